package gitguard

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/gitformat"
	"github.com/shimdev/shim/internal/testutil"
	"golang.org/x/sys/unix"
)

// looseIn writes raw (header included) as a loose object into the objects
// directory dir, named by its hash (SHA-256 for hexLen 64), and returns
// its name.
func looseIn(t *testing.T, dir string, hexLen int, raw []byte) string {
	t.Helper()
	var id string
	if hexLen == 64 {
		s := sha256.Sum256(raw)
		id = hex.EncodeToString(s[:])
	} else {
		s := sha1.Sum(raw)
		id = hex.EncodeToString(s[:])
	}
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(raw)
	zw.Close()
	writeFile(t, filepath.Join(dir, id[:2], id[2:]), z.String())
	return id
}

func rawObject(typ string, body []byte) []byte {
	return append([]byte(fmt.Sprintf("%s %d\x00", typ, len(body))), body...)
}

// rawTree is a tree object's body of entries "MODE NAME ID" (ids in hex),
// sorted as git sorts them.
func rawTree(entries ...string) []byte {
	sort.Slice(entries, func(i, j int) bool {
		key := func(e string) string {
			f := strings.Fields(e)
			if f[0] == "40000" {
				return f[1] + "/"
			}
			return f[1]
		}
		return key(entries[i]) < key(entries[j])
	})
	var b bytes.Buffer
	for _, e := range entries {
		f := strings.Fields(e)
		raw, _ := hex.DecodeString(f[2])
		fmt.Fprintf(&b, "%s %s\x00", f[0], f[1])
		b.Write(raw)
	}
	return b.Bytes()
}

// shim's pack of loose objects and its index are what git writes and
// reads: the index byte for byte the one `git index-pack` makes of that
// pack, for both object formats, with entry sizes at each of the header's
// seven-bit steps, objects of several stored blocks, and objects read
// again from the layer (not kept in memory).
func TestShimsPackIndexIsTheOneIndexPackWrites(t *testing.T) {
	for _, format := range []string{"sha1", "sha256"} {
		t.Run(format, func(t *testing.T) {
			hexLen := map[string]int{"sha1": 40, "sha256": 64}[format]
			repo := filepath.Join(t.TempDir(), "repo")
			tgit(t, filepath.Dir(repo), "init", "-q", "--object-format="+format, repo)
			layer := filepath.Join(t.TempDir(), "objects")
			var blobs []string
			for _, n := range []int{0, 1, 15, 16, 2047, 2048, 65535, 65536, 200000} {
				body := bytes.Repeat([]byte{byte('a' + n%26)}, n)
				blobs = append(blobs, looseIn(t, layer, hexLen, rawObject("blob", body)))
			}
			tree := looseIn(t, layer, hexLen, rawObject("tree", rawTree("100644 a "+blobs[1], "100755 b "+blobs[8])))
			commit := looseIn(t, layer, hexLen, rawObject("commit", []byte(fmt.Sprintf(
				"tree %s\nauthor h <h@h> 1 +0000\ncommitter h <h@h> 1 +0000\n\nmine\n", tree))))
			ofd, err := openDir(layer)
			must(t, err)
			defer unix.Close(ofd)
			budget, kept := int64(maxLayerObjects), int64(4096) // the bigger ones are read again
			names, _ := readDirNames(ofd)
			sort.Strings(names)
			var objs []looseObject
			for _, d := range names {
				objs = append(objs, verifyLoose(ofd, d, hexLen, &budget, &kept)...)
			}
			if len(objs) != len(blobs)+2 {
				t.Fatalf("%d objects checked, want %d", len(objs), len(blobs)+2)
			}
			store, ok := openObjectStore(filepath.Join(repo, ".git"), hexLen)
			if !ok {
				t.Fatal("the store of a new repository cannot be read")
			}
			must(t, store.addPack(ofd, objs))
			store.close()
			idx, _ := filepath.Glob(filepath.Join(repo, ".git", "objects", "pack", "pack-*.idx"))
			if len(idx) != 1 {
				t.Fatalf("indexes %v", idx)
			}
			mine, err := os.ReadFile(idx[0])
			must(t, err)
			theirs := filepath.Join(t.TempDir(), "git.idx")
			tgit(t, repo, "index-pack", "-o", theirs, strings.TrimSuffix(idx[0], ".idx")+".pack")
			want, err := os.ReadFile(theirs)
			must(t, err)
			if !bytes.Equal(mine, want) {
				t.Errorf("shim's index (%d bytes) is not index-pack's (%d bytes)", len(mine), len(want))
			}
			tgit(t, repo, "verify-pack", idx[0])
			if got := tgit(t, repo, "cat-file", "-s", blobs[8]); got != "200000" {
				t.Errorf("blob of 200000 bytes reads %s bytes", got)
			}
			if got := tgit(t, repo, "rev-parse", commit+"^{tree}"); got != tree {
				t.Errorf("the commit's tree is %s, want %s", got, tree)
			}
			tgit(t, repo, "fsck", "--full", "--no-dangling")
		})
	}
}

// The harness's loose copy of an object the repository has (packed or
// loose) is not packed again: git's copy of that name stands (index-pack
// would have checked the two were the same bytes; shim never adds a
// second copy instead).
func TestObjectsTheRepositoryHasAreNotPackedAgain(t *testing.T) {
	for _, packed := range []bool{true, false} {
		t.Run(map[bool]string{true: "packed", false: "loose"}[packed], func(t *testing.T) {
			f := newFixture(t)
			if packed {
				tgit(t, f.wt, "repack", "-adq")
			}
			g := f.guard(t, nil)
			up := filepath.Join(f.root, "layer", "upper")
			writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
			had := writeLoose(t, up, "blob", baseFiles["README.md"])
			if tgit(t, f.wt, "rev-parse", f.baseline+":README.md") != had {
				t.Fatal("control: the copy is not the baseline's README")
			}
			mine := writeLoose(t, up, "blob", "the harness's own\n")
			before := packedIDs(t, f)
			snapshotLayerOK(t, f, g, 1, up)
			added := map[string]bool{}
			for id := range packedIDs(t, f) {
				if !before[id] {
					added[id] = true
				}
			}
			if added[had] || !added[mine] {
				t.Errorf("packed again: %v (the repository's); packed: %v (the harness's)", added[had], added[mine])
			}
		})
	}
}

// packedIDs is every object name in the fixture repository's packs.
func packedIDs(t *testing.T, f *fixture) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	idx, _ := filepath.Glob(filepath.Join(f.wt, ".git", "objects", "pack", "*.idx"))
	for _, p := range idx {
		b, err := os.ReadFile(p)
		must(t, err)
		n := int(binary.BigEndian.Uint32(b[8+255*4:]))
		for i := 0; i < n; i++ {
			ids[hex.EncodeToString(b[8+1024+i*20:8+1024+(i+1)*20])] = true
		}
	}
	return ids
}

// What a harness's plain `git commit` leaves costs a snapshot no git: its
// loose objects are checked and packed by shim, the commit's history is
// read from them (whole, one commit of the harness's) instead of by
// rev-list, and the import runs in shim. The first snapshot on a baseline
// also resolves it (cat-file) and lists its trees (ls-tree), once.
func TestALayerSnapshotOfAHarnessCommitRunsNoGit(t *testing.T) {
	f := newFixture(t)
	c := &countingRunner{runs: map[string]int{}}
	g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
	for gen := uint64(1); gen <= 2; gen++ {
		up := filepath.Join(f.root, fmt.Sprintf("layer-%d", gen), "upper")
		head := harnessCommit(t, f, up, fmt.Sprintf("gen %d", gen))
		c.reset()
		rep, err := g.SnapshotLayer(context.Background(), gen, f.baseline, up)
		if err != nil {
			t.Fatal(err)
		}
		got := c.counts()
		want := map[string]int{}
		if gen == 1 {
			want["cat-file"] = 1 // the baseline, once
			want["ls-tree"] = 1  // its trees, once
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("gen %d's snapshot ran %v, want %v", gen, got, want)
		}
		if rep.HeadBefore != head || rep.LocalCommits != 1 {
			t.Errorf("gen %d: head_before %s (want the harness's %s), local_commits %d", gen, rep.HeadBefore, head, rep.LocalCommits)
		}
		if got := tgit(t, f.wt, "rev-parse", rep.SnapshotCommit+"^1"); got != head {
			t.Errorf("gen %d: the snapshot's first parent is %s, want %s", gen, got, head)
		}
	}
	tgit(t, f.wt, "fsck", "--full", "--no-dangling")
}

// harnessCommit makes what a harness's `git commit -a` leaves in its layer
// up: a commit of an edit on the baseline, its loose objects in the
// layer's .git, the branch moved to it; it returns the commit.
func harnessCommit(t *testing.T, f *fixture, up, msg string) string {
	t.Helper()
	scratch := filepath.Join(t.TempDir(), "harness")
	tgit(t, f.root, "clone", "-q", "--no-local", f.wt, scratch)
	writeFile(t, filepath.Join(scratch, "README.md"), msg+"\n")
	writeFile(t, filepath.Join(scratch, "src", "new.go"), "package src // "+msg+"\n")
	tgit(t, scratch, "add", "-A")
	tgit(t, scratch, "commit", "-q", "-m", msg)
	head := tgit(t, scratch, "rev-parse", "HEAD")
	for _, id := range strings.Fields(tgit(t, scratch, "rev-list", "--objects", "--no-object-names", head, "--not", f.baseline)) {
		b, err := os.ReadFile(filepath.Join(scratch, ".git", "objects", id[:2], id[2:]))
		must(t, err)
		writeFile(t, filepath.Join(up, ".git", "objects", id[:2], id[2:]), string(b))
	}
	writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), head+"\n")
	writeFile(t, filepath.Join(up, "README.md"), msg+"\n")
	writeFile(t, filepath.Join(up, "src", "new.go"), "package src // "+msg+"\n")
	return head
}

// readHistory answers only what git would, and nothing where it cannot
// tell: each history it reads whole is whole for rev-list too, with the
// count of the harness's commits rev-list gives; a missing object, a
// parent that is not the baseline, bytes not kept or a type it did not
// expect give no answer (git is asked then).
func TestReadHistoryAnswersAsRevListOrNotAtAll(t *testing.T) {
	f := newFixture(t)
	tgit(t, f.wt, "repack", "-adq")
	base := f.baseline
	baseTree := tgit(t, f.wt, "rev-parse", base+"^{tree}")
	readme := tgit(t, f.wt, "rev-parse", base+":README.md")
	parentOfNothing := strings.Repeat("1", 40)
	type obj struct{ typ, body string }
	id := func(typ string, body []byte) string {
		s := sha1.Sum(rawObject(typ, body))
		return hex.EncodeToString(s[:])
	}
	commit := func(tree string, parents ...string) []byte {
		var b strings.Builder
		fmt.Fprintf(&b, "tree %s\n", tree)
		for _, p := range parents {
			fmt.Fprintf(&b, "parent %s\n", p)
		}
		b.WriteString("author h <h@h> 1 +0000\ncommitter h <h@h> 1 +0000\n\nc\n")
		return []byte(b.String())
	}
	blob := []byte("new blob\n")
	blobID := id("blob", blob)
	tree := rawTree("100644 README.md "+readme, "100644 new.txt "+blobID, "160000 sub "+strings.Repeat("2", 40))
	treeID := id("tree", tree)
	c1 := commit(treeID, base)
	c1ID := id("commit", c1)
	c2 := commit(baseTree, c1ID)
	c2ID := id("commit", c2)
	side := commit(baseTree, base)
	sideID := id("commit", side)
	merge := commit(treeID, c2ID, sideID)
	mergeID := id("commit", merge)
	missingTree := rawTree("100644 gone.txt " + strings.Repeat("3", 40))
	missingTreeID := id("tree", missingTree)
	broken := commit(missingTreeID, base)
	brokenID := id("commit", broken)
	noTree := commit(strings.Repeat("4", 40), base)
	noTreeID := id("commit", noTree)
	orphan := commit(treeID, parentOfNothing)
	orphanID := id("commit", orphan)
	older := tgit(t, f.wt, "commit-tree", baseTree, "-p", base, "-m", "older")
	onOlder := commit(treeID, older)
	onOlderID := id("commit", onOlder)
	typeSwap := rawTree("100644 notablob " + treeID)
	typeSwapID := id("tree", typeSwap)
	onSwap := commit(typeSwapID, base)
	onSwapID := id("commit", onSwap)

	all := map[string]obj{
		blobID: {"blob", string(blob)}, treeID: {"tree", string(tree)}, c1ID: {"commit", string(c1)},
		c2ID: {"commit", string(c2)}, sideID: {"commit", string(side)}, mergeID: {"commit", string(merge)},
		missingTreeID: {"tree", string(missingTree)}, brokenID: {"commit", string(broken)},
		orphanID: {"commit", string(orphan)}, noTreeID: {"commit", string(noTree)}, onOlderID: {"commit", string(onOlder)},
		typeSwapID: {"tree", string(typeSwap)}, onSwapID: {"commit", string(onSwap)},
	}
	fresh := map[string]*looseObject{}
	for k, o := range all {
		fresh[k] = &looseObject{typ: map[string]int{"commit": 1, "tree": 2, "blob": 3}[o.typ], size: int64(len(o.body)), data: []byte(o.body)}
	}
	store, ok := openObjectStore(filepath.Join(f.wt, ".git"), 40)
	if !ok {
		t.Fatal("the fixture's store cannot be read")
	}
	defer store.close()
	baseTrees := map[string]bool{baseTree: true}
	for _, line := range strings.Split(tgit(t, f.wt, "ls-tree", "-r", "-d", "--format=%(objectname)", base), "\n") {
		baseTrees[line] = true
	}
	// Git's answers, with the objects written into the repository.
	objects := filepath.Join(f.wt, ".git", "objects")
	for _, o := range all {
		looseIn(t, objects, 40, rawObject(o.typ, []byte(o.body)))
	}
	for _, c := range []struct {
		name  string
		heads []string
		want  int // commits; -1: no answer
		fresh map[string]*looseObject
	}{
		{"one commit on the baseline", []string{c1ID}, 1, fresh},
		{"two in a row", []string{c2ID}, 2, fresh},
		{"a merge of two branches", []string{mergeID}, 4, fresh},
		{"two heads sharing history", []string{c2ID, c1ID, sideID}, 3, fresh},
		{"a tree entry missing", []string{brokenID}, -1, fresh},
		{"a parent missing", []string{orphanID}, -1, fresh},
		{"its tree missing", []string{noTreeID}, -1, fresh},
		{"a parent the store has that is not the baseline", []string{onOlderID}, -1, fresh},
		{"a blob entry naming a tree", []string{onSwapID}, -1, fresh},
		{"bytes not kept", []string{c1ID}, -1, map[string]*looseObject{c1ID: {typ: 1, size: int64(len(c1))}}},
		{"a head that is not fresh", []string{older}, -1, fresh},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := readHistory(c.heads, base, baseTrees, c.fresh, store)
			if c.want < 0 {
				if h != nil {
					t.Errorf("answered %+v, want no answer", h)
				}
				return
			}
			if h == nil {
				t.Fatalf("no answer, want %d commits", c.want)
			}
			if _, err := tgitErr(f.wt, append(append([]string{"rev-list", "--objects", "--quiet"}, c.heads...), "--not", base)...); err != nil {
				t.Fatalf("control: rev-list finds the history not whole: %v", err)
			}
			n, _ := strconv.Atoi(tgit(t, f.wt, append(append([]string{"rev-list", "--count"}, c.heads...), "--not", base)...))
			if h.commits != n || n != c.want {
				t.Errorf("%d commits, rev-list counts %d, want %d", h.commits, n, c.want)
			}
		})
	}
}

// Sealed packs (root's, read-only) cannot have their times set by the
// owner, which is what stops a harness's git from copying them up into
// its layer when it freshens one; git running as the owner still reads
// them, and its full repack and prune still delete them. Control: before
// sealing, the owner sets a pack's times (the freshen git does).
func TestSealedPacksCannotBeFreshenedAndStillRepack(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.Need(t, false, "sealing packs needs root")
	}
	const owner = 65534
	f := newFixture(t)
	tgit(t, f.wt, "repack", "-adq")
	chownR(t, f.wt, owner)
	g := f.guard(t, nil)
	packs, _ := filepath.Glob(filepath.Join(f.wt, ".git", "objects", "pack", "pack-*"))
	if len(packs) < 2 {
		t.Fatalf("packs %v", packs)
	}
	freshen := func(p string) error {
		return asUID(owner, func() error { return unix.UtimesNano(p, nil) })
	}
	if err := freshen(packs[0]); err != nil {
		t.Fatalf("control: the owner cannot set an unsealed pack's times: %v", err)
	}
	must(t, g.SealPacks())
	for _, p := range packs {
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		if st.Uid != 0 || st.Mode&0o222 != 0 {
			t.Errorf("%s: uid %d mode %o after sealing", filepath.Base(p), st.Uid, st.Mode&0o777)
		}
		if err := freshen(p); err == nil {
			t.Errorf("%s: the owner set a sealed pack's times", filepath.Base(p))
		}
	}
	for gen := uint64(1); gen <= 4; gen++ {
		abandon(t, f, g, gen)
	}
	rep, err := g.Maintain(context.Background(), MaintainOptions{KeepSnapshots: 1, Slack: 1})
	if err != nil || rep.Repack != "full" {
		t.Fatalf("maintain over sealed packs: %v %+v", err, rep)
	}
	for _, p := range packs {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s: a full repack left the sealed pack (%v)", filepath.Base(p), err)
		}
	}
	tgit(t, f.wt, "fsck", "--full", "--no-dangling")
}

// asUID runs fn on a thread of its own with the effective uid (and gid)
// uid, and puts the thread back.
func asUID(uid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread is thrown away if it cannot be put back
		if _, _, e := unix.RawSyscall(unix.SYS_SETREGID, ^uintptr(0), uintptr(uid), 0); e != 0 {
			errc <- e
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETREUID, ^uintptr(0), uintptr(uid), 0); e != 0 {
			errc <- e
			return
		}
		err := fn()
		_, _, e1 := unix.RawSyscall(unix.SYS_SETREUID, ^uintptr(0), 0, 0)
		_, _, e2 := unix.RawSyscall(unix.SYS_SETREGID, ^uintptr(0), 0, 0)
		if e1 == 0 && e2 == 0 {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// The store reads every object's type as git does: from a loose object's
// header, a pack entry's, or through a chain of deltas to its base (offset
// deltas, and deltas naming their base), for both object formats; what
// the store does not have has no type.
func TestObjectStoreTypesAreGits(t *testing.T) {
	for _, c := range []struct{ name, format, offsets string }{
		{"offset deltas", "sha1", "true"}, {"named bases", "sha1", "false"}, {"sha256", "sha256", "true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			repo := filepath.Join(t.TempDir(), "repo")
			tgit(t, filepath.Dir(repo), "init", "-q", "--object-format="+c.format, repo)
			body := strings.Repeat("a line that stays the same in every version\n", 40)
			for i := 0; i < 12; i++ { // versions of the same files: deltas of each other
				writeFile(t, filepath.Join(repo, "f.txt"), body+strconv.Itoa(i)+"\n")
				writeFile(t, filepath.Join(repo, "dir", "sub", fmt.Sprintf("g%d.txt", i%3)), body+strings.Repeat("x", i))
				tgit(t, repo, "add", "-A")
				tgit(t, repo, "commit", "-qm", "v"+strconv.Itoa(i))
			}
			tgit(t, repo, "tag", "-a", "-m", "a tag", "t1")
			tgit(t, repo, "-c", "repack.useDeltaBaseOffset="+c.offsets, "repack", "-adfq", "--depth=50", "--window=50")
			writeFile(t, filepath.Join(repo, "loose.txt"), "a loose blob\n")
			loose := tgit(t, repo, "hash-object", "-w", filepath.Join(repo, "loose.txt"))
			hexLen := map[string]int{"sha1": 40, "sha256": 64}[c.format]
			store, ok := openObjectStore(filepath.Join(repo, ".git"), hexLen)
			if !ok {
				t.Fatal("the store cannot be read")
			}
			defer store.close()
			deltas := 0
			for _, line := range strings.Split(tgit(t, repo, "verify-pack", "-v", mustGlobs(t, filepath.Join(repo, ".git", "objects", "pack", "*.idx"))[0]), "\n") {
				if f := strings.Fields(line); len(f) >= 7 && len(f[0]) == hexLen {
					deltas++
				}
			}
			if deltas == 0 {
				t.Fatal("control: the pack holds no delta; the test reads no chain")
			}
			n := typesAreGits(t, repo, store)
			if n < 40 || store.typeOf(loose) != gitformat.Blob {
				t.Errorf("%d objects read; the loose blob's type %d", n, store.typeOf(loose))
			}
			if got := store.typeOf(strings.Repeat("5", hexLen)); got != 0 {
				t.Errorf("an object the store does not have has type %d", got)
			}
		})
	}
}

// A loose object read again from the layer for the pack (its bytes were
// not kept in memory) is hashed again: bytes that no longer have its name
// are not packed under it (the pack is refused, and listed).
func TestALooseObjectReadAgainIsHashedAgain(t *testing.T) {
	layer := filepath.Join(t.TempDir(), "objects")
	big := rawObject("blob", bytes.Repeat([]byte("b"), 100000))
	id := looseIn(t, layer, 40, big)
	ofd, err := openDir(layer)
	must(t, err)
	defer unix.Close(ofd)
	budget, kept := int64(maxLayerObjects), int64(0) // nothing kept: read again
	objs := verifyLoose(ofd, id[:2], 40, &budget, &kept)
	if len(objs) != 1 || objs[0].data != nil {
		t.Fatalf("checked %+v", objs)
	}
	var buf bytes.Buffer
	if _, _, err := writePack(&buf, ofd, objs, 40); err != nil {
		t.Fatalf("control: the unchanged object is not packed: %v", err)
	}
	other := rawObject("blob", bytes.Repeat([]byte("c"), 100000))
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(other)
	zw.Close()
	writeFile(t, filepath.Join(layer, id[:2], id[2:]), z.String())
	if _, _, err := writePack(&buf, ofd, objs, 40); err == nil || !strings.Contains(err.Error(), "changed since it was checked") {
		t.Errorf("other bytes under a checked name were packed: %v", err)
	}
}

// A loose file over looseReadWhole is checked as a stream (never read
// whole) and, its bytes not kept, read again for the pack as one: git
// takes the pack; a file of that size whose bytes are not its name's is
// left out all the same.
func TestALargeLooseObjectIsCheckedAndPackedAsAStream(t *testing.T) {
	layer := filepath.Join(t.TempDir(), "objects")
	body := make([]byte, looseReadWhole*3/2)
	rand.Read(body) // incompressible: the file is as large
	id := looseIn(t, layer, 40, rawObject("blob", body))
	if st, err := os.Stat(filepath.Join(layer, id[:2], id[2:])); err != nil || st.Size() <= looseReadWhole {
		t.Fatalf("control: the loose file is not over %d bytes: %v", looseReadWhole, err)
	}
	ofd, err := openDir(layer)
	must(t, err)
	defer unix.Close(ofd)
	budget, kept := int64(maxLayerObjects), int64(0)
	objs := verifyLoose(ofd, id[:2], 40, &budget, &kept)
	if len(objs) != 1 || objs[0].size != int64(len(body)) || objs[0].data != nil {
		t.Fatalf("checked %+v", objs)
	}
	repo := filepath.Join(t.TempDir(), "repo")
	tgit(t, filepath.Dir(repo), "init", "-q", repo)
	store, ok := openObjectStore(filepath.Join(repo, ".git"), 40)
	if !ok {
		t.Fatal("the store of a new repository cannot be read")
	}
	must(t, store.addPack(ofd, objs))
	store.close()
	if got := tgit(t, repo, "cat-file", "-s", id); got != strconv.Itoa(len(body)) {
		t.Errorf("the packed blob reads %s bytes, want %d", got, len(body))
	}
	rand.Read(body)
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(rawObject("blob", body))
	zw.Close()
	writeFile(t, filepath.Join(layer, id[:2], id[2:]), z.String())
	if objs := verifyLoose(ofd, id[:2], 40, &budget, &kept); len(objs) != 0 {
		t.Errorf("other bytes under the name were taken: %+v", objs)
	}
}

// typesAreGits checks store's type of every object of repo against
// cat-file's and returns how many it checked.
func typesAreGits(t *testing.T, repo string, store *objectStore) int {
	t.Helper()
	want := map[string]int{"commit": gitformat.Commit, "tree": gitformat.Tree, "blob": gitformat.Blob, "tag": gitformat.Tag}
	n := 0
	for _, line := range strings.Split(tgit(t, repo, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)"), "\n") {
		f := strings.Fields(line)
		if got := store.typeOf(f[0]); got != want[f[1]] {
			t.Errorf("%s: type %d, want %s", f[0], got, f[1])
		}
		n++
	}
	return n
}
