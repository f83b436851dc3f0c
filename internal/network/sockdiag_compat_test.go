package network

import (
	"fmt"
	"sort"
	"testing"

	"golang.org/x/sys/unix"
)

// From the adversarial review of the one-walk TCP dump: the compat dump (one walk, AF_UNSPEC) lists exactly what the
// two v2 dumps list, for IPv4, IPv6, closed-after-send (FIN_WAIT with
// queued bytes) and MPTCP subflows.
func TestCompatDumpIsTheV2Dumps(t *testing.T) {
	g := newTestCgroup(t)
	s4, s6 := newSink(t), newSinkOn(t, "tcp6", "[::1]:0")
	queuedSender(t, g, s4, 0, 1<<20, false, false)
	queuedSender(t, g, s6, 0, 1<<20, false, false)
	queuedSender(t, g, s4, 1, 1<<20, true, false)
	queuedSender(t, g, s6, 1, 1<<20, true, false)
	queuedSender(t, g, s4, 2, 1<<20, false, true)
	g.freeze(t)
	d, err := openDiag(-1)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	key := func(s diagSock) string {
		return fmt.Sprintf("%d %d %s->%s", s.family, s.state, s.addr(s.id.src, s.id.sport), s.addr(s.id.dst, s.id.dport))
	}
	both, err := d.dumpAll(tcpDiagGetSock, unix.IPPROTO_TCP, cgroupSet{g.id})
	if err != nil {
		t.Fatal(err)
	}
	var a, b []string
	for _, s := range both {
		a = append(a, key(s))
	}
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := d.dump(fam, unix.IPPROTO_TCP, cgroupSet{g.id})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range socks {
			b = append(b, key(s))
		}
	}
	sort.Strings(a)
	sort.Strings(b)
	t.Logf("compat: %v", a)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("compat dump %v\nv2 dumps %v", a, b)
	}
	if _, err := DestroySockets(g.id, -1); err != nil {
		t.Errorf("DestroySockets: %v", err)
	}
}
