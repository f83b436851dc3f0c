package gitguard

import (
	"fmt"
	"path/filepath"
	"testing"
)

// Issue 27: a retried step that redoes its edit commits a tree the
// repository has already (the earlier snapshot's, or the earlier
// harness's, both imported then). The walk takes it for whole because
// shim wrote it or walked it whole before, not because the repository
// has it: no `rev-list --objects ... --not <baseline>` (a walk of the
// repository) on the fence's path. The control: a shim that knows
// nothing yet (a new Guard: a restarted shim) has git check the same
// history, as before.
func TestRetriedEditIsReadNotSentToGit(t *testing.T) {
	f := newFixture(t)
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	edit := func(gen uint64) (string, string) {
		up := filepath.Join(f.root, fmt.Sprintf("layer-%d", gen), "upper")
		head := r5Harness(t, f, up, f.baseline, func(dir string) {
			// the same edit every time; the commit differs (its message)
			writeFile(t, filepath.Join(dir, "src", "lib", "util.go"), "package lib // retried\n")
			writeFile(t, filepath.Join(dir, "new", "deep", "x.txt"), "x\n")
			r5Commit(t, dir, fmt.Sprintf("harness %d", gen))
		})
		// what the harness's git wrote and the lower had is not in the
		// layer: the trees of the retried edit are not fresh
		return up, head
	}
	check := func(g *Guard, gen uint64, wantRevList int) {
		t.Helper()
		up, head := edit(gen)
		rep, runs := r5Runs(t, f, g, c, gen, f.baseline, up)
		if runs["rev-list"] != wantRevList {
			t.Errorf("gen %d ran rev-list %d times, want %d (%v)", gen, runs["rev-list"], wantRevList, runs)
		}
		if rep.HeadBefore != head || rep.LocalCommits != 1 {
			t.Errorf("gen %d: head_before %s, local_commits %d; want %s, 1", gen, rep.HeadBefore, rep.LocalCommits, head)
		}
		if got := tgit(t, f.wt, "rev-parse", rep.SnapshotCommit+"^1"); got != head {
			t.Errorf("gen %d: the snapshot's first parent is %s, want the harness's head %s", gen, got, head)
		}
	}
	check(g, 1, 0) // fresh trees: read from the layer
	check(g, 2, 0) // the same trees, in the repository now: known whole
	check(g, 3, 0)
	// The control: the same retried edit, a shim that knows nothing.
	g2 := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	check(g2, 4, 2) // the check and the count of the harness's commits
	check(g2, 5, 0) // what git called whole is known whole from then on
	r5Whole(t, f)
	if out, err := tgitErr(f.wt, "fsck", "--no-dangling"); err != nil {
		t.Errorf("fsck: %v\n%s", err, lastLines(out))
	}
}
