package network

import (
	"bufio"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// slowListener is a loopback listener with a backlog of 0 whose accept
// queue is filled by one connection nobody accepts: the kernel drops every
// further SYN, so a dial to it hangs (SYN retransmitted after 1s) until
// release accepts the filler.
func slowListener(t *testing.T) (ln net.Listener, addr string, release func()) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(fd)
	port := sa.(*unix.SockaddrInet4).Port
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	filler, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	release = func() {
		nfd, _, err := unix.Accept(fd)
		if err == nil {
			unix.Close(nfd)
		}
	}
	ln = &fdListener{fd: fd}
	t.Cleanup(func() { unix.Close(fd) })
	return ln, addr, release
}

// fdListener accepts from a raw listening fd (only Accept is used).
type fdListener struct{ fd int }

func (l *fdListener) Accept() (net.Conn, error) {
	nfd, _, err := unix.Accept(l.fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(nfd), "upstream")
	defer f.Close()
	return net.FileConn(f)
}
func (l *fdListener) Close() error   { return nil }
func (l *fdListener) Addr() net.Addr { return nil }

// TestLeaseAttackSuspendedProxyStillForwardsADialInFlight: a plain-HTTP
// request whose upstream dial is in progress when the proxy is suspended
// (a lease ran out) is still sent upstream once the dial completes:
// setUpstream refuses only a closed proxy, not a suspended one. Cut does
// not have this hole (it sets closed).
func TestLeaseAttackSuspendedProxyStillForwardsADialInFlight(t *testing.T) {
	up, upAddr, release := slowListener(t)
	allow, err := parseAllowList([]string{upAddr})
	if err != nil {
		t.Fatal(err)
	}
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	audit := func(ev string, f map[string]any) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}
	p := newProxy(7, pln, net.ParseIP("127.0.0.1"), allow, audit, hclog.NewNullLogger())
	go p.serve()
	defer p.abort(time.Second)

	c, err := net.Dial("tcp", pln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := "push-secret-pack"
	req := "POST http://" + upAddr + "/repo.git/git-receive-pack HTTP/1.1\r\nHost: " + upAddr +
		"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the proxy has read the request and is dialling (SYN dropped)

	suspended := make(chan error, 1)
	go func() {
		_, err := p.suspend(2 * time.Second)
		suspended <- err
	}()
	time.Sleep(100 * time.Millisecond) // suspend has aborted the client
	release()                          // the dial may now complete (at the next SYN retransmit)
	got := make(chan string, 1)
	go func() {
		// The upstream: once the filler is accepted, the retransmitted
		// SYN completes; whatever the proxy sends is what left.
		uc, err := up.Accept()
		if err != nil {
			got <- "accept: " + err.Error()
			return
		}
		defer uc.Close()
		_ = uc.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, _ := io.ReadAll(bufio.NewReader(io.LimitReader(uc, 4096)))
		got <- string(b)
	}()

	err = <-suspended
	t.Logf("suspend returned %v", err)
	select {
	case s := <-got:
		if strings.Contains(s, "git-receive-pack") || strings.Contains(s, body) {
			t.Fatalf("a request reached upstream after the proxy was suspended:\n%q\nsuspend: %v", s, err)
		}
		t.Logf("upstream got %q", s)
	case <-time.After(5 * time.Second):
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range events {
		if ev == EventConnectionOpened {
			t.Fatalf("the proxy opened an upstream connection after its suspension: %v", events)
		}
	}
}
