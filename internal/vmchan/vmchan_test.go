package vmchan

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseListenAndConnect(t *testing.T) {
	good := map[string]Spec{
		"vsock:1024":    {Kind: KindVsock, Port: 1024},
		"serial:shim.0": {Kind: KindSerial, Name: "shim.0"},
	}
	for in, want := range good {
		got, err := ParseListen(in)
		if err != nil || got != want {
			t.Errorf("ParseListen(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "vsock:", "vsock:0", "vsock:x", "vsock:4294967295", "serial:", "serial:a/b", "serial:..", "tcp:80", "unix:/x"} {
		if _, err := ParseListen(in); err == nil {
			t.Errorf("ParseListen(%q) accepted", in)
		}
	}
	goodC := map[string]Spec{
		"vsock:3:1024":               {Kind: KindVsock, CID: 3, Port: 1024},
		"unix:/run/shim/shim.sock":   {Kind: KindUnix, Name: "/run/shim/shim.sock"},
		"vsock-uds:/tmp/v.sock:1024": {Kind: KindVsockUDS, Name: "/tmp/v.sock", Port: 1024},
		"vsock-uds:/a:b/v.sock:7":    {Kind: KindVsockUDS, Name: "/a:b/v.sock", Port: 7},
		"serial:/tmp/vm/ctl.sock":    {Kind: KindSerial, Name: "/tmp/vm/ctl.sock"},
	}
	for in, want := range goodC {
		got, err := ParseConnect(in)
		if err != nil || got != want {
			t.Errorf("ParseConnect(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if got.String() != in {
			t.Errorf("%+v.String() = %q, want %q", got, got.String(), in)
		}
	}
	for _, in := range []string{"vsock:3", "vsock:x:1", "vsock:3:0", "unix:", "vsock-uds:/x", "vsock-uds::5", "serial:", "tcp:1.2.3.4:5"} {
		if _, err := ParseConnect(in); err == nil {
			t.Errorf("ParseConnect(%q) accepted", in)
		}
	}
}

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// TestAdmitOnlyTheHost: a vsock peer is admitted only as CID 2; CID 1
// (the guest's loopback) and any guest CID are refused, as is a peer on
// no vmchan channel.
func TestAdmitOnlyTheHost(t *testing.T) {
	cases := []struct {
		remote net.Addr
		ok     bool
	}{
		{VsockAddr{CID: CIDHost, Port: 1234}, true},
		{VsockAddr{CID: CIDLocal, Port: 1234}, false},
		{VsockAddr{CID: 3, Port: 1234}, false},
		{VsockAddr{CID: 0, Port: 1234}, false},
		{VsockAddr{CID: unix.VMADDR_CID_ANY, Port: 1234}, false},
		{serialAddr("shim.0"), true},
		{&net.UnixAddr{Name: "/x", Net: "unix"}, false},
	}
	for _, c := range cases {
		err := Admit(addrConn{remote: c.remote})
		if (err == nil) != c.ok {
			t.Errorf("Admit(%v) = %v, want admitted %v", c.remote, err, c.ok)
		}
	}
}

func TestListenVsockRefusesAHostTransport(t *testing.T) {
	dir := t.TempDir()
	old := hostTransport
	hostTransport = filepath.Join(dir, "vhost-vsock")
	defer func() { hostTransport = old }()
	if err := os.WriteFile(hostTransport, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := ListenVsock(40001); err != ErrHostTransport {
		if l != nil {
			l.Close()
		}
		t.Fatalf("ListenVsock with a host-side transport: %v, want ErrHostTransport", err)
	}
}

// TestDialHybrid speaks Firecracker's hybrid vsock handshake to a fake
// VMM: CONNECT PORT, OK, then the guest's stream, nothing of it eaten.
func TestDialHybrid(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "v.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				line, _ := br.ReadString('\n')
				if line != "CONNECT 52\n" {
					io.WriteString(c, "NO\n")
					return
				}
				io.WriteString(c, "OK 1073741824\nhello from the guest")
			}(c)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := DialHybrid(ctx, sock, 52)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "hello from the guest" {
		t.Fatalf("stream after the handshake: %q", b)
	}
	if _, err := DialHybrid(ctx, sock, 53); err == nil || !strings.Contains(err.Error(), `"NO"`) {
		t.Fatalf("refused CONNECT: %v", err)
	}
}

// TestSerialListenerServesHTTPSessions drives the serial listener over a
// pty (a stand-in for a virtio-serial port: one byte stream, a hang-up
// while nobody holds the other end): two requests on one kept-alive
// session, each answered once, and a handler that takes a while keeps its
// request's context (net/http cancels every later request of a connection
// whose read fails with anything but a net.Error timeout it set itself).
func TestSerialListenerServesHTTPSessions(t *testing.T) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer master.Close()
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	// Raw mode on the slave: bytes as they are.
	slave := "/dev/pts/" + strconv.Itoa(n)
	sfd, err := unix.Open(slave, unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	tio, err := unix.IoctlGetTermios(sfd, unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	tio.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	tio.Oflag &^= unix.OPOST
	tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	if err := unix.IoctlSetTermios(sfd, unix.TCSETS, tio); err != nil {
		t.Fatal(err)
	}
	unix.Close(sfd)

	dir := t.TempDir()
	oldLinks := serialLinks
	serialLinks = dir
	defer func() { serialLinks = oldLinks }()
	if err := os.Symlink(slave, filepath.Join(dir, "shim.0")); err != nil {
		t.Fatal(err)
	}
	l, err := ListenSerial("shim.0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Admit(addrConn{remote: serialAddr("shim.0")}); err != nil {
			t.Error(err)
		}
		select {
		case <-r.Context().Done():
			t.Errorf("%s: the request's context ended while it was handled: %v", r.URL.Path, context.Cause(r.Context()))
		case <-time.After(300 * time.Millisecond): // a handler that takes a while (a fence, a wait)
		}
		io.WriteString(w, "answer to "+r.URL.Path)
	})}
	go srv.Serve(l)
	defer srv.Close()

	rd := bufio.NewReader(master)
	for _, path := range []string{"/one", "/two"} {
		if _, err := io.WriteString(master, "GET "+path+" HTTP/1.1\r\nHost: shim\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", path, nil)
		resp, err := http.ReadResponse(rd, req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "answer to "+path {
			t.Fatalf("%s: answered %q", path, b)
		}
	}
}
