package gitguard

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// How shim keeps the gits it runs as a worktree's owner out of reach of a
// harness of that uid (OwnerGuard.Mode).
const (
	// GuardAmbientCap: each such git carries one ambient capability
	// (OwnerCaps); the kernel refuses ptrace and every /proc/<pid> link
	// to a process lacking it.
	GuardAmbientCap = "ambient_cap"
	// GuardPtraceScope: ambient capabilities cannot be given here (gVisor
	// has no PR_CAP_AMBIENT), but the runtime itself refuses a process
	// that is not git's ancestor its ptrace and /proc/<pid>/mem, root and
	// cwd (gVisor applies YAMA's relational ptrace scope to those links
	// too). What else it leaves open is in the guard's Reason.
	GuardPtraceScope = "ptrace_scope"
	// GuardNone: neither; such gits run within a same-uid harness's reach.
	GuardNone = "none"
)

// OwnerGuard is how shim's gits of a worktree's owner are kept out of
// that uid's reach, decided once at start-up (DecideOwnerGuard).
type OwnerGuard struct {
	Mode string
	// Caps are the ambient capabilities each such git carries (Mode
	// GuardAmbientCap only).
	Caps []uintptr
	// Reason says why the mode is not GuardAmbientCap, and what the
	// probe found open.
	Reason string
}

// OwnerProbe is what DecideOwnerGuard asks the kernel: the runtime's
// start-up probe, a fake in tests.
type OwnerProbe interface {
	// Start starts git as an unprivileged uid with ambient as its
	// ambient capabilities, as shim starts an owner's git, and waits for
	// it.
	Start(ambient []uintptr) error
	// Reach starts git as an unprivileged uid without capabilities and,
	// beside it (not its ancestor), a capless process of the same uid
	// that tries every way into it. It returns what that process could
	// open ("ptrace", "mem", "root", "cwd", "fd", "environ").
	Reach() (open []string, err error)
}

// guarded are the reaches the ptrace_scope guard must find refused: with
// any of them a harness could enter git's view or take git over.
var guarded = []string{"ptrace", "mem", "root", "cwd"}

// DecideOwnerGuard picks the owner guard: the ambient capability where a
// git can be started with it; else, when the same git starts without it
// (the raise is what fails), the runtime's own rule where the probe finds
// every guarded reach refused; else none. A probe git that cannot start
// at all says nothing about the capability: the guard stays the ambient
// capability (every owner's git still carries it, and fails loudly if it
// cannot), with the reason; so it does when the git with the capability
// failed other than by the raise's EINVAL or EPERM. It never reports a protection the probe did
// not see.
func DecideOwnerGuard(caps []uintptr, p OwnerProbe) OwnerGuard {
	var why string
	if len(caps) == 0 {
		why = "shim holds neither CAP_NET_BIND_SERVICE nor CAP_AUDIT_WRITE to give its gits"
	} else if err := p.Start(caps); err == nil {
		return OwnerGuard{Mode: GuardAmbientCap, Caps: caps}
	} else if !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.EPERM) {
		// Not the raise's refusal (a git killed by a process of the probe's
		// uid, a timeout, EAGAIN): nothing learnt, and nothing weakened on it.
		return OwnerGuard{Mode: GuardAmbientCap, Caps: caps,
			Reason: fmt.Sprintf("not probed: the probe's git failed other than by the capability's raise (%v)", err)}
	} else if cerr := p.Start(nil); cerr != nil {
		return OwnerGuard{Mode: GuardAmbientCap, Caps: caps,
			Reason: fmt.Sprintf("not probed: the probe's git could not start even without the capability (%v)", cerr)}
	} else {
		why = fmt.Sprintf("a git of another uid cannot be started with an ambient capability here (%v; gVisor has no PR_CAP_AMBIENT)", err)
	}
	open, err := p.Reach()
	if err != nil {
		return OwnerGuard{Mode: GuardNone, Reason: why + "; the check of the runtime's own ptrace rule failed: " + err.Error()}
	}
	var reached []string
	for _, g := range guarded {
		for _, o := range open {
			if o == g {
				reached = append(reached, g)
			}
		}
	}
	if len(reached) > 0 {
		return OwnerGuard{Mode: GuardNone, Reason: why + "; a process of the same uid reached a git of shim's: " + strings.Join(open, ", ")}
	}
	r := why + "; the runtime refuses a process of the same uid that is not git's ancestor its ptrace and /proc/<pid>/mem, root and cwd"
	if len(open) > 0 {
		r += ", but not its /proc/<pid>/" + strings.Join(open, ", /proc/<pid>/")
	}
	return OwnerGuard{Mode: GuardPtraceScope, Reason: r}
}

// guard is the decided OwnerGuard; nil until SetOwnerGuard (then the
// ambient capability is required, as OwnerCaps finds it).
var guard atomic.Pointer[OwnerGuard]

// SetOwnerGuard installs the start-up decision.
func SetOwnerGuard(g OwnerGuard) { guard.Store(&g) }

// CurrentOwnerGuard is the installed guard, or the ambient capability's
// (none when shim has no capability to give) before one is installed.
func CurrentOwnerGuard() OwnerGuard {
	if g := guard.Load(); g != nil {
		return *g
	}
	if c := CapsHeld(); len(c) > 0 {
		return OwnerGuard{Mode: GuardAmbientCap, Caps: c}
	}
	return OwnerGuard{Mode: GuardNone, Reason: "not probed; shim holds neither capability"}
}

// OwnerCaps are the ambient capabilities every process shim runs as a
// worktree's owner outside a generation carries (inherited by every
// process that git starts): under GuardAmbientCap one that grants next to
// nothing, CAP_NET_BIND_SERVICE (else CAP_AUDIT_WRITE; Docker's default
// set has both); nil under the other guards.
//
// It is there for what holding it does, not for what it allows: a process
// that holds a capability its caller lacks is out of the caller's reach,
// even at the same uid. The kernel refuses ptrace and every /proc/<pid>
// link (root, cwd, fd, mem, environ) to a caller whose capabilities are
// not a superset of the target's (cap_ptrace_access_check), so a harness
// cannot write the checkout through a git of shim's, nor take that git
// over with its network and broker grant.
func OwnerCaps() []uintptr {
	g := CurrentOwnerGuard()
	if g.Mode != GuardAmbientCap {
		return nil
	}
	return g.Caps
}

// CapsHeld is the one capability OwnerCaps would give (nil when shim has
// neither), whether or not a git can be started with it here.
func CapsHeld() []uintptr {
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

// OwnerProtected reports whether a git to run as uid with ambient carries
// what the owner guard requires: nothing for root; every one of OwnerCaps
// under GuardAmbientCap; and, before a guard was decided, the ambient
// capability too (none held: refused). Under GuardPtraceScope and
// GuardNone there is nothing more a git can carry, and status says which
// guard holds.
func OwnerProtected(uid uint32, ambient []uintptr) bool {
	if uid == 0 {
		return true
	}
	g := CurrentOwnerGuard()
	if guard.Load() != nil && g.Mode != GuardAmbientCap {
		return true
	}
	if len(g.Caps) == 0 {
		return false
	}
	for _, w := range g.Caps {
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

// GitPath is the git shim runs, found in the hardened PATH.
func GitPath() (string, error) { return lookPath("git") }
