package snapshot

// The trees and objects of the import (Import): a baseline tree
// read, a directory's tree written, a blob written as it is read, and the
// changes described in diff-tree's terms.

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"sort"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitformat"
)

// treeModes are the modes git writes in a tree: only those are read (git
// fast-import reads others its own way: 16 bits, 0 as a deleted entry).
var treeModes = map[string]uint32{"40000": 0o040000, "100644": 0o100644, "100755": 0o100755, "120000": 0o120000, "160000": 0o160000}

func validName(n string) bool {
	return n != "" && n != "." && n != ".." && !bytes.ContainsRune([]byte(n), '/')
}

// load reads the entries of tree id (raw), counted against
// MaxHeldEntries; ErrNotHere for a tree the store does not give within
// its bounds, or one git would not write.
func (m *Import) load(id string) (map[string]treeEntry, error) {
	if err := m.ctx.Err(); err != nil {
		return nil, err
	}
	hexID := hex.EncodeToString([]byte(id))
	typ, b, err := m.s.Read(hexID, TreeReadMax)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotHere, err)
	}
	if typ != gitformat.Tree {
		return nil, fmt.Errorf("%w: %s is not a tree", ErrNotHere, hexID)
	}
	n := 0 // its entries, counted before any is held
	if !gitformat.ReadTree(b, m.s.HexLen()/2, func(_, _, _ []byte) bool { n++; return true }) {
		return nil, fmt.Errorf("%w: tree %s is malformed", ErrNotHere, hexID)
	}
	if err := m.hold(n); err != nil {
		return nil, err
	}
	entries := make(map[string]treeEntry, n)
	if !gitformat.ReadTree(b, m.s.HexLen()/2, func(mode, name, id []byte) bool {
		md, ok := treeModes[string(mode)]
		if _, dup := entries[string(name)]; !ok || dup || !validName(string(name)) {
			return false
		}
		entries[string(name)] = treeEntry{mode: md, id: string(id)}
		return true
	}) {
		return nil, fmt.Errorf("%w: tree %s has an entry git would not write", ErrNotHere, hexID)
	}
	return entries, nil
}

// finish makes the tree of directory d as the layer left it, releasing
// what d held: its raw name (written unless the pack or the store has
// it), whether it is empty (then not written, unless keepEmpty), and
// whether it changed at all (the baseline's, or nothing, otherwise).
func (m *Import) finish(d *importDir, keepEmpty bool) (id string, empty, changed bool, err error) {
	m.held -= len(d.base) + len(d.set)
	if len(d.set) == 0 && d.base != nil {
		return "", false, false, nil
	}
	type named struct {
		key, name string // key: git's order, a directory's name with a slash after it
		e         treeEntry
	}
	var es []named
	add := func(name string, e treeEntry) {
		key := name
		if isTreeMode(e.mode) {
			key += "/"
		}
		es = append(es, named{key, name, e})
	}
	for name, e := range d.base {
		if _, ok := d.set[name]; !ok {
			add(name, e)
		}
	}
	for name, e := range d.set {
		if e.mode != 0 {
			add(name, e)
		}
	}
	if len(es) == 0 && !keepEmpty {
		return "", true, true, nil
	}
	sort.Slice(es, func(i, j int) bool { return es[i].key < es[j].key })
	var b bytes.Buffer
	for _, x := range es {
		fmt.Fprintf(&b, "%o %s\x00%s", x.e.mode, x.name, x.e.id)
	}
	count := m.pack.Count()
	id, err = m.object(gitformat.Tree, b.Bytes())
	// Listed once, and at most MaxPackObjects: a layer of a million
	// directories of the same bytes makes one tree a million times.
	if err == nil && (m.pack.Count() > count || !m.written[id]) && len(m.trees) < MaxPackObjects {
		m.trees = append(m.trees, hex.EncodeToString([]byte(id)))
	}
	return id, len(es) == 0, true, err
}

// object writes an object of type typ and bytes data into the pack
// unless the pack or a pack of the store has it (as fast-import: a loose
// file of that name may be empty or corrupt, git did not sync it), and
// returns its raw name.
func (m *Import) object(typ int, data []byte) (string, error) {
	h := gitformat.NewHash(m.s.HexLen())
	fmt.Fprintf(h, "%s %d\x00", gitformat.TypeName(typ), len(data))
	h.Write(data)
	id := string(h.Sum(nil))
	return id, m.write(id, typ, int64(len(data)), bytes.NewReader(data))
}

// blob writes the size bytes of body as a blob, as object does: read
// once into the buffer when they fit, else hashed as they are read, then
// read again into the pack (and named again: bytes that changed between
// the reads are an error).
func (m *Import) blob(size int64, body io.ReaderAt) (string, error) {
	if size <= int64(len(m.buf)) {
		b := m.buf[:size]
		if n, err := body.ReadAt(b, 0); n != len(b) {
			return "", fmt.Errorf("read %d of %d bytes: %v", n, size, err)
		}
		return m.object(gitformat.Blob, b)
	}
	h := gitformat.NewHash(m.s.HexLen())
	fmt.Fprintf(h, "blob %d\x00", size)
	if n, err := io.CopyBuffer(h, io.NewSectionReader(body, 0, size), m.buf); n != size {
		return "", fmt.Errorf("read %d of %d bytes: %v", n, size, err)
	}
	id := string(h.Sum(nil))
	return id, m.write(id, gitformat.Blob, size, io.NewSectionReader(body, 0, size))
}

// write adds object id (raw), of type typ and size bytes read from body,
// to the pack unless it is there or in the store's packs.
func (m *Import) write(id string, typ int, size int64, body io.Reader) error {
	if m.written[id] || m.s.HasPacked(hex.EncodeToString([]byte(id))) {
		return nil
	}
	if m.pack.Count() >= MaxPackObjects {
		return fmt.Errorf("%w: more than %d objects", ErrNotHere, MaxPackObjects)
	}
	name, err := m.pack.Add(typ, size, body)
	if err != nil {
		return fmt.Errorf("%w: the pack: %v", ErrNotHere, err)
	}
	if string(name) != id {
		return fmt.Errorf("%x changed while it was read", id)
	}
	m.written[id] = true
	return nil
}

// describe records the change at p (a put e, or a whiteout: remove)
// against what the baseline had there (old, when had), in diff-tree's
// terms, while the changes describe the layer alone.
func (m *Import) describe(p string, remove, had bool, old, e treeEntry) {
	if !m.described {
		return
	}
	var kind string
	switch {
	case had && isTreeMode(old.mode):
		m.described, m.changes = false, nil // diff-tree lists what of the directory went
		return
	case remove:
		if !had {
			return
		}
		kind = "deleted"
	case !had:
		kind = "added"
	case old.mode == 0o160000 || (old.mode == 0o120000) != (e.mode == 0o120000):
		kind = "type_changed"
	case old != e:
		kind = "modified"
	default:
		return
	}
	if m.pathBytes += len(p); len(m.changes) >= MaxDescribed || m.pathBytes > maxDescribedBytes {
		m.described, m.changes = false, nil
		return
	}
	m.changes = append(m.changes, api.PathChange{Path: p, Change: kind})
}
