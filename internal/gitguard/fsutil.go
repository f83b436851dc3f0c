package gitguard

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// The helpers below work relative to directory file descriptors and never
// follow a symlink: shim runs as root and the .git directory is writable by
// the harness, which may have replaced any entry by a link to a file
// outside the worktree. Names are single path components. Every open is
// O_NONBLOCK and a file is read only once fstat says it is a regular file,
// so a FIFO planted in the worktree or the git dir never blocks shim itself
// (git, which does block on one, has a deadline instead).

var errNotRegular = errors.New("not a regular file")

// openDir opens an absolute directory path, refusing a symlink as its last
// component.
func openDir(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// openDirAt opens name in dirfd as a directory without following a symlink.
func openDirAt(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, &os.PathError{Op: "openat", Path: name, Err: err}
	}
	return fd, nil
}

// lstatAt stats name in dirfd without following a symlink.
func lstatAt(dirfd int, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return st, &os.PathError{Op: "lstat", Path: name, Err: err}
	}
	return st, nil
}

func isNotExist(err error) bool { return errors.Is(err, unix.ENOENT) }

// readFileAt reads a regular file (at most max bytes) without following a
// symlink and without blocking on a FIFO (O_NONBLOCK, checked with fstat
// before any read); anything but a regular file is errNotRegular.
func readFileAt(dirfd int, name string, max int64) ([]byte, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, st, fmt.Errorf("%s: %w", name, errNotRegular)
		}
		return nil, st, &os.PathError{Op: "openat", Path: name, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, st, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, st, fmt.Errorf("%s: %w", name, errNotRegular)
	}
	if st.Size > max {
		return nil, st, fmt.Errorf("%s: larger than %d bytes", name, max)
	}
	// Read with the fd itself (no *os.File: it costs a file of a loose
	// object more system calls than its read), up to max+1 bytes of a
	// file that grows meanwhile.
	data := make([]byte, 0, st.Size+1)
	for int64(len(data)) <= max {
		if len(data) == cap(data) {
			data = slices.Grow(data, int(min(max+1-int64(len(data)), int64(cap(data))+4096)))
		}
		n, err := unix.Read(fd, data[len(data):min(int64(cap(data)), max+1)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, st, &os.PathError{Op: "read", Path: name, Err: err}
		}
		if n == 0 {
			break
		}
		data = data[:len(data)+n]
	}
	return data, st, nil
}

// openRegularAt opens name below dirfd to read, as a stream, not
// following a symlink, and only if it is a regular file.
func openRegularAt(dirfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &os.PathError{Op: "openat", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, errNotRegular)
	}
	return f, nil
}

// writeFileAt atomically replaces name in dirfd with a regular file: the
// data goes to a fresh temporary (O_EXCL, O_NOFOLLOW) that is renamed over
// the old entry, so a symlink planted at name is replaced, never followed.
// uid/gid < 0 keep the creator's; mtime, if set, is applied (git's racy
// index check needs an index copy to keep its time).
func writeFileAt(dirfd int, name string, data []byte, mode uint32, uid, gid int, mtime *unix.Timespec) error {
	tmp := ".shim-tmp-" + name
	if err := removeAllAt(dirfd, tmp); err != nil {
		return err
	}
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: tmp, Err: err}
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil && uid >= 0 {
		err = unix.Fchown(fd, uid, gid)
	}
	if err == nil {
		err = unix.Fchmod(fd, mode&0o7777)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && mtime != nil {
		err = unix.UtimesNanoAt(dirfd, tmp, []unix.Timespec{*mtime, *mtime}, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err == nil {
		if st, serr := lstatAt(dirfd, name); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = removeAllAt(dirfd, name)
		}
	}
	if err == nil {
		err = unix.Renameat(dirfd, tmp, dirfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// removeAllAt removes name in dirfd and, if it is a real directory,
// everything below it. Symlinks are removed, not followed. A missing name
// is not an error.
func removeAllAt(dirfd int, name string) error {
	st, err := lstatAt(dirfd, name)
	if err != nil {
		if isNotExist(err) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(dirfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "unlink", Path: name, Err: err}
		}
		return nil
	}
	fd, err := openDirAt(dirfd, name)
	if err != nil {
		return err
	}
	// A batch of names at a time, read again from the start once it is
	// removed: memory bounded whatever a harness put in the directory.
	for {
		var names []string
		if names, err = firstDirNames(fd, 1024); err != nil || len(names) == 0 {
			break
		}
		for _, n := range names {
			if err = removeAllAt(fd, n); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("%s/%w", name, err)
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: name, Err: err}
	}
	return nil
}

// eachDirEntry calls fn with each name of the directory open at fd, as
// getdents returns them, holding one buffer and no list: a directory a
// harness filled with millions of names costs the caller time, not memory.
// fn may remove the name it is given. It stops at fn's first error.
func eachDirEntry(fd int, fn func(name string) error) error {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "getdents", Path: "dir", Err: err}
		}
		if n <= 0 {
			return nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, name := range names {
			if err := fn(name); err != nil {
				return err
			}
		}
	}
}

var errEnoughNames = errors.New("enough names")

// firstDirNames reads at most max names of the directory open at fd.
func firstDirNames(fd int, max int) ([]string, error) {
	var out []string
	err := eachDirEntry(fd, func(n string) error {
		out = append(out, n)
		if len(out) >= max {
			return errEnoughNames
		}
		return nil
	})
	if err == errEnoughNames {
		err = nil
	}
	return out, err
}

// readDirNames lists the directory open at fd (the fd stays open).
func readDirNames(fd int) ([]string, error) {
	// From the start, whatever read fd before (a second walk of the same
	// directory); with the fd itself (an *os.File of a dup costs each
	// directory four more system calls: a loose object's fan-out
	// directory holds a name or two).
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, err
	}
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return names, &os.PathError{Op: "getdents", Path: "dir", Err: err}
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// readTree reads a directory tree of regular files below dirfd/name into a
// map of relative path -> content, with the modes. Symlinks and other
// special files are recorded with a nil content so a comparison sees them.
type fileEntry struct {
	data []byte
	mode uint32
	dir  bool
}

func readTreeAt(dirfd int, name string, prefix string, out map[string]fileEntry) error {
	fd, err := openDirAt(dirfd, name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	names, err := readDirNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		rel := prefix + n
		st, err := lstatAt(fd, n)
		if err != nil {
			if isNotExist(err) {
				continue
			}
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			out[rel] = fileEntry{mode: st.Mode & 0o7777, dir: true}
			if err := readTreeAt(fd, n, rel+"/", out); err != nil {
				return err
			}
		case unix.S_IFREG:
			data, _, err := readFileAt(fd, n, 64<<20)
			if err != nil {
				return err
			}
			out[rel] = fileEntry{data: data, mode: st.Mode & 0o7777}
		default:
			out[rel] = fileEntry{mode: st.Mode} // type bits make it differ from any file
		}
	}
	return nil
}

// writeTreeAt creates the directory dirfd/name and the files of tree in it
// (a map as filled by readTreeAt), owned by uid/gid.
func writeTreeAt(dirfd int, name string, tree map[string]fileEntry, dirMode uint32, uid, gid int) error {
	if err := unix.Mkdirat(dirfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return &os.PathError{Op: "mkdir", Path: name, Err: err}
	}
	fd, err := openDirAt(dirfd, name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if uid >= 0 {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(fd, dirMode&0o7777); err != nil {
		return err
	}
	// Direct children first; subdirectories recurse with their own subset.
	sub := map[string]map[string]fileEntry{}
	for rel, e := range tree {
		head, rest, nested := strings.Cut(rel, "/")
		if nested {
			if sub[head] == nil {
				sub[head] = map[string]fileEntry{}
			}
			sub[head][rest] = e
			continue
		}
		if e.dir {
			if sub[head] == nil {
				sub[head] = map[string]fileEntry{}
			}
			continue
		}
		if e.mode&unix.S_IFMT != 0 {
			continue // a special file in the pristine copy is not recreated
		}
		if err := writeFileAt(fd, head, e.data, e.mode, uid, gid, nil); err != nil {
			return err
		}
	}
	for d, m := range sub {
		mode := uint32(0o755)
		if e, ok := tree[d]; ok && e.dir {
			mode = e.mode
		}
		if err := writeTreeAt(fd, d, m, mode, uid, gid); err != nil {
			return err
		}
	}
	return nil
}
