package gitguard

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/shimdev/shim/internal/gitformat"
)

// A layer snapshot's import runs in shim when it can: the stream
// importLayer writes for git fast-import (a commit on the baseline's tree,
// its files inline, deletions, and an ls before each change) is read by
// memImport instead, which writes the new objects as one pack, and the
// ref. git fast-import is a process to start, and in a container whose
// root is fuse-overlayfs that start (its binary and libraries read
// through the FUSE daemon) was most of a fence's 30-45 ms import.
//
// memImport takes only that stream's shape and what it can read alone
// (the store's packs and loose objects, no alternates, a ref that does not
// exist yet); anything else is errNotHere, and git fast-import imports the
// layer as before. Its commits are byte for byte fast-import's (the tests
// import the same streams with both).

// errNotHere: the import needs git fast-import.
var errNotHere = errors.New("the import needs git fast-import")

// memImportMax bounds the stream memImport holds (the layer's files are
// in it): a larger layer is fast-import's, which streams it. A tree it
// reads is at most memTreeMax bytes (its delta bases too), and all it
// inflates to read them at most memInflateMax: a store that makes reading
// its trees cost more (a harness's pack can hold them as deltas of a huge
// base) is fast-import's, under git's deadline.
//
// What memImport holds grows with the paths of the stream more than with
// its bytes: some 1 KiB of heap a path at its peak (a tree entry in a
// map, the ls's answer, the walk's ask, a new object's name; measured:
// 34 MiB for 32,700 files, in one directory or a thousand a directory).
// A stream of at most memImportMaxPaths paths (the walk's ls), whose
// trees hold at most memImportMaxEntries entries in all (the baseline's
// trees it loads, some 200 bytes each, and what the layer adds), keeps
// it to some 10 MiB whatever the layer's shape or the checkout's size:
// shim's peak RSS during a fence within 2x its idle RSS (issue 27). A
// larger one is fast-import's, in a process of its own
// (maxFastImportScans).
const (
	memImportMax        = 4 << 20
	memTreeMax          = 2 << 20
	memInflateMax       = 256 << 20
	memImportMaxPaths   = 1 << 12
	memImportMaxEntries = 1 << 14
)

// A limitedBuffer is a bytes.Buffer that refuses to grow past max.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, fmt.Errorf("%w: a stream of more than %d bytes", errNotHere, b.max)
	}
	return b.Buffer.Write(p)
}

// A memTree is a directory of the import: loaded from its object when
// first entered, its id cleared when it changes.
type memTree struct {
	id      string               // its object name; "" once changed
	entries map[string]*memEntry // nil until loaded
}

type memEntry struct {
	mode uint32
	id   string   // a blob's or a gitlink's, or a directory's as loaded
	tree *memTree // a directory's, once entered
}

func isTreeMode(mode uint32) bool { return mode&0o170000 == 0o040000 }

// memImport is one import: the store it reads and writes, the root, and
// the new objects (each once).
type memImport struct {
	ctx     context.Context // the fence's: its deadline
	s       *objectStore
	root    *memTree
	objs    []looseObject
	seen    map[string]bool
	entries int      // tree entries held (of memImportMaxEntries)
	trees   []string // the trees it wrote (whole: learnWhole)
}

// importHere imports stream, importLayer's, whose commit is ref's, and
// returns fast-import's answers (one line per ls, then the commit's
// name), having written the objects and the ref. errNotHere: nothing was
// written that git would see.
func (g *Guard) importHere(ctx context.Context, stream []byte, ref string, hexLen int) ([]string, error) {
	if !g.noRef(ref) || !strings.HasPrefix(ref, RefPrefix) {
		return nil, fmt.Errorf("%w: ref %s exists or is not a snapshot's", errNotHere, ref)
	}
	s, ok := openObjectStore(g.gitDir, hexLen)
	if !ok {
		return nil, fmt.Errorf("%w: an object store shim does not read alone", errNotHere)
	}
	defer s.close()
	s.budget = memInflateMax
	m := &memImport{ctx: ctx, s: s, seen: map[string]bool{}}
	answers, commit, err := m.parse(stream, ref)
	if err != nil {
		return nil, err
	}
	// What shim cannot write (a full disk, a name taken) git tries too:
	// a pack written before the ref is only objects no ref names yet.
	if len(m.objs) > 0 {
		if err := s.addPack(-1, m.objs); err != nil {
			return nil, fmt.Errorf("%w: the pack: %v", errNotHere, err)
		}
	}
	if err := g.writeRef(ref, commit); err != nil {
		return nil, fmt.Errorf("%w: the ref: %v", errNotHere, err)
	}
	g.learnWhole(m.trees)
	return append(answers, commit), nil
}

// parse reads the stream: the commit's header, then file commands up to
// the blank line, then get-mark and done.
func (m *memImport) parse(b []byte, ref string) (answers []string, commit string, err error) {
	bad := func(what string) error { return fmt.Errorf("%w: %s", errNotHere, what) }
	line := func() (string, bool) {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return "", false
		}
		l := string(b[:i])
		b = b[i+1:]
		return l, true
	}
	data := func() ([]byte, error) {
		l, ok := line()
		n, err := strconv.Atoi(strings.TrimPrefix(l, "data "))
		if !ok || !strings.HasPrefix(l, "data ") || err != nil || n < 0 || n > len(b) {
			return nil, bad("a data command")
		}
		d := b[:n]
		b = b[n:]
		if len(b) > 0 && b[0] == '\n' {
			b = b[1:]
		}
		return d, nil
	}
	expect := func(want string) error {
		if l, ok := line(); !ok || l != want {
			return bad("expected " + want)
		}
		return nil
	}
	if err := expect("commit " + ref); err != nil {
		return nil, "", err
	}
	if err := expect("mark :1"); err != nil {
		return nil, "", err
	}
	l, _ := line()
	ident, ok := strings.CutPrefix(l, "committer ")
	if !ok {
		return nil, "", bad("no committer")
	}
	msg, err := data()
	if err != nil {
		return nil, "", err
	}
	var parents []string
	for {
		l, ok := line()
		if !ok {
			return nil, "", bad("a commit without files")
		}
		if p, ok := strings.CutPrefix(l, "from "); ok && len(parents) == 0 {
			parents = append(parents, p)
			continue
		}
		if p, ok := strings.CutPrefix(l, "merge "); ok && len(parents) > 0 {
			parents = append(parents, p)
			continue
		}
		// the root: M 040000 <tree> ""
		f := strings.SplitN(l, " ", 4)
		if len(f) != 4 || f[0] != "M" || f[1] != "040000" || f[3] != `""` || len(f[2]) != m.s.hexLen || !isHex(f[2]) {
			return nil, "", bad("no root tree")
		}
		m.root = &memTree{id: f[2]}
		if err := m.load(m.root); err != nil {
			return nil, "", err
		}
		break
	}
	for _, p := range parents {
		if len(p) != m.s.hexLen || m.s.typeOf(p) != gitformat.Commit {
			return nil, "", bad("a parent that is not a commit of the store: " + p)
		}
	}
	for {
		if err := m.ctx.Err(); err != nil {
			return nil, "", err
		}
		l, ok := line()
		if !ok {
			return nil, "", bad("a commit without its end")
		}
		if l == "" {
			break
		}
		cmd, rest, _ := strings.Cut(l, " ")
		switch cmd {
		case "ls":
			p, err := unquotePath(rest)
			if err != nil {
				return nil, "", err
			}
			a, err := m.ls(p)
			if err != nil {
				return nil, "", err
			}
			answers = append(answers, a)
		case "D":
			p, err := unquotePath(rest)
			if err != nil {
				return nil, "", err
			}
			if _, err := m.del(m.root, p); err != nil {
				return nil, "", err
			}
		case "M":
			f := strings.SplitN(rest, " ", 3)
			if len(f) != 3 || f[1] != "inline" {
				return nil, "", bad("a file command: " + l)
			}
			var mode uint32
			switch f[0] {
			case "100644":
				mode = 0o100644
			case "100755":
				mode = 0o100755
			case "120000":
				mode = 0o120000
			default:
				return nil, "", bad("a file mode: " + f[0])
			}
			p, err := unquotePath(f[2])
			if err != nil {
				return nil, "", err
			}
			d, err := data()
			if err != nil {
				return nil, "", err
			}
			if err := m.set(p, mode, m.add(gitformat.Blob, d)); err != nil {
				return nil, "", err
			}
		default:
			return nil, "", bad("a command: " + l)
		}
	}
	if err := expect("get-mark :1"); err != nil {
		return nil, "", err
	}
	if err := expect("done"); err != nil || len(b) != 0 {
		return nil, "", bad("the stream's end")
	}
	tree, err := m.write(m.root)
	if err != nil {
		return nil, "", err
	}
	// fast-import's commit: no author given is the committer
	var c strings.Builder
	fmt.Fprintf(&c, "tree %s\n", tree)
	for _, p := range parents {
		fmt.Fprintf(&c, "parent %s\n", p)
	}
	fmt.Fprintf(&c, "author %s\ncommitter %s\n\n", ident, ident)
	c.Write(msg)
	return answers, m.add(gitformat.Commit, []byte(c.String())), nil
}

// add records a new object (unless a pack of the store or this import
// has it) and returns its name.
func (m *memImport) add(typ int, data []byte) string {
	h := gitformat.NewHash(m.s.hexLen)
	fmt.Fprintf(h, "%s %d\x00", typeName(typ), len(data))
	h.Write(data)
	id := hex.EncodeToString(h.Sum(nil))
	// As fast-import: what a pack has is not written again (a loose file
	// of that name may be empty or corrupt: git did not sync it).
	if !m.seen[id] && !m.s.hasPacked(id) {
		m.seen[id] = true
		m.objs = append(m.objs, looseObject{dir: id[:2], name: id[2:], typ: typ, size: int64(len(data)), data: data})
	}
	return id
}

func typeName(typ int) string {
	switch typ {
	case gitformat.Commit:
		return "commit"
	case gitformat.Tree:
		return "tree"
	case gitformat.Tag:
		return "tag"
	}
	return "blob"
}

// load reads t's entries from its object, once.
func (m *memImport) load(t *memTree) error {
	if t.entries != nil {
		return nil
	}
	if err := m.ctx.Err(); err != nil {
		return err
	}
	typ, b, err := m.s.read(t.id, memTreeMax)
	if err != nil {
		return fmt.Errorf("%w: %v", errNotHere, err)
	}
	if typ != gitformat.Tree {
		return fmt.Errorf("%w: %s is not a tree", errNotHere, t.id)
	}
	hashLen := m.s.hexLen / 2
	n := 0 // its entries, counted before any is held
	for r := b; len(r) > 0; n++ {
		nul := bytes.IndexByte(r, 0)
		if nul < 0 || nul+1+hashLen > len(r) {
			return fmt.Errorf("%w: tree %s is malformed", errNotHere, t.id)
		}
		r = r[nul+1+hashLen:]
	}
	if err := m.hold(n); err != nil {
		return err
	}
	t.entries = map[string]*memEntry{}
	for len(b) > 0 {
		sp := bytes.IndexByte(b, ' ')
		nul := bytes.IndexByte(b, 0)
		if sp <= 0 || nul < sp+2 || nul+1+hashLen > len(b) {
			return fmt.Errorf("%w: tree %s is malformed", errNotHere, t.id)
		}
		// only the modes git writes: fast-import reads others its own
		// way (16 bits; 0 as a deleted entry)
		mode, ok := treeModes[string(b[:sp])]
		name := string(b[sp+1 : nul])
		if !ok || t.entries[name] != nil || !validName(name) {
			return fmt.Errorf("%w: tree %s has an entry git would not write", errNotHere, t.id)
		}
		t.entries[name] = &memEntry{mode: mode, id: hex.EncodeToString(b[nul+1 : nul+1+hashLen])}
		b = b[nul+1+hashLen:]
	}
	return nil
}

var treeModes = map[string]uint32{"40000": 0o040000, "100644": 0o100644, "100755": 0o100755, "120000": 0o120000, "160000": 0o160000}

func validName(n string) bool { return n != "" && n != "." && n != ".." && !strings.Contains(n, "/") }

// hold counts n more tree entries against memImportMaxEntries.
func (m *memImport) hold(n int) error {
	if m.entries += n; m.entries > memImportMaxEntries {
		return fmt.Errorf("%w: trees of more than %d entries", errNotHere, memImportMaxEntries)
	}
	return nil
}

// dir is the tree of directory entry e, loaded.
func (m *memImport) dir(e *memEntry) (*memTree, error) {
	if e.tree == nil {
		e.tree = &memTree{id: e.id}
	}
	return e.tree, m.load(e.tree)
}

// split is path p's components; errNotHere for one fast-import and shim
// might read apart.
func split(p string) ([]string, error) {
	parts := strings.Split(p, "/")
	for _, c := range parts {
		if !validName(c) {
			return nil, fmt.Errorf("%w: a path of an unexpected shape: %q", errNotHere, p)
		}
	}
	return parts, nil
}

// ls is fast-import's answer to `ls p`: the entry there now.
func (m *memImport) ls(p string) (string, error) {
	parts, err := split(p)
	if err != nil {
		return "", err
	}
	t := m.root
	for i, c := range parts {
		e := t.entries[c]
		if e == nil {
			break
		}
		if i == len(parts)-1 {
			typ, id := "blob", e.id
			switch {
			case isTreeMode(e.mode):
				typ = "tree"
				if e.tree != nil {
					if id, err = m.write(e.tree); err != nil {
						return "", err
					}
				}
			case e.mode&0o170000 == 0o160000:
				typ = "commit"
			}
			return fmt.Sprintf("%06o %s %s\t%s", e.mode, typ, id, cQuote(p)), nil
		}
		if !isTreeMode(e.mode) {
			break
		}
		if t, err = m.dir(e); err != nil {
			return "", err
		}
	}
	return "missing " + cQuote(p), nil
}

// cQuote is path p as fast-import's answers write it: as it is, or, when
// it has a control character, a quote or a backslash, in C-style quotes
// (\t, \n and their kind by letter).
func cQuote(p string) string {
	if !strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '"' || r == '\\' }) {
		return p
	}
	return quoteC(p, true)
}

// set puts a blob at p: every directory on its way made (a file there
// replaced by one), each changed.
func (m *memImport) set(p string, mode uint32, id string) error {
	parts, err := split(p)
	if err != nil {
		return err
	}
	t := m.root
	for _, c := range parts[:len(parts)-1] {
		t.id = ""
		e := t.entries[c]
		if e == nil || !isTreeMode(e.mode) {
			if err := m.hold(1); err != nil {
				return err
			}
			e = &memEntry{mode: 0o040000, tree: &memTree{entries: map[string]*memEntry{}}}
			t.entries[c] = e
		}
		if t, err = m.dir(e); err != nil {
			return err
		}
	}
	t.id = ""
	leaf := parts[len(parts)-1]
	if t.entries[leaf] == nil {
		if err := m.hold(1); err != nil {
			return err
		}
	}
	t.entries[leaf] = &memEntry{mode: mode, id: id}
	return nil
}

// del removes p below t (what is there, of any type) and reports whether
// it did; a directory it leaves empty goes too, as with fast-import.
func (m *memImport) del(t *memTree, p string) (bool, error) {
	parts, err := split(p)
	if err != nil {
		return false, err
	}
	e := t.entries[parts[0]]
	if e == nil {
		return false, nil
	}
	if len(parts) == 1 {
		delete(t.entries, parts[0])
		t.id = ""
		return true, nil
	}
	if !isTreeMode(e.mode) {
		return false, nil
	}
	sub, err := m.dir(e)
	if err != nil {
		return false, err
	}
	removed, err := m.del(sub, strings.Join(parts[1:], "/"))
	if err != nil || !removed {
		return false, err
	}
	t.id = ""
	if len(sub.entries) == 0 {
		delete(t.entries, parts[0])
	}
	return true, nil
}

// write records t (and every changed directory below it) as tree objects
// and returns its name.
func (m *memImport) write(t *memTree) (string, error) {
	if t.id != "" {
		return t.id, nil
	}
	type named struct {
		name string
		e    *memEntry
	}
	es := make([]named, 0, len(t.entries))
	for n, e := range t.entries {
		if e.tree != nil {
			id, err := m.write(e.tree)
			if err != nil {
				return "", err
			}
			e.id = id
		}
		es = append(es, named{n, e})
	}
	// git's order: by name, a directory's as its name and a slash
	key := func(x named) string {
		if isTreeMode(x.e.mode) {
			return x.name + "/"
		}
		return x.name
	}
	sort.Slice(es, func(i, j int) bool { return key(es[i]) < key(es[j]) })
	var b bytes.Buffer
	for _, x := range es {
		raw, err := hex.DecodeString(x.e.id)
		if err != nil || len(raw) != m.s.hexLen/2 {
			return "", fmt.Errorf("%w: entry %q has no object name", errNotHere, x.name)
		}
		fmt.Fprintf(&b, "%o %s\x00", x.e.mode, x.name)
		b.Write(raw)
	}
	t.id = m.add(gitformat.Tree, b.Bytes())
	m.trees = append(m.trees, t.id)
	return t.id, nil
}

// unquotePath reads a path as quotePath writes it (gitformat.UnquotePath);
// one quoted otherwise is errNotHere.
func unquotePath(q string) (string, error) {
	p, err := gitformat.UnquotePath(q)
	if err != nil {
		return "", fmt.Errorf("%w: %v: %s", errNotHere, err, q)
	}
	return p, nil
}
