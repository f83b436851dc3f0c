package integration

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// lockedBuffer is a bytes.Buffer a stream writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// seedCall is one tool call of the seed scenario, streamed.
type seedCall struct {
	name string
	out  lockedBuffer
	rec  *api.Process
	err  error
	done chan struct{}
}

func runSeedCall(s *Shim, n uint64, name string, req api.ExecRequest) *seedCall {
	c := &seedCall{name: name, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c.rec, c.err = s.Client.Exec(ctx, n, req, &client.Output{Stdout: &c.out, Stderr: &c.out})
	}()
	return c
}

// TestExecSeedScenario is the exec architecture's seed scenario (issue
// 24): generation 1 is idle, its agent loop outside; three tool calls run
// in it: a hung sleep under a setsid child that ignores SIGTERM, a git
// push to a slow git smart-HTTP server (uploading when the fence comes),
// an editor writing files in the worktree. Generation 2 is announced:
// 0 survivors, the three calls listed in the report and ended with a
// fenced frame, no push lands after the report, the edits (and the
// push's commit) in refs/shim/abandoned/1.
func TestExecSeedScenario(t *testing.T) {
	r := newLayerRig(t, "auto")
	s, f := r.s, r.f
	pw := credSecret("push")
	srv := atkGitServer(t, gitServerOpts{Accounts: map[string]gitAccount{"bot": {Password: pw, Branch: "feature"}}})
	proxy := startAtkSlowProxy(t, srv.HostPort, 16<<10, 0)
	url := fmt.Sprintf("http://bot:%s@%s/repo.git", pw, proxy.Addr)
	s.MustCtl(nil, f.startArgs(1, "--idle")...)

	hung := runSeedCall(s, 1, "hung", api.ExecRequest{Command: []string{"sh", "-c",
		`setsid sh -c 'trap "" TERM; exec sleep 1000' & echo hung; wait`}})
	push := runSeedCall(s, 1, "push", api.ExecRequest{Command: []string{"sh", "-c",
		`head -c 2621440 /dev/urandom > big.bin && git add big.bin && git commit -qm "big push" && echo committed &&
git -c http.postBuffer=16777216 push -q "$0" HEAD:refs/heads/feature; echo "push exited $?"`, url}})
	editor := runSeedCall(s, 1, "editor", api.ExecRequest{Command: []string{"sh", "-c",
		`i=0; while :; do echo "line $i" >> notes.md; i=$((i+1)); [ $i = 100 ] && echo editing; done`}})
	eventually(t, time.Minute, "the three calls at work", func() bool {
		return strings.Contains(hung.out.String(), "hung") && strings.Contains(editor.out.String(), "editing") &&
			strings.Contains(push.out.String(), "committed") && proxy.maxUp() > atkPushTrigger
	})

	var r2 api.StartResult
	s.MustCtl(&r2, f.startArgs(2, "--idle")...)
	reported := time.Now()
	if len(r2.Fenced) != 1 {
		t.Fatalf("start 2: %+v", r2)
	}
	rep := r2.Fenced[0]
	if rep.Error != nil || rep.Survivors != 0 || len(rep.ToolCalls) != 3 || rep.SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("fence report: %+v", rep)
	}
	for _, c := range []*seedCall{hung, push, editor} {
		<-c.done
		if c.err != nil || c.rec == nil || !c.rec.Fenced {
			t.Errorf("%s: stream ended with %+v, %v (output %q)", c.name, c.rec, c.err, c.out.String())
		}
	}
	if strings.Contains(push.out.String(), "push exited") {
		t.Errorf("the push finished before the fence: %q", push.out.String())
	}
	eventually(t, 10*time.Second, "only shim and gen 2's holder left", func() bool { return len(s.PidnsProcs()) == 2 })

	// No push lands after the report: the server's side of the upload is
	// over, and the branch does not exist.
	how := atkWaitSettled(t, proxy, srv)
	if got := srv.Ref("refs/heads/feature"); got != "" {
		t.Errorf("the push landed after the fence: feature is %s", got)
	}
	if p := srv.PushesSince("bot", time.Time{}); len(p) != 0 {
		t.Errorf("pushes: %+v", p)
	}
	t.Logf("the upload's server side ended %q after %d bytes (report at %s); connections cut: %d",
		how, proxy.maxUp(), reported.Format(time.RFC3339Nano), len(rep.Cut.Connections))

	// The calls' edits are in refs/shim/abandoned/1: the notes, and the
	// push's commit among its parents.
	if notes := hgit(t, f.wt, "show", "refs/shim/abandoned/1:notes.md"); !strings.HasPrefix(notes, "line 0\nline 1\n") {
		t.Errorf("notes.md in the snapshot: %.40q", notes)
	}
	if log := hgit(t, f.wt, "log", "--format=%s", "refs/shim/abandoned/1"); !strings.Contains(log, "big push") {
		t.Errorf("the push's commit is not in the snapshot's history: %q", log)
	}
	// Generation 2 starts on the baseline.
	if _, o, _ := execOut(t, s, 2, api.ExecRequest{Command: []string{"git", "status", "--porcelain"}}); o != "" {
		t.Errorf("generation 2's worktree is not clean: %q", o)
	}
}
