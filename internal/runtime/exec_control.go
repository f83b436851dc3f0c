package runtime

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// What the exec API does to a tool call once it runs: its record, the
// list, a signal, its stdin, its terminal's size (docs/exec.md).

// findCall is call id of generation n, from memory while shim knows the
// generation, else nil and the record on disk.
func (rt *Runtime) findCall(n uint64, id string) (*call, *api.Process, error) {
	if _, err := strconv.ParseUint(id, 10, 64); err != nil {
		return nil, nil, errs.New(api.CodeBadRequest, "process id %q is not a number", id)
	}
	rt.mu.Lock()
	g := rt.gens[n]
	rt.mu.Unlock()
	if g != nil && g.calls != nil {
		g.calls.mu.Lock()
		c := g.calls.byID[id]
		g.calls.mu.Unlock()
		if c != nil {
			return c, nil, nil
		}
	}
	var rec api.Process
	if err := readJSON(filepath.Join(rt.genDir(n), "proc", id, "process.json"), &rec); err != nil {
		return nil, nil, errs.New(api.CodeNotFound, "generation %d has no tool call %s", n, id)
	}
	if rec.State == api.ProcessRunning {
		// Its shim is gone (or the call fell out of memory while it ran,
		// which maxKeptCalls never does): it did not end on record.
		rec.State = api.ProcessExited
		rec.Fenced = true
	}
	return nil, &rec, nil
}

// Process is call id's record.
func (rt *Runtime) Process(n uint64, id string) (api.Process, error) {
	c, rec, err := rt.findCall(n, id)
	if err != nil {
		return api.Process{}, err
	}
	if c != nil {
		return c.record(), nil
	}
	return *rec, nil
}

// maxListedCalls bounds a list read from disk.
const maxListedCalls = 4096

// Processes lists generation n's calls, oldest first.
func (rt *Runtime) Processes(n uint64) ([]api.Process, error) {
	ents, err := os.ReadDir(filepath.Join(rt.genDir(n), "proc"))
	if err != nil && !os.IsNotExist(err) {
		return nil, errs.New(api.CodeInternal, "list calls of generation %d: %v", n, err)
	}
	var ids []uint64
	for _, e := range ents {
		if k, err := strconv.ParseUint(e.Name(), 10, 64); err == nil {
			ids = append(ids, k)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	if len(ids) > maxListedCalls {
		ids = ids[len(ids)-maxListedCalls:]
	}
	out := []api.Process{}
	for _, k := range ids {
		if p, err := rt.Process(n, strconv.FormatUint(k, 10)); err == nil {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		rt.mu.Lock()
		_, known := rt.gens[n]
		highest := rt.highest
		rt.mu.Unlock()
		if !known && n > highest {
			return nil, errs.New(api.CodeNotFound, "generation %d has not been announced", n)
		}
	}
	return out, nil
}

// SignalProcess signals call id's leader, or with all every process of
// its cgroup (SIGKILL to all: cgroup.kill, confirmed).
func (rt *Runtime) SignalProcess(n uint64, id string, sig unix.Signal, all bool) error {
	c, _, err := rt.findCall(n, id)
	if err != nil {
		return err
	}
	if c == nil || c.ended() && !all {
		return errs.New(api.CodeNotRunning, "tool call %s of generation %d is not running", id, n)
	}
	rt.audit.Record("exec_signal", n, map[string]any{"id": id, "signal": sig.String(), "all": all}, false)
	if !all {
		// Through its pidfd while the leader is not reaped (a pid alone
		// could name another process by now); placed by the stub, it has
		// none: its pid, while the call has not ended.
		c.pidMu.Lock()
		defer c.pidMu.Unlock()
		switch {
		case c.pidfd >= 0:
			if err := unix.PidfdSendSignal(c.pidfd, sig, nil, 0); err == unix.ESRCH {
				return errs.New(api.CodeNotRunning, "the leader of tool call %s of generation %d exited", id, n)
			} else if err != nil {
				return err
			}
			return nil
		case c.ended():
			return errs.New(api.CodeNotRunning, "tool call %s of generation %d is not running", id, n)
		}
		select {
		case <-c.proc.Done():
			return errs.New(api.CodeNotRunning, "tool call %s of generation %d is not running", id, n)
		default:
		}
		return unix.Kill(c.proc.Pid, sig)
	}
	if sig == unix.SIGKILL {
		ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.KillTimeout)
		defer cancel()
		_, err := c.group.Kill(ctx)
		return err
	}
	pids, err := c.group.Procs()
	if err != nil {
		return err
	}
	for _, p := range pids {
		signalMember(p, sig, c.group.Name())
	}
	return nil
}

// signalMember signals pid through a pidfd once /proc says it is still in
// the cgroup named name ("gen-N/proc-K"; a pid reused meanwhile is not
// signalled).
func signalMember(pid int, sig unix.Signal, name string) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil || !strings.Contains(string(b), "/"+name+"\n") {
		return
	}
	unix.PidfdSendSignal(fd, sig, nil, 0)
}

// stdinTimeout bounds one write to a call's stdin: a call that does not
// read its stdin holds no API handler longer.
const stdinTimeout = 10 * time.Second

// WriteStdin writes data to call id's stdin and closes it if asked.
func (rt *Runtime) WriteStdin(n uint64, id string, req api.StdinRequest) (api.StdinResult, error) {
	c, _, err := rt.findCall(n, id)
	if err != nil {
		return api.StdinResult{}, err
	}
	if c == nil || c.ended() {
		return api.StdinResult{}, errs.New(api.CodeNotRunning, "tool call %s of generation %d is not running", id, n)
	}
	return c.writeStdin(req.Data, req.Close, stdinTimeout)
}

func (c *call) writeStdin(data []byte, closeAfter bool, timeout time.Duration) (api.StdinResult, error) {
	c.stdinMu.Lock()
	defer c.stdinMu.Unlock()
	if c.stdin == nil {
		if len(data) == 0 && closeAfter {
			return api.StdinResult{Closed: true}, nil
		}
		return api.StdinResult{}, errs.New(api.CodeStdinClosed, "tool call %s has no open stdin", c.id)
	}
	res := api.StdinResult{}
	if len(data) > 0 {
		c.stdin.SetWriteDeadline(time.Now().Add(timeout))
		w, err := c.stdin.Write(data)
		res.Written = w
		if err != nil {
			if os.IsTimeout(err) {
				return res, errs.New(api.CodeStdinFull, "tool call %s took %d of %d bytes of stdin in %s", c.id, w, len(data), timeout)
			}
			return res, errs.New(api.CodeStdinClosed, "stdin of tool call %s: %v", c.id, err)
		}
	}
	if closeAfter {
		if c.pty != nil {
			// A terminal has no end of file to close: ^D at the start of a
			// line is what a shell reads as one.
			c.stdin.Write([]byte{4})
		} else {
			c.stdin.Close()
		}
		c.stdin = nil
		res.Closed = true
	}
	return res, nil
}

func (c *call) closeStdin() {
	c.stdinMu.Lock()
	defer c.stdinMu.Unlock()
	if c.stdin != nil && c.pty == nil {
		c.stdin.Close()
	}
	c.stdin = nil
}

// Resize sets a TTY call's window size.
func (rt *Runtime) Resize(n uint64, id string, req api.ResizeRequest) error {
	c, _, err := rt.findCall(n, id)
	if err != nil {
		return err
	}
	if c == nil || c.ended() {
		return errs.New(api.CodeNotRunning, "tool call %s of generation %d is not running", id, n)
	}
	if c.pty == nil {
		return errs.New(api.CodeBadRequest, "tool call %s has no terminal", id)
	}
	return setWinsize(c.pty, req.Rows, req.Cols)
}
