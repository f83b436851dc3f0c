package runtime

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
)

// callIO are a call's standard streams: pipes, or a pseudo-terminal
// (stdin and stdout, stderr merged). Its output is copied into
// gen/<N>/proc/<K>/stdout and stderr, each capped: the files are the only
// buffer. A reader streams from the files (callStream.state says how far
// they go), so a reader that never reads holds no byte in memory and never
// slows the copy; past the cap bytes are counted, not kept, and every
// reader is told (a dropped frame).
type callIO struct {
	c                           *call
	childIn, childOut, childErr *os.File // the child's ends: closed once it started
	streams                     []*callStream
}

func newCallIO(c *call, req api.ExecRequest, cred *syscall.Credential, max int64) (_ *callIO, err error) {
	io := &callIO{c: c}
	defer func() {
		if err != nil {
			io.closeChildEnds()
			io.abort()
		}
	}()
	if req.TTY {
		master, slave, err := openPTY(cred)
		if err != nil {
			return nil, err
		}
		c.pty = master
		io.childIn, io.childOut, io.childErr = slave, slave, slave
		if req.Rows > 0 || req.Cols > 0 {
			if err := setWinsize(master, req.Rows, req.Cols); err != nil {
				return nil, err
			}
		}
		if c.stdout, err = newCallStream("stdout", filepath.Join(c.dir, "stdout"), master, max); err != nil {
			return nil, err
		}
		io.streams = []*callStream{c.stdout}
		c.stdin = master
		return io, nil
	}
	var wOut, wErr *os.File
	if c.stdout, wOut, err = newPipedStream("stdout", filepath.Join(c.dir, "stdout"), max); err != nil {
		return nil, err
	}
	io.childOut = wOut
	io.streams = append(io.streams, c.stdout)
	if c.stderr, wErr, err = newPipedStream("stderr", filepath.Join(c.dir, "stderr"), max); err != nil {
		return nil, err
	}
	io.childErr = wErr
	io.streams = append(io.streams, c.stderr)
	if req.Stdin || len(req.StdinData) > 0 {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		io.childIn, c.stdin = r, w
	} else {
		if io.childIn, err = os.Open(os.DevNull); err != nil {
			return nil, err
		}
	}
	return io, nil
}

// closeChildEnds closes shim's copies of the child's ends (once the child
// has its own, or when it did not start).
func (io *callIO) closeChildEnds() {
	seen := map[*os.File]bool{}
	for _, f := range []*os.File{io.childIn, io.childOut, io.childErr} {
		if f != nil && !seen[f] {
			seen[f] = true
			f.Close()
		}
	}
	io.childIn, io.childOut, io.childErr = nil, nil, nil
}

// start begins copying the output.
func (io *callIO) start() {
	for _, s := range io.streams {
		go s.pump()
	}
}

// abort undoes the streams of a call that did not start.
func (io *callIO) abort() {
	for _, s := range io.streams {
		s.r.Close()
		s.f.Close()
	}
	if io.c.stdin != nil {
		io.c.stdin.Close()
		io.c.stdin = nil
	}
}

// drain waits up to d for every stream to reach its end (every writer
// gone), then ends the copies of those something the call left running
// still holds open.
func (c *call) drain(d time.Duration) {
	expired := make(chan struct{})
	t := time.AfterFunc(d, func() { close(expired) })
	defer t.Stop()
	for _, s := range []*callStream{c.stdout, c.stderr} {
		if s == nil {
			continue
		}
		select {
		case <-s.eofCh:
			continue
		case <-expired:
		}
		s.r.Close()
		<-s.eofCh // Read returns at once on a closed file
	}
}

// callStream is one output stream of a call: the pipe (or terminal) shim
// reads and the file it keeps.
type callStream struct {
	name, path string
	r          *os.File
	f          *os.File
	max        int64 // < 0: no cap
	eofCh      chan struct{}

	mu      sync.Mutex // guards the fields below
	kept    int64      // bytes in the file: the first kept bytes of the stream
	total   int64      // bytes the call wrote
	full    bool       // nothing more goes into the file (the cap, or a failed write)
	eof     bool
	changed chan struct{} // closed (and replaced) at every change
}

func newCallStream(name, path string, r *os.File, max int64) (*callStream, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return nil, err
	}
	return &callStream{name: name, path: path, r: r, f: f, max: max, eofCh: make(chan struct{}), changed: make(chan struct{})}, nil
}

func newPipedStream(name, path string, max int64) (*callStream, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	s, err := newCallStream(name, path, r, max)
	if err != nil {
		r.Close()
		w.Close()
		return nil, nil, err
	}
	return s, w, nil
}

// pump copies the stream until its end: EOF, EIO on a terminal whose
// every slave is closed, or drain closing it.
func (s *callStream) pump() {
	buf := make([]byte, 32<<10) // two a call, at most 256 calls a generation: 16 MiB
	for {
		n, err := s.r.Read(buf)
		if n > 0 {
			s.add(buf[:n])
		}
		if err != nil {
			break
		}
	}
	s.f.Close()
	if s.name == "stderr" || !isPTY(s.r) {
		s.r.Close()
	}
	s.mu.Lock()
	s.eof = true
	s.notifyLocked()
	s.mu.Unlock()
	close(s.eofCh)
}

// add keeps what fits under the cap and counts the rest. A write error (a
// full disk) stops the file there: it stays a prefix of the stream.
func (s *callStream) add(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.full {
		keep := int64(len(p))
		if s.max >= 0 && s.kept+keep > s.max {
			keep = max(s.max-s.kept, 0)
		}
		if keep > 0 {
			w, err := s.f.Write(p[:keep])
			s.kept += int64(w)
			if err != nil {
				s.full = true
			}
		}
		if s.max >= 0 && s.kept >= s.max {
			s.full = true
		}
	}
	s.total += int64(len(p))
	s.notifyLocked()
}

func (s *callStream) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// state is how far the stream went, and a channel closed at its next
// change.
func (s *callStream) state() (kept, total int64, eof bool, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kept, s.total, s.eof, s.changed
}

// counts are the bytes kept and written.
func (s *callStream) counts() (kept, total int64) {
	if s == nil {
		return 0, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kept, s.total
}

// openPTY opens a pseudo-terminal: the master for shim (non-blocking, so
// that reads and writes take deadlines) and the slave for the call, owned
// by its user.
func openPTY(cred *syscall.Credential) (master, slave *os.File, err error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(mfd)
		return nil, nil, err
	}
	// The slave through the master (TIOCGPTPEER): no path lookup in a
	// /dev/pts shim does not control.
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		unix.Close(mfd)
		return nil, nil, errno
	}
	if cred != nil {
		unix.Fchown(int(sfd), int(cred.Uid), -1)
	}
	if err := unix.SetNonblock(mfd, true); err != nil {
		unix.Close(mfd)
		unix.Close(int(sfd))
		return nil, nil, err
	}
	return os.NewFile(uintptr(mfd), "ptmx"), os.NewFile(sfd, "pts"), nil
}

func isPTY(f *os.File) bool { return f.Name() == "ptmx" }

// setWinsize sets a terminal's window size.
func setWinsize(f *os.File, rows, cols uint16) error {
	ws := unix.Winsize{Row: rows, Col: cols}
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws)))
		if errno != 0 {
			ierr = errno
		}
	}); err != nil {
		return err
	}
	return ierr
}
