package network

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Network namespaces are per thread. Every helper here moves only a thread
// it locked for itself and either moves it back or leaves it locked so the
// Go runtime ends it with its goroutine: an unlocked thread is therefore
// always in shim's own network namespace, and so is every socket the rest of
// the program (including the proxy's upstream dials) creates.

// newNetns creates a network namespace held only by the returned fd (no bind
// mount under /run/netns, so nothing outlives shim or the fd).
func newNetns() (netns.NsHandle, error) {
	var h netns.NsHandle = -1
	err := onLockedThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		var err error
		h, err = netns.Get()
		return err
	})
	if err != nil {
		if h.IsOpen() {
			h.Close()
		}
		return -1, err
	}
	return h, nil
}

// runIn calls fn on a locked thread that has joined ns, then moves the
// thread back. If fn fails the thread is still moved back; if moving back
// fails the thread is left locked and dies with its goroutine.
func runIn(ns netns.NsHandle, fn func() error) error {
	return onLockedThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("setns into generation namespace: %w", err)
		}
		return fn()
	})
}

// errThreadLost marks that a thread could not be returned to shim's
// namespace; it was discarded.
var errThreadLost = errors.New("could not return thread to shim's network namespace; thread discarded")

// onLockedThread runs fn on a fresh goroutine locked to its thread, and
// restores the thread's network namespace afterwards (fn may change it).
// A panic in fn is turned into an error.
func onLockedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		defer orig.Close()
		ferr := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic in namespace function: %v", r)
				}
			}()
			return fn()
		}()
		if err := netns.Set(orig); err != nil {
			// Stay locked: the runtime terminates the thread when this
			// goroutine returns, so it never runs other goroutines.
			errc <- errors.Join(ferr, errThreadLost)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// nsInode returns the inode number that identifies the namespace of fd (what
// `ls -l /proc/PID/ns/net` shows).
func nsInode(h netns.NsHandle) uint64 {
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		return 0
	}
	return st.Ino
}
