package integration

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/shimdev/shim/internal/testutil"
)

// TestReachProbeSeesWhatTheKernelRefuses runs shim's reach probe (the
// start-up check behind status's OWNER_GIT_* codes; docs: README,
// "Security notes") as a capless process of uid 65534 against a git of
// that uid waiting on its stdin: a plain git is open to it in every way
// (the control), one started as shim starts an owner's git (an ambient
// capability) in none. Under gVisor the matrix's row runs the same probe
// through shim's start-up.
func TestReachProbeSeesWhatTheKernelRefuses(t *testing.T) {
	testutil.NeedRoot(t)
	git := testutil.NeedTool(t, "git")
	cred := &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}
	for _, c := range []struct {
		ambient []uintptr
		want    string
	}{
		{nil, "open: ptrace mem root cwd fd environ"},
		{[]uintptr{10 /* CAP_NET_BIND_SERVICE */}, "open:"},
	} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		target := exec.Command(git, "hash-object", "--stdin")
		target.Dir, target.Stdin, target.Env = "/", r, []string{"HOME=/nonexistent"}
		target.SysProcAttr = &syscall.SysProcAttr{Credential: cred, AmbientCaps: c.ambient}
		if err := target.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		reach := exec.Command(shimBin, "__reach", strconv.Itoa(target.Process.Pid))
		reach.Dir = "/"
		reach.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := reach.Output()
		w.Close()
		target.Wait()
		if err != nil || strings.TrimSpace(string(out)) != c.want {
			t.Errorf("ambient %v: reach probe said %q (%v), want %q", c.ambient, out, err, c.want)
		}
	}
}
