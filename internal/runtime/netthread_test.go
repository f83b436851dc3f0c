package runtime

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/network"
	"github.com/shimdev/shim/internal/testutil"
)

// The gits without network are forked in the one empty network made for
// them: every child in that namespace, none in shim's.
func TestGitsAreForkedInTheirEmptyNetwork(t *testing.T) {
	testutil.NeedRoot(t)
	n, err := network.New(0, network.Config{Mode: network.ModeNone})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	spawn := spawnIn(n, func(c *exec.Cmd, _ cgroup.Group) (*exec.Cmd, error) { return c, c.Start() })
	child := func() string {
		t.Helper()
		var out strings.Builder
		c := exec.Command("/bin/sh", "-c", "readlink /proc/self/ns/net; grep -c : /proc/net/dev")
		c.Stdout = &out
		if _, err := spawn(c, nil); err != nil {
			t.Fatal(err)
		}
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	a, b := child(), child()
	if a != b || strings.HasPrefix(a, own) {
		t.Errorf("children saw %q and %q (shim is in %s): want one namespace of their own", a, b, own)
	}
	if !strings.HasSuffix(a, "\n1\n") {
		t.Errorf("the namespace has interfaces besides lo: %q", a)
	}
}
