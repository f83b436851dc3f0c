package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shimdev/shim/api"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Mode is how a generation reaches the network.
type Mode string

const (
	// ModeHost shares the sandbox's network (the default). There is no
	// link to cut, but the generation's sockets are still aborted
	// (DestroySockets in shim's own namespace).
	ModeHost Mode = "host"
	// ModeNone gives the generation its own network namespace with
	// loopback only.
	ModeNone Mode = "none"
	// ModeIsolated gives the generation its own network namespace whose
	// only way out is a veth to shim's egress proxy, which enforces the
	// allowlist and audits every connection.
	ModeIsolated Mode = "isolated"
)

// ParseMode accepts "", "host", "none" and "isolated" ("" = host), so
// that the CLI, the API and New agree on one spelling; anything else is
// BAD_REQUEST.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeHost:
		return ModeHost, nil
	case ModeNone, ModeIsolated:
		return Mode(s), nil
	}
	return "", errorf(CodeBadRequest, nil, fmt.Sprintf("network mode %q is not host, none or isolated", s))
}

// DefaultSubnet is the link-local range generation /30s are carved from:
// link-local so that it cannot collide with a route of the sandbox.
const DefaultSubnet = "169.254.64.0/18"

// ProxyPort is the port of the egress proxy on the host side of the veth
// (the conventional proxy port, fixed because each generation has its own
// address).
const ProxyPort = 3128

// Name of the peer interface inside the generation's namespace.
const peerLinkName = "eth0"

// Config is what New needs to know about a generation's network; the zero
// value is host mode.
type Config struct {
	Mode   Mode
	Allow  []string // host[:port] allowlist for the proxy ("isolated"); port defaults to 443 for CONNECT and 80 for plain HTTP; host may be an IP or "*.domain"
	Subnet string   // link-local IPv4 range to carve /30s from; DefaultSubnet if empty
	Audit  Audit
	Log    hclog.Logger
}

// Network is one generation's network. In "isolated" mode the topology is
//
//	generation netns            egress netns (per generation)      shim's netns
//	eth0 .2/30 ── veth ── shg<gen> .1/30, proxy listens .1:3128 ── proxy dials out
//	default via .1
//
// The host side of the veth lives in a private egress namespace that holds
// nothing but the proxy's listening socket, rather than in shim's own
// namespace: so the generation can reach the proxy and nothing else (no
// service of the sandbox listening on 0.0.0.0, no IP forwarding through
// shim's namespace, whatever the sandbox's sysctls are), without needing a
// firewall or a writable /proc/sys. The proxy's upstream connections are made
// from shim's namespace.
type Network struct {
	gen  uint64
	mode Mode
	log  hclog.Logger

	ns      netns.NsHandle // generation's namespace (none, isolated)
	egress  netns.NsHandle // egress namespace (isolated)
	genH    *netlink.Handle
	egressH *netlink.Handle

	hostLink string
	hostAddr *net.IPNet
	peerAddr *net.IPNet
	allow    []string
	proxy    *proxy

	mu     sync.Mutex
	cut    bool // guarded by mu: a cut was confirmed
	closed bool // guarded by mu
}

// hostLinkName is "shg<gen>", or "shg" + base 36 when the decimal does not
// fit the 15-byte interface name limit.
func hostLinkName(gen uint64) string {
	n := "shg" + strconv.FormatUint(gen, 10)
	if len(n) > 15 {
		n = "shg" + strconv.FormatUint(gen, 36)
	}
	return n
}

// slotAddrs returns the generation's /30 in subnet: slot gen mod (number of
// /30s), .1 for the host side and .2 for the peer. Each pair lives between
// two private namespaces, so two generations sharing a slot cannot collide;
// the mapping just keeps addresses predictable in audit records.
func slotAddrs(gen uint64, subnet string) (host, peer *net.IPNet, err error) {
	if subnet == "" {
		subnet = DefaultSubnet
	}
	_, n, err := net.ParseCIDR(subnet)
	if err != nil || n.IP.To4() == nil {
		return nil, nil, errorf(CodeBadRequest, nil, fmt.Sprintf("subnet %q is not an IPv4 CIDR", subnet))
	}
	ones, _ := n.Mask.Size()
	if ones > 30 {
		return nil, nil, errorf(CodeBadRequest, nil, fmt.Sprintf("subnet %q is smaller than a /30", subnet))
	}
	slots := uint64(1) << (30 - ones)
	base := binary.BigEndian.Uint32(n.IP.To4()) + uint32(gen%slots)*4
	mk := func(off uint32) *net.IPNet {
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, base+off)
		return &net.IPNet{IP: ip, Mask: net.CIDRMask(30, 32)}
	}
	return mk(1), mk(2), nil
}

// New builds generation gen's network, before the generation starts, so
// that its first process already lives in it. "host" creates nothing.
// "none" creates a network namespace held by an fd (no bind mount) with lo
// up. "isolated" also creates the egress namespace, a veth pair (host side
// "shg<gen>" with .1 in the egress namespace, peer "eth0" with .2 in the
// generation's namespace, default route via .1) and starts the egress proxy
// on .1:3128. Everything is configured through netlink handles bound to the
// target namespace. On error nothing is left behind.
func New(gen uint64, cfg Config) (*Network, error) {
	mode, err := ParseMode(string(cfg.Mode))
	if err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	audit := cfg.Audit
	if audit == nil {
		audit = func(string, map[string]any) {}
	}
	n := &Network{gen: gen, mode: mode, log: log.Named("net"), ns: -1, egress: -1}
	if mode == ModeHost {
		return n, nil
	}
	// Validate everything before creating anything.
	allow, err := parseAllowList(cfg.Allow)
	if err != nil {
		return nil, err
	}
	if mode == ModeIsolated {
		if n.hostAddr, n.peerAddr, err = slotAddrs(gen, cfg.Subnet); err != nil {
			return nil, err
		}
	}
	if err := n.build(allow, audit); err != nil {
		n.release()
		what, cause := "build", err
		if se := (*stepError)(nil); errors.As(err, &se) {
			what, cause = se.what, se.err
		}
		return nil, errorf(CodeStartFailed, cause, fmt.Sprintf("generation %d network (%s): %s", gen, mode, what))
	}
	return n, nil
}

// stepError is a step of build that failed: what, and the kernel's error.
type stepError struct {
	what string
	err  error
}

func (e *stepError) Error() string { return e.what + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// step runs a step of build, naming it when it fails.
func step(what string, err error) error {
	if err != nil {
		return &stepError{what: what, err: err}
	}
	return nil
}

// build makes the generation's namespace (none, isolated) and, isolated,
// its egress namespace, the veth between them and the proxy. On error the
// caller releases what was made.
func (n *Network) build(allow []allowEntry, audit Audit) error {
	var err error
	if n.ns, err = newNetns(); err != nil {
		return step("create network namespace", err)
	}
	if n.genH, err = netlink.NewHandleAt(n.ns); err != nil {
		return step("netlink handle in generation namespace", err)
	}
	if err := step("bring up lo", linkUp(n.genH, "lo")); err != nil || n.mode == ModeNone {
		return err
	}
	n.hostLink = hostLinkName(n.gen)
	for _, a := range allow {
		n.allow = append(n.allow, a.String())
	}
	if n.egress, err = newNetns(); err != nil {
		return step("create egress namespace", err)
	}
	if n.egressH, err = netlink.NewHandleAt(n.egress); err != nil {
		return step("netlink handle in egress namespace", err)
	}
	if err := step("bring up lo in egress namespace", linkUp(n.egressH, "lo")); err != nil {
		return err
	}
	if err := n.link(); err != nil {
		return err
	}
	// The listening socket is created in the egress namespace; accepted
	// connections stay there. Upstream dials happen on ordinary goroutines,
	// i.e. in shim's namespace.
	addr := net.JoinHostPort(n.hostAddr.IP.String(), strconv.Itoa(ProxyPort))
	var ln net.Listener
	if err := runIn(n.egress, func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		return step("start egress proxy", err)
	}
	n.proxy = newProxy(n.gen, ln, n.peerAddr.IP, allow, audit, n.log)
	go n.proxy.serve()
	n.log.Info("generation network ready", "generation", n.gen, "mode", n.mode, "host_link", n.hostLink,
		"peer_addr", n.peerAddr.String(), "proxy", addr, "allow", strings.Join(n.allow, ","))
	return nil
}

// link makes the veth pair from the egress namespace into the
// generation's, addresses both ends and routes the generation through it.
func (n *Network) link() error {
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: n.hostLink},
		PeerName:      peerLinkName,
		PeerNamespace: netlink.NsFd(int(n.ns)),
	}
	if err := n.egressH.LinkAdd(veth); err != nil {
		return step("create veth pair", err)
	}
	host, err := n.egressH.LinkByName(n.hostLink)
	if err != nil {
		return step("find host side of veth", err)
	}
	if err := n.egressH.AddrAdd(host, &netlink.Addr{IPNet: n.hostAddr}); err != nil {
		return step("address host side of veth", err)
	}
	if err := n.egressH.LinkSetUp(host); err != nil {
		return step("bring up host side of veth", err)
	}
	peer, err := n.genH.LinkByName(peerLinkName)
	if err != nil {
		return step("find peer side of veth", err)
	}
	if err := n.genH.AddrAdd(peer, &netlink.Addr{IPNet: n.peerAddr}); err != nil {
		return step("address peer side of veth", err)
	}
	if err := n.genH.LinkSetUp(peer); err != nil {
		return step("bring up peer side of veth", err)
	}
	return step("default route", n.genH.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: n.hostAddr.IP}))
}

func linkUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	return h.LinkSetUp(l)
}

// Mode returns the network mode, as New resolved it ("" becomes host).
func (n *Network) Mode() Mode { return n.mode }

// Run calls fn on a locked OS thread that has joined the generation's
// network namespace, then moves the thread back (or lets it die if it
// cannot). In host mode it just calls fn. The runtime forks the harness
// inside fn (exec.Cmd.Start): a child forked from this thread inherits the
// namespace. Goroutines started by fn do not run in the namespace.
func (n *Network) Run(fn func() error) error {
	if n.mode == ModeHost {
		return fn()
	}
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return errorf(CodeStartFailed, nil, fmt.Sprintf("generation %d network is closed", n.gen))
	}
	return runIn(n.ns, fn)
}

// Env returns the proxy variables for the harness in isolated mode
// (HTTP_PROXY, HTTPS_PROXY and lower-case forms, NO_PROXY for loopback);
// nil otherwise.
func (n *Network) Env() []string {
	if n.mode != ModeIsolated {
		return nil
	}
	p := "http://" + net.JoinHostPort(n.hostAddr.IP.String(), strconv.Itoa(ProxyPort))
	np := "localhost,127.0.0.1,::1"
	return []string{
		"HTTP_PROXY=" + p, "HTTPS_PROXY=" + p, "http_proxy=" + p, "https_proxy=" + p,
		"NO_PROXY=" + np, "no_proxy=" + np,
	}
}

// Info describes the network as it is now (Cut is true once a cut was
// confirmed).
func (n *Network) Info() api.NetworkInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	info := api.NetworkInfo{Mode: string(n.mode), Generation: n.gen, Cut: n.cut}
	if n.ns.IsOpen() {
		info.NetnsInode = nsInode(n.ns)
	}
	if n.mode == ModeIsolated {
		if n.egress.IsOpen() {
			info.EgressNetnsInode = nsInode(n.egress)
		}
		info.HostLink = n.hostLink
		info.HostAddr = n.hostAddr.String()
		info.PeerLink = peerLinkName
		info.PeerAddr = n.peerAddr.String()
		info.Proxy = net.JoinHostPort(n.hostAddr.IP.String(), strconv.Itoa(ProxyPort))
		info.Allow = append([]string(nil), n.allow...)
	}
	return info
}

// cutTimeout bounds how long Cut waits for proxy handlers to finish.
const cutTimeout = 2 * time.Second

// Cut is the network half of the fence's cut step, called while the
// generation is frozen, with the id of its cgroup (the cgroup2
// directory's inode number). In this order, each part timed:
//
//   - "tunnels" (isolated): the proxy stops accepting and aborts every
//     connection on both sides (SO_LINGER 0: RST, queues dropped) after
//     reading what the kernel knew about each upstream;
//   - "connections": every socket of the cgroup in the generation's
//     namespace (shim's own in host mode) is destroyed (DestroySockets):
//     deleting the veth would not reset them;
//   - "link" (isolated): the veth is deleted (its peer goes with it) and
//     both ends are confirmed gone.
//
// Every part runs even when an earlier one failed; any part it cannot
// confirm makes the error an *Error with code CUT_FAILED (UNSUPPORTED when
// the kernel cannot destroy sockets at all): the fence must fail closed.
// The report lists the connections found either way. A second Cut after a
// confirmed one reports nothing more.
func (n *Network) Cut(cgroupID uint64) (api.CutReport, error) {
	rep := api.CutReport{DurationsMS: map[string]float64{}, Connections: []api.Connection{}}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut {
		return rep, nil
	}
	if n.closed {
		return rep, errorf(CodeCutFailed, nil, fmt.Sprintf("generation %d network is closed", n.gen))
	}
	errs := n.abortConns(cgroupID, &rep, n.proxyAbort)
	if n.mode == ModeIsolated {
		t := time.Now()
		deleted, err := n.deleteLink()
		rep.LinkDeleted = deleted
		if err != nil {
			errs = append(errs, err)
		}
		rep.DurationsMS["link"] = ms(time.Since(t))
	}
	if err := cutError(n.gen, errs, &rep); err != nil {
		return rep, err
	}
	n.cut = true
	n.log.Info("generation network cut", "generation", n.gen, "tunnels_closed", rep.TunnelsClosed,
		"sockets_destroyed", rep.SocketsDestroyed, "in_flight", rep.InFlight, "link_deleted", rep.LinkDeleted)
	return rep, nil
}

// Suspend is Cut without its end: every connection of the generation is
// aborted as Cut aborts them (tunnels through the proxy, its sockets by
// cgroup id), but the link stays and the proxy keeps listening, refusing
// every connection until Resume (one the kernel completed before the
// freeze is never dialled). For a generation whose lease ran out: the
// caller has frozen it, so nothing of it opens a new connection meanwhile.
// A Cut later ends the network as usual; after a Cut, Suspend and Resume do
// nothing.
func (n *Network) Suspend(cgroupID uint64) (api.CutReport, error) {
	rep := api.CutReport{DurationsMS: map[string]float64{}, Connections: []api.Connection{}}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut || n.closed {
		return rep, nil
	}
	errs := n.abortConns(cgroupID, &rep, n.proxySuspend)
	if err := cutError(n.gen, errs, &rep); err != nil {
		return rep, err
	}
	n.log.Info("generation network suspended", "generation", n.gen, "tunnels_closed", rep.TunnelsClosed,
		"sockets_destroyed", rep.SocketsDestroyed, "in_flight", rep.InFlight)
	return rep, nil
}

// Resume ends a Suspend: the proxy serves the generation again.
func (n *Network) Resume() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proxy != nil && !n.cut && !n.closed {
		n.proxy.resume()
	}
}

func (n *Network) proxyAbort() (abortResult, error)   { return n.proxy.abort(cutTimeout) }
func (n *Network) proxySuspend() (abortResult, error) { return n.proxy.suspend(cutTimeout) }

// abortConns aborts the proxy's connections (with how: abort or suspend)
// and destroys the generation's sockets in its namespace, recording both
// in rep; it returns what it could not confirm. n.mu held.
func (n *Network) abortConns(cgroupID uint64, rep *api.CutReport, how func() (abortResult, error)) []error {
	var errs []error
	if n.proxy != nil {
		t := time.Now()
		res, err := how()
		rep.TunnelsClosed, rep.ConnectionsClosed = res.tunnels, res.clients
		rep.Connections = append(rep.Connections, res.conns...)
		if err != nil {
			errs = append(errs, err)
		}
		rep.DurationsMS["tunnels"] = ms(time.Since(t))
	}
	// Without a cgroup2 id (cgroup1 and pidns modes) the sockets inside
	// the namespace cannot be told apart: the link deletion and the kill
	// end them (nothing leaves the namespace once the link is gone).
	if cgroupID != 0 {
		t := time.Now()
		socks, err := DestroySockets(cgroupID, int(n.ns))
		rep.SocketsDestroyed = len(socks)
		rep.Connections = append(rep.Connections, socks...)
		if err != nil {
			errs = append(errs, err)
		}
		rep.DurationsMS["connections"] = ms(time.Since(t))
	}
	return errs
}

// cutError records in rep whether anything was in flight and makes errs one error:
// CUT_FAILED, or UNSUPPORTED when that alone is why.
func cutError(gen uint64, errs []error, rep *api.CutReport) error {
	for _, c := range rep.Connections {
		rep.InFlight = rep.InFlight || c.InFlight
	}
	if len(errs) == 0 {
		return nil
	}
	code := CodeCutFailed
	if len(errs) == 1 {
		if e := (*Error)(nil); errors.As(errs[0], &e) && e.Code() == CodeUnsupported {
			code = CodeUnsupported
		}
	}
	return errorf(code, errors.Join(errs...), fmt.Sprintf("generation %d: network cut not confirmed", gen))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// deleteLink deletes the host side of the veth and confirms that neither
// side exists any more. It reports whether the link is gone.
func (n *Network) deleteLink() (bool, error) {
	if n.egressH == nil || n.genH == nil {
		return false, errors.New("no netlink handles")
	}
	l, err := n.egressH.LinkByName(n.hostLink)
	switch {
	case err == nil:
		if err := n.egressH.LinkDel(l); err != nil {
			return false, fmt.Errorf("delete %s: %w", n.hostLink, err)
		}
	case isNotFound(err):
	default:
		return false, fmt.Errorf("look up %s: %w", n.hostLink, err)
	}
	if _, err := n.egressH.LinkByName(n.hostLink); !isNotFound(err) {
		return false, fmt.Errorf("%s still present after delete (lookup: %v)", n.hostLink, err)
	}
	if _, err := n.genH.LinkByName(peerLinkName); !isNotFound(err) {
		return false, fmt.Errorf("peer %s still present in generation namespace (lookup: %v)", peerLinkName, err)
	}
	return true, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return err != nil && errors.As(err, &nf)
}

// Close releases the network after the generation is gone: it aborts what
// is left of the proxy, deletes the link if Cut did not, and closes the
// namespace fds (the kernel frees a namespace when its last process and fd
// are gone). It is idempotent.
func (n *Network) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	var err error
	if n.mode == ModeIsolated && !n.cut {
		if n.proxy != nil {
			_, _ = n.proxy.abort(cutTimeout)
		}
		if _, derr := n.deleteLink(); derr != nil {
			err = derr
		}
	}
	n.release()
	return err
}

// release closes handles and fds (no netlink calls).
func (n *Network) release() {
	if n.proxy != nil {
		_, _ = n.proxy.abort(cutTimeout)
	}
	if n.genH != nil {
		n.genH.Close()
		n.genH = nil
	}
	if n.egressH != nil {
		n.egressH.Close()
		n.egressH = nil
	}
	if n.ns.IsOpen() {
		n.ns.Close()
	}
	if n.egress.IsOpen() {
		n.egress.Close()
	}
}
