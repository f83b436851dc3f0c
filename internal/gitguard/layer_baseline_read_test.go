package gitguard

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The fourth adversarial review (it found nothing; its tests keep what it
// checked): the rule that a tree the repository has is
// whole in the heads' history only if it is one of the baseline's
// (Guard.treesOf, one ls-tree per git dir and baseline).

// r5Harness has a harness's git do ops on the baseline in a scratch clone
// and commit, then leaves what its git wrote (the loose objects only, as
// in a layer over the repository) and its branch in the layer up; it
// returns the commit.
func r5Harness(t *testing.T, f *fixture, up, baseline string, ops func(dir string)) string {
	t.Helper()
	scratch := filepath.Join(t.TempDir(), "harness")
	tgit(t, f.root, "clone", "-q", "--no-local", f.wt, scratch)
	tgit(t, scratch, "checkout", "-q", "--detach", baseline)
	ops(scratch)
	head := tgit(t, scratch, "rev-parse", "HEAD")
	objs := filepath.Join(scratch, ".git", "objects")
	must(t, filepath.WalkDir(objs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(objs, p)
		if dir := filepath.Dir(rel); len(dir) == 2 && isHex(dir) {
			b, err := os.ReadFile(p)
			must(t, err)
			writeFile(t, filepath.Join(up, ".git", "objects", rel), string(b))
		}
		return nil
	}))
	writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), head+"\n")
	writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
	return head
}

func r5Commit(t *testing.T, dir, msg string) {
	t.Helper()
	tgit(t, dir, "add", "-A")
	tgit(t, dir, "commit", "-q", "--allow-empty", "-m", msg)
}

// r5Runs snapshots generation gen of up on baseline and returns the runs
// of the history's git commands (ls-tree, rev-list).
func r5Runs(t *testing.T, f *fixture, g *Guard, c *countingRunner, gen uint64, baseline, up string) (*Report, map[string]int) {
	t.Helper()
	c.reset()
	rep, err := g.SnapshotLayer(context.Background(), gen, baseline, up)
	if err != nil {
		t.Fatalf("gen %d: %v", gen, err)
	}
	runs := c.counts()
	return rep, map[string]int{"ls-tree": runs["ls-tree"], "rev-list": runs["rev-list"]}
}

func r5Whole(t *testing.T, f *fixture) {
	t.Helper()
	for _, args := range [][]string{{"rev-list", "--all", "--objects"}, {"fsck", "--connectivity-only", "--no-dangling"}, {"repack", "-a", "-d", "-q"}} {
		if out, err := tgitErr(f.wt, args...); err != nil {
			t.Errorf("git %s: %v\n%s", strings.Join(args, " "), err, lastLines(out))
		}
	}
}

// Ordinary harness commits are read from the layer: no rev-list, one
// ls-tree for the first snapshot on a baseline, none for the next.
func TestOrdinaryCommitsAreReadNotSentToGit(t *testing.T) {
	cases := map[string]func(dir string, gen uint64){
		"edit in a subdirectory": func(dir string, gen uint64) {
			writeFile(t, filepath.Join(dir, "src", "lib", "util.go"), fmt.Sprintf("package lib // %d\n", gen))
		},
		"add directories": func(dir string, gen uint64) {
			writeFile(t, filepath.Join(dir, "new", "deep", "er", "x.txt"), fmt.Sprintf("x %d\n", gen))
			writeFile(t, filepath.Join(dir, "data", "more", "y.txt"), fmt.Sprintf("y %d\n", gen))
		},
		"git mv a directory": func(dir string, gen uint64) {
			tgit(t, dir, "mv", "data/keep", fmt.Sprintf("data/moved%d", gen))
		},
		"git mv a directory into another": func(dir string, gen uint64) {
			tgit(t, dir, "mv", "dir with space", fmt.Sprintf("src/lib/moved%d", gen))
		},
		"delete a directory": func(dir string, gen uint64) {
			tgit(t, dir, "rm", "-rq", "data/keep")
			writeFile(t, filepath.Join(dir, "README.md"), fmt.Sprintf("gen %d\n", gen))
		},
		"three commits, the last back to the baseline's tree": func(dir string, gen uint64) {
			writeFile(t, filepath.Join(dir, "src", "lib", "util.go"), fmt.Sprintf("package lib // %d\n", gen))
			r5Commit(t, dir, "one")
			tgit(t, dir, "mv", "docs", "doc")
			r5Commit(t, dir, "two")
			tgit(t, dir, "checkout", "-q", "HEAD~2", "--", ".")
			tgit(t, dir, "rm", "-rq", "doc")
			writeFile(t, filepath.Join(dir, "gen"), fmt.Sprint(gen)) // a fresh root
		},
	}
	for name, op := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			c := &countingRunner{runs: map[string]int{}}
			g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
			for gen := uint64(1); gen <= 2; gen++ {
				up := filepath.Join(f.root, fmt.Sprintf("layer-%d", gen), "upper")
				head := r5Harness(t, f, up, f.baseline, func(dir string) { op(dir, gen); r5Commit(t, dir, "harness") })
				rep, runs := r5Runs(t, f, g, c, gen, f.baseline, up)
				want := map[string]int{"ls-tree": 0, "rev-list": 0}
				if gen == 1 {
					want["ls-tree"] = 1
				}
				if fmt.Sprint(runs) != fmt.Sprint(want) {
					t.Errorf("gen %d ran %v, want %v", gen, runs, want)
				}
				commits, _ := tgitErr(f.wt, "rev-list", "--count", head, "--not", f.baseline)
				if rep.HeadBefore != head || fmt.Sprint(rep.LocalCommits) != strings.TrimSpace(commits) {
					t.Errorf("gen %d: head_before %s, local_commits %d; want %s, %s", gen, rep.HeadBefore, rep.LocalCommits, head, commits)
				}
			}
			r5Whole(t, f)
		})
	}
}

// The cache follows the baseline: a moved baseline's trees are listed
// again, and a tree of the old baseline's only (whole, but not the new
// baseline's) goes to git. Back on the old baseline, its trees again.
func TestMovedBaseline(t *testing.T) {
	f := newFixture(t)
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	b1 := f.baseline
	up1 := filepath.Join(f.root, "layer-1", "upper")
	h1 := r5Harness(t, f, up1, b1, func(dir string) {
		writeFile(t, filepath.Join(dir, "docs", "guide.txt"), "gen 1\n")
		r5Commit(t, dir, "gen 1")
	})
	if rep, runs := r5Runs(t, f, g, c, 1, b1, up1); rep.HeadBefore != h1 || runs["ls-tree"] != 1 || runs["rev-list"] != 0 {
		t.Errorf("gen 1: head_before %s (want %s), ran %v", rep.HeadBefore, h1, runs)
	}
	// B2 changes src/lib: B1's src/lib and src trees are not B2's.
	writeFile(t, filepath.Join(f.wt, "src", "lib", "util.go"), "package lib // b2\n")
	tgit(t, f.wt, "commit", "-qam", "b2")
	b2 := tgit(t, f.wt, "rev-parse", "HEAD")
	up2 := filepath.Join(f.root, "layer-2", "upper")
	h2 := r5Harness(t, f, up2, b2, func(dir string) {
		tgit(t, dir, "revert", "--no-edit", "HEAD") // src back to B1's
		writeFile(t, filepath.Join(dir, "docs", "guide.txt"), "gen 2\n")
		r5Commit(t, dir, "gen 2")
	})
	rep, runs := r5Runs(t, f, g, c, 2, b2, up2)
	if rep.HeadBefore != h2 || runs["ls-tree"] != 1 || runs["rev-list"] == 0 {
		t.Errorf("gen 2 on the moved baseline: head_before %s (want %s), ran %v (want one ls-tree, git's check)", rep.HeadBefore, h2, runs)
	}
	t.Logf("a harness's revert of the baseline (a tree of the old baseline's) on the new baseline: %v", runs)
	up3 := filepath.Join(f.root, "layer-3", "upper")
	h3 := r5Harness(t, f, up3, b1, func(dir string) {
		writeFile(t, filepath.Join(dir, "docs", "guide.txt"), "gen 3\n")
		r5Commit(t, dir, "gen 3")
	})
	if rep, runs := r5Runs(t, f, g, c, 3, b1, up3); rep.HeadBefore != h3 || runs["ls-tree"] != 1 || runs["rev-list"] != 0 {
		t.Errorf("gen 3 back on B1: head_before %s (want %s), ran %v", rep.HeadBefore, h3, runs)
	}
	r5Whole(t, f)
}

// r5Baseline commits, in the worktree, the baseline's files and paths
// (each written with content "x"), and makes it the fixture's baseline.
func r5Baseline(t *testing.T, f *fixture, paths ...string) {
	t.Helper()
	for _, p := range paths {
		writeFile(t, filepath.Join(f.wt, p), "x\n")
	}
	tgit(t, f.wt, "add", "-A")
	tgit(t, f.wt, "commit", "-qm", "b2")
	f.baseline = tgit(t, f.wt, "rev-parse", "HEAD")
}

// Paths of the baseline that look like ls-tree records (tabs, newlines,
// "040000 tree ID" in a name) do not make a planted broken tree one of
// the baseline's.
func TestBaselinePathsThatLookLikeRecords(t *testing.T) {
	f, g, up := hostileLayer(t)
	missing := strings.Repeat("7", 40)
	ids := plantInRepository(t, f, g, 2, rawObject("tree", rawTree("100644 f "+missing)))
	p := ids[0]
	r5Baseline(t, f,
		"a\t040000 tree "+p+"/f",
		"b\n040000 tree "+p+"\tc/f",
		"040000 tree "+p+"/f",
		"\t040000 tree "+p+"/f",
		"d\n040000 tree "+p+"\n/f")
	head := plantHead(t, f, up, p)
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// A baseline with gitlinks (one naming the planted broken tree, one a
// commit no one has): ls-tree -d lists no gitlink as a tree.
func TestBaselineWithGitlinks(t *testing.T) {
	f, g, up := hostileLayer(t)
	missing := strings.Repeat("7", 40)
	ids := plantInRepository(t, f, g, 2, rawObject("tree", rawTree("100644 f "+missing)))
	tgit(t, f.wt, "update-index", "--add", "--cacheinfo", "160000,"+ids[0]+",sub/mod")
	tgit(t, f.wt, "update-index", "--add", "--cacheinfo", "160000,"+strings.Repeat("6", 40)+",mod2")
	tgit(t, f.wt, "commit", "-qm", "gitlinks")
	f.baseline = tgit(t, f.wt, "rev-parse", "HEAD")
	tgit(t, f.wt, "reset", "-q", "--hard") // the index as the commit
	head := plantHead(t, f, up, ids[0])
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// failingLsTree runs git, but fails every ls-tree.
type failingLsTree struct{ countingRunner }

func (r *failingLsTree) Run(ctx context.Context, cmd *exec.Cmd) error {
	for _, a := range cmd.Args {
		if a == "ls-tree" {
			r.count("ls-tree")
			return errors.New("ls-tree fails")
		}
	}
	return r.countingRunner.Run(ctx, cmd)
}

// A failing ls-tree: git decides, every time (no tree set is cached).
func TestFailingLsTree(t *testing.T) {
	f := newFixture(t)
	r := &failingLsTree{countingRunner{runs: map[string]int{}}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = r })
	missing := strings.Repeat("7", 40)
	ids := plantInRepository(t, f, g, 2, rawObject("tree", rawTree("100644 f "+missing)))
	up := filepath.Join(f.root, "layer", "upper")
	writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
	head := plantHead(t, f, up, ids[0])
	wantBrokenHeadLeftOut(t, f, g, up, head)
	up3 := filepath.Join(f.root, "layer-3", "upper")
	h3 := r5Harness(t, f, up3, f.baseline, func(dir string) {
		writeFile(t, filepath.Join(dir, "src", "lib", "util.go"), "package lib // 3\n")
		r5Commit(t, dir, "gen 3")
	})
	rep, runs := r5Runs(t, f, g, &r.countingRunner, 3, f.baseline, up3)
	if rep.HeadBefore != h3 || runs["ls-tree"] != 1 || runs["rev-list"] == 0 {
		t.Errorf("gen 3: head_before %s (want %s), ran %v", rep.HeadBefore, h3, runs)
	}
	r5Whole(t, f)
}

// SHA-256: a harness commit on a baseline subtree is read (no rev-list);
// a head on a planted broken tree is left out.
func TestSHA256(t *testing.T) {
	f := newFixture(t) // its directories; the repositories made again in SHA-256
	f.inSHA256(t)
	if len(f.baseline) != 64 {
		t.Fatalf("not a SHA-256 repository: %s", f.baseline)
	}
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	up1 := filepath.Join(f.root, "layer-1", "upper")
	h1 := r5Harness(t, f, up1, f.baseline, func(dir string) {
		writeFile(t, filepath.Join(dir, "src", "lib", "util.go"), "package lib // 1\n")
		r5Commit(t, dir, "gen 1")
	})
	if rep, runs := r5Runs(t, f, g, c, 1, f.baseline, up1); rep.HeadBefore != h1 || runs["ls-tree"] != 1 || runs["rev-list"] != 0 {
		t.Errorf("gen 1: head_before %s (want %s), ran %v", rep.HeadBefore, h1, runs)
	}
	// gen 2 plants a broken tree (its only head is the baseline); gen 3's
	// head names it.
	objs := func(up string) string { return filepath.Join(up, ".git", "objects") }
	up2 := filepath.Join(f.root, "layer-2", "upper")
	writeFile(t, filepath.Join(up2, "README.md"), "edited by the harness\n")
	broken := looseIn(t, objs(up2), 64, rawObject("tree", rawTree("100644 f "+strings.Repeat("7", 64))))
	src := tgit(t, f.wt, "rev-parse", f.baseline+":src")
	typed := looseIn(t, objs(up2), 64, rawObject("tree", rawTree("100644 f "+src)))
	r5Runs(t, f, g, c, 2, f.baseline, up2)
	for i, tree := range []string{broken, typed} {
		up := filepath.Join(f.root, fmt.Sprintf("layer-%d", 3+i), "upper")
		writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
		sub := tgit(t, f.wt, "rev-parse", f.baseline+":src/lib")
		root := looseIn(t, objs(up), 64, rawObject("tree", rawTree("40000 ok "+sub, "40000 bad "+tree)))
		body := fmt.Sprintf("tree %s\nparent %s\nauthor h <h@h> 1 +0000\ncommitter h <h@h> 1 +0000\n\nodd\n", root, f.baseline)
		head := looseIn(t, objs(up), 64, rawObject("commit", []byte(body)))
		writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), head+"\n")
		rep, runs := r5Runs(t, f, g, c, uint64(3+i), f.baseline, up)
		if rep.HeadBefore == head {
			t.Errorf("case %d: the broken head %s is the snapshot's parent (ran %v)", i, head, runs)
		}
	}
	r5Whole(t, f)
}

// Not a break: a later generation's harness that writes a tree an earlier
// layer brought in (the same new directory again, a redone task) is sent
// to git (the tree is the repository's, not the baseline's), once per
// snapshot; the head is kept, whole.
func TestSameNewDirectoryTwiceGoesToGit(t *testing.T) {
	f := newFixture(t)
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	for gen := uint64(1); gen <= 2; gen++ {
		up := filepath.Join(f.root, fmt.Sprintf("layer-%d", gen), "upper")
		head := r5Harness(t, f, up, f.baseline, func(dir string) {
			writeFile(t, filepath.Join(dir, "new", "x.txt"), "same\n")
			writeFile(t, filepath.Join(dir, "README.md"), fmt.Sprintf("gen %d\n", gen))
			r5Commit(t, dir, "harness")
		})
		rep, runs := r5Runs(t, f, g, c, gen, f.baseline, up)
		if rep.HeadBefore != head {
			t.Errorf("gen %d: head_before %s, want %s", gen, rep.HeadBefore, head)
		}
		t.Logf("gen %d ran %v", gen, runs)
	}
	r5Whole(t, f)
}

// A shallow repository: the baseline's trees are whole (shallow cuts
// commits only); a head on the baseline's tree whose parent is the
// baseline's parent (cut away) is left out; an ordinary one is read.
func TestShallowBaseline(t *testing.T) {
	f := newFixture(t)
	first := f.baseline
	writeFile(t, filepath.Join(f.wt, "src", "lib", "util.go"), "package lib // 2\n")
	tgit(t, f.wt, "commit", "-qam", "second")
	tgit(t, f.wt, "push", "-q", "origin", "main")
	must(t, os.RemoveAll(f.wt))
	tgit(t, f.root, "clone", "-q", "--depth", "1", "file://"+f.origin, f.wt)
	f.baseline = tgit(t, f.wt, "rev-parse", "HEAD")
	if _, err := os.Stat(filepath.Join(f.wt, ".git", "shallow")); err != nil {
		t.Fatalf("not shallow: %v", err)
	}
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	up1 := filepath.Join(f.root, "layer-1", "upper")
	h1 := r5Harness(t, f, up1, f.baseline, func(dir string) {
		writeFile(t, filepath.Join(dir, "src", "main.go"), "package main // 1\n")
		r5Commit(t, dir, "gen 1")
	})
	if rep, runs := r5Runs(t, f, g, c, 1, f.baseline, up1); rep.HeadBefore != h1 || runs["rev-list"] != 0 {
		t.Errorf("gen 1: head_before %s (want %s), ran %v", rep.HeadBefore, h1, runs)
	}
	up2 := filepath.Join(f.root, "layer-2", "upper")
	writeFile(t, filepath.Join(up2, "README.md"), "edited by the harness\n")
	baseTree := tgit(t, f.wt, "rev-parse", f.baseline+"^{tree}")
	body := fmt.Sprintf("tree %s\nparent %s\nauthor h <h@h> 1 +0000\ncommitter h <h@h> 1 +0000\n\ncut\n", baseTree, first)
	head := writeLoose(t, up2, "commit", body)
	writeFile(t, filepath.Join(up2, ".git", "refs", "heads", "main"), head+"\n")
	if rep, runs := r5Runs(t, f, g, c, 2, f.baseline, up2); rep.HeadBefore == head {
		t.Errorf("gen 2: the head on a parent the shallow repository lacks is the snapshot's parent (ran %v)", runs)
	}
	r5Whole(t, f)
}
