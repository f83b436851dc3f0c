package reaper

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test process becomes a child subreaper so that orphans of its own
// children come back to it, as they come to shim.
func TestMain(m *testing.M) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

func TestTrackedStatusIsNeverStolen(t *testing.T) {
	r := New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Loop(ctx)
	// Many short children that exit at once: the race between fork and
	// registration is where a naive reaper steals statuses.
	procs := make([]*Process, 200)
	for i := range procs {
		p, err := r.Start(exec.Command("sh", "-c", "exit 3"))
		if err != nil {
			t.Fatal(err)
		}
		procs[i] = p
	}
	for _, p := range procs {
		e, err := p.Wait(withTimeout(t, 10*time.Second))
		if err != nil || e.Code != 3 || e.Signal != 0 {
			t.Fatalf("pid %d: exit %+v err %v", p.Pid, e, err)
		}
	}
}

func TestOrphansAreCollected(t *testing.T) {
	r := New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Loop(ctx)
	before := r.Orphans()
	// Each subshell exits at once; its sleep is orphaned to us.
	if err := r.Run(context.Background(), exec.Command("sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do (sleep 0.01 &); done"), nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.Orphans()-before < 10 { // the 10 sleeps; sh reaps its subshells
		if time.Now().After(deadline) {
			t.Fatalf("orphans reaped: %d", r.Orphans()-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunLikeExecCmd(t *testing.T) {
	r := New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Loop(ctx)
	var out, errb bytes.Buffer
	cmd := exec.Command("sh", "-c", "cat; echo err >&2; exit 5")
	cmd.Stdin = strings.NewReader("hello")
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := r.Run(context.Background(), cmd, nil)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 5 {
		t.Fatalf("err %v", err)
	}
	if out.String() != "hello" || errb.String() != "err\n" {
		t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
	}
	// A signal death is 128+signal.
	cmd = exec.Command("sh", "-c", "kill -9 $$")
	err = r.Run(context.Background(), cmd, nil)
	if !errors.As(err, &ee) || ee.Exit.Signal != 9 || ee.ExitCode() != 137 {
		t.Fatalf("signal death: %v", err)
	}
	// Context cancellation kills the child.
	cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer ccancel()
	if err := r.Run(cctx, exec.Command("sleep", "100"), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled run: %v", err)
	}
}

func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
