package snapshot

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitformat"
)

const parent = "1111111111111111111111111111111111111111"

var testCommit = Commit{Ref: "refs/shim/snap", Msg: "snapshot\n", Parents: []string{parent}, Now: 1700000000}

// commitID is the name git gives the commit of tree over testCommit.
func commitID(tree string) string {
	id := "shim <shim@localhost> 1700000000 +0000"
	return gitID("commit", []byte(fmt.Sprintf("tree %s\nparent %s\nauthor %s\ncommitter %s\n\nsnapshot\n", tree, parent, id, id)))
}

// imported is what an import made.
type imported struct {
	commit  string
	m       *Import
	objects []string // hex names in the pack, sorted
	err     error
}

// runImport imports the layer at dir (with markSink's whiteouts and
// opaque directories) onto tree base of s, into a fresh pack.
func runImport(t *testing.T, ctx context.Context, s Store, base, dir string, fill int) imported {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "pack")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pack := gitformat.NewPackStream(f, 40)
	for i := 0; i < fill; i++ {
		if _, err := pack.Add(gitformat.Blob, 1, strings.NewReader("z")); err != nil {
			t.Fatal(err)
		}
	}
	m := NewImport(ctx, s, pack)
	c := testCommit
	c.BaseTree = base
	w := NewWalk(markSink{m}, 1<<20, Defaults(), false, func(api.NotStoredFile) {})
	id, err := m.Run(openDir(t, dir), c, w)
	r := imported{commit: id, m: m, err: err}
	if err != nil {
		return r
	}
	entries, _, err := pack.Finish()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		r.objects = append(r.objects, hex.EncodeToString(e.Name))
	}
	sort.Strings(r.objects)
	return r
}

// An import of a layer of every kind of change: its commit, trees and
// new objects are git's, byte for byte.
func TestImportLayer(t *testing.T) {
	s := newStore()
	base := s.tree(
		ent{"100644", "README", s.blob("hi")},
		ent{"40000", "src", s.tree(ent{"100644", "main.go", s.blob("m")}, ent{"100644", "util.go", s.blob("u")})},
		ent{"100644", "old", s.blob("o")},
		ent{"40000", "dir2file", s.tree(ent{"100644", "x", s.blob("x")})},
		ent{"100644", "file2dir", s.blob("f")},
		ent{"40000", "opq", s.tree(ent{"100644", "keep", s.blob("k")})},
		ent{"40000", "solo", s.tree(ent{"100644", "only", s.blob("only")})},
		ent{"40000", "wiped", s.tree(ent{"100644", "w", s.blob("w")})},
	)
	dir := layer(t, map[string]string{
		"README":         "hello",
		"src/util.go.wh": "",
		"src/main.go":    "m",
		"old.wh":         "",
		"dir2file":       "now a file",
		"file2dir/inner": "i",
		"opq.opq/new":    "n",
		"wiped.opq/":     "",
		"link":           "->README",
		"new/deep/f":     "+x f",
		"emptydir/":      "",
		"solo/only.wh":   "",
	})
	r := runImport(t, context.Background(), s, base, dir, 0)
	if r.err != nil {
		t.Fatal(r.err)
	}
	deep := treeID(ent{"100755", "f", blobID("f")})
	trees := map[string]string{
		"file2dir": treeID(ent{"100644", "inner", blobID("i")}),
		"new":      treeID(ent{"40000", "deep", deep}),
		"opq":      treeID(ent{"100644", "new", blobID("n")}),
		"src":      treeID(ent{"100644", "main.go", blobID("m")}),
	}
	root := treeID(
		ent{"100644", "README", blobID("hello")},
		ent{"100644", "dir2file", blobID("now a file")},
		ent{"40000", "file2dir", trees["file2dir"]},
		ent{"120000", "link", blobID("README")},
		ent{"40000", "new", trees["new"]},
		ent{"40000", "opq", trees["opq"]},
		ent{"40000", "src", trees["src"]},
	)
	if want := commitID(root); r.commit != want {
		t.Errorf("commit %s, want %s", r.commit, want)
	}
	want := []string{commitID(root), root, deep, blobID("hello"), blobID("now a file"), blobID("i"),
		blobID("README"), blobID("n")} // blob "f" the store has: not written again
	for _, id := range trees {
		want = append(want, id)
	}
	sort.Strings(want)
	if !reflect.DeepEqual(r.objects, want) {
		t.Errorf("pack objects\n%q\nwant\n%q", r.objects, want)
	}
	if len(r.m.Trees()) != 6 {
		t.Errorf("trees %q", r.m.Trees())
	}
	if _, ok := r.m.Changes(); ok {
		t.Error("an opaque directory's changes described alone")
	}
}

// A layer of files alone is described in diff-tree's terms, by path.
func TestImportChanges(t *testing.T) {
	s := newStore()
	base := s.tree(
		ent{"100644", "mod", s.blob("1")},
		ent{"100644", "same", s.blob("s")},
		ent{"100644", "tolink", s.blob("t")},
		ent{"100644", "gone", s.blob("g")},
		ent{"100644", "exec", s.blob("e")},
		ent{"40000", "d", s.tree(ent{"100644", "in", s.blob("in")})},
	)
	dir := layer(t, map[string]string{
		"mod": "2", "same": "s", "tolink": "->same", "gone.wh": "", "exec": "+x e",
		"add": "a", "nothere.wh": "", "d/in": "in2",
	})
	r := runImport(t, context.Background(), s, base, dir, 0)
	if r.err != nil {
		t.Fatal(r.err)
	}
	got, ok := r.m.Changes()
	want := []api.PathChange{{Path: "add", Change: "added"}, {Path: "d/in", Change: "modified"},
		{Path: "exec", Change: "modified"}, {Path: "gone", Change: "deleted"},
		{Path: "mod", Change: "modified"}, {Path: "tolink", Change: "type_changed"}}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("changes %v %+v\nwant %+v", ok, got, want)
	}
	root := treeID(
		ent{"100644", "add", blobID("a")},
		ent{"40000", "d", treeID(ent{"100644", "in", blobID("in2")})},
		ent{"100755", "exec", blobID("e")},
		ent{"100644", "mod", blobID("2")},
		ent{"100644", "same", blobID("s")},
		ent{"120000", "tolink", blobID("same")},
	)
	if r.commit != commitID(root) {
		t.Errorf("commit %s, want %s", r.commit, commitID(root))
	}
}

// An empty layer (or one of empty directories) commits the baseline's
// tree, writing nothing but the commit; an empty baseline stays empty.
func TestImportNothingChanged(t *testing.T) {
	s := newStore()
	base := s.tree(ent{"100644", "a", s.blob("a")})
	empty := s.tree()
	for _, b := range []string{base, empty} {
		r := runImport(t, context.Background(), s, b, layer(t, map[string]string{"e/f/": "", "a": "a"}), 0)
		if b == empty {
			r = runImport(t, context.Background(), s, b, layer(t, map[string]string{"e/": ""}), 0)
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.commit != commitID(b) || !reflect.DeepEqual(r.objects, []string{commitID(b)}) {
			t.Errorf("commit %s, objects %q; want %s", r.commit, r.objects, commitID(b))
		}
	}
	// an empty baseline not in the store: the whole layer is deleted
	s2 := newStore()
	r := runImport(t, context.Background(), s2, s.tree(), layer(t, map[string]string{}), 0)
	if r.err == nil || !errors.Is(r.err, ErrNotHere) {
		t.Errorf("a baseline not in the store: %v", r.err)
	}
}
