package gitguard

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/snapshot"
	"golang.org/x/sys/unix"
)

// The layer walk runs in PID 1 on a layer a harness shaped: these tests
// give it the shapes of issue 22 (a directory chain 25,000 deep, made in
// 1.6 s, took the original walk 719 MB, more descriptors than
// RLIMIT_NOFILE and the snapshot ref; paths longer than PATH_MAX; a
// directory too large to hold; a layer too wide to import in shim) and
// want the snapshot of what fits made every time, the rest listed in
// not_stored, and the walk's descriptors and memory bounded.

// chainPath is the path of file name in the directory dirs deep in a
// chain of directories named d.
func chainPath(dirs int, name string) string { return strings.Repeat("d/", dirs) + name }

// A chain 25,000 deep is saved down to snapshot.MaxDepth, the rest listed as
// too_deep; the fence gets its ref, and the walk's allocations do not
// grow with the depth (the original walk's 25,000-deep snapshot failed
// with EMFILE after allocating 2.1 GiB).
func TestALayersDeepChainIsSavedUpToTheDepthBound(t *testing.T) {
	f, g, _ := hostileLayer(t)
	alloc := map[int]uint64{}
	for gen, depth := range []int{2000, 25000} {
		up := filepath.Join(f.root, fmt.Sprintf("layer-%d", gen), "upper")
		writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
		makeChain(t, up, "d", depth, func(fd, d int) {
			if d == 10 || d == snapshot.MaxDepth-1 || d == snapshot.MaxDepth {
				fileAt(t, fd, "f", fmt.Sprintf("at depth %d\n", d+1))
			}
		})
		// control: the chain is that deep (a walk that holds a
		// descriptor per level needs as many)
		if got := chainDepth(t, up, "d"); got != depth {
			t.Fatalf("the chain is %d deep, want %d", got, depth)
		}
		fds := openFDs(t)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		rep := snapshotLayerOK(t, f, g, uint64(gen+1), up)
		runtime.ReadMemStats(&after)
		alloc[depth] = after.TotalAlloc - before.TotalAlloc
		if n := openFDs(t); n != fds {
			t.Errorf("depth %d: %d descriptors open after the snapshot, %d before", depth, n, fds)
		}
		if got := tgit(t, f.wt, "rev-parse", rep.SnapshotRef); got != rep.SnapshotCommit || got == "" {
			t.Fatalf("depth %d: %s is %q, the snapshot %q", depth, rep.SnapshotRef, got, rep.SnapshotCommit)
		}
		for _, d := range []int{10, snapshot.MaxDepth - 1} {
			if got := tgit(t, f.wt, "show", rep.SnapshotCommit+":"+chainPath(d, "f")); got != fmt.Sprintf("at depth %d", d+1) {
				t.Errorf("depth %d: the file at depth %d reads %q", depth, d+1, got)
			}
		}
		if _, err := tgitErr(f.wt, "cat-file", "-e", rep.SnapshotCommit+":"+chainPath(snapshot.MaxDepth, "f")); err == nil {
			t.Errorf("depth %d: a file deeper than snapshot.MaxDepth was stored", depth)
		}
		want := []NotStoredFile{{Path: strings.TrimSuffix(chainPath(snapshot.MaxDepth, ""), "/"), Type: "too_deep"}}
		if !reflect.DeepEqual(rep.NotStored, want) {
			t.Errorf("depth %d: not stored %+v, want the directory at depth %d", depth, rep.NotStored, snapshot.MaxDepth)
		}
		if rep.Modified != 1 || rep.Added != 2 {
			t.Errorf("depth %d: %d modified, %d added", depth, rep.Modified, rep.Added)
		}
	}
	t.Logf("allocated during the snapshot: %d MiB at depth 2,000, %d MiB at 25,000", alloc[2000]>>20, alloc[25000]>>20)
	if alloc[25000] > 64<<20 || alloc[25000] > alloc[2000]+alloc[2000]/2+4<<20 {
		t.Errorf("the snapshot of a chain 25,000 deep allocated %d MiB (2,000 deep: %d MiB)", alloc[25000]>>20, alloc[2000]>>20)
	}
	tgit(t, f.wt, "fsck", "--no-dangling", "--no-progress")
}

// walkLayer walks up as git fast-import's import streams it (after a
// first line of its own), with bounds b (component by component with
// noOpenat2), and returns the stream and the walk.
func walkLayer(t *testing.T, up string, b snapshot.Bounds) ([]byte, *walked) {
	t.Helper()
	old := layerBounds
	layerBounds = b
	defer func() { layerBounds = old }()
	ufd, err := openDir(up)
	must(t, err)
	defer unix.Close(ufd)
	var stream bytes.Buffer
	stream.WriteString("walk\n")
	st := snapshot.NewStream(&stream, snapshot.Commit{})
	w := &walked{rep: &Report{}}
	w.Walk = newLayerWalk(w.rep, DefaultMaxFileSize, st, true)
	if noOpenat2 {
		w.OpenByComponents()
	}
	must(t, w.Run(ufd))
	must(t, st.End())
	return stream.Bytes(), w
}

// walked is a walk and the report it listed what it did not store in.
type walked struct {
	*snapshot.Walk
	rep *Report
}

// noOpenat2 makes walkLayer's walk open component by component.
var noOpenat2 bool

// The walk holds at most MaxOpenDirs descriptors at any depth, opening a
// directory it comes back to again by its path beneath the layer's top
// (openat2, or component by component without it), and writes the same
// stream either way. Control: a walk that keeps each level open (the
// bound raised) holds one per level.
func TestTheLayerWalkHoldsAFewDescriptorsAtAnyDepth(t *testing.T) {
	up := filepath.Join(t.TempDir(), "upper")
	must(t, os.Mkdir(up, 0o755))
	// each level: d, then z (after d in name order: the walk comes back
	// for it, out of a directory 3,000 deep)
	makeChain(t, up, "d", 3000, func(fd, _ int) { fileAt(t, fd, "z", "z\n") })
	var streams [][]byte
	for _, c := range []struct {
		name      string
		noOpenat2 bool
		openDirs  int
	}{
		{"openat2", false, snapshot.MaxOpenDirs},
		{"component by component", true, snapshot.MaxOpenDirs},
		{"control: a descriptor per level", false, 1 << 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			noOpenat2 = c.noOpenat2
			defer func() { noOpenat2 = false }()
			b := layerBounds
			b.OpenDirs = c.openDirs
			fds := openFDs(t)
			stream, w := walkLayer(t, up, b)
			if n := openFDs(t); n != fds {
				t.Errorf("%d descriptors open after the walk, %d before", n, fds)
			}
			if c.openDirs == snapshot.MaxOpenDirs && w.Peak() > snapshot.MaxOpenDirs {
				t.Errorf("the walk held %d descriptors at once, want at most %d", w.Peak(), snapshot.MaxOpenDirs)
			}
			if c.openDirs > snapshot.MaxOpenDirs && w.Peak() < snapshot.MaxDepth {
				t.Errorf("control: the walk held %d descriptors at once, want one per level (%d)", w.Peak(), snapshot.MaxDepth)
			}
			if n := bytes.Count(stream, []byte("\nM 100644 inline ")); n != snapshot.MaxDepth-1 {
				t.Errorf("%d files written, want %d (one a level down to the bound)", n, snapshot.MaxDepth-1)
			}
			want := []NotStoredFile{{Path: strings.TrimSuffix(chainPath(snapshot.MaxDepth, ""), "/"), Type: "too_deep"}}
			if !reflect.DeepEqual(w.rep.NotStored, want) {
				t.Errorf("not stored %+v", w.rep.NotStored)
			}
			streams = append(streams, stream)
		})
	}
	for i := 1; i < len(streams); i++ {
		if !bytes.Equal(streams[0], streams[i]) {
			t.Errorf("walk %d wrote another stream than the first", i)
		}
	}
}

// pathOf is path components whose path (joined by slashes, leaf last)
// has total bytes: names of at most 255 bytes (NAME_MAX).
func pathOf(total int, leaf string) []string {
	var dirs []string
	for n := total - len(leaf) - 1; n > 0; {
		c := n
		if n > 255 {
			c = min(255, n-2) // room for a slash and a name after it
		}
		dirs = append(dirs, strings.Repeat(string(rune('a'+len(dirs)%26)), c))
		n -= c + 1
	}
	return append(dirs, leaf)
}

// makePath makes the directories of parts below dir (holding one
// descriptor at a time: the path may be longer than PATH_MAX) and calls
// leaf in the last of them with the leaf's name.
func makePath(t *testing.T, dir string, parts []string, leaf func(fd int, name string)) {
	t.Helper()
	fd, err := openDir(dir)
	must(t, err)
	for _, p := range parts[:len(parts)-1] {
		if err := unix.Mkdirat(fd, p, 0o755); err != nil && err != unix.EEXIST {
			t.Fatal(err)
		}
		c, err := openDirAt(fd, p)
		unix.Close(fd)
		must(t, err)
		fd = c
	}
	leaf(fd, parts[len(parts)-1])
	unix.Close(fd)
}

// A path is stored up to snapshot.MaxPath bytes (PATH_MAX less its NUL); a
// longer one, of any type, is listed as path_too_long and nothing below
// it is walked.
func TestTheLayerWalksPathBound(t *testing.T) {
	file := func(t *testing.T) func(fd int, name string) {
		return func(fd int, name string) { fileAt(t, fd, name, "x\n") }
	}
	dir := func(t *testing.T) func(fd int, name string) {
		return func(fd int, name string) {
			must(t, unix.Mkdirat(fd, name, 0o755))
			c, err := openDirAt(fd, name)
			must(t, err)
			fileAt(t, c, "x", "x\n")
			unix.Close(c)
		}
	}
	cases := []struct {
		name   string
		total  int  // the leaf's path's bytes
		root   bool // a whiteout needs root
		leaf   func(t *testing.T) func(fd int, name string)
		stored bool   // the leaf's path is in the stream (a directory entered is not: only what it holds)
		listed string // the path listed as path_too_long: the leaf's ("leaf"), its child's ("child"), a directory above it ("above")
	}{
		{"a file of 4,095 bytes", snapshot.MaxPath, false, file, true, ""},
		{"a file of 4,096 bytes", snapshot.MaxPath + 1, false, file, false, "leaf"},
		{"a symlink of 4,096 bytes", snapshot.MaxPath + 1, false, func(t *testing.T) func(int, string) {
			return func(fd int, name string) { must(t, unix.Symlinkat("target", fd, name)) }
		}, false, "leaf"},
		{"a whiteout of 4,096 bytes", snapshot.MaxPath + 1, true, func(t *testing.T) func(int, string) {
			return func(fd int, name string) { must(t, unix.Mknodat(fd, name, unix.S_IFCHR, 0)) }
		}, false, "leaf"},
		{"a directory of 4,095 bytes, a file in it", snapshot.MaxPath, false, dir, false, "child"}, // entered: its file listed
		{"a directory of 4,096 bytes, a file in it", snapshot.MaxPath + 1, false, dir, false, "leaf"},
		{"a file below a directory of 4,346 bytes", snapshot.MaxPath + 256, false, file, false, "above"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.root {
				requireRoot(t)
			}
			up := filepath.Join(t.TempDir(), "upper")
			must(t, os.Mkdir(up, 0o755))
			t.Cleanup(func() { removeDeep(t, up) })
			parts := pathOf(c.total, "leaf")
			p := strings.Join(parts, "/")
			if len(p) != c.total {
				t.Fatalf("the path has %d bytes, want %d", len(p), c.total)
			}
			makePath(t, up, parts, c.leaf(t))
			stream, w := walkLayer(t, up, layerBounds)
			if got := bytes.Contains(stream, []byte(quotePath(p)+"\n")); got != c.stored {
				t.Errorf("the leaf's path is in the stream: %v, want %v", got, c.stored)
			}
			var want string
			switch c.listed {
			case "leaf":
				want = p
			case "child":
				want = p + "/x"
			case "above":
				want = strings.Join(parts[:len(parts)-1], "/")
			}
			var got []string
			for _, ns := range w.rep.NotStored {
				got = append(got, fmt.Sprintf("%s of %d bytes", ns.Type, len(ns.Path)))
				if ns.Path != want {
					t.Errorf("listed a path of %d bytes, want one of %d", len(ns.Path), len(want))
				}
				if regular := c.listed == "child" || (c.listed == "leaf" && strings.HasPrefix(c.name, "a file")); regular != (ns.Size == 2) {
					t.Errorf("listed with size %d", ns.Size)
				}
			}
			if (want == "") != (len(got) == 0) || len(got) > 1 || (len(got) == 1 && got[0] != fmt.Sprintf("path_too_long of %d bytes", len(want))) {
				t.Errorf("not stored: %v, want path_too_long of %d bytes", got, len(want))
			}
			for _, l := range bytes.Split(stream, []byte("\n")) {
				if len(l) > 4*snapshot.MaxPath+64 {
					t.Errorf("a stream line of %d bytes", len(l))
				}
			}
		})
	}
	// The longest path stored is a path of the snapshot, and git reads it.
	f, g, up := hostileLayer(t)
	parts := pathOf(snapshot.MaxPath, "leaf")
	makePath(t, up, parts, func(fd int, name string) { fileAt(t, fd, name, "the longest path\n") })
	t.Cleanup(func() { removeDeep(t, up) })
	rep := snapshotLayerOK(t, f, g, 1, up)
	if got := tgit(t, f.wt, "cat-file", "blob", rep.SnapshotCommit+":"+strings.Join(parts, "/")); got != "the longest path" {
		t.Errorf("the longest path reads %q", got)
	}
}

// A directory whose entries pass the walk's budget of names is listed as
// too_many_entries: the entries read before the budget was spent are
// saved, the rest not walked, and the snapshot is made.
func TestALayerDirectoryPastTheNameBudgetIsListed(t *testing.T) {
	f, g, up := hostileLayer(t)
	for i := 0; i < 200; i++ {
		writeFile(t, filepath.Join(up, "big", fmt.Sprintf("f%03d", i)), "x\n")
	}
	// the top holds README.md, .git and big; then 100 of big's entries
	old := layerBounds
	layerBounds.Names = (len("README.md") + 16) + (len(".git") + 16) + (len("big") + 16) + 100*(len("f000")+16)
	defer func() { layerBounds = old }()
	rep := snapshotLayerOK(t, f, g, 1, up)
	want := []NotStoredFile{{Path: "big", Type: "too_many_entries"}}
	if !reflect.DeepEqual(rep.NotStored, want) {
		t.Errorf("not stored %+v, want %+v", rep.NotStored, want)
	}
	if n := len(strings.Fields(tgit(t, f.wt, "ls-tree", "--name-only", rep.SnapshotCommit+":big"))); n != 100 || rep.Added != 100 {
		t.Errorf("%d of big's files saved (%d added), want the 100 the budget holds", n, rep.Added)
	}
}

// A layer of more changes than shim's import describes (snapshot.MaxDescribed) is
// still imported by shim, and diff-tree (read as it comes) describes it:
// every change counted, the first maxListed listed in diff-tree's order.
func TestAWideLayerIsImportedInShimAndDescribedByDiffTree(t *testing.T) {
	f := newFixture(t)
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	up := filepath.Join(f.root, "layer", "upper")
	writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
	n := snapshot.MaxDescribed + 100
	var paths []string
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("wide/%d/%d", i%50, i)
		writeFile(t, filepath.Join(up, p), fmt.Sprintf("file %d\n", i))
		paths = append(paths, p)
	}
	paths = append(paths, "README.md")
	sort.Strings(paths)
	rep := snapshotLayerOK(t, f, g, 1, up)
	if got := c.counts(); got["fast-import"] != 0 || got["diff-tree"] != 1 {
		t.Errorf("the snapshot ran %v, want no fast-import and one diff-tree", got)
	}
	if rep.Added != n || rep.Modified != 1 || !rep.PathsTruncated || len(rep.Paths) != maxListed {
		t.Fatalf("%d added, %d modified, %d listed (truncated %v)", rep.Added, rep.Modified, len(rep.Paths), rep.PathsTruncated)
	}
	for i, pc := range rep.Paths {
		if pc.Path != paths[i] {
			t.Fatalf("listed %d is %q, want %q (diff-tree's order)", i, pc.Path, paths[i])
		}
	}
	last := fmt.Sprintf("wide/%d/%d", (n-1)%50, n-1)
	if got := tgit(t, f.wt, "show", rep.SnapshotCommit+":"+last); got != fmt.Sprintf("file %d", n-1) {
		t.Errorf("a file of the wide layer, %s, reads %q", last, got)
	}
}

// A baseline whose trees on the walk's path hold more entries than
// shim's import keeps in memory is imported by git fast-import; control:
// one of a few entries fewer is shim's.
func TestTheImportInShimLeavesLargeTreesToGit(t *testing.T) {
	for _, c := range []struct {
		entries     int
		fastImports int
	}{{snapshot.MaxHeldEntries - 100, 0}, {snapshot.MaxHeldEntries + 1, 1}} {
		t.Run(fmt.Sprintf("%d entries", c.entries), func(t *testing.T) {
			f := newFixture(t)
			base := flatBaseline(t, f, c.entries)
			runs := &countingRunner{runs: map[string]int{}}
			g := f.guard(t, func(cfg *Config) { cfg.Runner = runs })
			up := filepath.Join(f.root, "layer", "upper")
			writeFile(t, filepath.Join(up, "c", "0", "7"), "edited\n")
			runs.reset()
			rep, err := g.SnapshotLayer(context.Background(), 1, base, up)
			if err != nil {
				t.Fatal(err)
			}
			if got := runs.counts()["fast-import"]; got != c.fastImports {
				t.Errorf("the snapshot ran %d fast-imports, want %d", got, c.fastImports)
			}
			if rep.Modified != 1 || len(rep.Paths) != 1 || rep.Paths[0].Path != "c/0/7" {
				t.Errorf("%d modified: %+v", rep.Modified, rep.Paths)
			}
			if got := tgit(t, f.wt, "show", rep.SnapshotCommit+":c/0/7"); got != "edited" {
				t.Errorf("the edit reads %q", got)
			}
		})
	}
}

// recordWriter hands over each record as it comes, across writes of any
// size, a record over its bound cut to it.
func TestARecordWriterHandsOverRecordsAsTheyCome(t *testing.T) {
	in := "one\x00two\x00" + strings.Repeat("x", 40) + "\x00\x00last\x00"
	want := []string{"one", "two", strings.Repeat("x", 16), "", "last"}
	for _, size := range []int{1, 2, 3, 7, len(in)} {
		var got []string
		w := &recordWriter{max: 16, fn: func(b []byte) error { got = append(got, string(b)); return nil }}
		for r := in; len(r) > 0; r = r[min(size, len(r)):] {
			if n, err := w.Write([]byte(r[:min(size, len(r))])); err != nil || n != min(size, len(r)) {
				t.Fatalf("write: %d, %v", n, err)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("writes of %d bytes: %q, want %q", size, got, want)
		}
	}
}

// A layer git fast-import imports costs it a comparison per entry of a
// directory for each entry it writes there: past snapshot.MaxFastImportScans the
// entries left of the directory are listed as too_many_entries, and the
// snapshot is made.
func TestAFlatLayerPastFastImportsBudgetIsListed(t *testing.T) {
	f, g, up := hostileLayer(t)
	for i := 0; i < 300; i++ {
		writeFile(t, filepath.Join(up, "flat", fmt.Sprintf("f%03d", i)), "x\n")
	}
	tgit(t, f.wt, "update-ref", RefPrefix+"1", f.baseline) // not shim's import: a ref of that name exists
	old := layerBounds
	layerBounds.Scans = 1000
	defer func() { layerBounds = old }()
	rep := snapshotLayerOK(t, f, g, 1, up)
	want := []NotStoredFile{{Path: "flat", Type: "too_many_entries"}}
	if !reflect.DeepEqual(rep.NotStored, want) {
		t.Errorf("not stored %+v, want %+v", rep.NotStored, want)
	}
	// the top's .git, README.md and flat cost 1+2+3; then flat's k-th
	// entry k: 6 + k(k+1)/2 <= 1000 for k <= 44
	if n := len(strings.Fields(tgit(t, f.wt, "ls-tree", "--name-only", rep.SnapshotCommit+":flat"))); n != 44 {
		t.Errorf("%d of flat's files saved, want 44", n)
	}
}

// flatBaseline makes a commit of the baseline's files and n more in one
// directory, c/0, and returns it (its tree written whole: fast-import
// takes n²/2 comparisons to write them one by one, mktree seconds).
func flatBaseline(t *testing.T, f *fixture, n int) string {
	t.Helper()
	in := func(stdin []byte, args ...string) string {
		cmd := exec.Command("/usr/bin/git", append([]string{"-c", "safe.directory=*"}, args...)...)
		cmd.Dir, cmd.Env, cmd.Stdin = f.wt, testEnv(os.TempDir()), bytes.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	blob, err := hex.DecodeString(in([]byte("file\n"), "hash-object", "-w", "--stdin"))
	must(t, err)
	names := make([]string, n)
	for i := range names {
		names[i] = strconv.Itoa(i)
	}
	sort.Strings(names)
	var tree bytes.Buffer
	for _, name := range names {
		fmt.Fprintf(&tree, "100644 %s\x00%s", name, blob)
	}
	dir := in(tree.Bytes(), "hash-object", "-t", "tree", "-w", "--stdin")
	c := in([]byte("040000 tree "+dir+"\t0\n"), "mktree")
	root := in([]byte(tgit(t, f.wt, "ls-tree", f.baseline)+"\n040000 tree "+c+"\tc\n"), "mktree")
	return in(nil, "commit-tree", root, "-p", f.baseline, "-m", "flat")
}
