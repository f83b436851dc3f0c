package network

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"golang.org/x/sys/unix"
)

// sink is a loopback server with a tiny receive buffer that reads nothing
// until told to: a slow server whose client's bytes stay queued.
type sink struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []*net.TCPConn
}

func newSink(t testing.TB) *sink { return newSinkOn(t, "tcp4", "127.0.0.1:0") }

// newSinkOn is a sink listening on network and address (an IPv6 one:
// "tcp6", "[::1]:0").
func newSinkOn(t testing.TB, network, address string) *sink {
	t.Helper()
	// MPTCP where the kernel has it (Go's default for listeners): a
	// plain TCP client falls back to TCP, an MPTCP one gets MPTCP.
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		_ = c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
		return err
	}}
	return listenSink(t, lc, network, address)
}

// listenSink is a sink on a listener of lc.
func listenSink(t testing.TB, lc net.ListenConfig, network, address string) *sink {
	t.Helper()
	ln, err := lc.Listen(t.Context(), network, address)
	if err != nil {
		t.Fatal(err)
	}
	s := &sink{ln: ln}
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c.(*net.TCPConn))
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sink) addr() string { return s.ln.Addr().String() }

// conn waits for the i-th accepted connection.
func (s *sink) conn(t testing.TB, i int) *net.TCPConn {
	t.Helper()
	var c *net.TCPConn
	waitFor(t, 10*time.Second, fmt.Sprintf("sink connection %d", i), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.conns) > i {
			c = s.conns[i]
		}
		return c != nil
	})
	return c
}

// inq is how many bytes have arrived at c and are waiting to be read.
func inq(c *net.TCPConn) int64 {
	raw, _ := c.SyscallConn()
	n := -1
	_ = raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return int64(n)
}

// drain reads c until it ends and returns how many bytes it got and how it
// ended (nil for EOF).
func drain(t testing.TB, c *net.TCPConn) (int64, error) {
	t.Helper()
	n, err := drainFor(c, 20*time.Second)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection neither ended nor was reset after %d bytes", n)
	}
	return n, err
}

// drainFor reads c until it ends or d passes (then the error is a timeout).
func drainFor(c *net.TCPConn, d time.Duration) (int64, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	return io.Copy(io.Discard, c)
}

// dumpFor lists the sockets of cgroupID in the caller's namespace, without
// destroying anything.
func dumpFor(t testing.TB, cgroupID uint64, nsFd int) []diagSock {
	t.Helper()
	d, err := openDiag(nsFd)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	socks, err := d.dumpCgroup(cgroupSet{cgroupID})
	if err != nil {
		t.Fatal(err)
	}
	return socks
}

// queuedSender starts a "sender" child in g that writes size bytes to the
// sink, and waits until its bytes stop moving: the sink's receive buffer
// is full and the rest sits in the child's send queue. It returns the
// child's local address, its send queue and what the sink holds unread.
func queuedSender(t *testing.T, g *testCgroup, s *sink, i, size int, closeAfter, mptcp bool) (local string, wq, serverQueued int64) {
	t.Helper()
	env := []string{"SHIM_NET_TEST_ADDR=" + s.addr(), fmt.Sprintf("SHIM_NET_TEST_SIZE=%d", size)}
	if closeAfter {
		env = append(env, "SHIM_NET_TEST_CLOSE=1")
	}
	if mptcp {
		env = append(env, "SHIM_NET_TEST_MPTCP=1")
	}
	_, out := g.start(t, "sender", env, nil)
	line := readLine(t, out)
	local, ok := strings.CutPrefix(line, "local ")
	if !ok {
		t.Fatalf("sender: %s", line)
	}
	if closeAfter {
		if l := readLine(t, out); l != "closed" {
			t.Fatalf("sender: %s", l)
		}
	}
	sc := s.conn(t, i)
	wq = waitStable(t, "sender's send queue", func() int64 {
		for _, so := range dumpFor(t, g.id, -1) {
			if so.proto == unix.IPPROTO_TCP && so.addr(so.id.src, so.id.sport) == local {
				return int64(so.wqueue)
			}
		}
		return 0
	})
	serverQueued = waitStable(t, "sink's receive queue", func() int64 { return inq(sc) })
	return local, wq, serverQueued
}

// One walk of the kernel's TCP tables (the compat dump) finds a
// generation's IPv4 and IPv6 connections alike, and DestroySockets aborts
// both.
func TestDestroySocketsFindsBothFamiliesInOneWalk(t *testing.T) {
	g := newTestCgroup(t)
	s4, s6 := newSink(t), newSinkOn(t, "tcp6", "[::1]:0")
	l4, _, _ := queuedSender(t, g, s4, 0, 1<<20, false, false)
	l6, _, _ := queuedSender(t, g, s6, 0, 1<<20, false, false)
	g.freeze(t)
	d, err := openDiag(-1)
	if err != nil {
		t.Fatal(err)
	}
	both, err := d.dumpAll(tcpDiagGetSock, unix.IPPROTO_TCP, cgroupSet{g.id})
	d.close()
	if err != nil {
		t.Fatalf("the compat dump: %v", err)
	}
	families := map[uint8]bool{}
	for _, so := range both {
		families[so.family] = true
	}
	if !families[unix.AF_INET] || !families[unix.AF_INET6] {
		t.Fatalf("one walk found the families %v, want both", families)
	}
	conns, err := DestroySockets(g.id, -1)
	if err != nil {
		t.Fatalf("DestroySockets: %v", err)
	}
	got := map[string]string{}
	for _, c := range conns {
		got[c.Local] = c.Family
	}
	if got[l4] != "ipv4" || got[l6] != "ipv6" || len(conns) != 2 {
		t.Errorf("aborted %+v, want %s (ipv4) and %s (ipv6)", conns, l4, l6)
	}
	if left := dumpFor(t, g.id, -1); anyLive(left) {
		t.Errorf("sockets left after destroy: %+v", left)
	}
}

// TestDestroySocketsAbortsQueuedBytes is the guarantee and, beside it, the
// attack it stops. A child in a test cgroup writes 8 MiB to a loopback
// server that reads nothing, so megabytes sit in the child's send queue;
// the cgroup is frozen as a fence would freeze it.
//
//   - destroyed: DestroySockets reports the connection with its queued
//     bytes and aborts it; the server, reading at last, gets only what had
//     already reached its own receive buffer, then ECONNRESET (an RST from
//     the peer, not a local abort), and nothing more ever arrives.
//   - orphaned: the same, but the child closed its socket itself right
//     after writing (the kernel still flushes an orphan); the abort reaches
//     it too.
//   - mptcp: the child speaks MPTCP and its backlog sits above its only
//     subflow, a TCP socket of its cgroup that is aborted the same way; the
//     connection is reported as "mptcp" with the MPTCP level's backlog.
//     With no subflow left it delivers nothing more, not even once the
//     child is killed. This server's 4 KiB buffer overflows, so the
//     subflow ends with bytes the server dropped unacknowledged and the
//     server discards the RST that carries MP_FASTCLOSE (out of its
//     window): its MPTCP socket is not reset (TestDestroySocketsMPTCP has
//     the server that is).
//   - killed only (the control): no destroy, the frozen child is killed;
//     the server still receives every queued byte and a clean EOF. That is
//     the delivery after the fence the abort exists to prevent.
//
// A connection of the test's own cgroup to another server is untouched.
func TestDestroySocketsAbortsQueuedBytes(t *testing.T) {
	requireNetns(t)
	const size = 8 << 20
	echo := echoServer(t, "127.0.0.1:0")
	own, err := net.Dial("tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()

	for i, tc := range []struct {
		name                     string
		size                     int
		closeAfter, mptcp, abort bool
	}{
		{"destroyed", size, false, false, true},
		{"orphaned", 1 << 20, true, false, true},
		{"mptcp", size, false, true, true},
		{"killed only", size, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newTestCgroup(t)
			s := newSink(t)
			local, wq, queued := queuedSender(t, g, s, 0, tc.size, tc.closeAfter, tc.mptcp)
			t.Logf("child %s: %d bytes in its send queue, %d in the server's receive queue", local, wq, queued)
			if wq < 64<<10 && !tc.mptcp { // MPTCP keeps its backlog above the subflow
				t.Fatalf("only %d bytes queued at the sender; the test needs a backlog", wq)
			}
			g.freeze(t)
			if tc.abort {
				conns, err := DestroySockets(g.id, -1)
				if err != nil {
					t.Fatalf("DestroySockets: %v", err)
				}
				var c *api.Connection
				for i := range conns {
					if conns[i].Local == local {
						c = &conns[i]
					}
				}
				if c == nil || len(conns) != 1 {
					t.Fatalf("reported %+v, want only %s", conns, local)
				}
				wantState, wantProto, minQueue := "established", "tcp", uint32(1)
				if tc.closeAfter {
					wantState = "fin_wait1"
				}
				if tc.mptcp {
					wantProto, minQueue = "mptcp", 1<<20
				}
				if c.Via != ViaSocket || c.Protocol != wantProto || c.Family != "ipv4" || c.Remote != s.addr() || c.State != wantState ||
					c.SendQueue < minQueue || c.TCP == nil || c.TCP.BytesAcked <= 1 || !c.InFlight {
					t.Errorf("conn: %+v tcp %+v", *c, c.TCP)
				}
				t.Logf("reported: %+v tcp_info %+v", *c, *c.TCP)
				if left := dumpFor(t, g.id, -1); anyLive(left) {
					t.Errorf("sockets left after destroy: %+v", left)
				}
			} else {
				g.kill(t)
			}
			if tc.mptcp {
				// The server's MPTCP socket outlives the loss of its only
				// subflow, waiting for another that never comes: it sees
				// no reset, and must see no byte more after the kill.
				g.kill(t)
				got, err := drainFor(s.conn(t, 0), 2*time.Second)
				t.Logf("server read %d bytes, then %v", got, err)
				if got > queued {
					t.Errorf("server read %d bytes after the abort, only %d had reached it before", got, queued)
				}
				return
			}
			got, err := drain(t, s.conn(t, 0))
			t.Logf("server read %d bytes, then %v", got, err)
			if tc.abort {
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("server: %v, want connection reset by peer", err)
				}
				if got > queued {
					t.Errorf("server read %d bytes after the abort, only %d had reached it before", got, queued)
				}
				if more, err := s.conn(t, 0).Read(make([]byte, 1)); more != 0 || err == nil {
					t.Errorf("read after reset: %d %v", more, err)
				}
			} else {
				if err != nil || got <= queued+wq/2 {
					t.Errorf("control: server read %d (had %d queued, sender %d) then %v; want the queued bytes delivered and EOF", got, queued, wq, err)
				}
			}
		})
		_ = i
	}
	if err := echoOnce(own, bufio.NewReader(own), "still here"); err != nil {
		t.Errorf("a connection of another cgroup was touched: %v", err)
	}
}

// TestDestroySocketsOtherCgroup: sockets of another cgroup (the test's own,
// and a sibling test cgroup's) are neither reported nor destroyed, and an
// empty cgroup costs one dump and reports nothing.
func TestDestroySocketsOtherCgroup(t *testing.T) {
	requireNetns(t)
	victim, bystander := newTestCgroup(t), newTestCgroup(t)
	s := newSink(t)
	_, out := bystander.start(t, "sender", []string{"SHIM_NET_TEST_ADDR=" + s.addr(), "SHIM_NET_TEST_SIZE=1"}, nil)
	local, _ := strings.CutPrefix(readLine(t, out), "local ")
	echo := echoServer(t, "127.0.0.1:0")
	own, err := net.Dial("tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()

	conns, err := DestroySockets(victim.id, -1)
	if err != nil || len(conns) != 0 || conns == nil {
		t.Fatalf("empty cgroup: %+v %v", conns, err)
	}
	if err := echoOnce(own, bufio.NewReader(own), "mine"); err != nil {
		t.Errorf("own connection: %v", err)
	}
	found := false
	for _, so := range dumpFor(t, bystander.id, -1) {
		found = found || (so.addr(so.id.src, so.id.sport) == local && so.state == tcpEstablished)
	}
	if !found {
		t.Errorf("bystander's connection %s gone", local)
	}
	if _, err := DestroySockets(0, -1); api.CodeOf(err) != CodeBadRequest {
		t.Errorf("cgroup 0: %v", err)
	}
}

// TestDestroySocketsErrors: what no retry can fix is UNSUPPORTED with a
// message naming the missing piece; the rest is CUT_FAILED.
func TestDestroySocketsErrors(t *testing.T) {
	for _, tc := range []struct {
		err        error
		code, text string
	}{
		{unix.EOPNOTSUPP, CodeUnsupported, "CONFIG_INET_DIAG_DESTROY"},
		{unix.EPERM, CodeUnsupported, "CAP_NET_ADMIN"},
		{fmt.Errorf("tcp/ipv4: %w", errNoCgroupFilter), CodeUnsupported, "Linux 5.9"},
		{unix.EIO, CodeCutFailed, "input/output"},
	} {
		err := diagError(tc.err, "destroy socket")
		if api.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.text) || !errors.Is(err, tc.err) && !errors.Is(err, errNoCgroupFilter) {
			t.Errorf("%v: %v (code %s)", tc.err, err, api.CodeOf(err))
		}
	}
}

func anyLive(socks []diagSock) bool {
	for i := range socks {
		if socks[i].mustGo() {
			return true
		}
	}
	return false
}

// TestInFlight: only an established (or closing) connection whose peer
// acknowledged payload, or one the kernel said nothing about, counts.
func TestInFlight(t *testing.T) {
	for _, tc := range []struct {
		state uint8
		info  *api.TCPInfo
		want  bool
	}{
		{tcpEstablished, &api.TCPInfo{BytesAcked: 1}, false}, // only the SYN
		{tcpEstablished, &api.TCPInfo{BytesAcked: 2}, true},
		{tcpEstablished, nil, true},
		{tcpCloseWait, &api.TCPInfo{BytesAcked: 100}, true},
		{tcpFinWait1, &api.TCPInfo{BytesAcked: 100}, true},
		{tcpFinWait2, &api.TCPInfo{BytesAcked: 100}, true},
		{tcpLastAck, &api.TCPInfo{BytesAcked: 100}, true},
		{tcpSynSent, nil, false},
		{tcpListen, nil, false},
		{tcpTimeWait, nil, false},
	} {
		if got := tcpInFlight(tc.state, tc.info); got != tc.want {
			t.Errorf("%s %+v: %v", stateName(unix.IPPROTO_TCP, tc.state), tc.info, got)
		}
	}
}

// TestDestroySocketsOfSeveralCgroupsInOneDump: a generation and its tool
// calls (each a cgroup of its own) are cut in one dump whose filter names
// them all, 257 cgroups (the most a generation has) included; a cgroup not
// named keeps its connection. Control: the filter of one cgroup leaves the
// others' connections.
func TestDestroySocketsOfSeveralCgroupsInOneDump(t *testing.T) {
	requireNetns(t)
	a, b, bystander := newTestCgroup(t), newTestCgroup(t), newTestCgroup(t)
	s := newSink(t)
	sender := func(g *testCgroup) string {
		_, out := g.start(t, "sender", []string{"SHIM_NET_TEST_ADDR=" + s.addr(), "SHIM_NET_TEST_SIZE=1"}, nil)
		local, _ := strings.CutPrefix(readLine(t, out), "local ")
		return local
	}
	la, lb, lc := sender(a), sender(b), sender(bystander)
	established := func(g *testCgroup, local string) bool {
		for _, so := range dumpFor(t, g.id, -1) {
			if so.addr(so.id.src, so.id.sport) == local && so.state == tcpEstablished {
				return true
			}
		}
		return false
	}
	// Control: a's filter alone leaves b's connection.
	if _, err := DestroySockets(a.id, -1); err != nil {
		t.Fatal(err)
	}
	if established(a, la) || !established(b, lb) {
		t.Fatalf("control: a's cut: a %v, b %v (want a gone, b there)", established(a, la), established(b, lb))
	}
	la = sender(a)
	ids := []uint64{}
	for i := uint64(1); len(ids) < 255; i++ {
		if id := 1<<62 + i; id != a.id && id != b.id && id != bystander.id { // ids no cgroup has
			ids = append(ids, id)
		}
	}
	ids = append(ids, b.id, a.id) // the last conditions of the longest filter
	conns, err := DestroySocketsOf(ids, -1)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, c := range conns {
		got[c.Local] = true
	}
	if !got[la] || !got[lb] || got[lc] || established(a, la) || established(b, lb) {
		t.Errorf("one dump of 257 cgroups: reported %v; a %s, b %s cut; bystander %s untouched", conns, la, lb, lc)
	}
	if !established(bystander, lc) {
		t.Errorf("the bystander's connection %s is gone", lc)
	}
	if _, err := DestroySocketsOf(append(ids, make([]uint64, maxCgroupSet)...), -1); api.CodeOf(err) != CodeBadRequest {
		t.Errorf("past maxCgroupSet: %v", err)
	}
}
