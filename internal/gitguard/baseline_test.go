package gitguard

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRestoreResolvesTheBaselineAfterTheMetadata: Restore takes a ref name
// or a commit id not resolved yet and reports both what was asked and the
// commit; HEAD means the registration's HEAD, not the one the harness left.
func TestRestoreResolvesTheBaselineAfterTheMetadata(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	g := f.guard(t, nil)
	// The harness switches to a branch of its own, with a commit, and
	// breaks the config (which shim puts back before resolving).
	tgit(t, f.wt, "checkout", "-q", "-b", "evil")
	writeFile(t, filepath.Join(f.wt, "README.md"), "evil\n")
	tgit(t, f.wt, "commit", "-q", "-am", "evil")
	evil := tgit(t, f.wt, "rev-parse", "HEAD")
	must(t, os.WriteFile(filepath.Join(f.wt, ".git/config"), []byte("[core\ngarbage"), 0o644))
	for i, rev := range []string{"HEAD", "refs/remotes/origin/main", "main", f.baseline[:12]} {
		rep, err := g.Restore(ctx, uint64(i+1), rev)
		if err != nil {
			t.Fatalf("restore to %q: %v", rev, err)
		}
		if rep.Baseline != f.baseline || rep.BaselineRev != rev {
			t.Errorf("restore to %q: baseline %s, baseline_rev %q", rev, rep.Baseline, rep.BaselineRev)
		}
		if i == 0 && rep.HeadBefore != evil {
			t.Errorf("head_before %s, want the harness's commit %s", rep.HeadBefore, evil)
		}
		f.assertBaseline(t)
	}
}

// TestUnresolvableBaselineStillSavesTheEdits: the harness (as the
// worktree's unprivileged owner) deletes the baseline's commit object.
// Restore fails with RESTORE_FAILED (not BAD_REQUEST) naming the revision,
// resets nothing, and has saved every edit as the whole worktree's tree
// under the generation's ref; a repeated restore keeps that snapshot.
func TestUnresolvableBaselineStillSavesTheEdits(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	f := newFixture(t)
	chownR(t, f.wt, 65534)
	g := f.guard(t, nil)
	f.commonEdits(t)
	chownR(t, f.wt, 65534)
	obj := filepath.Join(f.wt, ".git/objects", f.baseline[:2], f.baseline[2:])
	if _, err := os.Stat(obj); err != nil {
		t.Fatalf("the baseline is not a loose object: %v", err)
	}
	rm := exec.Command("/bin/rm", "-f", obj)
	rm.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	if out, err := rm.CombinedOutput(); err != nil {
		t.Fatalf("rm as uid 65534: %v %s", err, out)
	}

	for _, rev := range []string{f.baseline, "refs/heads/main"} {
		rep, err := g.Restore(ctx, 1, rev)
		if code(err) != CodeRestoreFailed || !strings.Contains(err.Error(), `baseline "`+rev+`"`) {
			t.Fatalf("restore to %q = %v, want RESTORE_FAILED naming it", rev, err)
		}
		if rep == nil || rep.SnapshotCommit == "" || rep.Baseline != "" || rep.BaselineRev != rev {
			t.Fatalf("report %+v", rep)
		}
		if !strings.Contains(err.Error(), rep.SnapshotCommit) {
			t.Errorf("the error does not say where the edits are: %v", err)
		}
		if got := tgit(t, f.wt, "rev-parse", RefPrefix+"1"); got != rep.SnapshotCommit {
			t.Errorf("ref %s, report %s", got, rep.SnapshotCommit)
		}
		snapshot := rep.SnapshotCommit
		if got := tgit(t, f.wt, "show", snapshot+":README.md"); got != strings.TrimSpace(editReadme) {
			t.Errorf("snapshot README = %q", got)
		}
		if got := tgit(t, f.wt, "show", snapshot+":newdir/deep/new.txt"); got != strings.TrimSpace(editNew) {
			t.Errorf("snapshot new.txt = %q", got)
		}
		if _, err := tgitErr(f.wt, "cat-file", "-e", snapshot+":docs/guide.txt"); err == nil {
			t.Error("the deleted file is in the snapshot")
		}
		if got := tgit(t, f.wt, "show", snapshot+":src/main.go"); got != strings.TrimSpace(baseFiles["src/main.go"]) {
			t.Errorf("unchanged file in the snapshot = %q", got)
		}
		if got := readFileT(t, filepath.Join(f.wt, "README.md")); got != editReadme {
			t.Errorf("the worktree was reset: README = %q", got)
		}
		if rev != f.baseline && !rep.SnapshotReused {
			t.Errorf("the repeated restore replaced the snapshot")
		}
	}
	snaps, err := g.List(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].Baseline != "" {
		t.Errorf("list %+v %v", snaps, err)
	}
}
