package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/internal/gitformat"
)

// A baseline tree the import does not read (not hex, not in the store,
// not a tree, malformed, an entry git would not write) is fast-import's.
func TestImportBaselineGitWouldNotWrite(t *testing.T) {
	s := newStore()
	a := s.blob("a")
	bad := func(b []byte) string {
		id := gitID("tree", b)
		s.objs[id] = fakeObj{gitformat.Tree, b}
		return id
	}
	raw := func(mode, name string) []byte { return treeBytes(ent{mode, name, a}) }
	cases := map[string]string{
		"not hex":      "zz",
		"missing":      strings.Repeat("ab", 20),
		"a blob":       a,
		"malformed":    bad([]byte("100644 x")),
		"odd mode":     bad(raw("100664", "x")),
		"dot-dot":      bad(raw("100644", "..")),
		"dot":          bad(raw("100644", ".")),
		"duplicate":    bad(append(raw("100644", "x"), raw("100644", "x")...)),
		"subtree blob": s.tree(ent{"40000", "d", a}),
	}
	dir := layer(t, map[string]string{"d/f": "f"})
	for name, base := range cases {
		r := runImport(t, context.Background(), s, base, dir, 0)
		if !errors.Is(r.err, ErrNotHere) {
			t.Errorf("%s: %v", name, r.err)
		}
	}
}

// Past MaxHeldEntries tree entries (a baseline's, or the layer's
// added to it) the import says git must import.
func TestImportHeldEntriesBound(t *testing.T) {
	s := newStore()
	a := s.blob("a")
	many := func(n int) string {
		es := make([]ent, n)
		for i := range es {
			es[i] = ent{"100644", fmt.Sprintf("f%05d", i), a}
		}
		return s.tree(es...)
	}
	full, over := many(MaxHeldEntries), many(MaxHeldEntries+1)
	for _, c := range []struct {
		base  string
		files map[string]string
		ok    bool
	}{
		{full, map[string]string{"f00000": "a"}, true}, // no change: nothing held
		{full, map[string]string{"new": "n"}, false},
		{over, map[string]string{}, false},
	} {
		r := runImport(t, context.Background(), s, c.base, layer(t, c.files), 0)
		if c.ok != (r.err == nil) || !c.ok && !errors.Is(r.err, ErrNotHere) {
			t.Errorf("%v: %v", c.files, r.err)
		}
	}
}

// Past MaxPackObjects new objects the import says git must import.
func TestImportPackObjectsBound(t *testing.T) {
	s := newStore()
	base := s.tree()
	dir := layer(t, map[string]string{"f": "new"})
	for _, fill := range []int{MaxPackObjects - 3, MaxPackObjects - 2} { // blob, tree, commit
		r := runImport(t, context.Background(), s, base, dir, fill)
		if ok := fill == MaxPackObjects-3; ok != (r.err == nil) || !ok && !errors.Is(r.err, ErrNotHere) {
			t.Errorf("fill %d: %v", fill, r.err)
		}
	}
}

// cancelSink cancels the import's context at its first put.
type cancelSink struct {
	Sink
	cancel func()
}

func (s cancelSink) Put(p string, mode uint32, size int64, body io.ReaderAt) error {
	s.cancel()
	return s.Sink.Put(p, mode, size, body)
}

// The import ends when its context does: before it reads the baseline,
// and between the layer's changes (the fence's deadline).
func TestImportContextDone(t *testing.T) {
	s := newStore()
	base := s.tree(ent{"40000", "d", s.tree(ent{"100644", "x", s.blob("x")})})
	dir := layer(t, map[string]string{"a": "a", "d/y": "y"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r := runImport(t, ctx, s, base, dir, 0); !errors.Is(r.err, context.Canceled) {
		t.Errorf("canceled: %v", r.err)
	}
	ctx, cancel = context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	if r := runImport(t, ctx, s, base, dir, 0); !errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("past its deadline: %v", r.err)
	}

	// canceled mid-walk: the put that cancels, and what follows, fail
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	f, err := os.CreateTemp(t.TempDir(), "pack")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := NewImport(ctx, s, gitformat.NewPackStream(f, 40))
	w := NewWalk(cancelSink{m, cancel}, 1<<20, Defaults(), false, nil)
	c := testCommit
	c.BaseTree = base
	if _, err := m.Run(openDir(t, dir), c, w); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled mid-walk: %v", err)
	}
}

// A file shorter than the walk said (truncated while read) fails its put.
func TestImportShortBlob(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "pack")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := NewImport(context.Background(), emptyStore{}, gitformat.NewPackStream(f, 40))
	for _, size := range []int64{5, SmallBlob + 1} {
		if _, err := m.blob(size, strings.NewReader("ab")); err == nil || !strings.Contains(err.Error(), "read") {
			t.Errorf("size %d: %v", size, err)
		}
	}
}

// Past MaxDescribed changes, or maxDescribedBytes of their paths,
// diff-tree describes the layer.
func TestImportDescribedBounds(t *testing.T) {
	e := treeEntry{mode: 0o100644, id: strings.Repeat("x", 20)}
	for _, c := range []struct {
		n    int
		path string
	}{{MaxDescribed, "f"}, {MaxDescribed + 1, "f"}, {2, strings.Repeat("p", maxDescribedBytes)}} {
		m := NewImport(context.Background(), emptyStore{}, nil)
		for i := 0; i < c.n; i++ {
			m.describe(fmt.Sprintf("%s%d", c.path, i), false, false, treeEntry{}, e)
		}
		changes, ok := m.Changes()
		if want := c.n == MaxDescribed; ok != want || ok && len(changes) != c.n || !ok && changes != nil {
			t.Errorf("%d changes of %d bytes: %v, %d", c.n, len(c.path), ok, len(changes))
		}
	}
}

// The trees the import made (Trees) are listed once each, at most
// MaxPackObjects, whatever the count of directories: 130 directories of
// 131 of the same bytes (one file each) make three trees, 17,161 times,
// and held every one (some 80 bytes each; a million directories were 80
// MiB of PID 1's); a tree the store has is listed each time, up to
// MaxPackObjects.
func TestImportTreesBound(t *testing.T) {
	s := newStore()
	dir := t.TempDir()
	for i := range 130 {
		for j := range 131 {
			d := filepath.Join(dir, fmt.Sprintf("a%03d", i), fmt.Sprintf("b%03d", j))
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "f"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := runImport(t, context.Background(), s, s.tree(), dir, 0)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if n := len(r.m.Trees()); n != 3 {
		t.Errorf("%d trees listed, want 3", n)
	}
	// the directories' tree in the store's packs already: listed each
	// time it is made, up to the bound
	s = newStore()
	s.tree(ent{"100644", "f", s.blob("x")})
	r = runImport(t, context.Background(), s, s.tree(), dir, 0)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if n := len(r.m.Trees()); n != MaxPackObjects {
		t.Errorf("%d trees listed, want %d", n, MaxPackObjects)
	}
}
