package gitguard

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/testutil"
)

// The adversarial tests plant what a hostile harness could leave in a
// worktree, restore it, and check that: no payload ran (the payload appends
// to a marker file outside the worktree), nothing outside the worktree
// changed, the snapshot holds every edit with its exact bytes, the worktree
// equals the baseline afterwards, and the report says so. Each case also
// has a control: the same attack against plain git must work, which shows
// the test has teeth.

// Edits every case makes on top of its attack.
var (
	editReadme = "edited\x00\xff binary\r\n"
	editNew    = "new file\r\nwith CRLF and $Id$\r\n"
)

func (f *fixture) marker() string  { return filepath.Join(f.outside, "marker") }
func (f *fixture) payload() string { return filepath.Join(f.outside, "payload.sh") }

// writePayload creates the payload script (world-executable: git may run
// as another uid).
func (f *fixture) writePayload(t testing.TB) {
	t.Helper()
	script := fmt.Sprintf("#!/bin/sh\necho \"ran $0 $*\" >> %s\nexit 0\n", f.marker())
	must(t, os.WriteFile(f.payload(), []byte(script), 0o755))
	must(t, os.Chmod(f.outside, 0o777))
}

func (f *fixture) payloadRan() bool {
	_, err := os.Stat(f.marker())
	return err == nil
}

// commonEdits modifies, adds and deletes files like a harness would.
func (f *fixture) commonEdits(t testing.TB) {
	t.Helper()
	writeFile(t, filepath.Join(f.wt, "README.md"), editReadme)
	writeFile(t, filepath.Join(f.wt, "newdir/deep/new.txt"), editNew)
	must(t, os.Remove(filepath.Join(f.wt, "docs/guide.txt")))
}

// outsideState records everything under the fixture root except the
// worktree and the state dir (and the payload marker, checked separately).
func (f *fixture) outsideState(t testing.TB) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(f.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == f.wt || p == f.state {
			return filepath.SkipDir
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		v := fmt.Sprintf("%v %d %v", info.Mode(), info.Size(), info.ModTime().UnixNano())
		if info.Mode()&fs.ModeSymlink != 0 {
			l, _ := os.Readlink(p)
			v += " -> " + l
		} else if info.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			v += " " + string(b)
		}
		m[p] = v
		return nil
	})
	must(t, err)
	return m
}

// blob reads path from commit with hardened plain git (raw bytes, no
// replace objects, no filters).
func (f *fixture) blob(t testing.TB, commit, path string) (string, bool) {
	t.Helper()
	cmd := exec.Command("/usr/bin/git", "--no-replace-objects", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
		"cat-file", "blob", commit+":"+path)
	cmd.Env = append(testEnv(os.TempDir()), "GIT_DIR="+filepath.Join(f.wt, ".git"))
	out, err := cmd.Output()
	return string(out), err == nil
}

// assertBaseline checks that the worktree is exactly the baseline: HEAD on
// main at the baseline, nothing modified, untracked or ignored, and the
// files have the baseline bytes.
func (f *fixture) assertBaseline(t testing.TB) {
	t.Helper()
	if h := tgit(t, f.wt, "--no-replace-objects", "rev-parse", "HEAD"); h != f.baseline {
		t.Errorf("HEAD %s, want baseline %s", h, f.baseline)
	}
	if b := tgit(t, f.wt, "symbolic-ref", "-q", "HEAD"); b != "refs/heads/main" {
		t.Errorf("HEAD is %q, want refs/heads/main", b)
	}
	if s := tgit(t, f.wt, "--no-replace-objects", "-c", "core.fsmonitor=false", "status", "--porcelain", "--ignored", "--untracked-files=all"); s != "" {
		t.Errorf("worktree not clean:\n%s", s)
	}
	var files []string
	err := filepath.WalkDir(f.wt, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(f.wt, p)
		if rel == ".git" {
			return filepath.SkipDir
		}
		if d.Type()&fs.ModeSymlink != 0 {
			t.Errorf("symlink left in worktree: %s", rel)
		}
		if d.Type().IsRegular() {
			files = append(files, rel)
			want, ok := f.baseContent[rel]
			got, _ := os.ReadFile(p)
			if f.eolAgnostic {
				got = bytes.ReplaceAll(got, []byte("\r\n"), []byte("\n"))
			}
			if !ok || string(got) != want {
				t.Errorf("%s = %q, want %q (tracked %v)", rel, got, want, ok)
			}
		}
		return nil
	})
	must(t, err)
	if len(files) != len(f.baseContent) {
		sort.Strings(files)
		t.Errorf("worktree has %d files, baseline %d: %v", len(files), len(f.baseContent), files)
	}
}

// assertSnapshot checks the common edits are in the snapshot with their
// exact bytes and the report counts them.
func (f *fixture) assertSnapshot(t testing.TB, rep *Report) {
	t.Helper()
	if rep.SnapshotCommit == "" || rep.Baseline != f.baseline || rep.SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("report: %+v", rep)
	}
	if got := tgit(t, f.wt, "rev-parse", rep.SnapshotRef); got != rep.SnapshotCommit {
		t.Errorf("ref %s = %s, report says %s", rep.SnapshotRef, got, rep.SnapshotCommit)
	}
	if got, _ := f.blob(t, rep.SnapshotCommit, "README.md"); got != editReadme {
		t.Errorf("snapshot README.md = %q", got)
	}
	wantNew := editNew
	if f.eolAgnostic {
		// The baseline's own attributes say *.txt is text: git stores it
		// normalised (as `git add` would); checkout gives CRLF back.
		wantNew = strings.ReplaceAll(editNew, "\r\n", "\n")
	}
	if got, _ := f.blob(t, rep.SnapshotCommit, "newdir/deep/new.txt"); got != wantNew {
		t.Errorf("snapshot newdir/deep/new.txt = %q", got)
	}
	if _, ok := f.blob(t, rep.SnapshotCommit, "docs/guide.txt"); ok {
		t.Errorf("snapshot still has the deleted docs/guide.txt")
	}
	want := map[string]string{"README.md": "modified", "newdir/deep/new.txt": "added", "docs/guide.txt": "deleted"}
	got := map[string]string{}
	for _, p := range rep.Paths {
		got[p.Path] = p.Change
	}
	for p, c := range want {
		if got[p] != c {
			t.Errorf("report path %s = %q, want %q (paths %v)", p, got[p], c, rep.Paths)
		}
	}
	if rep.Modified < 1 || rep.Added < 1 || rep.Deleted < 1 || rep.Modified+rep.Added+rep.Deleted != len(rep.Paths) {
		t.Errorf("report counts m=%d a=%d d=%d for %d paths", rep.Modified, rep.Added, rep.Deleted, len(rep.Paths))
	}
}

type advCase struct {
	name string
	// pristine runs before Register (it may change the baseline).
	pristine func(t *testing.T, f *fixture)
	// arm plants the attack after Register, in the worktree under test.
	arm func(t *testing.T, f *fixture)
	// control runs plain git after arm in a separate fixture and reports
	// whether the attack worked there.
	control func(t *testing.T, f *fixture) bool
	// check adds case-specific assertions after the restore.
	check func(t *testing.T, f *fixture, rep *Report)
}

func plainControl(args ...string) func(t *testing.T, f *fixture) bool {
	return func(t *testing.T, f *fixture) bool {
		before := f.outsideState(t)
		for _, a := range strings.Split(strings.Join(args, " "), ";") {
			cmd := exec.Command("/usr/bin/git", strings.Fields(a)...)
			cmd.Dir = f.wt
			cmd.Env = testEnv(os.TempDir())
			_ = cmd.Run()
		}
		after := f.outsideState(t)
		delete(after, f.marker())
		delete(before, f.marker())
		return f.payloadRan() || fmt.Sprint(before) != fmt.Sprint(after)
	}
}

func hookScripts(t *testing.T, f *fixture, dir string) {
	must(t, os.MkdirAll(dir, 0o777))
	for _, h := range []string{"post-index-change", "reference-transaction", "post-checkout", "pre-commit", "post-commit", "pre-auto-gc", "post-rewrite", "fsmonitor-watchman"} {
		must(t, os.WriteFile(filepath.Join(dir, h), []byte("#!/bin/sh\nexec "+f.payload()+" "+h+"\n"), 0o755))
	}
}

var advCases = []advCase{
	{
		name: "fsmonitor",
		arm: func(t *testing.T, f *fixture) {
			tgit(t, f.wt, "config", "core.fsmonitor", f.payload())
		},
		control: plainControl("status"),
	},
	{
		name: "hooks",
		arm: func(t *testing.T, f *fixture) {
			hookScripts(t, f, filepath.Join(f.wt, ".git/hooks"))
		},
		control: plainControl("add -A; commit -q --allow-empty -m x; checkout -q -b other"),
		check: func(t *testing.T, f *fixture, rep *Report) {
			if !contains(rep.MetadataRestored, "hooks/post-index-change") {
				t.Errorf("metadata restored %v", rep.MetadataRestored)
			}
			if _, err := os.Stat(filepath.Join(f.wt, ".git/hooks/post-checkout")); err == nil {
				t.Errorf("planted hook still there")
			}
		},
	},
	{
		name: "hooksPath",
		arm: func(t *testing.T, f *fixture) {
			hookScripts(t, f, filepath.Join(f.outside, "hooks"))
			tgit(t, f.wt, "config", "core.hooksPath", filepath.Join(f.outside, "hooks"))
		},
		control: plainControl("add -A; commit -q --allow-empty -m x"),
		check: func(t *testing.T, f *fixture, rep *Report) {
			if !contains(rep.MetadataRestored, "config") {
				t.Errorf("metadata restored %v", rep.MetadataRestored)
			}
		},
	},
	{
		name: "filters planted",
		arm: func(t *testing.T, f *fixture) {
			for _, k := range []string{"clean", "smudge"} {
				tgit(t, f.wt, "config", "filter.evil."+k, f.payload())
			}
			tgit(t, f.wt, "config", "filter.evil.required", "true")
			tgit(t, f.wt, "config", "filter.proc.process", f.payload())
			// tracked .gitattributes changed and an untracked one
			writeFile(t, filepath.Join(f.wt, ".gitattributes"), "* filter=evil\n")
			writeFile(t, filepath.Join(f.wt, "newdir/.gitattributes"), "* filter=proc\n")
		},
		control: plainControl("add -A"),
		check: func(t *testing.T, f *fixture, rep *Report) {
			if got, _ := f.blob(t, rep.SnapshotCommit, ".gitattributes"); got != "* filter=evil\n" {
				t.Errorf("snapshot .gitattributes = %q", got)
			}
		},
	},
	{
		name: "filters in pristine config",
		pristine: func(t *testing.T, f *fixture) {
			// A filter the owner configured (think git-lfs) and attributes
			// in the baseline: restore must not run it either.
			writeFile(t, filepath.Join(f.wt, ".gitattributes"), "*.md filter=lfsish\n*.txt text eol=crlf\n")
			tgit(t, f.wt, "add", ".gitattributes")
			tgit(t, f.wt, "commit", "-q", "-m", "attrs")
			tgit(t, f.wt, "push", "-q", "origin", "main")
			f.baseline = tgit(t, f.wt, "rev-parse", "HEAD")
			f.baseContent[".gitattributes"] = "*.md filter=lfsish\n*.txt text eol=crlf\n"
			f.eolAgnostic = true // *.txt may be checked out either way
			tgit(t, f.wt, "config", "filter.lfsish.clean", f.payload())
			tgit(t, f.wt, "config", "filter.lfsish.smudge", f.payload())
			tgit(t, f.wt, "config", "filter.lfsish.required", "true")
		},
		arm:     func(t *testing.T, f *fixture) {},
		control: plainControl("add -A"),
		check: func(t *testing.T, f *fixture, rep *Report) {
			if rep.MetadataRestored != nil && contains(rep.MetadataRestored, "config") {
				t.Errorf("pristine config reported as changed")
			}
		},
	},
	{
		name: "core.worktree elsewhere",
		arm: func(t *testing.T, f *fixture) {
			other := filepath.Join(f.outside, "other-wt")
			writeFile(t, filepath.Join(other, "README.md"), "other\n")
			writeFile(t, filepath.Join(other, "precious.txt"), "precious\n")
			tgit(t, f.wt, "config", "core.worktree", other)
		},
		control: plainControl("add -A; clean -ffdx; reset -q --hard"),
	},
	{
		name: "include.path",
		arm: func(t *testing.T, f *fixture) {
			inc := filepath.Join(f.outside, "evil.cfg")
			hookScripts(t, f, filepath.Join(f.outside, "hooks"))
			must(t, os.WriteFile(inc, []byte(fmt.Sprintf("[core]\n\tfsmonitor = %s\n\thooksPath = %s\n[filter \"inc\"]\n\tclean = %s\n\tsmudge = %s\n",
				f.payload(), filepath.Join(f.outside, "hooks"), f.payload(), f.payload())), 0o644))
			tgit(t, f.wt, "config", "include.path", inc)
			writeFile(t, filepath.Join(f.wt, "newdir/.gitattributes"), "* filter=inc\n")
		},
		control: plainControl("status; add -A"),
	},
	{
		name: "replace refs",
		arm: func(t *testing.T, f *fixture) {
			// Replace the baseline commit with one whose tree has an extra
			// file, and README's blob with other bytes.
			evil := tgit(t, f.wt, "hash-object", "-w", "--stdin", "--path=x", "-t", "blob", "/dev/null")
			_ = evil
			cmd := exec.Command("/usr/bin/git", "hash-object", "-w", "--stdin")
			cmd.Dir = f.wt
			cmd.Env = testEnv(os.TempDir())
			cmd.Stdin = strings.NewReader("replaced readme\n")
			out, err := cmd.Output()
			must(t, err)
			blob := strings.TrimSpace(string(out))
			orig := tgit(t, f.wt, "rev-parse", f.baseline+":README.md")
			tgit(t, f.wt, "replace", orig, blob)
			idx := filepath.Join(f.root, "evil.index")
			c := exec.Command("/usr/bin/git", "read-tree", f.baseline)
			c.Dir, c.Env = f.wt, append(testEnv(os.TempDir()), "GIT_INDEX_FILE="+idx)
			must(t, c.Run())
			c = exec.Command("/usr/bin/git", "update-index", "--add", "--cacheinfo", "100644,"+blob+",pwned")
			c.Dir, c.Env = f.wt, append(testEnv(os.TempDir()), "GIT_INDEX_FILE="+idx)
			must(t, c.Run())
			c = exec.Command("/usr/bin/git", "write-tree")
			c.Dir, c.Env = f.wt, append(testEnv(os.TempDir()), "GIT_INDEX_FILE="+idx)
			tree, err := c.Output()
			must(t, err)
			must(t, os.Remove(idx))
			fake := tgit(t, f.wt, "commit-tree", strings.TrimSpace(string(tree)), "-m", "fake")
			tgit(t, f.wt, "replace", f.baseline, fake)
		},
		control: func(t *testing.T, f *fixture) bool {
			tgit(t, f.wt, "reset", "-q", "--hard", f.baseline)
			_, err := os.Stat(filepath.Join(f.wt, "pwned"))
			return err == nil
		},
	},
	{
		name: "symlinks out of the worktree",
		arm: func(t *testing.T, f *fixture) {
			victim := filepath.Join(f.outside, "victim")
			writeFile(t, filepath.Join(victim, "main.go"), "victim main\n")
			writeFile(t, filepath.Join(victim, "lib/util.go"), "victim util\n")
			writeFile(t, filepath.Join(victim, "secret"), "secret\n")
			// tracked dir replaced by a link, untracked links to a file and a dir
			must(t, os.RemoveAll(filepath.Join(f.wt, "src")))
			must(t, os.Symlink(victim, filepath.Join(f.wt, "src")))
			must(t, os.MkdirAll(filepath.Join(f.wt, "newdir"), 0o755))
			must(t, os.Symlink(filepath.Join(victim, "secret"), filepath.Join(f.wt, "newdir/link-to-secret")))
			must(t, os.Symlink(victim, filepath.Join(f.wt, "newdir/link-to-dir")))
			// links inside .git: a lock file, hooks/, info/, config.worktree
			gd := filepath.Join(f.wt, ".git")
			must(t, os.Symlink(filepath.Join(victim, "secret"), filepath.Join(gd, "index.lock")))
			must(t, os.RemoveAll(filepath.Join(gd, "hooks")))
			hookScripts(t, f, filepath.Join(f.outside, "hooks"))
			must(t, os.Symlink(filepath.Join(f.outside, "hooks"), filepath.Join(gd, "hooks")))
			must(t, os.RemoveAll(filepath.Join(gd, "info")))
			must(t, os.Symlink(victim, filepath.Join(gd, "info")))
			must(t, os.Symlink(filepath.Join(victim, "secret"), filepath.Join(gd, "config.worktree")))
			must(t, os.Symlink(victim, filepath.Join(gd, "rebase-merge")))
		},
		check: func(t *testing.T, f *fixture, rep *Report) {
			// the snapshot keeps the links as links
			if got, _ := f.blob(t, rep.SnapshotCommit, "src"); got != filepath.Join(f.outside, "victim") {
				t.Errorf("snapshot src = %q, want the link target", got)
			}
			mode := tgit(t, f.wt, "ls-tree", rep.SnapshotCommit, "newdir/link-to-dir")
			if !strings.HasPrefix(mode, "120000 ") {
				t.Errorf("link-to-dir saved as %q", mode)
			}
			for _, p := range []string{"hooks", "info", "config.worktree", "index.lock", "rebase-merge"} {
				if fi, err := os.Lstat(filepath.Join(f.wt, ".git", p)); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
					t.Errorf(".git/%s is still a symlink", p)
				}
			}
			if st, err := os.Stat(filepath.Join(f.wt, ".git/info/exclude")); err != nil || !st.Mode().IsRegular() {
				t.Errorf(".git/info/exclude not restored: %v", err)
			}
		},
	},
	{
		name: "killed git: index.lock, half-finished rebase, temp objects",
		arm: func(t *testing.T, f *fixture) {
			// two diverging local branches, a rebase stopped on a conflict
			tgit(t, f.wt, "checkout", "-q", "-b", "side")
			writeFile(t, filepath.Join(f.wt, "README.md"), "side\n")
			tgit(t, f.wt, "commit", "-q", "-am", "side")
			tgit(t, f.wt, "checkout", "-q", "main")
			writeFile(t, filepath.Join(f.wt, "README.md"), "main local\n")
			tgit(t, f.wt, "commit", "-q", "-am", "local 1")
			writeFile(t, filepath.Join(f.wt, "src/main.go"), "local 2\n")
			tgit(t, f.wt, "commit", "-q", "-am", "local 2")
			if out, err := tgitErr(f.wt, "rebase", "side"); err == nil {
				t.Fatalf("rebase did not stop: %s", out)
			}
			if _, err := os.Stat(filepath.Join(f.wt, ".git/rebase-merge")); err != nil {
				t.Fatalf("no rebase in progress: %v", err)
			}
			gd := filepath.Join(f.wt, ".git")
			for _, p := range []string{"index.lock", "HEAD.lock", "config.lock", "refs/heads/main.lock", "MERGE_HEAD", "CHERRY_PICK_HEAD",
				"BISECT_LOG", "AUTO_MERGE", "objects/pack/tmp_pack_x", "objects/ab/tmp_obj_y", "objects/info/commit-graph.lock", "sequencer/todo"} {
				writeFile(t, filepath.Join(gd, p), "left by a killed git\n")
			}
		},
		check: func(t *testing.T, f *fixture, rep *Report) {
			for _, p := range []string{"index.lock", "rebase-merge", "refs/heads/main.lock", "MERGE_HEAD", "objects/pack/tmp_pack_x", "objects/ab/tmp_obj_y", "sequencer"} {
				if !contains(rep.Cleaned, p) {
					t.Errorf("cleaned %v lacks %s", rep.Cleaned, p)
				}
				if _, err := os.Lstat(filepath.Join(f.wt, ".git", p)); err == nil {
					t.Errorf(".git/%s still there", p)
				}
			}
			// the local commits (main's two, side's one) stay reachable
			for _, b := range []string{"main@{1}", "side"} {
				_ = b
			}
			if rep.LocalCommits < 2 {
				t.Errorf("local commits %d, want >= 2", rep.LocalCommits)
			}
		},
	},
}

func TestAdversarial(t *testing.T) {
	owners := []struct {
		name string
		uid  int
	}{{"self", -1}}
	if os.Geteuid() != 0 && testutil.Strict() {
		t.Fatal("the uid 65534 variants need root (SHIM_REQUIRE_INTEGRATION=1)")
	}
	if os.Geteuid() == 0 {
		owners = append(owners, struct {
			name string
			uid  int
		}{"uid65534", 65534})
	}
	for _, tc := range advCases {
		for _, o := range owners {
			t.Run(tc.name+"/"+o.name, func(t *testing.T) {
				runAdversarial(t, tc, o.uid)
			})
		}
	}
}

func runAdversarial(t *testing.T, tc advCase, uid int) {
	ctx := context.Background()
	setup := func() *fixture {
		f := newFixture(t)
		f.writePayload(t)
		if tc.pristine != nil {
			tc.pristine(t, f)
		}
		if uid >= 0 {
			chownR(t, f.wt, uid)
		}
		return f
	}
	if tc.control != nil {
		c := setup()
		tc.arm(t, c)
		c.commonEdits(t)
		if !tc.control(t, c) {
			t.Fatalf("control: the attack does nothing against plain git; the test has no teeth")
		}
	}
	f := setup()
	g := f.guard(t, nil)
	tc.arm(t, f)
	f.commonEdits(t)
	if uid >= 0 {
		chownR(t, f.wt, uid)
	}
	before := f.outsideState(t)
	rep, err := g.Restore(ctx, 1, f.baseline)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if f.payloadRan() {
		b, _ := os.ReadFile(f.marker())
		t.Fatalf("payload ran:\n%s", b)
	}
	if after := f.outsideState(t); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Errorf("outside the worktree changed:\nbefore %v\nafter  %v", before, after)
	}
	f.assertBaseline(t)
	f.assertSnapshot(t, rep)
	if uid >= 0 {
		assertOwned(t, f.wt, uid)
	}
	if tc.check != nil {
		tc.check(t, f, rep)
	}
	// a second restore is a no-op that keeps the snapshot
	rep2, err := g.Restore(ctx, 1, f.baseline)
	if err != nil {
		t.Fatalf("second restore: %v", err)
	}
	if rep2.SnapshotCommit != rep.SnapshotCommit || !rep2.SnapshotReused {
		t.Errorf("second restore changed the snapshot: %s -> %s", rep.SnapshotCommit, rep2.SnapshotCommit)
	}
	if f.payloadRan() {
		t.Fatalf("payload ran on the second restore")
	}
	f.assertBaseline(t)
}

func chownR(t testing.TB, dir string, uid int) {
	t.Helper()
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	}))
}

// assertOwned checks git (running as the owner) left no root-owned file in
// the worktree or its git dir.
func assertOwned(t testing.TB, dir string, uid int) {
	t.Helper()
	var bad []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if info.Sys() != nil && statUID(info) != uid {
			bad = append(bad, p)
		}
		return nil
	})
	if len(bad) > 0 {
		t.Errorf("%d paths not owned by uid %d, e.g. %v", len(bad), uid, bad[:min(5, len(bad))])
	}
}

var _ = bytes.Equal
