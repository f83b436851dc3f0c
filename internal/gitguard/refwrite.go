package gitguard

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// writeRef creates loose ref name (below the git dir: refs/...) as git
// does: a lock file, then a rename; directories made as the owner of
// refs/ has them. The ref must not exist (noRef).
func (g *Guard) writeRef(name, id string) error {
	parts := strings.Split(name, "/")
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return err
	}
	fd := gfd
	defer func() { unix.Close(fd) }()
	var st unix.Stat_t
	for i, c := range parts[:len(parts)-1] {
		if i > 0 { // refs/ exists (noRef checked it)
			if err := unix.Mkdirat(fd, c, 0o755); err == nil && os.Geteuid() == 0 {
				unix.Fchownat(fd, c, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
			} else if err != nil && err != unix.EEXIST {
				return &os.PathError{Op: "mkdir", Path: c, Err: err}
			}
		}
		next, err := openDirAt(fd, c)
		if err != nil {
			return err
		}
		unix.Close(fd)
		fd = next
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
	}
	leaf := parts[len(parts)-1]
	lock := leaf + ".lock"
	lfd, err := unix.Openat(fd, lock, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return &os.PathError{Op: "create", Path: name + ".lock", Err: err}
	}
	_, err = unix.Write(lfd, []byte(id+"\n"))
	if err == nil && os.Geteuid() == 0 {
		err = unix.Fchown(lfd, int(st.Uid), int(st.Gid))
	}
	if cerr := unix.Close(lfd); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(fd, lock, fd, leaf)
	}
	if err != nil {
		unix.Unlinkat(fd, lock, 0)
		return &os.PathError{Op: "write ref", Path: name, Err: err}
	}
	return nil
}
