package vmchan

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Where virtio-serial ports appear: udev's links by name, and the kernel's
// own record of each port's name (an init has no udev).
var (
	serialLinks = "/dev/virtio-ports"
	serialClass = "/sys/class/virtio-ports"
	devDir      = "/dev"
)

// serialIdle is how long Accept waits before it looks again whether the
// host has opened its end of the port: while it has not, poll reports a
// hang-up at once instead of waiting. serialPoll bounds one wait for the
// host's bytes while it has (Close waits for it).
const (
	serialIdle = 50 * time.Millisecond
	serialPoll = 1000 // ms
)

type serialAddr string

func (a serialAddr) Network() string { return "virtio-serial" }
func (a serialAddr) String() string  { return "serial:" + string(a) }

// serialListener serves one virtio-serial port: one byte stream with the
// host at its other end, so one connection at a time. The port stays open
// for the listener's life (a port admits one opener: no guest process can
// open it beside shim); a connection's Close ends the session, not the
// port.
type serialListener struct {
	f      *os.File
	rc     syscall.RawConn
	addr   serialAddr
	free   chan struct{} // holds a token while no connection is served
	closed chan struct{}
	once   sync.Once
}

// SerialPath finds the device of the virtio-serial port called name: the
// udev link /dev/virtio-ports/NAME, else the /dev/vportNpM whose
// /sys/class/virtio-ports/vportNpM/name says name.
func SerialPath(name string) (string, error) {
	link := filepath.Join(serialLinks, name)
	if _, err := os.Stat(link); err == nil {
		return link, nil
	}
	ents, err := os.ReadDir(serialClass)
	if err != nil {
		return "", fmt.Errorf("no virtio-serial port %q: %w", name, err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(serialClass, e.Name(), "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return filepath.Join(devDir, e.Name()), nil
		}
	}
	return "", fmt.Errorf("no virtio-serial port %q in %s or %s", name, serialLinks, serialClass)
}

// ListenSerial opens the virtio-serial port called name.
func ListenSerial(name string) (net.Listener, error) {
	path, err := SerialPath(name)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	l := &serialListener{f: f, rc: rc, addr: serialAddr(name), free: make(chan struct{}, 1), closed: make(chan struct{})}
	l.free <- struct{}{}
	return l, nil
}

// Accept waits until the connection before has ended and the host has
// sent something, and returns the port as a connection.
func (l *serialListener) Accept() (net.Conn, error) {
	select {
	case <-l.free:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	for {
		ready, hup, err := l.readable()
		if err != nil {
			l.free <- struct{}{}
			return nil, err
		}
		if ready {
			break
		}
		wait := time.After(0)
		if hup {
			wait = time.After(serialIdle)
		}
		select {
		case <-l.closed:
			l.free <- struct{}{}
			return nil, net.ErrClosed
		case <-wait:
		}
	}
	l.f.SetDeadline(time.Time{})
	return &serialConn{l: l}, nil
}

// readable waits up to serialPoll for the host's bytes: ready when there
// are some; hup when the host has not opened its end (poll does not wait
// then).
func (l *serialListener) readable() (ready, hup bool, err error) {
	var revents int16
	var perr error
	cerr := l.rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		_, perr = unix.Poll(fds, serialPoll)
		revents = fds[0].Revents
	})
	if cerr != nil {
		if errors.Is(cerr, os.ErrClosed) {
			return false, false, net.ErrClosed
		}
		return false, false, cerr
	}
	if perr != nil && perr != unix.EINTR {
		return false, false, perr
	}
	return revents&unix.POLLIN != 0, revents&(unix.POLLHUP|unix.POLLERR) != 0 && revents&unix.POLLIN == 0, nil
}

func (l *serialListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.f.Close()
}

func (l *serialListener) Addr() net.Addr { return l.addr }

// serialConn is one session on the port. Its Close unblocks any read in
// flight (a deadline in the past), waits for it, and frees the port for
// the next Accept, so no read of an ended session takes the next one's
// bytes.
type serialConn struct {
	l      *serialListener
	mu     sync.Mutex // guards done
	done   bool
	reads  sync.WaitGroup
	closed sync.Once
}

func (c *serialConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	c.reads.Add(1)
	c.mu.Unlock()
	defer c.reads.Done()
	n, err := c.l.f.Read(b)
	return n, netError("read", c.l.addr, err)
}

func (c *serialConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done {
		return 0, net.ErrClosed
	}
	n, err := c.l.f.Write(b)
	return n, netError("write", c.l.addr, err)
}

func (c *serialConn) Close() error {
	c.closed.Do(func() {
		c.mu.Lock()
		c.done = true
		c.mu.Unlock()
		c.l.f.SetReadDeadline(time.Unix(1, 0))
		c.reads.Wait()
		c.l.free <- struct{}{}
	})
	return nil
}

func (c *serialConn) LocalAddr() net.Addr  { return c.l.addr }
func (c *serialConn) RemoteAddr() net.Addr { return c.l.addr }
func (c *serialConn) SetDeadline(t time.Time) error {
	return c.live(func() error { return c.l.f.SetDeadline(t) })
}
func (c *serialConn) SetReadDeadline(t time.Time) error {
	return c.live(func() error { return c.l.f.SetReadDeadline(t) })
}
func (c *serialConn) SetWriteDeadline(t time.Time) error {
	return c.live(func() error { return c.l.f.SetWriteDeadline(t) })
}

// live runs set unless the session has ended: a deadline an ended session
// sets late must not land on the next one.
func (c *serialConn) live(set func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return net.ErrClosed
	}
	return set()
}
