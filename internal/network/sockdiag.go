package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
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

	conns := []api.Connection{}
	seen := map[[3]uint32]bool{}
	folded := map[uint32]bool{} // tokens of the MPTCP connections reported
	var destroyErrs []error
	// abort records and destroys every socket in socks that want selects,
	// and reports whether it tried any.
	abort := func(socks []diagSock, want func(*diagSock) bool) (bool, error) {
		tried := false
		for i := range socks {
			s := &socks[i]
			if !want(s) {
				continue
			}
			tried = true
			if !seen[s.key()] {
				seen[s.key()] = true
				if !(s.subflow && folded[s.token]) { // else reported with its MPTCP connection
					conns = append(conns, s.conn())
				}
			}
			if err := d.destroy(s); err != nil && s.mustGo() {
				if isUnsupported(err) {
					return tried, diagError(err, "destroy socket")
				}
				if !errors.Is(err, unix.ENOENT) { // ENOENT: it closed meanwhile
					destroyErrs = append(destroyErrs, err)
				}
			}
		}
		return tried, nil
	}
	socks, err := d.dumpCgroup(cgroupID)
	if err != nil {
		return conns, diagError(err, fmt.Sprintf("list sockets of cgroups %v", ids))
	}
	if mptcpCut && anySubflow(socks) {
		// Best effort: a kernel without MPTCP diag leaves the subflows
		// reported as TCP sockets, and destroyed all the same.
		if msks, err := d.dumpMPTCP(cgroupID); err == nil {
			mp, reach := mptcpConns(msks, socks)
			for _, m := range mp {
				conns = append(conns, m.conn)
				folded[m.token] = true
			}
			// Before the subflows are destroyed: MP_FASTCLOSE travels on
			// a subflow.
			fastcloseMPTCP(reach)
		}
	}
	tried, err := abort(socks, func(s *diagSock) bool { return s.live() || s.proto == unix.IPPROTO_UDP })
	if err != nil || !tried {
		return conns, err // nothing found: one dump per family was all it cost
	}
	for round := 1; ; round++ {
		if socks, err = d.dumpCgroup(cgroupID); err != nil {
			return conns, diagError(err, fmt.Sprintf("confirm abort of sockets of cgroups %v", ids))
		}
		var left []string
		for i := range socks {
			if s := &socks[i]; s.mustGo() {
				left = append(left, fmt.Sprintf("%s %s->%s", stateName(s.proto, s.state), s.addr(s.id.src, s.id.sport), s.addr(s.id.dst, s.id.dport)))
			}
		}
		if len(left) == 0 {
			return conns, nil
		}
		if round == destroyRounds {
			return conns, errorf(CodeCutFailed, errors.Join(destroyErrs...),
				fmt.Sprintf("cgroups %v: %d socket(s) still open after abort: %s", ids, len(left), strings.Join(left, ", ")))
		}
		if _, err := abort(socks, (*diagSock).mustGo); err != nil {
			return conns, err
		}
	}
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
