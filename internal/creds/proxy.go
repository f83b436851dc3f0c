package creds

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// allowEntry is one parsed --allow entry: a host name (lower case, or
// "*.domain" for any subdomain) or IP, and an optional port (0 = the
// default of the request kind: 443 for CONNECT, 80 for plain HTTP).
type allowEntry struct {
	host string
	port int
}

func (a allowEntry) String() string {
	h := a.host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if a.port == 0 {
		return h
	}
	return h + ":" + strconv.Itoa(a.port)
}

func normHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return h
}

func parseAllowList(list []string) ([]allowEntry, error) {
	var out []allowEntry
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		e := allowEntry{}
		if h, p, err := net.SplitHostPort(s); err == nil {
			port, perr := strconv.Atoi(p)
			if perr != nil || port < 1 || port > 65535 {
				return nil, errorf(CodeBadRequest, nil, fmt.Sprintf("allow entry %q: bad port", s))
			}
			e.host, e.port = normHost(h), port
		} else {
			e.host = normHost(s)
		}
		if e.host == "" || strings.ContainsAny(e.host, "/ @") || strings.Contains(strings.TrimPrefix(e.host, "*."), "*") {
			return nil, errorf(CodeBadRequest, nil, fmt.Sprintf("allow entry %q: want host[:port]", s))
		}
		out = append(out, e)
	}
	return out, nil
}

// allowed reports whether host:port may be reached; defPort is the port an
// entry without one allows.
func allowed(list []allowEntry, host string, port, defPort int) bool {
	host = normHost(host)
	for _, e := range list {
		p := e.port
		if p == 0 {
			p = defPort
		}
		if p != port {
			continue
		}
		if e.host == host {
			return true
		}
		if d, ok := strings.CutPrefix(e.host, "*."); ok && strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// proxy is a generation's egress proxy: HTTP CONNECT tunnels and plain-HTTP
// absolute-URI forwarding, allowlisted, audited, and cut as a whole.
type proxy struct {
	gen   uint64
	ln    net.Listener
	peer  net.IP
	allow []allowEntry
	audit Audit
	log   hclog.Logger

	mu      sync.Mutex
	closed  bool
	clients map[net.Conn]*proxied
	wg      sync.WaitGroup
}

// proxied is one client connection and, once dialled, its upstream.
type proxied struct {
	upstream net.Conn
}

const (
	proxyHeaderTimeout = 30 * time.Second
	proxyDialTimeout   = 10 * time.Second
	maxHeaderBytes     = 64 << 10
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
			time.Sleep(20 * time.Millisecond)
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
			c.Close()
			return
		}
		p.clients[c] = &proxied{}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer func() {
				if r := recover(); r != nil {
					p.log.Error("proxy handler panicked", "panic", fmt.Sprint(r))
				}
				c.Close()
				p.mu.Lock()
				if u := p.clients[c].upstream; u != nil {
					u.Close()
				}
				delete(p.clients, c)
				p.mu.Unlock()
				p.wg.Done()
			}()
			p.handle(c)
		}()
	}
}

// shutdown closes the listener and every connection, and waits up to
// timeout for the handlers to finish. It returns how many connections had an
// upstream (tunnels) and how many client connections were closed.
func (p *proxy) shutdown(timeout time.Duration) (tunnels, conns int, err error) {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	for c, pc := range p.clients {
		conns++
		if pc.upstream != nil {
			tunnels++
			pc.upstream.Close()
		}
		c.Close()
	}
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
	return tunnels, conns, err
}

// setUpstream records u for c, or refuses when the proxy is shutting down
// (so a dial racing with Cut cannot outlive it).
func (p *proxy) setUpstream(c, u net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.clients[c].upstream = u
	return true
}

// countingConn counts bytes read from and written to a net.Conn.
type countingConn struct {
	net.Conn
	read, written atomic.Int64
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
func (p *proxy) dial(c net.Conn, kind, target string) (net.Conn, bool) {
	fields := map[string]any{"generation": p.gen, "client": c.RemoteAddr().String(), "kind": kind, "target": target}
	u, err := net.DialTimeout("tcp", target, proxyDialTimeout)
	if err != nil {
		fields["reason"] = "upstream_unreachable"
		p.audit(EventConnectionRefused, fields)
		writeStatus(c, http.StatusBadGateway, "upstream unreachable")
		return nil, false
	}
	if !p.setUpstream(c, u) {
		u.Close()
		return nil, false
	}
	fields["remote"] = u.RemoteAddr().String() // the address the name resolved to
	p.audit(EventConnectionOpened, fields)
	return u, true
}

// auditClosed records the end of an upstream connection with its byte
// counts and whether Cut ended it.
func (p *proxy) auditClosed(kind, target string, c net.Conn, up, down int64, start time.Time) {
	p.mu.Lock()
	cut := p.closed
	p.mu.Unlock()
	p.audit(EventConnectionClosed, map[string]any{
		"generation": p.gen, "client": c.RemoteAddr().String(), "kind": kind, "target": target,
		"bytes_up": up, "bytes_down": down,
		"duration_ms": ms(time.Since(start)), "cut": cut,
	})
}

func (p *proxy) connect(c net.Conn, br *bufio.Reader, req *http.Request) {
	target, ok := p.target(c, "connect", req.RequestURI, 443)
	if !ok {
		return
	}
	start := time.Now()
	u, ok := p.dial(c, "connect", target)
	if !ok {
		return
	}
	var up, down atomic.Int64
	defer func() { p.auditClosed("connect", target, c, up.Load(), down.Load(), start) }()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	// Copy between the raw TCP connections so the kernel can splice; only
	// the bytes the client sent after its CONNECT head that are already
	// buffered go through br.
	if k := br.Buffered(); k > 0 {
		b, _ := br.Peek(k)
		m, err := u.Write(b)
		up.Add(int64(m))
		if err != nil {
			return
		}
		_, _ = br.Discard(k)
	}
	done := make(chan struct{}, 2)
	go func() {
		m, _ := io.Copy(u, c)
		up.Add(m)
		if tc, ok := u.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		m, _ := io.Copy(c, u)
		down.Add(m)
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
	raw, ok := p.dial(c, "http", target)
	if !ok {
		return false
	}
	u := &countingConn{Conn: raw}
	defer func() {
		p.mu.Lock()
		if pc := p.clients[c]; pc != nil {
			pc.upstream = nil
		}
		p.mu.Unlock()
		u.Close()
		p.auditClosed("http", target, c, u.written.Load(), u.read.Load(), start)
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
