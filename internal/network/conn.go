package network

import (
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
)

// Where an api.Connection was found (its Via).
const (
	// ViaSocket: a socket of the generation's cgroup, found and destroyed
	// through sock_diag (DestroySockets).
	ViaSocket = "socket"
	// ViaProxy: a connection the egress proxy made on the generation's
	// behalf; Local and Remote are the proxy's upstream socket.
	ViaProxy = "proxy"
)

func tcpInfoFrom(ti *unix.TCPInfo) *api.TCPInfo {
	return &api.TCPInfo{
		BytesSent: ti.Bytes_sent, BytesAcked: ti.Bytes_acked, BytesReceived: ti.Bytes_received,
		NotSentBytes: ti.Notsent_bytes, UnackedSegments: ti.Unacked,
	}
}

// TCP states (include/net/tcp_states.h).
const (
	tcpEstablished   = 1
	tcpSynSent       = 2
	tcpSynRecv       = 3
	tcpFinWait1      = 4
	tcpFinWait2      = 5
	tcpTimeWait      = 6
	tcpClose         = 7
	tcpCloseWait     = 8
	tcpLastAck       = 9
	tcpListen        = 10
	tcpClosing       = 11
	tcpNewSynRecv    = 12
	tcpBoundInactive = 13
)

var tcpStateNames = map[uint8]string{
	tcpEstablished: "established", tcpSynSent: "syn_sent", tcpSynRecv: "syn_recv",
	tcpFinWait1: "fin_wait1", tcpFinWait2: "fin_wait2", tcpTimeWait: "time_wait",
	tcpClose: "close", tcpCloseWait: "close_wait", tcpLastAck: "last_ack",
	tcpListen: "listen", tcpClosing: "closing", tcpNewSynRecv: "new_syn_recv",
	tcpBoundInactive: "bound_inactive",
}

func stateName(proto uint16, state uint8) string {
	if proto == unix.IPPROTO_UDP {
		if state == tcpEstablished {
			return "established"
		}
		return "unconnected"
	}
	if s, ok := tcpStateNames[state]; ok {
		return s
	}
	return fmt.Sprintf("state_%d", state)
}

// tcpInFlight decides Conn.InFlight for TCP. bytes_acked counts the SYN, so
// only more than 1 means the peer acknowledged payload; no tcp_info at all
// means we cannot tell, which counts as in flight.
func tcpInFlight(state uint8, info *api.TCPInfo) bool {
	switch state {
	case tcpEstablished, tcpFinWait1, tcpFinWait2, tcpCloseWait, tcpClosing, tcpLastAck:
		return info == nil || info.BytesAcked > 1
	}
	return false
}

func familyName(af uint8) string {
	if af == unix.AF_INET6 {
		return "ipv6"
	}
	return "ipv4"
}

// kernelView fills c from the kernel's view of a TCP connection of the proxy
// (TCP_INFO, SIOCOUTQ, SIOCINQ), read before it is aborted.
func kernelView(tc *net.TCPConn, c *api.Connection) {
	c.Protocol, c.Local, c.Remote = "tcp", tc.LocalAddr().String(), tc.RemoteAddr().String()
	c.Family = "ipv4"
	if ap, err := netip.ParseAddrPort(c.Remote); err == nil && ap.Addr().Is6() && !ap.Addr().Is4In6() {
		c.Family = "ipv6"
	}
	c.State = "unknown"
	raw, err := tc.SyscallConn()
	if err != nil {
		c.InFlight = true
		return
	}
	var state uint8
	var info *api.TCPInfo
	_ = raw.Control(func(fd uintptr) {
		if ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state, info = ti.State, tcpInfoFrom(ti)
			c.State = stateName(unix.IPPROTO_TCP, ti.State)
		}
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ); err == nil && n >= 0 {
			c.SendQueue = uint32(n)
		}
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil && n >= 0 {
			c.RecvQueue = uint32(n)
		}
	})
	c.TCP = info
	if info == nil {
		c.InFlight = true // the kernel did not say
		return
	}
	c.InFlight = tcpInFlight(state, info)
}

// abortTCP closes c with SO_LINGER 0: the kernel sends an RST and drops
// both queues instead of flushing the send queue and sending a FIN. Close
// returns once the descriptor is closed, so the RST has been sent by then.
func abortTCP(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
