package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/reaper"
)

// Tool calls (docs/exec.md): a supervisor whose agent loop runs outside
// the sandbox runs each tool call inside a generation through the exec
// API. A call runs in the generation's mount, IPC and network namespaces
// (so on its layers), as its user, with its environment, in a cgroup of
// its own below the generation's (gen-N/proc-K): its whole tree can be
// killed alone (a timeout, a signal to all), and the generation's freeze
// and kill, which are hierarchical, cover it at a fence like the harness.

// maxKeptCalls bounds the ended calls a generation keeps in memory (every
// call's record stays on disk, gen/<N>/proc/<K>/process.json).
const maxKeptCalls = 1024

// callDrain bounds how long a call's output is read after its leader
// exited, while something it left running holds the pipes open.
const callDrain = 2 * time.Second

// calls are one generation's tool calls.
type calls struct {
	// What every call of the generation gets, as its harness did: set at
	// the start, immutable.
	env  []string
	cwd  string
	user string

	// gate is held shared by every call's spawn, from its state check to
	// the process in its cgroup, and taken exclusively by the fence before
	// the freeze: once the fence has it, no call is half-started and none
	// starts any more (closed).
	gate sync.RWMutex

	mu      sync.Mutex // guards the fields below
	closed  bool       // the generation's fence began: no call starts; calls that end from here are fenced
	next    uint64
	byID    map[string]*call
	order   []*call // oldest first, at most maxKeptCalls ended ones
	running int
}

func newCalls(env []string, cwd, user string) *calls {
	return &calls{env: env, cwd: cwd, user: user, byID: map[string]*call{}}
}

// call is one tool call.
type call struct {
	id      string
	n       uint64
	dir     string
	group   cgroup.Group
	proc    *reaper.Process
	pidMu   sync.Mutex // guards pidfd: closed once the leader is reaped
	pidfd   int        // of the leader, from its clone; -1 when unavailable or closed
	started time.Time
	stdout  *callStream
	stderr  *callStream // nil with a TTY (one stream)
	pty     *os.File    // the terminal's master; nil without a TTY
	done    chan struct{}

	stdinMu sync.Mutex
	stdin   *os.File // the write end (or the pty master) while open; nil once closed

	timedOut atomic.Bool

	mu  sync.Mutex // guards rec
	rec api.Process
}

// record is a copy of the call's record, with its streams' counts now.
func (c *call) record() api.Process {
	c.mu.Lock()
	rec := c.rec
	c.mu.Unlock()
	rec.Labels = maps.Clone(rec.Labels)
	rec.StdoutKept, rec.StdoutBytes = c.stdout.counts()
	if c.stderr != nil {
		rec.StderrKept, rec.StderrBytes = c.stderr.counts()
	}
	return rec
}

// ended reports whether the call's record is final.
func (c *call) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// execGeneration finds generation n for a new call and says why it cannot
// take one: STALE_GENERATION below the highest announced (or fenced),
// GENERATION_SUSPENDED while its lease ran out, NOT_RUNNING once its
// harness (an idle generation's holder) exited.
func (rt *Runtime) execGeneration(n uint64) (*generation, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	g, ok := rt.gens[n]
	switch {
	case n < rt.highest:
		return nil, staleError(n, rt.highest)
	case !ok && n == rt.st.Ended:
		return nil, errs.New(api.CodeStaleGeneration, "generation %d was ended", n)
	case !ok && n > rt.highest:
		return nil, errs.New(api.CodeNotFound, "generation %d has not been announced", n)
	case !ok || g.calls == nil:
		return nil, errs.New(api.CodeNotRunning, "generation %d is not running", n)
	case rt.shuttingDown:
		return nil, errs.New(api.CodeShuttingDown, "shim is shutting down")
	}
	switch g.state {
	case stRunning:
		return g, nil
	case stSuspended:
		return nil, errs.New(api.CodeGenerationSuspended, "generation %d is suspended (its lease ran out): renew it first", n)
	case stFencing, stEmptied, stFenced, stFailed:
		return nil, errs.New(api.CodeStaleGeneration, "generation %d is fenced", n)
	}
	return nil, errs.New(api.CodeNotRunning, "generation %d is not running (%s)", n, g.apiState())
}

// validateExec checks an exec request before anything is made.
func validateExec(req *api.ExecRequest) error {
	if len(req.Command) == 0 || req.Command[0] == "" {
		return errs.New(api.CodeBadRequest, "command is required")
	}
	for _, kv := range req.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return errs.New(api.CodeBadRequest, "env entry %q is not K=V", kv)
		}
	}
	if req.Cwd != "" && !filepath.IsAbs(req.Cwd) {
		return errs.New(api.CodeBadRequest, "cwd must be an absolute path, not %q", req.Cwd)
	}
	if req.TimeoutMS < 0 {
		return errs.New(api.CodeBadRequest, "timeout_ms must not be negative")
	}
	if !req.TTY && (req.Rows != 0 || req.Cols != 0) {
		return errs.New(api.CodeBadRequest, "rows and cols need tty")
	}
	return nil
}

// Exec starts a tool call in generation n. The call runs until it exits,
// its timeout kills it, or its generation is fenced.
func (rt *Runtime) Exec(n uint64, req api.ExecRequest) (*call, error) {
	if err := validateExec(&req); err != nil {
		return nil, err
	}
	l, ok := rt.launch.(*launcher)
	if !ok {
		return nil, errs.New(api.CodeUnsupported, "tool calls need the real launcher")
	}
	if rt.groups.Mode() == cgroup.ModePidns {
		return nil, errs.New(api.CodeUnsupported, "tool calls need cgroups (mode pidns)")
	}
	g, err := rt.execGeneration(n)
	if err != nil {
		return nil, err
	}
	cs := g.calls
	cs.gate.RLock()
	defer cs.gate.RUnlock()
	// Again with the gate: a suspension or an exit may have frozen the
	// generation while this call waited for it (see withoutSpawns).
	if _, err := rt.execGeneration(n); err != nil {
		return nil, err
	}
	cs.mu.Lock()
	if cs.closed {
		cs.mu.Unlock()
		return nil, errs.New(api.CodeStaleGeneration, "generation %d is being fenced", n)
	}
	if cs.running >= api.MaxCallsPerGeneration {
		cs.mu.Unlock()
		return nil, errs.New(api.CodeTooManyCalls, "generation %d already runs %d tool calls", n, cs.running)
	}
	cs.next++
	k := cs.next
	cs.running++
	cs.mu.Unlock()
	c, err := rt.startCall(l, g, k, req)
	if err != nil {
		cs.mu.Lock()
		cs.running--
		cs.mu.Unlock()
		return nil, err
	}
	cs.mu.Lock()
	cs.byID[c.id] = c
	cs.order = append(cs.order, c)
	cs.mu.Unlock()
	rt.audit.Record("exec", n, map[string]any{"id": c.id, "pid": c.rec.Pid, "command": req.Command, "labels": req.Labels}, false)
	go rt.runCall(g, c, time.Duration(req.TimeoutMS)*time.Millisecond)
	return c, nil
}

// startCall makes call k's directory, cgroup and streams, and starts it.
// On failure nothing of it is left but its directory.
func (rt *Runtime) startCall(l *launcher, g *generation, k uint64, req api.ExecRequest) (_ *call, err error) {
	id := strconv.FormatUint(k, 10)
	dir := filepath.Join(g.dir, "proc", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errs.New(api.CodeStartFailed, "call dir: %v", err)
	}
	user := req.User
	if user == "" {
		user = g.calls.user
	}
	cred, home, err := lookupUser(user)
	if err != nil {
		return nil, err
	}
	if lg := l.lowerGroup(); lg != 0 && cred != nil && cred.Gid == lg {
		return nil, errs.New(api.CodeBadRequest, "gid %d is shim's --lower-group: no tool call may have it", lg)
	}
	group, err := callGroup(g.group, "proc-"+id)
	if err != nil {
		return nil, errs.New(api.CodeStartFailed, "cgroup of call %s: %v", id, err)
	}
	defer func() {
		if err != nil {
			kctx, cancel := context.WithTimeout(context.Background(), rt.cfg.KillTimeout)
			if _, kerr := group.Kill(kctx); kerr == nil {
				group.Remove()
			}
			cancel()
		}
	}()
	c := &call{id: id, n: g.n, dir: dir, group: group, pidfd: -1, done: make(chan struct{})}
	io, err := newCallIO(c, req, cred, rt.cfg.ExecOutputMax)
	if err != nil {
		return nil, errs.New(api.CodeStartFailed, "call %s output: %v", id, err)
	}
	defer io.closeChildEnds()
	cwd := req.Cwd
	if cwd == "" {
		cwd = g.calls.cwd
	}
	env := callEnv(g.calls.env, req.Env, home, req.User != "")
	cmd := &callCmd{argv: req.Command, env: env, dir: cwd, cred: cred, stdin: io.childIn, stdout: io.childOut, stderr: io.childErr, tty: req.TTY}
	c.started = time.Now().UTC()
	p, pidfd, err := l.spawnCall(g, group, cmd)
	if err != nil {
		io.abort()
		return nil, errs.New(api.CodeStartFailed, "call %s: %v", id, err)
	}
	c.proc, c.pidfd = p, pidfd
	io.start()
	c.rec = api.Process{ID: id, Generation: g.n, Pid: p.Pid, Command: req.Command, Cwd: cwd, User: user, TTY: req.TTY,
		Labels: maps.Clone(req.Labels), Cgroup: group.Path(), State: api.ProcessRunning, StartedAt: c.started, TimeoutMS: req.TimeoutMS,
		Stdout: c.stdout.path}
	if c.stderr != nil {
		c.rec.Stderr = c.stderr.path
	}
	if len(req.StdinData) > 0 {
		go c.writeStdin(req.StdinData, !req.Stdin, stdinTimeout)
	} else if !req.Stdin && c.pty != nil {
		// No stdin on a terminal: the master stays open (it is the
		// output), nothing is written to it.
		c.stdinMu.Lock()
		c.stdin = nil
		c.stdinMu.Unlock()
	}
	_ = os.WriteFile(filepath.Join(dir, "process.json"), mustJSON(c.record()), 0o644)
	return c, nil
}

// callGroup makes a tool call's cgroup below its generation's
// (cgroup.Child); the unit tests make it below their fake cgroups.
var callGroup = cgroup.Child

// callEnv is the generation's environment with the request's on top (the
// request's value wins for a key in both); HOME follows a user the call
// names.
func callEnv(base, extra []string, home string, otherUser bool) []string {
	out := slices.Clone(base)
	set := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		out = slices.DeleteFunc(out, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		out = append(out, kv)
	}
	if otherUser && home != "" {
		set("HOME=" + home)
	}
	for _, kv := range extra {
		set(kv)
	}
	return out
}

// runCall waits for the call's leader, kills its tree at its timeout, and
// makes its record final. The timeout covers the whole tree: what the
// leader left running when it exited is killed at the deadline too (its
// record says leftover; the audit says exec_leftover_killed).
func (rt *Runtime) runCall(g *generation, c *call, timeout time.Duration) {
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() { rt.callDeadline(c) })
	}
	e := c.proc.Exit()
	c.drain(callDrain)
	left, _ := c.group.Procs()
	if len(left) == 0 {
		if timer != nil {
			timer.Stop()
		}
		c.group.Remove()
	}
	c.pidMu.Lock()
	if c.pidfd >= 0 {
		unix.Close(c.pidfd)
		c.pidfd = -1
	}
	c.pidMu.Unlock()
	c.closeStdin()
	if c.pty != nil {
		c.pty.Close()
	}
	g.calls.mu.Lock()
	fenced := g.calls.closed
	g.calls.mu.Unlock()
	at := e.At
	code := e.Code
	c.mu.Lock()
	c.rec.State, c.rec.ExitedAt, c.rec.ExitCode, c.rec.Signal = api.ProcessExited, &at, &code, e.Signal
	c.rec.TimedOut, c.rec.Fenced, c.rec.Leftover = c.timedOut.Load(), fenced, len(left)
	c.mu.Unlock()
	rec := c.record()
	if err := rt.reserve.retry(func() error { return writeJSON(filepath.Join(c.dir, "process.json"), rec) }); err != nil {
		rt.log.Warn("tool call record not written", "generation", c.n, "call", c.id, "error", err)
	}
	close(c.done)
	g.calls.ended(c)
	rt.audit.Record("exec_exited", c.n, map[string]any{"id": c.id, "exit_code": code, "signal": e.Signal,
		"timed_out": rec.TimedOut, "fenced": fenced}, false)
}

// callDeadline kills call c's whole tree at its timeout: the leader's
// (the record says timed_out), or, once the leader has exited, what it
// left running, and then its cgroup goes.
func (rt *Runtime) callDeadline(c *call) {
	leaderGone := c.ended()
	if !leaderGone {
		c.timedOut.Store(true)
	} else if _, err := os.Stat(c.group.Path()); errors.Is(err, fs.ErrNotExist) {
		return // what it left is gone already (killed and removed with its generation's fence)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.KillTimeout)
	defer cancel()
	if _, err := c.group.Kill(ctx); err != nil {
		rt.log.Error("timed-out tool call not killed", "generation", c.n, "call", c.id, "error", err)
		return
	}
	if leaderGone {
		_ = c.group.Remove() // (a fence of its generation may have removed it already)
		rt.audit.Record("exec_leftover_killed", c.n, map[string]any{"id": c.id}, false)
	}
}

// ended counts c out and forgets the oldest ended calls past maxKeptCalls.
func (cs *calls) ended(c *call) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.running--
	for len(cs.order) > maxKeptCalls {
		i := slices.IndexFunc(cs.order, func(o *call) bool { return o.ended() })
		if i < 0 {
			break
		}
		delete(cs.byID, cs.order[i].id)
		cs.order = slices.Delete(cs.order, i, i+1)
	}
}

// close is the fence's first act on the calls, before the freeze: it
// waits for every spawn in progress, then no call starts any more; the
// calls still running are returned (they are frozen, cut and killed with
// the generation).
func (cs *calls) close() []*call {
	if cs == nil {
		return nil
	}
	cs.gate.Lock()
	defer cs.gate.Unlock()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.closed = true
	var out []*call
	for _, c := range cs.order {
		if !c.ended() {
			out = append(out, c)
		}
	}
	return out
}

// withoutSpawns runs freeze (a freeze of the generation outside a fence:
// a suspension, a harness's exit) with no call half-started: a call
// cloned into a frozen cgroup never reaches its exec, so its spawn would
// hang holding the gate shared, and the next fence, which takes the gate
// first, would wait for it for ever. A call that waited re-checks its
// generation once it has the gate (Exec) and is refused.
func (cs *calls) withoutSpawns(freeze func()) {
	if cs != nil {
		cs.gate.Lock()
		defer cs.gate.Unlock()
	}
	freeze()
}

// fenceCalls closes g's calls before its freeze and reports those that
// were running (FenceReport.ToolCalls).
func (rt *Runtime) fenceCalls(f *fenceRun) {
	running := f.g.calls.close()
	now := time.Now()
	for _, c := range running {
		c.mu.Lock()
		f.rep.ToolCalls = append(f.rep.ToolCalls, api.ToolCall{ID: c.id, Command: c.rec.Command, Pid: c.rec.Pid,
			DurationMS: ms(now.Sub(c.started))})
		c.mu.Unlock()
	}
}

// liveGroups are the cgroups of the calls still running, and of the
// calls whose leader exited leaving processes behind (their sockets are
// as live as a running call's; none for a generation without calls).
func (cs *calls) liveGroups() []cgroup.Group {
	if cs == nil {
		return nil
	}
	cs.mu.Lock()
	order := slices.Clone(cs.order)
	cs.mu.Unlock()
	var out []cgroup.Group
	for _, c := range order {
		c.mu.Lock()
		left := c.rec.Leftover > 0
		c.mu.Unlock()
		if !c.ended() || left {
			out = append(out, c.group)
		}
	}
	return out
}

// callCmd is what spawnCall starts.
type callCmd struct {
	argv                  []string
	env                   []string
	dir                   string
	cred                  *syscall.Credential
	stdin, stdout, stderr *os.File
	tty                   bool
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(fmt.Sprintf("{\"error\": %q}\n", err.Error()))
	}
	return b
}
