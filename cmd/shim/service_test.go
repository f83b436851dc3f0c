package main

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// The service's exit code when its command cannot run is tini's (execvp's
// errno): 127 not found, 126 found but not executable.
func TestLookService(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for name, mode := range map[string]os.FileMode{"x": 0o755, "plain": 0o644} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(other, "x"), 0o755); err != nil { // a directory first in PATH is skipped
		t.Fatal(err)
	}
	t.Setenv("PATH", other+":"+dir)
	for _, c := range []struct {
		name, path string
		code       int
	}{
		{"x", filepath.Join(dir, "x"), 0},
		{"plain", "", 126},
		{"missing", "", 127},
		{"", "", 127},
		{"./relative", "./relative", 0}, // a slash: used as it is, exec decides
	} {
		p, err := lookService(c.name)
		code := 0
		if err != nil {
			code = execExitCode(err)
		}
		if p != c.path || code != c.code {
			t.Errorf("lookService(%q) = %q, %v (exit %d); want %q, exit %d", c.name, p, err, code, c.path, c.code)
		}
	}
}

// Every signal is forwarded, dropped or left alone, and the forwarded set
// is the one the README lists.
func TestSignalPlan(t *testing.T) {
	var fwd []syscall.Signal
	for _, s := range forwardedSignals() {
		fwd = append(fwd, s.(syscall.Signal))
	}
	want := []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
		syscall.SIGALRM, syscall.SIGTERM, syscall.SIGSTKFLT, syscall.SIGCONT, syscall.SIGTSTP, syscall.SIGXCPU,
		syscall.SIGXFSZ, syscall.SIGVTALRM, syscall.SIGWINCH, syscall.SIGIO, syscall.SIGPWR}
	for s := syscall.Signal(35); s <= 64; s++ {
		want = append(want, s)
	}
	if !slices.Equal(fwd, want) {
		t.Fatalf("forwarded %v\nwant      %v", fwd, want)
	}
	if droppedSignals&untouchedSignals != 0 || setOf(fwd...)&(droppedSignals|untouchedSignals) != 0 ||
		setOf(fwd...)|droppedSignals|untouchedSignals != ^sigSet(0) {
		t.Fatal("forwarded, dropped and untouched must split the 64 signals")
	}
}
