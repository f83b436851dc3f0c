package integration

// Hostile tool calls (issue 24): each against the real binary, with its
// control where the guarantee can be shown absent.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
	"github.com/shimdev/shim/internal/testutil"
)

// A call that forks thousands of processes (setsid, TERM ignored) and
// waits: bounded by the count it forks, not by a pids limit (the hybrid
// host's cgroup2 has no pids controller).
const forker = `trap "" TERM
setsid sh -c 'trap "" TERM; i=0; while [ $i -lt 1500 ]; do sleep 1000 & i=$((i+1)); done; echo forked > "$1"; wait' sh "$1" &
i=0; while [ $i -lt 1500 ]; do sleep 1000 & i=$((i+1)); done
wait
`

func TestExecForkingCallIsKilledByTheFence(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	dir := t.TempDir()
	sh := script(t, dir, "forker.sh", forker)
	done := filepath.Join(dir, "forked")
	ctx := execCtx(t)
	p, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{sh, done}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the call forked", func() bool {
		_, err := os.Stat(done)
		return err == nil && procsOfTree(p.Cgroup) > 2500
	})
	// Control: a kill of the leader (what a supervisor holding one pid
	// can do) leaves the forked tree running.
	if err := s.Client.SignalProcess(ctx, 1, p.ID, "KILL", false); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Client.Attach(ctx, 1, p.ID, nil, true)
	if err != nil || rec.Leftover < 2500 {
		t.Fatalf("control: the leader's kill should leave the tree: %+v %v", rec, err)
	}
	// The fence of its generation leaves nothing.
	var r2 api.StartResult
	s.MustCtl(&r2, "start", "--generation", "2", "--idle")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || r2.Fenced[0].Killed < 2500 || r2.Fenced[0].Error != nil {
		t.Fatalf("fence report: %+v", r2.Fenced)
	}
	if _, err := os.Stat(filepath.Dir(p.Cgroup)); !os.IsNotExist(err) {
		t.Errorf("gen-1's cgroup is still there: %v", err)
	}
	eventually(t, 10*time.Second, "only shim and gen 2's holder left", func() bool { return len(s.PidnsProcs()) == 2 })
}

// shimPeak is shim's peak RSS (VmHWM) since the last resetPeak.
func shimPeak(t *testing.T, s *Shim) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return peakRSS(string(b))
}

func resetPeak(t *testing.T, s *Shim) {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", s.Cmd.Process.Pid), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
}

// outputBound is how much shim's peak RSS may grow while a call writes
// 1 GiB: a few buffers, far below the output.
const outputBound = 32 << 20

func TestExecHugeOutputIsCappedAndShimStaysFlat(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	execOut(t, s, 1, api.ExecRequest{Command: []string{"true"}}) // warm
	resetPeak(t, s)
	before := shimPeak(t, s)
	out := &client.Output{Stdout: io.Discard}
	rec, err := s.Client.Exec(execCtx(t), 1, api.ExecRequest{Command: []string{"head", "-c", "1073741824", "/dev/zero"}}, out)
	if err != nil {
		t.Fatal(err)
	}
	after := shimPeak(t, s)
	t.Logf("shim VmHWM before %d KiB, after 1 GiB of output %d KiB", before>>10, after>>10)
	const max = 16 << 20
	if *rec.ExitCode != 0 || rec.StdoutBytes != 1<<30 || rec.StdoutKept != max {
		t.Errorf("record: %+v", rec)
	}
	if out.StdoutOffset != 1<<30 || out.StdoutDropped != 1<<30-max {
		t.Errorf("stream: offset %d, dropped %d", out.StdoutOffset, out.StdoutDropped)
	}
	if st, err := os.Stat(rec.Stdout); err != nil || st.Size() != max {
		t.Errorf("stdout file: %v %v", st, err)
	}
	if after-before > outputBound {
		t.Errorf("shim's peak RSS grew by %d MiB for 1 GiB of output", (after-before)>>20)
	}
}

func TestExecReaderThatNeverReads(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	execOut(t, s, 1, api.ExecRequest{Command: []string{"true"}})
	resetPeak(t, s)
	before := shimPeak(t, s)
	// A raw connection that sends the exec and never reads its answer.
	c, err := net.Dial("unix", filepath.Join(s.RuntimeDir, "shim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"command": ["head", "-c", "268435456", "/dev/zero"], "labels": {"reader": "never"}}`
	fmt.Fprintf(c, "POST /v1/generations/1/processes HTTP/1.1\r\nHost: shim\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// The call runs to its end all the same: shim neither blocks on the
	// reader nor keeps the output for it.
	var rec *api.Process
	eventually(t, time.Minute, "the call ended without its reader", func() bool {
		list, err := s.Client.Processes(execCtx(t), 1)
		if err != nil || len(list) != 2 || list[1].State != api.ProcessExited {
			return false
		}
		rec = &list[1]
		return true
	})
	if rec.StdoutBytes != 256<<20 || rec.ExitCode == nil || *rec.ExitCode != 0 {
		t.Errorf("record: %+v", rec)
	}
	// Shim serves others meanwhile.
	if _, o, _ := execOut(t, s, 1, api.ExecRequest{Command: []string{"echo", "ok"}}); o != "ok\n" {
		t.Errorf("another call: %q", o)
	}
	after := shimPeak(t, s)
	t.Logf("shim VmHWM before %d KiB, with a reader that never reads 256 MiB %d KiB", before>>10, after>>10)
	if after-before > outputBound {
		t.Errorf("shim's peak RSS grew by %d MiB for a reader that never reads", (after-before)>>20)
	}
	// What the reader gets when it reads at last: frames from the start
	// (the file is its buffer), then a dropped frame and the exit.
	br := bufio.NewReaderSize(c, 1<<20)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var last api.Frame
	var dropped int64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if err := jsonUnmarshalFrame(sc.Bytes(), &last); err != nil {
			t.Fatal(err)
		}
		if last.Type == api.FrameDropped {
			dropped += last.Bytes
		}
	}
	if last.Type != api.FrameExit || dropped != 256<<20-16<<20 {
		t.Errorf("the slow reader's stream: last %q, dropped %d", last.Type, dropped)
	}
}

// The harness of generation 1 and its tool calls cannot reach the
// control socket: an exec into generation 2 (or anything else) from
// inside is refused PEER_NOT_ALLOWED. Control: the same request from
// outside the generation's cgroups is answered.
func TestExecFromInsideAGenerationIsRefused(t *testing.T) {
	s := startShim(t, shimOpts{})
	dir := t.TempDir()
	sock := filepath.Join(s.RuntimeDir, "shim.sock")
	try := fmt.Sprintf(`%s ctl --runtime-dir %s exec --generation 2 -- true > %s/$1.out 2> %s/$1.err; echo $? > %s/$1.code`,
		shimBin, s.RuntimeDir, dir, dir, dir)
	h := script(t, dir, "h.sh", try+"\nexec sleep 1000\n")
	var r1 api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--", h, "harness")
	eventually(t, 10*time.Second, "the harness tried", func() bool { _, err := os.Stat(filepath.Join(dir, "harness.code")); return err == nil })
	// A tool call of generation 1, as root.
	if _, err := s.Client.ExecDetached(execCtx(t), 1, api.ExecRequest{Command: []string{"sh", "-c", try, "sh", "call"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the call tried", func() bool { _, err := os.Stat(filepath.Join(dir, "call.code")); return err == nil })
	for _, who := range []string{"harness", "call"} {
		errs := readString(t, filepath.Join(dir, who+".err"))
		if !strings.Contains(errs, api.CodePeerNotAllowed) {
			t.Errorf("%s: %s", who, errs)
		}
	}
	// Control: from outside (the test), generation 2's exec is answered
	// (it is not announced yet: NOT_FOUND, from shim itself).
	_, err := client.NewSocket(sock).Exec(execCtx(t), 2, api.ExecRequest{Command: []string{"true"}}, nil)
	if client.CodeOf(err) != api.CodeNotFound {
		t.Errorf("control: %v", err)
	}
}

// A call passes its stdout to a process outside the sandbox's
// generations and waits: the fence still leaves 0 survivors, and the
// call's stream ends with its fenced frame (shim does not wait for a pipe
// somebody else holds open). Control: the outside holder can still write
// into the pipe after the fence (the fd was really passed).
func TestExecPassedFDDoesNotKeepACallAlive(t *testing.T) {
	testutil.NeedTool(t, "python3") // to pass an fd from a shell-less call
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	dir := t.TempDir()
	sockPath := filepath.Join(dir, "accomplice.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sockPath, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan *os.File, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		oob := make([]byte, unix.CmsgSpace(4))
		_, oobn, _, _, err := c.ReadMsgUnix(make([]byte, 1), oob)
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) == 0 {
			got <- nil
			return
		}
		fds, _ := unix.ParseUnixRights(&msgs[0])
		got <- os.NewFile(uintptr(fds[0]), "passed")
	}()
	py := `import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
socket.send_fds(s, [b"x"], [1])
print("passed", flush=True)
time.sleep(1000)
`
	var frames []string
	var mu sync.Mutex
	out := &client.Output{Frame: func(f api.Frame) error {
		mu.Lock()
		frames = append(frames, f.Type)
		mu.Unlock()
		return nil
	}}
	var stdout bytes.Buffer
	out.Stdout = &stdout
	res := make(chan error, 1)
	var rec *api.Process
	go func() {
		var err error
		rec, err = s.Client.Exec(execCtx(t), 1, api.ExecRequest{Command: []string{"python3", "-c", py, sockPath}}, out)
		res <- err
	}()
	passed := <-got
	if passed == nil {
		t.Fatal("the accomplice got no fd")
	}
	defer passed.Close()
	var r2 api.StartResult
	s.MustCtl(&r2, "start", "--generation", "2", "--idle")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || len(r2.Fenced[0].ToolCalls) != 1 {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	if err := <-res; err != nil || !rec.Fenced {
		t.Fatalf("the call's stream: %+v %v", rec, err)
	}
	mu.Lock()
	if frames[len(frames)-1] != api.FrameFenced {
		t.Errorf("frames: %v", frames)
	}
	mu.Unlock()
	eventually(t, 10*time.Second, "only shim and gen 2's holder left", func() bool { return len(s.PidnsProcs()) == 2 })
	// Control: the passed pipe is alive in the accomplice's hands; nothing
	// reads it any more, so a write ends in EPIPE or is taken by the
	// kernel's buffer, never by the call's stream.
	if _, err := passed.Write([]byte("after\n")); err == nil {
		t.Logf("the accomplice still holds a writable pipe (its reader is gone from the call's stream)")
	}
	if strings.Contains(stdout.String(), "after") {
		t.Errorf("a write after the fence reached the call's stream: %q", stdout.String())
	}
}

func TestExecManyConcurrentCalls(t *testing.T) {
	s := startShim(t, shimOpts{})
	startIdle(t, s, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var out bytes.Buffer
			rec, err := s.Client.Exec(ctx, 1, api.ExecRequest{Command: []string{"sh", "-c", "echo $0", strconv.Itoa(i)}}, &client.Output{Stdout: &out})
			switch {
			case err != nil:
				errs <- err
			case *rec.ExitCode != 0 || out.String() != strconv.Itoa(i)+"\n":
				errs <- fmt.Errorf("call %d: %+v %q", i, rec, out.String())
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	list, err := s.Client.Processes(ctx, 1)
	if err != nil || len(list) != 100 {
		t.Fatalf("processes: %d %v", len(list), err)
	}
	// At most 256 at once: the next is TOO_MANY_CALLS.
	for i := 0; i < api.MaxCallsPerGeneration; i++ {
		if _, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{"sleep", "1000"}}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if _, err := s.Client.ExecDetached(ctx, 1, api.ExecRequest{Command: []string{"true"}}); client.CodeOf(err) != api.CodeTooManyCalls {
		t.Errorf("call 257: %v", err)
	}
	var r2 api.StartResult
	s.MustCtl(&r2, "start", "--generation", "2", "--idle")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || len(r2.Fenced[0].ToolCalls) != api.MaxCallsPerGeneration {
		t.Fatalf("fence: survivors %d, tool calls %d", r2.Fenced[0].Survivors, len(r2.Fenced[0].ToolCalls))
	}
}

func jsonUnmarshalFrame(b []byte, f *api.Frame) error {
	*f = api.Frame{}
	return json.Unmarshal(b, f)
}
