package gitguard

// The layer walk: the import stream of a worktree layer (its files inline,
// an ls before each change), and the description of the changes from the
// import's answers to those ls.

import (
	"bufio"
	"cmp"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// The walk's bounds. A harness shapes its layer as it likes (a directory
// chain 25,000 deep takes it a second and a half), and the walk runs in
// PID 1, at a fence that must make the snapshot whatever the shape. So the
// walk holds no descriptor and no path per level of depth, and the
// snapshot stores only paths git and the kernel can use again; what lies
// past a bound is listed in the report's not_stored (too_deep,
// path_too_long, too_many_entries) and the layer keeps it.
const (
	// maxLayerDepth bounds the components of a path the snapshot stores:
	// a directory at that depth is not entered. Newer git refuses to walk
	// a tree deeper than core.maxTreeDepth (2048 by default, 512 in its
	// Windows builds): a deeper snapshot would break log -p, fsck and
	// clones of the real repository there. And a path of 2048 components
	// or more is longer than PATH_MAX (each is a name and a slash), which
	// no checkout can write back. Half of git's default leaves it room.
	maxLayerDepth = 1024
	// maxLayerPath bounds the bytes of a path the snapshot stores:
	// PATH_MAX (4096, its NUL included) is the longest path a system call
	// takes, and git checks a file out by its path from the worktree's
	// top: a longer one can never be written back (ENAMETOOLONG).
	maxLayerPath = unix.PathMax - 1
	// maxOpenDirs bounds the directories the walk holds open (the top's
	// among them). A directory the walk comes back to (one with entries
	// left) stays open while it is among the maxOpenDirs nearest the top
	// with entries left; a deeper one is opened again, beneath the
	// layer's top, by its path.
	maxOpenDirs = 16
	// maxWalkNames bounds the bytes of names the walk holds: the entries
	// left of every directory it is in, each a name and a string header.
	// 16 MiB is a directory of 300,000 entries of 40-byte names; the
	// entries of a directory past it (as the filesystem lists them) are
	// not walked.
	maxWalkNames = 16 << 20
	// maxFastImportAsks bounds the ls of a stream for git fast-import:
	// their answers describe a small layer without a diff-tree (a process
	// more); past it diff-tree describes it instead. An ls costs
	// fast-import some 10 µs (100,000 cost it a second more, a
	// diff-tree of as many changes 0.7 s), and the walk holds each.
	maxFastImportAsks = 1024
	// maxFastImportScans bounds what a stream costs git fast-import to
	// place its entries: fast-import finds a name in a directory by
	// reading its entries one by one, so the k-th entry written into a
	// directory costs it k comparisons (and one per entry the baseline
	// has there), and a directory of n new entries n²/2 (65,536 new
	// files in one directory took it 16 s; git's deadline is 60 s). Past
	// 2^30 (some 8 s here; 46,000 entries in one directory, or 1,000
	// directories of 1,400) the entries left of the directory are listed
	// as too_many_entries instead. Shim's import (a map a directory)
	// takes layers of up to memImportMaxPaths paths of any shape.
	maxFastImportScans = 1 << 30
)

// walkBounds are the walk's bounds; the tests raise or lower them.
type walkBounds struct {
	depth, path, openDirs, names, scans int
}

var layerBounds = walkBounds{depth: maxLayerDepth, path: maxLayerPath, openDirs: maxOpenDirs, names: maxWalkNames, scans: maxFastImportScans}

// layerWalk writes fast-import file commands for a layer's tree, each
// after an ls of its path, and pairs the ls with their answers.
type layerWalk struct {
	w      *bufio.Writer
	rep    *Report
	max    int64
	sha256 bool // the repository's object format
	bounds walkBounds
	opaque bool // an opaque directory was met

	// asks are the ls written, at most maxAsks: past them a stream of
	// shim's import (inShim) is fast-import's, and fast-import's asks no
	// more (unasked).
	asks    []layerAsk
	maxAsks int
	inShim  bool
	unasked bool

	ufd   int       // the layer's top
	path  []byte    // the path of the entry walked
	stack []walkDir // the directories the walk is in, the top first
	open  int       // descriptors of stack held
	peak  int       // the most it held at once
	names int       // bytes of names stack holds
	scans int       // what the stream costs fast-import (maxFastImportScans)
}

// newLayerWalk is a walk that reports to rep (files over max not
// stored), for shim's import (inShim) or git fast-import.
func newLayerWalk(rep *Report, max int64, sha256, inShim bool) *layerWalk {
	l := &layerWalk{rep: rep, max: max, sha256: sha256, bounds: layerBounds, maxAsks: maxFastImportAsks, inShim: inShim}
	if inShim {
		l.maxAsks = memImportMaxPaths
	}
	return l
}

// A walkDir is a directory the walk is in.
type walkDir struct {
	fd      int      // open, or -1: opened again by path for its next entry
	names   []string // its entries not walked yet, sorted
	end     int      // its path's length in the walk's path
	cost    int      // bytes of names it holds
	written int      // its entries walked
}

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
	err := l.walk(ufd)
	if err == nil {
		_, err = bw.WriteString("\nget-mark :1\ndone\n")
	}
	if err == nil {
		err = bw.Flush()
	}
	return err
}

// walk writes the layer open at ufd, depth first, each directory's
// entries in name order. Only the directory whose entries it reads is
// sure to be open: see maxOpenDirs.
func (l *layerWalk) walk(ufd int) error {
	l.ufd, l.open, l.peak, l.names, l.scans = ufd, 1, 1, 0, 0
	names, cost, full, err := l.list(ufd)
	if err != nil {
		return err
	}
	if !full {
		l.notStored(NotStoredFile{Path: ".", Type: "too_many_entries"})
	}
	l.path = l.path[:0]
	l.stack = append(l.stack[:0], walkDir{fd: ufd, names: names, cost: cost})
	defer l.leave()
	for len(l.stack) > 0 {
		d := &l.stack[len(l.stack)-1]
		if len(d.names) == 0 {
			l.pop()
			continue
		}
		if d.written++; !l.inShim && l.scans+d.written > l.bounds.scans {
			clear(d.names)
			d.names = nil
			l.notStored(NotStoredFile{Path: cmp.Or(string(l.path[:d.end]), "."), Type: "too_many_entries"})
			continue
		}
		l.scans += d.written
		name := d.names[0]
		d.names[0], d.names = "", d.names[1:]
		if d.fd < 0 {
			fd, err := openBeneath(ufd, string(l.path[:d.end]))
			if err != nil {
				return err
			}
			d.fd = fd
			l.held(1)
		}
		l.path = l.path[:d.end]
		if d.end > 0 {
			l.path = append(l.path, '/')
		}
		l.path = append(l.path, name...)
		if len(l.stack) == 1 && name == ".git" {
			continue // the repository: its objects and refs are imported apart
		}
		if strings.EqualFold(name, ".git") {
			l.notStored(NotStoredFile{Path: string(l.path), Type: "nested_git"})
			continue
		}
		if err := l.entry(d.fd, name); err != nil {
			return err
		}
	}
	return nil
}

// pop leaves the directory the walk is in.
func (l *layerWalk) pop() {
	d := &l.stack[len(l.stack)-1]
	if d.fd >= 0 && d.fd != l.ufd {
		unix.Close(d.fd)
		l.held(-1)
	}
	l.names -= d.cost
	*d = walkDir{}
	l.stack = l.stack[:len(l.stack)-1]
}

// leave closes what the walk holds open (after an error).
func (l *layerWalk) leave() {
	for len(l.stack) > 0 {
		l.pop()
	}
}

// list reads the names of the directory open at fd, sorted, as far as
// the walk's budget of names goes (full false when it stopped short), and
// counts them against it.
func (l *layerWalk) list(fd int) (names []string, cost int, full bool, err error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil { // the top, walked again
		return nil, 0, false, err
	}
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, 0, false, &os.PathError{Op: "getdents", Path: string(l.path), Err: err}
		}
		if n <= 0 {
			break
		}
		from := len(names)
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		for i, name := range names[from:] {
			c := len(name) + 16 // the name and its string header
			if l.names+cost+c > l.bounds.names {
				names = names[:from+i]
				l.names += cost
				sort.Strings(names)
				return names, cost, false, nil
			}
			cost += c
		}
	}
	l.names += cost
	sort.Strings(names)
	return names, cost, true, nil
}

// openBeneath opens the directory at path (names the walk read, joined by
// slashes) below the directory open at top, never through a symlink, a
// magic link or a mount, never out of top: openat2 with RESOLVE_BENEATH
// and its kin; component by component (each without following a symlink)
// where the kernel has no openat2 (before Linux 5.6, or a seccomp profile
// that refuses it).
func openBeneath(top int, path string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for try := 0; !noOpenat2 && try < 8; try++ {
		fd, err := unix.Openat2(top, path, &how)
		switch {
		case err == nil:
			return fd, nil
		case err == unix.EINTR || err == unix.EAGAIN: // EAGAIN: a rename raced the lookup
			continue
		case err != unix.ENOSYS && err != unix.EPERM:
			return -1, &os.PathError{Op: "openat2", Path: path, Err: err}
		}
		break
	}
	fd := top
	for _, c := range strings.Split(path, "/") {
		next, err := openDirAt(fd, c)
		if fd != top {
			unix.Close(fd)
		}
		if err != nil {
			return -1, err
		}
		fd = next
	}
	if fd == top {
		return -1, &os.PathError{Op: "open", Path: path, Err: unix.EINVAL}
	}
	return fd, nil
}

// noOpenat2 makes openBeneath open component by component (a test hook).
var noOpenat2 bool

// entry writes entry name of the directory open at fd, whose path is the
// walk's.
func (l *layerWalk) entry(fd int, name string) error {
	st, err := lstatAt(fd, name)
	if err != nil {
		return err
	}
	if len(l.path) > l.bounds.path {
		f := NotStoredFile{Path: string(l.path), Type: "path_too_long"}
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			f.Size, f.Allocated = st.Size, st.Blocks*512
		}
		l.notStored(f)
		return nil
	}
	p := string(l.path)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return l.dir(fd, name, p)
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			if err := l.ask(layerAsk{path: p, kind: 'x'}); err != nil {
				return err
			}
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
		if err := l.ask(layerAsk{path: p, kind: 'f', mode: "120000", oid: hex.EncodeToString(h.Sum(nil))}); err != nil {
			return err
		}
		_, err = fmt.Fprintf(l.w, "M 120000 inline %s\ndata %d\n%s\n", quotePath(p), n, buf[:n])
		return err
	case unix.S_IFREG:
		return l.file(fd, name, p, st)
	}
	return nil
}

// dir enters directory name of the directory open at fd (p its path),
// unless it is as deep as the walk goes. An opaque directory (the harness
// removed the baseline's and made a new one) first deletes the
// baseline's.
func (l *layerWalk) dir(fd int, name, p string) error {
	cfd, err := openDirAt(fd, name)
	if err != nil {
		return err
	}
	if len(l.stack) >= l.bounds.depth {
		if hasEntries(cfd) {
			l.notStored(NotStoredFile{Path: p, Type: "too_deep"})
		}
		unix.Close(cfd)
		return nil
	}
	var v [8]byte
	if n, xerr := unix.Fgetxattr(cfd, "trusted.overlay.opaque", v[:]); xerr == nil && n == 1 && v[0] == 'y' {
		l.opaque = true
		_, err = fmt.Fprintf(l.w, "D %s\n", quotePath(p))
	} else {
		err = l.ask(layerAsk{path: p, kind: 'd'})
	}
	var names []string
	var cost int
	full := true
	if err == nil {
		names, cost, full, err = l.list(cfd)
	}
	if err != nil {
		unix.Close(cfd)
		return err
	}
	if !full {
		l.notStored(NotStoredFile{Path: p, Type: "too_many_entries"})
	}
	// The directory walked so far is closed when the walk will not come
	// back to it, or is past the directories it keeps open.
	if d := &l.stack[len(l.stack)-1]; d.fd != l.ufd && (len(d.names) == 0 || l.open >= l.bounds.openDirs) {
		unix.Close(d.fd)
		d.fd = -1
		l.held(-1)
	}
	l.stack = append(l.stack, walkDir{fd: cfd, names: names, end: len(l.path), cost: cost})
	l.held(1)
	return nil
}

// held counts n more descriptors held (fewer, when negative).
func (l *layerWalk) held(n int) {
	l.open += n
	l.peak = max(l.peak, l.open)
}

// hasEntries reports whether the directory open at fd has an entry.
func hasEntries(fd int) bool {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return err != nil // one it cannot read is listed, as one with entries
		}
		if _, c, _ := unix.ParseDirent(buf[:n], -1, nil); c > 0 {
			return true
		}
	}
}

func (l *layerWalk) file(dfd int, name, p string, st unix.Stat_t) error {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if st.Size > l.max {
		h := gitformat.NewHash(64) // SHA-256, whatever the repository's hash
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
	if err := l.ask(layerAsk{path: p, kind: 'f', mode: mode}); err != nil {
		return err
	}
	fmt.Fprintf(l.w, "M %s inline %s\ndata %d\n", mode, quotePath(p), st.Size)
	h := l.blobHash(st.Size)
	n, err := io.CopyN(io.MultiWriter(l.w, h), f, st.Size)
	if err != nil {
		return fmt.Errorf("read %s: %d of %d bytes: %w", p, n, st.Size, err)
	}
	if !l.unasked {
		l.asks[len(l.asks)-1].oid = hex.EncodeToString(h.Sum(nil))
	}
	return l.w.WriteByte('\n')
}

// blobHash is the object id the blob of b's bytes (or of the bytes written
// to it) gets.
func (l *layerWalk) blobHash(size int64) hash.Hash {
	h := gitformat.NewHash(40)
	if l.sha256 {
		h = gitformat.NewHash(64)
	}
	fmt.Fprintf(h, "blob %d\x00", size)
	return h
}

// notStored lists a file of the layer the snapshot does not store (the
// scan's NotStored, with the same types, and the walk's bounds).
func (l *layerWalk) notStored(f NotStoredFile) {
	if len(l.rep.NotStored) >= maxListed {
		return
	}
	l.rep.NotStored = append(l.rep.NotStored, f)
}

// A layerAsk is one `ls` of the import's stream: what the baseline had
// at a path the layer changes, and what the layer puts there.
type layerAsk struct {
	path string
	kind byte   // 'f' a file or symlink written, 'd' a directory entered, 'x' a whiteout
	mode string // of what is written
	oid  string // of what is written (its blob)
}

// ask writes the ls of a.path, whose answer describes the change, unless
// the walk asked maxAsks already: then a stream of shim's import is
// fast-import's (errNotHere), and fast-import's asks no more (diff-tree
// describes the layer).
func (l *layerWalk) ask(a layerAsk) error {
	if l.unasked {
		return nil
	}
	if len(l.asks) >= l.maxAsks {
		if l.inShim {
			return fmt.Errorf("%w: more than %d paths", errNotHere, l.maxAsks)
		}
		l.unasked = true
		return nil
	}
	l.asks = append(l.asks, a)
	_, err := fmt.Fprintf(l.w, "ls %s\n", quotePath(a.path))
	return err
}

// finish reads the import's answers to the walk's asks, then the
// snapshot commit's name, and fills the report's changes; described is
// false when the answers do not describe the layer.
func (l *layerWalk) finish(lines []string) (commit string, described bool, err error) {
	if len(lines) != len(l.asks)+1 {
		return "", false, fmt.Errorf("fast-import answered %d lines to %d questions", len(lines), len(l.asks)+1)
	}
	commit = lines[len(lines)-1]
	if !isHex(commit) {
		return "", false, fmt.Errorf("fast-import answered %q", commit)
	}
	return commit, l.describe(lines[:len(l.asks)]), nil
}

// describe fills the report's changes from fast-import's answers to the
// walk's asks, in diff-tree's terms and order; false when one of them (or
// the walk) found a shape only diff-tree describes, or the walk did not
// ask of every path.
func (l *layerWalk) describe(answers []string) bool {
	if l.opaque || l.unasked {
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
