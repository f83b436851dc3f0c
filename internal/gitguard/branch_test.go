package gitguard

import (
	"context"
	"strings"
	"testing"
)

// An announcement's branch: the worktree is put on it at the baseline (the
// files and index unchanged); a harness's commits on it are saved by the
// restore like any other (snapshot parents, refs/shim/harness/<gen>/...),
// the branch goes back to the baseline, and HEAD back to the pristine
// branch.
func TestPutOnBranch(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	g := f.guard(t, nil)
	for _, bad := range []string{"", "HEAD", "-x", "a..b", "a b", "x.lock", "a/", "@{u}"} {
		if err := g.PutOnBranch(ctx, bad, f.baseline); code(err) != CodeBadRequest {
			t.Errorf("branch %q: %v", bad, err)
		}
	}
	if err := g.PutOnBranch(ctx, "task-43", "main"); code(err) != CodeBadRequest {
		t.Errorf("a ref for a commit id: %v", err)
	}
	must(t, g.PutOnBranch(ctx, "task-43", f.baseline))
	if h := tgit(t, f.wt, "symbolic-ref", "HEAD"); h != "refs/heads/task-43" {
		t.Fatalf("HEAD is %s", h)
	}
	if c := tgit(t, f.wt, "rev-parse", "task-43"); c != f.baseline {
		t.Fatalf("task-43 at %s", c)
	}
	if s := tgit(t, f.wt, "status", "--porcelain"); s != "" {
		t.Fatalf("the worktree changed: %q", s)
	}
	// The harness commits on it.
	writeFile(t, f.wt+"/feature.txt", "feature\n")
	tgit(t, f.wt, "add", "feature.txt")
	tgit(t, f.wt, "commit", "-q", "-m", "on task-43")
	tip := tgit(t, f.wt, "rev-parse", "HEAD")
	rep, err := g.Restore(ctx, 1, f.baseline)
	if err != nil {
		t.Fatal(err)
	}
	f.assertBaseline(t)
	if h := tgit(t, f.wt, "symbolic-ref", "HEAD"); h != "refs/heads/main" {
		t.Errorf("HEAD after the restore: %s", h)
	}
	if c := tgit(t, f.wt, "rev-parse", "task-43"); c != f.baseline {
		t.Errorf("task-43 after the restore: %s", c)
	}
	if _, err := tgitErr(f.wt, "merge-base", "--is-ancestor", tip, rep.SnapshotRef); err != nil {
		t.Errorf("the commit on task-43 is not in the snapshot")
	}
	saved := tgit(t, f.wt, "for-each-ref", "--format=%(refname) %(objectname)", "refs/shim/harness/")
	if !strings.Contains(saved, "refs/shim/harness/1/refs/heads/task-43 "+tip) {
		t.Errorf("the harness's task-43 is not kept: %q", saved)
	}
	// The next announcement names it again: the same branch, back at the baseline.
	must(t, g.PutOnBranch(ctx, "task-43", f.baseline))
	if h := tgit(t, f.wt, "rev-parse", "HEAD"); h != f.baseline {
		t.Errorf("HEAD %s", h)
	}
}

// A harness that plants what would make the next announcement's branch
// fail to be created (a ref below its name, so refs/heads/task-43 is a
// directory; a lock file on it) cannot stop it: the restore puts the
// trusted ref namespace back first. Control: without the restore, git
// itself refuses to create the branch.
func TestPutOnBranchAfterAPlantedRefDirectory(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	g := f.guard(t, nil)
	plant := func() {
		tgit(t, f.wt, "update-ref", "refs/heads/task-43/x", f.baseline)
		writeFile(t, f.wt+"/.git/refs/heads/task-43.lock", "")
	}
	plant()
	if _, err := tgitErr(f.wt, "update-ref", "refs/heads/task-43", f.baseline); err == nil {
		t.Fatal("control: git created the branch over a planted directory")
	}
	if _, err := g.Restore(ctx, 1, f.baseline); err != nil {
		t.Fatal(err)
	}
	must(t, g.PutOnBranch(ctx, "task-43", f.baseline))
	if h := tgit(t, f.wt, "rev-parse", "--symbolic-full-name", "HEAD"); h != "refs/heads/task-43" {
		t.Fatalf("HEAD %s", h)
	}
	if saved := tgit(t, f.wt, "for-each-ref", "--format=%(refname)", "refs/shim/harness/"); !strings.Contains(saved, "refs/shim/harness/1/refs/heads/task-43/x") {
		t.Errorf("the planted ref is not kept aside: %q", saved)
	}
}
