package sandbox

import (
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// MountNS is a private mount namespace of one locked thread of this
// process: what Do runs there mounts where no other process (the host's
// namespace included) sees it. The thread, and the namespace with it,
// ends at Close (its goroutine returns still locked, so the runtime ends
// the thread). For benchmarks and tests that mount overlays beside shim.
type MountNS struct {
	reqs chan func()
	once sync.Once
}

// NewMountNS unshares a mount namespace on a new locked thread and makes
// every mount in it private.
func NewMountNS() (*MountNS, error) {
	ns := &MountNS{reqs: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- fmt.Errorf("make mounts private: %w", err)
			return
		}
		errc <- nil
		for fn := range ns.reqs {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return ns, nil
}

// Do runs fn on the namespace's thread (a process it starts is in the
// namespace too) and returns its error.
func (ns *MountNS) Do(fn func() error) error {
	errc := make(chan error, 1)
	ns.reqs <- func() { errc <- fn() }
	return <-errc
}

// Close ends the thread and its namespace (its mounts with it, once no
// process it started holds them).
func (ns *MountNS) Close() { ns.once.Do(func() { close(ns.reqs) }) }
