package layers

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// kernel holds the package's privileged calls: mounts, unmounts, chowns
// and the pivot. They are function values so that the decisions around
// them (what is mounted where, with which options, in which order, what
// is undone when one fails) are unit-tested without root against a fake
// that records them (kernel_test.go); the real-kernel tests, as root, prove
// that the calls do what the fake claims. Nothing but tests changes them.
var kernel = struct {
	mount     func(source, target, fstype string, flags uintptr, data string) error
	unmount   func(target string, flags int) error
	chown     func(path string, uid, gid int) error
	lchown    func(path string, uid, gid int) error
	pivot     func(root string) error
	mountinfo func(path string) ([]mountEntry, error)
}{
	mount: unix.Mount, unmount: unix.Unmount, chown: os.Chown, lchown: os.Lchown,
	pivot: pivot, mountinfo: readMountinfo,
}

// mountLayer mounts a layer's tmpfs of size bytes at dir in shim's
// mount namespace, with subs made in it: its own, so that a kept layer
// never takes room from the next generation's. What was at dir (a start
// of this generation that failed half-way) goes first.
func mountLayer(dir string, size int64, subs ...string) error {
	unmount(dir)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// Inodes are bounded too (one per 4 KiB of the size, as for a disk):
	// empty files cost no blocks but kernel memory.
	inodes := max(size/4096, 1024)
	opts := "mode=0700,size=" + strconv.FormatInt(size, 10) + ",nr_inodes=" + strconv.FormatInt(inodes, 10)
	if err := kernel.mount("shim-layer", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount a layer's tmpfs on %s: %w", dir, err)
	}
	for _, s := range subs {
		if err := os.Mkdir(filepath.Join(dir, s), 0o700); err != nil {
			return err
		}
	}
	return nil
}

// unmount detaches every mount at dir.
func unmount(dir string) {
	for mounted(dir) {
		if kernel.unmount(dir, unix.MNT_DETACH) != nil {
			return
		}
	}
}

// mounted reports whether path is a mount point (its device differs from
// its parent's, or mountinfo lists it).
func mounted(path string) bool {
	// thread-self: the calling thread's mount namespace, which is not the
	// process's when a thread unshared its own (the tests do)
	ms, err := kernel.mountinfo("/proc/thread-self/mountinfo")
	if err != nil {
		return false
	}
	for _, m := range ms {
		if m.point == filepath.Clean(path) {
			return true
		}
	}
	return false
}
