package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/shimdev/shim/api"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sock_diag as shim uses it (linux/inet_diag.h, linux/sock_diag.h). The
// vishvananda/netlink helpers do not fit: they dump every socket of the
// namespace without a filter, do not report the cgroup, and destroy only
// IPv4 sockets, by address, without the cookie.
const (
	inetDiagReqBytecode  = 1  // INET_DIAG_REQ_BYTECODE: request attribute
	inetDiagBCCgroupCond = 13 // INET_DIAG_BC_CGROUP_COND: u64 cgroup v2 id follows (Linux 5.9)
	inetDiagBCJmp        = 1  // INET_DIAG_BC_JMP: always takes its no
	inetDiagInfo         = 2  // INET_DIAG_INFO: struct tcp_info (requested by idiag_ext bit 1<<(2-1))
	inetDiagCgroupID     = 21 // INET_DIAG_CGROUP_ID: u64, always reported with CONFIG_SOCK_CGROUP_DATA
	inetDiagNoCookie     = ^uint32(0)

	// MPTCP (linux/mptcp.h, net/mptcp/mptcp_diag.c). Its protocol number
	// does not fit the request's u8, so it goes in a request attribute.
	ipprotoMPTCP         = 262 // IPPROTO_MPTCP
	inetDiagReqProtocol  = 3   // INET_DIAG_REQ_PROTOCOL: u32 (Linux 5.9)
	inetDiagULPInfo      = 19  // INET_DIAG_ULP_INFO: nested, a TCP socket's upper layer (CAP_NET_ADMIN)
	inetULPInfoName      = 1   // INET_ULP_INFO_NAME: "mptcp" on a subflow
	inetULPInfoMPTCP     = 3   // INET_ULP_INFO_MPTCP: nested MPTCP_SUBFLOW_ATTR_*
	mptcpSubflowTokenLoc = 2   // MPTCP_SUBFLOW_ATTR_TOKEN_LOC: u32, its connection's mptcpi_token
	mptcpInfoFallback    = 1   // MPTCP_INFO_FLAG_FALLBACK: the connection fell back to plain TCP

	sizeofSockID   = 48 // struct inet_diag_sockid
	sizeofReqV2    = 8 + sizeofSockID
	sizeofReqV1    = 4 + sizeofSockID + 8  // struct inet_diag_req, the compat request
	tcpDiagGetSock = 18                    // TCPDIAG_GETSOCK: the compat dump of TCP, both families
	sizeofDiagMsg  = 4 + sizeofSockID + 20 // struct inet_diag_msg
	sizeofBytecode = 4 + 8                 // one inet_diag_bc_op + u64

	nlaTypeMask     = 0x3fff // strips NLA_F_NESTED and NLA_F_NET_BYTEORDER
	diagRecvTimeout = 5      // seconds a kernel answer may take before the cut fails
	destroyRounds   = 3      // dump-and-destroy passes before an unconfirmed abort is an error
)

var native = binary.NativeEndian

// sockID is struct inet_diag_sockid: ports in host order here, addresses
// as the kernel wrote them (network order), cookie opaque.
type sockID struct {
	sport, dport uint16
	src, dst     [16]byte
	ifindex      uint32
	cookie       [2]uint32
}

func (id *sockID) put(b []byte) {
	binary.BigEndian.PutUint16(b[0:], id.sport)
	binary.BigEndian.PutUint16(b[2:], id.dport)
	copy(b[4:20], id.src[:])
	copy(b[20:36], id.dst[:])
	native.PutUint32(b[36:], id.ifindex)
	native.PutUint32(b[40:], id.cookie[0])
	native.PutUint32(b[44:], id.cookie[1])
}

func parseSockID(b []byte) sockID {
	var id sockID
	id.sport = binary.BigEndian.Uint16(b[0:])
	id.dport = binary.BigEndian.Uint16(b[2:])
	copy(id.src[:], b[4:20])
	copy(id.dst[:], b[20:36])
	id.ifindex = native.Uint32(b[36:])
	id.cookie[0] = native.Uint32(b[40:])
	id.cookie[1] = native.Uint32(b[44:])
	return id
}

// diagSock is one socket as a dump reported it.
type diagSock struct {
	family, state  uint8
	proto          uint16 // IPPROTO_TCP, IPPROTO_UDP or ipprotoMPTCP
	id             sockID
	rqueue, wqueue uint32
	uid, inode     uint32
	cgroup         uint64
	hasCgroup      bool
	info           *api.TCPInfo
	mptcp          *mptcpInfo // an MPTCP socket's struct mptcp_info
	token          uint32     // a subflow's: its MPTCP connection's token
	subflow        bool       // a TCP socket whose upper layer is MPTCP, token set
}

func (s *diagSock) key() [3]uint32 {
	return [3]uint32{uint32(s.proto), s.id.cookie[0], s.id.cookie[1]}
}

func (s *diagSock) addr(b [16]byte, port uint16) string {
	var a netip.Addr
	if s.family == unix.AF_INET {
		a = netip.AddrFrom4([4]byte(b[:4]))
	} else {
		a = netip.AddrFrom16(b)
	}
	return netip.AddrPortFrom(a, port).String()
}

// live reports whether the socket is a TCP socket that is not closed yet:
// what DestroySockets aborts.
func (s *diagSock) live() bool { return s.proto == unix.IPPROTO_TCP && openState(s.state) }

// openState reports whether a TCP (or MPTCP) socket in state is not
// closed yet.
func openState(state uint8) bool {
	switch state {
	case tcpTimeWait, tcpClose, tcpNewSynRecv, tcpBoundInactive:
		return false
	}
	return true
}

// mustGo reports whether the socket could still carry data out: what the
// confirmation after an abort requires to be gone. A listener carries
// nothing; its destroy may also be refused (an MPTCP listener answers
// EINVAL, a SO_REUSEPORT sibling may be found instead of it), and the
// kill step closes it anyway, so it is aborted when possible and never
// blocks the cut.
func (s *diagSock) mustGo() bool { return s.live() && s.state != tcpListen }

func (s *diagSock) conn() api.Connection {
	c := api.Connection{
		Via: ViaSocket, Protocol: "tcp", Family: familyName(s.family),
		Local: s.addr(s.id.src, s.id.sport), Remote: s.addr(s.id.dst, s.id.dport),
		State: stateName(s.proto, s.state), UID: s.uid,
	}
	if s.proto == unix.IPPROTO_UDP {
		c.Protocol = "udp"
		// A datagram is gone once sent; a connected socket may have sent
		// one, and nothing tells whether it arrived.
		c.InFlight = s.state == tcpEstablished
		c.SendQueue, c.RecvQueue = s.wqueue, s.rqueue
		return c
	}
	if s.state != tcpListen { // for a listener the queues are backlog figures
		c.SendQueue, c.RecvQueue = s.wqueue, s.rqueue
		c.TCP = s.info
	}
	c.InFlight = tcpInFlight(s.state, s.info)
	return c
}

// DestroySockets aborts every TCP socket that processes of the cgroup v2
// cgroupID created, in the network namespace nsFd (-1: the caller's own),
// and returns them as they were just before: the connections open at the
// cut. Call it while the cgroup is frozen, before it is killed.
//
// Killing a process, or deleting its link, does not stop its connections:
// the kernel keeps flushing a dead or frozen process's send queue and ends
// with a FIN, so a request written just before the freeze still reaches its
// server. SOCK_DESTROY instead aborts the socket in the kernel: RST to the
// peer, send queue dropped, the process's next call fails with
// ECONNABORTED. Listeners are reported (never as in flight) and destroyed
// where the kernel allows it; one that remains (an MPTCP listener refuses)
// does not fail the cut: it carries no data and the kill step closes it. UDP sockets of the cgroup are reported and destroyed on a best
// effort basis: a datagram cannot be recalled, so there is nothing to
// confirm.
//
// Only sockets created while their process was in cgroupID match (the
// kernel records the cgroup at socket creation); sockets in other cgroups,
// descendants included, are left alone. One dump per protocol and address
// family finds them (the kernel filters by cgroup; each TCP dump walks the
// kernel's established hash, a few milliseconds on a large host); a second
// round, only when something was found, confirms that no TCP socket of the cgroup that could still
// send remains (TIME_WAIT and closed sockets are fine). An abort that
// cannot be confirmed is an *Error with code CUT_FAILED; a kernel or
// sandbox that cannot destroy sockets at all (no CONFIG_INET_DIAG_DESTROY,
// no cgroup filter before Linux 5.9, no CAP_NET_ADMIN) gives UNSUPPORTED.
//
// MPTCP: the process's socket is an MPTCP socket above TCP subflows, and
// what it wrote waits at the MPTCP level, not in a subflow. Each MPTCP
// connection whose subflows the dump finds is reported once, as protocol
// "mptcp", with what the MPTCP level held (mptcpConns), its subflows
// folded into it; the subflows are destroyed like any TCP socket, which
// stops the connection's data. SOCK_DESTROY cannot reach the MPTCP socket
// itself (the kernel's mptcp_diag has no destroy: EOPNOTSUPP), and an RST
// on its subflows leaves the peer's MPTCP connection open, waiting for a
// new subflow. So before the subflows go, the MPTCP socket is reset the
// way the process itself could reset it (fastcloseMPTCP: MP_FASTCLOSE,
// which the peer turns into ECONNRESET), where shim can reach it; where it
// cannot, the cut is no weaker, only the peer learns later (its
// net.mptcp.close_timeout).
func DestroySockets(cgroupID uint64, nsFd int) ([]api.Connection, error) {
	return DestroySocketsOf([]uint64{cgroupID}, nsFd)
}

// maxCgroupSet bounds the cgroups one DestroySocketsOf filters on (a
// generation, its 256 running tool calls and the 1,024 it keeps records
// of, which may have left processes behind): 16 bytes of filter each.
const maxCgroupSet = 2048

// DestroySocketsOf is DestroySockets for the sockets of any of the
// cgroups ids (a generation's and its tool calls'), in one dump: the
// kernel's filter is one condition per cgroup, the established table
// walked once whatever their number.
func DestroySocketsOf(ids []uint64, nsFd int) ([]api.Connection, error) {
	if err := checkCgroupSet(ids); err != nil {
		return nil, err
	}
	cgroupID := cgroupSet(ids)
	d, err := openDiag(nsFd)
	if err != nil {
		return nil, diagError(err, "open sock_diag socket")
	}
	defer d.close()
	c := &cut{d: d, conns: []api.Connection{}, seen: map[[3]uint32]bool{}, folded: map[uint32]bool{}}
	socks, err := d.dumpCgroup(cgroupID)
	if err != nil {
		return c.conns, diagError(err, fmt.Sprintf("list sockets of cgroups %v", ids))
	}
	if mptcpCut && anySubflow(socks) {
		c.foldMPTCP(cgroupID, socks)
	}
	tried, err := c.abort(socks, func(s *diagSock) bool { return s.live() || s.proto == unix.IPPROTO_UDP })
	if err != nil || !tried {
		return c.conns, err // nothing found: one dump per family was all it cost
	}
	for round := 1; ; round++ {
		if socks, err = d.dumpCgroup(cgroupID); err != nil {
			return c.conns, diagError(err, fmt.Sprintf("confirm abort of sockets of cgroups %v", ids))
		}
		left := stillOpen(socks)
		if len(left) == 0 {
			return c.conns, nil
		}
		if round == destroyRounds {
			return c.conns, errorf(CodeCutFailed, errors.Join(c.destroyErrs...),
				fmt.Sprintf("cgroups %v: %d socket(s) still open after abort: %s", ids, len(left), strings.Join(left, ", ")))
		}
		if _, err := c.abort(socks, (*diagSock).mustGo); err != nil {
			return c.conns, err
		}
	}
}

// cut is one DestroySocketsOf in progress: the connections reported (each
// once; an MPTCP connection's subflows folded into it) and the destroys
// that failed.
type cut struct {
	d           *diagConn
	conns       []api.Connection
	seen        map[[3]uint32]bool
	folded      map[uint32]bool // tokens of the MPTCP connections reported
	destroyErrs []error
}

// foldMPTCP reports the MPTCP connections whose subflows socks holds, and
// resets them (MP_FASTCLOSE) before the subflows are destroyed: it
// travels on a subflow. Best effort: a kernel without MPTCP diag leaves
// the subflows reported as TCP sockets, and destroyed all the same.
func (c *cut) foldMPTCP(cgroupID cgroupSet, socks []diagSock) {
	msks, err := c.d.dumpMPTCP(cgroupID)
	if err != nil {
		return
	}
	mp, reach := mptcpConns(msks, socks)
	for _, m := range mp {
		c.conns = append(c.conns, m.conn)
		c.folded[m.token] = true
	}
	fastcloseMPTCP(reach)
}

// abort records and destroys every socket in socks that want selects,
// and reports whether it tried any.
func (c *cut) abort(socks []diagSock, want func(*diagSock) bool) (bool, error) {
	tried := false
	for i := range socks {
		s := &socks[i]
		if !want(s) {
			continue
		}
		tried = true
		if !c.seen[s.key()] {
			c.seen[s.key()] = true
			if !(s.subflow && c.folded[s.token]) { // else reported with its MPTCP connection
				c.conns = append(c.conns, s.conn())
			}
		}
		if err := c.d.destroy(s); err != nil && s.mustGo() {
			if isUnsupported(err) {
				return tried, diagError(err, "destroy socket")
			}
			if !errors.Is(err, unix.ENOENT) { // ENOENT: it closed meanwhile
				c.destroyErrs = append(c.destroyErrs, err)
			}
		}
	}
	return tried, nil
}

// stillOpen describes the sockets of socks that must go and have not.
func stillOpen(socks []diagSock) []string {
	var left []string
	for i := range socks {
		if s := &socks[i]; s.mustGo() {
			left = append(left, fmt.Sprintf("%s %s->%s", stateName(s.proto, s.state), s.addr(s.id.src, s.id.sport), s.addr(s.id.dst, s.id.dport)))
		}
	}
	return left
}

func isUnsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) ||
		errors.Is(err, unix.EPROTONOSUPPORT)
}

// diagError turns a sock_diag failure into the package's error, with
// UNSUPPORTED for what no retry can fix.
func diagError(err error, what string) error {
	switch {
	case errors.Is(err, unix.EOPNOTSUPP):
		return errorf(CodeUnsupported, err, what+": the kernel cannot destroy sockets (CONFIG_INET_DIAG_DESTROY not set)")
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return errorf(CodeUnsupported, err, what+": destroying sockets needs CAP_NET_ADMIN")
	case errors.Is(err, unix.EPROTONOSUPPORT):
		return errorf(CodeUnsupported, err, what+": the kernel has no sock_diag for TCP (CONFIG_INET_DIAG)")
	case errors.Is(err, errNoCgroupFilter):
		return errorf(CodeUnsupported, err, what)
	}
	return errorf(CodeCutFailed, err, what)
}

var errNoCgroupFilter = errors.New("the kernel cannot filter sockets by cgroup (needs Linux 5.9 and CONFIG_SOCK_CGROUP_DATA)")

// diagConn is a NETLINK_SOCK_DIAG socket. Its network namespace is fixed
// when it is created and is the one its requests see.
type diagConn struct {
	fd  int
	buf []byte
}

var diagSeq atomic.Uint32

func openDiag(nsFd int) (*diagConn, error) {
	fd := -1
	create := func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		return err
	}
	var err error
	if nsFd < 0 {
		err = create()
	} else {
		err = runIn(netns.NsHandle(nsFd), create)
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, err
	}
	tv := unix.Timeval{Sec: diagRecvTimeout}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &diagConn{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (d *diagConn) close() { unix.Close(d.fd) }

// dumpCgroup lists the TCP and UDP sockets of cgroupID, both families.
// TCP is one walk of the kernel's tables for both families (the compat
// request, whose family is AF_UNSPEC): a dump walks every bucket of the
// established table whatever the filter, about 3 ms on a VM of 24 GiB,
// and the v2 request asks for one family at a time. Where the compat
// request fails, one v2 dump per family.
func (d *diagConn) dumpCgroup(cgroupID cgroupSet) ([]diagSock, error) {
	var out []diagSock
	tcp, err := d.dumpAll(tcpDiagGetSock, unix.IPPROTO_TCP, cgroupID)
	for _, proto := range []uint16{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
		if proto == unix.IPPROTO_TCP && err == nil {
			for _, s := range tcp {
				if !s.hasCgroup || cgroupID.has(s.cgroup) {
					out = append(out, s)
				}
			}
			continue
		}
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			socks, err := d.dump(family, proto, cgroupID)
			if err != nil {
				if proto == unix.IPPROTO_UDP && errors.Is(err, unix.ENOENT) {
					continue // no udp_diag module: UDP is best effort
				}
				return out, fmt.Errorf("%s/%s: %w", map[uint16]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[proto], familyName(family), err)
			}
			for _, s := range socks {
				if !s.hasCgroup || cgroupID.has(s.cgroup) {
					out = append(out, s)
				}
			}
		}
	}
	return out, nil
}

func (d *diagConn) dump(family uint8, proto uint16, cgroupID cgroupSet) ([]diagSock, error) {
	var ext uint8
	if proto == unix.IPPROTO_TCP || proto == ipprotoMPTCP {
		ext = 1 << (inetDiagInfo - 1)
	}
	seq := diagSeq.Add(1)
	req := request(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, seq, family, proto, ext, nil, cgroupID)
	return d.collect(req, seq, unix.SOCK_DIAG_BY_FAMILY, proto, cgroupID)
}

// dumpAll is the compat dump of typ (TCPDIAG_GETSOCK): every socket of
// proto, both families, in one walk; the family is each answer's own.
func (d *diagConn) dumpAll(typ uint16, proto uint16, cgroupID cgroupSet) ([]diagSock, error) {
	seq := diagSeq.Add(1)
	n := unix.SizeofNlMsghdr + sizeofReqV1 + unix.SizeofNlAttr + cgroupID.bytecodeLen()
	b := make([]byte, n)
	native.PutUint32(b[0:], uint32(n))
	native.PutUint16(b[4:], typ)
	native.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	native.PutUint32(b[8:], seq)
	r := b[unix.SizeofNlMsghdr:]
	r[3] = 1 << (inetDiagInfo - 1) // idiag_ext; idiag_family is AF_UNSPEC
	native.PutUint32(r[4+40:], inetDiagNoCookie)
	native.PutUint32(r[4+44:], inetDiagNoCookie)
	native.PutUint32(r[4+sizeofSockID:], ^uint32(0)) // idiag_states: all
	putCgroupFilter(r[sizeofReqV1:], cgroupID)
	return d.collect(b, seq, typ, proto, cgroupID)
}

// collect sends req (sequence seq) and reads the dump's answers, each a
// message of type typ.
func (d *diagConn) collect(req []byte, seq uint32, typ uint16, proto uint16, cgroupID cgroupSet) ([]diagSock, error) {
	if err := unix.Sendto(d.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out []diagSock
	for {
		msgs, err := d.receive()
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				if len(m.Data) >= 4 {
					if e := int32(native.Uint32(m.Data)); e < 0 {
						return nil, syscall.Errno(-e)
					}
				}
				return out, nil
			case unix.NLMSG_ERROR:
				e := nlError(m.Data)
				if errors.Is(e, unix.EINVAL) && len(cgroupID) != 0 {
					return nil, fmt.Errorf("%w: %v", errNoCgroupFilter, e)
				}
				return nil, e
			case typ:
				if s, ok := parseDiagMsg(proto, m.Data); ok {
					out = append(out, s)
				}
			}
		}
	}
}

// destroy sends SOCK_DESTROY for s (matched by address, port, interface and
// cookie) and waits for the kernel's answer.
func (d *diagConn) destroy(s *diagSock) error {
	seq := diagSeq.Add(1)
	req := request(unix.SOCK_DESTROY, unix.NLM_F_REQUEST|unix.NLM_F_ACK, seq, s.family, s.proto, 0, &s.id, nil)
	if err := unix.Sendto(d.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	for {
		msgs, err := d.receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq == seq && m.Header.Type == unix.NLMSG_ERROR {
				return nlError(m.Data)
			}
		}
	}
}

// receive reads one datagram from the kernel (never from another process:
// the sender's port id must be 0).
func (d *diagConn) receive() ([]syscall.NetlinkMessage, error) {
	for {
		n, _, flags, from, err := unix.Recvmsg(d.fd, d.buf, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			if errors.Is(err, unix.EAGAIN) {
				return nil, fmt.Errorf("no answer from the kernel within %ds", diagRecvTimeout)
			}
			return nil, err
		}
		if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
			continue
		}
		if flags&unix.MSG_TRUNC != 0 {
			return nil, errors.New("sock_diag answer truncated")
		}
		return syscall.ParseNetlinkMessage(d.buf[:n])
	}
}

func nlError(b []byte) error {
	if len(b) < 4 {
		return errors.New("short netlink error message")
	}
	if e := int32(native.Uint32(b)); e < 0 {
		return syscall.Errno(-e)
	}
	return nil
}

// parseDiagMsg decodes struct inet_diag_msg and the attributes shim uses.
func parseDiagMsg(proto uint16, b []byte) (diagSock, bool) {
	if len(b) < sizeofDiagMsg {
		return diagSock{}, false
	}
	s := diagSock{family: b[0], state: b[1], proto: proto, id: parseSockID(b[4:])}
	t := b[4+sizeofSockID:]
	s.rqueue = native.Uint32(t[4:])
	s.wqueue = native.Uint32(t[8:])
	s.uid = native.Uint32(t[12:])
	s.inode = native.Uint32(t[16:])
	attrs(b[sizeofDiagMsg:], func(typ uint16, v []byte) {
		switch typ {
		case inetDiagCgroupID:
			if len(v) >= 8 {
				s.cgroup, s.hasCgroup = native.Uint64(v), true
			}
		case inetDiagInfo:
			if proto == ipprotoMPTCP {
				s.mptcp = parseMPTCPInfo(v)
				break
			}
			var ti unix.TCPInfo
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&ti)), unsafe.Sizeof(ti)), v)
			s.info = tcpInfoFrom(&ti)
		case inetDiagULPInfo:
			s.token, s.subflow = parseULPInfo(v)
		}
	})
	return s, true
}

// attrs calls f with the type and value of each netlink attribute in b.
func attrs(b []byte, f func(typ uint16, v []byte)) {
	for len(b) >= unix.SizeofNlAttr {
		l := int(native.Uint16(b[0:]))
		if l < unix.SizeofNlAttr || l > len(b) {
			return
		}
		f(native.Uint16(b[2:])&nlaTypeMask, b[unix.SizeofNlAttr:l])
		al := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if al > len(b) {
			return
		}
		b = b[al:]
	}
}
