package main

// The signal state the service starts with: the signal mask and the
// ignored signals shim itself was started with, as tini passes them on
// (tini's child restores the parent's mask before execvp and never touched
// a SIG_IGN). startSignalState reads it (sigstate_cgo.go, exact; or
// sigstate_nocgo.go, what the Go runtime leaves visible), runInit passes
// it to the service stub, and the stub sets it on the thread that execs
// the service (setForExec).

import (
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sigState is a signal mask and a set of signals at SIG_IGN.
type sigState struct{ blocked, ignored sigSet }

// visibleSignalState is the signal state as Go code sees it: the calling
// thread's mask and the signals at SIG_IGN now. It is the state shim was
// started with except where the Go runtime changed it before main, which
// sigstate_nocgo.go lists. It must be read before anything in shim calls
// signal.Notify.
func visibleSignalState() sigState {
	var s sigState
	var mask uint64
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_BLOCK, 0, uintptr(unsafe.Pointer(&mask)), 8, 0, 0); errno == 0 {
		s.blocked = sigSet(mask)
	}
	for sig := 1; sig <= 64; sig++ {
		if handler(sig) == sigIgn {
			s.ignored |= 1 << (sig - 1)
		}
	}
	return s
}

const (
	sigDfl = 0
	sigIgn = 1
)

// handler is sig's disposition: sigDfl, sigIgn or a handler's address; -1
// when the kernel refuses sig. The kernel's struct sigaction has the
// handler first on every architecture shim is built for; the buffer is
// larger than the struct.
func handler(sig int) uintptr {
	var old [8]uintptr
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), 0, uintptr(unsafe.Pointer(&old)), 8, 0, 0); errno != 0 {
		return ^uintptr(0)
	}
	return old[0]
}

func setHandler(sig int, h uintptr) error {
	act := [8]uintptr{h} // no flags, no restorer, an empty mask: what SIG_IGN and SIG_DFL need
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); errno != 0 {
		return fmt.Errorf("signal %d: %w", sig, errno)
	}
	return nil
}

// String is the stub's argument: BLOCKED:IGNORED in hex.
func (s sigState) String() string {
	return strconv.FormatUint(uint64(s.blocked), 16) + ":" + strconv.FormatUint(uint64(s.ignored), 16)
}

func parseSigState(arg string) (sigState, error) {
	b, i, ok := strings.Cut(arg, ":")
	blocked, err1 := strconv.ParseUint(b, 16, 64)
	ignored, err2 := strconv.ParseUint(i, 16, 64)
	if !ok || err1 != nil || err2 != nil {
		return sigState{}, fmt.Errorf("bad signal state %q", arg)
	}
	return sigState{blocked: sigSet(blocked), ignored: sigSet(ignored)}, nil
}

// setForExec makes s the signal state of the calling thread, so that an
// execve from it starts the program with s: SIG_IGN on every signal in
// s.ignored and SIG_DFL on every other signal that is at SIG_IGN now
// (handlers become SIG_DFL at the exec anyway), then the mask. The caller
// has locked its goroutine to the thread and execs right after: from
// here on this process's Go runtime may not get the signals it uses
// (SIGURG for preemption, which only delays it), and syscall.Exec changes
// no mask on its way to execve.
//
// The kernel's calls are used, not os/signal: signal.Ignore cannot touch
// signals the runtime keeps for itself (32..34), and the mask must be
// exactly s.blocked, including the signals the runtime always unblocks.
func setForExec(s sigState) error {
	for sig := 1; sig <= 64; sig++ {
		if sig == int(unix.SIGKILL) || sig == int(unix.SIGSTOP) {
			continue // always at SIG_DFL
		}
		var err error
		switch {
		case s.ignored&(1<<(sig-1)) != 0:
			err = setHandler(sig, sigIgn)
		case handler(sig) == sigIgn:
			err = setHandler(sig, sigDfl)
		}
		if err != nil {
			return err
		}
	}
	mask := uint64(s.blocked)
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&mask)), 0, 8, 0, 0); errno != 0 {
		return fmt.Errorf("signal mask: %w", errno)
	}
	return nil
}
