package network

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shimdev/shim/api"
)

// Audit receives one record per decision of the proxy (connection opened,
// refused, closed). Fields never contain a secret or a query string. It
// must be safe for concurrent use. The runtime writes them to the audit
// log; the type is declared here so this package needs no sibling.
type Audit func(event string, fields map[string]any)

// Audit event names.
const (
	EventConnectionOpened  = "connection_opened"
	EventConnectionRefused = "connection_refused"
	EventConnectionClosed  = "connection_closed"
)

// proxy is a generation's egress proxy: HTTP CONNECT tunnels and plain-HTTP
// absolute-URI forwarding, allowlisted, audited, and aborted as a whole.
type proxy struct {
	gen   uint64
	ln    net.Listener
	peer  net.IP
	allow []allowEntry
	audit Audit
	log   hclog.Logger

	mu        sync.Mutex
	closed    bool                  // guarded by mu
	suspended bool                  // guarded by mu: every connection is refused until resume
	clients   map[net.Conn]*proxied // guarded by mu
	wg        sync.WaitGroup
}

// proxied is one client connection and what the proxy knows about it; the
// fields describe its current upstream connection (one per CONNECT, one per
// plain-HTTP request) and are guarded by proxy.mu, the counters excepted.
type proxied struct {
	kind     string // "connect" or "http"
	target   string // host:port
	request  string // "CONNECT host:port" or "METHOD scheme://host/path"
	upstream net.Conn
	up, down atomic.Int64  // bytes relayed to and from upstream
	done     chan struct{} // closed when its handler has finished
	aborted  bool          // by a cut or a suspension: it gets no upstream again
}

const (
	proxyHeaderTimeout = 30 * time.Second
	proxyDialTimeout   = 10 * time.Second
	maxHeaderBytes     = 64 << 10
	// copyChunk bounds how far the byte counters may lag behind a CONNECT
	// tunnel: each chunk still moves by splice(2) between the sockets.
	copyChunk = 128 << 10
)

func newProxy(gen uint64, ln net.Listener, peer net.IP, allow []allowEntry, audit Audit, log hclog.Logger) *proxy {
	return &proxy{gen: gen, ln: ln, peer: peer, allow: allow, audit: audit, log: log.Named("proxy"), clients: map[net.Conn]*proxied{}}
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(20 * time.Millisecond) // EMFILE and the like: back off, do not spin
			continue
		}
		ra, _ := c.RemoteAddr().(*net.TCPAddr)
		if ra == nil || !ra.IP.Equal(p.peer) {
			p.audit(EventConnectionRefused, map[string]any{"generation": p.gen, "client": c.RemoteAddr().String(), "reason": "client_not_generation_peer"})
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			abortTCP(c)
			return
		}
		if p.suspended {
			// A connection the kernel completed before the freeze (its
			// request may be queued already): never dialled.
			p.mu.Unlock()
			p.audit(EventConnectionRefused, map[string]any{"generation": p.gen, "client": c.RemoteAddr().String(), "reason": "generation_suspended"})
			abortTCP(c)
			continue
		}
		pc := &proxied{done: make(chan struct{})}
		p.clients[c] = pc
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer func() {
				if r := recover(); r != nil {
					p.log.Error("proxy handler panicked", "panic", fmt.Sprint(r))
				}
				c.Close()
				p.mu.Lock()
				if u := pc.upstream; u != nil {
					u.Close()
				}
				delete(p.clients, c)
				p.mu.Unlock()
				close(pc.done)
				p.wg.Done()
			}()
			p.handle(c)
		}()
	}
}

// abortResult is what abort did.
type abortResult struct {
	conns   []api.Connection // one per connection with an upstream, in no order
	tunnels int              // connections with an upstream
	clients int              // client connections closed
}

// abort closes the listener and aborts every connection: for each upstream
// it first reads the kernel's view (TCP_INFO, queues), then closes it with
// SO_LINGER 0, then the client side the same way, so both peers get an RST
// and nothing queued is flushed. It waits up to timeout for the handlers to
// finish. A second call finds nothing.
func (p *proxy) abort(timeout time.Duration) (abortResult, error) {
	var err error
	p.mu.Lock()
	already := p.closed
	p.closed = true
	res, _ := p.abortClientsLocked()
	p.mu.Unlock()
	if !already {
		if lerr := p.ln.Close(); lerr != nil && !errors.Is(lerr, net.ErrClosed) {
			err = fmt.Errorf("close proxy listener: %w", lerr)
		}
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		err = errors.Join(err, fmt.Errorf("proxy connections still open after %s", timeout))
	}
	return res, err
}

// suspend aborts every connection as abort does but keeps listening, and
// refuses every connection accepted from now on until resume. It waits up
// to timeout for the aborted connections' handlers to finish.
func (p *proxy) suspend(timeout time.Duration) (abortResult, error) {
	p.mu.Lock()
	p.suspended = true
	res, handlers := p.abortClientsLocked()
	p.mu.Unlock()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for _, h := range handlers {
		select {
		case <-h:
		case <-deadline.C:
			return res, fmt.Errorf("proxy connections still open after %s", timeout)
		}
	}
	return res, nil
}

// resume ends a suspension: connections are served again.
func (p *proxy) resume() {
	p.mu.Lock()
	p.suspended = false
	p.mu.Unlock()
}

// abortClientsLocked aborts every client connection and its upstream, and
// returns what they were and their handlers' done channels. p.mu held.
func (p *proxy) abortClientsLocked() (abortResult, []<-chan struct{}) {
	var res abortResult
	handlers := make([]<-chan struct{}, 0, len(p.clients))
	for c, pc := range p.clients {
		res.clients++
		if u := pc.upstream; u != nil {
			res.tunnels++
			res.conns = append(res.conns, p.describe(c, pc))
			abortTCP(u)
		}
		abortTCP(c)
		pc.aborted = true
		handlers = append(handlers, pc.done)
	}
	return res, handlers
}

// describe reports pc as a Conn; called with p.mu held, before the abort.
func (p *proxy) describe(c net.Conn, pc *proxied) api.Connection {
	conn := api.Connection{
		Via: ViaProxy, Client: c.RemoteAddr().String(), Kind: pc.kind, Target: pc.target,
		Request: pc.request, BytesUp: pc.up.Load(), BytesDown: pc.down.Load(),
	}
	if tc, ok := pc.upstream.(*net.TCPConn); ok {
		kernelView(tc, &conn)
	} else {
		conn.Protocol, conn.State, conn.InFlight = "tcp", "unknown", true
	}
	return conn
}

// setUpstream records u for c, or refuses when the proxy is shutting down
// or suspended, or c was aborted (so a dial racing with Cut or Suspend
// never gets the request: a resume soon after does not revive it).
func (p *proxy) setUpstream(c, u net.Conn, kind, target, request string) (*proxied, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.clients[c]
	if p.closed || p.suspended || pc.aborted {
		return nil, false
	}
	pc.upstream, pc.kind, pc.target, pc.request = u, kind, target, request
	pc.up.Store(0)
	pc.down.Store(0)
	return pc, true
}

// countingConn counts bytes read from and written to a net.Conn.
type countingConn struct {
	net.Conn
	read, written *atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

// copyCounted copies src to dst in chunks, adding each to n as it goes, so
// that a cut sees how much was relayed so far. Between two TCP connections
// io.Copy still splices each chunk in the kernel.
func copyCounted(dst, src net.Conn, n *atomic.Int64) {
	for {
		m, err := io.Copy(dst, &io.LimitedReader{R: src, N: copyChunk})
		n.Add(m)
		if err != nil || m < copyChunk {
			return
		}
	}
}

func writeStatus(c net.Conn, code int, msg string) {
	body := "shim egress proxy: " + msg + "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}

// handle serves one client connection: one CONNECT tunnel, or plain-HTTP
// requests (one upstream connection per request).
func (p *proxy) handle(c net.Conn) {
	// The limit applies while a request head is read and is lifted for
	// bodies and tunnels; one bufio.Reader serves all of it so no byte read
	// ahead is lost.
	lr := &io.LimitedReader{R: c}
	br := bufio.NewReaderSize(lr, 16<<10)
	for {
		lr.N = maxHeaderBytes
		_ = c.SetReadDeadline(time.Now().Add(proxyHeaderTimeout))
		req, err := http.ReadRequest(br)
		if err != nil {
			if lr.N <= 0 {
				writeStatus(c, http.StatusRequestHeaderFieldsTooLarge, "request head too large")
			}
			return
		}
		lr.N = 1 << 62
		_ = c.SetReadDeadline(time.Time{})
		if req.Method == http.MethodConnect {
			p.connect(c, br, req)
			return
		}
		if !p.forward(c, br, req) {
			return
		}
	}
}

// target checks host:port against the allowlist and audits a refusal.
func (p *proxy) target(c net.Conn, kind, hostport string, defPort int) (string, bool) {
	fields := map[string]any{"generation": p.gen, "client": c.RemoteAddr().String(), "kind": kind}
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		host, portStr = hostport, strconv.Itoa(defPort)
	}
	port, perr := strconv.Atoi(portStr)
	target := net.JoinHostPort(normHost(host), portStr)
	fields["target"] = target
	if host == "" || perr != nil || port < 1 || port > 65535 {
		fields["reason"] = "bad_target"
		p.audit(EventConnectionRefused, fields)
		writeStatus(c, http.StatusBadRequest, "bad target")
		return "", false
	}
	if !allowed(p.allow, host, port, defPort) {
		fields["reason"] = "not_allowed"
		p.audit(EventConnectionRefused, fields)
		writeStatus(c, http.StatusForbidden, "destination not allowed")
		return "", false
	}
	return target, true
}

// dial connects to target from shim's namespace (this goroutine's thread is
// never moved) and registers the upstream for Cut.
func (p *proxy) dial(c net.Conn, kind, target, request string) (net.Conn, *proxied, bool) {
	fields := map[string]any{"generation": p.gen, "client": c.RemoteAddr().String(), "kind": kind, "target": target}
	u, err := net.DialTimeout("tcp", target, proxyDialTimeout)
	if err != nil {
		fields["reason"] = "upstream_unreachable"
		p.audit(EventConnectionRefused, fields)
		writeStatus(c, http.StatusBadGateway, "upstream unreachable")
		return nil, nil, false
	}
	pc, ok := p.setUpstream(c, u, kind, target, request)
	if !ok {
		abortTCP(u)
		return nil, nil, false
	}
	fields["remote"] = u.RemoteAddr().String() // the address the name resolved to
	p.audit(EventConnectionOpened, fields)
	return u, pc, true
}

// auditClosed records the end of an upstream connection with its byte
// counts and whether Cut ended it.
func (p *proxy) auditClosed(kind, target string, c net.Conn, pc *proxied, start time.Time) {
	p.mu.Lock()
	cut := p.closed
	p.mu.Unlock()
	p.audit(EventConnectionClosed, map[string]any{
		"generation": p.gen, "client": c.RemoteAddr().String(), "kind": kind, "target": target,
		"bytes_up": pc.up.Load(), "bytes_down": pc.down.Load(),
		"duration_ms": ms(time.Since(start)), "cut": cut,
	})
}

func (p *proxy) connect(c net.Conn, br *bufio.Reader, req *http.Request) {
	target, ok := p.target(c, "connect", req.RequestURI, 443)
	if !ok {
		return
	}
	start := time.Now()
	u, pc, ok := p.dial(c, "connect", target, "CONNECT "+target)
	if !ok {
		return
	}
	defer p.auditClosed("connect", target, c, pc, start)
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	// Only the bytes the client sent after its CONNECT head that are
	// already buffered go through br; the rest is spliced.
	if k := br.Buffered(); k > 0 {
		b, _ := br.Peek(k)
		m, err := u.Write(b)
		pc.up.Add(int64(m))
		if err != nil {
			return
		}
		_, _ = br.Discard(k)
	}
	done := make(chan struct{}, 2)
	go func() {
		copyCounted(u, c, &pc.up)
		if tc, ok := u.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		copyCounted(c, u, &pc.down)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// hopHeaders are removed before forwarding (RFC 9110 section 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authorization", "Proxy-Authenticate", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// requestLine is what the report may say about a request: the method and
// the URL without userinfo, query or fragment (where secrets go).
func requestLine(req *http.Request) string {
	u := url.URL{Scheme: req.URL.Scheme, Host: req.URL.Host, Path: req.URL.Path, RawPath: req.URL.RawPath}
	return req.Method + " " + u.String()
}

// forward relays one plain-HTTP absolute-URI request. It reports whether the
// client connection may carry another request.
func (p *proxy) forward(c net.Conn, br *bufio.Reader, req *http.Request) bool {
	if req.URL == nil || req.URL.Scheme != "http" || req.URL.Host == "" {
		p.audit(EventConnectionRefused, map[string]any{"generation": p.gen, "client": c.RemoteAddr().String(), "kind": "http", "reason": "not_absolute_http_uri"})
		writeStatus(c, http.StatusBadRequest, "only CONNECT and absolute http:// requests are proxied")
		return false
	}
	target, ok := p.target(c, "http", req.URL.Host, 80)
	if !ok {
		return false
	}
	start := time.Now()
	raw, pc, ok := p.dial(c, "http", target, requestLine(req))
	if !ok {
		return false
	}
	u := &countingConn{Conn: raw, read: &pc.down, written: &pc.up}
	defer func() {
		p.mu.Lock()
		pc.upstream = nil
		p.mu.Unlock()
		u.Close()
		p.auditClosed("http", target, c, pc, start)
	}()
	if conn := req.Header.Get("Connection"); conn != "" {
		for _, h := range strings.Split(conn, ",") {
			req.Header.Del(strings.TrimSpace(h))
		}
	}
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	keep := !req.Close
	req.RequestURI = ""
	req.Close = true // one upstream connection per request
	if err := req.Write(u); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(u), req)
	if err != nil {
		writeStatus(c, http.StatusBadGateway, "bad upstream response")
		return false
	}
	defer resp.Body.Close()
	for _, h := range hopHeaders {
		if h != "Transfer-Encoding" {
			resp.Header.Del(h)
		}
	}
	// Without a length the body ends when the connection closes.
	if resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 {
		keep = false
	}
	resp.Close = !keep
	if err := resp.Write(c); err != nil {
		return false
	}
	return keep
}
