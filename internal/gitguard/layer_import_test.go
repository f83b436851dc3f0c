package gitguard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/gitformat"
	"github.com/shimdev/shim/internal/snapshot"
	"golang.org/x/sys/unix"
)

// inShim runs shim's import of the upper up as commit c.
func inShim(t *testing.T, g *Guard, up string, c snapshot.Commit) (string, bool, error) {
	t.Helper()
	ufd, err := openDir(up)
	must(t, err)
	defer unix.Close(ufd)
	return g.importInShim(context.Background(), ufd, c, &Report{})
}

// byGit imports the upper up as commit c with git fast-import, as
// importLayer runs it but on a throwaway ref, and returns the commit.
func byGit(t *testing.T, g *Guard, up string, c snapshot.Commit) string {
	t.Helper()
	ufd, err := openDir(up)
	must(t, err)
	defer unix.Close(ufd)
	c.Ref = "refs/shim-test/git"
	commit, err := g.importByGit(context.Background(), ufd, c, true, &Report{})
	if err != nil {
		t.Fatalf("fast-import: %v", err)
	}
	return commit
}

// The import in shim is git fast-import's, byte for byte: every shape of
// layer the description test knows (edits, whiteouts, opaque and deleted
// directories, type changes, symlinks, gitlinks, names that need quoting,
// modes), imported by shim, then by git from the same typed changes,
// gives the same commit, and the repository is whole (fsck --strict)
// after shim wrote its pack and ref.
func TestTheImportInShimIsFastImports(t *testing.T) {
	requireRoot(t) // whiteouts and the opaque xattr
	for _, format := range []string{"sha1", "sha256"} {
		t.Run(format, func(t *testing.T) {
			f := newFixture(t)
			if format == "sha256" {
				f.inSHA256(t)
			}
			must(t, os.Symlink("README.md", filepath.Join(f.wt, "link")))
			tgit(t, f.wt, "add", "link")
			tgit(t, f.wt, "update-index", "--add", "--cacheinfo", "160000,"+tgit(t, f.wt, "rev-parse", "HEAD")+",sub")
			tgit(t, f.wt, "commit", "-q", "-m", "a symlink and a gitlink")
			// a second commit: a parent besides the baseline, packed with
			// deltas (the trees are read through them)
			writeFile(t, filepath.Join(f.wt, "src", "lib", "util.go"), "package lib // two\n")
			tgit(t, f.wt, "commit", "-qam", "two")
			head := tgit(t, f.wt, "rev-parse", "HEAD")
			tgit(t, f.wt, "reset", "-q", "--hard", "HEAD^")
			tgit(t, f.wt, "branch", "-f", "other", head)
			tgit(t, f.wt, "repack", "-adfq", "--depth=50", "--window=50")
			base := tgit(t, f.wt, "rev-parse", "HEAD")
			g := f.guard(t, nil)
			baseTree := treeOf(t, g, base)

			file, whiteout, opaque, symlink := upperBuilders(t)
			cases := map[string]func(up string){
				"edits, additions, deletions": func(up string) {
					file(up, "README.md", "edited\n", 0o644)
					file(up, "new.txt", "new\n", 0o644)
					file(up, "deep/er/new.txt", "deeper\n", 0o644)
					whiteout(up, "docs/guide.txt")
					whiteout(up, "data/keep/a.txt")
					whiteout(up, "nothing/there")
				},
				"the same bytes, modes, an empty file": func(up string) {
					file(up, "src/main.go", baseFiles["src/main.go"], 0o644)
					file(up, "script.sh", baseFiles["script.sh"], 0o644)
					file(up, "README.md", baseFiles["README.md"], 0o755)
					file(up, "empty", "", 0o600)
				},
				"symlinks, type changes, gitlinks": func(up string) {
					symlink(up, "README.md", "elsewhere")
					file(up, "link", "now a file\n", 0o644)
					symlink(up, "new-link", "src/main.go")
					file(up, "sub/x", "x\n", 0o644)
				},
				"a gitlink deleted, a directory emptied": func(up string) {
					whiteout(up, "sub")
					whiteout(up, "data/keep/a.txt")
					whiteout(up, "data/keep/b.txt")
				},
				"directories deleted, opaque, replacing files": func(up string) {
					whiteout(up, "docs")
					opaque(up, "data/keep")
					file(up, "data/keep/a.txt", "a\n", 0o644)
					file(up, "data/keep/c.txt", "c\n", 0o644)
					opaque(up, "src/lib")
					file(up, "README.md/inside", "x\n", 0o644)
					file(up, "dir with space", "a file now\n", 0o644)
				},
				"names that need quoting": func(up string) {
					for _, p := range []string{"a-b", "a/c", "a.b", "a b", "quote\"d", "back\\slash", "tab\there", "new\nline", "é.txt", "dir with space/x", "\x01\x7f"} {
						file(up, p, "content of "+p+"\n", 0o644)
					}
				},
				"nothing": func(up string) {},
			}
			gen := uint64(0)
			for name, build := range cases {
				gen++
				t.Run(name, func(t *testing.T) {
					up := builtUpper(t, f, gen, build)
					ref := fmt.Sprintf("%s%d", RefPrefix, gen)
					for _, parents := range [][]string{{base}, {head, base}} {
						c := snapshot.Commit{Ref: ref, Msg: "shim snapshot\n\nsome message\n", BaseTree: baseTree, Parents: parents, Now: 1700000000}
						tgit(t, f.wt, "update-ref", "-d", ref)
						here, _, err := inShim(t, g, up, c)
						if err != nil {
							t.Fatalf("importInShim: %v", err)
						}
						if got := tgit(t, f.wt, "rev-parse", ref); got != here {
							t.Fatalf("the ref is %s, the import's commit %s", got, here)
						}
						if out, err := tgitErr(f.wt, "fsck", "--strict", "--no-dangling", "--no-progress"); err != nil {
							t.Fatalf("fsck after shim's import: %v\n%s", err, out)
						}
						if git := byGit(t, g, up, c); git != here {
							t.Errorf("parents %v: shim's commit %s (%s), git's %s (%s)", parents, here,
								tgit(t, f.wt, "ls-tree", "-r", here), git, tgit(t, f.wt, "ls-tree", "-r", git))
						}
					}
				})
			}
		})
	}
}

// What shim does not import itself goes to git fast-import (errNotHere,
// nothing written): a ref that exists, a ref not a snapshot's, a store
// it does not read alone, a parent that is not a commit, a root that is
// not a tree.
func TestTheImportInShimLeavesTheRestToGit(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	base := f.baseline
	baseTree := treeOf(t, g, base)
	up := filepath.Join(f.root, "layer", "upper")
	writeFile(t, filepath.Join(up, "README.md"), "edited\n")
	ref := RefPrefix + "9"
	blob := tgit(t, f.wt, "rev-parse", base+":README.md")
	c := snapshot.Commit{Ref: ref, Msg: "m\n", BaseTree: baseTree, Parents: []string{base}, Now: 1700000000}
	with := func(fn func(c *snapshot.Commit)) snapshot.Commit {
		c := c
		c.Parents = append([]string(nil), c.Parents...)
		fn(&c)
		return c
	}
	cases := map[string]struct {
		c     snapshot.Commit
		setup func()
	}{
		"the ref exists":     {c, func() { tgit(t, f.wt, "update-ref", ref, base) }},
		"another ref":        {with(func(c *snapshot.Commit) { c.Ref = "refs/heads/x" }), nil},
		"a parent not there": {with(func(c *snapshot.Commit) { c.Parents[0] = strings.Repeat("1", 40) }), nil},
		"a parent a blob":    {with(func(c *snapshot.Commit) { c.Parents[0] = blob }), nil},
		"a root not a tree":  {with(func(c *snapshot.Commit) { c.BaseTree = blob }), nil},
		"alternates": {c, func() {
			writeFile(t, filepath.Join(f.wt, ".git", "objects", "info", "alternates"), f.origin+"/objects\n")
		}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			tgit(t, f.wt, "update-ref", "-d", ref)
			os.Remove(filepath.Join(f.wt, ".git", "objects", "info", "alternates"))
			if c.setup != nil {
				c.setup()
			}
			packs, _ := filepath.Glob(filepath.Join(f.wt, ".git", "objects", "pack", "*"))
			_, _, err := inShim(t, g, up, c.c)
			if !errors.Is(err, errNotHere) {
				t.Fatalf("importInShim: %v, want errNotHere", err)
			}
			after, _ := filepath.Glob(filepath.Join(f.wt, ".git", "objects", "pack", "*"))
			if !reflect.DeepEqual(packs, after) {
				t.Errorf("a pack was written: %v -> %v", packs, after)
			}
			if name != "the ref exists" {
				if _, err := tgitErr(f.wt, "rev-parse", "--verify", "-q", c.c.Ref); err == nil {
					t.Errorf("the ref was written")
				}
			}
		})
	}
	os.Remove(filepath.Join(f.wt, ".git", "objects", "info", "alternates"))
	// Through the snapshot: a layer of more objects than shim's import
	// keeps the index of goes to git, whole; control: one of the old
	// in-shim bound's bytes (4 MiB), a few objects, is shim's.
	runs := &countingRunner{runs: map[string]int{}}
	g = f.guard(t, func(cfg *Config) { cfg.Runner = runs })
	big := strings.Repeat("0123456789abcdef", (4<<20)/16+1)
	writeFile(t, filepath.Join(up, "big"), big)
	for _, c := range []struct {
		gen   uint64
		files int
	}{{10, 0}, {11, snapshot.MaxPackObjects}} { // in order: the files stay in the layer
		gen, files := c.gen, c.files
		for i := 0; i < files; i++ {
			writeFile(t, filepath.Join(up, "many", strconv.Itoa(i%64), strconv.Itoa(i)), strconv.Itoa(i))
		}
		runs.reset()
		rep, err := g.SnapshotLayer(context.Background(), gen, base, up)
		if err != nil {
			t.Fatal(err)
		}
		if want := min(files, 1); runs.counts()["fast-import"] != want || rep.Added != files+1 || rep.Modified != 1 {
			t.Errorf("%d files more: ran %v (want %d fast-import), %d added, %d modified", files, runs.counts(), want, rep.Added, rep.Modified)
		}
		if got := tgit(t, f.wt, "cat-file", "-s", rep.SnapshotCommit+":big"); got != fmt.Sprint(len(big)) {
			t.Errorf("the big file's size in the snapshot: %s", got)
		}
	}
}

// shim reads every object of a pack whose trees and blobs are deltas of
// each other (long chains, both OFS and REF deltas), and loose ones, as
// git does.
func TestTheStoreReadsObjectsAsGit(t *testing.T) {
	for _, c := range []struct{ name, offsets, format string }{{"ofs", "true", "sha1"}, {"ref", "false", "sha1"}, {"ref256", "false", "sha256"}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			tgit(t, dir, "init", "-q", "--object-format="+c.format, "-b", "main", dir)
			for i := 0; i < 30; i++ {
				for d := 0; d < 3; d++ {
					var b strings.Builder
					for l := 0; l < 300; l++ {
						if l == i*7 {
							fmt.Fprintf(&b, "line %d changed in commit %d\n", l, i)
						} else {
							fmt.Fprintf(&b, "line %d of the file in d%d\n", l, d)
						}
					}
					writeFile(t, filepath.Join(dir, fmt.Sprintf("d%d", d), "deep", "file.txt"), b.String())
					writeFile(t, filepath.Join(dir, fmt.Sprintf("d%d", d), fmt.Sprintf("f%02d", i)), "x\n")
				}
				tgit(t, dir, "add", "-A")
				tgit(t, dir, "commit", "-qm", fmt.Sprint(i))
			}
			tgit(t, dir, "-c", "repack.useDeltaBaseOffset="+c.offsets, "repack", "-adfq", "--depth=20", "--window=50")
			writeFile(t, filepath.Join(dir, "loose.txt"), "a loose blob\n")
			loose := tgit(t, dir, "hash-object", "-w", "loose.txt")
			idx, _ := filepath.Glob(filepath.Join(dir, ".git", "objects", "pack", "*.idx"))
			if len(idx) != 1 {
				t.Fatalf("packs: %v", idx)
			}
			verify := tgit(t, dir, "verify-pack", "-v", idx[0])
			if !strings.Contains(verify, "chain length = 2") {
				t.Fatalf("no long delta chains:\n%s", verify)
			}
			all := strings.Fields(tgit(t, dir, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)"))
			s, ok := openObjectStore(filepath.Join(dir, ".git"), len(loose))
			if !ok {
				t.Fatal("the store does not open")
			}
			defer s.close()
			for _, id := range all {
				typ, data, err := s.read(id, maxLooseObject)
				if err != nil {
					t.Fatalf("%s: %v", id, err)
				}
				if got := tgit(t, dir, "cat-file", "-t", id); got != gitformat.TypeName(typ) {
					t.Fatalf("%s: type %s, git says %s", id, gitformat.TypeName(typ), got)
				}
				h := gitformat.NewHash(len(id))
				fmt.Fprintf(h, "%s %d\x00", gitformat.TypeName(typ), len(data))
				h.Write(data)
				if fmt.Sprintf("%x", h.Sum(nil)) != id {
					t.Fatalf("%s: read other bytes", id)
				}
			}
			if _, _, err := s.read(strings.Repeat("0", len(loose)), 1<<20); !errors.Is(err, gitformat.ErrUnreadable) {
				t.Errorf("a missing object: %v", err)
			}
			// every object read, nothing of the store is mapped: a mapping's
			// pages count in shim's RSS (issue 27's peak during a fence)
			maps, err := os.ReadFile("/proc/self/maps")
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(string(maps), "\n") {
				if strings.Contains(l, filepath.Join(dir, ".git", "objects")) {
					t.Errorf("the store maps %s", l)
				}
			}
		})
	}
}

// A baseline whose trees are loose (plain commits, no repack) is read in
// shim however many trees the layer touches: the inflate budget counts
// what a loose object inflates to, not the most it may (a first version
// charged 16 MiB per loose tree and gave every layer of more than 16
// directories to fast-import).
func TestTheImportInShimReadsManyLooseTrees(t *testing.T) {
	f := newFixture(t)
	const dirs = 40
	base := f.commitDirs(t, dirs)
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	up := filepath.Join(f.root, "layer", "upper")
	for i := 0; i < dirs; i++ {
		writeFile(t, filepath.Join(up, fmt.Sprintf("d%03d", i), "f"), fmt.Sprintf("edited %d\n", i))
	}
	c.reset()
	rep, err := g.SnapshotLayer(context.Background(), 1, base, up)
	if err != nil {
		t.Fatal(err)
	}
	if n := c.counts()["fast-import"]; n != 0 || rep.Modified != dirs {
		t.Errorf("ran %v (want no fast-import), %d modified", c.counts(), rep.Modified)
	}
}

// commitDirs commits n directories d000/f, d001/f... in the fixture's
// worktree (their trees loose) and returns the commit.
func (f *fixture) commitDirs(t *testing.T, n int) string {
	t.Helper()
	for i := 0; i < n; i++ {
		writeFile(t, filepath.Join(f.wt, fmt.Sprintf("d%03d", i), "f"), fmt.Sprintf("file %d\n", i))
	}
	tgit(t, f.wt, "add", "-A")
	tgit(t, f.wt, "commit", "-qm", fmt.Sprintf("%d directories", n))
	return tgit(t, f.wt, "rev-parse", "HEAD")
}

// inSHA256 makes the fixture's origin and worktree again as SHA-256
// repositories, the baseline pushed.
func (f *fixture) inSHA256(t *testing.T) {
	t.Helper()
	must(t, os.RemoveAll(f.origin))
	must(t, os.RemoveAll(f.wt))
	tgit(t, f.root, "init", "-q", "--bare", "--object-format=sha256", f.origin)
	tgit(t, f.root, "init", "-q", "--object-format=sha256", "-b", "main", f.wt)
	tgit(t, f.wt, "remote", "add", "origin", f.origin)
	for p, c := range baseFiles {
		writeFile(t, filepath.Join(f.wt, p), c)
	}
	tgit(t, f.wt, "add", "-A")
	tgit(t, f.wt, "commit", "-q", "-m", "base")
	tgit(t, f.wt, "push", "-q", "-u", "origin", "main")
	f.baseline = tgit(t, f.wt, "rev-parse", "HEAD")
}

// The store holds each pack index's file open while it is open: a
// repository of more than maxStorePacks packs is git's to answer, so
// PID 1's open files do not grow with the packs. The control: exactly
// maxStorePacks packs are read by the store, every one of its files
// closed with it.
func TestTheStoreLeavesARepositoryOfTooManyPacksToGit(t *testing.T) {
	dir := t.TempDir()
	tgit(t, dir, "init", "-q", "-b", "main", dir)
	writeFile(t, filepath.Join(dir, "a.txt"), "a\n")
	tgit(t, dir, "add", "-A")
	tgit(t, dir, "commit", "-qm", "a")
	tgit(t, dir, "repack", "-adq")
	pack := filepath.Join(dir, ".git", "objects", "pack")
	idx, _ := filepath.Glob(filepath.Join(pack, "*.idx"))
	if len(idx) != 1 {
		t.Fatalf("packs: %v", idx)
	}
	data, err := os.ReadFile(idx[0])
	must(t, err)
	copies := func(n int) {
		for i := 1; i < n; i++ { // the same index under other names: as many packs to open
			must(t, os.WriteFile(filepath.Join(pack, fmt.Sprintf("pack-%040x.idx", i)), data, 0o444))
		}
	}
	copies(maxStorePacks)
	before := openFDs(t)
	s, ok := openObjectStore(filepath.Join(dir, ".git"), 40)
	if !ok || len(s.files) != maxStorePacks {
		t.Fatalf("control: a store of %d packs is not read by shim (ok %v)", maxStorePacks, ok)
	}
	s.close()
	if after := openFDs(t); after != before {
		t.Errorf("control: %d files open before the store, %d after it closed", before, after)
	}
	copies(maxStorePacks + 1)
	if s, ok := openObjectStore(filepath.Join(dir, ".git"), 40); ok || s != nil {
		t.Fatalf("a store of %d packs was read by shim", maxStorePacks+1)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d files open before, %d after a store refused: its files leak", before, after)
	}
}
