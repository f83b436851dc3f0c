package gitguard

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/internal/testutil"
)

// TestOwnerCapsPutAGitOutOfTheHarnesssReach starts a process as git is
// started (the owner's uid, OwnerCaps ambient) and tries to reach into it
// from a process of the same uid without capabilities, as a harness
// would: its /proc/<pid>/cwd, root, fd and environ are refused. The
// control, the same process without OwnerCaps, is open to it.
func TestOwnerCapsPutAGitOutOfTheHarnesssReach(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.NeedTool(t, "setpriv")
	testutil.Need(t, len(OwnerCaps()) == 1, "shim has neither CAP_NET_BIND_SERVICE nor CAP_AUDIT_WRITE here")
	const uid = 65534
	for _, protected := range []bool{true, false} {
		target := exec.Command("sleep", "1000")
		target.Dir = "/tmp"
		target.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
		if protected {
			target.SysProcAttr.AmbientCaps = OwnerCaps()
		}
		if err := target.Start(); err != nil {
			t.Fatal(err)
		}
		pid := strconv.Itoa(target.Process.Pid)
		for _, probe := range []string{"readlink /proc/" + pid + "/cwd", "ls /proc/" + pid + "/root/", "ls -l /proc/" + pid + "/fd/", "cat /proc/" + pid + "/environ"} {
			out, err := exec.Command("setpriv", "--reuid", strconv.Itoa(uid), "--regid", strconv.Itoa(uid), "--clear-groups",
				"--inh-caps=-all", "sh", "-c", probe+" >/dev/null").CombinedOutput()
			if protected && err == nil {
				t.Errorf("with OwnerCaps: a process of the same uid reached it: %s", probe)
			}
			if !protected && err != nil {
				t.Errorf("control, without OwnerCaps: %s was refused: %v %s", probe, err, out)
			}
		}
		target.Process.Kill()
		target.Wait()
	}
}

// TestOwnerProtectedIsTheRule: a process as another uid than root is
// protected only with every one of OwnerCaps.
func TestOwnerProtectedIsTheRule(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.Need(t, len(OwnerCaps()) == 1, "shim has neither capability here")
	if !OwnerProtected(0, nil) {
		t.Error("root needs no capability")
	}
	if OwnerProtected(1000, nil) {
		t.Error("a uid without OwnerCaps counted as protected")
	}
	if !OwnerProtected(1000, OwnerCaps()) {
		t.Error("a uid with OwnerCaps counted as unprotected")
	}
}

// fakeOwnerProbe answers DecideOwnerGuard's questions and counts them.
type fakeOwnerProbe struct {
	raiseErr          error // Start with capabilities
	startErr          error // Start without
	open              []string
	reachErr          error
	raised, reachCall int
}

func (f *fakeOwnerProbe) Start(ambient []uintptr) error {
	if len(ambient) == 0 {
		return f.startErr
	}
	f.raised++
	return f.raiseErr
}

func (f *fakeOwnerProbe) Reach() ([]string, error) { f.reachCall++; return f.open, f.reachErr }

// TestDecideOwnerGuardFallsBackOnlyWhenTheRaiseFails: the ambient
// capability wherever a git starts with it (the runtime's rule is then
// not even asked: the control); the runtime's own rule only when the
// raise fails (gVisor: EINVAL) and every guarded reach is refused; none
// otherwise, never a protection the probe did not see.
func TestDecideOwnerGuardFallsBackOnlyWhenTheRaiseFails(t *testing.T) {
	caps := []uintptr{unix.CAP_NET_BIND_SERVICE}
	for _, c := range []struct {
		name    string
		caps    []uintptr
		probe   fakeOwnerProbe
		mode    string
		reached bool     // Reach was asked
		inWhy   []string // in the Reason
	}{
		{"raise works", caps, fakeOwnerProbe{open: []string{"ptrace"}}, GuardAmbientCap, false, nil},
		{"raise EINVAL, runtime refuses", caps, fakeOwnerProbe{raiseErr: syscall.EINVAL, open: []string{"fd", "environ"}},
			GuardPtraceScope, true, []string{"invalid argument", "/proc/<pid>/fd, /proc/<pid>/environ"}},
		{"raise EINVAL, all refused", caps, fakeOwnerProbe{raiseErr: syscall.EINVAL}, GuardPtraceScope, true, []string{"ptrace and /proc/<pid>/mem, root and cwd"}},
		{"raise EINVAL, root reached", caps, fakeOwnerProbe{raiseErr: syscall.EINVAL, open: []string{"root", "fd"}}, GuardNone, true, []string{"reached a git of shim's: root, fd"}},
		{"raise EINVAL, ptrace reached", caps, fakeOwnerProbe{raiseErr: syscall.EINVAL, open: []string{"ptrace"}}, GuardNone, true, nil},
		{"raise EINVAL, probe failed", caps, fakeOwnerProbe{raiseErr: syscall.EINVAL, reachErr: errors.New("exec: permission denied")}, GuardNone, true, []string{"permission denied"}},
		{"no capability held", nil, fakeOwnerProbe{}, GuardPtraceScope, true, []string{"neither CAP_NET_BIND_SERVICE"}},
		// The probe's git cannot start at all (a guest whose uid 65534
		// may not execute it): nothing learnt, the capability kept.
		{"git not startable", caps, fakeOwnerProbe{raiseErr: syscall.EACCES, startErr: syscall.EACCES}, GuardAmbientCap, false, []string{"not probed", "permission denied"}},
		// The git with the capability killed (a process of the probe's uid
		// may signal it) while the same git without it starts: not the
		// raise, so no weaker guard. Control: the raise's EINVAL above.
		{"git killed, not the raise", caps, fakeOwnerProbe{raiseErr: errors.New("signal: killed")}, GuardAmbientCap, false, []string{"not probed", "killed"}},
		{"git timed out", caps, fakeOwnerProbe{raiseErr: context.DeadlineExceeded}, GuardAmbientCap, false, []string{"not probed"}},
	} {
		p := c.probe
		g := DecideOwnerGuard(c.caps, &p)
		if g.Mode != c.mode || (p.reachCall > 0) != c.reached {
			t.Errorf("%s: mode %s (reach asked %d times), want %s (asked: %v)", c.name, g.Mode, p.reachCall, c.mode, c.reached)
		}
		if len(c.caps) == 0 && p.raised != 0 {
			t.Errorf("%s: a raise was tried without a capability", c.name)
		}
		if (g.Mode == GuardAmbientCap) != (len(g.Caps) > 0) || (g.Mode != GuardAmbientCap && g.Reason == "") {
			t.Errorf("%s: %+v: caps and reason must go with the mode", c.name, g)
		}
		for _, w := range c.inWhy {
			if !strings.Contains(g.Reason, w) {
				t.Errorf("%s: reason %q lacks %q", c.name, g.Reason, w)
			}
		}
	}
}

// TestOwnerProtectedFollowsTheInstalledGuard: under the ambient guard a
// git of another uid without the capability is refused; under the
// fallbacks it carries none and runs (status names the guard).
func TestOwnerProtectedFollowsTheInstalledGuard(t *testing.T) {
	defer guard.Store(nil)
	SetOwnerGuard(OwnerGuard{Mode: GuardAmbientCap, Caps: []uintptr{unix.CAP_AUDIT_WRITE}})
	if OwnerProtected(1000, nil) || !OwnerProtected(1000, []uintptr{unix.CAP_AUDIT_WRITE}) || !OwnerProtected(0, nil) {
		t.Error("ambient guard: only a git with the capability (or root's) passes")
	}
	if got := OwnerCaps(); len(got) != 1 || got[0] != unix.CAP_AUDIT_WRITE {
		t.Errorf("OwnerCaps %v", got)
	}
	for _, m := range []string{GuardPtraceScope, GuardNone} {
		SetOwnerGuard(OwnerGuard{Mode: m, Reason: "probe"})
		if OwnerCaps() != nil || !OwnerProtected(1000, nil) {
			t.Errorf("%s: OwnerCaps %v, a capless git refused", m, OwnerCaps())
		}
	}
}
