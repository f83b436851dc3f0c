package gitguard

// Shim's import of a layer snapshot: the walk's typed changes applied to
// the baseline's trees, read from the store shim already reads, and the
// new objects (the layer's blobs as the walk reads them, the changed
// trees as the walk leaves them, the commit) streamed into one pack
// (gitformat.PackStream), then the ref. Nothing is written only to be
// parsed back; what it holds is the trees of the directories the walk is
// in and where each new object is in the pack, whatever the layer's
// bytes. What it does not take (errNotHere) is git fast-import's
// (importByGit): a ref that exists, a store it does not read alone, a
// baseline tree of a shape git would not write or past its bounds, a
// layer of more objects than it keeps the index of. Its commits are byte
// for byte fast-import's (the tests import the same layers with both).

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/shimdev/shim/internal/gitformat"
)

// errNotHere: the import needs git fast-import.
var errNotHere = errors.New("the import needs git fast-import")

// The import's bounds: a tree it reads is at most treeReadMax bytes (its
// delta bases too), and all it inflates to read them at most
// treeInflateMax (a store that makes reading its trees cost more, a
// harness's pack holding them as deltas of a huge base, is fast-import's,
// under git's deadline). The directories the walk is in hold at most
// maxHeldEntries tree entries (the baseline's and the layer's, some 150
// bytes each), the pack at most maxPackObjects objects (an index entry
// and a name each, some 150 bytes), and the description at most
// maxDescribed changes of maxDescribedBytes of paths (past either,
// diff-tree describes the layer): some 9 MiB at worst, whatever the
// checkout's size and the layer's shape, so that shim's peak RSS during a
// fence stays within 2x its idle RSS (issue 27). A file's bytes are read
// smallBlob at a time, never held whole.
const (
	treeReadMax       = 2 << 20
	treeInflateMax    = 256 << 20
	maxHeldEntries    = 1 << 15
	maxPackObjects    = 1 << 14
	maxDescribed      = 1 << 12
	maxDescribedBytes = 1 << 20
	smallBlob         = 64 << 10
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

// treeImport is one import: a layerSink.
type treeImport struct {
	ctx     context.Context
	s       *objectStore
	pack    *gitformat.PackStream
	written map[string]bool // raw names in the pack
	dirs    []*importDir    // the walk's, the top first
	held    int             // tree entries dirs hold (of maxHeldEntries)
	buf     []byte          // a small blob's bytes
	trees   []string        // the trees it made (whole: learnWhole)
	// changes: the layer's changes against the baseline, in diff-tree's
	// terms, while described (the layer's shape is one they describe
	// alone, and fewer than maxDescribed).
	changes   []PathChange
	pathBytes int // of changes
	described bool
}

// importInShim imports the layer open at ufd as commit c, writes its
// pack and ref, and reports whether the changes it put in rep describe
// the layer. errNotHere: nothing git would see was written.
func (g *Guard) importInShim(ctx context.Context, ufd int, c snapshotCommit, rep *Report) (string, bool, error) {
	if !g.noRef(c.ref) || !strings.HasPrefix(c.ref, RefPrefix) {
		return "", false, fmt.Errorf("%w: ref %s exists or is not a snapshot's", errNotHere, c.ref)
	}
	s, ok := openObjectStore(g.gitDir, len(c.baseTree))
	if !ok {
		return "", false, fmt.Errorf("%w: an object store shim does not read alone", errNotHere)
	}
	defer s.close()
	s.budget = treeInflateMax
	for _, p := range c.parents {
		if len(p) != s.hexLen || s.typeOf(p) != gitformat.Commit {
			return "", false, fmt.Errorf("%w: a parent that is not a commit of the store: %s", errNotHere, p)
		}
	}
	np, err := s.newPack("_snapshot")
	if err != nil {
		return "", false, fmt.Errorf("%w: the pack: %v", errNotHere, err)
	}
	m := &treeImport{ctx: ctx, s: s, pack: gitformat.NewPackStream(np.f, s.hexLen), written: map[string]bool{},
		buf: make([]byte, smallBlob), described: true}
	commit, err := m.run(ufd, c, newLayerWalk(rep, g.maxFile, m, false))
	if err != nil {
		np.abandon()
		return "", false, err
	}
	// What shim cannot write (a full disk, a name taken) git tries too:
	// a pack written before the ref is only objects no ref names yet.
	if err := m.install(np); err != nil {
		return "", false, fmt.Errorf("%w: the pack: %v", errNotHere, err)
	}
	if err := g.writeRef(c.ref, commit); err != nil {
		return "", false, fmt.Errorf("%w: the ref: %v", errNotHere, err)
	}
	g.learnWhole(m.trees)
	if m.described {
		m.report(rep)
	}
	return commit, m.described, nil
}

// run walks the layer with w into the baseline's trees and returns the
// commit's name.
func (m *treeImport) run(ufd int, c snapshotCommit, w *layerWalk) (string, error) {
	rawTree, err := hex.DecodeString(c.baseTree)
	if err != nil {
		return "", fmt.Errorf("%w: the baseline's tree %q", errNotHere, c.baseTree)
	}
	base, err := m.load(string(rawTree))
	if err != nil {
		return "", err
	}
	m.dirs = []*importDir{{base: base, set: map[string]treeEntry{}}}
	if err := w.walk(ufd); err != nil {
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
	for _, p := range c.parents {
		fmt.Fprintf(&b, "parent %s\n", p)
	}
	fmt.Fprintf(&b, "author %s\ncommitter %s\n\n%s", c.ident(), c.ident(), c.msg)
	id, err := m.object(gitformat.Commit, []byte(b.String()))
	return hex.EncodeToString([]byte(id)), err
}

// install ends the pack and puts it in the store (abandoned when it
// holds nothing new, or fails).
func (m *treeImport) install(np *newPack) error {
	if m.pack.Count() == 0 {
		np.abandon()
		return nil
	}
	entries, sum, err := m.pack.Finish()
	if err != nil {
		np.abandon()
		return err
	}
	return np.install(entries, sum)
}

func (m *treeImport) top() *importDir { return m.dirs[len(m.dirs)-1] }

// leafName is the last component of path p.
func leafName(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }

func (m *treeImport) enter(p string, opaque bool) error {
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

func (m *treeImport) leave() error {
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

func (m *treeImport) put(p string, mode uint32, size int64, body io.ReaderAt) error {
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

func (m *treeImport) remove(p string) error {
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

// hold counts n more tree entries held against maxHeldEntries.
func (m *treeImport) hold(n int) error {
	if m.held += n; m.held > maxHeldEntries {
		return fmt.Errorf("%w: trees of more than %d entries", errNotHere, maxHeldEntries)
	}
	return nil
}
