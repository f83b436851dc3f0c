package integration

// Issue 24: tool calls inside a generation (exec), through the real
// binary as PID 1 of its own namespaces. Each hostile call has its
// control where the guarantee is absent.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/internal/testutil"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// execCtx bounds every call of a test.
func execCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startIdle announces idle generation n and checks its record.
func startIdle(t *testing.T, s *Shim, n uint64, extra ...string) api.StartResult {
	t.Helper()
	var r api.StartResult
	s.MustCtl(&r, append([]string{"start", "--generation", strconv.FormatUint(n, 10)}, extra...)...)
	var g api.Generation
	s.MustCtl(&g, "generation", "--generation", strconv.FormatUint(n, 10))
	if !g.Idle || g.State != api.StateRunning {
		t.Fatalf("generation %d should be idle and running: %+v", n, g)
	}
	return r
}

// execOut runs a call and returns its record, stdout and stderr.
func execOut(t *testing.T, s *Shim, n uint64, req api.ExecRequest) (*api.Process, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	rec, err := s.Client.Exec(execCtx(t), n, req, &client.Output{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %v: %v", req.Command, err)
	}
	return rec, out.String(), errb.String()
}

func TestExecStreamsOutputAndExitCode(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	rec, out, errs := execOut(t, s, 1, api.ExecRequest{Command: []string{"sh", "-c", "echo out; echo err >&2; echo $SHIM_GENERATION $FOO; exit 3"},
		Env: []string{"FOO=bar"}})
	if out != "out\n1 bar\n" || errs != "err\n" {
		t.Errorf("output %q, %q", out, errs)
	}
	if rec.ExitCode == nil || *rec.ExitCode != 3 || rec.State != api.ProcessExited || rec.Fenced || rec.TimedOut {
		t.Errorf("record: %+v", rec)
	}
	// Its cgroup was a child of the generation's, and is gone.
	if !strings.HasSuffix(rec.Cgroup, "/gen-1/proc-"+rec.ID) {
		t.Errorf("call cgroup %s", rec.Cgroup)
	}
	if _, err := os.Stat(rec.Cgroup); !os.IsNotExist(err) {
		t.Errorf("call cgroup left: %v", err)
	}
	// Its record and output files.
	var disk api.Process
	if err := readJSONFile(filepath.Join(s.RuntimeDir, "gen", "1", "proc", rec.ID, "process.json"), &disk); err != nil || disk.ExitCode == nil || *disk.ExitCode != 3 {
		t.Errorf("process.json: %+v %v", disk, err)
	}
	if b, _ := os.ReadFile(filepath.Join(s.RuntimeDir, "gen", "1", "proc", rec.ID, "stdout")); string(b) != out {
		t.Errorf("stdout file %q", b)
	}
	// The CLI exits with the command's code.
	o, _, code := s.Ctl("exec", "--generation", "1", "--", "sh", "-c", "echo hi; exit 7")
	if code != 7 || o != "hi\n" {
		t.Errorf("ctl exec: exit %d, %q", code, o)
	}
	list, err := s.Client.Processes(execCtx(t), 1)
	if err != nil || len(list) != 2 {
		t.Errorf("processes: %+v %v", list, err)
	}
}

func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func TestExecStdin(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	ctx := execCtx(t)
	p, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{"sh", "-c", "while read l; do echo got $l; done; echo eof"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"a", "b"} {
		if n, err := s.Client.WriteStdin(ctx, 1, p.ID, []byte(l+"\n")); err != nil || n != 2 {
			t.Fatalf("write stdin: %d %v", n, err)
		}
	}
	if err := s.Client.CloseStdin(ctx, 1, p.ID); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rec, err := s.Client.Attach(ctx, 1, p.ID, &client.Output{Stdout: &out}, true)
	if err != nil || rec == nil || *rec.ExitCode != 0 || out.String() != "got a\ngot b\neof\n" {
		t.Fatalf("attach: %+v %v %q", rec, err, out.String())
	}
	// Re-attach from an offset: the rest only.
	out.Reset()
	if _, err := s.Client.Attach(ctx, 1, p.ID, &client.Output{Stdout: &out, StdoutOffset: 6}, false); err != nil || out.String() != "got b\neof\n" {
		t.Errorf("attach from 6: %v %q", err, out.String())
	}
	// ctl exec -i: this process's stdin, closed at its end.
	cmd := exec.Command(shimBin, "ctl", "--runtime-dir", s.RuntimeDir, "exec", "--generation", "1", "-i", "--", "sh", "-c", "cat; exit 4")
	cmd.Stdin = strings.NewReader("from ctl\n")
	ob, err := cmd.Output()
	if cmd.ProcessState.ExitCode() != 4 || string(ob) != "from ctl\n" {
		t.Errorf("ctl exec -i: exit %d, %q %v", cmd.ProcessState.ExitCode(), ob, err)
	}
	// Stdin data in the request, closed after it.
	_, o, _ := execOut(t, s, 1, api.ExecRequest{Command: []string{"cat"}, StdinData: []byte("hello")})
	if o != "hello" {
		t.Errorf("cat: %q", o)
	}
}

func TestExecPTY(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	rec, out, _ := execOut(t, s, 1, api.ExecRequest{Command: []string{"sh", "-c", "test -t 0 && test -t 1 && stty size"}, TTY: true, Rows: 33, Cols: 101})
	if *rec.ExitCode != 0 || strings.TrimSpace(out) != "33 101" {
		t.Fatalf("pty: %+v %q", rec, out)
	}
	ctx := execCtx(t)
	p, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{"sh", "-c", "read x; stty size; echo $x"}, TTY: true, Stdin: true, Rows: 10, Cols: 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Client.Resize(ctx, 1, p.ID, 44, 55); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.WriteStdin(ctx, 1, p.ID, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	var o bytes.Buffer
	rec, err = s.Client.Attach(ctx, 1, p.ID, &client.Output{Stdout: &o}, true)
	if err != nil || *rec.ExitCode != 0 || !strings.Contains(o.String(), "44 55") {
		t.Fatalf("resize: %+v %v %q", rec, err, o.String())
	}
}

// procsOf counts the processes of a cgroup tree (0 once it is gone).
func procsOfTree(dir string) int {
	n := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "cgroup.procs" {
			b, _ := os.ReadFile(p)
			n += len(strings.Fields(string(b)))
		}
		return nil
	})
	return n
}

// An escapist call: a setsid child that ignores SIGTERM, then hangs.
const escapist = `setsid sh -c 'trap "" TERM; echo $$ > "$1"; exec sleep 1000' sh "$1" &
while [ ! -s "$1" ]; do :; done
echo ready
exec sleep 1000
`

func TestExecTimeoutKillsTheWholeTree(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	dir := t.TempDir()
	sh := script(t, dir, "esc.sh", escapist)
	pidf := filepath.Join(dir, "pid")
	var out bytes.Buffer
	rec, err := s.Client.Exec(execCtx(t), 1, api.ExecRequest{Command: []string{sh, pidf}, TimeoutMS: 1500}, &client.Output{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if !rec.TimedOut || rec.ExitCode == nil || *rec.ExitCode != 137 || out.String() != "ready\n" {
		t.Fatalf("record %+v, output %q", rec, out.String())
	}
	if esc, _ := strconv.Atoi(strings.TrimSpace(readString(t, pidf))); esc <= 0 {
		t.Fatal("no escapist pid")
	}
	// 0 survivors: the call's cgroup is empty (and removed), and only
	// shim and the generation's holder are left in shim's pid namespace.
	if n := procsOfTree(rec.Cgroup); n != 0 {
		t.Errorf("%d processes left in the call's cgroup", n)
	}
	eventually(t, 10*time.Second, "the setsid child gone (only shim and the holder left)", func() bool { return len(s.PidnsProcs()) == 2 })
	// The timeout covers what a leader left behind when it exited: a
	// daemon started by a call that returns at once is killed at the
	// deadline (before, it ran on until the fence).
	daemon := filepath.Join(dir, "daemon")
	rec3, err := s.Client.Exec(execCtx(t), 1, api.ExecRequest{Command: []string{"sh", "-c",
		"setsid sh -c 'echo $$ > " + daemon + "; exec sleep 1000' </dev/null >/dev/null 2>&1 & while [ ! -s " + daemon + " ]; do :; done"},
		TimeoutMS: 1500}, nil)
	if err != nil || rec3.TimedOut || rec3.Leftover != 1 {
		t.Fatalf("a call that leaves a daemon: %+v %v", rec3, err)
	}
	eventually(t, 30*time.Second, "the daemon killed at the call's deadline", func() bool { return procsOfTree(rec3.Cgroup) == 0 })
	// ctl exec exits 124.
	if _, _, code := s.Ctl("exec", "--generation", "1", "--timeout", "300ms", "--", "sleep", "1000"); code != 124 {
		t.Errorf("ctl exec of a timed-out call: exit %d, want 124", code)
	}
	// Control: the leader's timeout alone (a kill of the leader's pid)
	// leaves the setsid child; the signal to the whole tree does not.
	pidf2 := filepath.Join(dir, "pid2")
	p, err := s.Client.ExecDetached(execCtx(t), 1, api.ExecRequest{Command: []string{sh, pidf2}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "escapist 2 ready", func() bool { b, _ := os.ReadFile(pidf2); return len(b) > 0 })
	if err := s.Client.SignalProcess(execCtx(t), 1, p.ID, "KILL", false); err != nil {
		t.Fatal(err)
	}
	rec2, err := s.Client.Attach(execCtx(t), 1, p.ID, nil, true)
	if err != nil || rec2.Leftover == 0 {
		t.Fatalf("control: killing the leader should leave the setsid child: %+v %v", rec2, err)
	}
	if err := s.Client.SignalProcess(execCtx(t), 1, p.ID, "KILL", true); err != nil {
		t.Fatal(err)
	}
	if n := procsOfTree(rec2.Cgroup); n != 0 {
		t.Errorf("%d processes left after the kill of the tree", n)
	}
}

func TestExecStaleAndRefused(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	ctx := execCtx(t)
	p, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	var r2 api.StartResult
	s.MustCtl(&r2, "start", "--generation", "2", "--idle")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || len(r2.Fenced[0].ToolCalls) != 1 || r2.Fenced[0].ToolCalls[0].ID != p.ID {
		t.Fatalf("fence report: %+v", r2.Fenced)
	}
	rec, err := s.Client.Attach(ctx, 1, p.ID, nil, true)
	if err != nil || !rec.Fenced {
		t.Errorf("the fenced call: %+v %v", rec, err)
	}
	_, err = s.Client.Exec(ctx, 1, api.ExecRequest{Command: []string{"true"}}, nil)
	if client.CodeOf(err) != api.CodeStaleGeneration {
		t.Errorf("exec into a fenced generation: %v", err)
	}
	if _, _, code := s.Ctl("exec", "--generation", "1", "--", "true"); code != 3 {
		t.Errorf("ctl exec into a fenced generation: exit %d, want 3", code)
	}
	_, err = s.Client.Exec(ctx, 3, api.ExecRequest{Command: []string{"true"}}, nil)
	if client.CodeOf(err) != api.CodeNotFound {
		t.Errorf("exec into an unannounced generation: %v", err)
	}
	_, err = s.Client.Exec(ctx, 2, api.ExecRequest{}, nil)
	if client.CodeOf(err) != api.CodeBadRequest {
		t.Errorf("exec without a command: %v", err)
	}
	_, err = s.Client.Exec(ctx, 2, api.ExecRequest{Command: []string{"no-such-command-here"}}, nil)
	if client.CodeOf(err) != api.CodeStartFailed {
		t.Errorf("exec of a missing command: %v", err)
	}
	// wait returns when an idle generation is ended.
	done := make(chan error, 1)
	go func() { _, err := s.Client.Wait(ctx, 2); done <- err }()
	if _, err := s.Client.End(ctx, 2, api.EndRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("wait of the ended idle generation: %v", err)
	}
}

// TestExecOnTheGenerationsLayers: a call runs in the generation's mount,
// IPC and network namespaces, as its user, with no_new_privs, on its
// layers: its edits are not in the lower, the next call sees them, and
// the fence saves them in refs/shim/abandoned/1 like a harness's.
func TestExecOnTheGenerationsLayers(t *testing.T) {
	r := newLayerRig(t, "auto")
	s, f := r.s, r.f
	var r1 api.StartResult
	s.MustCtl(&r1, f.startArgs(1, "--network", "none", "--idle")...)
	// As root (the holder is root: the generation's user may not read
	// its namespaces), the call's namespaces are the holder's.
	nsProbe := fmt.Sprintf(`for ns in mnt ipc net; do [ "$(readlink /proc/self/ns/$ns)" = "$(readlink /proc/%d/ns/$ns)" ] || echo "$ns differs"; done
[ "$(readlink /proc/self/ns/mnt)" != "$(readlink /proc/1/ns/mnt)" ] || echo "in shim's mount namespace"
echo checked`, r1.Pid)
	if _, o, e := execOut(t, s, 1, api.ExecRequest{User: "0", Command: []string{"sh", "-c", nsProbe}}); o != "checked\n" {
		t.Errorf("namespaces: %q %q", o, e)
	}
	probe := fmt.Sprintf(`id -u; id -g; pwd; grep NoNewPrivs /proc/self/status
kill -9 %d 2>/dev/null && echo "killed the holder"
echo "tool edit" > tool.txt; rm README.md; git add -A 2>/dev/null; echo done`, r1.Pid)
	rec, out, errs := execOut(t, s, 1, api.ExecRequest{Command: []string{"sh", "-c", probe}})
	want := fmt.Sprintf("%d\n%d\n%s\nNoNewPrivs:\t1\ndone\n", wtUID, wtUID, f.wt)
	if *rec.ExitCode != 0 || out != want {
		t.Fatalf("call: %+v\nstdout %q\nwant   %q\nstderr %q", rec, out, want, errs)
	}
	// Only stdin, stdout and stderr (ls's own directory is the 4th).
	if _, o, _ := execOut(t, s, 1, api.ExecRequest{Command: []string{"ls", "/proc/self/fd"}}); o != "0\n1\n2\n3\n" {
		t.Errorf("a call's open files: %q", o)
	}
	// The lower is untouched; the next call sees the edit.
	if _, err := os.Stat(filepath.Join(f.wt, "tool.txt")); !os.IsNotExist(err) {
		t.Errorf("the call's edit reached the lower: %v", err)
	}
	if _, o, _ := execOut(t, s, 1, api.ExecRequest{Command: []string{"cat", "tool.txt"}}); o != "tool edit\n" {
		t.Errorf("the next call does not see the edit: %q", o)
	}
	// A call cannot reach the control socket, even as root.
	_, o, _ := execOut(t, s, 1, api.ExecRequest{User: "0", Command: []string{"sh", "-c",
		"curl -s --unix-socket " + filepath.Join(s.RuntimeDir, "shim.sock") + " http://shim/v1/status || echo unreachable"}})
	if !strings.Contains(o, api.CodePeerNotAllowed) && !strings.Contains(o, "unreachable") {
		t.Errorf("a tool call reached the control socket: %q", o)
	}
	var r2 api.StartResult
	s.MustCtl(&r2, f.startArgs(2, "--idle")...)
	if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil || r2.Fenced[0].SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	if got := hgit(t, f.wt, "show", "refs/shim/abandoned/1:tool.txt"); got != "tool edit" {
		t.Errorf("the call's edit in the snapshot: %q", got)
	}
	if _, err := hgitErr(f.wt, "cat-file", "-e", "refs/shim/abandoned/1:README.md"); err == nil {
		t.Errorf("the call's removal is not in the snapshot")
	}
	// Generation 2 starts on the baseline.
	if _, o, _ := execOut(t, s, 2, api.ExecRequest{Command: []string{"sh", "-c", "ls tool.txt README.md 2>&1"}}); !strings.Contains(o, "No such file") || !strings.Contains(o, "README.md\n") {
		t.Errorf("generation 2's worktree: %q", o)
	}
}

// A generation whose lease ran out is suspended: an exec into it is
// GENERATION_SUSPENDED (its calls are frozen with it), a renewal resumes
// it and its calls.
func TestExecIntoASuspendedGeneration(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1, "--lease", "300ms")
	ctx := execCtx(t)
	p, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{"sh", "-c", "read x; echo got $x"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "suspended", func() bool {
		g, err := s.Client.Generation(ctx, 1)
		return err == nil && g.State == api.StateSuspended && g.Lease != nil && g.Lease.FrozenAt != nil // frozen, then recorded
	})
	if _, err := s.Client.Exec(ctx, 1, api.ExecRequest{Command: []string{"true"}}, nil); client.CodeOf(err) != api.CodeGenerationSuspended {
		t.Errorf("exec into a suspended generation: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(p.Cgroup), "cgroup.events")); !strings.Contains(string(b), "frozen 1") {
		t.Errorf("the generation (and its calls) not frozen: %s", b)
	}
	if _, err := s.Client.Renew(ctx, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.WriteStdin(ctx, 1, p.ID, []byte("x\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if rec, err := s.Client.Attach(ctx, 1, p.ID, &client.Output{Stdout: &out}, true); err != nil || *rec.ExitCode != 0 || out.String() != "got x\n" {
		t.Errorf("the call after the renewal: %+v %v %q", rec, err, out.String())
	}
}

// The round trip of `true` through exec, as the benchmark reports
// it (median of 50, logged; no timing is asserted).
func TestExecRoundTripOfTrue(t *testing.T) {
	for _, iso := range []string{"scan", "auto"} {
		t.Run(iso, func(t *testing.T) {
			var s *Shim
			if iso == "auto" {
				r := newLayerRig(t, "auto")
				s = r.s
				s.MustCtl(nil, r.f.startArgs(1, "--idle")...)
			} else {
				s = startShim(t, shimOpts{})
				startIdle(t, s, 1)
			}
			ctx := execCtx(t)
			var ds []time.Duration
			for i := 0; i < 50; i++ {
				t0 := time.Now()
				rec, err := s.Client.Exec(ctx, 1, api.ExecRequest{Command: []string{"true"}}, nil)
				if err != nil || *rec.ExitCode != 0 {
					t.Fatalf("exec true: %+v %v", rec, err)
				}
				ds = append(ds, time.Since(t0))
			}
			slices.Sort(ds)
			t.Logf("exec of true (%s): median %v, min %v, max %v", iso, ds[len(ds)/2], ds[0], ds[len(ds)-1])
		})
	}
}

// The CLI's exec verbs end to end: exec --detach, processes, process,
// attach (without and with follow), kill.
func TestExecCLIVerbs(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	var p api.Process
	s.MustCtl(&p, "exec", "--generation", "1", "--detach", "--label", "step=build", "--", "sh", "-c", "echo hi; exec sleep 1000")
	if p.ID == "" || p.State != api.ProcessRunning || p.Labels["step"] != "build" {
		t.Fatalf("exec --detach: %+v", p)
	}
	var list []api.Process
	s.MustCtl(&list, "processes", "--generation", "1")
	if len(list) != 1 || list[0].ID != p.ID {
		t.Errorf("processes: %+v", list)
	}
	eventually(t, 10*time.Second, "hi written", func() bool {
		var q api.Process
		s.MustCtl(&q, "process", "--generation", "1", p.ID)
		return q.StdoutBytes == 3
	})
	if o, _, code := s.Ctl("attach", "--generation", "1", "--no-follow", p.ID); code != 0 || o != "hi\n" {
		t.Errorf("attach --no-follow: exit %d %q", code, o)
	}
	if _, e, code := s.Ctl("kill", "--generation", "1", "--all", "--signal", "KILL", p.ID); code != 0 {
		t.Errorf("kill: exit %d %s", code, e)
	}
	if o, _, code := s.Ctl("attach", "--generation", "1", "--stdout-offset", "1", p.ID); code != 137 || o != "i\n" {
		t.Errorf("attach after the kill: exit %d %q", code, o)
	}
	if _, e, code := s.Ctl("process", "--generation", "1", "99"); code != 1 || !strings.Contains(e, api.CodeNotFound) {
		t.Errorf("process 99: exit %d %s", code, e)
	}
}

// A call that returns and leaves a connected process behind: the fence
// aborts that process's connection too (its socket carries the call's
// cgroup id, and the call's record says leftover), in the same dump as
// the running calls'. Before, only running calls' cgroups were named, and
// a leftover's queued bytes could still reach its server after the kill.
func TestExecFenceCutsALeftoversConnection(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	dir := testutil.HarnessDir(t, -1)
	portf, conn := filepath.Join(dir, "port"), filepath.Join(dir, "connected")
	server := `import socket,sys,time
l=socket.socket(); l.bind(("127.0.0.1",0)); l.listen(1)
open(sys.argv[1]+".tmp","w").write(str(l.getsockname()[1])); __import__("os").rename(sys.argv[1]+".tmp", sys.argv[1])
c,_=l.accept(); time.sleep(1000)`
	if _, err := s.Client.ExecDetached(execCtx(t), 1, api.ExecRequest{Command: []string{"python3", "-c", server, portf}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the server listening", func() bool { b, _ := os.ReadFile(portf); return len(b) > 0 })
	port := strings.TrimSpace(readString(t, portf))
	rec, err := s.Client.Exec(execCtx(t), 1, api.ExecRequest{Command: []string{"bash", "-c",
		`setsid bash -c 'exec 3<>/dev/tcp/127.0.0.1/` + port + `; echo ok > ` + conn + `; while :; do printf %65536s >&3; done' </dev/null >/dev/null 2>&1 &
		while [ ! -s ` + conn + ` ]; do :; done`}}, nil)
	if err != nil || rec.Leftover != 1 {
		t.Fatalf("the call that leaves a connected process: %+v %v", rec, err)
	}
	var r2 api.StartResult
	s.MustCtl(&r2, "start", "--generation", "2", "--idle")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	found := false
	cut := r2.Fenced[0].Cut
	if cut == nil {
		t.Fatalf("no cut report: %+v", r2.Fenced[0])
	}
	for _, c := range cut.Connections {
		found = found || c.Remote == "127.0.0.1:"+port
	}
	if !found {
		t.Errorf("the leftover's connection to :%s is not among the cut's: %+v", port, cut.Connections)
	}
}
