package network

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openSink is a sink whose receive buffer is the kernel's choice: it reads
// nothing, so its window closes, but cleanly, without dropping a segment
// it had room for. mptcp false: a plain TCP server.
func openSink(t testing.TB, mptcp bool) *sink {
	t.Helper()
	var lc net.ListenConfig
	lc.SetMultipathTCP(mptcp)
	return listenSink(t, lc, "tcp4", "127.0.0.1:0")
}

// heldSender starts a sender in g that dials s over MPTCP and holds all of
// size bytes in its socket (a send buffer forced to fit them), then closes
// it when closeAfter. It returns the sender's local address once every
// byte is written.
func heldSender(t *testing.T, g *testCgroup, s *sink, size int, closeAfter bool) string {
	t.Helper()
	env := []string{"SHIM_NET_TEST_ADDR=" + s.addr(), fmt.Sprintf("SHIM_NET_TEST_SIZE=%d", size),
		"SHIM_NET_TEST_MPTCP=1", "SHIM_NET_TEST_HOLD=1"}
	want := "written"
	if closeAfter {
		env, want = append(env, "SHIM_NET_TEST_CLOSE=1"), "closed"
	}
	_, out := g.start(t, "sender", env, nil)
	local, ok := strings.CutPrefix(readLine(t, out), "local ")
	if !ok {
		t.Fatalf("sender: %s", local)
	}
	if l := readLine(t, out); l != want {
		t.Fatalf("sender: %s", l)
	}
	return local
}

// mptcpOf is the MPTCP socket of cgroupID whose local address is local, or
// nil.
func mptcpOf(t testing.TB, cgroupID uint64, local string) *diagSock {
	t.Helper()
	d, err := openDiag(-1)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	msks, err := d.dumpMPTCP(cgroupSet{cgroupID})
	if err != nil {
		t.Fatalf("MPTCP dump: %v", err)
	}
	for i := range msks {
		if msks[i].addr(msks[i].id.src, msks[i].id.sport) == local {
			return &msks[i]
		}
	}
	return nil
}

// subflowOf is the TCP subflow of cgroupID whose local address is local,
// or nil.
func subflowOf(t testing.TB, cgroupID uint64, local string) *diagSock {
	t.Helper()
	for _, s := range dumpFor(t, cgroupID, -1) {
		if s.subflow && s.addr(s.id.src, s.id.sport) == local {
			return &s
		}
	}
	return nil
}

// peerSubflows is how many subflows the MPTCP socket c has
// (mptcpi_subflows_total, Linux 6.6), -1 when the kernel does not say.
func peerSubflows(c *net.TCPConn) int {
	var info [96]byte
	n := uint32(len(info))
	var errno syscall.Errno
	raw, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	_ = raw.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_MPTCP, 1, // MPTCP_INFO
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
	})
	if errno != 0 || n <= 80 {
		return -1
	}
	return int(info[80])
}

// readNow reads what c holds without waiting, and says how the last read
// ended: EAGAIN when the connection is open and has nothing more.
func readNow(c *net.TCPConn) (int64, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int64
	var rerr error
	buf := make([]byte, 64<<10)
	_ = raw.Control(func(fd uintptr) {
		for {
			m, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case err != nil:
				rerr = err
				return
			case m == 0:
				rerr = io.EOF
				return
			}
			n += int64(m)
		}
	})
	return n, rerr
}

// TestDestroySocketsMPTCP: a child in a test cgroup dials MPTCP and writes
// 8 MiB to a server that reads nothing; its write returns once every byte
// is in its socket (a send buffer forced to hold them), so megabytes wait
// at the MPTCP level above a subflow that holds a byte or two. The cgroup
// is frozen, and the cut waits until the subflow has nothing unacknowledged
// in flight (the peer got every byte it was sent, so it accepts the
// abort's RST: see fastcloseMPTCP).
//
//   - reset: the report has one "mptcp" connection whose send queue is
//     the MPTCP level's: what it reports plus what the server received is
//     every byte written. The server reads what it had, then ECONNRESET:
//     MP_FASTCLOSE reached it.
//   - orphaned: the child closed its socket after writing (the kernel
//     still flushes it, no descriptor is left): reported the same, but
//     nothing can fastclose it. The server loses its subflow and its MPTCP
//     connection stays open: no error, no EOF, nothing more to read.
//   - fallback: the server is plain TCP, so the child's MPTCP connection
//     fell back to TCP and its backlog is split between the MPTCP level
//     and the subflow: both are reported, and the subflow's RST resets
//     the server.
//   - without mptcp handling (the control, mptcpCut off): the connection
//     is reported as its TCP subflow, with the subflow's few bytes, and
//     the server's MPTCP connection outlives its subflow, open.
//
// Every wait is for a state, bounded only to fail; nothing sleeps to
// synchronise.
func TestDestroySocketsMPTCP(t *testing.T) {
	requireNetns(t)
	const size = 8 << 20
	for _, tc := range []struct {
		name                         string
		closeAfter, plainPeer, off   bool
		wantProto, wantState         string
		wantFullQueue, wantPeerReset bool
	}{
		{"reset", false, false, false, "mptcp", "established", true, true},
		{"orphaned", true, false, false, "mptcp", "fin_wait1", true, false},
		{"fallback", false, true, false, "mptcp", "established", true, true},
		{"without mptcp handling", false, false, true, "tcp", "established", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.off {
				mptcpCut = false
				t.Cleanup(func() { mptcpCut = true })
			}
			g := newTestCgroup(t)
			s := openSink(t, !tc.plainPeer)
			local := heldSender(t, g, s, size, tc.closeAfter)
			sc := s.conn(t, 0)
			g.freeze(t)
			waitFor(t, 20*time.Second, "the frozen child's subflow to have nothing unacknowledged", func() bool {
				sf := subflowOf(t, g.id, local)
				return sf != nil && sf.info != nil && sf.info.UnackedSegments == 0
			})
			m, sf := mptcpOf(t, g.id, local), subflowOf(t, g.id, local)
			if m == nil || m.mptcp == nil || sf == nil {
				t.Fatalf("no MPTCP connection %s with its subflow in the dumps", local)
			}
			if got := stateName(unix.IPPROTO_TCP, m.state); got != tc.wantState {
				t.Fatalf("the child's MPTCP connection is %s before the cut, want %s", got, tc.wantState)
			}
			t.Logf("before the cut: %d bytes queued at the MPTCP level (fallback %v), %d in the subflow",
				m.mptcp.queued(), m.mptcp.fallback(), sf.wqueue)

			conns, err := DestroySockets(g.id, -1)
			if err != nil {
				t.Fatalf("DestroySockets: %v", err)
			}
			if len(conns) != 1 || conns[0].Local != local {
				t.Fatalf("reported %+v, want only %s", conns, local)
			}
			c := conns[0]
			t.Logf("reported: %s %s send_queue %d in_flight %v tcp_info %+v", c.Protocol, c.State, c.SendQueue, c.InFlight, c.TCP)
			if left := dumpFor(t, g.id, -1); anyLive(left) {
				t.Errorf("sockets left after destroy: %+v", left)
			}

			var got int64
			if tc.wantPeerReset {
				got, err = drain(t, sc)
				t.Logf("server read %d bytes, then %v", got, err)
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("server: %v, want connection reset by peer", err)
				}
			} else {
				// Its subflow is reset (the kernel's, without
				// MP_FASTCLOSE): once it is gone, the server's MPTCP
				// socket still stands, as it does for
				// net.mptcp.close_timeout (60 s by default).
				waitFor(t, 20*time.Second, "the server's MPTCP connection to lose its subflow", func() bool { return peerSubflows(sc) == 0 })
				got, err = readNow(sc)
				t.Logf("server read %d bytes, then %v (subflows left: %d)", got, err, peerSubflows(sc))
				if !errors.Is(err, unix.EAGAIN) {
					t.Errorf("server: %v, want its MPTCP connection still open (EAGAIN)", err)
				}
			}

			if c.Via != ViaSocket || c.Protocol != tc.wantProto || c.State != tc.wantState || c.Remote != s.addr() || !c.InFlight {
				t.Errorf("conn: %+v", c)
			}
			accounted := int64(c.SendQueue) + got
			if tc.wantFullQueue {
				// Every byte written is either in the report or at the
				// server; and the report holds megabytes, not a subflow's
				// few bytes.
				if accounted < size || c.SendQueue < size/2 {
					t.Errorf("reported %d queued, server received %d: %d of the %d written are missing", c.SendQueue, got, size-accounted, size)
				}
				if c.TCP == nil || c.TCP.BytesAcked == 0 {
					t.Errorf("tcp_info: %+v", c.TCP)
				}
			} else if accounted >= size/2 {
				t.Errorf("control: reported %d queued, server received %d; want the MPTCP level's backlog missing", c.SendQueue, got)
			}
			switch m := mptcpOf(t, g.id, local); {
			case tc.off && (m == nil || m.state != tcpEstablished):
				t.Errorf("control: the child's MPTCP socket did not outlive its subflow's abort: %+v", m)
			case tc.name == "reset" && m != nil && m.state != tcpClose:
				// The fastclose disconnected it before DestroySockets
				// returned (an orphan or a fallen back one closes in the
				// kernel's own time).
				t.Errorf("the child's MPTCP connection is still %s", stateName(unix.IPPROTO_TCP, m.state))
			}
		})
	}
}
