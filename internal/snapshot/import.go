package snapshot

// Shim's import of a layer snapshot: the walk's typed changes applied to
// the baseline's trees, read from the repository's store, and the new
// objects (the layer's blobs as the walk reads them, the changed trees as
// the walk leaves them, the commit) streamed into one pack
// (gitformat.PackStream). Nothing is written only to be parsed back; what
// it holds is the trees of the directories the walk is in and where each
// new object is in the pack, whatever the layer's bytes. What it does not
// take (ErrNotHere) is git fast-import's (Stream): a baseline tree of a
// shape git would not write or past its bounds, a layer of more objects
// than it keeps the index of. Its commits are byte for byte fast-import's
// (gitguard's tests import the same layers with both).

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitformat"
)

// ErrNotHere: the import needs git fast-import.
var ErrNotHere = errors.New("the import needs git fast-import")

// A Store is the repository's objects as the import reads them.
type Store interface {
	// HexLen is the length of its object names in hex: 40 (SHA-1) or
	// 64 (SHA-256).
	HexLen() int
	// Read returns the type and bytes of object id (hex), at most max
	// bytes, within the store's budget.
	Read(id string, max int64) (int, []byte, error)
	// HasPacked reports whether a pack of the store has object id (hex).
	HasPacked(id string) bool
}

// The import's bounds: a tree it reads is at most TreeReadMax bytes (its
// delta bases too), and all it inflates to read them at most
// TreeInflateMax (a store that makes reading its trees cost more, a
// harness's pack holding them as deltas of a huge base, is fast-import's,
// under git's deadline). The directories the walk is in hold at most
// MaxHeldEntries tree entries (the baseline's and the layer's, some 150
// bytes each), the pack at most MaxPackObjects objects (an index entry
// and a name each, some 150 bytes), and the description at most
// MaxDescribed changes of maxDescribedBytes of paths (past either,
// diff-tree describes the layer): some 9 MiB at worst, whatever the
// checkout's size and the layer's shape, so that shim's peak RSS during a
// fence stays within 2x its idle RSS (issue 27). A file's bytes are read
// SmallBlob at a time, never held whole.
const (
	TreeReadMax       = 2 << 20
	TreeInflateMax    = 256 << 20
	MaxHeldEntries    = 1 << 15
	MaxPackObjects    = 1 << 14
	MaxDescribed      = 1 << 12
	maxDescribedBytes = 1 << 20
	SmallBlob         = 64 << 10
)

// A treeEntry is an entry of a tree: its mode (0: deleted) and its raw
// object name.
type treeEntry struct {
	mode uint32
	id   string
}

func isTreeMode(mode uint32) bool { return mode&0o170000 == 0o040000 }

// An importDir is a directory the walk is in: the baseline's entries
// there and what the layer changed.
type importDir struct {
	name string
	base map[string]treeEntry // nil: the baseline has no tree there (or an opaque directory hides it)
	set  map[string]treeEntry // the layer's: mode 0 deleted
	// removes: an entry of the baseline's was deleted here, or the
	// directory is opaque: emptied, it goes from its parent (as
	// fast-import removes a directory its D leaves empty).
	removes bool
}

// An Import is one import: a Sink.
type Import struct {
	ctx     context.Context
	s       Store
	pack    *gitformat.PackStream
	written map[string]bool // raw names in the pack
	dirs    []*importDir    // the walk's, the top first
	held    int             // tree entries dirs hold (of MaxHeldEntries)
	buf     []byte          // a small blob's bytes
	trees   []string        // the trees it made (Trees)
	// changes: the layer's changes against the baseline, in diff-tree's
	// terms, while described (the layer's shape is one they describe
	// alone, and fewer than MaxDescribed).
	changes   []api.PathChange
	pathBytes int // of changes
	described bool
}

// NewImport is an import that reads the baseline's trees from s and
// writes what it makes into pack, until ctx is done.
func NewImport(ctx context.Context, s Store, pack *gitformat.PackStream) *Import {
	return &Import{ctx: ctx, s: s, pack: pack, written: map[string]bool{}, buf: make([]byte, SmallBlob), described: true}
}

// Run walks the layer open at ufd with w (whose sink is m) into the
// baseline's trees and returns the commit's name (hex).
func (m *Import) Run(ufd int, c Commit, w *Walk) (string, error) {
	rawTree, err := hex.DecodeString(c.BaseTree)
	if err != nil {
		return "", fmt.Errorf("%w: the baseline's tree %q", ErrNotHere, c.BaseTree)
	}
	base, err := m.load(string(rawTree))
	if err != nil {
		return "", err
	}
	m.dirs = []*importDir{{base: base, set: map[string]treeEntry{}}}
	if err := w.Run(ufd); err != nil {
		return "", err
	}
	tree, _, changed, err := m.finish(m.dirs[0], true)
	if err != nil {
		return "", err
	}
	if !changed {
		tree = string(rawTree)
	}
	// fast-import's commit: no author given is the committer
	var b strings.Builder
	fmt.Fprintf(&b, "tree %x\n", tree)
	for _, p := range c.Parents {
		fmt.Fprintf(&b, "parent %s\n", p)
	}
	fmt.Fprintf(&b, "author %s\ncommitter %s\n\n%s", c.ident(), c.ident(), c.Msg)
	id, err := m.object(gitformat.Commit, []byte(b.String()))
	return hex.EncodeToString([]byte(id)), err
}

// Trees are the trees the import made (hex names): whole, every object
// below them in the store once the pack is.
func (m *Import) Trees() []string { return m.trees }

// Changes are the layer's changes against the baseline, in diff-tree's
// terms and order (by path, bytewise); ok false when they do not describe
// the layer alone (an opaque directory, a directory deleted or put where a
// file was, more than MaxDescribed changes): diff-tree describes it then.
func (m *Import) Changes() (changes []api.PathChange, ok bool) {
	sort.Slice(m.changes, func(i, j int) bool { return m.changes[i].Path < m.changes[j].Path })
	return m.changes, m.described
}

func (m *Import) top() *importDir { return m.dirs[len(m.dirs)-1] }

// leafName is the last component of path p.
func leafName(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }

// Enter (the Sink's) loads the baseline's tree at p, unless the
// directory is opaque or the baseline has none there.
func (m *Import) Enter(p string, opaque bool) error {
	if err := m.ctx.Err(); err != nil {
		return err
	}
	d := &importDir{name: leafName(p), set: map[string]treeEntry{}}
	e, had := m.top().base[d.name]
	switch {
	case opaque:
		d.removes = true
		m.described = false // diff-tree tells what of the baseline's went
	case had && isTreeMode(e.mode):
		base, err := m.load(e.id)
		if err != nil {
			return err
		}
		d.base = base
	case had:
		m.described = false // a directory where the baseline has a file: its deletion is implicit
	}
	m.dirs = append(m.dirs, d)
	return nil
}

// Leave (the Sink's) writes the tree of the directory the walk leaves
// when it changed, into its parent's entries: gone when the layer emptied
// it, as it was when the layer put nothing there.
func (m *Import) Leave() error {
	d := m.top()
	m.dirs = m.dirs[:len(m.dirs)-1]
	parent := m.top()
	id, empty, changed, err := m.finish(d, false)
	_, had := parent.base[d.name]
	switch {
	case err != nil:
		return err
	case empty && d.removes && had:
		parent.set[d.name] = treeEntry{}
		parent.removes = true
	case empty || !changed:
		// nothing put there, or the baseline's as it was: the parent's
		// entry stands
		return nil
	default:
		parent.set[d.name] = treeEntry{mode: 0o040000, id: id}
	}
	return m.hold(1)
}

// Put (the Sink's) writes the blob and puts it in its directory's entries.
func (m *Import) Put(p string, mode uint32, size int64, body io.ReaderAt) error {
	if err := m.ctx.Err(); err != nil {
		return err
	}
	id, err := m.blob(size, body)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	d, e := m.top(), treeEntry{mode: mode, id: id}
	old, had := d.base[leafName(p)]
	m.describe(p, false, had, old, e)
	if had && old == e {
		return nil
	}
	d.set[leafName(p)] = e
	return m.hold(1)
}

// Remove (the Sink's) deletes the baseline's entry at p, if any.
func (m *Import) Remove(p string) error {
	d := m.top()
	old, had := d.base[leafName(p)]
	m.describe(p, true, had, old, treeEntry{})
	if !had {
		return nil
	}
	d.set[leafName(p)] = treeEntry{}
	d.removes = true
	return m.hold(1)
}

// hold counts n more tree entries held against MaxHeldEntries.
func (m *Import) hold(n int) error {
	if m.held += n; m.held > MaxHeldEntries {
		return fmt.Errorf("%w: trees of more than %d entries", ErrNotHere, MaxHeldEntries)
	}
	return nil
}
