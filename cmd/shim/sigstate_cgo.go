//go:build cgo

package main

// The signal state shim was started with, recorded by a constructor that
// the C library runs before main, and so before the Go runtime starts
// (runc's libcontainer/nsenter runs its nsexec the same way). By the time
// Go code runs, the runtime has replaced SIG_IGN with its own handler for
// most signals and unblocked some in every thread (sigstate_nocgo.go has
// the list); nothing here can be seen from Go afterwards.
//
// The kernel's calls are used, not sigprocmask(3) and sigaction(3): glibc
// refuses 32 and 33 (its own) and hides them from the mask it reports.
// The handler is the first field of the kernel's struct sigaction on every
// architecture shim is built for (amd64, arm64); the buffer is larger than
// the struct.

/*
#include <signal.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/syscall.h>

static uint64_t shim_start_blocked, shim_start_ignored;
static int shim_start_recorded;

__attribute__((constructor)) static void shim_record_signal_state(void) {
	uint64_t blocked = 0, ignored = 0;
	if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, (void *)0, &blocked, sizeof blocked) != 0)
		return;
	for (int sig = 1; sig <= 64; sig++) {
		unsigned long old[8] = {0};
		if (syscall(SYS_rt_sigaction, sig, (void *)0, old, sizeof(uint64_t)) == 0 && old[0] == 1) // SIG_IGN
			ignored |= (uint64_t)1 << (sig - 1);
	}
	shim_start_blocked = blocked;
	shim_start_ignored = ignored;
	shim_start_recorded = 1;
}

static uint64_t shim_blocked_at_start(void) { return shim_start_blocked; }
static uint64_t shim_ignored_at_start(void) { return shim_start_ignored; }
static int shim_signal_state_recorded(void) { return shim_start_recorded; }
*/
import "C"

// startSignalState is the signal mask and the ignored signals shim was
// started with, exactly, as the constructor above recorded them; the
// fallback (sigstate_nocgo.go) when the constructor could not.
func startSignalState() sigState {
	if C.shim_signal_state_recorded() == 0 {
		return visibleSignalState()
	}
	return sigState{blocked: sigSet(C.shim_blocked_at_start()), ignored: sigSet(C.shim_ignored_at_start())}
}

// startStateHidden is the part of the start state startSignalState cannot
// report: none.
var startStateHidden sigState
