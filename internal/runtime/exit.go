package runtime

import (
	"context"
	"path/filepath"
	"time"

	"github.com/shimdev/shim/api"
)

// watch records the harness's exit when the reaper collects it, then ends
// what the generation left behind: an exited harness leaves nothing acting.
func (rt *Runtime) watch(g *generation) {
	e := g.proc.Exit()
	// At once: exited (the broker answers it no more), and its
	// credentials and network cut, before anything that can take time.
	rt.mu.Lock()
	live := g.state == stRunning || g.state == stSuspended // suspended: killed while frozen (the OOM killer, a failed suspension)
	fenced := !live || rt.shuttingDown
	onItsOwn := live && g.transition(stExited) == nil
	rt.mu.Unlock()
	var cutAt *time.Time
	if onItsOwn {
		stopped := true
		if g.net == nil && g.group != nil {
			// Host mode: the sandbox's network cannot be taken from what it
			// left running, so that is frozen instead (killed after the exit
			// grace; with linger, kept frozen until the next announcement).
			var err error
			g.calls.withoutSpawns(func() {
				ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.FreezeTimeout)
				err = g.group.Freeze(ctx)
				cancel()
			})
			if err != nil {
				stopped = false
				rt.log.Error("what the exited harness left could not be frozen; it is killed after the grace", "generation", g.n, "error", err)
			}
		}
		if _, err := rt.cut(g, false); err != nil {
			rt.log.Error("cut after the harness exited not confirmed; the next fence cuts again", "generation", g.n, "error", err)
		} else if stopped {
			now := time.Now().UTC()
			cutAt = &now
		}
	}
	if g.out != nil {
		g.out.wait(time.Second) // what it wrote last is in the files before anyone is told
	}
	exit := api.Exit{Generation: g.n, Pid: e.Pid, ExitCode: e.Code, Signal: e.Signal,
		StartedAt: g.started, ExitedAt: e.At, Fenced: fenced, CutAt: cutAt}
	// The record is on disk before anyone is told the generation exited.
	if err := rt.reserve.retry(func() error { return writeJSON(filepath.Join(g.dir, "exit.json"), exit) }); err != nil {
		rt.log.Error("exit record not written", "generation", g.n, "error", err)
	}
	rt.mu.Lock()
	g.exit = &exit
	stopLeaseLocked(g)
	close(g.exited)
	rt.mu.Unlock()
	rt.audit.Record("generation_exited", g.n, map[string]any{"exit": exit}, false)
	rt.events.publish(api.EventExited, g.n, &api.ExitedData{ExitCode: exit.ExitCode, Signal: exit.Signal, Fenced: exit.Fenced})
	rt.log.Info("harness exited", "generation", g.n, "exit_code", exit.ExitCode, "fenced", exit.Fenced)
	if onItsOwn {
		rt.quiesce(g)
	}
}

// quiesce ends what a harness that exited on its own left behind (its
// credentials and network were cut at the exit, and in host mode it was
// frozen, so a daemon holding a copied token reaches nothing): the rest of
// its processes after the exit grace, unless the
// announcement asked to linger (then at the next announcement). A fence
// that begins meanwhile takes over: every step here is one the fence
// repeats safely.
func (rt *Runtime) quiesce(g *generation) {
	if g.spec.Linger || g.group == nil {
		rt.mu.Lock()
		g.markQuiet()
		rt.mu.Unlock()
		return
	}
	t := time.NewTimer(rt.cfg.ExitGrace)
	defer t.Stop()
	select {
	case <-t.C:
	case <-g.quiet: // fenced meanwhile
		return
	}
	rt.mu.Lock()
	mine := g.state == stExited
	rt.mu.Unlock()
	if !mine {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.KillTimeout)
	defer cancel()
	res, err := g.group.Kill(ctx)
	if err == nil {
		err = g.group.Remove()
	}
	if err != nil {
		rt.log.Error("what the exited harness left could not be killed; the next fence kills it", "generation", g.n, "error", err)
		return
	}
	if g.net != nil {
		g.net.Close()
	}
	rt.mu.Lock()
	if g.state == stExited {
		rt.move(g, stQuiesced)
	}
	g.markQuiet()
	rt.mu.Unlock()
	rt.audit.Record("generation_quiesced", g.n, map[string]any{"killed": res.Killed}, true)
	rt.events.publish(api.EventQuiesced, g.n, &api.QuiescedData{Killed: res.Killed})
}

// settleLater runs the push check of each fenced worktree again after the
// announcement's settle window, for pushes a server finished receiving
// after the fence; a move is published (remote_moved) and stored in the
// fenced generation's record. It only asks the remote (ls-remote from
// outside the worktree): the new generation owns the worktree by then.
func (rt *Runtime) settleLater(a *announcement, fenced []api.FenceReport) {
	if a.fetch == nil || a.fetch.Settle <= 0 {
		return
	}
	for _, rep := range fenced {
		w := rep.Worktree
		if w == nil || w.Fetch == nil || w.Fetch.URL == "" || w.Fetch.Error != "" {
			continue
		}
		rt.mu.Lock()
		wt := rt.worktrees[filepath.Clean(w.Worktree)]
		rt.mu.Unlock()
		if wt == nil {
			continue
		}
		go rt.settle(rep.Generation, wt, *w.Fetch, a.fetch)
	}
}

func (rt *Runtime) settle(n uint64, wt worktree, first api.FetchReport, spec *fetchSpec) {
	t := time.NewTimer(spec.Settle)
	defer t.Stop()
	<-t.C
	ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.GitTimeout)
	defer cancel()
	check := first
	check.Settled, check.Error = true, ""
	commit, err := wt.RemoteHead(ctx, first, spec)
	switch {
	case err != nil:
		check.Error = err.Error()
	case commit != first.FetchedCommit:
		check.FetchedCommit, check.RemoteMoved = commit, commit != "" && commit != first.Baseline
		check.RemoteCommits, check.RemoteCommitCount = nil, 0
	}
	dir := rt.genDir(n)
	var rec api.Generation
	if readJSON(filepath.Join(dir, "generation.json"), &rec) == nil {
		rec.PushCheck = &check
		if err := writeJSON(filepath.Join(dir, "generation.json"), rec); err != nil {
			rt.log.Warn("push check not stored", "generation", n, "error", err)
		}
	}
	rt.audit.Record("push_check_settled", n, map[string]any{"fetched_commit": check.FetchedCommit,
		"first_commit": first.FetchedCommit, "remote_moved": check.RemoteMoved, "error": check.Error}, true)
	if check.FetchedCommit != first.FetchedCommit && check.Error == "" {
		rt.log.Warn("the remote moved after the fence", "generation", n, "remote", first.Remote, "branch", first.Branch,
			"at_fence", first.FetchedCommit, "now", check.FetchedCommit)
		rt.events.publish(api.EventRemoteMoved, n, &api.RemoteMovedData{Remote: first.Remote, Branch: first.Branch,
			AtFence: first.FetchedCommit, Now: check.FetchedCommit})
	}
}
