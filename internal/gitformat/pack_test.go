package gitformat

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// Every object of git's own pack (deltas among them) reads as its loose
// copy did, typed as its header says.
func TestPacksReadGitsPackAsItsLooseObjects(t *testing.T) {
	r := gitRepo(t)
	if r == nil {
		t.Skip("git is not here")
	}
	s := packsOf(r.pack, r.idx)
	deltas := 0
	for id, obj := range r.inflated {
		raw, _ := hex.DecodeString(id)
		i, at, ok := s.Find(raw)
		if !ok {
			t.Fatalf("%s: not in the pack", id)
		}
		off, _ := s.List[i].Index.Offset(at)
		if typ, _, _, _ := entryHeader(r.pack, off); typ == OfsDelta || typ == RefDelta {
			deltas++
		}
		typ, body, err := s.Read(i, at, entryMax)
		hdr, want, _ := bytes.Cut(obj, []byte{0})
		name, _, _ := bytes.Cut(hdr, []byte{' '})
		if err != nil || typ != typeFromName(string(name)) || !bytes.Equal(body, want) || s.Type(i, at) != typ {
			t.Errorf("%s: type %d (typed %d), %d bytes, %v; want %s", id, typ, s.Type(i, at), len(body), err, hdr)
		}
		if lt := LooseType(r.loose[id]); lt != typ {
			t.Errorf("%s: loose type %d", id, lt)
		}
		ltyp, lbody, err := ParseLoose(id, r.loose[id], fuzzMax, nil)
		c := VerifyLoose(bytes.NewReader(r.loose[id]), id, fuzzMax, nil, 0)
		if err != nil || ltyp != typ || !bytes.Equal(lbody, want) || !c.OK || c.Type != typ || c.Size != int64(len(want)) {
			t.Errorf("%s: loose %d %v, verified %+v", id, ltyp, err, c)
		}
	}
	if deltas == 0 {
		t.Errorf("git's pack has no delta to read")
	}
}

// A pack PackWriter writes, and its index, read back: every object whole.
func TestPackWriterRoundTrip(t *testing.T) {
	var pack, idx bytes.Buffer
	objs := map[string][]byte{}
	pw := NewPackWriter(&pack, 40, 40)
	for i := 0; i < 40; i++ {
		body := bytes.Repeat([]byte(strconv.Itoa(i)), i*3000) // some over a stored block
		h := NewHash(40)
		h.Write([]byte("blob " + strconv.Itoa(len(body)) + "\x00"))
		h.Write(body)
		id := h.Sum(nil)
		objs[string(id)] = body
		must(t, pw.Add(id, Blob, int64(len(body)), bytes.NewReader(body)))
	}
	entries, sum, err := pw.Close()
	must(t, err)
	must(t, WriteIndex(&idx, entries, sum, 40))
	x, err := ParseIndex(idx.Bytes(), 20)
	must(t, err)
	s := &Packs{List: []Pack{{Name: "w", Index: x, Data: pack.Bytes()}}, HashLen: 20}
	for id, want := range objs {
		i, at, ok := s.Find([]byte(id))
		if !ok {
			t.Fatalf("%x: not in the index", id)
		}
		typ, got, err := s.Read(i, at, 1<<20)
		if err != nil || typ != Blob || !bytes.Equal(got, want) {
			t.Errorf("%x: type %d, %d bytes, %v", id, typ, len(got), err)
		}
	}
	if err := NewPackWriter(&pack, 1, 40).Add(make([]byte, 20), Blob, 10, bytes.NewReader([]byte("short"))); err == nil {
		t.Errorf("an object shorter than its size was written")
	}
}

// A pack PackStream writes as its objects come is the pack PackWriter
// writes of them, byte for byte: the count in its header and its
// checksum fixed at the end; each object named as git names it.
func TestPackStreamIsPackWritersPack(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "pack")
	must(t, err)
	defer f.Close()
	var want bytes.Buffer
	ps := NewPackStream(f, 64)
	pw := NewPackWriter(&want, 30, 64)
	for i := 0; i < 30; i++ {
		typ := []int{Blob, Tree, Commit}[i%3]
		body := bytes.Repeat([]byte(strconv.Itoa(i)), i*3000)
		name, err := ps.Add(typ, int64(len(body)), bytes.NewReader(body))
		must(t, err)
		h := NewHash(64)
		h.Write([]byte(TypeName(typ) + " " + strconv.Itoa(len(body)) + "\x00"))
		h.Write(body)
		if !bytes.Equal(name, h.Sum(nil)) {
			t.Fatalf("object %d named %x, git names it %x", i, name, h.Sum(nil))
		}
		must(t, pw.Add(name, typ, int64(len(body)), bytes.NewReader(body)))
	}
	entries, sum, err := ps.Finish()
	must(t, err)
	wentries, wsum, err := pw.Close()
	must(t, err)
	got, err := os.ReadFile(f.Name())
	must(t, err)
	if !bytes.Equal(got, want.Bytes()) || !bytes.Equal(sum, wsum) || !reflect.DeepEqual(entries, wentries) {
		t.Errorf("the streamed pack (%d bytes, %x) is not the written one (%d bytes, %x)", len(got), sum, want.Len(), wsum)
	}
	if _, err := ps.Add(Blob, 10, bytes.NewReader([]byte("short"))); err == nil {
		t.Errorf("an object shorter than its size was written")
	}
	if _, _, err := ps.Finish(); err == nil {
		t.Errorf("a pack with a short object was finished")
	}
}

// Each of the red team's packs is refused or read within its bound; none
// reads whole but the one good blob.
func TestRedTeamShapes(t *testing.T) {
	for _, sh := range append(redTeamPacks(), deepChain(maxDeltaChain+2)) {
		s := packsOf(sh.pack, sh.idx)
		typ, data, err := s.readAt(0, sh.off, entryMax, 0)
		if sh.name == "a blob" {
			if err != nil || typ != Blob || string(data) != "hello" {
				t.Errorf("%s: %d %q %v", sh.name, typ, data, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, ErrUnreadable) {
			t.Errorf("%s: read (type %d, %d bytes, %v)", sh.name, typ, len(data), err)
		}
		if strings.Contains(sh.name, "REF_DELTA") && !strings.Contains(fmt.Sprint(err), "a delta cycle") {
			t.Errorf("%s: %v, not a cycle found at once", sh.name, err)
		}
		if s.Type(0, 0) != 0 && sh.name != "a 64-bit offset" {
			t.Errorf("%s: typed %d", sh.name, s.Type(0, 0))
		}
	}
}

// git's own packed-refs and HEAD read as git writes them.
func TestRefsReadAsGitWritesThem(t *testing.T) {
	r := gitRepo(t)
	if r == nil {
		t.Skip("git is not here")
	}
	refs := map[string]string{}
	ParsePackedRefs(r.refs, func(name, oid string) bool { refs[name] = oid; return true })
	if len(refs) != 2 || refs["refs/heads/main"] == "" || refs["refs/tags/t1"] == "" {
		t.Errorf("packed-refs %q read as %v", r.refs, refs)
	}
	if v, ok := ParseRefValue(r.head); !ok || v != "ref: refs/heads/main" {
		t.Errorf("HEAD %q read as %q, %v", r.head, v, ok)
	}
}

// An index whose fan-out bucket holds more names than Find reads at once
// (maxFindRead) is narrowed down one name at a time first: every name is
// found at its place, a name between two is not.
func TestFindInABucketPastTheReadBound(t *testing.T) {
	const hashLen = 20
	n := 2*maxFindRead/hashLen + 7
	names := make([][]byte, n)
	for i := range names {
		names[i] = make([]byte, hashLen)
		names[i][0] = 0xab // one bucket
		binary.BigEndian.PutUint32(names[i][1:], uint32(2*i+1))
	}
	var idx bytes.Buffer
	idx.Write(idxMagic)
	for b := 0; b < 256; b++ {
		c := 0
		if b >= 0xab {
			c = n
		}
		binary.Write(&idx, binary.BigEndian, uint32(c))
	}
	for _, name := range names {
		idx.Write(name)
	}
	idx.Write(make([]byte, 4*n)) // CRCs
	for i := range names {
		binary.Write(&idx, binary.BigEndian, uint32(12+i))
	}
	idx.Write(make([]byte, 2*hashLen))
	x, err := ParseIndex(idx.Bytes(), hashLen)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range names {
		if at, ok := x.Find(name); !ok || at != i {
			t.Fatalf("name %d: at %d, %v", i, at, ok)
		}
		if off, ok := x.Offset(i); !ok || off != uint64(12+i) {
			t.Fatalf("name %d: offset %d, %v", i, off, ok)
		}
		between := bytes.Clone(name)
		binary.BigEndian.PutUint32(between[1:], uint32(2*i))
		if _, ok := x.Find(between); ok {
			t.Fatalf("a name between %d and %d found", i-1, i)
		}
	}
	if cap(x.buf) > maxFindRead {
		t.Errorf("Find read %d bytes at once, more than %d", cap(x.buf), maxFindRead)
	}
}
