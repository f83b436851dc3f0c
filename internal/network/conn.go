package network

import (
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Where a Conn was found.
const (
	// ViaSocket: a socket of the generation's cgroup, found and destroyed
	// through sock_diag (DestroySockets).
	ViaSocket = "socket"
	// ViaProxy: a connection the egress proxy made on the generation's
	// behalf; Local and Remote are the proxy's upstream socket.
	ViaProxy = "proxy"
)

// Conn is one connection open at the cut, as the fence report shows it: the
// evidence for "was anything in flight". The queue and TCPInfo figures are
// the kernel's, read just before the connection was aborted.
type Conn struct {
	Via      string `json:"via"`      // ViaSocket or ViaProxy
	Protocol string `json:"protocol"` // "tcp", "mptcp" (one per MPTCP connection, its subflows folded in) or "udp"
	Family   string `json:"family"`   // "ipv4" or "ipv6"
	Local    string `json:"local"`    // address:port
	Remote   string `json:"remote"`   // address:port; port 0 for a listener
	State    string `json:"state"`    // TCP state: "established", "fin_wait1", "listen", ...; UDP: "established" or "unconnected"
	UID      uint32 `json:"uid"`      // owner of the socket (ViaSocket)
	Inode    uint32 `json:"inode,omitempty"`

	// What the proxy knew (ViaProxy only).
	Client    string `json:"client,omitempty"`  // the generation's end of the proxied connection
	Kind      string `json:"kind,omitempty"`    // "connect" or "http"
	Target    string `json:"target,omitempty"`  // host:port the generation asked for
	Request   string `json:"request,omitempty"` // "CONNECT host:port", or "METHOD scheme://host/path" (no userinfo, no query)
	BytesUp   int64  `json:"bytes_up,omitempty"`
	BytesDown int64  `json:"bytes_down,omitempty"`

	// SendQueue is what the socket still held on the way out: bytes
	// written and not yet acknowledged by the peer (sent or not). The
	// abort dropped them. RecvQueue is what had arrived and was not read.
	// For "mptcp" both are the MPTCP level's, and TCP holds its data-level
	// counts (see mptcpConns).
	SendQueue uint32   `json:"send_queue"`
	RecvQueue uint32   `json:"recv_queue"`
	TCP       *TCPInfo `json:"tcp_info,omitempty"`

	// InFlight is true when a request on this connection may have reached
	// its server whole: the connection was established (or closing) and
	// the peer had acknowledged payload, or the kernel did not say. A
	// listener, a connection still in its handshake, or one whose peer
	// acknowledged nothing beyond the SYN is not in flight.
	InFlight bool `json:"in_flight"`
}

// TCPInfo is the part of the kernel's struct tcp_info that says how far a
// connection's data got.
type TCPInfo struct {
	BytesSent       uint64 `json:"bytes_sent"`       // tcpi_bytes_sent: payload bytes transmitted, retransmissions included
	BytesAcked      uint64 `json:"bytes_acked"`      // tcpi_bytes_acked: bytes the peer acknowledged, the SYN counting 1
	BytesReceived   uint64 `json:"bytes_received"`   // tcpi_bytes_received
	NotSentBytes    uint32 `json:"notsent_bytes"`    // tcpi_notsent_bytes: queued, never transmitted
	UnackedSegments uint32 `json:"unacked_segments"` // tcpi_unacked: segments sent and not acknowledged
}

func tcpInfoFrom(ti *unix.TCPInfo) *TCPInfo {
	return &TCPInfo{
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
func tcpInFlight(state uint8, info *TCPInfo) bool {
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
func kernelView(tc *net.TCPConn, c *Conn) {
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
	var info *TCPInfo
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
