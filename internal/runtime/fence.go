package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
)

// fenceBelow ends every generation older than a.n. This is the fence, in
// the order of the brief; nothing a harness can influence (its worktree,
// its git, free disk space, its logs, its pids) comes before step 1:
//
//  0. the token is raised in memory and every older generation is marked
//     fencing (the broker refuses it from here on);
//  1. freeze, until the kernel confirms it;
//  2. cut: credentials revoked, every connection aborted, link deleted;
//  3. kill, until the cgroup is empty, and remove it;
//  4. persist the token (state.json, then the audit record); restore each
//     worktree (save the abandoned edits, reset to the baseline).
//
// Step 5, start, is startGeneration's. A step that cannot be confirmed
// fails the fence (fail closed) but never stops the steps that end the old
// generation: a failed freeze still cuts and kills. Only the restore waits
// for a confirmed kill.
func (rt *Runtime) fenceBelow(ctx context.Context, a *announcement) ([]api.FenceReport, error) {
	runs := rt.beginFence(a)
	for _, f := range runs {
		f.step("freeze", rt.freeze)
	}
	rt.stopMaintenance()   // the last answer's, if still running: not beside this fence
	rt.startEarly(a, runs) // nothing older runs: the new stub's exec goes on beside steps 2-4
	for _, f := range runs {
		f.step("cut", rt.cutOff)
	}
	for _, f := range runs {
		f.step("kill", rt.killAndRemove)
	}
	persisted := rt.persistToken(a, runs)
	for _, f := range runs {
		if f.stopped() {
			f.step("restore", rt.restoreWorktree)
			// Its layers are read: the unmounts (and the sync of the
			// layers' filesystem they make) run once the announcement is
			// answered, not in the way of the fence's own fsyncs.
			a.held = append(a.held, f.g.mounts)
		}
	}
	rt.letGoIfShort(a)
	rt.maintainAfterFence(a, runs, persisted)
	return rt.endFence(a, runs, persisted)
}

// fenceRun is one generation's fence: its report, its errors, and the
// timing of every step.
type fenceRun struct {
	ctx     context.Context
	g       *generation
	a       *announcement
	resumed bool // freeze, cut and kill were confirmed by an earlier fence
	began   time.Time
	rep     api.FenceReport
	errs    []error
}

// step runs one step of the pipeline on f, timed; a resumed fence skips
// the steps an earlier one confirmed.
func (f *fenceRun) step(name string, fn func(*fenceRun) error) {
	if f.resumed && name != "restore" {
		return
	}
	t := time.Now()
	err := fn(f)
	f.rep.DurationsMS[name] = ms(time.Since(t))
	if err != nil {
		f.errs = append(f.errs, fmt.Errorf("%s: %w", name, err))
	}
}

// stopped reports whether the restore may run: the kill is confirmed and
// no step of this fence failed.
func (f *fenceRun) stopped() bool { return len(f.errs) == 0 }

// beginFence raises the token in memory and marks every older generation
// fencing, under one lock: from here on the broker answers none of them
// and no announcement below a.n is admitted. It touches no disk.
func (rt *Runtime) beginFence(a *announcement) []*fenceRun {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if a.n > rt.highest {
		rt.highest = a.n
	}
	below := a.n
	if a.kind == "end" {
		below = a.n + 1 // the generation itself too
		rt.st.Ended = a.n
	}
	old := rt.sortedGensLocked(below)
	runs := make([]*fenceRun, 0, len(old))
	for _, g := range old {
		f := &fenceRun{a: a, g: g, ctx: a.ctx, began: time.Now(),
			rep: api.FenceReport{Generation: g.n, StateBefore: g.apiState(), DurationsMS: map[string]float64{}}}
		switch g.state {
		case stEmptied:
			f.resumed = true // killed before (an earlier fence, an exit, a previous shim): restore only
		case stQuiesced:
			f.resumed = true
			rt.move(g, stEmptied)
		default:
			if err := g.transition(stFencing); err != nil {
				f.errs = append(f.errs, err)
			}
		}
		runs = append(runs, f)
	}
	if len(runs) > 0 {
		rt.fencing = true
	}
	for _, f := range runs {
		rt.events.publish(api.EventFencing, f.g.n, &api.FencingData{By: a.n})
	}
	return runs
}

// freeze is step 1: nothing in the generation runs from here on.
func (rt *Runtime) freeze(f *fenceRun) error {
	rt.fenceCalls(f) // no tool call starts in it from here on (exec.go)
	if f.g.group == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(f.ctx, rt.cfg.FreezeTimeout)
	defer cancel()
	return f.g.group.Freeze(ctx)
}

// cutOff is step 2: the broker stops answering the generation, and every
// TCP connection it has is aborted (reset, queued bytes dropped), through
// its own network or, in host mode, in shim's namespace; then its link is
// deleted.
func (rt *Runtime) cutOff(f *fenceRun) error {
	rep, err := rt.cut(f.g, false)
	f.rep.Cut = rep
	return err
}

// cut revokes g's credentials and cuts its network (step 2, and at the
// harness's exit). With suspend (a lease that ran out) the credentials are
// only refused until a renewal and the network keeps its link: every
// connection is aborted all the same.
func (rt *Runtime) cut(g *generation, suspend bool) (*api.CutReport, error) {
	rep := &api.CutReport{DurationsMS: map[string]float64{}}
	t := time.Now()
	if b := rt.credBroker(); b != nil {
		if suspend {
			rep.CredentialsRevoked = b.Suspend(g.n)
		} else {
			rep.CredentialsRevoked = b.Revoke(g.n)
		}
	}
	rep.DurationsMS["credentials"] = ms(time.Since(t))
	var err error
	switch {
	case g.net != nil:
		var nr api.CutReport
		if suspend {
			nr, err = g.net.Suspend(g.group)
		} else {
			nr, err = g.net.Cut(g.group)
		}
		rep.TunnelsClosed, rep.ConnectionsClosed, rep.LinkDeleted = nr.TunnelsClosed, nr.ConnectionsClosed, nr.LinkDeleted
		rep.SocketsDestroyed = nr.SocketsDestroyed
		rep.Connections = nr.Connections
		for k, v := range nr.DurationsMS {
			rep.DurationsMS[k] = v
		}
	case g.group != nil && rt.groups.Mode() == cgroup.ModeCgroup2:
		t := time.Now()
		// Its tool calls' sockets carry their own cgroups' ids: one dump
		// for the generation and every call.
		rep.Connections, err = rt.launch.abortSockets(append([]cgroup.Group{g.group}, g.calls.liveGroups()...))
		if err == nil {
			rep.SocketsDestroyed = len(rep.Connections)
		}
		rep.DurationsMS["connections"] = ms(time.Since(t))
	case suspend && g.group != nil:
		// Host mode without cgroup2: its sockets cannot be told apart.
		err = errs.New(api.CodeUnsupported, "the connections of a host-mode generation cannot be aborted in cgroup mode %s", rt.groups.Mode())
	}
	for _, c := range rep.Connections {
		rep.InFlight = rep.InFlight || c.InFlight
	}
	if err != nil && api.CodeOf(err) == api.CodeUnsupported && suspend {
		// No kill follows a suspension to end what is in flight: it
		// cannot be confirmed (the caller kills instead).
		rep.AbortUnsupported = err.Error()
		return rep, err
	}
	if err != nil && api.CodeOf(err) == api.CodeUnsupported {
		// This sandbox cannot abort sockets (no CAP_NET_ADMIN, or a kernel
		// without SOCK_DESTROY): what is in flight is not aborted, the kill
		// still ends the generation. Reported, never a reason to fail every
		// fence in such a sandbox.
		rep.AbortUnsupported = err.Error()
		rt.log.Warn("in-flight connections cannot be aborted here; the kill ends them", "generation", g.n, "reason", err)
		err = nil
	}
	if err != nil && api.CodeOf(err) == api.CodeInternal {
		err = errs.New(api.CodeCutFailed, "generation %d: %v", g.n, err)
	}
	return rep, err
}

// killAndRemove is step 3: every process killed, the cgroup confirmed empty
// and removed, the harness's exit collected, the network released.
func (rt *Runtime) killAndRemove(f *fenceRun) error {
	g := f.g
	if g.group != nil {
		ctx, cancel := context.WithTimeout(f.ctx, rt.cfg.KillTimeout)
		defer cancel()
		res, err := g.group.Kill(ctx)
		f.rep.Killed, f.rep.Survivors = res.Killed, res.Survivors
		if err != nil {
			return err
		}
		if g.proc != nil {
			// The harness's own exit status is collected by the reaper;
			// wait for it so that the exit record is complete.
			select {
			case <-g.exited: // first: with both ready, select would pick at random
			default:
				select {
				case <-g.exited:
				case <-ctx.Done():
					return errs.New(api.CodeFenceFailed, "generation %d: harness pid %d not reaped after the kill", g.n, g.pid)
				}
			}
		}
		if err := g.group.Remove(); err != nil {
			return err
		}
	}
	if g.net != nil {
		g.net.Close()
	}
	// Dead is dead, whatever failed before: a retry resumes at the restore.
	// (An earlier failure still fails this fence and skips its restore.)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	g.markQuiet()
	return g.transition(stEmptied)
}

// persistToken is the first disk write of the fence: the token (and what a
// restarted shim needs to finish the fence) to state.json, then the audit
// record of the announcement. If either fails, the old generations are
// already dead and the new one does not start (TOKEN_NOT_PERSISTED,
// AUDIT_FAILED). It returns that failure.
func (rt *Runtime) persistToken(a *announcement, runs []*fenceRun) error {
	t := time.Now()
	rt.mu.Lock()
	if rt.highest > rt.st.Highest {
		rt.st.Highest = rt.highest
		rt.st.Started = nil
	}
	err := rt.saveLocked()
	rt.mu.Unlock()
	if err == nil {
		err = rt.audit.Record("announced", a.n, map[string]any{"kind": a.kind, "fencing": runGens(runs)}, true)
	}
	for _, f := range runs {
		f.rep.DurationsMS["persist"] = ms(time.Since(t))
	}
	return err
}

// restoreWorktree is step 4: once nothing of the generation runs, its
// worktree's edits become refs/shim/abandoned/<gen> and the worktree goes
// back to the baseline. The baseline is resolved here, among the trusted
// refs, after the trusted git metadata is back: a harness that broke its
// worktree can fail its restore, never keep itself alive. In order: which
// worktree and baseline (restoreTarget), the worktree's guard
// (openWorktree), save and reset (saveAndReset), on to what the abandoned
// call pushed if asked (continueFromPush), the outcome noted
// (recordRestore).
func (rt *Runtime) restoreWorktree(f *fenceRun) error {
	f.rep.Layer = rt.rootLayerReport(f.g)
	path, rev, fetch := rt.restoreTarget(f)
	if path == "" {
		return nil
	}
	wt, err := rt.openWorktree(f.ctx, path, f.a.opts, true) // a generation ran: late
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(f.ctx, rt.cfg.RestoreTimeout)
	defer cancel()
	rep, err := rt.saveAndReset(ctx, f, wt, path, rev, fetch)
	if err == nil {
		err = rt.continueFromPush(ctx, f, wt, fetch, rep)
	}
	rt.recordRestore(f, path, rep, err)
	return err
}

// saveAndReset saves the generation's edits as its snapshot and puts the
// worktree back on rev: from its layer (the overlay's upper) when it ran
// on one, else by the scan of the worktree itself.
func (rt *Runtime) saveAndReset(ctx context.Context, f *fenceRun, wt worktree, path, rev string, fetch *fetchSpec) (*api.WorktreeReport, error) {
	upper := rt.worktreeLayer(f.g, path)
	if upper == "" {
		return wt.Restore(ctx, f.g.n, rev, fetch)
	}
	if rt.layersReserve.short() {
		// The harness left less room than the reserve: the snapshot and
		// the marker get it (nothing else runs now).
		rt.layersReserve.release()
	}
	return rt.restoreLayer(ctx, f, wt, rev, fetch, upper)
}

// continueFromPush moves the worktree, at the baseline and clean now, to
// the commit the abandoned call pushed when the announcement asks to
// continue from it (the snapshot is kept as it is).
func (rt *Runtime) continueFromPush(ctx context.Context, f *fenceRun, wt worktree, fetch *fetchSpec, rep *api.WorktreeReport) error {
	if fetch == nil || !fetch.Continue || rep == nil || rep.Fetch == nil || !rep.Fetch.RemoteMoved || rep.Fetch.FetchedCommit == "" {
		return nil
	}
	rt.lowerMoves(f)
	moved, err := wt.Move(ctx, f.g.n, rep.Fetch.FetchedCommit, nil)
	if moved != nil {
		rep.Baseline, rep.BaselineFromFetch = moved.Baseline, err == nil
	}
	return err
}

// recordRestore notes where the worktree is now (its baseline, for the
// next start) and puts the restore's report into the fence's.
func (rt *Runtime) recordRestore(f *fenceRun, path string, rep *api.WorktreeReport, err error) {
	if rep == nil {
		return
	}
	if err == nil && rep.Baseline != "" {
		rt.mu.Lock()
		rt.baselines[filepath.Clean(path)] = rep.Baseline // where the worktree is now
		rt.mu.Unlock()
	}
	f.rep.Worktree = rep
	f.rep.SnapshotRef, f.rep.SnapshotCommit, f.rep.Baseline = rep.SnapshotRef, rep.SnapshotCommit, rep.Baseline
	rt.auditFetch(f.g.n, rep)
}

// restoreTarget is where generation f.g's worktree goes back to: its own
// worktree and baseline, or the announcement's when it names that worktree
// (or the fenced generation had none: it may have written the
// announcement's). Only the announcement's worktree is fetched.
func (rt *Runtime) restoreTarget(f *fenceRun) (path, rev string, fetch *fetchSpec) {
	rt.mu.Lock()
	path, rev = f.g.spec.Worktree, f.g.baseline
	rt.mu.Unlock()
	if f.a.worktree != "" && (path == "" || filepath.Clean(path) == filepath.Clean(f.a.worktree)) {
		path, fetch = f.a.worktree, ownBranch(f.a.fetch, f.g.spec)
		if f.a.baseline != "" {
			rev = f.a.baseline
		}
	}
	if path != "" && rev == "" {
		// Named for the first time now: its HEAD, resolved from the git
		// metadata registration keeps (the report says registered_late).
		rev = "HEAD"
	}
	return path, rev, fetch
}

// ownBranch is the push check of a fenced generation: the announcement's
// fetch (its credentials, its settle window), but on the remote and branch
// the fenced generation was announced with when it named them: it pushed
// there, not to the new announcement's branch (one task's announcement
// fencing another task's generation checked the wrong branch).
func ownBranch(fetch *fetchSpec, fenced api.StartRequest) *fetchSpec {
	var remote, branch string
	if fenced.Fetch != nil {
		remote, branch = fenced.Fetch.Remote, fenced.Fetch.Branch
	}
	if branch == "" {
		branch = fenced.Branch // the branch it was put on
	}
	if fetch == nil || branch == "" && remote == "" {
		return fetch
	}
	own := *fetch
	if branch != "" {
		own.Branch = branch
	}
	if remote != "" {
		own.Remote = remote
	}
	return &own
}

// endFence records the outcome of every run: a confirmed one is fenced and
// forgotten, an unconfirmed one keeps its generation (failed, or emptied
// with its restore pending) and fails the announcement with the first error.
//
// Its records are one fsync batch: the fenced generations' records,
// state.json (which no longer lists them) and, for a start, the new
// generation's dir and hand-off; then the audit record of each
// fence, which says the decision was made once what it depends on (the
// snapshot, synced by the restore; these records) is durable.
func (rt *Runtime) endFence(a *announcement, runs []*fenceRun, persistErr error) ([]api.FenceReport, error) {
	reports := make([]api.FenceReport, 0, len(runs))
	failure := persistErr
	var records durableBatch
	var fenced []*fenceRun
	for _, f := range runs {
		err := rt.finishRun(f, &records)
		reports = append(reports, f.rep)
		if err != nil && failure == nil {
			failure = err
		}
		if err == nil {
			fenced = append(fenced, f)
		}
	}
	if failure == nil && a.kind == "start" && a.req != nil {
		// The start's dir and hand-off (what the fenced generations
		// left) in the same batch: no sync of its own at the start.
		a.prep = rt.putStartRecords(a.n, a.req.Env, a.req.User, reports, &records)
	}
	rt.mu.Lock()
	rt.fencing = false
	rt.st.Failed = nil
	if failure != nil {
		rt.st.Failed = asAPIError(failure)
	}
	if err := rt.saveWithLocked(&records); err != nil && failure == nil {
		failure = err
		rt.st.Failed = asAPIError(err)
	}
	rt.mu.Unlock()
	if a.prep != nil {
		a.prep.durable(&records)
	}
	for _, f := range fenced {
		if err := rt.recordFenced(f); err != nil && failure == nil {
			// The decision could not be recorded: the announcement fails
			// closed, and state.json says so.
			failure = err
			rt.mu.Lock()
			rt.st.Failed = asAPIError(err)
			if serr := rt.saveLocked(); serr != nil {
				rt.log.Error("failed fence not persisted", "generation", f.g.n, "error", serr)
			}
			rt.mu.Unlock()
		}
	}
	return reports, failure
}

// finishRun ends one run: its report, its state, its record (put in
// records, made durable by endFence). It returns why the run failed.
func (rt *Runtime) finishRun(f *fenceRun, records *durableBatch) error {
	g := f.g
	rt.mu.Lock()
	f.rep.Exit = g.exit
	f.rep.DurationsMS["total"] = ms(time.Since(f.began))
	ok := len(f.errs) == 0
	switch {
	case ok:
		rt.move(g, stFenced)
		stopLeaseLocked(g)
		delete(rt.gens, g.n)
		if rt.current == g {
			rt.current = nil
		}
	case g.state == stFencing:
		rt.move(g, stFailed)
	}
	rt.mu.Unlock()
	if !ok {
		err := fenceError(g.n, errors.Join(f.errs...))
		f.rep.Error = asAPIError(err)
		_ = rt.audit.Record("fence_failed", g.n, map[string]any{"report": f.rep}, true) // failing already
		rt.events.publish(api.EventFailed, g.n, &api.FailedData{Error: f.rep.Error})
		rt.log.Error("fence failed", "generation", g.n, "error", err)
		return err
	}
	rt.putFenceRecord(records, g, &f.rep)
	// Its layers are the snapshot and the report now: kept for forensics
	// within --keep-layers, the older ones removed once the announcement
	// is answered (pruneLayers), not in its way: removing a layer of
	// 50,000 files on ext4 takes 30 ms, and even a small one's unlinks
	// take the CPU the fence and the start need.
	f.a.prune = rt.layers != nil
	return nil
}

// recordFenced is the audit record of a run that fenced its generation
// (its event and its log line), once endFence made its records durable.
func (rt *Runtime) recordFenced(f *fenceRun) error {
	g := f.g
	if err := rt.audit.Record("fenced", g.n, map[string]any{"report": f.rep}, true); err != nil {
		return err
	}
	rt.events.publish(api.EventFenced, g.n, &api.FencedData{Killed: f.rep.Killed, Survivors: f.rep.Survivors})
	rt.log.Info("generation fenced", "generation", g.n, "killed", f.rep.Killed, "durations_ms", f.rep.DurationsMS)
	return nil
}

// putFenceRecord puts gen/<N>/generation.json with the fence report added
// in records.
func (rt *Runtime) putFenceRecord(records *durableBatch, g *generation, rep *api.FenceReport) {
	rt.mu.Lock()
	rec := rt.recordLocked(g)
	rt.mu.Unlock()
	rec.State, rec.Fence = api.GenFenced, rep
	if g.proc == nil {
		return // adopted: its record (if any) is the previous shim's
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		rt.log.Warn("generation record not updated", "generation", g.n, "error", err)
		return
	}
	records.put(filepath.Join(g.dir, "generation.json"), append(b, '\n'), 0o644)
}

// asAPIError is err as the API reports it: its stable code and a message
// without the code repeated.
func asAPIError(err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) && ae == err {
		return &api.Error{Code: ae.Code, Message: ae.Message}
	}
	return &api.Error{Code: api.CodeOf(err), Message: err.Error()}
}

// fenceError keeps the code of a restore, cut or persist failure and makes
// every other unconfirmed step a FENCE_FAILED.
func fenceError(n uint64, err error) error {
	code := api.CodeOf(err)
	switch code {
	case api.CodeRestoreFailed, api.CodeCutFailed, api.CodeTokenNotPersisted, api.CodeAuditFailed:
	case api.CodeWorktreeRefused, api.CodeBadRequest, api.CodeNotFound:
		// A worktree the abandoned generation made unsafe (.git pointing
		// outside, a baseline object deleted) is a restore that failed:
		// exit 4 and state failed like any other; the message keeps the cause.
		code = api.CodeRestoreFailed
	default:
		code = api.CodeFenceFailed
	}
	if code == api.CodeRestoreFailed {
		// The restore runs only once the kill is confirmed.
		return errs.New(code, "generation %d was fenced (frozen, cut and killed: nothing of it runs) but its worktree was not restored; "+
			"the next announcement restores it: %v", n, err)
	}
	return errs.New(code, "generation %d not fenced: %v", n, err)
}

// auditFetch records the push check of a restore.
func (rt *Runtime) auditFetch(n uint64, rep *api.WorktreeReport) {
	f := rep.Fetch
	if f == nil {
		return
	}
	fields := map[string]any{"worktree": rep.Worktree, "remote": f.Remote, "branch": f.Branch, "url": f.URL,
		"fetched_commit": f.FetchedCommit, "baseline": f.Baseline, "remote_moved": f.RemoteMoved,
		"remote_commit_count": f.RemoteCommitCount}
	if f.Error != "" {
		fields["error"] = f.Error
		rt.log.Warn("fetch at the fence failed; the fence goes on", "generation", n, "worktree", rep.Worktree, "remote", f.Remote, "error", f.Error)
	} else if f.RemoteMoved {
		rt.log.Warn("the remote moved past the baseline: likely pushes by the fenced generation", "generation", n,
			"remote", f.Remote, "branch", f.Branch, "commits", f.RemoteCommitCount)
	}
	rt.audit.Record("worktree_fetched", n, fields, true)
}

func runGens(runs []*fenceRun) []uint64 {
	out := make([]uint64, 0, len(runs))
	for _, f := range runs {
		out = append(out, f.g.n)
	}
	return out
}
