package runtime

import (
	"context"
	"os"
	"path/filepath"
	"slices"
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
