package snapshot

// The layer walk: a worktree layer's changes, as typed values (a file or a
// symlink put at a path, a whiteout, a directory entered, opaque or not),
// handed to the import that consumes them (a Sink): shim's own (Import),
// or the stream of git fast-import (Stream).

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/shimdev/shim/api"
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
	// MaxDepth bounds the components of a path the snapshot stores:
	// a directory at that depth is not entered. Newer git refuses to walk
	// a tree deeper than core.maxTreeDepth (2048 by default, 512 in its
	// Windows builds): a deeper snapshot would break log -p, fsck and
	// clones of the real repository there. And a path of 2048 components
	// or more is longer than PATH_MAX (each is a name and a slash), which
	// no checkout can write back. Half of git's default leaves it room.
	MaxDepth = 1024
	// MaxPath bounds the bytes of a path the snapshot stores:
	// PATH_MAX (4096, its NUL included) is the longest path a system call
	// takes, and git checks a file out by its path from the worktree's
	// top: a longer one can never be written back (ENAMETOOLONG).
	MaxPath = unix.PathMax - 1
	// MaxOpenDirs bounds the directories the walk holds open (the top's
	// among them). A directory the walk comes back to (one with entries
	// left) stays open while it is among the MaxOpenDirs nearest the top
	// with entries left; a deeper one is opened again, beneath the
	// layer's top, by its path.
	MaxOpenDirs = 16
	// MaxNames bounds the bytes of names the walk holds: the entries
	// left of every directory it is in, each a name and a string header.
	// 16 MiB is a directory of 300,000 entries of 40-byte names; the
	// entries of a directory past it (as the filesystem lists them) are
	// not walked.
	MaxNames = 16 << 20
	// MaxFastImportScans bounds what a stream costs git fast-import to
	// place its entries: fast-import finds a name in a directory by
	// reading its entries one by one, so the k-th entry written into a
	// directory costs it k comparisons (and one per entry the baseline
	// has there), and a directory of n new entries n²/2 (65,536 new
	// files in one directory took it 16 s; git's deadline is 60 s). Past
	// 2^30 (some 8 s here; 46,000 entries in one directory, or 1,000
	// directories of 1,400) the entries left of the directory are listed
	// as too_many_entries instead. Shim's import (a map a directory)
	// takes layers of any shape.
	MaxFastImportScans = 1 << 30
	// hashedPrefix: the bytes of a file over the size bound that are
	// hashed for the report (its first MiB).
	hashedPrefix = 1 << 20
)

// Bounds are a walk's bounds (the tests raise or lower them).
type Bounds struct {
	Depth, Path, OpenDirs, Names, Scans int
}

// Defaults are the walk's bounds.
func Defaults() Bounds {
	return Bounds{Depth: MaxDepth, Path: MaxPath, OpenDirs: MaxOpenDirs, Names: MaxNames, Scans: MaxFastImportScans}
}

// A Sink consumes the layer's changes as the walk finds them, in its
// order: depth first, each directory's entries by name (bytewise). p is
// the change's path from the layer's top; every enter is followed, after
// the directory's entries, by its leave.
type Sink interface {
	// Enter: the walk goes into directory p; opaque when the harness
	// removed the baseline's and made a new one there.
	Enter(p string, opaque bool) error
	// Leave: the walk is done with the directory it entered last.
	Leave() error
	// Put: a file (mode 100644 or 100755) or a symlink (120000, its
	// target the bytes) of size bytes, read from body, is at p.
	Put(p string, mode uint32, size int64, body io.ReaderAt) error
	// Remove: a whiteout: p is deleted.
	Remove(p string) error
}

// A Walk walks a layer's tree and hands each change to its sink.
type Walk struct {
	sink      Sink
	skip      func(api.NotStoredFile)
	max       int64
	bounds    Bounds
	noOpenat2 bool // open component by component (a test hook)
	// scanned: the sink is git fast-import's stream, whose cost
	// MaxFastImportScans bounds.
	scanned bool

	ufd   int       // the layer's top
	path  []byte    // the path of the entry walked
	stack []walkDir // the directories the walk is in, the top first
	open  int       // descriptors of stack held
	peak  int       // the most it held at once
	names int       // bytes of names stack holds
	scans int       // what the stream costs fast-import (MaxFastImportScans)
}

// NewWalk is a walk within bounds b that hands the changes to sink
// (scanned: git fast-import's stream) and what it does not store (files
// over max bytes, shapes past its bounds) to skip.
func NewWalk(sink Sink, max int64, b Bounds, scanned bool, skip func(api.NotStoredFile)) *Walk {
	return &Walk{sink: sink, skip: skip, max: max, bounds: b, scanned: scanned}
}

// OpenByComponents makes the walk open a directory it comes back to
// component by component, as it does where the kernel has no openat2 (a
// test hook).
func (l *Walk) OpenByComponents() { l.noOpenat2 = true }

// Peak is the most descriptors the walk held at once.
func (l *Walk) Peak() int { return l.peak }

// A walkDir is a directory the walk is in.
type walkDir struct {
	fd      int      // open, or -1: opened again by path for its next entry
	names   []string // its entries not walked yet, sorted
	end     int      // its path's length in the walk's path
	cost    int      // bytes of names it holds
	written int      // its entries walked
}

// Run hands the changes of the layer open at ufd to the sink, depth
// first, each directory's entries in name order. Only the directory whose entries it reads is
// sure to be open: see MaxOpenDirs.
func (l *Walk) Run(ufd int) error {
	l.ufd, l.open, l.peak, l.names, l.scans = ufd, 1, 1, 0, 0
	names, cost, full, err := l.list(ufd)
	if err != nil {
		return err
	}
	if !full {
		l.notStored(api.NotStoredFile{Path: ".", Type: "too_many_entries"})
	}
	l.path = l.path[:0]
	l.stack = append(l.stack[:0], walkDir{fd: ufd, names: names, cost: cost})
	defer l.leave()
	for len(l.stack) > 0 {
		d := &l.stack[len(l.stack)-1]
		if len(d.names) == 0 {
			if len(l.stack) > 1 {
				if err := l.sink.Leave(); err != nil {
					return err
				}
			}
			l.pop()
			continue
		}
		if d.written++; l.scanned && l.scans+d.written > l.bounds.Scans {
			clear(d.names)
			d.names = nil
			l.notStored(api.NotStoredFile{Path: cmp.Or(string(l.path[:d.end]), "."), Type: "too_many_entries"})
			continue
		}
		l.scans += d.written
		name := d.names[0]
		d.names[0], d.names = "", d.names[1:]
		if d.fd < 0 {
			fd, err := openBeneath(ufd, string(l.path[:d.end]), l.noOpenat2)
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
			l.notStored(api.NotStoredFile{Path: string(l.path), Type: "nested_git"})
			continue
		}
		if err := l.entry(d.fd, name); err != nil {
			return err
		}
	}
	return nil
}

// pop leaves the directory the walk is in.
func (l *Walk) pop() {
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
func (l *Walk) leave() {
	for len(l.stack) > 0 {
		l.pop()
	}
}

// list reads the names of the directory open at fd, sorted, as far as
// the walk's budget of names goes (full false when it stopped short), and
// counts them against it.
func (l *Walk) list(fd int) (names []string, cost int, full bool, err error) {
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
			if l.names+cost+c > l.bounds.Names {
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
func openBeneath(top int, path string, noOpenat2 bool) (int, error) {
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

// entry hands entry name of the directory open at fd, whose path is the
// walk's, to the sink.
func (l *Walk) entry(fd int, name string) error {
	st, err := lstatAt(fd, name)
	if err != nil {
		return err
	}
	if len(l.path) > l.bounds.Path {
		f := api.NotStoredFile{Path: string(l.path), Type: "path_too_long"}
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
			return l.sink.Remove(p) // a whiteout: deleted
		}
		l.notStored(api.NotStoredFile{Path: p, Type: "char_device"})
	case unix.S_IFBLK:
		l.notStored(api.NotStoredFile{Path: p, Type: "block_device"})
	case unix.S_IFIFO:
		l.notStored(api.NotStoredFile{Path: p, Type: "fifo"})
	case unix.S_IFSOCK:
		l.notStored(api.NotStoredFile{Path: p, Type: "socket"})
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(fd, name, buf)
		if err != nil {
			return err
		}
		return l.sink.Put(p, 0o120000, int64(n), bytes.NewReader(buf[:n]))
	case unix.S_IFREG:
		return l.file(fd, name, p, st)
	}
	return nil
}

// dir enters directory name of the directory open at fd (p its path),
// unless it is as deep as the walk goes, and tells the sink whether it is
// opaque (the harness removed the baseline's and made a new one).
func (l *Walk) dir(fd int, name, p string) error {
	cfd, err := openDirAt(fd, name)
	if err != nil {
		return err
	}
	if len(l.stack) >= l.bounds.Depth {
		if hasEntries(cfd) {
			l.notStored(api.NotStoredFile{Path: p, Type: "too_deep"})
		}
		unix.Close(cfd)
		return nil
	}
	var v [8]byte
	n, xerr := unix.Fgetxattr(cfd, "trusted.overlay.opaque", v[:])
	err = l.sink.Enter(p, xerr == nil && n == 1 && v[0] == 'y')
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
		l.notStored(api.NotStoredFile{Path: p, Type: "too_many_entries"})
	}
	// The directory walked so far is closed when the walk will not come
	// back to it, or is past the directories it keeps open.
	if d := &l.stack[len(l.stack)-1]; d.fd != l.ufd && (len(d.names) == 0 || l.open >= l.bounds.OpenDirs) {
		unix.Close(d.fd)
		d.fd = -1
		l.held(-1)
	}
	l.stack = append(l.stack, walkDir{fd: cfd, names: names, end: len(l.path), cost: cost})
	l.held(1)
	return nil
}

// held counts n more descriptors held (fewer, when negative).
func (l *Walk) held(n int) {
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

func (l *Walk) file(dfd int, name, p string, st unix.Stat_t) error {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if st.Size > l.max {
		h := gitformat.NewHash(64) // SHA-256, whatever the repository's hash
		n, _ := io.CopyN(h, f, hashedPrefix)
		l.notStored(api.NotStoredFile{Path: p, Type: "file", Size: st.Size, Allocated: st.Blocks * 512,
			Hash: "sha256:" + hex.EncodeToString(h.Sum(nil)), HashedBytes: n})
		return nil
	}
	mode := uint32(0o100644)
	if st.Mode&0o100 != 0 {
		mode = 0o100755
	}
	return l.sink.Put(p, mode, st.Size, f)
}

// notStored lists a file of the layer the snapshot does not store (the
// scan's NotStored, with the same types, and the walk's bounds).
func (l *Walk) notStored(f api.NotStoredFile) { l.skip(f) }
