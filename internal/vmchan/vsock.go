package vmchan

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// VsockAddr is one end of a vsock connection.
type VsockAddr struct{ CID, Port uint32 }

func (a VsockAddr) Network() string { return "vsock" }
func (a VsockAddr) String() string  { return fmt.Sprintf("vsock:%d:%d", a.CID, a.Port) }

// hostTransport is the device of vhost_vsock, the host-side transport.
// A guest that has it can bind CID 2 itself, and then a guest process
// would look like the host to Admit.
var hostTransport = "/dev/vhost-vsock"

// ErrHostTransport is Listen's refusal in a guest with a host-side vsock
// transport.
var ErrHostTransport = errors.New("this machine has a host-side vsock transport (/dev/vhost-vsock): " +
	"a process here could connect as CID 2, the host, so the vsock listener could not tell the host from a harness")

type vsockListener struct {
	f    *os.File
	rc   syscall.RawConn
	addr VsockAddr
}

// ListenVsock listens on port of every CID of this guest (VMADDR_CID_ANY).
// It admits nothing by itself: the server calls Admit on every connection.
func ListenVsock(port uint32) (net.Listener, error) {
	if _, err := os.Stat(hostTransport); err == nil {
		return nil, ErrHostTransport
	}
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket (is the vsock transport loaded?): %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock bind port %d: %w", port, err)
	}
	if err := unix.Listen(fd, 64); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock listen: %w", err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("vsock-listener:%d", port))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &vsockListener{f: f, rc: rc, addr: VsockAddr{CID: unix.VMADDR_CID_ANY, Port: port}}, nil
}

func (l *vsockListener) Accept() (net.Conn, error) {
	var nfd int
	var sa unix.Sockaddr
	var aerr error
	err := l.rc.Read(func(fd uintptr) bool {
		nfd, sa, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return aerr != unix.EAGAIN
	})
	if err != nil {
		if errors.Is(err, os.ErrClosed) {
			return nil, net.ErrClosed
		}
		return nil, err
	}
	if aerr != nil {
		return nil, &net.OpError{Op: "accept", Net: "vsock", Addr: l.addr, Err: aerr}
	}
	remote := VsockAddr{}
	if vm, ok := sa.(*unix.SockaddrVM); ok {
		remote = VsockAddr{CID: vm.CID, Port: vm.Port}
	}
	return newFileConn(nfd, "vsock", l.addr, remote), nil
}

func (l *vsockListener) Close() error   { return l.f.Close() }
func (l *vsockListener) Addr() net.Addr { return l.addr }

// Admit is the admission of a connection on a vmchan listener: a vsock
// peer must be the host (CID 2); every other CID is a process of this
// guest (CID 1 through the loopback transport, or the guest's own CID)
// and is refused whatever its uid. A virtio-serial port's peer is always
// the host. Anything else is refused.
func Admit(c net.Conn) error {
	switch a := c.RemoteAddr().(type) {
	case VsockAddr:
		if a.CID != CIDHost {
			return fmt.Errorf("vsock peer CID %d is not the host (CID %d): processes inside the guest may not control shim over vsock", a.CID, CIDHost)
		}
		return nil
	case serialAddr:
		return nil
	}
	return fmt.Errorf("peer %v is on no channel vmchan knows", c.RemoteAddr())
}

// fileConn is a net.Conn over a non-blocking socket or device file (Go's
// poller gives it deadlines).
type fileConn struct {
	*os.File
	local, remote net.Addr
}

func newFileConn(fd int, name string, local, remote net.Addr) *fileConn {
	return &fileConn{File: os.NewFile(uintptr(fd), name), local: local, remote: remote}
}

func (c *fileConn) Read(b []byte) (int, error) {
	n, err := c.File.Read(b)
	return n, netError("read", c.remote, err)
}

func (c *fileConn) Write(b []byte) (int, error) {
	n, err := c.File.Write(b)
	return n, netError("write", c.remote, err)
}

// netError makes an *os.File's error a net.Error, as net/http expects of
// a connection: its server tells a deadline it set itself (Timeout, on a
// net.Error only) from a broken connection, and on anything else cancels
// every later request's context on the connection.
func netError(op string, addr net.Addr, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	if errors.Is(err, os.ErrClosed) {
		err = net.ErrClosed
	} else if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	return &net.OpError{Op: op, Net: addr.Network(), Addr: addr, Err: err}
}

func (c *fileConn) LocalAddr() net.Addr  { return c.local }
func (c *fileConn) RemoteAddr() net.Addr { return c.remote }

// DialVsock connects to cid:port (from the host: the guest's CID).
func DialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w", err)
	}
	c := newFileConn(fd, "vsock", VsockAddr{}, VsockAddr{CID: cid, Port: port})
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	cerr := unix.Connect(fd, &unix.SockaddrVM{CID: cid, Port: port})
	if cerr == unix.EINPROGRESS {
		werr := rc.Write(func(fd uintptr) bool {
			n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
			if err != nil {
				cerr = err
				return true
			}
			cerr = unix.Errno(n)
			if n == 0 {
				cerr = nil
			}
			return true
		})
		if werr != nil {
			cerr = werr
		}
	}
	if cerr != nil {
		c.Close()
		return nil, fmt.Errorf("vsock connect %d:%d: %w", cid, port, cerr)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// maxHybridReply bounds the line a hybrid vsock's VMM answers CONNECT with.
const maxHybridReply = 128

// DialHybrid connects through Firecracker's hybrid vsock: the unix socket
// at path is the VMM's end of the guest's vsock device; "CONNECT PORT\n"
// asks it for the guest's port, and it answers "OK <host port>\n" before
// the stream is the guest's.
func DialHybrid(ctx context.Context, path string, port uint32) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		c.Close()
		return nil, fmt.Errorf("hybrid vsock %s: %w", path, err)
	}
	line, err := readLine(c, maxHybridReply)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("hybrid vsock %s: no answer to CONNECT %d: %w", path, port, err)
	}
	if !strings.HasPrefix(line, "OK ") {
		c.Close()
		return nil, fmt.Errorf("hybrid vsock %s: CONNECT %d answered %q", path, port, line)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// readLine reads up to '\n' one byte at a time, so that nothing of the
// stream after it is consumed.
func readLine(c net.Conn, max int) (string, error) {
	var b strings.Builder
	one := make([]byte, 1)
	for b.Len() < max {
		if _, err := c.Read(one); err != nil {
			return b.String(), err
		}
		if one[0] == '\n' {
			return b.String(), nil
		}
		b.WriteByte(one[0])
	}
	return b.String(), bufio.ErrTooLong
}
