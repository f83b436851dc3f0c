package gitguard

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/internal/gitformat"
	"github.com/shimdev/shim/internal/snapshot"
	"golang.org/x/sys/unix"
)

// attackPackEntry is one entry of a hand-made version 2 pack.
func attackPackEntry(typ int, size int, extra []byte, body []byte) []byte {
	var b bytes.Buffer
	c := byte(typ<<4) | byte(size&0x0f)
	size >>= 4
	for size > 0 {
		b.WriteByte(c | 0x80)
		c = byte(size & 0x7f)
		size >>= 7
	}
	b.WriteByte(c)
	b.Write(extra)
	zw, _ := zlib.NewWriterLevel(&b, zlib.BestCompression)
	zw.Write(body)
	zw.Close()
	return b.Bytes()
}

func attackVarint(b *bytes.Buffer, v int) {
	for v >= 0x80 {
		b.WriteByte(byte(v) | 0x80)
		v >>= 7
	}
	b.WriteByte(byte(v))
}

// attackInsertDelta is a delta on a base of baseLen bytes that copies
// nothing and inserts out.
func attackInsertDelta(baseLen int, out []byte) []byte {
	var b bytes.Buffer
	attackVarint(&b, baseLen)
	attackVarint(&b, len(out))
	for len(out) > 0 {
		n := len(out)
		if n > 127 {
			n = 127
		}
		b.WriteByte(byte(n))
		b.Write(out[:n])
		out = out[n:]
	}
	return b.Bytes()
}

// A harness puts a pack in its layer's .git/objects/pack. index-pack
// (not --strict) takes it into the trusted store: a huge "tree" B of
// zeros, and a copy of each of the baseline's trees as a REF_DELTA on B
// (each copy hashes to the baseline tree's own name, so index-pack keeps
// it). The baseline's trees were loose (a plain git commit), and the
// store reads packs first: every baseline tree the import loads is read
// through B. Found by a review of the first in-shim import (8a6eb54),
// which inflated B again for each tree, without a bound or the fence's
// deadline: 14 GiB inflated and 16 s in PID 1 for 300 directories.
//
// Now a base larger than a tree may be (snapshot.TreeReadMax) is refused at once,
// and one under it that the base cache does not keep runs into the
// import's inflate budget: either way git fast-import imports the layer,
// under git's deadline, and the snapshot holds every edit. Control: the
// same trees read without a budget inflate far more than it allows.
func TestAttackMemImportDeltaBombGoesToGit(t *testing.T) {
	requireRoot(t)
	for _, bsize := range []int{48 << 20, 15 << 20} {
		t.Run(fmt.Sprintf("a base of %d MiB", bsize>>20), func(t *testing.T) {
			f := newFixture(t)
			const dirs = 300
			base := f.commitDirs(t, dirs)
			c := &countingRunner{runs: map[string]int{}}
			g := f.guard(t, func(cfg *Config) { cfg.Runner = c })
			// the baseline's trees, loose (as a plain commit leaves them)
			trees := strings.Split(tgit(t, f.wt, "ls-tree", "-r", "-d", "--format=%(objectname)", base), "\n")
			trees = append(trees, tgit(t, f.wt, "rev-parse", base+"^{tree}"))

			// the harness's pack
			zeros := make([]byte, bsize)
			h := sha1.New()
			fmt.Fprintf(h, "tree %d\x00", bsize)
			h.Write(zeros)
			bid := h.Sum(nil)
			var pack bytes.Buffer
			pack.Write([]byte{'P', 'A', 'C', 'K', 0, 0, 0, 2, 0, 0, 0, 0})
			binary.BigEndian.PutUint32(pack.Bytes()[8:], uint32(1+len(trees)))
			pack.Write(attackPackEntry(gitformat.Tree, bsize, nil, zeros))
			for _, id := range trees {
				body, err := exec.Command("/usr/bin/git", "-C", f.wt, "cat-file", "tree", id).Output()
				must(t, err)
				d := attackInsertDelta(bsize, body)
				pack.Write(attackPackEntry(gitformat.RefDelta, len(d), bid, d))
			}
			sum := sha1.Sum(pack.Bytes())
			pack.Write(sum[:])
			up := builtUpper(t, f, 7, func(up string) {
				writeFile(t, filepath.Join(up, ".git", "objects", "pack", "pack-"+hex.EncodeToString(sum[:])+".pack"), pack.String())
				for i := 0; i < dirs; i++ {
					writeFile(t, filepath.Join(up, fmt.Sprintf("d%03d", i), "f"), fmt.Sprintf("edited %d\n", i))
				}
			})
			c.reset()
			rep, err := g.SnapshotLayer(context.Background(), 7, base, up)
			if err != nil {
				t.Fatalf("SnapshotLayer: %v", err)
			}
			if n := c.counts()["fast-import"]; n != 1 || rep.Modified != dirs {
				t.Errorf("ran %v (want one fast-import), %d modified (want %d)", c.counts(), rep.Modified, dirs)
			}
			for _, i := range []int{0, dirs - 1} {
				if got := tgit(t, f.wt, "cat-file", "blob", fmt.Sprintf("%s:d%03d/f", rep.SnapshotCommit, i)); got != fmt.Sprintf("edited %d", i) {
					t.Errorf("the snapshot's d%03d/f: %q", i, got)
				}
			}
			// control: the harness's pack is in the store now; its trees,
			// read as the import would without a budget
			if bsize <= snapshot.TreeReadMax {
				s, ok := openObjectStore(filepath.Join(f.wt, ".git"), 40)
				if !ok {
					t.Fatal("the store does not open")
				}
				defer s.close()
				const unbounded = 1 << 50
				s.budget = unbounded
				for _, id := range trees {
					if _, _, err := s.read(id, snapshot.TreeReadMax); err != nil {
						t.Fatalf("control: %s: %v", id, err)
					}
				}
				if inflated := unbounded - s.budget; inflated <= snapshot.TreeInflateMax {
					t.Errorf("control: the trees inflated %d bytes, within the budget (%d): the attack tests nothing", inflated, snapshot.TreeInflateMax)
				}
			}
		})
	}
}

// The import stops at the fence's deadline, having written nothing.
func TestTheImportInShimStopsAtTheDeadline(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	baseTree := treeOf(t, g, f.baseline)
	up := filepath.Join(f.root, "layer", "upper")
	writeFile(t, filepath.Join(up, "README.md"), "edited\n")
	ref := RefPrefix + "4"
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	packs, _ := filepath.Glob(filepath.Join(f.wt, ".git", "objects", "pack", "*"))
	ufd, err := openDir(up)
	must(t, err)
	defer unix.Close(ufd)
	c := snapshot.Commit{Ref: ref, Msg: "m\n", BaseTree: baseTree, Parents: []string{f.baseline}, Now: 1700000000}
	if _, _, err := g.importInShim(ctx, ufd, c, &Report{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("importInShim after the deadline: %v", err)
	}
	after, _ := filepath.Glob(filepath.Join(f.wt, ".git", "objects", "pack", "*"))
	if len(after) != len(packs) {
		t.Errorf("a pack was written: %v -> %v", packs, after)
	}
	if _, err := tgitErr(f.wt, "rev-parse", "--verify", "-q", ref); err == nil {
		t.Errorf("the ref was written")
	}
}

// A baseline tree with modes git fast-import reads otherwise: it keeps a
// mode in 16 bits (get_mode's uint16_t: "1100644" is 0100644 to it) and
// takes mode 0 for an entry it deleted (missing to ls, left out of the
// tree it writes). A harness's commit that becomes the next baseline
// (index-pack and the loose check do not fsck trees) can hold such
// entries. The first in-shim import (8a6eb54) kept 32 bits and the entry:
// other answers and another commit than fast-import's. Now a tree with a
// mode git would not write is fast-import's, and the snapshot is its.
func TestAttackMemImportReadsModesAsFastImportDoes(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	baseTree := treeOf(t, g, f.baseline)
	raw, err := exec.Command("/usr/bin/git", "-C", f.wt, "cat-file", "tree", baseTree).Output()
	must(t, err)
	blob := tgit(t, f.wt, "rev-parse", f.baseline+":README.md")
	id, _ := hex.DecodeString(blob)
	raw = append(raw, []byte("1100644 weird\x00")...)
	raw = append(raw, id...)
	raw = append(raw, []byte("0 zero\x00")...)
	raw = append(raw, id...)
	tf := filepath.Join(f.root, "tree")
	must(t, os.WriteFile(tf, raw, 0o644))
	tree := tgit(t, f.wt, "hash-object", "-t", "tree", "-w", "--literally", tf)
	base := tgit(t, f.wt, "commit-tree", "-p", f.baseline, "-m", "a harness's tree, now the baseline", tree)

	up := filepath.Join(f.root, "layer", "upper")
	writeFile(t, filepath.Join(up, "README.md"), "edited\n")
	writeFile(t, filepath.Join(up, "zero"), "zero now\n")
	c := snapshot.Commit{Ref: RefPrefix + "5", Msg: "m\n", BaseTree: tree, Parents: []string{base}, Now: 1700000000}
	if _, _, err := inShim(t, g, up, c); !errors.Is(err, errNotHere) {
		t.Fatalf("importInShim: %v, want errNotHere", err)
	}
	rep, err := g.SnapshotLayer(context.Background(), 5, base, up)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tgit(t, f.wt, "rev-parse", rep.SnapshotCommit+"^{tree}"), tgit(t, f.wt, "rev-parse", byGit(t, g, up, c)+"^{tree}"); got != want {
		t.Errorf("the snapshot's tree:\n%s\nfast-import's:\n%s", tgit(t, f.wt, "ls-tree", got), tgit(t, f.wt, "ls-tree", want))
	}
}

// git fast-import writes every object of the stream into its pack unless
// a pack has it already (store_object: find_sha1_pack); shim's import skips
// any object whose loose file name exists (objectStore.has lists names,
// it reads nothing). A loose object that is empty or corrupt (a crash
// after git wrote it without fsync, core.fsync's default; or one a
// scan-mode generation planted) then leaves the snapshot naming bytes the
// store does not hold: the layer's file is lost, where fast-import's pack
// would have held it.
//
// The first in-shim import (8a6eb54) did so; now only a pack's object is
// not written again.
func TestAttackMemImportTrustsALooseFileName(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	baseTree := treeOf(t, g, f.baseline)
	up := filepath.Join(f.root, "layer", "upper")
	writeFile(t, filepath.Join(up, "precious.txt"), "the abandoned generation's work\n")
	blob := tgit(t, f.wt, "hash-object", filepath.Join(up, "precious.txt"))
	must(t, os.MkdirAll(filepath.Join(f.wt, ".git", "objects", blob[:2]), 0o755))
	must(t, os.WriteFile(filepath.Join(f.wt, ".git", "objects", blob[:2], blob[2:]), nil, 0o444)) // an empty loose object
	c := snapshot.Commit{Ref: RefPrefix + "3", Msg: "m\n", BaseTree: baseTree, Parents: []string{f.baseline}, Now: 1700000000}
	here, _, err := inShim(t, g, up, c)
	if err != nil {
		t.Fatalf("importInShim: %v", err)
	}
	if out, err := tgitErr(f.wt, "cat-file", "blob", here+":precious.txt"); err != nil {
		t.Errorf("shim's snapshot does not hold the file: %v\n%s", err, out)
	}
	// as importLayer runs it (unpackLimit=0: always a pack)
	if out, err := tgitErr(f.wt, "cat-file", "blob", byGit(t, g, up, c)+":precious.txt"); err != nil {
		t.Logf("fast-import's snapshot does not hold it either: %v\n%s", err, out)
	} else {
		t.Logf("fast-import's snapshot holds it: %q", strings.TrimSpace(out))
	}
}

// The stream's walk ends before importByGit returns, even where it writes
// nothing fast-import could refuse (empty directories): the caller closes
// the layer's descriptor, imports again with it, and resets the report
// the walk appends to. Before, a fast-import that ended (the deadline) left
// the walk going through 20,000 empty directories, below a descriptor
// closed (and reused by PID 1), and it listed the FIFO after them in the
// report afterwards.
func TestTheStreamsWalkEndsWithTheImportByGit(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	baseTree := treeOf(t, g, f.baseline)
	up := filepath.Join(f.root, "layer", "upper")
	must(t, os.MkdirAll(up, 0o755))
	for i := range 20000 {
		must(t, os.Mkdir(filepath.Join(up, fmt.Sprintf("d%05d", i)), 0o755))
	}
	must(t, unix.Mkfifo(filepath.Join(up, "zz"), 0o644))
	ufd, err := openDir(up)
	must(t, err)
	defer unix.Close(ufd)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep := &Report{}
	c := snapshot.Commit{Ref: "refs/shim-test/git", Msg: "m\n", BaseTree: baseTree, Parents: []string{f.baseline}, Now: 1700000000}
	if _, err := g.importByGit(ctx, ufd, c, true, rep); err == nil {
		t.Fatal("fast-import after the deadline: no error")
	}
	n := len(rep.NotStored)
	time.Sleep(500 * time.Millisecond)
	if len(rep.NotStored) != n || n != 0 {
		t.Fatalf("the walk went on after importByGit returned: not stored %v", rep.NotStored)
	}
}
