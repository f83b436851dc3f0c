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

// A restore that moves a lower first lets go of every namespace an earlier
// announcement is still letting go of in the background: when now returns,
// all of them are closed.
func TestLowerMovesOnlyOnceEveryHeldNamespaceIsGone(t *testing.T) {
	var r releasing
	var hs []*heldMounts
	for i := 0; i < 50; i++ {
		f, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, &heldMounts{f: f})
	}
	r.later(hs[:25])
	r.later(hs[25:])
	r.now()
	for i, h := range hs {
		if err := h.f.Close(); err == nil {
			t.Errorf("namespace %d still open after now", i)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pending) != 0 {
		t.Errorf("%d still pending", len(r.pending))
	}
}
