package integration

// Tool calls racing the generation's end: a spawn across a suspension or
// the harness's exit, an OOM kill of the holder; each with its control.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
)

// holdCallAtItsOutput makes call k of generation n stop, once started,
// at the creation of its stdout file (a FIFO nobody opened yet): a
// deterministic stand-in for a spawn that is slow between its state check
// and its clone. It returns the FIFO's path; opening it for reading lets
// the call go on.
func holdCallAtItsOutput(t *testing.T, s *Shim, n, k string) string {
	t.Helper()
	dir := filepath.Join(s.RuntimeDir, "gen", n, "proc", k)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "stdout")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	return fifo
}

// release opens the FIFO for reading (the held call's open returns) and
// keeps it open until the test ends.
func release(t *testing.T, fifo string) {
	t.Helper()
	f, err := os.OpenFile(fifo, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
}

type execResult struct {
	p   *api.Process
	err error
}

// TestExecAttackSpawnAcrossASuspension: a call being started when its
// generation's lease runs out. The suspension froze gen-N without waiting
// for the call's spawn (the fence waits for it: calls.gate), so the call
// was cloned into a frozen cgroup: its exec never completed, the exec
// request hung holding the gate shared, and the next announcement's
// fence, which takes the gate first, waited for it for ever: shim could
// never start another generation. Now the suspension waits for a spawn
// in progress, and a spawn re-checks its generation once it has the gate.
// Control: the same held call, released while the generation runs,
// starts and runs (the hold only delays it).
func TestExecAttackSpawnAcrossASuspension(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1, "--lease", "10m")
	ctx := execCtx(t)
	cg := filepath.Join(s.CgroupRoot, "gen-1")

	// Control: held, then released while the generation runs.
	fifo := holdCallAtItsOutput(t, s, "1", "1")
	res := make(chan execResult, 1)
	go func() {
		p, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{"sleep", "1000"}})
		res <- execResult{p, err}
	}()
	eventually(t, 30*time.Second, "call 1 held at its output", func() bool { _, err := os.Stat(filepath.Join(cg, "proc-1")); return err == nil })
	release(t, fifo)
	if r := <-res; r.err != nil || r.p.State != api.ProcessRunning {
		t.Fatalf("control: the held call did not start once released: %+v %v", r.p, r.err)
	}

	// The attack: call 2 held while the lease runs out.
	fifo = holdCallAtItsOutput(t, s, "1", "2")
	go func() {
		p, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{"sleep", "1000"}})
		res <- execResult{p, err}
	}()
	eventually(t, 30*time.Second, "call 2 held at its output", func() bool { _, err := os.Stat(filepath.Join(cg, "proc-2")); return err == nil })
	if _, err := s.Client.Renew(ctx, 1, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "generation 1 suspended", func() bool {
		g, err := s.Client.Generation(ctx, 1)
		return err == nil && g.State == api.StateSuspended
	})
	release(t, fifo)
	select {
	case r := <-res:
		// Started before the freeze (then frozen with the rest), or
		// refused as suspended: either way the request answers.
		t.Logf("the held call: %+v %v", r.p, r.err)
	case <-time.After(time.Minute):
		t.Errorf("the exec held across the suspension never answered (its child cloned into a frozen cgroup)")
	}
	// The next announcement fences generation 1, calls and all.
	out, errOut, code := atkCtl(s.RuntimeDir, 90*time.Second, "start", "--generation", "2", "--idle")
	if code != 0 {
		t.Fatalf("announcing generation 2: code %d (-2: it hung)\n%s%s", code, out, errOut)
	}
	var r2 api.StartResult
	if err := json.Unmarshal([]byte(out), &r2); err != nil {
		t.Fatal(err)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || r2.Fenced[0].Error != nil || len(r2.Fenced[0].ToolCalls) == 0 {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	eventually(t, 10*time.Second, "only shim and gen 2's holder left", func() bool { return len(s.PidnsProcs()) == 2 })
}

// TestExecAttackSpawnAcrossTheHarnessExit: the harness picks its moment.
// A harness (host network, --linger) exits while the supervisor's call is
// being started: shim froze what it left (host mode) without waiting for
// the spawn, the call was cloned into the frozen cgroup, the exec hung,
// and the next announcement's fence waited for it for ever. Now the exit's
// freeze waits for the spawn, and the call is refused NOT_RUNNING or
// started before it (then frozen and fenced). Control: the harness's exit
// did freeze its cgroup (what makes the clone hang).
func TestExecAttackSpawnAcrossTheHarnessExit(t *testing.T) {
	s := startShim(t, shimOpts{})
	dir := t.TempDir()
	gate := filepath.Join(dir, "exit-now")
	if err := unix.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	h := script(t, dir, "h.sh", "read x < "+gate+"\nexit 0\n")
	var r1 api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--linger", "--", h)
	ctx := execCtx(t)
	cg := filepath.Join(s.CgroupRoot, "gen-1")
	fifo := holdCallAtItsOutput(t, s, "1", "1")
	res := make(chan execResult, 1)
	go func() {
		p, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{"sleep", "1000"}})
		res <- execResult{p, err}
	}()
	eventually(t, 30*time.Second, "call 1 held at its output", func() bool { _, err := os.Stat(filepath.Join(cg, "proc-1")); return err == nil })
	// The harness exits now.
	w, err := os.OpenFile(gate, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("go\n"))
	w.Close()
	eventually(t, 30*time.Second, "generation 1 exited", func() bool {
		g, err := s.Client.Generation(ctx, 1)
		return err == nil && g.State == api.StateExited
	})
	release(t, fifo)
	select {
	case r := <-res:
		t.Logf("the held call: %+v %v", r.p, r.err)
	case <-time.After(time.Minute):
		t.Errorf("the exec held across the harness's exit never answered (its child cloned into a frozen cgroup)")
	}
	// Control: what the harness left is frozen (host mode, linger).
	eventually(t, 30*time.Second, "control: gen-1 frozen after its harness exited", func() bool {
		b, _ := os.ReadFile(filepath.Join(cg, "cgroup.events"))
		return strings.Contains(string(b), "frozen 1")
	})
	out, errOut, code := atkCtl(s.RuntimeDir, 90*time.Second, "start", "--generation", "2", "--idle")
	if code != 0 {
		t.Fatalf("announcing generation 2: code %d (-2: it hung)\n%s%s", code, out, errOut)
	}
	var r2 api.StartResult
	if err := json.Unmarshal([]byte(out), &r2); err != nil {
		t.Fatal(err)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || r2.Fenced[0].Error != nil {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	eventually(t, 10*time.Second, "only shim and gen 2's holder left", func() bool { return len(s.PidnsProcs()) == 2 })
}

// TestExecAttackOOMKillsTheHolder: an idle generation's holder is root so
// that no tool call can kill it and end its own generation. A call of the
// generation's user fills a tmpfs until the generation's memory cgroup
// runs out: the OOM killer picks the task with the highest badness, and
// the holder (a few MB of RSS, oom_score_adj like every child's) outweighed
// the call's own small processes (the tmpfs pages are in no process's
// RSS): the call ended its own generation. Now the holder's score is below
// the calls' (and above shim's) and the call's own process is killed.
// Control: the call cannot signal the holder (the promise's other half).
//
// This machine's cgroup2 has no memory controller: the generation's
// memory limit is a v1 memory cgroup the test makes and moves the holder
// and the call into (shim stays outside, as gen-N's memory.max would
// leave it).
func TestExecAttackOOMKillsTheHolder(t *testing.T) {
	mem := atkMemoryCgroup(t, 64<<20)
	fill := atkTmpfs(t, "512m")
	if err := os.Chmod(fill, 0o1777); err != nil {
		t.Fatal(err)
	}
	s := startShim(t, shimOpts{})
	var r1 api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--idle", "--user", "65534:65534")
	ctx := execCtx(t)
	// Control: the call cannot kill the holder with a signal.
	if _, o, _ := execOut(t, s, 1, api.ExecRequest{Command: []string{"sh", "-c", fmt.Sprintf("kill -9 %d 2>/dev/null || echo refused", r1.Pid)}}); o != "refused\n" {
		t.Fatalf("control: the call signalled the holder: %q", o)
	}
	p, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Stdin: true, Command: []string{"sh", "-c", "read x; head -c 268435456 /dev/zero > " + fill + "/fill"}})
	if err != nil {
		t.Fatal(err)
	}
	// Host pids: the holder's (alone in gen-1) and the call's.
	for _, cg := range []string{filepath.Dir(p.Cgroup), p.Cgroup} {
		b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err != nil || len(strings.Fields(string(b))) != 1 {
			t.Fatalf("%s: %q %v", cg, b, err)
		}
		if err := os.WriteFile(filepath.Join(mem, "cgroup.procs"), []byte(strings.TrimSpace(string(b))), 0); err != nil {
			t.Fatalf("move %s into %s: %v", b, mem, err)
		}
	}
	if _, err := s.Client.WriteStdin(ctx, 1, p.ID, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Client.Attach(ctx, 1, p.ID, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the filling call: exit %v signal %d; OOM kills %d", *rec.ExitCode, rec.Signal, atkOOMKills(mem))
	if atkOOMKills(mem) == 0 {
		t.Fatalf("no OOM kill in %s", mem)
	}
	os.Remove(filepath.Join(fill, "fill"))
	g, err := s.Client.Generation(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if g.State != api.StateRunning {
		t.Fatalf("a tool call ended its own generation through the OOM killer: %+v", g.Exit)
	}
	if _, o, _ := execOut(t, s, 1, api.ExecRequest{Command: []string{"echo", "ok"}}); o != "ok\n" {
		t.Errorf("exec after the OOM: %q", o)
	}
}
