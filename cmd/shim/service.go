package main

// The service of `shim init -- CMD`: how it starts, which signals reach it
// and the exit code shim takes from it. The model is tini (krallin/tini,
// src/tini.c: spawn, isolate_child, wait_and_forward_signal), whose
// behaviour `docker run --init` users rely on.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/internal/reaper"
)

// sigSet is a set of signals 1..64, bit sig-1 for sig.
type sigSet uint64

func (s sigSet) has(sig syscall.Signal) bool { return sig >= 1 && sig <= 64 && s&(1<<(sig-1)) != 0 }

func setOf(sigs ...syscall.Signal) sigSet {
	var s sigSet
	for _, sig := range sigs {
		s |= 1 << (sig - 1)
	}
	return s
}

// Signals shim catches and drops instead of forwarding.
//
// SIGPIPE: shim's own writes to a closed pipe or socket raise it (a
// supervisor that stops reading shim's log, a control client that hangs
// up), os/signal cannot tell those from a kill(2), and Go would exit on a
// broken stderr if it were not caught. It is not set to SIG_IGN, which
// the service and harnesses would inherit across exec.
//
// SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS: tini's
// signals_for_tini, never forwarded. A real fault in shim still crashes it
// (os/signal only takes those sent with kill(2)); caught, one sent with
// kill(2) cannot end PID 1, which Go's default handling would let any
// process in the sandbox do.
var droppedSignals = setOf(unix.SIGPIPE, unix.SIGILL, unix.SIGTRAP, unix.SIGABRT, unix.SIGBUS,
	unix.SIGFPE, unix.SIGSEGV, unix.SIGSYS)

// Signals shim neither catches nor forwards.
//
// SIGKILL, SIGSTOP: cannot be caught. SIGCHLD: the reaper's (tini does not
// forward it either). SIGURG: the Go runtime's preemption signal, which it
// sends to its own threads all the time; os/signal would hand those over
// too. SIGPROF: the Go runtime takes it for its CPU profiler before
// os/signal sees it. 32, 33, 34: reserved by the C libraries (glibc's
// cancellation and setxid, musl's synccall) and the Go runtime (33);
// os/signal cannot catch them. SIGTTIN, SIGTTOU: left as shim found them,
// as tini leaves them out of what it forwards (tini ignores them in
// itself; shim does not, because the harnesses would inherit SIG_IGN).
var untouchedSignals = setOf(unix.SIGKILL, unix.SIGSTOP, unix.SIGCHLD, unix.SIGURG, unix.SIGPROF,
	32, 33, 34, unix.SIGTTIN, unix.SIGTTOU)

// forwardedSignals is every other signal: shim passes each one it receives
// to the service and to the current harness, as tini passes everything but
// SIGCHLD. That is SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM,
// SIGTERM (which also starts the shutdown), SIGSTKFLT, SIGCONT, SIGTSTP,
// SIGXCPU, SIGXFSZ, SIGVTALRM, SIGWINCH, SIGIO, SIGPWR and 35..64.
//
// That includes signals shim was started with ignored: tini blocks every
// signal and takes them with sigtimedwait, and a blocked signal is never
// discarded as ignored, so tini forwards those too (the service ignores
// them unless it installed a handler). Catching one replaces its SIG_IGN,
// so the service stub puts SIG_IGN back before the exec.
func forwardedSignals() []os.Signal {
	var out []os.Signal
	for sig := syscall.Signal(1); sig <= 64; sig++ {
		if !droppedSignals.has(sig) && !untouchedSignals.has(sig) {
			out = append(out, sig)
		}
	}
	return out
}

func signalList(s sigSet) []os.Signal {
	var out []os.Signal
	for sig := syscall.Signal(1); sig <= 64; sig++ {
		if s.has(sig) {
			out = append(out, sig)
		}
	}
	return out
}

// serviceStubArg is the hidden first argument of the service stub: shim
// re-execs itself with it to start the service (runServiceStub).
const serviceStubArg = "__service"

// service is the command given after `--`, started through the reaper.
type service struct {
	cmd  *exec.Cmd
	proc *reaper.Process
	// execed is closed when the stub has exec'd the service (or exited):
	// until then a signal for the service is held, not sent, because the
	// stub's Go runtime would drop some (SIGUSR1) and dump its goroutines
	// on others (SIGQUIT).
	execed chan struct{}
}

// startService starts the service the way tini's spawn does.
//
// Process group and terminal: in a process group of its own
// (isolate_child's setpgid) and, when shim's stdin is its controlling
// terminal, with that group as the terminal's foreground group
// (tcsetpgrp). Keys like Ctrl-C and Ctrl-Z then signal the service's group
// directly; shim is not in it, so it receives nothing to forward a second
// time, and a shell run as the service can do job control. Go's fork child
// sets the group and the foreground with every signal blocked (no
// SIGTTOU), as tini does with SIGTTIN and SIGTTOU blocked.
//
// Signal mask and ignored signals: the service starts with those shim
// was started with (state, from startSignalState). os/exec gives the child
// the mask of the thread that forks, which is the Go runtime's by now, and
// cannot set dispositions in the child (no SysProcAttr field does, up to
// Go 1.26); across exec a SIG_IGN stays and every handler goes back to
// SIG_DFL, so what shim catches to forward would lose the SIG_IGN it was
// started with. So the child is shim itself, re-exec'd as a stub
// (runServiceStub) that sets state on the thread that execs the service
// (setForExec). Mask and SIG_IGN both survive that exec.
//
// The stub finds and execs the command as execvp does and, like tini's
// child, exits 127 (ENOENT) or 126 (EACCES) or 1 when that fails.
func startService(rp *reaper.Reaper, self string, argv []string, state sigState) (*service, error) {
	sync, ready, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	attr := &syscall.SysProcAttr{Setpgid: true}
	// TIOCGPGRP succeeds only on the caller's controlling terminal; tini's
	// tcsetpgrp tolerates ENOTTY for the same case.
	if _, err := unix.IoctlGetInt(0, unix.TIOCGPGRP); err == nil {
		attr.Foreground, attr.Ctty = true, 0
	}
	cmd := &exec.Cmd{
		Path: self, Args: append([]string{argv[0], serviceStubArg, state.String()}, argv...),
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, ExtraFiles: []*os.File{ready}, SysProcAttr: attr,
	}
	p, err := rp.Start(cmd)
	ready.Close()
	if err != nil {
		sync.Close()
		return nil, err
	}
	s := &service{cmd: cmd, proc: p, execed: make(chan struct{})}
	go func() {
		io.Copy(io.Discard, sync) // EOF: fd 3 closed by the exec, or by the stub's exit
		sync.Close()
		close(s.execed)
	}()
	return s, nil
}

// runServiceStub is the service stub's main: args are STATE ARGV...,
// STATE the signal state to start the service with (sigState.String). The
// exec closes fd 3 (the pipe startService waits on).
func runServiceStub(args []string) int {
	if len(args) < 2 {
		return 1
	}
	unix.CloseOnExec(3)
	state, err := parseSigState(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "shim: service stub: %v\n", err)
		return 1
	}
	argv := args[1:]
	path, err := lookService(argv[0])
	if err == nil {
		// The mask is the thread's: the one that sets it must be the one
		// that execs.
		goruntime.LockOSThread()
		err = setForExec(state)
	}
	if err == nil {
		err = unix.Exec(path, argv, os.Environ())
		if errors.Is(err, unix.ENOEXEC) {
			// execvp runs a file without a #! line with the shell.
			err = unix.Exec("/bin/sh", append([]string{"/bin/sh", path}, argv[1:]...), os.Environ())
		}
	}
	fmt.Fprintf(os.Stderr, "shim: exec %s: %v\n", argv[0], err)
	return execExitCode(err)
}

// lookService finds the executable as execvp(3) does, which is what tini
// runs: a name with a slash is used as it is; otherwise each entry of PATH
// ("/bin:/usr/bin" when PATH is unset) is tried in turn, and a file that
// exists but cannot be executed is skipped and remembered, so that the
// error is EACCES (126) rather than ENOENT (127). Go's exec.LookPath
// reports both as not found.
func lookService(name string) (string, error) {
	if name == "" {
		return "", &fs.PathError{Op: "exec", Path: name, Err: unix.ENOENT}
	}
	if strings.Contains(name, "/") {
		return name, nil
	}
	path, ok := os.LookupEnv("PATH")
	if !ok {
		path = "/bin:/usr/bin"
	}
	var errno error = unix.ENOENT
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrPermission):
			errno = unix.EACCES
		case err != nil:
		case st.Mode().IsRegular() && unix.Access(p, unix.X_OK) == nil:
			return p, nil
		default:
			errno = unix.EACCES
		}
	}
	return "", &fs.PathError{Op: "exec", Path: name, Err: errno}
}

func execExitCode(err error) int {
	switch {
	case errors.Is(err, unix.ENOENT):
		return 127
	case errors.Is(err, unix.EACCES):
		return 126
	}
	return 1
}

// signal sends sig to the service through its pidfd (os.Process uses
// one), so a signal sent after the reaper collected the service reaches
// nobody rather than a process that got its pid.
func (s *service) signal(sig syscall.Signal) error { return s.cmd.Process.Signal(sig) }
