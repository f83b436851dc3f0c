package gitguard

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Maintenance keeps the repository flat over many generations: snapshot
// refs past the policy go with their objects, new packs are rolled up, and
// the locks of a killed git never accumulate.

// abandon is one generation of a harness: an edit committed, an untracked
// file, then the restore that saves them as the generation's snapshot.
func abandon(t *testing.T, f *fixture, g *Guard, gen uint64) *Report {
	t.Helper()
	n := strconv.FormatUint(gen, 10)
	writeFile(t, filepath.Join(f.wt, "README.md"), "# test\nedit of generation "+n+"\n")
	tgit(t, f.wt, "commit", "-qam", "generation "+n)
	writeFile(t, filepath.Join(f.wt, "new-"+n+".txt"), "only in generation "+n+"\n")
	rep, err := g.Restore(context.Background(), gen, f.baseline)
	if err != nil {
		t.Fatalf("restore %d: %v", gen, err)
	}
	return rep
}

func TestMaintainPrunesSnapshotsWithTheirObjects(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	ctx := context.Background()
	var commits []string
	for gen := uint64(1); gen <= 6; gen++ {
		commits = append(commits, abandon(t, f, g, gen).SnapshotCommit)
	}
	// Control: without maintenance every snapshot and its objects stay.
	for _, c := range commits {
		if _, err := tgitErr(f.wt, "cat-file", "-e", c); err != nil {
			t.Fatalf("snapshot %s missing before any maintenance: %v", c, err)
		}
	}
	// keep 2, slack 1: 6 > 3, so 4 go; generation 2 is protected (its
	// fence is pending) and stays.
	rep, err := g.Maintain(ctx, MaintainOptions{KeepSnapshots: 2, Slack: 1, Protect: func(n uint64) bool { return n == 2 }})
	if err != nil {
		t.Fatalf("maintain: %v %+v", err, rep)
	}
	want := []string{RefPrefix + "4", RefPrefix + "3", RefPrefix + "1"}
	if !slices.Equal(rep.SnapshotsPruned, want) || !rep.ObjectsPruned || rep.Repack != "full" || rep.SnapshotsKept != 3 {
		t.Fatalf("report %+v, want pruned %v with their objects", rep, want)
	}
	list, _ := g.List(ctx)
	var kept []uint64
	for _, s := range list {
		kept = append(kept, s.Generation)
	}
	if !slices.Equal(kept, []uint64{6, 5, 2}) {
		t.Errorf("kept %v", kept)
	}
	for i, c := range commits {
		_, err := tgitErr(f.wt, "cat-file", "-e", c)
		gone := err != nil
		if wantGone := i == 0 || i == 2 || i == 3; gone != wantGone {
			t.Errorf("snapshot of generation %d: gone %v, want %v", i+1, gone, wantGone)
		}
	}
	// The untracked file of a pruned generation (only its snapshot had
	// it) is gone from the object store too; a kept one's is there.
	for gen, wantGone := range map[int]bool{1: true, 6: false} {
		n := strconv.Itoa(gen)
		oid := hashOf(t, f, "only in generation "+n+"\n")
		_, err := tgitErr(f.wt, "cat-file", "-e", oid)
		if (err != nil) != wantGone {
			t.Errorf("untracked file of generation %d: gone %v, want %v", gen, err != nil, wantGone)
		}
	}
	if rep.PacksAfter != 1 || rep.LooseAfter != 0 {
		t.Errorf("after a full repack: %d packs, %d loose objects", rep.PacksAfter, rep.LooseAfter)
	}
	// The worktree is as the restore left it: at the baseline, clean.
	if out := tgit(t, f.wt, "status", "--porcelain"); out != "" {
		t.Errorf("worktree not clean after maintenance: %q", out)
	}
	if _, err := g.Restore(ctx, 7, f.baseline); err != nil {
		t.Errorf("restore after maintenance: %v", err)
	}
}

// hashOf is the blob id of content, computed without writing it.
func hashOf(t *testing.T, f *fixture, content string) string {
	t.Helper()
	p := filepath.Join(f.outside, "blob")
	must(t, os.WriteFile(p, []byte(content), 0o644))
	return tgit(t, f.root, "hash-object", "--no-filters", p)
}

func TestMaintainRollsUpPacksWithoutPruning(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	for gen := uint64(1); gen <= maintainMaxPacks+2; gen++ {
		abandon(t, f, g, gen)
	}
	// keep 0: nothing is pruned, ever; the packs are still rolled up.
	rep, err := g.Maintain(context.Background(), MaintainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.SnapshotsPruned) != 0 || rep.ObjectsPruned || rep.SnapshotsKept != maintainMaxPacks+2 {
		t.Errorf("keep 0 pruned: %+v", rep)
	}
	if rep.PacksBefore < maintainMaxPacks && rep.LooseBefore < maintainMaxLoose {
		t.Skipf("this git wrote %d packs and %d loose objects: no roll-up due", rep.PacksBefore, rep.LooseBefore)
	}
	if rep.Repack != "geometric" || !rep.RefsPacked || rep.PacksAfter >= rep.PacksBefore {
		t.Errorf("want a geometric roll-up: %+v", rep)
	}
	if list, _ := g.List(context.Background()); len(list) != maintainMaxPacks+2 {
		t.Errorf("snapshots after the roll-up: %d", len(list))
	}
	if gens := func() []uint64 { _, g := SnapshotGenerations(f.state); return g }(); len(gens) != maintainMaxPacks+2 {
		t.Errorf("SnapshotGenerations after pack-refs: %v", gens)
	}
}

func TestTidyRemovesTheLocksOfAKilledGit(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	gd := filepath.Join(f.wt, ".git")
	for _, p := range []string{"index.lock", "gc.log.lock", "gc.pid", "HEAD.lock", "refs/heads/main.lock", "objects/pack/tmp_pack_x"} {
		writeFile(t, filepath.Join(gd, p), "")
	}
	writeFile(t, filepath.Join(gd, "MERGE_HEAD"), f.baseline+"\n")
	// Control: a git of the owner's cannot commit with index.lock there.
	writeFile(t, filepath.Join(f.wt, "README.md"), "edited\n")
	if out, err := tgitErr(f.wt, "commit", "-qam", "x"); err == nil {
		t.Fatalf("commit with index.lock present succeeded: %s", out)
	}
	cleaned, err := g.Tidy(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"index.lock", "gc.log.lock", "gc.pid", "HEAD.lock", "refs/heads/main.lock", "objects/pack/tmp_pack_x"} {
		if !slices.Contains(cleaned, p) {
			t.Errorf("%s not reported as cleaned: %v", p, cleaned)
		}
		if _, err := os.Lstat(filepath.Join(gd, p)); !os.IsNotExist(err) {
			t.Errorf("%s still there", p)
		}
	}
	// An operation in progress may be a person's: left as it is.
	if _, err := os.Lstat(filepath.Join(gd, "MERGE_HEAD")); err != nil {
		t.Errorf("MERGE_HEAD removed by Tidy: %v", err)
	}
	os.Remove(filepath.Join(gd, "MERGE_HEAD"))
	tgit(t, f.wt, "commit", "-qam", "after the tidy")
}

// A pruned snapshot stays pruned: the next restore, which puts back every
// ref that differs from the trusted namespace, must not bring it back
// (pointing at objects the repack deleted, it broke for-each-ref and so
// every later maintenance).
func TestAPrunedSnapshotIsNotPutBackByTheNextRestore(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	ctx := context.Background()
	for gen := uint64(1); gen <= 4; gen++ {
		abandon(t, f, g, gen)
	}
	rep, err := g.Maintain(ctx, MaintainOptions{KeepSnapshots: 1, Slack: 1})
	if err != nil || len(rep.SnapshotsPruned) != 3 {
		t.Fatalf("maintain: %v %+v", err, rep)
	}
	abandon(t, f, g, 5)
	for _, ref := range rep.SnapshotsPruned {
		if _, err := tgitErr(f.wt, "rev-parse", "-q", "--verify", ref); err == nil {
			t.Errorf("%s is back after the next restore", ref)
		}
	}
	if _, err := g.Maintain(ctx, MaintainOptions{KeepSnapshots: 1, Slack: 1}); err != nil {
		t.Errorf("the next maintenance: %v", err)
	}
}

// nameable lists every commit a generation started now could build on:
// what the repository's refs and reflogs reach.
func nameable(t *testing.T, f *fixture) []string {
	t.Helper()
	return strings.Fields(tgit(t, f.wt, "rev-list", "--all", "--reflog"))
}

// missing lists the commits of list whose history the repository no
// longer has whole.
func missing(f *fixture, list []string) []string {
	var gone []string
	for _, c := range list {
		if _, err := tgitErr(f.wt, "rev-list", "--objects", "-n", "1", c); err != nil {
			gone = append(gone, c)
		}
	}
	return gone
}

// A layered worktree's lower is repacked beside the next generation, which
// can build on any commit the lower's refs and reflogs name. Its snapshot
// refs are therefore pruned in the fence, before that generation starts
// (PruneSnapshots: refs and reflog entries, no object), and the repack
// beside it (Maintain, keep 0) drops their objects without touching any
// commit the generation could name. The control: the refs pruned beside
// the running generation (the order before) delete commits it could have
// built on.
func TestSnapshotRefsPrunedBeforeAGenerationNeverLoseWhatItCanName(t *testing.T) {
	ctx := context.Background()
	run := func(t *testing.T, inFence bool) (lost, pruned []string, objectsGone bool) {
		f := newFixture(t)
		g := f.guard(t, nil)
		var first string
		for gen := uint64(1); gen <= 6; gen++ {
			rep := abandon(t, f, g, gen)
			if gen == 1 {
				first = rep.SnapshotCommit
			}
		}
		keep := MaintainOptions{KeepSnapshots: 2, Slack: 1}
		if inFence {
			rep, err := g.PruneSnapshots(ctx, keep)
			if err != nil {
				t.Fatalf("prune snapshots: %v %+v", err, rep)
			}
			pruned = rep.SnapshotsPruned
			if _, err := tgitErr(f.wt, "cat-file", "-e", first); err != nil {
				t.Fatalf("the prune in the fence deleted objects: %v", err)
			}
			keep = MaintainOptions{} // the background maintenance prunes no ref
		}
		canName := nameable(t, f) // the next generation starts here
		rep, err := g.Maintain(ctx, keep)
		if err != nil {
			t.Fatalf("maintain: %v %+v", err, rep)
		}
		if !inFence {
			pruned = rep.SnapshotsPruned
		}
		_, err = tgitErr(f.wt, "cat-file", "-e", first)
		return missing(f, canName), pruned, err != nil && rep.ObjectsPruned
	}
	lost, pruned, gone := run(t, true)
	if len(lost) != 0 {
		t.Errorf("the repack deleted %d commits a generation started after the prune could name: %v", len(lost), lost)
	}
	if len(pruned) != 4 || !gone {
		t.Errorf("pruned %v, objects of generation 1 gone %v: want 4 refs pruned in the fence and their objects by the repack", pruned, gone)
	}
	// The control.
	lost, pruned, _ = run(t, false)
	if len(pruned) != 4 || len(lost) == 0 {
		t.Errorf("control: pruned %v beside the running generation, lost %v: want commits it could name lost", pruned, lost)
	}
}
