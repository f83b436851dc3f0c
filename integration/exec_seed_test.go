package integration

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
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
// push's commit) in refs/shim/abandoned/1. The control of the push is
// TestAttackInFlightPushControl: the same upload from a process frozen
// and killed without the cut lands (and with the calls' sockets left out
// of shim's cut, this push landed after the report).
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
	// The whole push is queued in the kernel (a push git had not written
	// whole would not land with or without the cut): without the cut of
	// the call's connection it lands after the fence.
	eventually(t, 60*time.Second, "the whole push queued in the kernel", func() bool { return proxy.allQueued(t) })

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

// TestDockerExecSeedScenario is the seed scenario under Docker with the
// image, on layers (the documented flags), its tool calls sent the way a
// supervisor outside the VM boundary does: `docker exec NAME shim ctl
// exec`.
func TestDockerExecSeedScenario(t *testing.T) {
	dockerImage(t)
	flags := append(append([]string{}, dockerFullFlags...), "-v", t.TempDir()+":/var/lib/shim")
	b := dockerRun(t, flags, "--grace", "5s", "--isolation", "auto")
	ctl := b.execCtl()
	pw := credSecret("push")
	srv := atkGitServer(t, gitServerOpts{AnonFetch: true, Seed: dockerSeedFiles, Accounts: map[string]gitAccount{"bot": {Password: pw, Branch: "feature"}}})
	proxy := startAtkSlowProxy(t, srv.HostPort, 16<<10, 0)
	base := srv.Seed
	dockerClone(t, b, srv.URL)
	var st api.Status
	eventually(t, 30*time.Second, "the start-up probes done", func() bool {
		ctl.must(t, &st, "status")
		return st.Isolation.Mode != "probing"
	})
	if st.Isolation.Mode != "layers" {
		t.Fatalf("isolation %+v", st.Isolation)
	}
	ctl.must(t, nil, "start", "--generation", "1", "--user", "1000:1000", "--cwd", "/workspace/repo",
		"--env", "HOME=/home/agent", "--worktree", "/workspace/repo", "--baseline", base, "--network", "host", "--idle")
	type dcall struct {
		name string
		out  lockedBuffer
		code chan int
	}
	run := func(name string, script string, args ...string) *dcall {
		c := &dcall{name: name, code: make(chan int, 1)}
		cmd := exec.Command("docker", append([]string{"exec", b.Name, "shim", "ctl", "exec", "--generation", "1", "--", "sh", "-c", script, "sh"}, args...)...)
		cmd.Stdout, cmd.Stderr = &c.out, &c.out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			cmd.Wait()
			c.code <- cmd.ProcessState.ExitCode()
		}()
		return c
	}
	url := fmt.Sprintf("http://bot:%s@%s/repo.git", pw, proxy.Addr)
	hung := run("hung", `setsid sh -c 'trap "" TERM; exec sleep 1000' & echo hung; wait`)
	push := run("push", `git config user.name agent && git config user.email agent@example.com &&
head -c 2621440 /dev/urandom > big.bin && git add big.bin && git commit -qm "big push" && echo committed &&
git -c http.postBuffer=16777216 push -q "$1" HEAD:refs/heads/feature; echo "push exited $?"`, url)
	editor := run("editor", `i=0; while :; do echo "line $i" >> notes.md; i=$((i+1)); [ $i = 100 ] && echo editing; done`)
	eventually(t, time.Minute, "the three calls at work", func() bool {
		return strings.Contains(hung.out.String(), "hung") && strings.Contains(editor.out.String(), "editing") &&
			strings.Contains(push.out.String(), "committed") && proxy.maxUp() > atkPushTrigger
	})
	// The whole push is queued in the kernel (a push git had not written
	// whole would not land with or without the cut): without the cut of
	// the call's connection it lands after the fence.
	eventually(t, 60*time.Second, "the whole push queued in the kernel", func() bool { return proxy.allQueued(t) })
	var r2 api.StartResult
	ctl.must(t, &r2, "start", "--generation", "2", "--user", "1000:1000", "--cwd", "/workspace/repo",
		"--env", "HOME=/home/agent", "--worktree", "/workspace/repo", "--baseline", base, "--network", "host", "--idle")
	if len(r2.Fenced) != 1 {
		t.Fatalf("start 2: %+v", r2)
	}
	rep := r2.Fenced[0]
	t.Logf("fence report: killed %d survivors %d tool calls %d snapshot %s durations %v", rep.Killed, rep.Survivors, len(rep.ToolCalls), rep.SnapshotRef, rep.DurationsMS)
	if rep.Error != nil || rep.Survivors != 0 || len(rep.ToolCalls) != 3 || rep.SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("fence report: %+v", rep)
	}
	for _, c := range []*dcall{hung, push, editor} {
		if code := <-c.code; code != 137 || !strings.Contains(c.out.String(), "was fenced") {
			t.Errorf("%s: ctl exec exit %d: %q", c.name, code, c.out.String())
		}
	}
	atkWaitSettled(t, proxy, srv)
	if got := srv.Ref("refs/heads/feature"); got != "" || len(srv.PushesSince("bot", time.Time{})) != 0 {
		t.Errorf("the push landed after the fence: feature is %s", got)
	}
	if got := b.MustExec("agent", "git", "-C", "/workspace/repo", "show", "refs/shim/abandoned/1:notes.md"); !strings.HasPrefix(got, "line 0\n") {
		t.Errorf("snapshot lacks the editor's notes: %.40q", got)
	}
	if got := b.MustExec("agent", "git", "-C", "/workspace/repo", "log", "--format=%s", "refs/shim/abandoned/1"); !strings.Contains(got, "big push") {
		t.Errorf("snapshot lacks the push's commit: %q", got)
	}
	if o, _, code := ctl.run("exec", "--generation", "1", "--", "true"); code != 3 {
		t.Errorf("exec into the fenced generation: exit %d %s", code, o)
	}
	ctl.must(t, nil, "end", "--generation", "2")
	if ps := dockerProcs(t, b); len(ps) != 0 {
		t.Errorf("processes left in the container besides shim: %q", ps)
	}
}
