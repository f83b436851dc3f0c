package gitguard

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The wedge tests: one command of the worktree's owner (uid 65534, as a
// harness) that made every later restore fail, or stall, before. Each
// runs the command after the common edits, restores, and checks that the
// worktree is the baseline, the edits are in the snapshot, nothing is left
// root-owned, and a second restore keeps the snapshot. The control runs the
// same command in another fixture and shows the wedge against plain git
// (reset --hard and clean -ffdx, or the `add -A` the snapshot ran before).

const wedgeUID = 65534

// asOwner runs a shell command as the worktree's owner in the worktree.
func (f *fixture) asOwner(t testing.TB, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = f.wt
	cmd.Env = testEnv(f.outside)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: wedgeUID, Gid: wedgeUID, Groups: []uint32{}}}
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

// failsAsOwner is a control: script fails when the owner runs it.
func failsAsOwner(script string) func(t *testing.T, f *fixture) bool {
	return func(t *testing.T, f *fixture) bool {
		out, err := f.asOwner(t, script)
		t.Logf("control %q: %v %s", script, err, strings.TrimSpace(out))
		return err != nil
	}
}

// plainReset is the destructive floor: what a supervisor without shim runs.
const plainReset = "git reset -q --hard && git clean -qffdx"

type wedgeCase struct {
	name    string
	wedge   string // shell, as the owner, in the worktree
	control func(t *testing.T, f *fixture) bool
	check   func(t *testing.T, f *fixture, rep *Report)
	cfg     func(*Config)
	bounds  [2]int // maxRefs and maxSavedRefs for this case (0: shim's)
}

var wedgeCases = []wedgeCase{
	{
		name:    "fifo at a tracked path",
		wedge:   "rm src/main.go && mkfifo src/main.go",
		control: failsAsOwner("git add -A"),
		check: func(t *testing.T, f *fixture, rep *Report) {
			wantNotStored(t, rep, "src/main.go", "fifo", true)
		},
	},
	{
		name:    "mode-000 file at a tracked path",
		wedge:   "echo edited > src/lib/util.go && chmod 000 src/lib/util.go",
		control: failsAsOwner("git add -A"),
		check: func(t *testing.T, f *fixture, rep *Report) {
			if got, _ := f.blob(t, rep.SnapshotCommit, "src/lib/util.go"); got != "edited\n" {
				t.Errorf("snapshot util.go = %q", got)
			}
			wantRepaired(t, rep, "src/lib/util.go")
		},
	},
	{
		name:    "mode-000 directory",
		wedge:   "echo new > src/lib/new.go && chmod 000 src/lib",
		control: failsAsOwner(plainReset),
		check: func(t *testing.T, f *fixture, rep *Report) {
			if got, _ := f.blob(t, rep.SnapshotCommit, "src/lib/new.go"); got != "new\n" {
				t.Errorf("snapshot src/lib/new.go = %q", got)
			}
			wantRepaired(t, rep, "src/lib")
		},
	},
	{
		name:    "read-only directories",
		wedge:   "echo changed > src/main.go && echo x > src/extra.go && chmod 555 docs . src",
		control: failsAsOwner(plainReset),
		check: func(t *testing.T, f *fixture, rep *Report) {
			if got, _ := f.blob(t, rep.SnapshotCommit, "src/extra.go"); got != "x\n" {
				t.Errorf("snapshot src/extra.go = %q", got)
			}
			wantRepaired(t, rep, "src")
			wantRepaired(t, rep, ".")
		},
	},
	{
		name:    "read-only .git/objects",
		wedge:   "chmod -R a-w .git/objects",
		control: failsAsOwner("git add -A"),
		check: func(t *testing.T, f *fixture, rep *Report) {
			wantRepaired(t, rep, ".git/objects")
		},
	},
	{
		name: "40 GiB sparse files",
		// One untracked, one at a tracked path.
		wedge: "truncate -s 40G huge.bin && truncate -s 40G data/keep/a.txt",
		check: func(t *testing.T, f *fixture, rep *Report) {
			for _, p := range []string{"huge.bin", "data/keep/a.txt"} {
				n := wantNotStored(t, rep, p, "file", p != "huge.bin")
				if n == nil {
					continue
				}
				zeros := "sha256:30e14955ebf1352266dc2ff8067e68104607e750abb9d3b36582b8af909fcb58" // of 1 MiB
				if n.Size != 40<<30 || n.HashedBytes != HashBound || n.Allocated >= HashBound || (p == "huge.bin") != (n.Hash == zeros) {
					t.Errorf("not stored %s: %+v (want 40 GiB, 1 MiB of zeros hashed, little allocated)", p, *n)
				}
				if _, ok := f.blob(t, rep.SnapshotCommit, p); ok {
					t.Errorf("the snapshot stores %s", p)
				}
			}
			msg := tgit(t, f.wt, "log", "-1", "--format=%B", rep.SnapshotCommit)
			if !strings.Contains(msg, "Shim-Not-Stored: file 42949672960 sha256:") || !strings.Contains(msg, `"huge.bin"`) {
				t.Errorf("the snapshot message does not list the files not stored:\n%s", msg)
			}
			if rep.MaxFileSize != DefaultMaxFileSize {
				t.Errorf("max_file_size %d", rep.MaxFileSize)
			}
		},
	},
	{
		name:  "a file over a configured cap",
		wedge: "head -c 5000 /dev/zero > five-k.bin",
		cfg:   func(c *Config) { c.MaxFileSize = 4096 },
		check: func(t *testing.T, f *fixture, rep *Report) {
			if n := wantNotStored(t, rep, "five-k.bin", "file", false); n != nil && n.HashedBytes != 5000 {
				t.Errorf("hashed %d bytes, want the whole 5000", n.HashedBytes)
			}
		},
	},
	{
		name:  "a ref planted at the generation's snapshot ref (a blob)",
		wedge: "git update-ref refs/shim/abandoned/1 $(echo planted | git hash-object -w --stdin)",
		control: func(t *testing.T, f *fixture) bool {
			// The restore before took it for the generation's own snapshot
			// and refused: "exists but is a blob".
			out, err := f.asOwner(t, "git cat-file -t refs/shim/abandoned/1")
			return err == nil && strings.TrimSpace(out) == "blob"
		},
		check: func(t *testing.T, f *fixture, rep *Report) {
			wantMoved(t, f, rep, "refs/shim/abandoned/1", HarnessRefPrefix+"1/refs/shim/abandoned/1")
		},
	},
	{
		name:    "a ref planted below the generation's snapshot ref",
		wedge:   "git update-ref refs/shim/abandoned/1/x HEAD",
		control: failsAsOwner("git update-ref refs/shim/abandoned/1 HEAD"),
		check: func(t *testing.T, f *fixture, rep *Report) {
			wantMoved(t, f, rep, "refs/shim/abandoned/1/x", HarnessRefPrefix+"1/refs/shim/abandoned/1/x")
		},
	},
	{
		name:  "fifos in refs and logs",
		wedge: "mkfifo .git/refs/heads/fifo && mkdir -p .git/logs/refs/heads && rm -f .git/logs/refs/heads/main && mkfifo .git/logs/refs/heads/main",
		check: func(t *testing.T, f *fixture, rep *Report) {
			for _, p := range []string{"refs/heads/fifo", "logs/refs/heads/main"} {
				if !contains(rep.RefsRemoved, p) {
					t.Errorf("refs_removed %v, want %s", rep.RefsRemoved, p)
				}
			}
		},
	},
	{
		name: "the harness's refs and rr-cache",
		wedge: `git checkout -q -b evil && echo h > h.txt && git add h.txt && git commit -q -m harness &&
			git update-ref refs/remotes/origin/main HEAD && git tag v-evil && git branch evil2 &&
			git checkout -q main && git pack-refs --all && git update-ref ORIG_HEAD HEAD &&
			mkdir -p .git/rr-cache/0123 && echo x > .git/rr-cache/0123/preimage`,
		control: func(t *testing.T, f *fixture) bool {
			_, _ = f.asOwner(t, plainReset)
			out, _ := f.asOwner(t, "git for-each-ref --format='%(refname)' && ls .git/rr-cache")
			return strings.Contains(out, "refs/tags/v-evil") && strings.Contains(out, "refs/heads/evil2") && strings.Contains(out, "0123")
		},
		check: func(t *testing.T, f *fixture, rep *Report) {
			evil := tgit(t, f.wt, "rev-parse", HarnessRefPrefix+"1/refs/heads/evil")
			want := "refs/heads/main " + f.baseline + "\nrefs/remotes/origin/main " + f.baseline + "\nrefs/shim/abandoned/1 " + rep.SnapshotCommit
			for _, n := range []string{"refs/heads/evil", "refs/heads/evil2", "refs/remotes/origin/main", "refs/tags/v-evil"} {
				want += "\n" + HarnessRefPrefix + "1/" + n + " " + evil
				wantMoved(t, f, rep, n, HarnessRefPrefix+"1/"+n)
			}
			if got := tgit(t, f.wt, "for-each-ref", "--format=%(refname) %(objectname)"); got != want {
				t.Errorf("refs after the restore:\n%s\nwant\n%s", got, want)
			}
			for _, p := range []string{"rr-cache", "ORIG_HEAD", "FETCH_HEAD"} {
				if _, err := os.Lstat(filepath.Join(f.wt, ".git", p)); err == nil {
					t.Errorf(".git/%s is still there", p)
				}
			}
		},
	},
	{
		// 200,000 loose refs: shim reads maxRefs of them, saves
		// maxSavedRefs, removes and counts the rest; PID 1's memory and
		// the report stay bounded. Control: plain git sees every one.
		// (The bounds are lowered to 4,000 refs read, 1,000 saved, so that
		// it takes seconds; the packed flood below runs at the real ones.)
		name: "more loose refs than shim reads",
		wedge: `mkdir .git/refs/heads/flood && h=$(git rev-parse HEAD) &&
			awk -v h=$h 'BEGIN { for (i = 0; i < 6000; i++) { f = ".git/refs/heads/flood/r" i; print h > f; close(f) } }'`,
		control: refCount(6000),
		bounds:  [2]int{4000, 1000},
		check: func(t *testing.T, f *fixture, rep *Report) {
			wantRefBounds(t, f, rep)
		},
	},
	{
		name: "more packed refs than shim reads",
		wedge: `h=$(git rev-parse HEAD) && awk -v h=$h 'BEGIN { print "# pack-refs with: peeled fully-peeled sorted ";
			for (i = 0; i < 300000; i++) printf "%s refs/heads/p%07d\n", h, i }' >> .git/packed-refs`,
		control: refCount(300000),
		check: func(t *testing.T, f *fixture, rep *Report) {
			wantRefBounds(t, f, rep)
		},
	},
	{
		name:  "a packed-refs past its byte bound",
		wedge: `(cat .git/packed-refs 2>/dev/null; head -c 70000000 /dev/zero | tr '\0' '#') > .git/pr && mv .git/pr .git/packed-refs`,
		check: func(t *testing.T, f *fixture, rep *Report) {
			if !contains(rep.RefsRemoved, "packed-refs") {
				t.Errorf("refs_removed %v, want packed-refs", rep.RefsRemoved)
			}
			if fi, err := os.Stat(filepath.Join(f.wt, ".git", "packed-refs")); err == nil && fi.Size() > 1<<20 {
				t.Errorf("packed-refs after the restore: %d bytes", fi.Size())
			}
		},
	},
	{
		name:    "refs deeper than shim reads",
		wedge:   `d=.git/refs/heads; for i in $(seq 1 100); do d=$d/d; done; mkdir -p $d && git rev-parse HEAD > $d/r`,
		control: refCount(1),
		check: func(t *testing.T, f *fixture, rep *Report) {
			if len(rep.RefsRemoved) == 0 || !strings.HasPrefix(rep.RefsRemoved[0], "refs/heads/d/d/") {
				t.Errorf("refs_removed %v, want the chain below %d directories", rep.RefsRemoved, maxRefDepth)
			}
			if got := tgit(t, f.wt, "for-each-ref", "refs/heads/d"); got != "" {
				t.Errorf("the chain's ref is still there: %s", got)
			}
		},
	},
}

func TestWedges(t *testing.T) {
	requireRoot(t)
	for _, tc := range wedgeCases {
		t.Run(tc.name, func(t *testing.T) { runWedge(t, tc) })
	}
}

func runWedge(t *testing.T, tc wedgeCase) {
	ctx := context.Background()
	if tc.bounds[0] != 0 {
		r, s := maxRefs, maxSavedRefs
		maxRefs, maxSavedRefs = tc.bounds[0], tc.bounds[1]
		t.Cleanup(func() { maxRefs, maxSavedRefs = r, s })
	}
	setup := func() (*fixture, *Guard) {
		f := newFixture(t)
		chownR(t, f.wt, wedgeUID)
		g := f.guard(t, tc.cfg)
		f.commonEdits(t)
		chownR(t, f.wt, wedgeUID)
		if out, err := f.asOwner(t, tc.wedge); err != nil {
			t.Fatalf("wedge %q: %v\n%s", tc.wedge, err, out)
		}
		return f, g
	}
	if tc.control != nil {
		c, _ := setup()
		if !tc.control(t, c) {
			t.Fatalf("control: the wedge does nothing against plain git; the test has no teeth")
		}
	}
	f, g := setup()
	t0 := time.Now()
	rep, err := g.Restore(ctx, 1, f.baseline)
	took := time.Since(t0)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	removed := rep.RefsRemoved[:min(len(rep.RefsRemoved), 5)]
	t.Logf("restore took %v; steps %v; repaired %v; not stored %+v; refs moved %d, removed %d %v",
		took, rep.DurationsMS, rep.Repaired, rep.NotStored, len(rep.RefsMoved), len(rep.RefsRemoved), removed)
	f.assertBaseline(t)
	f.assertSnapshot(t, rep)
	assertOwned(t, f.wt, wedgeUID)
	if tc.check != nil {
		tc.check(t, f, rep)
	}
	rep2, err := g.Restore(ctx, 1, f.baseline)
	if err != nil {
		t.Fatalf("second restore: %v", err)
	}
	if rep2.SnapshotCommit != rep.SnapshotCommit || !rep2.SnapshotReused || len(rep2.RefsMoved) != 0 {
		t.Errorf("second restore: snapshot %s -> %s (reused %v), refs moved %v", rep.SnapshotCommit, rep2.SnapshotCommit, rep2.SnapshotReused, rep2.RefsMoved)
	}
	f.assertBaseline(t)
}

func wantNotStored(t *testing.T, rep *Report, path, typ string, tracked bool) *NotStoredFile {
	t.Helper()
	for i, n := range rep.NotStored {
		if n.Path == path {
			if n.Type != typ || n.Tracked != tracked {
				t.Errorf("not stored %s: %+v, want type %s tracked %v", path, n, typ, tracked)
			}
			return &rep.NotStored[i]
		}
	}
	t.Errorf("not_stored %+v lacks %s", rep.NotStored, path)
	return nil
}

func wantRepaired(t *testing.T, rep *Report, path string) {
	t.Helper()
	for _, r := range rep.Repaired {
		if strings.HasPrefix(r, path+":") {
			return
		}
	}
	t.Errorf("repaired %v lacks %s", rep.Repaired, path)
}

func wantMoved(t *testing.T, f *fixture, rep *Report, ref, savedAs string) {
	t.Helper()
	for _, c := range rep.RefsMoved {
		if c.Ref == ref {
			if c.SavedAs != savedAs || c.Harness == "" {
				t.Errorf("ref %s moved: %+v, want saved as %s", ref, c, savedAs)
			}
			if got := tgit(t, f.wt, "rev-parse", savedAs); got != c.Harness {
				t.Errorf("%s = %s, want the harness's %s", savedAs, got, c.Harness)
			}
			return
		}
	}
	t.Errorf("refs_moved %+v lacks %s", rep.RefsMoved, ref)
}

// TestBaselineRefResolvesAmongTheTrustedRefs: the harness moves
// refs/remotes/origin/main to its own commit (and plants .git/origin/main,
// where git's rules look first for "origin/main"); a restore to that ref,
// by any of its names, and ResolveBaseline, find the trusted value. The
// control: plain git resolves it to the harness's commit.
func TestBaselineRefResolvesAmongTheTrustedRefs(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	f := newFixture(t)
	chownR(t, f.wt, wedgeUID)
	g := f.guard(t, nil)
	move := `git checkout -q -b evil && echo h > h.txt && git add h.txt && git commit -q -m harness &&
		git update-ref refs/remotes/origin/main HEAD && mkdir -p .git/origin && git rev-parse HEAD > .git/origin/main &&
		git rev-parse HEAD`
	for gen, rev := range []string{"refs/remotes/origin/main", "origin/main", "remotes/origin/main"} {
		out, err := f.asOwner(t, move)
		if err != nil {
			t.Fatalf("harness: %v %s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		evil := lines[len(lines)-1]
		if got := tgit(t, f.wt, "-c", "core.warnAmbiguousRefs=false", "rev-parse", rev); got != evil {
			t.Fatalf("control: plain git resolves %s to %s, not the harness's %s", rev, got, evil)
		}
		if got, err := g.ResolveBaseline(ctx, rev); err != nil || got != f.baseline {
			t.Errorf("ResolveBaseline(%s) = %s %v, want the trusted %s", rev, got, err, f.baseline)
		}
		rep, err := g.Restore(ctx, uint64(gen+1), rev)
		if err != nil {
			t.Fatalf("restore to %s: %v", rev, err)
		}
		if rep.Baseline != f.baseline {
			t.Errorf("restore to %s: baseline %s, want the trusted %s (the harness's is %s)", rev, rep.Baseline, f.baseline, evil)
		}
		must(t, os.RemoveAll(filepath.Join(f.wt, ".git/origin")))
		f.assertBaseline(t)
	}
	if _, err := g.Restore(ctx, 9, "refs/remotes/origin/nothing"); code(err) != CodeRestoreFailed {
		t.Errorf("restore to a ref the trusted refs lack = %v, want RESTORE_FAILED", err)
	}
}

// refCount is a control: plain git lists at least n refs besides the
// fixture's own (it reads every one a harness wrote).
func refCount(n int) func(t *testing.T, f *fixture) bool {
	return func(t *testing.T, f *fixture) bool {
		out, err := f.asOwner(t, "git for-each-ref --format=x | wc -l")
		got, _ := strconv.Atoi(strings.TrimSpace(out))
		return err == nil && got >= n
	}
}

// wantRefBounds checks a restore of a flood of refs: the trusted refs are
// back, maxSavedRefs of the harness's are kept and the rest counted, the
// report's lists are capped.
func wantRefBounds(t *testing.T, f *fixture, rep *Report) {
	t.Helper()
	if rep.RefsNotSaved == 0 || len(rep.RefsMoved) > maxListed || !rep.RefsMovedTruncated {
		t.Errorf("refs moved %d (truncated %v), not saved %d: want the list capped and the refs past %d counted",
			len(rep.RefsMoved), rep.RefsMovedTruncated, rep.RefsNotSaved, maxSavedRefs)
	}
	if len(rep.RefsRemoved) > maxListed {
		t.Errorf("refs_removed lists %d", len(rep.RefsRemoved))
	}
	saved := tgit(t, f.wt, "for-each-ref", "--format=x", HarnessRefPrefix)
	if n := strings.Count(saved, "x"); n != maxSavedRefs {
		t.Errorf("%d of the harness's refs saved, want %d", n, maxSavedRefs)
	}
	if got := tgit(t, f.wt, "rev-parse", "refs/heads/main"); got != f.baseline {
		t.Errorf("main is %s, want the baseline %s", got, f.baseline)
	}
}
