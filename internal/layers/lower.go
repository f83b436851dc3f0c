package layers

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The lower of a worktree's layer is the checkout itself: every
// generation's overlay reads it, and the fence trusts it (it is the
// baseline by construction). It must not be writable by a harness's uid
// from outside its overlay: a process of that uid in shim's mount
// namespace (a supervisor's `docker exec -u agent`, a tool call not placed
// in its generation, the /proc/<pid>/root of any process of that uid)
// would otherwise write the lower, and every later generation would start
// on what it wrote, with no snapshot of it.
//
// LockLower makes the checkout read-only where everyone sees it: a bind
// of the checkout on itself, remounted read-only, in shim's mount
// namespace (and so in every namespace copied from it later: a
// generation's, a `docker exec`'s). Root cannot write through it either;
// an unprivileged process cannot remove it or make it writable (no
// CAP_SYS_ADMIN), not even in a user namespace of its own, where the
// copied mount is locked read-only. Shim itself reads and writes the
// checkout through a second bind, the view, under the layers dir
// (<layers>/lower/<key>, never bound into a generation: the layers dir is
// hidden from them). Only root and the group LowerGroup may enter
// <layers>/lower: shim's gits run as the owner with that group (and out of
// the harness's reach, gitguard.OwnerCaps); the harness's uid without it
// cannot.

// lowerDir holds the writable views of the locked lowers.
func (l *Layers) lowerDir() string { return filepath.Join(l.cfg.Dir, "lower") }

// LowerView is where shim reads and writes the locked checkout at path.
func (l *Layers) LowerView(path string) string {
	return filepath.Join(l.lowerDir(), WorktreeKey(path))
}

// lowerLock is what LockLower made: the mounts CheckLower confirms.
type lowerLock struct {
	view       string
	lockMnt    uint64 // the read-only bind at the worktree's path
	viewMnt    uint64 // the writable bind at the view
	dev, inode uint64 // the checkout's top directory
}

// LockLower locks the checkout at path (see above) and returns its view.
// Locking a checkout locked already (by this shim, or by a previous one in
// the same mount namespace) only confirms the lock.
func (l *Layers) LockLower(path string) (string, error) {
	path = filepath.Clean(path)
	if err := l.Prepare(); err != nil {
		return "", err
	}
	view := l.LowerView(path)
	l.mu.Lock()
	defer l.mu.Unlock()
	if lk, err := inspectLock(path, view); err == nil && l.viewDirOK() {
		l.locks[path] = lk
		return view, nil
	}
	// The layers dir itself only needs to be passable (its other
	// entries are root's, 0700); the views' dir is root's and the
	// group's.
	if err := os.Chmod(l.cfg.Dir, 0o711); err != nil {
		return "", err
	}
	if err := os.MkdirAll(l.lowerDir(), 0o750); err != nil {
		return "", err
	}
	if err := kernel.chown(l.lowerDir(), 0, int(l.cfg.LowerGroup)); err != nil {
		return "", err
	}
	if err := os.Chmod(l.lowerDir(), 0o750); err != nil {
		return "", err
	}
	if err := os.Mkdir(view, 0o700); err != nil && !os.IsExist(err) {
		return "", err
	}
	unmount(view) // a half-made lock of a previous attempt
	var owner unix.Stat_t
	if err := unix.Stat(path, &owner); err != nil {
		return "", fmt.Errorf("lock the lower %s: %w", path, err)
	}
	if err := passable(l.cfg.Dir, owner.Uid, owner.Gid, l.cfg.LowerGroup); err != nil {
		return "", fmt.Errorf("lock the lower %s: shim's gits run as its owner (uid %d) and cannot reach the layers dir: %w", path, owner.Uid, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return "", fmt.Errorf("lock the lower %s: %w", path, err)
	}
	if fs.Flags&unix.ST_RDONLY != 0 {
		// A lock half made (its view gone) or a checkout mounted
		// read-only: shim could not write the snapshots through a view
		// of it.
		return "", fmt.Errorf("lock the lower %s: it is read-only already, so shim cannot keep a writable view of it (a lock left half made: restart the sandbox)", path)
	}
	// The view first, while the checkout is still its writable self.
	if err := kernel.mount(path, view, "", unix.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("lock the lower %s: bind its view: %w", path, err)
	}
	if err := kernel.mount(path, path, "", unix.MS_BIND, ""); err != nil {
		unmount(view)
		return "", fmt.Errorf("lock the lower %s: bind it on itself: %w", path, err)
	}
	// A remount of a bind keeps the flags it names only: the checkout's
	// own (nosuid, nodev, noexec, atime) are named again, or a user
	// namespace's locked flags would refuse it.
	flags := uintptr(unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY) | keptFlags(fs.Flags)
	if err := kernel.mount("", path, "", flags, ""); err != nil {
		_ = kernel.unmount(path, unix.MNT_DETACH)
		unmount(view)
		return "", fmt.Errorf("lock the lower %s: make it read-only: %w", path, err)
	}
	lk, err := inspectLock(path, view)
	if err != nil {
		_ = kernel.unmount(path, unix.MNT_DETACH)
		unmount(view)
		return "", fmt.Errorf("lock the lower %s: %w", path, err)
	}
	l.locks[path] = lk
	return view, nil
}

// CheckLower confirms that the lock LockLower made on path still holds:
// the same read-only mount at path, the same view, both the same
// directory. A lower whose lock is gone may have been written by anyone.
func (l *Layers) CheckLower(path string) error {
	path = filepath.Clean(path)
	l.mu.Lock()
	want, ok := l.locks[path]
	l.mu.Unlock()
	if !ok {
		return fmt.Errorf("the lower %s is not locked", path)
	}
	got, err := inspectLock(path, want.view)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("the lower %s is not the one locked: its mounts or directory changed (%+v, locked %+v)", path, got, want)
	}
	return nil
}

// inspectLock reads the lock of path as it is: its read-only mount and
// its view, which must be the same directory.
func inspectLock(path, view string) (lowerLock, error) {
	lk := lowerLock{view: view}
	var ps, vs unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_MNT_ID, &ps); err != nil {
		return lk, err
	}
	if err := unix.Statx(unix.AT_FDCWD, view, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_MNT_ID, &vs); err != nil {
		return lk, err
	}
	if ps.Mask&unix.STATX_MNT_ID == 0 || vs.Mask&unix.STATX_MNT_ID == 0 {
		return lk, fmt.Errorf("the kernel does not report mount ids (statx STATX_MNT_ID)")
	}
	if ps.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 &&
		(ps.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 || vs.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0) {
		return lk, fmt.Errorf("%s or its view is not a mount of its own", path)
	}
	if ps.Dev_major != vs.Dev_major || ps.Dev_minor != vs.Dev_minor || ps.Ino != vs.Ino {
		return lk, fmt.Errorf("the view %s is not the checkout %s", view, path)
	}
	if ps.Mnt_id == vs.Mnt_id {
		return lk, fmt.Errorf("%s has no read-only mount of its own", path)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return lk, err
	}
	if fs.Flags&unix.ST_RDONLY == 0 {
		return lk, fmt.Errorf("%s is writable", path)
	}
	if err := unix.Statfs(view, &fs); err != nil {
		return lk, err
	}
	if fs.Flags&unix.ST_RDONLY != 0 {
		return lk, fmt.Errorf("the view %s is read-only", view)
	}
	lk.lockMnt, lk.viewMnt = ps.Mnt_id, vs.Mnt_id
	lk.dev, lk.inode = unix.Mkdev(ps.Dev_major, ps.Dev_minor), ps.Ino
	return lk, nil
}

// keptFlags are the mount flags (from statfs) a remount must name again.
func keptFlags(st int64) uintptr {
	var f uintptr
	for _, m := range []struct {
		st int64
		ms uintptr
	}{
		{unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV}, {unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if st&m.st != 0 {
			f |= m.ms
		}
	}
	return f
}

// viewDirOK reports whether the views' dir is root's and LowerGroup's,
// mode 0750: no one else may enter it.
func (l *Layers) viewDirOK() bool {
	var st unix.Stat_t
	if err := unix.Lstat(l.lowerDir(), &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Uid == 0 && st.Gid == l.cfg.LowerGroup && st.Mode&0o7777 == 0o750
}

// LowerGroup is the group that may enter the locked lowers' views.
func (l *Layers) LowerGroup() uint32 { return l.cfg.LowerGroup }

// passable reports why a process of uid, gid and the supplementary group
// group cannot pass through every directory from / down to dir (dir's
// mode is shim's to set), nil when it can.
func passable(dir string, uid, gid, group uint32) error {
	p := filepath.Clean(dir)
	for p = filepath.Dir(p); ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return err
		}
		var bit uint32 = 0o001
		switch {
		case uid == 0:
			bit = 0
		case st.Uid == uid:
			bit = 0o100
		case st.Gid == gid || st.Gid == group:
			bit = 0o010
		}
		if bit != 0 && st.Mode&bit == 0 {
			return fmt.Errorf("%s (mode %o, owner %d:%d) is not passable by it", p, st.Mode&0o7777, st.Uid, st.Gid)
		}
		if p == "/" {
			return nil
		}
	}
}

// UnlockLower undoes LockLower on path (the sandbox lost its layers: the
// generations that follow work in the checkout itself).
func (l *Layers) UnlockLower(path string) error {
	path = filepath.Clean(path)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.locks[path]; !ok {
		return nil
	}
	if err := kernel.unmount(path, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unlock the lower %s: %w", path, err)
	}
	unmount(l.LowerView(path))
	delete(l.locks, path)
	return nil
}
