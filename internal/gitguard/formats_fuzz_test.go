package gitguard

// Fuzz targets for every parser of git's formats that reads bytes a
// harness wrote (its commits' loose objects and packs sit in its layer,
// and shim reads them as root, in PID 1): pack indexes, pack entries and
// their delta chains, deltas, zlib streams, loose objects, commits and
// trees. Each is seeded with real objects (git's own, when git is here)
// and with the red team's shapes: delta cycles, huge declared sizes,
// truncated zlib. The property: no panic, no allocation past the bound
// the caller gave, and what is returned is within it. scripts/fuzz runs
// them long; scripts/test runs each briefly.

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// fuzzMax is the bound the targets give every read.
const fuzzMax = 1 << 20

func zlibOf(b []byte) []byte {
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// realPack is a pack and its index written by git (with deltas: one file
// in three versions), or nil where git is not here.
func realPack(tb testing.TB) (pack, idx []byte) {
	tb.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		return nil, nil
	}
	dir := tb.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=f", "-c", "user.email=f@f", "-c", "init.defaultBranch=main"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	run("init", "-q")
	body := bytes.Repeat([]byte("a line of the file that deltas share\n"), 40)
	for i := 0; i < 3; i++ {
		body = append(body, []byte("version "+strconv.Itoa(i)+"\n")...)
		if err := os.WriteFile(filepath.Join(dir, "f.txt"), body, 0o644); err != nil {
			tb.Fatal(err)
		}
		run("add", "f.txt")
		run("commit", "-qm", "v"+strconv.Itoa(i))
	}
	run("repack", "-adfq", "--depth=5")
	packs, _ := filepath.Glob(filepath.Join(dir, ".git/objects/pack/pack-*.pack"))
	if len(packs) != 1 {
		tb.Fatalf("git wrote %d packs", len(packs))
	}
	pack, _ = os.ReadFile(packs[0])
	idx, _ = os.ReadFile(packs[0][:len(packs[0])-len(".pack")] + ".idx")
	return pack, idx
}

// emptyIndex is a version 2 index of no object (and its two checksums).
func emptyIndex() []byte {
	b := append([]byte{0xff, 't', 'O', 'c', 0, 0, 0, 2}, make([]byte, 256*4+2*20)...)
	return b
}

// entry is a pack entry's header of type typ and declared size.
func entry(typ int, size uint64) []byte {
	c := byte(typ<<4) | byte(size&0x0f)
	size >>= 4
	var b []byte
	for size > 0 {
		b = append(b, c|0x80)
		c = byte(size & 0x7f)
		size >>= 7
	}
	return append(b, c)
}

// storeOf is an objectStore of one pack (bytes, not a file) and its index.
func storeOf(pack, idx []byte) *objectStore {
	s := &objectStore{hexLen: 40, budget: 4 * fuzzMax, fanout: map[string]map[string]bool{}}
	p, err := parseIndex("fuzz.idx", idx, 20)
	if err != nil {
		p, _ = parseIndex("fuzz.idx", emptyIndex(), 20)
	}
	p.pack = pack
	s.packs = []packIndex{p}
	return s
}

func FuzzPackIndex(f *testing.F) {
	_, idx := realPack(f)
	if idx != nil {
		f.Add(idx, idx[8+256*4:8+256*4+20])
	}
	f.Add(emptyIndex(), make([]byte, 20))
	huge := emptyIndex()
	binary.BigEndian.PutUint32(huge[8+255*4:], 0xffffffff) // a count the size cannot hold
	f.Add(huge, bytes.Repeat([]byte{0xff}, 20))
	f.Fuzz(func(t *testing.T, idx, name []byte) {
		p, err := parseIndex("fuzz.idx", idx, 20)
		if err != nil {
			return
		}
		raw := make([]byte, 20)
		copy(raw, name)
		if i, ok := p.find(raw); ok {
			p.offset(i, 20)
		}
		for i := 0; i < p.n && i < 64; i++ {
			p.offset(i, 20)
		}
	})
}

func FuzzPackEntry(f *testing.F) {
	pack, idx := realPack(f)
	if pack != nil {
		p, err := parseIndex("seed", idx, 20)
		if err != nil {
			f.Fatal(err)
		}
		for i := 0; i < p.n; i++ {
			if off, ok := p.offset(i, 20); ok {
				f.Add(pack, idx, off)
			}
		}
	}
	blob := append(entry(objBlob, 5), zlibOf([]byte("hello"))...)
	pre := []byte("PACK\x00\x00\x00\x02\x00\x00\x00\x01")
	f.Add(append(pre, blob...), emptyIndex(), uint64(12))
	// A declared size of 2^60: refused before anything is allocated.
	f.Add(append(append(pre, entry(objBlob, 1<<60)...), zlibOf([]byte("x"))...), emptyIndex(), uint64(12))
	// Truncated zlib.
	f.Add(append(pre, blob[:len(blob)-3]...), emptyIndex(), uint64(12))
	// An OFS_DELTA whose base is itself (a distance of 0) and one whose
	// base is before the pack.
	f.Add(append(append(pre, entry(objOfs, 4)...), 0x00), emptyIndex(), uint64(12))
	f.Add(append(append(pre, entry(objOfs, 4)...), 0x7f), emptyIndex(), uint64(12))
	// A REF_DELTA on its own name: a cycle through the index.
	self := make([]byte, 20)
	cyc := append(append(append([]byte(nil), pre...), entry(objRef, 4)...), self...)
	cyc = append(cyc, zlibOf([]byte{0, 0})...)
	ci := emptyIndex()[:8+256*4]
	for b := 0; b < 256; b++ {
		binary.BigEndian.PutUint32(ci[8+b*4:], 1)
	}
	ci = append(ci, self...)
	ci = append(ci, 0, 0, 0, 0)          // crc
	ci = append(ci, 0, 0, 0, 12)         // offset
	ci = append(ci, make([]byte, 40)...) // checksums
	f.Add(cyc, ci, uint64(12))
	f.Fuzz(func(t *testing.T, pack, idx []byte, off uint64) {
		if len(pack) == 0 {
			return
		}
		s := storeOf(pack, idx)
		typ, data, err := s.readAt(0, off%uint64(len(pack)), fuzzMax, 0)
		if err == nil && (len(data) > fuzzMax || typ < objCommit || typ > objTag) {
			t.Fatalf("a read of %d bytes of type %d past its bound", len(data), typ)
		}
		s.packType(0, 0)
		for i := 0; i < s.packs[0].n && i < 16; i++ {
			s.packType(0, i)
		}
	})
}

func FuzzApplyDelta(f *testing.F) {
	base := []byte("the base of a delta, with some bytes to copy")
	// base size, result size, copy 10 bytes from 4, insert 3
	f.Add(base, append([]byte{byte(len(base)), 13, 0x91, 4, 10, 3}, "new"...))
	f.Add(base, []byte{byte(len(base)), 0xff, 0xff, 0xff, 0xff, 0x0f}) // a result of 4 GiB declared
	f.Add(base, []byte{byte(len(base)), 4, 0x80})                      // copy 0x10000 bytes of a short base
	f.Add([]byte{}, []byte{0, 0})
	f.Fuzz(func(t *testing.T, base, delta []byte) {
		out, err := applyDelta(base, delta, fuzzMax)
		if err == nil && len(out) > fuzzMax {
			t.Fatalf("%d bytes past the bound", len(out))
		}
	})
}

func FuzzInflate(f *testing.F) {
	z := zlibOf(bytes.Repeat([]byte{0}, 4<<20)) // a zip bomb of the bound's 4x
	f.Add(z, 5)
	f.Add(zlibOf([]byte("hello")), 5)
	f.Add(zlibOf([]byte("hello"))[:6], 5)
	f.Fuzz(func(t *testing.T, z []byte, size int) {
		if out, err := inflateAll(z, fuzzMax); err == nil && len(out) > fuzzMax {
			t.Fatalf("inflateAll: %d bytes past the bound", len(out))
		}
		if size >= 0 && size <= fuzzMax {
			if out, err := inflateExact(z, size); err == nil && len(out) != size {
				t.Fatalf("inflateExact: %d bytes, want %d", len(out), size)
			}
		}
	})
}

// The object's bytes (header and body) are the input: their name is
// computed, so the fuzzer reaches the header's parser (a name that does
// not match is refused before it).
func FuzzLooseObject(f *testing.F) {
	f.Add([]byte("blob 5\x00hello"), false)
	f.Add([]byte("tree 0\x00"), false)
	f.Add([]byte("blob 99999999999999999999\x00x"), false)
	f.Add([]byte("commit 3\x00abc"), true)
	f.Add([]byte("nothing"), false)
	f.Fuzz(func(t *testing.T, obj []byte, truncate bool) {
		sum := sha1.Sum(obj)
		id := hex.EncodeToString(sum[:])
		z := zlibOf(obj)
		if truncate && len(z) > 2 {
			z = z[:len(z)/2]
		}
		s := &objectStore{hexLen: 40, budget: 4 * fuzzMax}
		typ, body, err := s.looseObject(id, z, fuzzMax)
		if err != nil {
			return
		}
		if len(body) > fuzzMax || typ < objCommit || typ > objTag {
			t.Fatalf("type %d, %d bytes", typ, len(body))
		}
		if !bytes.HasSuffix(obj, body) {
			t.Fatal("a body that is not the object's")
		}
	})
}

func FuzzCommitAndTree(f *testing.F) {
	tree := "1234567890123456789012345678901234567890"
	f.Add([]byte("tree "+tree+"\nparent "+tree+"\nauthor a <a> 1 +0000\n"), []byte("100644 f\x00"+string(make([]byte, 20))))
	f.Add([]byte("tree "+tree+"\n"), []byte("40000 d\x00"+string(make([]byte, 19))))
	f.Add([]byte("tree x\n"), []byte(" \x00"))
	f.Fuzz(func(t *testing.T, commit, tree []byte) {
		if tr, parents, ok := commitLinks(commit, 40); ok && (len(tr) != 40 || len(parents) > len(commit)/40) {
			t.Fatalf("tree %q, %d parents of %d bytes", tr, len(parents), len(commit))
		}
		n := 0
		treeEntries(tree, 20, func(mode, id string) bool {
			n++
			if len(id) != 40 {
				t.Fatalf("an id of %d hex digits", len(id))
			}
			return true
		})
		if n > len(tree)/22+1 {
			t.Fatalf("%d entries in %d bytes", n, len(tree))
		}
	})
}

func FuzzUnquotePath(f *testing.F) {
	f.Add(`"a\tb\303\251"`)
	f.Add(`"\"`)
	f.Add(`plain`)
	f.Add(`"\777"`)
	f.Fuzz(func(t *testing.T, q string) {
		p, err := unquotePath(q)
		if err == nil && len(p) > len(q) {
			t.Fatalf("%q unquoted to a longer %q", q, p)
		}
	})
}
