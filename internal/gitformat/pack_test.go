package gitformat

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
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
