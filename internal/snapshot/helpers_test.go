package snapshot

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// gitID is the hex name git gives an object of type typ and bytes b.
func gitID(typ string, b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "%s %d\x00", typ, len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func blobID(s string) string { return gitID("blob", []byte(s)) }

// ent is a tree entry as a test writes it: mode in git's octal, hex id.
type ent struct{ mode, name, id string }

// treeBytes encodes entries as git does: sorted by name, a tree's with a
// slash after it.
func treeBytes(es ...ent) []byte {
	key := func(e ent) string {
		if e.mode == "40000" {
			return e.name + "/"
		}
		return e.name
	}
	sort.Slice(es, func(i, j int) bool { return key(es[i]) < key(es[j]) })
	var b []byte
	for _, e := range es {
		raw, err := hex.DecodeString(e.id)
		if err != nil {
			panic(err)
		}
		b = append(b, e.mode+" "+e.name+"\x00"...)
		b = append(b, raw...)
	}
	return b
}

func treeID(es ...ent) string { return gitID("tree", treeBytes(es...)) }

// fakeStore is a repository of the objects put in it.
type fakeStore struct {
	objs   map[string]fakeObj
	packed map[string]bool
}

type fakeObj struct {
	typ int
	b   []byte
}

func newStore() *fakeStore {
	return &fakeStore{objs: map[string]fakeObj{}, packed: map[string]bool{}}
}

func (s *fakeStore) HexLen() int { return 40 }
func (s *fakeStore) Read(id string, max int64) (int, []byte, error) {
	o, ok := s.objs[id]
	if !ok {
		return 0, nil, fmt.Errorf("%w: %s", gitformat.ErrUnreadable, id)
	}
	if int64(len(o.b)) > max {
		return 0, nil, fmt.Errorf("%s: over %d bytes", id, max)
	}
	return o.typ, o.b, nil
}
func (s *fakeStore) HasPacked(id string) bool { return s.packed[id] }

// tree stores a tree of entries es and returns its hex name.
func (s *fakeStore) tree(es ...ent) string {
	b := treeBytes(es...)
	id := gitID("tree", b)
	s.objs[id] = fakeObj{gitformat.Tree, b}
	s.packed[id] = true
	return id
}

// blob stores a blob and returns its hex name.
func (s *fakeStore) blob(body string) string {
	id := blobID(body)
	s.objs[id] = fakeObj{gitformat.Blob, []byte(body)}
	s.packed[id] = true
	return id
}

// layer makes a layer in a temp dir: a path ending in / a directory, a
// value starting "->" a symlink, one starting "+x " an executable file,
// else a file of those bytes.
func layer(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, v := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(p, "/"):
			err = os.MkdirAll(full, 0o755)
		case strings.HasPrefix(v, "->"):
			err = os.Symlink(v[2:], full)
		case strings.HasPrefix(v, "+x "):
			err = os.WriteFile(full, []byte(v[3:]), 0o755)
		default:
			err = os.WriteFile(full, []byte(v), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// openDir opens dir for a walk, closed with the test.
func openDir(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// recSink records the walk's changes, one line each.
type recSink struct {
	ev  []string
	err error // returned by Put when set
}

func (r *recSink) Enter(p string, opaque bool) error {
	r.ev = append(r.ev, fmt.Sprintf("enter %s %v", p, opaque))
	return nil
}
func (r *recSink) Leave() error { r.ev = append(r.ev, "leave"); return nil }
func (r *recSink) Put(p string, mode uint32, size int64, body io.ReaderAt) error {
	if r.err != nil {
		return r.err
	}
	b, err := io.ReadAll(io.NewSectionReader(body, 0, size))
	if err != nil {
		return err
	}
	r.ev = append(r.ev, fmt.Sprintf("put %s %o %q", p, mode, b))
	return nil
}
func (r *recSink) Remove(p string) error { r.ev = append(r.ev, "remove "+p); return nil }

// walkLayer walks dir into sink within b (files over max not stored) and
// returns what it did not store.
func walkLayer(t *testing.T, dir string, sink Sink, max int64, b Bounds, scanned bool) ([]api.NotStoredFile, *Walk, error) {
	t.Helper()
	var skipped []api.NotStoredFile
	w := NewWalk(sink, max, b, scanned, func(f api.NotStoredFile) { skipped = append(skipped, f) })
	err := w.Run(openDir(t, dir))
	return skipped, w, err
}

// markSink stands in for the overlay's whiteouts and opaque directories,
// which need root to make: a file named NAME.wh is a whiteout of NAME, a
// directory named NAME.opq is NAME, opaque.
type markSink struct{ Sink }

func unmark(p string) string { return strings.ReplaceAll(p, ".opq", "") }

func (s markSink) Enter(p string, opaque bool) error {
	return s.Sink.Enter(unmark(p), opaque || strings.HasSuffix(p, ".opq"))
}
func (s markSink) Put(p string, mode uint32, size int64, body io.ReaderAt) error {
	if strings.HasSuffix(p, ".wh") {
		return s.Sink.Remove(unmark(strings.TrimSuffix(p, ".wh")))
	}
	return s.Sink.Put(unmark(p), mode, size, body)
}
func (s markSink) Remove(p string) error { return s.Sink.Remove(unmark(p)) }
