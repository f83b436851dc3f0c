//go:build !cgo

package main

import "golang.org/x/sys/unix"

// startSignalState, built without cgo, is the signal state as the Go
// runtime leaves it visible to shim's first line, which is not all of the
// state shim was started with (the release binary is built with cgo, and
// sigstate_cgo.go records it exactly). Before main the runtime:
//
//   - replaces SIG_IGN with its own handler for every signal except SIGHUP
//     and SIGINT (left ignored, see os/signal), SIGCONT, SIGTSTP, SIGTTIN
//     and SIGTTOU (left alone until signal.Notify), and 32 and 34; so a
//     SIGQUIT, SIGTERM, SIGUSR1, SIGPIPE or real-time signal shim was
//     started with ignored reaches the service at SIG_DFL;
//   - unblocks, in every thread, SIGHUP, SIGINT, SIGQUIT, SIGABRT, SIGTERM,
//     SIGSTKFLT, SIGSYS, the synchronous signals (SIGILL, SIGTRAP, SIGBUS,
//     SIGFPE, SIGSEGV), SIGCHLD, SIGPROF, SIGURG and 32..34; so one of
//     those shim was started with blocked reaches the service unblocked.
//
// The runtime keeps the original dispositions in private variables, and
// no Go code runs before it.
func startSignalState() sigState { return visibleSignalState() }

// startStateHidden is the part of the start state startSignalState cannot
// report: the signals whose SIG_IGN or block the runtime removed (above).
var startStateHidden = sigState{
	blocked: setOf(unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGILL, unix.SIGTRAP, unix.SIGABRT, unix.SIGBUS,
		unix.SIGFPE, unix.SIGSEGV, unix.SIGTERM, unix.SIGSTKFLT, unix.SIGCHLD, unix.SIGURG, unix.SIGPROF, unix.SIGSYS,
		32, 33, 34),
	ignored: ^setOf(unix.SIGHUP, unix.SIGINT, unix.SIGCONT, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU, 32, 34),
}
