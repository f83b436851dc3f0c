package gitformat

// Fuzz targets for every parser here (each reads bytes a harness wrote:
// its commits' loose objects and packs sit in its layer, and shim reads
// them as root, in PID 1): pack indexes, pack entries and their delta
// chains, deltas, zlib streams, loose objects, commits and trees, quoted
// paths, packed-refs and loose refs. Each is seeded with real objects (git's own, when git is here)
// and with the red team's shapes (shapes_test.go). The property: no
// panic, no allocation past the bound the caller gave, what is returned is
// within it, and the readers agree with each other. scripts/fuzz runs
// them long; scripts/test runs each briefly.

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"io"
	"strings"
	"testing"
)

// fuzzMax is the bound the targets give every read; entryMax the pack
// reads' (each exec reads up to 17 objects: at fuzzMax, allocating as
// much as the bound allows made each exec cost milliseconds).
const (
	fuzzMax  = 1 << 20
	entryMax = 1 << 16
)

// packsOf is the Packs of one pack (bytes, not a file) and its index
// (an empty one when idx is not an index), within a budget.
func packsOf(pack, idx []byte) *Packs {
	x, err := ParseIndex(idx, 20)
	if err != nil {
		x, _ = ParseIndex(emptyIndex(), 20)
	}
	b := Budget(4 * entryMax)
	return &Packs{List: []Pack{{Name: "fuzz", Index: x, Data: pack}}, HashLen: 20, Budget: &b}
}

func FuzzPackIndex(f *testing.F) {
	if r := gitRepo(f); r != nil {
		f.Add(r.idx, r.idx[idxHeader:idxHeader+20])
	}
	f.Add(emptyIndex(), make([]byte, 20))
	huge := emptyIndex()
	huge[8+255*4] = 0xff // a count the size cannot hold
	f.Add(huge, bytes.Repeat([]byte{0xff}, 20))
	id := bytes.Repeat([]byte{0xaa}, 20)
	f.Add(indexOf([][]byte{id}, []uint64{1 << 40}), id) // a 64-bit offset
	bent := indexOf([][]byte{id}, []uint64{1<<31 | 5})  // an index into a 64-bit table it lacks
	f.Add(bent[:len(bent)-8], id)
	f.Fuzz(func(t *testing.T, idx, name []byte) {
		x, err := ParseIndex(idx, 20)
		if err != nil {
			return
		}
		raw := make([]byte, 20)
		copy(raw, name)
		if i, ok := x.Find(raw); ok {
			if i < 0 || i >= x.Len() {
				t.Fatalf("found at %d of %d", i, x.Len())
			}
			x.Offset(i)
		}
		for i := -1; i <= x.Len() && i < 64; i++ {
			x.Offset(i)
		}
	})
}

func FuzzPackEntry(f *testing.F) {
	if r := gitRepo(f); r != nil {
		x, err := ParseIndex(r.idx, 20)
		if err != nil {
			f.Fatal(err)
		}
		for i := 0; i < x.Len(); i++ {
			if off, ok := x.Offset(i); ok {
				f.Add(r.pack, r.idx, off)
			}
		}
	}
	for _, s := range append(redTeamPacks(), deepChain(50)) {
		f.Add(s.pack, s.idx, s.off)
	}
	f.Fuzz(func(t *testing.T, pack, idx []byte, off uint64) {
		s := packsOf(pack, idx)
		typ, data, err := s.readAt(0, off, entryMax, 0)
		if err == nil && (len(data) > entryMax || typ < Commit || typ > Tag) {
			t.Fatalf("a read of %d bytes of type %d past its bound", len(data), typ)
		}
		if *s.Budget < 0 && err == nil {
			t.Fatal("a read past its budget")
		}
		n := s.List[0].Index.Len()
		for i := 0; i < n && i < 16; i++ {
			t0 := s.Type(0, i)
			if typ, _, err := s.Read(0, i, entryMax); err == nil && typ != t0 {
				t.Fatalf("object %d: read as type %d, typed %d", i, typ, t0)
			}
		}
	})
}

func FuzzApplyDelta(f *testing.F) {
	base := []byte("the base of a delta, with some bytes to copy")
	// base size, result size, copy 10 bytes from 4, insert 3
	f.Add(base, append([]byte{byte(len(base)), 13, 0x91, 4, 10, 3}, "new"...))
	f.Add(base, []byte{byte(len(base)), 0xff, 0xff, 0xff, 0xff, 0x0f})                // a result of 4 GiB declared
	f.Add(base, []byte{byte(len(base)), 4, 0x80})                                     // copy 0x10000 bytes of a short base
	f.Add(base, []byte{byte(len(base)), 4, 0x8f, 0xff, 0xff, 0xff, 0xff})             // copy from offset 2^32-1
	f.Add(base, append(varint(uint64(len(base))), bytes.Repeat([]byte{0xff}, 11)...)) // a size of more than 64 bits
	f.Add(base, []byte{byte(len(base)), 1, 0})                                        // the reserved instruction
	f.Add([]byte{}, []byte{0, 0})
	f.Add(bytes.Repeat([]byte{'x'}, 300), copyAll(300, 3))
	f.Fuzz(func(t *testing.T, base, delta []byte) {
		out, err := ApplyDelta(base, delta, fuzzMax)
		if err == nil && len(out) > fuzzMax {
			t.Fatalf("%d bytes past the bound", len(out))
		}
	})
}

func FuzzInflate(f *testing.F) {
	if r := gitRepo(f); r != nil {
		for _, z := range r.loose {
			f.Add(z, 5)
		}
	}
	f.Add(zlibOf(bytes.Repeat([]byte{0}, 4<<20)), 5) // a zlib bomb of the bound's 4x
	f.Add(zlibOf([]byte("hello")), 5)
	f.Add(zlibOf([]byte("hello"))[:6], 5) // truncated
	bad := zlibOf([]byte("hello"))
	bad[len(bad)-1] ^= 1 // a wrong checksum
	f.Add(bad, 5)
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
// computed, so the fuzzer reaches the header's parsers (a name that does
// not match is refused before them). The four readers of a loose object
// must agree.
func FuzzLooseObject(f *testing.F) {
	if r := gitRepo(f); r != nil {
		for _, b := range r.inflated {
			f.Add(b, false)
		}
	}
	f.Add([]byte("blob 5\x00hello"), false)
	f.Add([]byte("tree 0\x00"), false)
	f.Add([]byte("blob 99999999999999999999\x00x"), false)
	f.Add([]byte("blob 1073741824\x00"), false) // a huge declared size
	f.Add([]byte("blob 05\x00hello"), false)    // not git's own header
	f.Add([]byte("commit 3\x00abc"), true)
	f.Add(bytes.Repeat([]byte("x"), 4096), false) // no header's end
	f.Add([]byte("nothing"), false)
	f.Fuzz(func(t *testing.T, obj []byte, truncate bool) {
		sum := sha1.Sum(obj)
		id := hex.EncodeToString(sum[:])
		z := zlibOf(obj)
		if truncate && len(z) > 2 {
			z = z[:len(z)/2]
		}
		b := Budget(4 * fuzzMax)
		typ, body, err := ParseLoose(id, z, fuzzMax, &b)
		var keep bytes.Buffer
		c := VerifyLoose(bytes.NewReader(z), id, fuzzMax, &keep, fuzzMax)
		if c.Inflated > fuzzMax+maxHeaderLen+1 {
			t.Fatalf("VerifyLoose inflated %d bytes", c.Inflated)
		}
		if c.OK && (err != nil || typ != c.Type || int64(len(body)) != c.Size || !bytes.Equal(body, keep.Bytes())) {
			t.Fatalf("VerifyLoose took what ParseLoose read as type %d, %d bytes, %v", typ, len(body), err)
		}
		if c.OK && LooseType(z) != c.Type {
			t.Fatalf("LooseType %d, VerifyLoose %d", LooseType(z), c.Type)
		}
		// OpenLoose streams what VerifyLoose took: its header, then its
		// bytes; of anything else it reads no more than a header's bound.
		hdr, lr, lerr := OpenLoose(bytes.NewReader(z))
		if len(hdr) > maxHeaderLen {
			t.Fatalf("OpenLoose read a header of %d bytes", len(hdr))
		}
		if c.OK {
			if lerr != nil || !bytes.HasPrefix(obj, []byte(hdr)) {
				t.Fatalf("OpenLoose: header %q, %v", hdr, lerr)
			}
			if b, err := io.ReadAll(io.LimitReader(lr, c.Size)); err != nil || !bytes.Equal(b, keep.Bytes()) {
				t.Fatalf("OpenLoose read %d bytes, %v", len(b), err)
			}
		}
		if err != nil {
			return
		}
		if len(body) > fuzzMax || typ < Commit || typ > Tag || !bytes.HasSuffix(obj, body) {
			t.Fatalf("type %d, %d bytes", typ, len(body))
		}
	})
}

func FuzzCommitAndTree(f *testing.F) {
	if r := gitRepo(f); r != nil {
		commits, trees := r.bodies("commit"), r.bodies("tree")
		for i := range min(len(commits), len(trees)) {
			f.Add(commits[i], trees[i])
		}
	}
	tree := "1234567890123456789012345678901234567890"
	f.Add([]byte("tree "+tree+"\nparent "+tree+"\nauthor a <a> 1 +0000\n"), []byte("100644 f\x00"+string(make([]byte, 20))))
	f.Add([]byte("tree "+tree+"\n"), []byte("40000 d\x00"+string(make([]byte, 19))))
	f.Add([]byte("tree x\n"), []byte(" \x00"))
	f.Fuzz(func(t *testing.T, commit, tree []byte) {
		if tr, parents, ok := CommitLinks(commit, 40); ok && (len(tr) != 40 || len(parents) > len(commit)/40) {
			t.Fatalf("tree %q, %d parents of %d bytes", tr, len(parents), len(commit))
		}
		n := 0
		TreeEntries(tree, 20, func(mode, id string) bool {
			n++
			if len(id) != 40 || mode == "" {
				t.Fatalf("mode %q, an id of %d hex digits", mode, len(id))
			}
			return true
		})
		if n > len(tree)/22+1 {
			t.Fatalf("%d entries in %d bytes", n, len(tree))
		}
		m := 0
		ok := ReadTree(tree, 20, func(mode, name, id []byte) bool {
			m++
			if len(id) != 20 || len(mode) == 0 || len(name) == 0 || bytes.IndexByte(name, 0) >= 0 || bytes.IndexByte(mode, ' ') >= 0 {
				t.Fatalf("mode %q, name %q, an id of %d bytes", mode, name, len(id))
			}
			return true
		})
		if ok != TreeEntries(tree, 20, func(string, string) bool { return true }) || (ok && m != n) {
			t.Fatalf("ReadTree read %d entries (%v), TreeEntries %d", m, ok, n)
		}
	})
}

func FuzzUnquotePath(f *testing.F) {
	f.Add(`"a\tb\303\251"`)
	f.Add(`"\"`)
	f.Add(`plain`)
	f.Add(`"\777"`)
	f.Add(`"a\"b\\c"`)
	f.Add(`"unterminated`)
	f.Fuzz(func(t *testing.T, q string) {
		p, err := UnquotePath(q)
		if err == nil && len(p) > len(q) {
			t.Fatalf("%q unquoted to a longer %q", q, p)
		}
		if back, err := UnquotePath(QuotePath(q)); err != nil || back != q {
			t.Fatalf("%q quoted as %q reads back as %q, %v", q, QuotePath(q), back, err)
		}
	})
}

func FuzzRefs(f *testing.F) {
	if r := gitRepo(f); r != nil {
		f.Add(r.refs, r.head)
	}
	id := strings.Repeat("ab", 20)
	f.Add([]byte("# pack-refs with: peeled fully-peeled sorted \n"+id+" refs/heads/main\n^"+id+"\n"), []byte(id+"\n"))
	f.Add([]byte(id+" refs/heads/a..b\n"+id+" refs/heads/x.lock\n"+id+" refs/tags/@{x}\n"), []byte("ref: refs/heads/../../x\n"))
	f.Add([]byte(id+" refs/heads/crlf\r\n"+id+"  refs/heads/two-spaces\n"+id+" refs/heads/last"), []byte("ref: HEAD"))
	f.Add([]byte(strings.Repeat("x", 4096)), []byte("ref: refs/heads/\x00"))
	f.Fuzz(func(t *testing.T, packed, loose []byte) {
		n := 0
		ParsePackedRefs(packed, func(name, oid string) bool {
			n++
			if !ValidRefName(name) || !IsObjectName(oid) || !bytes.Contains(packed, []byte(oid+" "+name)) {
				t.Fatalf("ref %q of %q", name, oid)
			}
			return n < 1000
		})
		if n > bytes.Count(packed, []byte{'\n'})+1 {
			t.Fatalf("%d refs of %d lines", n, bytes.Count(packed, []byte{'\n'})+1)
		}
		if v, ok := ParseRefValue(loose); ok {
			name, sym := strings.CutPrefix(v, "ref: ")
			if sym && name != "HEAD" && !ValidRefName(name) || !sym && !IsObjectName(v) || strings.ContainsAny(v, "\n\x00") {
				t.Fatalf("%q taken as %q", loose, v)
			}
		}
	})
}

func FuzzGitfile(f *testing.F) {
	f.Add([]byte("gitdir: .git-real\n"))
	f.Add([]byte("gitdir: /abs/path/.git/worktrees/w\nmore\n"))
	f.Add([]byte("gitdir:\t  spaced  \r\n"))
	f.Add([]byte("gitdir:"))
	f.Add([]byte("\x00gitdir: x"))
	f.Add([]byte(strings.Repeat("gitdir: ", 512)))
	f.Fuzz(func(t *testing.T, data []byte) {
		target, ok := ParseGitfile(data)
		if !ok && target != "" || len(target) > len(data) || strings.ContainsAny(target, "\n") ||
			target != strings.TrimSpace(target) {
			t.Fatalf("%q read as %q, %v", data, target, ok)
		}
	})
}
