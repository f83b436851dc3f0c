package gitguard

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/shimdev/shim/internal/snapshot"
	"golang.org/x/sys/unix"
)

// The layer snapshot describes its changes from fast-import's answers to
// the ls of every path it writes, not from a diff-tree of the commit it
// made. That description must be diff-tree's, path for path and in its
// order, for every shape a layer can have; the shapes the answers cannot
// describe alone (an opaque directory, a directory deleted or put where a
// file was) must go to diff-tree. Each case builds an upper by hand, as
// overlayfs leaves one (whiteouts are 0/0 character devices, an opaque
// directory has trusted.overlay.opaque=y), on a baseline with a symlink
// and a gitlink besides the fixture's files.
func TestLayerDescriptionIsDiffTrees(t *testing.T) {
	requireRoot(t) // whiteouts and the opaque xattr
	f := newFixture(t)
	must(t, os.Symlink("README.md", filepath.Join(f.wt, "link")))
	tgit(t, f.wt, "add", "link")
	tgit(t, f.wt, "update-index", "--add", "--cacheinfo", "160000,"+f.baseline+",sub")
	tgit(t, f.wt, "commit", "-q", "-m", "a symlink and a gitlink")
	base := tgit(t, f.wt, "rev-parse", "HEAD")
	g := f.guard(t, nil)

	file, whiteout, opaque, symlink := upperBuilders(t)
	cases := []struct {
		name  string
		fast  bool // described from the import's answers
		build func(up string)
	}{
		{"edits, additions, deletions", true, func(up string) {
			file(up, "README.md", "edited\n", 0o644)
			file(up, "new.txt", "new\n", 0o644)
			file(up, "deep/er/new.txt", "deeper\n", 0o644)
			whiteout(up, "docs/guide.txt")
			whiteout(up, "data/keep/a.txt")
		}},
		{"a copy-up of the same bytes is no change", true, func(up string) {
			file(up, "src/main.go", baseFiles["src/main.go"], 0o644)
			file(up, "script.sh", baseFiles["script.sh"], 0o755)
			file(up, "src/lib/util.go", "package lib // edited\n", 0o644)
		}},
		{"modes", true, func(up string) {
			file(up, "README.md", baseFiles["README.md"], 0o755)  // +x only
			file(up, "script.sh", baseFiles["script.sh"], 0o644)  // -x only
			file(up, "docs/guide.txt", "line 1\nline 2\n", 0o700) // +x, same bytes
		}},
		{"symlinks and type changes", true, func(up string) {
			symlink(up, "README.md", "elsewhere")   // file -> symlink
			file(up, "link", "now a file\n", 0o644) // symlink -> file
			symlink(up, "new-link", "src/main.go")  // added
			file(up, "sub", "a file where a gitlink was\n", 0o644)
		}},
		{"an unchanged symlink, a retargeted one", true, func(up string) {
			symlink(up, "link", "README.md")
			symlink(up, "deep/link", "x")
			whiteout(up, "src/main.go")
		}},
		{"a gitlink deleted", true, func(up string) { whiteout(up, "sub") }},
		{"names that need quoting, in diff-tree's order", true, func(up string) {
			for _, p := range []string{"a-b", "a/c", "a.b", "a b", "quote\"d", "back\\slash", "tab\there", "new\nline", "é.txt", "dir with space/x", "dir with space/y"} {
				file(up, p, "content of "+p+"\n", 0o644)
			}
		}},
		{"an empty directory is no change", true, func(up string) {
			must(t, os.MkdirAll(filepath.Join(up, "empty", "dirs"), 0o755))
			must(t, os.MkdirAll(filepath.Join(up, "src"), 0o755))
		}},
		{"a directory deleted", false, func(up string) {
			whiteout(up, "data")
			file(up, "README.md", "edited\n", 0o644)
		}},
		{"an opaque directory", false, func(up string) {
			opaque(up, "data/keep")
			file(up, "data/keep/a.txt", "a\n", 0o644) // the same bytes again
			file(up, "data/keep/c.txt", "c\n", 0o644)
		}},
		{"a directory where a file was", false, func(up string) {
			file(up, "README.md/inside", "x\n", 0o644)
		}},
		{"a file where a directory was", false, func(up string) {
			file(up, "docs", "no more docs\n", 0o644)
		}},
		{"a directory where a gitlink was", false, func(up string) {
			file(up, "sub/x", "x\n", 0o644)
		}},
	}
	baseTree := treeOf(t, g, base)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gen := uint64(i + 1)
			up := builtUpper(t, f, gen, c.build)
			if fast := importAnswers(t, g, up, base, baseTree); fast != c.fast {
				t.Errorf("described from the import's answers: %v, want %v", fast, c.fast)
			}
			want := describedAsDiffTree(t, g, gen, base, baseTree, up)
			if len(want.Paths) == 0 && c.name != "an empty directory is no change" && c.name != "a copy-up of the same bytes is no change" {
				t.Errorf("diff-tree found no change: the case tests nothing")
			}
		})
	}
}

// treeOf is rev's tree, as the guard's git resolves it.
func treeOf(t *testing.T, g *Guard, rev string) string {
	t.Helper()
	res, err := g.lookup(context.Background(), []string{rev + "^{tree}"})
	must(t, err)
	return res[0].oid
}

// builtUpper is generation gen's upper below the fixture's root, made by
// build.
func builtUpper(t *testing.T, f *fixture, gen uint64, build func(up string)) string {
	t.Helper()
	up := filepath.Join(f.root, fmt.Sprintf("layer-%d", gen), "upper")
	must(t, os.MkdirAll(up, 0o755))
	build(up)
	return up
}

// upperBuilders make an upper's entries by hand, as overlayfs leaves
// them: a file (its mode exactly), a whiteout (a 0/0 character device),
// an opaque directory (trusted.overlay.opaque=y), a symlink; each with
// its parents.
func upperBuilders(t *testing.T) (file func(up, p, c string, mode os.FileMode), whiteout, opaque func(up, p string), symlink func(up, p, to string)) {
	parent := func(up, p string) { must(t, os.MkdirAll(filepath.Dir(filepath.Join(up, p)), 0o755)) }
	file = func(up, p, c string, mode os.FileMode) {
		t.Helper()
		parent(up, p)
		must(t, os.WriteFile(filepath.Join(up, p), []byte(c), mode))
		must(t, os.Chmod(filepath.Join(up, p), mode))
	}
	whiteout = func(up, p string) {
		t.Helper()
		parent(up, p)
		must(t, unix.Mknod(filepath.Join(up, p), unix.S_IFCHR, 0))
	}
	opaque = func(up, p string) {
		t.Helper()
		must(t, os.MkdirAll(filepath.Join(up, p), 0o755))
		must(t, unix.Setxattr(filepath.Join(up, p), "trusted.overlay.opaque", []byte("y"), 0))
	}
	symlink = func(up, p, to string) {
		t.Helper()
		parent(up, p)
		must(t, os.Symlink(to, filepath.Join(up, p)))
	}
	return file, whiteout, opaque, symlink
}

// describedAsDiffTree snapshots the layer up as generation gen and wants
// its description to be diff-tree's of the same commit; it returns
// diff-tree's.
func describedAsDiffTree(t *testing.T, g *Guard, gen uint64, base, baseTree, up string) *Report {
	t.Helper()
	ctx := context.Background()
	rep, err := g.SnapshotLayer(ctx, gen, base, up)
	if err != nil {
		t.Fatalf("SnapshotLayer: %v", err)
	}
	want := &Report{SnapshotCommit: rep.SnapshotCommit, HeadBefore: rep.HeadBefore}
	must(t, g.describeLayer(ctx, base, baseTree, want))
	if !reflect.DeepEqual(rep.Paths, want.Paths) || rep.Modified != want.Modified || rep.Added != want.Added || rep.Deleted != want.Deleted {
		t.Errorf("the snapshot's description:\n  %d modified, %d added, %d deleted: %v\ndiff-tree's:\n  %d modified, %d added, %d deleted: %v",
			rep.Modified, rep.Added, rep.Deleted, rep.Paths, want.Modified, want.Added, want.Deleted, want.Paths)
	}
	return want
}

// importAnswers runs shim's import of up (into a throwaway ref) and
// reports whether its changes describe the layer.
func importAnswers(t *testing.T, g *Guard, up, base, baseTree string) bool {
	t.Helper()
	answers++
	c := snapshot.Commit{Ref: fmt.Sprintf("%stest-answers-%d", RefPrefix, answers), Msg: "answers\n", BaseTree: baseTree, Parents: []string{base}, Now: 1700000000}
	_, described, err := inShim(t, g, up, c)
	if err != nil {
		t.Fatalf("importInShim: %v", err)
	}
	return described
}

var answers int

// countingRunner runs git and counts the commands it ran, by name.
type countingRunner struct {
	mu   sync.Mutex
	runs map[string]int
}

func (c *countingRunner) Run(ctx context.Context, cmd *exec.Cmd) error {
	name := ""
	for i, a := range cmd.Args[1:] {
		if !strings.HasPrefix(a, "-") && (i == 0 || cmd.Args[i] != "-c") {
			name = a
			break
		}
	}
	c.count(name)
	return ExecRunner{}.Run(ctx, cmd)
}

func (c *countingRunner) count(name string) {
	c.mu.Lock()
	c.runs[name]++
	c.mu.Unlock()
}

// reset forgets what ran so far.
func (c *countingRunner) reset() {
	c.mu.Lock()
	c.runs = map[string]int{}
	c.mu.Unlock()
}

// counts is what ran since the last reset, by name.
func (c *countingRunner) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.runs)
}

// What a layer snapshot runs: for a layer of plain edits, no git at all
// (the import runs in shim) but a cat-file for the baseline the first time
// a baseline is seen (its tree is then known); diff-tree never.
func TestALayerSnapshotRunsOneGitOnAKnownBaseline(t *testing.T) {
	f := newFixture(t)
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	for gen := uint64(1); gen <= 3; gen++ {
		up := filepath.Join(f.root, fmt.Sprintf("layer-%d", gen), "upper")
		writeFile(t, filepath.Join(up, "README.md"), fmt.Sprintf("edit %d\n", gen))
		writeFile(t, filepath.Join(up, "new", "file.txt"), "new\n")
		c.reset()
		rep, err := g.SnapshotLayer(context.Background(), gen, f.baseline, up)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Modified != 1 || rep.Added != 1 {
			t.Errorf("gen %d: %d modified, %d added", gen, rep.Modified, rep.Added)
		}
		want := map[string]int{}
		if gen == 1 {
			want["cat-file"] = 1
		}
		got := c.counts()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("gen %d's snapshot ran %v, want %v", gen, got, want)
		}
	}
}

// A harness's git copies a pack of the lower's up into its layer when it
// freshens an object in it (it touches the pack's mtime): that copy is not
// read again (no index-pack), while a pack of the harness's own is.
func TestALayersCopyOfTheLowersPackIsNotReadAgain(t *testing.T) {
	f := newFixture(t)
	tgit(t, f.wt, "repack", "-adq")
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	packs, _ := filepath.Glob(filepath.Join(f.wt, ".git", "objects", "pack", "*.pack"))
	if len(packs) != 1 {
		t.Fatalf("packs %v", packs)
	}
	up := filepath.Join(f.root, "layer", "upper")
	writeFile(t, filepath.Join(up, "README.md"), "edited\n")
	b, err := os.ReadFile(packs[0])
	must(t, err)
	writeFile(t, filepath.Join(up, ".git", "objects", "pack", filepath.Base(packs[0])), string(b))
	rep, err := g.SnapshotLayer(context.Background(), 1, f.baseline, up)
	if err != nil {
		t.Fatal(err)
	}
	if c.runs["index-pack"] != 0 || len(rep.NotStored) != 0 {
		t.Errorf("the copy of the lower's pack: %d index-packs, not stored %v", c.runs["index-pack"], rep.NotStored)
	}
	// The same name with other bytes is the harness's: read (and refused).
	b[len(b)-1] ^= 0xff
	up2 := filepath.Join(f.root, "layer2", "upper")
	writeFile(t, filepath.Join(up2, "README.md"), "edited again\n")
	writeFile(t, filepath.Join(up2, ".git", "objects", "pack", filepath.Base(packs[0])), string(b))
	rep, err = g.SnapshotLayer(context.Background(), 2, f.baseline, up2)
	if err != nil {
		t.Fatal(err)
	}
	if c.runs["index-pack"] != 1 || len(rep.NotStored) != 1 || rep.NotStored[0].Type != "pack_rejected" {
		t.Errorf("a pack that only has the lower's name: %d index-packs, not stored %v", c.runs["index-pack"], rep.NotStored)
	}
}
