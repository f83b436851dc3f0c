package gitguard

import (
	"sync"

	"golang.org/x/sys/unix"
)

// OwnerCaps is the capability every process shim runs as a worktree's
// owner outside a generation carries, ambient (inherited by every process
// that git starts): one that grants next to nothing,
// CAP_NET_BIND_SERVICE (else CAP_AUDIT_WRITE; Docker's default set has
// both).
//
// It is there for what holding it does, not for what it allows: a process
// that holds a capability its caller lacks is out of the caller's reach,
// even at the same uid. The kernel refuses ptrace and every /proc/<pid>
// link (root, cwd, fd, mem, environ) to a caller whose capabilities are
// not a superset of the target's (cap_ptrace_access_check), so a harness
// cannot write the checkout through a git of shim's, nor take that git
// over with its network and broker grant. It is nil when shim has
// neither; such a git is refused (runtime's git runner checks
// OwnerProtected).
func OwnerCaps() []uintptr {
	capsOnce.Do(func() {
		for _, c := range []uintptr{unix.CAP_NET_BIND_SERVICE, unix.CAP_AUDIT_WRITE} {
			if hasCap(c) {
				ownerCaps = []uintptr{c}
				return
			}
		}
	})
	return ownerCaps
}

var (
	capsOnce  sync.Once
	ownerCaps []uintptr
)

// hasCap reports whether c is in shim's permitted and bounding sets.
func hasCap(c uintptr) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	if data[c/32].Permitted&(1<<(c%32)) == 0 {
		return false
	}
	in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, c, 0, 0, 0)
	return err == nil && in == 1
}

// OwnerProtected reports whether cmd, if it runs as another uid than
// root, carries every one of OwnerCaps: the rule that no process shim
// starts as a harness's uid outside a generation is within that
// harness's reach.
func OwnerProtected(uid uint32, ambient []uintptr) bool {
	if uid == 0 {
		return true
	}
	want := OwnerCaps()
	if len(want) == 0 {
		return false
	}
	for _, w := range want {
		found := false
		for _, a := range ambient {
			found = found || a == w
		}
		if !found {
			return false
		}
	}
	return true
}
