package network

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"github.com/shimdev/shim/api"
	"golang.org/x/sys/unix"
)

// MPTCP as the cut sees it: the subflows sock_diag reports folded into one
// connection each, and the connections the kernel cannot destroy by socket
// closed by their holder's descriptor (fastclose).

// parseULPInfo reads INET_DIAG_ULP_INFO: for an MPTCP subflow, the token of
// its MPTCP connection (the local one, mptcpi_token of that connection).
func parseULPInfo(v []byte) (token uint32, subflow bool) {
	var name string
	var sub []byte
	attrs(v, func(typ uint16, v []byte) {
		switch typ {
		case inetULPInfoName:
			name = strings.TrimRight(string(v), "\x00")
		case inetULPInfoMPTCP:
			sub = v
		}
	})
	if name != "mptcp" {
		return 0, false
	}
	attrs(sub, func(typ uint16, v []byte) {
		if typ == mptcpSubflowTokenLoc && len(v) >= 4 {
			token, subflow = native.Uint32(v), true
		}
	})
	return token, subflow
}

// mptcpInfo is what shim reads of struct mptcp_info (linux/mptcp.h), the
// MPTCP level of a connection: data sequence numbers, not a subflow's.
type mptcpInfo struct {
	flags, token          uint32
	writeSeq, sndUna      uint64 // mptcpi_write_seq, mptcpi_snd_una (Linux 5.7)
	sent, received, acked uint64 // mptcpi_bytes_sent, _received, _acked (Linux 6.5)
	hasBytes              bool
}

func parseMPTCPInfo(v []byte) *mptcpInfo {
	if len(v) < 32 {
		return nil
	}
	m := &mptcpInfo{flags: native.Uint32(v[8:]), token: native.Uint32(v[12:]),
		writeSeq: native.Uint64(v[16:]), sndUna: native.Uint64(v[24:])}
	if len(v) >= 80 {
		m.sent, m.received, m.acked = native.Uint64(v[56:]), native.Uint64(v[64:]), native.Uint64(v[72:])
		m.hasBytes = true
	}
	return m
}

// queued is what the connection still holds on the way out at the MPTCP
// level: written and not acknowledged at the data level (DATA_ACK), sent
// on some subflow or not, a DATA_FIN counting one.
func (m *mptcpInfo) queued() uint64 { return m.writeSeq - m.sndUna }

func (m *mptcpInfo) fallback() bool { return m.flags&mptcpInfoFallback != 0 }

// dumpMPTCP lists the MPTCP sockets of cgroupID, both families, with their
// struct mptcp_info. A kernel without MPTCP diag (no CONFIG_INET_MPTCP_DIAG,
// or before Linux 5.9 and its protocol attribute) gives an error.
func (d *diagConn) dumpMPTCP(cgroupID cgroupSet) ([]diagSock, error) {
	var out []diagSock
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := d.dump(family, ipprotoMPTCP, cgroupID)
		if err != nil {
			return out, fmt.Errorf("mptcp/%s: %w", familyName(family), err)
		}
		for _, s := range socks {
			if !s.hasCgroup || cgroupID.has(s.cgroup) {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// mptcpCut turns on the MPTCP handling of DestroySockets (the MPTCP
// level's queue in the report, the reset of the peer). Only the tests turn
// it off, for their control.
var mptcpCut = true

func anySubflow(socks []diagSock) bool {
	for i := range socks {
		if socks[i].subflow {
			return true
		}
	}
	return false
}

// mptcpConn is an MPTCP connection as the cut reports it.
type mptcpConn struct {
	token uint32
	conn  api.Connection
}

// mptcpConns reports the live MPTCP connections among msks (an MPTCP dump)
// with their subflows among socks (a TCP dump), and returns those whose
// peer needs MP_FASTCLOSE to learn of the abort. Listeners are left to the
// TCP listener they stand on, reported as before.
//
// SendQueue is what the MPTCP level holds on the way out, write_seq -
// snd_una in data sequence numbers (what SIOCOUTQ on the socket says; with
// its subflows destroyed it has no way out left); a subflow holds at most
// what it was handed and not yet acknowledged, a few bytes to a window's
// worth. For a
// connection that fell back to TCP the MPTCP level hands its data to its
// one subflow and counts it acknowledged there, so the subflow's queue is
// added. TCP is the MPTCP level's bytes_sent, bytes_acked and
// bytes_received (Linux 6.5), NotSentBytes what no subflow was handed yet;
// a fallen back connection shows its subflow's tcp_info instead.
// RecvQueue is the kernel's receive memory at the MPTCP level (skb
// truesize, not payload bytes) and what its subflows hold.
func mptcpConns(msks, socks []diagSock) (out []mptcpConn, reach []*diagSock) {
	for i := range msks {
		ms := &msks[i]
		m := ms.mptcp
		if m == nil || ms.state == tcpListen || !openState(ms.state) {
			continue
		}
		c := api.Connection{
			Via: ViaSocket, Protocol: "mptcp", Family: familyName(ms.family),
			Local: ms.addr(ms.id.src, ms.id.sport), Remote: ms.addr(ms.id.dst, ms.id.dport),
			State: stateName(unix.IPPROTO_TCP, ms.state), UID: ms.uid,
			RecvQueue: ms.rqueue,
		}
		queued := m.queued()
		var first *diagSock
		for j := range socks {
			if sf := &socks[j]; sf.subflow && sf.token == m.token {
				c.RecvQueue += sf.rqueue
				if m.fallback() {
					queued += uint64(sf.wqueue)
				}
				if first == nil {
					first = sf
				}
			}
		}
		switch {
		case m.fallback():
			if first != nil {
				c.TCP = first.info
			}
			c.InFlight = tcpInFlight(ms.state, c.TCP)
		case m.hasBytes:
			var inFlight uint64 // sent on some subflow, not acknowledged
			if m.sent > m.acked {
				inFlight = m.sent - m.acked
			}
			c.TCP = &api.TCPInfo{BytesSent: m.sent, BytesAcked: m.acked, BytesReceived: m.received,
				NotSentBytes: clamp32(queued - min(inFlight, queued))}
			// The MPTCP level has no SYN to count: any acknowledged byte
			// is payload.
			c.InFlight = tcpInFlight(ms.state, &api.TCPInfo{BytesAcked: m.acked + 1})
		default:
			c.InFlight = tcpInFlight(ms.state, nil) // the kernel did not say
		}
		c.SendQueue = clamp32(queued)
		out = append(out, mptcpConn{token: m.token, conn: c})
		if !m.fallback() {
			reach = append(reach, ms)
		}
	}
	return out, reach
}

func clamp32(v uint64) uint32 { return uint32(min(v, uint64(^uint32(0)))) }

// fastcloseMPTCP resets each MPTCP connection in msks the way its process
// could: connect(AF_UNSPEC) on the socket, whose MPTCP disconnect sends
// an RST carrying MP_FASTCLOSE on every subflow and drops both queues. The
// peer's MPTCP socket then fails with ECONNRESET; a plain RST on the
// subflows would only close them, and the peer would wait for another
// subflow until its net.mptcp.close_timeout (60 s by default) and then
// fail with ENOTCONN.
//
// sock_diag cannot do this (no SOCK_DESTROY for MPTCP), so shim takes the
// socket from a process that holds it: a /proc walk for the socket's
// inode, pidfd_getfd (Linux 5.6; the right to ptrace the holder, so
// CAP_SYS_PTRACE for another uid), and SO_COOKIE must equal the cookie the
// dump reported before anything is done. It reports how many it reset.
// What it cannot reach is left to the subflows' abort: a socket its
// process already closed (inode 0: the kernel still flushes it and no
// descriptor is left), a holder shim may not ptrace.
//
// MP_FASTCLOSE reaches the peer only when the peer accepts the RST that
// carries it: its sequence number must be the peer's next expected one
// (RFC 5961). A subflow that has sent bytes the peer dropped unacknowledged
// (a receive buffer overrun) sends it beyond the peer's window; the peer
// discards it and later takes the kernel's answer to its next segment, a
// plain RST, for its subflow alone.
func fastcloseMPTCP(msks []*diagSock) int {
	want := map[uint32]*diagSock{}
	for _, m := range msks {
		if m.inode != 0 {
			want[m.inode] = m
		}
	}
	if len(want) == 0 {
		return 0
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	done, budget := 0, maxFastcloseFDs
	for _, p := range procs {
		if len(want) == 0 || budget <= 0 {
			break
		}
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		done += fastcloseHeld(pid, want, &budget)
	}
	return done
}

// maxFastcloseFDs bounds the descriptors the MPTCP reset looks at in all
// (a harness that opens a million): past it, the sockets not found yet are
// left to the subflows' destruction (their peers then wait for their
// close timeout, as without the reset).
const maxFastcloseFDs = 1 << 16

// fastcloseHeld resets the MPTCP sockets of want that process pid holds,
// removing them from want.
func fastcloseHeld(pid int, want map[uint32]*diagSock, budget *int) int {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	d, err := os.Open(dir)
	if err != nil {
		return 0 // gone, or not ours to read
	}
	defer d.Close()
	pidfd, done := -1, 0
	defer func() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	for len(want) > 0 && *budget > 0 {
		fds, _ := d.ReadDir(min(256, *budget)) // a batch at a time: memory bounded whatever the process holds
		if len(fds) == 0 {
			return done // the end, or an error
		}
		*budget -= len(fds)
		done += fastcloseBatch(pid, dir, fds, want, &pidfd)
	}
	return done
}

// fastcloseBatch resets the sockets of want among fds, descriptors of
// process pid listed in dir; pidfd is opened on the first match.
func fastcloseBatch(pid int, dir string, fds []os.DirEntry, want map[uint32]*diagSock, pidfd *int) int {
	done := 0
	for _, f := range fds {
		link, err := os.Readlink(dir + "/" + f.Name())
		if err != nil {
			continue
		}
		ino, ok := socketInode(link)
		m := want[ino]
		if !ok || m == nil {
			continue
		}
		fd, err := strconv.Atoi(f.Name())
		if err != nil {
			continue
		}
		if *pidfd < 0 {
			if *pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
				*pidfd = -1
				return done
			}
		}
		if fastclose(*pidfd, fd, m) == nil {
			delete(want, ino)
			done++
		}
	}
	return done
}

// socketInode parses a /proc/<pid>/fd link of a socket, "socket:[<inode>]".
func socketInode(link string) (uint32, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), ok && err == nil
}

var errNotThatSocket = errors.New("the descriptor holds another socket")

// fastclose takes descriptor fd of the process behind pidfd and, when it is
// the socket m (same cookie), disconnects it.
func fastclose(pidfd, fd int, m *diagSock) error {
	nfd, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return err
	}
	defer unix.Close(nfd)
	cookie, err := unix.GetsockoptUint64(nfd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		return err
	}
	if cookie != uint64(m.id.cookie[0])|uint64(m.id.cookie[1])<<32 {
		return errNotThatSocket
	}
	// connect(2) with AF_UNSPEC: disconnect (MPTCP: mptcp_disconnect, a
	// fastclose). unix.Connect cannot express it.
	sa := unix.RawSockaddrInet4{Family: unix.AF_UNSPEC}
	if _, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(nfd), uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa)); e != 0 {
		return e
	}
	return nil
}
