package gitguard

import (
	"errors"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// makeChain makes a chain of depth directories named name below dir
// (dir/name/name/...), a file leaf at its bottom, holding one descriptor at
// a time: what a harness makes in a second or two, deeper than any path a
// system call takes (PATH_MAX) and than the descriptors a process may
// hold (RLIMIT_NOFILE). each, if set, is called in every directory of the
// chain (open at fd, depth 1 for dir/name). The chain is removed at the
// test's end (removeDeep) before t.TempDir's own removal, which holds a
// descriptor per level.
func makeChain(t testing.TB, dir, name string, depth int, each func(fd, depth int)) {
	t.Helper()
	fd, err := openDir(dir)
	must(t, err)
	for i := 0; i < depth; i++ {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			t.Fatalf("mkdir at depth %d: %v", i, err)
		}
		c, err := openDirAt(fd, name)
		unix.Close(fd)
		must(t, err)
		fd = c
		if each != nil {
			each(fd, i+1)
		}
	}
	err = unix.Mknodat(fd, "leaf", unix.S_IFREG|0o644, 0)
	unix.Close(fd)
	must(t, err)
	t.Cleanup(func() { removeDeep(t, dir) })
}

// chainDepth is how many directories named name stand one in the other
// below dir, counted holding one descriptor at a time.
func chainDepth(t testing.TB, dir, name string) int {
	t.Helper()
	fd, err := openDir(dir)
	must(t, err)
	n := 0
	for {
		c, err := openDirAt(fd, name)
		unix.Close(fd)
		if err != nil {
			return n
		}
		fd, n = c, n+1
	}
}

// removeDeep empties dir, however deep, with two descriptors: each
// directory below it is flattened (its entries renamed up into dir), then
// removed. The work is one rename per entry.
func removeDeep(t testing.TB, dir string) {
	t.Helper()
	fd, err := openDir(dir)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	seq := 0
	for {
		names, err := readDirNames(fd)
		must(t, err)
		if len(names) == 0 {
			return
		}
		for _, n := range names {
			st, err := lstatAt(fd, n)
			if err != nil {
				continue
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				must(t, unix.Unlinkat(fd, n, 0))
				continue
			}
			cfd, err := openDirAt(fd, n)
			must(t, err)
			sub, err := readDirNames(cfd)
			if err == nil {
				for _, s := range sub {
					seq++
					if err = unix.Renameat(cfd, s, fd, ".rm"+strconv.Itoa(seq)); err != nil {
						break
					}
				}
			}
			unix.Close(cfd)
			must(t, err)
			must(t, unix.Unlinkat(fd, n, unix.AT_REMOVEDIR))
		}
	}
}

// fileAt makes file name, holding content, in the directory open at fd.
func fileAt(t testing.TB, fd int, name, content string) {
	t.Helper()
	f, err := unix.Openat(fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	must(t, err)
	_, err = unix.Write(f, []byte(content))
	unix.Close(f)
	must(t, err)
}

// openFDs is how many descriptors this process has open.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(ents)
}
