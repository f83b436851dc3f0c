package runtime

import (
	"context"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
)

// Tool calls through the real launcher, on fake cgroups, as whoever runs
// the tests: an idle generation (its holder is this test binary), calls
// placed by the stub in a cgroup of their own below it.

// idleGeneration starts generation n without a harness.
func (lf *launchFixture) idleGeneration(n uint64) {
	lf.t.Helper()
	req := api.StartRequest{Generation: n, Idle: true, Network: api.NetworkHost, Env: []string{"GEN_VAR=g"}}
	if _, err := lf.rt.Start(context.Background(), req); err != nil {
		lf.t.Fatalf("start %d: %v", n, err)
	}
}

func (lf *launchFixture) exec(n uint64, req api.ExecRequest) *call {
	lf.t.Helper()
	c, err := lf.rt.Exec(n, req)
	if err != nil {
		lf.t.Fatalf("exec: %v", err)
	}
	return c
}

// final waits for c to end and returns its final record.
func final(t *testing.T, c *call) api.Process {
	t.Helper()
	<-c.done
	return c.record()
}

// A call runs in its generation's environment with its own on top, in a
// cgroup of its own below the generation's; its output and its exit are
// in its final record, and the audit log has its start.
func TestAToolCallRunsAndItsRecordIsFinal(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup2)
	lf.idleGeneration(1)
	c := lf.exec(1, api.ExecRequest{Command: []string{"/bin/sh", "-c", `echo "$GEN_VAR $CALL_VAR"; echo err >&2; exit 5`}, Env: []string{"CALL_VAR=c"}})
	rec := final(t, c)
	if rec.State != api.ProcessExited || rec.ExitCode == nil || *rec.ExitCode != 5 || rec.TimedOut || rec.Fenced {
		t.Fatalf("record %+v", rec)
	}
	out, _ := os.ReadFile(rec.Stdout)
	errOut, _ := os.ReadFile(rec.Stderr)
	if string(out) != "g c\n" || string(errOut) != "err\n" {
		t.Errorf("output %q %q", out, errOut)
	}
	if !strings.HasSuffix(rec.Cgroup, "/gen-1/proc-1") {
		t.Errorf("cgroup %s", rec.Cgroup)
	}
	if got, err := lf.rt.Process(1, c.id); err != nil || got.ExitCode == nil || *got.ExitCode != 5 {
		t.Errorf("Process: %+v %v", got, err)
	}
	if list, err := lf.rt.Processes(1); err != nil || len(list) != 1 {
		t.Errorf("Processes: %v %v", list, err)
	}
	if len(auditRecords(t, lf.dir, "exec")) != 1 { // (exec_exited is written after done closes)
		t.Error("the call is not in the audit log")
	}
	if err := lf.rt.SignalProcess(1, c.id, unix.SIGTERM, false); codeOf(err) != api.CodeNotRunning {
		t.Errorf("a signal to an ended call: %v", err)
	}
	if _, err := lf.rt.WriteStdin(1, c.id, api.StdinRequest{Data: []byte("x")}); codeOf(err) != api.CodeNotRunning {
		t.Errorf("stdin of an ended call: %v", err)
	}
}

// A call with stdin takes what is written to it, until it is closed;
// after that there is no stdin to write.
func TestAToolCallsStdinIsWrittenThenClosed(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup1)
	lf.idleGeneration(1)
	c := lf.exec(1, api.ExecRequest{Command: []string{"cat"}, Stdin: true})
	res, err := lf.rt.WriteStdin(1, c.id, api.StdinRequest{Data: []byte("hello\n"), Close: true})
	if err != nil || res.Written != 6 || !res.Closed {
		t.Fatalf("%+v %v", res, err)
	}
	rec := final(t, c)
	if out, _ := os.ReadFile(rec.Stdout); string(out) != "hello\n" || *rec.ExitCode != 0 {
		t.Fatalf("output %q, exit %d", out, *rec.ExitCode)
	}
	if _, err := c.writeStdin([]byte("more"), false, stdinTimeout); codeOf(err) != api.CodeStdinClosed {
		t.Errorf("a write after the close: %v", err)
	}
	if res, err := c.writeStdin(nil, true, stdinTimeout); err != nil || !res.Closed {
		t.Errorf("closing again: %+v %v", res, err)
	}
}

// A call past its timeout is killed, its whole tree, and its record says
// so; a signal reaches a running call's leader.
func TestAToolCallIsKilledAtItsTimeoutAndSignalled(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup2)
	lf.idleGeneration(1)
	slow := lf.exec(1, api.ExecRequest{Command: []string{"cat"}, Stdin: true, TimeoutMS: 1})
	if rec := final(t, slow); !rec.TimedOut || rec.Signal != int(unix.SIGKILL) {
		t.Fatalf("timed out: %+v", rec)
	}
	c := lf.exec(1, api.ExecRequest{Command: []string{"cat"}, Stdin: true})
	if err := lf.rt.SignalProcess(1, c.id, unix.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	if rec := final(t, c); rec.Signal != int(unix.SIGTERM) || rec.TimedOut {
		t.Fatalf("signalled: %+v", rec)
	}
	c = lf.exec(1, api.ExecRequest{Command: []string{"cat"}, Stdin: true})
	if err := lf.rt.SignalProcess(1, c.id, unix.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	if rec := final(t, c); rec.Signal != int(unix.SIGKILL) {
		t.Fatalf("killed with its cgroup: %+v", rec)
	}
	if _, _, err := lf.rt.findCall(1, "99"); codeOf(err) != api.CodeNotFound {
		t.Errorf("an unknown call: %v", err)
	}
}

// The fence of a generation kills its running calls with it; their
// records say fenced, and no call starts in it any more.
func TestTheFenceKillsTheGenerationsCalls(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup2)
	lf.idleGeneration(1)
	c := lf.exec(1, api.ExecRequest{Command: []string{"cat"}, Stdin: true})
	lf.idleGeneration(2)
	if rec := final(t, c); !rec.Fenced || rec.Signal != int(unix.SIGKILL) {
		t.Fatalf("record %+v", rec)
	}
	if _, err := lf.rt.Exec(1, api.ExecRequest{Command: []string{"true"}}); codeOf(err) != api.CodeStaleGeneration {
		t.Fatalf("a call into the fenced generation: %v", err)
	}
	if _, err := lf.rt.Exec(2, api.ExecRequest{Command: []string{"no-such-command-here"}}); codeOf(err) != api.CodeStartFailed {
		t.Fatalf("a command that is not there: %v", err)
	}
	if _, err := lf.rt.Exec(2, api.ExecRequest{Command: []string{"true"}, User: "no-such-user-here"}); codeOf(err) != api.CodeBadRequest {
		t.Fatalf("a user that is not there: %v", err)
	}
}
