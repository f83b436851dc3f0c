package gitguard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestGitStderrHasNoHomeWarning: git runs as the worktree owner, who cannot
// read anything in StateDir; its HOME must not point there, or every call
// starts its stderr with "unable to access .../.config/git/ignore" and the
// real error of a failed call is pushed out of the message.
func TestGitStderrHasNoHomeWarning(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	f := newFixture(t)
	chownR(t, f.wt, 65534)
	g := f.guard(t, nil)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(true); err != nil {
		t.Fatal(err)
	}
	if !g.asOwner {
		t.Fatal("git does not run as the owner; the test proves nothing")
	}
	_, err := g.git(ctx, gitOpts{}, "ls-files", "--others", "--exclude-standard", "--error-unmatch", "--", "does-not-exist")
	var ge *GitError
	if !errors.As(err, &ge) {
		t.Fatalf("want a GitError, got %v", err)
	}
	if strings.Contains(ge.Stderr, "unable to access") || strings.Contains(ge.Stderr, "Permission denied") {
		t.Errorf("git's stderr carries a HOME warning: %q", ge.Stderr)
	}
	if !strings.HasPrefix(ge.Stderr, "error:") {
		t.Errorf("git's stderr does not start with the error: %q", ge.Stderr)
	}
}

// TestReplaceRefsMovedAside: a replace ref the harness planted stays out of
// the way of the next harness's plain git (which honours refs/replace/),
// and is kept under refs/shim/replace/<gen>/.
func TestReplaceRefsMovedAside(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	g := f.guard(t, nil)
	writeFile(t, filepath.Join(f.wt, "README.md"), "edited\n")
	readme := tgit(t, f.wt, "rev-parse", f.baseline+":README.md")
	empty := tgit(t, f.wt, "mktree")
	fake := tgit(t, f.wt, "commit-tree", "-m", "a fake baseline", empty)
	tgit(t, f.wt, "replace", f.baseline, fake)
	other := tgit(t, f.wt, "hash-object", "-w", "--stdin")
	tgit(t, f.wt, "update-ref", "refs/replace/"+readme, other)

	rep, err := g.Restore(ctx, 3, f.baseline)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"refs/replace/" + f.baseline, "refs/replace/" + readme}
	sort.Strings(want)
	got := append([]string{}, rep.ReplaceRefsMoved...)
	sort.Strings(got)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("replace_refs_moved = %v, want %v", got, want)
	}
	if out := tgit(t, f.wt, "for-each-ref", "refs/replace/"); out != "" {
		t.Errorf("replace refs left:\n%s", out)
	}
	if got := tgit(t, f.wt, "rev-parse", ReplaceRefPrefix+"3/"+f.baseline); got != fake {
		t.Errorf("moved ref = %s, want %s", got, fake)
	}
	if got := tgit(t, f.wt, "rev-parse", ReplaceRefPrefix+"3/"+readme); got != other {
		t.Errorf("moved ref = %s, want %s", got, other)
	}
	// Plain git, replace objects honoured: the worktree is the baseline.
	if s := tgit(t, f.wt, "status", "--porcelain", "--untracked-files=all"); s != "" {
		t.Errorf("plain git status after the restore:\n%s", s)
	}
	if got, _ := f.blob(t, rep.SnapshotCommit, "README.md"); got != "edited\n" {
		t.Errorf("snapshot README.md = %q", got)
	}
	// A second restore of the same generation finds nothing to move.
	rep2, err := g.Restore(ctx, 3, f.baseline)
	if err != nil || len(rep2.ReplaceRefsMoved) != 0 {
		t.Errorf("second restore: %v, moved %v", err, rep2.ReplaceRefsMoved)
	}
}

// TestNestedRepositoryWithoutCommit: `git add` refuses a nested repository
// with no commit; the restore leaves it out of the snapshot and moves it,
// files and all, to <gitdir>/shim-nested/<gen>/<path> instead of failing
// every fence.
func TestNestedRepositoryWithoutCommit(t *testing.T) {
	for _, uid := range []int{-1, 65534} {
		t.Run(fmt.Sprint("uid", uid), func(t *testing.T) {
			if uid >= 0 {
				requireRoot(t)
			}
			ctx := context.Background()
			f := newFixture(t)
			if uid >= 0 {
				chownR(t, f.wt, uid)
			}
			g := f.guard(t, nil)
			writeFile(t, filepath.Join(f.wt, "README.md"), "edited\n")
			tgit(t, f.wt, "init", "-q", "scratch")
			writeFile(t, filepath.Join(f.wt, "scratch/notes.txt"), "notes\n")
			tgit(t, f.wt, "init", "-q", "new/deep/inner")
			writeFile(t, filepath.Join(f.wt, "new/deep/inner/x.txt"), "inner\n")
			writeFile(t, filepath.Join(f.wt, "new/x.txt"), "x\n")
			tgit(t, f.wt, "init", "-q", "withc")
			writeFile(t, filepath.Join(f.wt, "withc/y.txt"), "y\n")
			tgit(t, filepath.Join(f.wt, "withc"), "add", "y.txt")
			tgit(t, filepath.Join(f.wt, "withc"), "commit", "-qm", "c")
			withcHead := tgit(t, filepath.Join(f.wt, "withc"), "rev-parse", "HEAD")
			if uid >= 0 {
				chownR(t, f.wt, uid)
			}

			rep, err := g.Restore(ctx, 1, f.baseline)
			if err != nil {
				t.Fatal(err)
			}
			got := append([]string{}, rep.NestedRepos...)
			sort.Strings(got)
			if fmt.Sprint(got) != "[new/deep/inner scratch withc]" {
				t.Errorf("nested_repos = %v", rep.NestedRepos)
			}
			moved := filepath.Join(f.wt, ".git", "shim-nested", "1")
			if rep.NestedReposMovedTo != moved {
				t.Errorf("nested_repos_moved_to = %q, want %q", rep.NestedReposMovedTo, moved)
			}
			for p, want := range map[string]string{"scratch/notes.txt": "notes\n", "new/deep/inner/x.txt": "inner\n"} {
				if b, err := os.ReadFile(filepath.Join(moved, p)); err != nil || string(b) != want {
					t.Errorf("moved %s = %q, %v", p, b, err)
				}
			}
			if _, err := os.Stat(filepath.Join(moved, "scratch/.git/HEAD")); err != nil {
				t.Errorf("the nested repository's .git was not moved with it: %v", err)
			}
			for p, want := range map[string]string{"README.md": "edited\n", "new/x.txt": "x\n"} {
				if got, _ := f.blob(t, rep.SnapshotCommit, p); got != want {
					t.Errorf("snapshot %s = %q, want %q", p, got, want)
				}
			}
			if e := strings.Fields(tgit(t, f.wt, "ls-tree", rep.SnapshotCommit, "withc")); len(e) < 3 || e[0] != "160000" || e[2] != withcHead {
				t.Errorf("withc in the snapshot: %v, want a gitlink to %s", e, withcHead)
			}
			if _, ok := f.blob(t, rep.SnapshotCommit, "scratch/notes.txt"); ok {
				t.Error("scratch is in the snapshot")
			}
			f.assertBaseline(t)
			if uid >= 0 {
				assertOwned(t, f.wt, uid)
			}
			rep2, err := g.Restore(ctx, 1, f.baseline)
			if err != nil || rep2.NestedReposMovedTo != "" || fmt.Sprint(rep2.NestedRepos) != "[withc]" || rep2.SnapshotCommit != rep.SnapshotCommit {
				t.Errorf("second restore: %v %v %q %s", err, rep2.NestedRepos, rep2.NestedReposMovedTo, rep2.SnapshotCommit)
			}
		})
	}
}

// TestPlantedAttributesDoNotApplyToTheCheckout: the reset writes only the
// paths that differ, with checkout-index, which reads .gitattributes from
// the worktree first. Attributes the harness changed (tracked), added
// (untracked) or hid (ignored) must not convert what is written: every
// file comes back with the baseline's exact bytes.
func TestPlantedAttributesDoNotApplyToTheCheckout(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	base := map[string]string{
		".gitattributes": "*.txt -text\n",
		"-first.txt":     "$Id$\nfirst\n",
		"z.txt":          "$Id$\nlast\n",
		"sub/-x.txt":     "$Id$\nsub\n",
		"d/-y.txt":       "$Id$\nd\n",
	}
	for p, c := range base {
		writeFile(t, filepath.Join(f.wt, p), c)
		f.baseContent[p] = c
	}
	tgit(t, f.wt, "add", "-A")
	tgit(t, f.wt, "commit", "-q", "-m", "attributes")
	f.baseline = tgit(t, f.wt, "rev-parse", "HEAD")
	g := f.guard(t, nil)

	evil := "* text eol=crlf ident\n"
	writeFile(t, filepath.Join(f.wt, ".gitattributes"), evil)
	writeFile(t, filepath.Join(f.wt, "sub/.gitattributes"), evil)
	writeFile(t, filepath.Join(f.wt, "d/.gitattributes"), evil)
	writeFile(t, filepath.Join(f.wt, ".gitignore"), f.baseContent[".gitignore"]+"d/.gitattributes\n")
	for _, p := range []string{"-first.txt", "z.txt", "sub/-x.txt", "d/-y.txt", "README.md"} {
		writeFile(t, filepath.Join(f.wt, p), "changed\n")
	}
	rep, err := g.Restore(ctx, 1, f.baseline)
	if err != nil {
		t.Fatal(err)
	}
	f.assertBaseline(t)
	if !contains(rep.Ignored, "d/.gitattributes") {
		t.Errorf("ignored %v lacks d/.gitattributes", rep.Ignored)
	}
	if got, _ := f.blob(t, rep.SnapshotCommit, "sub/.gitattributes"); got != evil {
		t.Errorf("snapshot sub/.gitattributes = %q", got)
	}
}

// TestLooseScanSkipsOnlyUnchangedDirs: a loose-object directory skipped
// because it is unchanged since an earlier scan is read again as soon as a
// temporary object file appears in it.
func TestLooseScanSkipsOnlyUnchangedDirs(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	g := f.guard(t, nil)
	blob := filepath.Join(f.root, "loose.txt")
	writeFile(t, blob, "a loose object of its own\n")
	oid := tgit(t, f.wt, "hash-object", "-w", blob)
	fan := filepath.Join(f.wt, ".git", "objects", oid[:2])
	old := metadataNow
	defer func() { metadataNow = old }()
	// Every directory's ctime now lies well before the scan.
	metadataNow = func() time.Time { return time.Now().Add(time.Hour) }
	for gen := uint64(1); gen <= 2; gen++ {
		if _, err := g.Restore(ctx, gen, f.baseline); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := g.looseScanned[g.gitDir][oid[:2]]; !ok {
		t.Fatalf("%s not remembered as scanned: %v", fan, g.looseScanned)
	}
	writeFile(t, filepath.Join(fan, "tmp_obj_left"), "left by a killed git\n")
	rep, err := g.Restore(ctx, 3, f.baseline)
	if err != nil {
		t.Fatal(err)
	}
	if p := "objects/" + oid[:2] + "/tmp_obj_left"; !contains(rep.Cleaned, p) {
		t.Errorf("cleaned %v lacks %s", rep.Cleaned, p)
	}
	if _, err := os.Lstat(filepath.Join(fan, "tmp_obj_left")); err == nil {
		t.Errorf("tmp_obj_left still there")
	}
}
