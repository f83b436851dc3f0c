package runtime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/gitguard"
)

// Start announces generation req.Generation: it fences every older
// generation and then starts the new harness. Stale announcements are
// refused, an identical retry gets the first answer, and a different spec
// under the same number is a conflict.
func (rt *Runtime) Start(ctx context.Context, req api.StartRequest) (*api.StartResult, error) {
	if err := validateStart(&req); err != nil {
		return nil, err
	}
	fetch, err := fetchSpec(req.Fetch, req.Worktree, req.Credentials)
	if err != nil {
		return nil, err
	}
	hash := specHash(req)

	rt.announce.Lock()
	defer rt.announce.Unlock()

	rt.mu.Lock()
	if rt.shuttingDown {
		rt.mu.Unlock()
		return nil, api.Errorf(api.CodeShuttingDown, "shim is shutting down")
	}
	if prev := rt.st.Started; prev != nil && prev.Generation == req.Generation {
		rt.mu.Unlock()
		if prev.SpecHash == hash {
			res := prev.Result
			rt.audit.Record("announcement_retried", req.Generation, nil, false)
			return &res, nil
		}
		rt.audit.Record("announcement_refused", req.Generation, map[string]any{"code": api.CodeGenerationConflict}, true)
		return nil, api.Errorf(api.CodeGenerationConflict,
			"generation %d was already started with a different spec; announce a higher generation", req.Generation)
	}
	rt.mu.Unlock()
	if err := rt.refuseStale(req.Generation, "announcement_refused"); err != nil {
		return nil, err
	}
	started := time.Now()

	// A worktree is registered (pristine git metadata kept) before any
	// harness of this announcement runs, and its baseline resolved once.
	var guard *gitguard.Guard
	var baseline string
	deferred := false
	if req.Worktree != "" {
		var err error
		guard, err = rt.guardFor(ctx, req.Worktree, guardOpts{req.KeepPaths, req.IncludeIgnored})
		switch {
		case err == nil:
			if baseline, deferred, err = rt.resolveBaseline(ctx, guard, req); err != nil {
				return nil, err
			}
		case rt.hasLiveBelow(req.Generation):
			// The generation about to be fenced may have broken the
			// worktree: it must not be able to stop its own fence. The
			// fence goes ahead; its restore step checks again and fails
			// closed if the worktree is still refused.
			rt.log.Warn("worktree refused before the fence; fencing anyway", "worktree", req.Worktree, "error", err)
			rt.audit.Record("worktree_deferred", req.Generation, map[string]any{"worktree": req.Worktree, "error": err.Error()}, true)
			guard, baseline, deferred = nil, req.Baseline, true
		default:
			return nil, err
		}
	}

	fenced, err := rt.fenceBelow(ctx, req.Generation, target{worktree: req.Worktree, baseline: baseline, fetch: fetch})
	if err != nil {
		return &api.StartResult{Generation: req.Generation, Fenced: fenced}, err
	}
	if deferred {
		if baseline, err = rt.settleBaseline(ctx, guard, req.Worktree, baseline, fenced); err != nil {
			return &api.StartResult{Generation: req.Generation, Fenced: fenced}, err
		}
	}

	tStart := time.Now()
	rt.mu.Lock()
	if rt.shuttingDown {
		rt.mu.Unlock()
		return &api.StartResult{Generation: req.Generation, Fenced: fenced}, api.Errorf(api.CodeShuttingDown, "shim is shutting down; generation %d was not started", req.Generation)
	}
	rt.starting = req.Generation
	rt.mu.Unlock()
	g, err := rt.launch.start(ctx, rt, req, baseline)
	rt.mu.Lock()
	rt.starting = 0
	rt.mu.Unlock()
	if err != nil {
		rt.audit.Record("start_failed", req.Generation, map[string]any{"error": err.Error()}, true)
		rt.events.publish("failed", req.Generation, map[string]any{"error": err.Error()})
		return &api.StartResult{Generation: req.Generation, Fenced: fenced}, err
	}
	startMS := ms(time.Since(tStart))
	for i := range fenced {
		fenced[i].DurationsMS["start"] = startMS
		fenced[i].DurationsMS["total"] = ms(time.Since(started))
	}
	res := api.StartResult{
		Generation: g.n, Pid: g.pid, Cgroup: g.group.Path(), StartedAt: g.started, Fenced: fenced,
		Baseline: baseline, DurationsMS: map[string]float64{"start": startMS, "total": ms(time.Since(started))},
	}
	if g.net != nil {
		res.Network = g.net.Info()
	}
	if res.Fenced == nil {
		res.Fenced = []api.FenceReport{}
	}

	rt.mu.Lock()
	rt.gens[g.n] = g
	rt.current = g
	rt.st.Started = &startedRecord{Generation: g.n, SpecHash: hash, Result: res}
	err = rt.saveLocked()
	rt.mu.Unlock()
	if err != nil {
		// The harness runs but the token is not durable: say so; a retry
		// of the same announcement is answered from memory.
		rt.log.Error("state not persisted after start", "generation", g.n, "error", err)
	}
	rt.audit.Record("generation_started", g.n, map[string]any{
		"pid": g.pid, "cgroup": g.group.Path(), "network": req.Network, "labels": req.Labels, "command": req.Command,
	}, true)
	rt.events.publish("started", g.n, map[string]any{"pid": g.pid})
	rt.log.Info("generation started", "generation", g.n, "pid", g.pid, "cgroup", g.group.Path())
	return &res, nil
}

// Fence fences every generation older than req.Generation and starts
// nothing; req.Generation becomes the lowest generation Start accepts.
func (rt *Runtime) Fence(ctx context.Context, req api.FenceRequest) (*api.FenceResult, error) {
	if req.Generation == 0 {
		return nil, api.Errorf(api.CodeBadRequest, "generation must be a positive integer")
	}
	if len(req.Credentials) > 0 && req.Fetch == nil {
		return nil, api.Errorf(api.CodeBadRequest, "a fence uses credentials only for its fetch; credentials need fetch")
	}
	fetch, err := fetchSpec(req.Fetch, req.Worktree, req.Credentials)
	if err != nil {
		return nil, err
	}
	rt.announce.Lock()
	defer rt.announce.Unlock()
	rt.mu.Lock()
	if rt.shuttingDown {
		rt.mu.Unlock()
		return nil, api.Errorf(api.CodeShuttingDown, "shim is shutting down")
	}
	rt.mu.Unlock()
	if err := rt.refuseStale(req.Generation, "fence_refused"); err != nil {
		return nil, err
	}
	var baseline string
	if req.Worktree != "" {
		guard, err := rt.guardFor(ctx, req.Worktree, guardOpts{req.KeepPaths, req.IncludeIgnored})
		if err != nil {
			return nil, err
		}
		if baseline, _, err = rt.resolveBaseline(ctx, guard, api.StartRequest{Worktree: req.Worktree, Baseline: req.Baseline}); err != nil {
			return nil, err
		}
	}
	fenced, err := rt.fenceBelow(ctx, req.Generation, target{worktree: req.Worktree, baseline: baseline, fetch: fetch})
	if fenced == nil {
		fenced = []api.FenceReport{}
	}
	return &api.FenceResult{Generation: req.Generation, Fenced: fenced}, err
}

// refuseStale refuses (and audits) an announcement below the fencing token.
// The caller holds rt.announce, so the token cannot move meanwhile.
func (rt *Runtime) refuseStale(n uint64, event string) error {
	rt.mu.Lock()
	highest := rt.st.Highest
	rt.mu.Unlock()
	if n >= highest {
		return nil
	}
	rt.audit.Record(event, n, map[string]any{"code": api.CodeStaleGeneration, "highest": highest}, true)
	return api.Errorf(api.CodeStaleGeneration, "generation %d is stale: generation %d has been announced", n, highest)
}

// hasLiveBelow says whether any generation older than n is still live.
func (rt *Runtime) hasLiveBelow(n uint64) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for gn := range rt.gens {
		if gn < n {
			return true
		}
	}
	return false
}

// target is where the fenced generations' worktree goes back to, and what
// its restore fetches (nil: nothing).
type target struct {
	worktree, baseline string
	fetch              *gitguard.FetchSpec
}

// fetchSpec checks an announcement's fetch and turns it, with the
// announcement's credentials, into the restore's. A fetch needs a worktree.
func fetchSpec(f *api.FetchSpec, worktree string, cs []api.Credential) (*gitguard.FetchSpec, error) {
	if f == nil {
		return nil, nil
	}
	if worktree == "" {
		return nil, api.Errorf(api.CodeBadRequest, "fetch needs a worktree")
	}
	spec := &gitguard.FetchSpec{Remote: f.Remote, Branch: f.Branch}
	if err := spec.Validate(); err != nil {
		return nil, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	for i, c := range cs {
		cc := creds.Credential{Protocol: c.Protocol, Host: c.Host, Path: c.Path, Username: c.Username, Password: c.Password}
		if err := cc.Validate(); err != nil {
			return nil, api.Errorf(api.CodeBadRequest, "credential %d: %v", i, err)
		}
		spec.Credentials = append(spec.Credentials, cc)
	}
	return spec, nil
}

// fenceBelow persists n as the highest generation, then fences every live
// generation older than n, oldest first. The first failure stops it: the
// state becomes failed and nothing starts.
func (rt *Runtime) fenceBelow(ctx context.Context, n uint64, tgt target) ([]api.FenceReport, error) {
	rt.mu.Lock()
	if n > rt.st.Highest {
		rt.st.Highest = n
		rt.st.Started = nil
	}
	if err := rt.saveLocked(); err != nil {
		rt.mu.Unlock()
		return nil, err // fail closed: an undurable token is no token
	}
	var old []*generation
	for gn, g := range rt.gens {
		if gn < n {
			old = append(old, g)
		}
	}
	sort.Slice(old, func(i, j int) bool { return old[i].n < old[j].n })
	if len(old) > 0 {
		rt.fencing = true
	}
	rt.mu.Unlock()
	rt.audit.Record("announced", n, map[string]any{"fencing": gens(old)}, true)

	reports := []api.FenceReport{}
	var failure error
	for _, g := range old {
		rt.events.publish("fencing", g.n, map[string]any{"by": n})
		// A failure does not stop the others: every old generation is
		// frozen, cut and killed even when one of them cannot be confirmed.
		rep, err := rt.fenceOne(ctx, g, tgt)
		reports = append(reports, rep)
		if err != nil && failure == nil {
			failure = err
		}
	}

	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.fencing = false
	if failure != nil {
		rt.st.Failed = asAPIError(failure)
		if e := rt.saveLocked(); e != nil {
			rt.log.Error("state not persisted after a failed fence", "error", e)
		}
		return reports, failure
	}
	for _, g := range old {
		delete(rt.gens, g.n)
		if rt.current == g {
			rt.current = nil
		}
	}
	rt.st.Failed = nil
	if err := rt.saveLocked(); err != nil {
		return reports, err
	}
	return reports, nil
}

// fenceOne runs the pipeline on one generation. Every step is timed; a step
// that cannot be confirmed fails the fence (fail closed), but the kill is
// still attempted so that nothing keeps running because a step before it
// failed.
func (rt *Runtime) fenceOne(ctx context.Context, g *generation, tgt target) (api.FenceReport, error) {
	rt.mu.Lock()
	rep := api.FenceReport{Generation: g.n, StateBefore: api.StateExited, DurationsMS: map[string]float64{}}
	if g.running() {
		rep.StateBefore = api.StateRunning
	}
	g.fenced = true
	rt.mu.Unlock()
	began := time.Now()
	step := func(name string, fn func() error) error {
		t := time.Now()
		err := fn()
		rep.DurationsMS[name] = ms(time.Since(t))
		return err
	}
	var errs []error

	if !g.emptied {
		errs = rt.stopGeneration(ctx, g, &rep, step)
	}

	// 4. restore: only once nothing of the generation runs any more.
	if len(errs) == 0 {
		wt, baseline := g.spec.Worktree, g.baseline
		var fetch *gitguard.FetchSpec
		if tgt.worktree != "" && (wt == "" || wt == tgt.worktree) {
			wt = tgt.worktree
			if tgt.baseline != "" {
				baseline = tgt.baseline
			}
			fetch = tgt.fetch
		}
		if wt != "" {
			if err := step("restore", func() error {
				wrep, err := rt.restore(ctx, g.n, wt, baseline, fetch)
				if wrep != nil {
					rep.Worktree = wrep
					rep.SnapshotRef, rep.SnapshotCommit, rep.Baseline = wrep.SnapshotRef, wrep.SnapshotCommit, wrep.Baseline
				}
				return err
			}); err != nil {
				errs = append(errs, fmt.Errorf("restore: %w", err))
			}
		}
	}

	rt.mu.Lock()
	rep.Exit = g.exit
	rt.mu.Unlock()
	rep.DurationsMS["total"] = ms(time.Since(began))
	if len(errs) > 0 {
		err := fenceError(g.n, errors.Join(errs...))
		rep.Error = asAPIError(err)
		rt.audit.Record("fence_failed", g.n, map[string]any{"report": rep}, true)
		rt.events.publish("failed", g.n, map[string]any{"error": rep.Error})
		rt.log.Error("fence failed", "generation", g.n, "error", err)
		return rep, err
	}
	rt.audit.Record("fenced", g.n, map[string]any{"report": rep}, true)
	rt.events.publish("fenced", g.n, map[string]any{"killed": rep.Killed, "survivors": rep.Survivors})
	rt.log.Info("generation fenced", "generation", g.n, "killed", rep.Killed, "durations_ms", rep.DurationsMS)
	return rep, nil
}

// stopGeneration is steps 1-3 of the pipeline: freeze, cut, kill. It is
// skipped when a retried fence finds the generation already emptied.
func (rt *Runtime) stopGeneration(ctx context.Context, g *generation, rep *api.FenceReport, step func(string, func() error) error) []error {
	var errs []error
	// 1. freeze: nothing in the generation runs from here on.
	if err := step("freeze", func() error {
		fctx, cancel := context.WithTimeout(ctx, rt.cfg.FreezeTimeout)
		defer cancel()
		return g.group.Freeze(fctx)
	}); err != nil {
		errs = append(errs, fmt.Errorf("freeze: %w", err))
	}

	// 2. cut: credentials revoked, tunnels closed, link deleted.
	if err := step("cut", func() error {
		cut, err := rt.cut(g)
		rep.Cut = cut
		return err
	}); err != nil {
		errs = append(errs, fmt.Errorf("cut: %w", err))
	}

	// 3. kill: every process, then confirm empty and remove the cgroup.
	if err := step("kill", func() error {
		kctx, cancel := context.WithTimeout(ctx, rt.cfg.KillTimeout)
		defer cancel()
		res, err := g.group.Kill(kctx)
		rep.Killed, rep.Survivors = res.Killed, res.Survivors
		if err != nil {
			return err
		}
		if g.proc != nil {
			// The harness's own exit status is collected by the reaper;
			// wait for it so the exit record is complete.
			select {
			case <-g.exited:
			case <-kctx.Done():
				return api.Errorf(api.CodeFenceFailed, "generation %d: harness pid %d not reaped after the kill", g.n, g.pid)
			}
		}
		if err := g.group.Remove(); err != nil {
			return err
		}
		rt.mu.Lock()
		g.emptied = true
		rt.mu.Unlock()
		return nil
	}); err != nil {
		errs = append(errs, fmt.Errorf("kill: %w", err))
	}
	// The network is released only once the generation is gone: a retried
	// fence must still be able to cut it.
	if g.emptied && g.net != nil {
		g.net.Close()
	}
	return errs
}

// asAPIError is err as the API reports it: its stable code and a message
// without the code repeated.
func asAPIError(err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return &api.Error{Code: ae.Code, Message: ae.Message}
	}
	return &api.Error{Code: api.CodeOf(err), Message: err.Error()}
}

// fenceError keeps the code of a restore or cut failure and makes every
// other unconfirmed step a FENCE_FAILED.
func fenceError(n uint64, err error) error {
	code := api.CodeOf(err)
	switch code {
	case api.CodeRestoreFailed, api.CodeCutFailed:
	case api.CodeWorktreeRefused:
		// A worktree the abandoned generation made unsafe (.git pointing
		// outside, a symlinked path) is a restore that failed: exit 4 and
		// state failed like any other; the message keeps the cause.
		code = api.CodeRestoreFailed
	default:
		code = api.CodeFenceFailed
	}
	return api.Errorf(code, "generation %d not fenced: %v", n, err)
}

// cut revokes the generation's credentials and cuts its network.
func (rt *Runtime) cut(g *generation) (*api.CutReport, error) {
	rep := &api.CutReport{DurationsMS: map[string]float64{}}
	t := time.Now()
	if rt.broker != nil {
		rep.CredentialsRevoked = rt.broker.Revoke(g.n)
	}
	rep.DurationsMS["credentials"] = ms(time.Since(t))
	if g.net == nil {
		return rep, nil
	}
	c, err := g.net.Cut()
	rep.TunnelsClosed, rep.ConnectionsClosed, rep.LinkDeleted = c.TunnelsClosed, c.ConnectionsClosed, c.LinkDeleted
	for k, v := range c.DurationsMS {
		rep.DurationsMS[k] = v
	}
	return rep, err
}

// restore saves the abandoned edits of generation n and resets the worktree;
// with fetch, it also fetches the branch (reported, never a failure).
func (rt *Runtime) restore(ctx context.Context, n uint64, worktree, baseline string, fetch *gitguard.FetchSpec) (*gitguard.Report, error) {
	rt.mu.Lock()
	guard := rt.guards[filepath.Clean(worktree)]
	rt.mu.Unlock()
	if guard == nil {
		var err error
		if guard, err = rt.guardFor(ctx, worktree, guardOpts{}); err != nil {
			return nil, err
		}
	}
	if baseline == "" {
		return nil, api.Errorf(api.CodeRestoreFailed, "no baseline known for worktree %s; announce with --baseline", worktree)
	}
	rctx, cancel := context.WithTimeout(ctx, rt.cfg.RestoreTimeout)
	defer cancel()
	if fetch == nil {
		return guard.Restore(rctx, n, baseline)
	}
	rep, err := guard.Restore(rctx, n, baseline, gitguard.WithFetch(*fetch))
	if rep != nil && rep.Fetch != nil {
		f := rep.Fetch
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
	return rep, err
}

func gens(gs []*generation) []uint64 {
	out := make([]uint64, 0, len(gs))
	for _, g := range gs {
		out = append(out, g.n)
	}
	return out
}

// guardOpts are the per-announcement options of a worktree's restore.
type guardOpts struct {
	keepPaths      []string
	includeIgnored bool
}

func (o guardOpts) equal(p guardOpts) bool {
	return o.includeIgnored == p.includeIgnored && slices.Equal(o.keepPaths, p.keepPaths)
}

// guardFor returns the worktree's guard, registering it on first use: the
// pristine copy of its git metadata is taken before any harness runs there
// (registration is idempotent, so new options just make a new guard).
func (rt *Runtime) guardFor(ctx context.Context, worktree string, opts guardOpts) (*gitguard.Guard, error) {
	worktree = filepath.Clean(worktree)
	rt.mu.Lock()
	guard, ok := rt.guards[worktree]
	same := ok && rt.guardOpts[worktree].equal(opts)
	rt.mu.Unlock()
	if same {
		return guard, nil
	}
	guard, err := gitguard.New(gitguard.Config{
		Worktree:       worktree,
		StateDir:       filepath.Join(rt.cfg.RuntimeDir, "worktrees", pathKey(worktree)),
		Runner:         gitRunner{rt},
		KeepPaths:      opts.keepPaths,
		IncludeIgnored: opts.includeIgnored,
		KeepSnapshots:  rt.cfg.KeepSnapshots,
	})
	if err != nil {
		return nil, err
	}
	if err := guard.Register(ctx); err != nil {
		return nil, err
	}
	rt.mu.Lock()
	rt.guards[worktree] = guard
	rt.guardOpts[worktree] = opts
	rt.mu.Unlock()
	return guard, nil
}

// resolveBaseline resolves the announced baseline once, before the fence, or
// falls back to the baseline the worktree was last restored to (else HEAD).
//
// A revision that is not a commit there is the supervisor's mistake:
// BAD_REQUEST, and nothing is fenced. But the worktree may also fail to
// answer because the harness about to be fenced broke it (garbage in
// .git/config, .git replaced by a gitfile pointing elsewhere): that must not
// keep the abandoned generation alive. Then the revision is returned
// unresolved with deferred set: the fence still freezes, cuts and kills, and
// the restore resolves the revision itself after putting the pristine git
// metadata back, or fails closed (RESTORE_FAILED). The implicit HEAD is never
// deferred, as after the harness ran it may name the harness's own commit.
func (rt *Runtime) resolveBaseline(ctx context.Context, guard *gitguard.Guard, req api.StartRequest) (string, bool, error) {
	rev := req.Baseline
	if rev == "" {
		rt.mu.Lock()
		for _, g := range rt.gens {
			if g.spec.Worktree == req.Worktree && g.baseline != "" {
				rev = g.baseline
			}
		}
		rt.mu.Unlock()
	}
	implicit := rev == ""
	if implicit {
		rev = "HEAD"
	}
	commit, err := guard.ResolveBaseline(ctx, rev)
	if err == nil {
		return commit, false, nil
	}
	switch code := api.CodeOf(err); {
	case code == api.CodeBadRequest || code == api.CodeNotFound:
		return "", false, api.Errorf(api.CodeBadRequest, "baseline %q of worktree %s: %v", rev, req.Worktree, err)
	case implicit:
		return "", false, api.Errorf(code, "baseline HEAD of worktree %s (announce with --baseline): %v", req.Worktree, err)
	}
	rt.log.Warn("baseline not resolvable before the fence; the restore resolves it after putting the pristine git metadata back",
		"worktree", req.Worktree, "baseline", rev, "error", err)
	rt.audit.Record("baseline_deferred", req.Generation, map[string]any{"worktree": req.Worktree, "baseline": rev, "error": err.Error()}, true)
	return rev, true, nil
}

// settleBaseline turns a deferred baseline into the commit the fence's
// restore resolved it to; with nothing fenced, it resolves it now (no
// harness runs any more) or fails with the worktree's error.
func (rt *Runtime) settleBaseline(ctx context.Context, guard *gitguard.Guard, worktree, rev string, fenced []api.FenceReport) (string, error) {
	for i := len(fenced) - 1; i >= 0; i-- {
		if w, ok := fenced[i].Worktree.(*gitguard.Report); ok && w.Worktree == filepath.Clean(worktree) && w.Baseline != "" {
			return w.Baseline, nil
		}
	}
	if guard == nil {
		var err error
		if guard, err = rt.guardFor(ctx, worktree, guardOpts{}); err != nil {
			return "", err
		}
	}
	commit, err := guard.ResolveBaseline(ctx, rev)
	if err != nil {
		code := api.CodeOf(err)
		if code == api.CodeNotFound {
			code = api.CodeBadRequest
		}
		return "", api.Errorf(code, "baseline %q of worktree %s: %v", rev, worktree, err)
	}
	return commit, nil
}
