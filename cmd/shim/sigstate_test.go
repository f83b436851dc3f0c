package main

import (
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The signal state shim is started with is what startSignalState reports:
// all of it built with cgo, and without cgo all but startStateHidden. The
// test binary starts itself twice: with setForExec(state) then exec, and
// from that exec reporting startSignalState. So this also shows that
// setForExec's state is the one the exec'd program starts with.
func TestStartSignalState(t *testing.T) {
	switch os.Getenv("SHIM_TEST_SIGSTATE") {
	case "":
	case "report":
		fmt.Print(startSignalState())
		os.Exit(0)
	default:
		s, err := parseSigState(os.Getenv("SHIM_TEST_SIGSTATE"))
		if err == nil {
			goruntime.LockOSThread()
			err = setForExec(s)
		}
		if err == nil {
			os.Setenv("SHIM_TEST_SIGSTATE", "report")
			err = unix.Exec(os.Args[0], os.Args, os.Environ())
		}
		fmt.Print(err)
		os.Exit(1)
	}
	for _, start := range []sigState{
		{},
		{blocked: setOf(syscall.SIGTERM), ignored: setOf(syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGPIPE, syscall.SIGTERM)},
		{blocked: setOf(syscall.SIGINT, syscall.SIGUSR2, syscall.SIGQUIT, syscall.SIGWINCH, syscall.SIGCHLD, 32, 33, 34, 50),
			ignored: setOf(syscall.SIGHUP, syscall.SIGTTOU, syscall.SIGURG, syscall.SIGCHLD, 32, 33, 34, 40, 64)},
		{blocked: ^setOf(syscall.SIGKILL, syscall.SIGSTOP), ignored: ^setOf(syscall.SIGKILL, syscall.SIGSTOP)},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStartSignalState$")
		cmd.Env = append(os.Environ(), "SHIM_TEST_SIGSTATE="+start.String())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("start with %v: %v: %s", start, err, out)
		}
		want := sigState{blocked: start.blocked &^ startStateHidden.blocked, ignored: start.ignored &^ startStateHidden.ignored}
		if got := strings.TrimSpace(string(out)); got != want.String() {
			t.Errorf("started with %v: startSignalState %s, want %v", start, got, want)
		}
	}
}

func TestParseSigState(t *testing.T) {
	s := sigState{blocked: setOf(syscall.SIGTERM, 64), ignored: setOf(syscall.SIGHUP)}
	if got, err := parseSigState(s.String()); err != nil || got != s {
		t.Fatalf("parseSigState(%q) = %v, %v", s.String(), got, err)
	}
	for _, bad := range []string{"", "4000", "x:1", "1:", ":1", "1:2:3"} {
		if _, err := parseSigState(bad); err == nil {
			t.Errorf("parseSigState(%q) accepted", bad)
		}
	}
}
