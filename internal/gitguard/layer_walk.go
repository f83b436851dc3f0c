package gitguard

// The layer walk: the import stream of a worktree layer (its files inline,
// an ls before each change), and the description of the changes from the
// import's answers to those ls.

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// stream writes to out the import of the layer open at ufd as a commit on
// ref (committed at now, with msg, on parents, the first the baseline of
// tree baseTree), walking it with l.
func (l *layerWalk) stream(out io.Writer, ufd int, ref string, now int64, msg string, parents []string, baseTree string) error {
	bw := bufio.NewWriterSize(out, 1<<16)
	l.w = bw
	fmt.Fprintf(bw, "commit %s\nmark :1\ncommitter shim <shim@localhost> %d +0000\ndata %d\n%s\nfrom %s\n",
		ref, now, len(msg), msg, parents[0])
	for _, p := range parents[1:] {
		fmt.Fprintf(bw, "merge %s\n", p)
	}
	fmt.Fprintf(bw, "M 040000 %s \"\"\n", baseTree)
	err := l.dir(ufd, "")
	if err == nil {
		_, err = bw.WriteString("\nget-mark :1\ndone\n")
	}
	if err == nil {
		err = bw.Flush()
	}
	return err
}

// answered reads the import's answers to the walk's asks, then the
// snapshot commit's name.
func (g *Guard) answered(w *layerWalk, lines []string) (string, bool, error) {
	if len(lines) != len(w.asks)+1 {
		return "", false, fmt.Errorf("fast-import answered %d lines to %d questions", len(lines), len(w.asks)+1)
	}
	commit := lines[len(lines)-1]
	if !isHex(commit) {
		return "", false, fmt.Errorf("fast-import answered %q", commit)
	}
	return commit, w.describe(lines[:len(w.asks)]), nil
}

// A layerAsk is one `ls` of the import's stream: what the baseline had
// at a path the layer changes, and what the layer puts there.
type layerAsk struct {
	path string
	kind byte   // 'f' a file or symlink written, 'd' a directory entered, 'x' a whiteout
	mode string // of what is written
	oid  string // of what is written (its blob)
}

// describe fills the report's changes from fast-import's answers to the
// walk's asks, in diff-tree's terms and order; false when one of them (or
// the walk) found a shape only diff-tree describes.
func (l *layerWalk) describe(answers []string) bool {
	if l.opaque {
		return false
	}
	type change struct{ path, kind string }
	var changes []change
	for i, a := range l.asks {
		mode, typ, oid, ok := parseLs(answers[i])
		if !ok {
			return false
		}
		switch {
		case a.kind == 'd':
			if typ != "" && typ != "tree" {
				return false // a directory where the baseline has a file: its deletion is implicit
			}
		case typ == "tree":
			return false // a file, or a whiteout, where the baseline has a directory
		case a.kind == 'x':
			if typ != "" {
				changes = append(changes, change{a.path, "deleted"})
			}
		case typ == "":
			changes = append(changes, change{a.path, "added"})
		case typ == "commit" || (mode == "120000") != (a.mode == "120000"):
			changes = append(changes, change{a.path, "type_changed"})
		case mode != a.mode || oid != a.oid:
			changes = append(changes, change{a.path, "modified"})
		}
	}
	// diff-tree's order: by path, bytewise (a directory's entries sort as
	// its name and a slash).
	sort.Slice(changes, func(i, j int) bool { return changes[i].path < changes[j].path })
	rep := l.rep
	for _, c := range changes {
		switch c.kind {
		case "added":
			rep.Added++
		case "deleted":
			rep.Deleted++
		default:
			rep.Modified++
		}
		if len(rep.Paths) >= maxListed {
			rep.PathsTruncated = true
			continue
		}
		rep.Paths = append(rep.Paths, PathChange{Path: c.path, Change: c.kind})
	}
	return true
}

// parseLs reads one answer of fast-import's ls: "missing PATH", or "MODE
// TYPE OID\tPATH"; typ is "" for a missing path.
func parseLs(s string) (mode, typ, oid string, ok bool) {
	if strings.HasPrefix(s, "missing ") {
		return "", "", "", true
	}
	meta, _, ok := strings.Cut(s, "\t")
	f := strings.Fields(meta)
	if !ok || len(f) != 3 || !isHex(f[2]) {
		return "", "", "", false
	}
	return f[0], f[1], f[2], true
}

// layerWalk writes fast-import file commands for a layer's tree, each
// after an ls of its path.
type layerWalk struct {
	w      *bufio.Writer
	rep    *Report
	max    int64
	sha256 bool // the repository's object format
	asks   []layerAsk
	opaque bool // an opaque directory was met
}

// ask writes the ls of path p, whose answer describes the change.
func (l *layerWalk) ask(a layerAsk) {
	fmt.Fprintf(l.w, "ls %s\n", quotePath(a.path))
	l.asks = append(l.asks, a)
}

// blobHash is the object id the blob of b's bytes (or of the bytes written
// to it) gets.
func (l *layerWalk) blobHash(size int64) hash.Hash {
	h := objectHash(40)
	if l.sha256 {
		h = objectHash(64)
	}
	fmt.Fprintf(h, "blob %d\x00", size)
	return h
}

// notStored lists a file of the layer the snapshot does not store (the
// scan's NotStored, with the same types).
func (l *layerWalk) notStored(f NotStoredFile) {
	if len(l.rep.NotStored) >= maxListed {
		return
	}
	l.rep.NotStored = append(l.rep.NotStored, f)
}

// dir walks the directory open at fd (rel is its path in the worktree,
// "" for the top). An opaque directory (the harness removed the
// baseline's and made a new one) first deletes the baseline's.
func (l *layerWalk) dir(fd int, rel string) error {
	if rel != "" {
		var v [8]byte
		if n, err := unix.Fgetxattr(fd, "trusted.overlay.opaque", v[:]); err == nil && n == 1 && v[0] == 'y' {
			l.opaque = true
			fmt.Fprintf(l.w, "D %s\n", quotePath(rel))
		} else {
			l.ask(layerAsk{path: rel, kind: 'd'})
		}
	}
	names, err := readDirNames(fd)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, n := range names {
		p := n
		if rel != "" {
			p = rel + "/" + n
		}
		if rel == "" && n == ".git" {
			continue // the repository: its objects and refs are imported apart
		}
		if strings.EqualFold(n, ".git") {
			l.notStored(NotStoredFile{Path: p, Type: "nested_git"})
			continue
		}
		if err := l.entry(fd, n, p); err != nil {
			return err
		}
	}
	return nil
}

func (l *layerWalk) entry(fd int, name, p string) error {
	st, err := lstatAt(fd, name)
	if err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		cfd, err := openDirAt(fd, name)
		if err != nil {
			return err
		}
		defer unix.Close(cfd)
		return l.dir(cfd, p)
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			l.ask(layerAsk{path: p, kind: 'x'})
			_, err := fmt.Fprintf(l.w, "D %s\n", quotePath(p)) // a whiteout: deleted
			return err
		}
		l.notStored(NotStoredFile{Path: p, Type: "char_device"})
	case unix.S_IFBLK:
		l.notStored(NotStoredFile{Path: p, Type: "block_device"})
	case unix.S_IFIFO:
		l.notStored(NotStoredFile{Path: p, Type: "fifo"})
	case unix.S_IFSOCK:
		l.notStored(NotStoredFile{Path: p, Type: "socket"})
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(fd, name, buf)
		if err != nil {
			return err
		}
		h := l.blobHash(int64(n))
		h.Write(buf[:n])
		l.ask(layerAsk{path: p, kind: 'f', mode: "120000", oid: hex.EncodeToString(h.Sum(nil))})
		_, err = fmt.Fprintf(l.w, "M 120000 inline %s\ndata %d\n%s\n", quotePath(p), n, buf[:n])
		return err
	case unix.S_IFREG:
		return l.file(fd, name, p, st)
	}
	return nil
}

func (l *layerWalk) file(dfd int, name, p string, st unix.Stat_t) error {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if st.Size > l.max {
		h := objectHash(64) // SHA-256, whatever the repository's hash
		n, _ := io.CopyN(h, f, hashedPrefix)
		l.notStored(NotStoredFile{Path: p, Type: "file", Size: st.Size, Allocated: st.Blocks * 512,
			Hash: "sha256:" + hex.EncodeToString(h.Sum(nil)), HashedBytes: n})
		return nil
	}
	mode := "100644"
	if st.Mode&0o100 != 0 {
		mode = "100755"
	}
	// The ls first: its answer is the baseline's entry. The blob's id is
	// known only once the file is read, and filled in then.
	l.ask(layerAsk{path: p, kind: 'f', mode: mode})
	fmt.Fprintf(l.w, "M %s inline %s\ndata %d\n", mode, quotePath(p), st.Size)
	h := l.blobHash(st.Size)
	n, err := io.CopyN(io.MultiWriter(l.w, h), f, st.Size)
	if err != nil {
		return fmt.Errorf("read %s: %d of %d bytes: %w", p, n, st.Size, err)
	}
	l.asks[len(l.asks)-1].oid = hex.EncodeToString(h.Sum(nil))
	return l.w.WriteByte('\n')
}
