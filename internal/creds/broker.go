package creds

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Identify maps a caller pid (SO_PEERCRED, in the shim's pid namespace) to
// its generation and whether that generation is the current running one.
// The runtime supplies it (cgroup membership). An error means "not a
// harness process": the request is refused.
type Identify func(pid int) (gen uint64, current bool, err error)

// Audit receives one record per decision (credential request granted or
// refused, proxy connection opened, refused or closed). Fields never contain
// a secret. It must be safe for concurrent use.
type Audit func(event string, fields map[string]any)

// Audit event names.
const (
	EventCredentialGranted = "credential_granted"
	EventCredentialRefused = "credential_refused"
	EventConnectionOpened  = "connection_opened"
	EventConnectionRefused = "connection_refused"
	EventConnectionClosed  = "connection_closed"
)

// Wire protocol between HelperMain and the Broker on cred.sock, one request
// per connection:
//
//	request:  "shim-credential/1 <action>\n" then git's "key=value\n" lines,
//	          ended by an empty line (or by the helper half-closing).
//	response: "key=value\n" lines (protocol, host, [path], username,
//	          password) then an empty line; a refusal is an empty response.
//
// Both sides bound sizes and use deadlines, so a stuck or malicious peer
// costs one goroutine for at most brokerTimeout.
const (
	wireMagic      = "shim-credential/1"
	maxRequest     = 64 << 10
	maxLine        = 8 << 10
	brokerTimeout  = 5 * time.Second
	maxConcurrency = 64
)

// Broker serves git credential-helper requests on a unix socket and answers
// only the current generation's processes with the credentials granted to
// that generation. Credentials live in memory only.
type Broker struct {
	path     string
	ln       *net.UnixListener
	identify Identify
	audit    Audit
	log      hclog.Logger

	// answerMu is held shared from a decision until its answer is written,
	// and exclusively by Revoke and Suspend, so no answer for a generation
	// leaves the broker after either returned.
	answerMu sync.RWMutex

	mu      sync.Mutex
	grants  map[uint64][]Credential
	revoked map[uint64]bool
	// suspended generations keep their grants but get no answer until
	// Resume (a lease that ran out).
	suspended map[uint64]bool
	closed    bool
	conns     map[net.Conn]struct{}

	wg  sync.WaitGroup
	sem chan struct{}
}

// NewBroker listens on socketPath (mode 0666 so the harness uid can connect:
// identity comes from SO_PEERCRED, not from the socket mode). A stale socket
// left at socketPath is replaced; any other file there is an error.
func NewBroker(socketPath string, identify Identify, audit Audit, log hclog.Logger) (*Broker, error) {
	if identify == nil {
		return nil, errors.New("creds: NewBroker needs an Identify function")
	}
	if audit == nil {
		audit = func(string, map[string]any) {}
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if fi, err := os.Lstat(socketPath); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("creds: %s exists and is not a socket", socketPath)
		}
		if err := os.Remove(socketPath); err != nil {
			return nil, fmt.Errorf("creds: remove stale socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socketPath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("creds: listen on credential socket: %w", err)
	}
	if err := os.Chmod(socketPath, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("creds: chmod credential socket: %w", err)
	}
	return &Broker{
		path: socketPath, ln: ln, identify: identify, audit: audit, log: log.Named("creds"),
		grants: map[uint64][]Credential{}, revoked: map[uint64]bool{}, suspended: map[uint64]bool{},
		conns: map[net.Conn]struct{}{}, sem: make(chan struct{}, maxConcurrency),
	}, nil
}

// Path returns the socket path (for HarnessEnv).
func (b *Broker) Path() string { return b.path }

// Grant gives generation gen these credentials (replacing earlier grants of
// gen). They are copied and held in memory only. A revoked generation can
// never be granted again: generations are never reused.
func (b *Broker) Grant(gen uint64, creds []Credential) {
	cp := make([]Credential, 0, len(creds))
	for _, c := range creds {
		if err := c.Validate(); err != nil {
			b.log.Warn("ignoring invalid credential", "generation", gen, "credential", c, "error", err)
			continue
		}
		cp = append(cp, c)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.revoked[gen] {
		b.log.Warn("refusing to grant credentials to a revoked generation", "generation", gen)
		return
	}
	b.grants[gen] = cp
}

// Revoke forgets gen's credentials: from the moment it returns no request of
// gen is answered (a decision is taken under the same lock). It returns how
// many credentials were dropped. It is the credential half of the fence's
// cut step and cannot fail.
func (b *Broker) Revoke(gen uint64) int {
	b.answerMu.Lock()
	defer b.answerMu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.grants[gen])
	for i := range b.grants[gen] {
		b.grants[gen][i].Password = "" // drop our reference early
	}
	delete(b.grants, gen)
	delete(b.suspended, gen)
	b.revoked[gen] = true
	return n
}

// Suspend stops answering gen, as Revoke does, but keeps its grants in
// memory for Resume: the credential half of a lease's suspension. From
// the moment it returns no request of gen is answered. It returns how
// many credentials gen holds.
func (b *Broker) Suspend(gen uint64) int {
	b.answerMu.Lock()
	defer b.answerMu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.revoked[gen] {
		b.suspended[gen] = true
	}
	return len(b.grants[gen])
}

// Resume answers a suspended gen again; a revoked one stays revoked.
func (b *Broker) Resume(gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.suspended, gen)
}

// Granted reports how many credentials gen currently holds (for status).
func (b *Broker) Granted(gen uint64) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.grants[gen])
}

// Serve accepts requests until Close; it returns nil after Close.
func (b *Broker) Serve() error {
	for {
		c, err := b.ln.AcceptUnix()
		if err != nil {
			b.mu.Lock()
			closed := b.closed
			b.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			b.log.Warn("accept on credential socket failed", "error", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		b.sem <- struct{}{}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			c.Close()
			<-b.sem
			return nil
		}
		b.conns[c] = struct{}{}
		b.wg.Add(1)
		b.mu.Unlock()
		go func() {
			defer func() {
				if r := recover(); r != nil {
					b.log.Error("credential request handler panicked", "panic", fmt.Sprint(r))
				}
				c.Close()
				b.mu.Lock()
				delete(b.conns, c)
				b.mu.Unlock()
				<-b.sem
				b.wg.Done()
			}()
			b.handle(c)
		}()
	}
}

// Close stops Serve, closes open requests and removes the socket. It forgets
// every grant. Idempotent.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	for c := range b.conns {
		c.Close()
	}
	b.grants = map[uint64][]Credential{}
	b.mu.Unlock()
	err := b.ln.Close()
	b.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// peerPid returns the SO_PEERCRED pid of c (0 when the peer lives in a pid
// namespace the shim cannot see).
func peerPid(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	return int(cred.Pid), nil
}

// request is a parsed credential-helper request.
type request struct {
	action   string
	protocol string
	host     string
	path     string
	username string
}

// readRequest reads one bounded request. It never echoes input in errors.
func readRequest(r io.Reader) (request, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, maxRequest), 4096)
	var req request
	first := true
	for {
		line, err := readLine(br)
		if err != nil {
			if errors.Is(err, io.EOF) && !first {
				return req, nil
			}
			return req, err
		}
		if first {
			first = false
			magic, action, ok := strings.Cut(line, " ")
			if !ok || magic != wireMagic {
				return req, errors.New("bad request header")
			}
			req.action = action
			continue
		}
		if line == "" {
			return req, nil
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return req, errors.New("bad attribute line")
		}
		switch k {
		case "protocol":
			req.protocol = v
		case "host":
			req.host = v
		case "path":
			req.path = v
		case "username":
			req.username = v
		}
	}
}

// readLine reads a "\n"-terminated line of at most maxLine bytes; a final
// line without newline is returned with a nil error.
func readLine(br *bufio.Reader) (string, error) {
	var buf []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if err != nil {
			return "", err
		}
		buf = append(buf, chunk...)
		if len(buf) > maxLine {
			return "", errors.New("line too long")
		}
		if !isPrefix {
			break
		}
	}
	if bytes.IndexByte(buf, 0) >= 0 {
		return "", errors.New("NUL in request")
	}
	return strings.TrimSuffix(string(buf), "\r"), nil
}

// handle answers one connection.
func (b *Broker) handle(c *net.UnixConn) {
	_ = c.SetDeadline(time.Now().Add(brokerTimeout))
	pid, perr := peerPid(c)
	req, rerr := readRequest(c)
	fields := map[string]any{"pid": pid, "protocol": req.protocol, "host": req.host}
	if req.path != "" {
		fields["path"] = req.path
	}
	refuse := func(reason string) {
		fields["reason"] = reason
		b.audit(EventCredentialRefused, fields)
	}
	switch {
	case perr != nil || pid <= 0:
		refuse("peer_unknown")
		return
	case rerr != nil:
		refuse("bad_request")
		return
	case req.action != "get":
		refuse("unsupported_action")
		return
	}
	gen, current, err := b.identify(pid)
	if err != nil {
		refuse("not_a_generation")
		return
	}
	fields["generation"] = gen
	if !current {
		refuse("not_current_generation")
		return
	}
	var answer Credential
	found := false
	b.answerMu.RLock()
	defer b.answerMu.RUnlock()
	b.mu.Lock()
	grants, granted := b.grants[gen]
	revoked, suspended := b.revoked[gen], b.suspended[gen]
	best := -1
	for _, g := range grants {
		if g.matches(req.protocol, req.host, req.path, req.username) && len(g.Path) > best {
			answer, best, found = g, len(g.Path), true
		}
	}
	b.mu.Unlock()
	switch {
	case revoked:
		refuse("revoked")
		return
	case suspended:
		refuse("suspended")
		return
	case !granted:
		refuse("no_grant")
		return
	case !found:
		refuse("no_matching_credential")
		return
	}
	var out strings.Builder
	fmt.Fprintf(&out, "protocol=%s\nhost=%s\n", req.protocol, req.host)
	if req.path != "" {
		fmt.Fprintf(&out, "path=%s\n", req.path)
	}
	fmt.Fprintf(&out, "username=%s\npassword=%s\n\n", answer.Username, answer.Password)
	// Recorded before the answer is sent: the record's time is the
	// decision's, so it never comes after what the caller does next.
	fields["username"] = answer.Username
	b.audit(EventCredentialGranted, fields)
	if _, err := io.WriteString(c, out.String()); err != nil {
		delete(fields, "username")
		refuse("write_failed")
	}
}
