package gitguard

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// threadIDs changes the ids the calling thread's permission checks use.
type threadIDs interface {
	take(uid, gid int) bool    // reports whether the thread now checks as uid, gid
	restore(uid, gid int) bool // reports whether it is back to uid, gid and its capabilities
}

// fsIDs uses setfsuid and setfsgid.
type fsIDs struct{}

// supported reports whether setfsuid works here (a query changes nothing).
func (fsIDs) supported() bool {
	_, err := unix.SetfsuidRetUid(-1)
	return err == nil
}

func (fsIDs) take(uid, gid int) bool {
	_, _ = unix.SetfsgidRetGid(gid)
	_, _ = unix.SetfsuidRetUid(uid)
	u, _ := unix.SetfsuidRetUid(-1)
	g, _ := unix.SetfsgidRetGid(-1)
	return u == uid && g == gid
}

func (f fsIDs) restore(uid, gid int) bool { return f.take(uid, gid) }

// effectiveIDs sets the thread's effective uid and gid (raw syscalls:
// unix.Setresuid would change every thread of the process).
type effectiveIDs struct {
	caps [2]unix.CapUserData // the thread's capabilities before take
}

func threadCaps(data *[2]unix.CapUserData) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	return unix.Capget(&hdr, &data[0])
}

func (e *effectiveIDs) take(uid, gid int) bool {
	if threadCaps(&e.caps) != nil {
		return false
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0)); errno != 0 {
		return false
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); errno != 0 {
		return false
	}
	_, eu, _ := unix.Getresuid()
	_, eg, _ := unix.Getresgid()
	return eu == uid && eg == gid
}

func (e *effectiveIDs) restore(uid, gid int) bool {
	_, _, e1 := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0))
	_, _, e2 := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0))
	_, eu, _ := unix.Getresuid()
	_, eg, _ := unix.Getresgid()
	var now [2]unix.CapUserData
	return e1 == 0 && e2 == 0 && eu == uid && eg == gid && threadCaps(&now) == nil && now == e.caps
}

// AsEffectiveIDs runs fn on a locked OS thread whose effective uid and gid
// are uid and gid (effectiveIDs; the rest of the process keeps its own):
// what fn does is checked, and credited (a connect's SO_PEERCRED), as
// that uid's. The thread goes back to the scheduler only once its ids and
// capabilities are back; if they cannot be, it ends with its goroutine.
func AsEffectiveIDs(uid, gid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ouid, ogid := unix.Geteuid(), unix.Getegid()
		e := &effectiveIDs{}
		var err error
		if !e.take(uid, gid) {
			err = fmt.Errorf("cannot take uid %d gid %d on a thread", uid, gid)
		} else {
			err = fn()
		}
		if e.restore(ouid, ogid) {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
