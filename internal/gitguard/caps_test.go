package gitguard

import (
	"os/exec"
	"strconv"
	"syscall"
	"testing"

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
