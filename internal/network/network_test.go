package network

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// echoServer echoes every connection on addr in the test's namespace (which
// plays shim's namespace: the proxy dials from here).
func echoServer(t testing.TB, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func newTestNetwork(t testing.TB, gen uint64, mode Mode, allow ...string) (*Network, *auditLog, *syncBuffer) {
	t.Helper()
	audit, logs := &auditLog{}, &syncBuffer{}
	n, err := New(gen, Config{Mode: mode, Allow: allow, Audit: audit.Record, Log: testLogger(logs)})
	if err != nil {
		t.Fatalf("New(%d, %s): %v", gen, mode, err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return n, audit, logs
}

// dialIn dials addr from inside the generation's namespace (the socket is
// created on Run's thread, so it belongs to that namespace).
func dialIn(n *Network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := n.Run(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	})
	return c, err
}

func tunnelIn(t testing.TB, n *Network, target string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := dialIn(n, n.Info().Proxy, 3*time.Second)
	if err != nil {
		t.Fatalf("dial proxy from generation namespace: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	br, err := connectTunnel(c, target)
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	return c, br
}

func echoOnce(c net.Conn, br *bufio.Reader, msg string) error {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	got, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

func linkNames(t testing.TB, h *netlink.Handle) []string {
	t.Helper()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names
}

// TestIsolatedNetwork: the generation's namespace gets its veth peer with
// the /30 address and a default route to the host side; the host side lives
// in the egress namespace, not in shim's; a CONNECT tunnel and a plain-HTTP
// request to allowed 127.0.0.1 servers (in shim's namespace) work, from
// in-process sockets and from programs forked inside Run; a host not on the
// allowlist gets 403 and an audit record; nothing but the proxy is
// reachable; Cut closes a long-lived tunnel (the client sees EOF/reset),
// deletes the link on both sides and is reported; after Cut the proxy is
// unreachable.
func TestIsolatedNetwork(t *testing.T) {
	requireNetns(t)
	echo := echoServer(t, "127.0.0.1:0")
	notAllowed := echoServer(t, "127.0.0.1:0")
	web := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	})}
	webLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go web.Serve(webLn)
	t.Cleanup(func() { web.Close() })
	webAddr := webLn.Addr().String()

	n, audit, logs := newTestNetwork(t, 5, ModeIsolated, echo, webAddr, "*.example.com")
	info := n.Info()
	if info.Mode != string(ModeIsolated) || info.HostLink != "shg5" || info.HostAddr != "169.254.64.21/30" || info.PeerAddr != "169.254.64.22/30" || info.Proxy != "169.254.64.21:3128" {
		t.Fatalf("info: %+v", info)
	}
	self, _ := netns.Get()
	defer self.Close()
	if info.NetnsInode == 0 || info.NetnsInode == nsInode(self) || info.EgressNetnsInode == 0 {
		t.Errorf("netns inodes: %+v (own %d)", info, nsInode(self))
	}
	if env := strings.Join(n.Env(), " "); !strings.Contains(env, "HTTPS_PROXY=http://169.254.64.21:3128") || !strings.Contains(env, "http_proxy=http://169.254.64.21:3128") {
		t.Errorf("env: %s", env)
	}

	// Topology, through handles bound to each namespace.
	genH, err := netlink.NewHandleAt(n.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer genH.Close()
	if names := strings.Join(linkNames(t, genH), ","); names != "lo,eth0" {
		t.Errorf("generation links: %s", names)
	}
	eth0, err := genH.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := genH.AddrList(eth0, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != "169.254.64.22/30" || eth0.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("eth0: %v up=%v", addrs, eth0.Attrs().Flags&net.FlagUp != 0)
	}
	routes, _ := genH.RouteList(nil, netlink.FAMILY_V4)
	hasDefault := false
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == "169.254.64.21" {
			hasDefault = true
		}
	}
	if !hasDefault {
		t.Errorf("no default route via .21: %v", routes)
	}
	ownH, err := netlink.NewHandleAt(self)
	if err != nil {
		t.Fatal(err)
	}
	defer ownH.Close()
	if _, err := ownH.LinkByName("shg5"); !isNotFound(err) {
		t.Errorf("host side visible in shim's namespace: %v", err)
	}

	// Allowed CONNECT works; the audit record names the generation.
	c1, br1 := tunnelIn(t, n, echo)
	if err := echoOnce(c1, br1, "through the proxy"); err != nil {
		t.Fatal(err)
	}
	if op := audit.Find(EventConnectionOpened); len(op) != 1 || op[0]["generation"] != float64(5) || op[0]["target"] != echo || op[0]["kind"] != "connect" {
		t.Errorf("opened audit: %v", op)
	}

	// Not on the allowlist: 403, audited, never dialled.
	for _, target := range []string{notAllowed, "github.com:443", "evil.com:443", "a.example.com:80"} {
		c, err := dialIn(n, info.Proxy, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		_, err = connectTunnel(c, target)
		c.Close()
		if err == nil || !strings.Contains(err.Error(), "403") {
			t.Errorf("CONNECT %s: %v, want 403", target, err)
		}
	}
	if r := audit.Find(EventConnectionRefused); len(r) != 4 || r[0]["reason"] != "not_allowed" || r[0]["target"] != notAllowed {
		t.Errorf("refused audit: %v", r)
	}

	// Plain HTTP, absolute URI, in process.
	c, err := dialIn(n, info.Proxy, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET http://%s/plain?token=not-audited HTTP/1.1\r\nHost: %s\r\n\r\n", webAddr, webAddr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	c.Close()
	if resp.StatusCode != 200 || string(body) != "hello /plain" {
		t.Errorf("plain HTTP: %d %q", resp.StatusCode, body)
	}

	// Programs forked inside Run live in the namespace: the test binary as
	// a CONNECT client, and curl for plain HTTP and CONNECT when present.
	exe, _ := os.Executable()
	var out []byte
	var stderr bytes.Buffer
	err = n.Run(func() error {
		cmd := exec.Command(exe)
		cmd.Env = []string{envTestMode + "=client", "SHIM_NET_TEST_PROXY=" + info.Proxy, "SHIM_NET_TEST_TARGET=" + echo}
		// Its answer on stdout only: under go test -cover the test binary
		// warns on stderr that it has no GOCOVERDIR.
		cmd.Stderr = &stderr
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Errorf("forked client: %v: %s %s", err, out, stderr.String())
	}
	if curl, err := exec.LookPath("curl"); err == nil {
		for _, args := range [][]string{
			{"-sS", "--max-time", "5", "-x", "http://" + info.Proxy, "http://" + webAddr + "/curl"},
			{"-sS", "--max-time", "5", "-p", "-x", "http://" + info.Proxy, "http://" + webAddr + "/tunnel"},
		} {
			var out []byte
			err := n.Run(func() error {
				cmd := exec.Command(curl, args...)
				cmd.Env = []string{"PATH=/usr/bin:/bin"}
				var err error
				out, err = cmd.CombinedOutput()
				return err
			})
			want := "hello " + args[len(args)-1][len("http://"+webAddr):]
			if err != nil || string(out) != want {
				t.Errorf("curl %v: %v %q, want %q", args, err, out, want)
			}
		}
	} else {
		t.Log("curl not found: plain HTTP checked in process only")
	}

	// Nothing but the proxy is reachable from the generation.
	for _, addr := range []string{echo, "169.254.64.21:22", "169.254.64.21:80", "10.255.255.1:80"} {
		if c, err := dialIn(n, addr, 500*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("generation reached %s directly", addr)
		}
	}

	// A second long-lived tunnel and an idle proxy connection, then Cut.
	c2, br2 := tunnelIn(t, n, echo)
	if err := echoOnce(c2, br2, "second"); err != nil {
		t.Fatal(err)
	}
	idle, err := dialIn(n, info.Proxy, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	waitFor(t, 5*time.Second, "the proxy to accept the idle connection", func() bool {
		n.proxy.mu.Lock()
		defer n.proxy.mu.Unlock()
		return len(n.proxy.clients) == 3
	})
	rep, err := n.Cut(newTestCgroup(t).id)
	if err != nil {
		t.Fatalf("Cut: %v", err)
	}
	if rep.TunnelsClosed != 2 || rep.ConnectionsClosed != 3 || !rep.LinkDeleted || len(rep.Connections) != 2 ||
		rep.DurationsMS["tunnels"] <= 0 || rep.DurationsMS["connections"] <= 0 || rep.DurationsMS["link"] <= 0 {
		t.Errorf("cut report: %+v", rep)
	}
	t.Logf("cut report: %+v", rep)
	for i, cc := range []net.Conn{c1, c2, idle} {
		_ = cc.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 16)
		_, err := cc.Read(buf)
		var ne net.Error
		if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("connection %d not cut: %v", i, err)
		}
	}
	egH, err := netlink.NewHandleAt(n.egress)
	if err != nil {
		t.Fatal(err)
	}
	defer egH.Close()
	if _, err := egH.LinkByName("shg5"); !isNotFound(err) {
		t.Errorf("host side still present: %v", err)
	}
	if names := strings.Join(linkNames(t, genH), ","); names != "lo" {
		t.Errorf("generation links after cut: %s", names)
	}
	if c, err := dialIn(n, info.Proxy, 500*time.Millisecond); err == nil {
		c.Close()
		t.Error("proxy reachable after Cut")
	}
	closed := audit.Find(EventConnectionClosed)
	cutClosed := 0
	for _, r := range closed {
		if r["cut"] == true && r["kind"] == "connect" && r["bytes_up"].(float64) > 0 {
			cutClosed++
		}
	}
	if cutClosed != 2 {
		t.Errorf("closed-by-cut audit records: %v", closed)
	}
	if again, err := n.Cut(1); err != nil || again.TunnelsClosed != 0 || again.LinkDeleted {
		t.Errorf("second Cut: %+v %v", again, err)
	}
	if !n.Info().Cut {
		t.Error("Info does not say cut")
	}
	if strings.Contains(string(audit.Bytes()), "not-audited") || strings.Contains(string(logs.Bytes()), "not-audited") {
		t.Error("a request path/query reached the audit log or logs")
	}
}

// TestProxyRefusesForeignClient: a connection to the proxy from any address
// but the generation's peer is refused and audited.
func TestProxyRefusesForeignClient(t *testing.T) {
	requireNetns(t)
	n, audit, _ := newTestNetwork(t, 9, ModeIsolated, "127.0.0.1:1")
	var c net.Conn
	err := runIn(n.egress, func() error { // from the host side's own address
		var err error
		c, err = net.DialTimeout("tcp", n.Info().Proxy, 2*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("foreign client was served")
	}
	if r := audit.Find(EventConnectionRefused); len(r) != 1 || r[0]["reason"] != "client_not_generation_peer" {
		t.Errorf("audit: %v", r)
	}
}

// TestNoneNetwork: "none" has loopback only: its own lo works, there is no
// route anywhere, a concurrent isolated generation's proxy is unreachable,
// and there is nothing to cut.
func TestNoneNetwork(t *testing.T) {
	requireNetns(t)
	iso, _, _ := newTestNetwork(t, 11, ModeIsolated, "127.0.0.1:1")
	n, _, _ := newTestNetwork(t, 12, ModeNone)
	if n.Env() != nil || n.Info().Mode != string(ModeNone) || n.Info().NetnsInode == 0 || n.Info().Proxy != "" {
		t.Errorf("none: env %v info %+v", n.Env(), n.Info())
	}
	err := n.Run(func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Close()
			}
		}()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
		if err != nil {
			return fmt.Errorf("loopback inside none: %w", err)
		}
		return c.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{iso.Info().Proxy, "169.254.64.1:3128", "127.0.0.53:53"} {
		if c, err := dialIn(n, addr, 500*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("none reached %s", addr)
		}
	}
	h, err := netlink.NewHandleAt(n.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if names := strings.Join(linkNames(t, h), ","); names != "lo" {
		t.Errorf("links: %s", names)
	}
	if routes, _ := h.RouteList(nil, netlink.FAMILY_V4); len(routes) != 0 {
		t.Errorf("routes in none: %v", routes)
	}
	if rep, err := n.Cut(newTestCgroup(t).id); err != nil || rep.LinkDeleted || rep.TunnelsClosed != 0 || len(rep.Connections) != 0 {
		t.Errorf("Cut in none: %+v %v", rep, err)
	}
}

// TestHostNetwork: host mode runs fn in shim's own namespace, sets no proxy
// and has no link to cut (its sockets are: TestDestroySocketsAbortsQueuedBytes).
func TestHostNetwork(t *testing.T) {
	requireNetns(t)
	n, err := New(3, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	self, _ := netns.Get()
	defer self.Close()
	var inside uint64
	if err := n.Run(func() error { h, _ := netns.Get(); defer h.Close(); inside = nsInode(h); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != nsInode(self) || n.Env() != nil || n.Info().Mode != string(ModeHost) {
		t.Errorf("host: ns %d vs %d, env %v, info %+v", inside, nsInode(self), n.Env(), n.Info())
	}
	if rep, err := n.Cut(newTestCgroup(t).id); err != nil || rep.LinkDeleted {
		t.Errorf("host Cut: %+v %v", rep, err)
	}
}

// TestRunRestoresThread: after Run (also when fn fails or panics) later
// work on any thread is back in shim's namespace.
func TestRunRestoresThread(t *testing.T) {
	requireNetns(t)
	n, _, _ := newTestNetwork(t, 13, ModeNone)
	self, _ := netns.Get()
	defer self.Close()
	want := nsInode(self)
	var in uint64
	_ = n.Run(func() error { h, _ := netns.Get(); in = nsInode(h); h.Close(); return nil })
	if in != n.Info().NetnsInode {
		t.Errorf("fn ran in %d, want %d", in, n.Info().NetnsInode)
	}
	if err := n.Run(func() error { return errors.New("boom") }); err == nil || err.Error() != "boom" {
		t.Errorf("fn error not returned: %v", err)
	}
	if err := n.Run(func() error { panic("bad") }); err == nil {
		t.Error("panic not turned into an error")
	}
	for i := 0; i < 50; i++ {
		if err := onLockedThread(func() error {
			h, _ := netns.Get()
			defer h.Close()
			if nsInode(h) != want {
				return fmt.Errorf("thread in %d, want %d", nsInode(h), want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCutFailsClosed: a cut whose link deletion cannot be confirmed is an
// error with code CUT_FAILED, and Close still releases everything.
func TestCutFailsClosed(t *testing.T) {
	requireNetns(t)
	n, err := New(14, Config{Mode: ModeIsolated})
	if err != nil {
		t.Fatal(err)
	}
	n.egressH.Close()
	n.egressH = nil // netlink in the egress namespace is now impossible
	rep, err := n.Cut(newTestCgroup(t).id)
	if err == nil || api.CodeOf(err) != "CUT_FAILED" || rep.LinkDeleted {
		t.Fatalf("Cut: %+v %v (code %s)", rep, err, api.CodeOf(err))
	}
	if n.Info().Cut {
		t.Error("an unconfirmed cut is reported as cut")
	}
	_ = n.Close() // releases the namespaces, which takes the veth with them
}

// TestNetworkNoLeak: building, cutting and closing networks leaves no fd, no
// link in shim's namespace, and no thread outside it.
func TestNetworkNoLeak(t *testing.T) {
	requireNetns(t)
	// Count namespace fds: other tests' sockets may still be closing.
	countFDs := func() int {
		e, _ := os.ReadDir("/proc/self/fd")
		n := 0
		for _, f := range e {
			if l, _ := os.Readlink("/proc/self/fd/" + f.Name()); strings.HasPrefix(l, "net:[") {
				n++
			}
		}
		return n
	}
	cg := newTestCgroup(t)
	before := countFDs()
	for i := uint64(0); i < 5; i++ {
		n, err := New(100+i, Config{Mode: ModeIsolated, Allow: []string{"127.0.0.1:1"}})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := n.Cut(cg.id); err != nil {
				t.Fatal(err)
			}
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		if err := n.Close(); err != nil {
			t.Fatal("second Close:", err)
		}
		m, err := New(200+i, Config{Mode: ModeNone})
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	// Fewer is fine (an earlier test's namespace fd closed meanwhile); more
	// is a leak, unless it goes away: a goroutine of an earlier test (or of
	// a closed proxy) may hold one for a moment after Close has returned
	// (seen under a second suite). A leak never goes away.
	after := countFDs()
	if after > before {
		waitFor(t, 10*time.Second, fmt.Sprintf("namespace fds back to %d (now %d)", before, after), func() bool {
			after = countFDs()
			return after <= before
		})
	}
	h, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if names := strings.Join(linkNames(t, h), ","); names != "lo" {
		t.Errorf("links in the test namespace: %s", names)
	}
}

// TestConfigErrors: bad input is BAD_REQUEST before anything is
// created.
func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Mode: "bridge"},
		{Mode: ModeIsolated, Subnet: "10.0.0.0/31"},
		{Mode: ModeIsolated, Subnet: "fe80::/64"},
		{Mode: ModeIsolated, Allow: []string{"host:99999"}},
		{Mode: ModeIsolated, Allow: []string{"http://host/path"}},
		{Mode: ModeIsolated, Allow: []string{"a*b.com"}},
	} {
		if _, err := New(1, cfg); err == nil || api.CodeOf(err) != "BAD_REQUEST" {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

// TestAllowList: default ports per request kind, explicit ports, wildcard
// subdomains, IPs.
func TestAllowList(t *testing.T) {
	list, err := parseAllowList([]string{"GitHub.com", "api.example.org:8443", "*.corp.test", "10.1.2.3:22", "[::1]:8080"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host          string
		port, defPort int
		want          bool
	}{
		{"github.com", 443, 443, true},
		{"github.com.", 443, 443, true},
		{"github.com", 80, 80, true},
		{"github.com", 22, 443, false},
		{"gist.github.com", 443, 443, false},
		{"api.example.org", 8443, 443, true},
		{"api.example.org", 443, 443, false},
		{"x.corp.test", 443, 443, true},
		{"corp.test", 443, 443, false},
		{"10.1.2.3", 22, 443, true},
		{"::1", 8080, 443, true},
	} {
		if got := allowed(list, tc.host, tc.port, tc.defPort); got != tc.want {
			t.Errorf("allowed(%s:%d) = %v", tc.host, tc.port, got)
		}
	}
}

// TestIsolatedSuspendAndResume: Suspend (a lease that ran out) aborts a
// live tunnel as Cut does but keeps the link, and the proxy refuses, never
// dials, every connection until Resume; then tunnels work again, and a Cut
// ends the network as usual.
func TestIsolatedSuspendAndResume(t *testing.T) {
	requireNetns(t)
	echo := echoServer(t, "127.0.0.1:0")
	n, audit, _ := newTestNetwork(t, 9, ModeIsolated, echo)
	c, br := tunnelIn(t, n, echo)
	if err := echoOnce(c, br, "before"); err != nil {
		t.Fatal(err)
	}
	rep, err := n.Suspend(0)
	if err != nil || rep.TunnelsClosed != 1 || rep.LinkDeleted {
		t.Fatalf("Suspend: %+v %v", rep, err)
	}
	if err := echoOnce(c, br, "after"); err == nil {
		t.Fatal("a tunnel survived the suspension")
	}
	genH, err := netlink.NewHandleAt(n.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer genH.Close()
	if names := strings.Join(linkNames(t, genH), ","); names != "lo,eth0" {
		t.Fatalf("links after Suspend: %s", names)
	}
	opened := len(audit.Find(EventConnectionOpened))
	// The reset may come before connect(2) returns or after.
	if s, err := dialIn(n, n.Info().Proxy, 3*time.Second); err == nil {
		_, err = connectTunnel(s, echo)
		s.Close()
		if err == nil {
			t.Fatal("a suspended generation got a tunnel")
		}
	}
	if got := len(audit.Find(EventConnectionOpened)); got != opened {
		t.Fatalf("the proxy dialled for a suspended generation: %d opened, was %d", got, opened)
	}
	refused := audit.Find(EventConnectionRefused)
	if len(refused) == 0 || refused[len(refused)-1]["reason"] != "generation_suspended" {
		t.Fatalf("refusal audit: %v", refused)
	}
	n.Resume()
	c2, br2 := tunnelIn(t, n, echo)
	if err := echoOnce(c2, br2, "resumed"); err != nil {
		t.Fatal(err)
	}
	if rep, err := n.Cut(0); err != nil || !rep.LinkDeleted || rep.TunnelsClosed != 1 {
		t.Fatalf("Cut after Resume: %+v %v", rep, err)
	}
	if rep, err := n.Suspend(0); err != nil || rep.TunnelsClosed != 0 {
		t.Fatalf("Suspend after Cut: %+v %v", rep, err)
	}
}
