package runtime

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// withCalls gives the fake generation n the call table a real start
// gives it.
func (f *fixture) withCalls(n uint64) *calls {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	g := f.rt.gens[n]
	g.calls = newCalls([]string{"PATH=/bin"}, "/", "")
	return g.calls
}

func TestExecIsRefusedByTheGenerationsState(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.withCalls(1)
	if _, err := f.rt.execGeneration(1); err != nil {
		t.Fatalf("running: %v", err)
	}
	if _, err := f.rt.execGeneration(2); codeOf(err) != api.CodeNotFound {
		t.Errorf("not announced: %v", err)
	}
	f.rt.mu.Lock()
	f.rt.gens[1].state = stSuspended
	f.rt.mu.Unlock()
	if _, err := f.rt.execGeneration(1); codeOf(err) != api.CodeGenerationSuspended {
		t.Errorf("suspended: %v", err)
	}
	f.rt.mu.Lock()
	f.rt.gens[1].state = stExited
	f.rt.mu.Unlock()
	if _, err := f.rt.execGeneration(1); codeOf(err) != api.CodeNotRunning {
		t.Errorf("exited: %v", err)
	}
	f.rt.mu.Lock()
	f.rt.gens[1].state = stRunning
	f.rt.mu.Unlock()
	f.mustStart(2)
	if _, err := f.rt.execGeneration(1); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("older: %v", err)
	}
	if _, err := f.rt.End(context.Background(), 2, api.EndRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rt.execGeneration(2); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("ended: %v", err)
	}
}

// The fence closes a generation's calls before its freeze: the running
// ones are in its report, none starts after, and every call that ends
// from then on is fenced.
func TestTheFenceClosesTheCallsAndReportsThem(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	cs := f.withCalls(1)
	running := &call{id: "1", group: &fakeGroup{name: "gen-1/proc-1", j: f.j}, started: time.Now(), done: make(chan struct{}), rec: api.Process{ID: "1", Command: []string{"sleep", "9"}, Pid: 42}}
	ended := &call{id: "2", started: time.Now(), done: make(chan struct{}), rec: api.Process{ID: "2", Command: []string{"true"}}}
	close(ended.done)
	cs.order = []*call{running, ended}
	res := f.mustStart(2)
	if len(res.Fenced) != 1 {
		t.Fatalf("fenced: %+v", res.Fenced)
	}
	tc := res.Fenced[0].ToolCalls
	if len(tc) != 1 || tc[0].ID != "1" || tc[0].Pid != 42 || !slices.Equal(tc[0].Command, []string{"sleep", "9"}) {
		t.Errorf("tool calls: %+v", tc)
	}
	// Its sockets were aborted with the generation's (host mode), after
	// the freeze.
	if i, j := f.j.index("freeze gen-1"), f.j.index("abort gen-1/proc-1"); i < 0 || j < i {
		t.Errorf("the call's sockets: %q", f.j.all())
	}
	cs.mu.Lock()
	closed := cs.closed
	cs.mu.Unlock()
	if !closed {
		t.Error("the calls were not closed by the fence")
	}
	// The gate: a close waits for a spawn in progress.
	cs2 := newCalls(nil, "/", "")
	cs2.gate.RLock()
	done := make(chan struct{})
	go func() { cs2.close(); close(done) }()
	cs2.mu.Lock()
	if cs2.closed {
		t.Error("closed while a spawn held the gate")
	}
	cs2.mu.Unlock()
	cs2.gate.RUnlock()
	<-done
}

func TestCallStreamKeepsAPrefixUpToItsCap(t *testing.T) {
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s, err := newCallStream("stdout", filepath.Join(dir, "stdout"), r, 10)
	if err != nil {
		t.Fatal(err)
	}
	go s.pump()
	for _, p := range []string{"abcd", "efgh", "ijkl"} {
		w.Write([]byte(p))
	}
	w.Close()
	<-s.eofCh
	kept, total, eof, _ := s.state()
	if kept != 10 || total != 12 || !eof {
		t.Errorf("kept %d total %d eof %v", kept, total, eof)
	}
	if b, _ := os.ReadFile(s.path); string(b) != "abcdefghij" {
		t.Errorf("file %q", b)
	}
}

func TestCallEnvIsTheGenerationsWithTheRequestsOnTop(t *testing.T) {
	got := callEnv([]string{"PATH=/bin", "HOME=/h", "A=1"}, []string{"A=2", "B=3"}, "/root", false)
	if !slices.Equal(got, []string{"PATH=/bin", "HOME=/h", "A=2", "B=3"}) {
		t.Errorf("env %q", got)
	}
	got = callEnv([]string{"HOME=/h"}, nil, "/root", true)
	if !slices.Equal(got, []string{"HOME=/root"}) {
		t.Errorf("another user's HOME: %q", got)
	}
}

func TestValidateExec(t *testing.T) {
	for _, req := range []api.ExecRequest{
		{}, {Command: []string{""}}, {Command: []string{"x"}, Env: []string{"NOVALUE"}}, {Command: []string{"x"}, Env: []string{"=v"}},
		{Command: []string{"x"}, Cwd: "rel"}, {Command: []string{"x"}, TimeoutMS: -1}, {Command: []string{"x"}, Rows: 3},
	} {
		if err := validateExec(&req); codeOf(err) != api.CodeBadRequest {
			t.Errorf("%+v: %v", req, err)
		}
	}
	if err := validateExec(&api.ExecRequest{Command: []string{"x"}, TTY: true, Rows: 3, Cols: 4, Cwd: "/w", Env: []string{"A="}}); err != nil {
		t.Error(err)
	}
}

func TestAnAnnouncementWithoutACommandIsIdle(t *testing.T) {
	req := api.StartRequest{Generation: 1}
	if err := validateStart(&req); err != nil || !req.Idle {
		t.Fatalf("%v %+v", err, req)
	}
	path, argv, err := harnessCommand(req, nil)
	if err != nil || path != holderPath || !slices.Equal(argv, []string{"shim-hold", HoldArg}) {
		t.Errorf("the holder: %s %q %v", path, argv, err)
	}
}

// frames decodes an NDJSON body.
func frames(t *testing.T, body string) []api.Frame {
	t.Helper()
	var out []api.Frame
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		var f api.Frame
		if err := json.Unmarshal([]byte(l), &f); err != nil {
			t.Fatalf("frame %q: %v", l, err)
		}
		out = append(out, f)
	}
	return out
}

// A call's stream, from its files: data frames at their offsets, a
// dropped frame for what is past the cap, the last frame; from an offset
// only the rest; without follow an end frame while the call runs.
func TestStreamCallFramesFromTheFiles(t *testing.T) {
	dir := t.TempDir()
	rt := newFixture(t).rt
	mk := func(name string, max int64) (*callStream, *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		s, err := newCallStream(name, filepath.Join(dir, name), r, max)
		if err != nil {
			t.Fatal(err)
		}
		go s.pump()
		return s, w
	}
	out, wOut := mk("stdout", 8)
	errS, wErr := mk("stderr", 100)
	c := &call{id: "1", stdout: out, stderr: errS, done: make(chan struct{}), rec: api.Process{ID: "1", State: api.ProcessRunning}}
	wOut.Write([]byte("0123456789ab"))
	wErr.Write([]byte("err"))
	waitTotal(out, 12)
	waitTotal(errS, 3)

	get := func(outOff, errOff int64, follow bool) []api.Frame {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		rt.streamCall(w, r, c, outOff, errOff, follow, nil)
		if ct := w.Header().Get("Content-Type"); ct != "application/x-ndjson" {
			t.Errorf("content type %q", ct)
		}
		return frames(t, w.Body.String())
	}
	fs := get(0, 0, false)
	want := []api.Frame{{Type: "stdout", Data: []byte("01234567")}, {Type: "dropped", Stream: "stdout", Bytes: 4, Offset: 12},
		{Type: "stderr", Data: []byte("err")}, {Type: "end"}}
	if len(fs) != len(want) {
		t.Fatalf("frames %+v", fs)
	}
	for i := range want {
		if fs[i].Type != want[i].Type || string(fs[i].Data) != string(want[i].Data) || fs[i].Bytes != want[i].Bytes || fs[i].Stream != want[i].Stream {
			t.Errorf("frame %d: %+v, want %+v", i, fs[i], want[i])
		}
	}
	// From offsets: the rest only; past the file, the drop is not told twice.
	fs = get(5, 12, false)
	if len(fs) != 3 || string(fs[0].Data) != "567" || fs[0].Offset != 5 || fs[1].Type != "dropped" || fs[2].Type != "end" {
		t.Errorf("from offset 5: %+v", fs)
	}
	if fs = get(12, 3, false); len(fs) != 1 || fs[0].Type != "end" {
		t.Errorf("from the end: %+v", fs)
	}
	// Followed to its end: the exit frame with the record.
	wOut.Close()
	wErr.Close()
	<-out.eofCh
	<-errS.eofCh
	code := 0
	c.rec.State, c.rec.ExitCode = api.ProcessExited, &code
	close(c.done)
	fs = get(12, 3, true)
	if len(fs) != 1 || fs[0].Type != api.FrameExit || fs[0].Process == nil || fs[0].Process.StdoutBytes != 12 || fs[0].Process.StdoutKept != 8 {
		t.Errorf("followed: %+v", fs)
	}
	c.rec.Fenced = true
	if fs = get(12, 3, true); fs[len(fs)-1].Type != api.FrameFenced {
		t.Errorf("fenced: %+v", fs)
	}
}

// waitTotal waits on s's change notifications until it has read n bytes.
func waitTotal(s *callStream, n int64) {
	for {
		_, total, _, changed := s.state()
		if total >= n {
			return
		}
		<-changed
	}
}
