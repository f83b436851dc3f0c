package runtime

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/errs"
)

// announcement is one start or fence request as the pipeline sees it.
type announcement struct {
	ctx      context.Context
	kind     string // "start", "fence" or "end"
	n        uint64
	hash     string // the start's identity ("" for a fence)
	worktree string
	baseline string // as announced: resolved only once the old generations are dead
	opts     worktreeOpts
	fetch    *fetchSpec
	arrived  time.Time
	// fresh: when it was admitted, shim had never seen a generation, so a
	// worktree registered for it is trusted (see openWorktree).
	fresh bool
	// ifCurrent: admitted only while the highest generation is this one.
	ifCurrent *uint64
	// force: an end of a generation never announced (NOT_ANNOUNCED
	// without it).
	force bool
	// refused: why the request cannot be carried out, found before
	// admission by checks no harness can sway (vetStart): refused in every
	// state, nothing fenced. shape: what is wrong with its worktree or
	// command (checkShape), which a live older generation may have caused:
	// refused before anything only when none is live (see admit).
	refused, shape error
	// cleaned: what tidyWorktree removed from the worktree's git dir.
	cleaned []string
	// held: the mount namespaces of the generations it fenced, let go
	// once it is answered (heldMounts).
	held []*heldMounts
	// prune: it fenced a generation with layers; older layers are
	// pruned once it is answered (pruneLayers).
	prune bool
	// maintain: the worktrees its fence restored, maintained once it is
	// answered (maintainLater).
	maintain []maintainJob
	// req is a start's request; early what of it began beside the fence
	// (startEarly); prep its records written in the fence's last batch
	// (endFence).
	req   *api.StartRequest
	early *earlyStart
	prep  *startRecords
}

// fetchSpec is an announcement's push check: the branch to fetch at the
// restore and the credentials that fetch may use (through the broker,
// never in git's environment).
type fetchSpec struct {
	Remote, Branch string
	Settle         time.Duration
	Continue       bool // start from the fetched commit when the remote moved
	Credentials    []creds.Credential
}

// maxSettle bounds FetchSpec.SettleMS.
const maxSettle = 10 * time.Minute

// Start announces generation req.Generation: it fences every older
// generation (steps 1-4) and then starts the new harness (step 5). Stale
// announcements are refused, an identical retry gets the first answer, and
// a different spec under the same number is a conflict.
func (rt *Runtime) Start(ctx context.Context, req api.StartRequest) (*api.StartResult, error) {
	if err := validateStart(&req); err != nil {
		return nil, err
	}
	if err := validGenerations(req.Generation, req.IfCurrent, req.Worktree); err != nil {
		return nil, err
	}
	fetch, err := fetchSpecOf(req.Fetch, req.Worktree, req.Credentials)
	if err != nil {
		return nil, err
	}
	a := &announcement{kind: "start", n: req.Generation, hash: specHash(req), worktree: req.Worktree,
		baseline: req.Baseline, fetch: fetch, arrived: time.Now(), ifCurrent: req.IfCurrent, req: &req,
		opts:    worktreeOpts{keepPaths: req.KeepPaths, includeIgnored: req.IncludeIgnored, remoteURLs: remoteURLs(req.Fetch)},
		refused: rt.vetStart(req), shape: rt.launch.checkShape(req)}
	done, replay, err := rt.admit(ctx, a)
	if replay != nil && req.LeaseMS > 0 {
		// Whoever retries is alive: the retry renews the lease.
		if _, err := rt.Renew(a.n, api.RenewRequest{LeaseMS: req.LeaseMS}); err != nil {
			rt.log.Debug("lease not renewed by the retry", "generation", a.n, "error", err)
		}
	}
	if replay != nil || err != nil {
		return replay, err
	}
	defer done()
	defer func() { rt.launch.dropEarly(a.early, a.n) }() // unless the start took it over
	refused := a.dropRefusedWorktree()
	fenced, err := rt.fenceBelow(a.ctx, a)
	if err == nil && refused != nil {
		err = rt.refusedAfterFence(a, refused, fenced)
	}
	if err != nil {
		return &api.StartResult{Generation: a.n, Fenced: fenced}, err
	}
	fenceMS := ms(time.Since(a.arrived))
	res, err := rt.startGeneration(a, req, fenced)
	if err != nil {
		return &api.StartResult{Generation: a.n, Fenced: fenced}, err
	}
	res.DurationsMS["fence"] = fenceMS
	rt.settleLater(a, fenced)
	return res, nil
}

// Fence fences every generation older than req.Generation and starts
// nothing; req.Generation becomes the lowest generation Start accepts.
func (rt *Runtime) Fence(ctx context.Context, req api.FenceRequest) (*api.FenceResult, error) {
	if req.Generation == 0 {
		return nil, errs.New(api.CodeBadRequest, "generation must be a positive integer")
	}
	if err := validGenerations(req.Generation, req.IfCurrent, req.Worktree); err != nil {
		return nil, err
	}
	if len(req.Credentials) > 0 && req.Fetch == nil {
		return nil, errs.New(api.CodeBadRequest, "a fence uses credentials only for its fetch; credentials need fetch")
	}
	if req.Worktree != "" && !filepath.IsAbs(req.Worktree) {
		return nil, errs.New(api.CodeBadRequest, "worktree must be an absolute path, not %q", req.Worktree)
	}
	if req.Baseline != "" && req.Worktree == "" {
		return nil, errs.New(api.CodeBadRequest, "baseline needs a worktree")
	}
	if req.Baseline != "" {
		if err := validRevision(req.Baseline); err != nil {
			return nil, err
		}
	}
	fetch, err := fetchSpecOf(req.Fetch, req.Worktree, req.Credentials)
	if err != nil {
		return nil, err
	}
	a := &announcement{kind: "fence", n: req.Generation, worktree: req.Worktree, baseline: req.Baseline,
		fetch: fetch, arrived: time.Now(), ifCurrent: req.IfCurrent,
		opts: worktreeOpts{keepPaths: req.KeepPaths, includeIgnored: req.IncludeIgnored, remoteURLs: remoteURLs(req.Fetch)}}
	if req.Worktree != "" {
		a.shape = rt.launch.checkShape(api.StartRequest{Worktree: req.Worktree})
	}
	done, _, err := rt.admit(ctx, a)
	if err != nil {
		return nil, err
	}
	defer done()
	refused := a.dropRefusedWorktree()
	fenced, err := rt.fenceBelow(a.ctx, a)
	if err == nil && refused != nil {
		err = rt.refusedAfterFence(a, refused, fenced)
	}
	rt.settleLater(a, fenced)
	return &api.FenceResult{Generation: a.n, Fenced: fenced}, err
}

// End fences generation req's n itself, and everything older, and starts
// nothing (see api.EndRequest).
func (rt *Runtime) End(ctx context.Context, n uint64, req api.EndRequest) (*api.FenceResult, error) {
	if n == 0 {
		return nil, errs.New(api.CodeBadRequest, "generation must be a positive integer")
	}
	if err := validGenerations(n, req.IfCurrent, ""); err != nil {
		return nil, err
	}
	a := &announcement{kind: "end", n: n, arrived: time.Now(), ifCurrent: req.IfCurrent, force: req.Force}
	done, _, err := rt.admit(ctx, a)
	if err != nil {
		return nil, err
	}
	defer done()
	fenced, err := rt.fenceBelow(a.ctx, a)
	return &api.FenceResult{Generation: a.n, Fenced: fenced}, err
}

// admit is the admission of every announcement, written once: refused
// while shutting down, below the token (STALE_GENERATION), or, for a start
// of the generation already started, answered with the first result
// (identical spec) or refused (GENERATION_CONFLICT). It takes the
// announcement lock; done releases it. It reads nothing from disk.
func (rt *Runtime) admit(ctx context.Context, a *announcement) (done func(), replay *api.StartResult, err error) {
	// A stale announcement is refused at once, not after the announcement
	// in flight (which holds the lock only while it fences: everything
	// older than it is frozen first, so waiting here keeps nothing alive).
	if err := rt.refuse(a); err != nil {
		return nil, nil, err
	}
	rt.announce.Lock()
	if err := rt.refuse(a); err != nil {
		rt.announce.Unlock()
		return nil, nil, err
	}
	rt.mu.Lock()
	if prev := rt.st.Started; a.kind == "start" && prev != nil && prev.Generation == a.n {
		if prev.SpecHash != a.hash {
			rt.mu.Unlock()
			rt.announce.Unlock()
			rt.audit.Record("announcement_refused", a.n, map[string]any{"code": api.CodeGenerationConflict}, true)
			return nil, nil, errs.New(api.CodeGenerationConflict,
				"generation %d was already started with a different spec; announce a higher generation", a.n)
		}
		res := rt.replayLocked(prev.Result)
		rt.mu.Unlock()
		rt.announce.Unlock()
		rt.audit.Record("announcement_retried", a.n, map[string]any{"state": res.State}, false)
		return nil, &res, nil
	}
	if a.ifCurrent != nil && *a.ifCurrent != rt.highest {
		highest := rt.highest
		rt.mu.Unlock()
		rt.announce.Unlock()
		rt.audit.Record(a.kind+"_refused", a.n, map[string]any{"code": api.CodeNotCurrent, "if_current": *a.ifCurrent, "highest": highest}, true)
		return nil, nil, errs.New(api.CodeNotCurrent,
			"generation %d was announced only if generation %d were the current one; the highest announced is %d", a.n, *a.ifCurrent, highest)
	}
	if err := a.refusal(rt.liveBelowLocked(a.n)); err != nil {
		rt.mu.Unlock()
		rt.announce.Unlock()
		rt.audit.Record(a.kind+"_refused", a.n, map[string]any{"code": api.CodeOf(err), "error": err.Error()}, true)
		return nil, nil, err
	}
	// The fence runs to its end even if the client goes away; only
	// Shutdown cancels it.
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rt.cancelAnnounce = cancel
	a.fresh = rt.neverSawAGenerationLocked()
	rt.mu.Unlock()
	a.ctx = actx
	return func() {
		rt.mu.Lock()
		rt.cancelAnnounce = nil
		rt.mu.Unlock()
		cancel()
		rt.released.later(a.held)
		rt.maintainLater(a.n, a.maintain)
		if a.prune {
			go rt.pruneLayers(a.n)
		}
		rt.announce.Unlock()
	}, nil, nil
}

// replayLocked is the answer to an identical retry of the start that
// answered first: that answer, marked replayed, with what became of the
// generation since (its state, its exit when it exited). rt.mu held.
func (rt *Runtime) replayLocked(first api.StartResult) api.StartResult {
	res := first
	res.Replayed = true
	if g, ok := rt.gens[first.Generation]; ok {
		res.State, res.Exit = g.apiState(), g.exit
		return res
	}
	var exit api.Exit
	if readJSON(filepath.Join(rt.genDir(first.Generation), "exit.json"), &exit) == nil {
		res.State, res.Exit = api.StateExited, &exit
		return res
	}
	res.State = api.GenGone // fenced and forgotten, or never recorded its exit
	return res
}

// refuse says why a may not be admitted now, or returns nil.
func (rt *Runtime) refuse(a *announcement) error {
	rt.mu.Lock()
	highest, down, ended := rt.highest, rt.shuttingDown, rt.st.Ended
	rt.mu.Unlock()
	if down {
		return errs.New(api.CodeShuttingDown, "shim is shutting down")
	}
	if a.kind == "start" && a.n == ended && a.n > 0 {
		rt.audit.Record("start_refused", a.n, map[string]any{"code": api.CodeStaleGeneration, "ended": ended}, true)
		return errs.New(api.CodeStaleGeneration, "generation %d was ended; announce a higher generation", a.n)
	}
	if a.kind == "end" && a.n > highest && !a.force {
		rt.audit.Record("end_refused", a.n, map[string]any{"code": api.CodeNotAnnounced, "highest": highest}, true)
		return errs.New(api.CodeNotAnnounced, "generation %d was never announced (the highest announced is %d): nothing was fenced; "+
			"to end every generation and move the token to %d all the same, say so (force, shim ctl end --force)", a.n, highest, a.n)
	}
	if a.n >= highest {
		return nil
	}
	rt.audit.Record(a.kind+"_refused", a.n, map[string]any{"code": api.CodeStaleGeneration, "highest": highest}, true)
	return staleError(a.n, highest)
}

// pruneLayers removes the layers of generations older than n beyond
// what --keep-layers and --keep-layers-bytes keep (never a live one's).
func (rt *Runtime) pruneLayers(n uint64) {
	if err := rt.layers.Prune(n, rt.keepLayer); err != nil {
		rt.log.Warn("layers not pruned", "below", n, "error", err)
	}
}

// startEarly begins a start's slow part beside its fence (the new
// generation's stub: launcher.startEarly) once every generation the
// fence ends is frozen, or dead already. A fence that fails (or fences
// nothing, with nothing to overlap) begins nothing.
func (rt *Runtime) startEarly(a *announcement, runs []*fenceRun) {
	if a.kind != "start" || len(runs) == 0 || a.shape != nil {
		return
	}
	for _, f := range runs {
		if !f.stopped() {
			return
		}
	}
	a.early = rt.launch.startEarly(*a.req)
}

// staleError is STALE_GENERATION for n below the token highest: whoever
// announced or leased n is superseded.
func staleError(n, highest uint64) error {
	return errs.New(api.CodeStaleGeneration, "generation %d is stale: generation %d has been announced", n, highest)
}

// startGeneration is step 5: the worktree's baseline (from the restore that
// just ran, or resolved now that nothing older runs), then the harness in a
// fresh cgroup with its own network and credentials.
func (rt *Runtime) startGeneration(a *announcement, req api.StartRequest, fenced []api.FenceReport) (*api.StartResult, error) {
	t := time.Now()
	baseline, reg, err := rt.prepareStart(a, &req, fenced)
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	if rt.shuttingDown {
		rt.mu.Unlock()
		return nil, errs.New(api.CodeShuttingDown, "shim is shutting down; generation %d was not started", a.n)
	}
	rt.starting = a.n
	rt.mu.Unlock()
	g, err := rt.launch.start(a.ctx, req, baseline, a.early)
	rt.mu.Lock()
	rt.starting = 0
	rt.mu.Unlock()
	if err != nil {
		rt.audit.Record("start_failed", a.n, map[string]any{"error": err.Error()}, true)
		rt.events.publish(api.EventFailed, a.n, &api.FailedData{Error: asAPIError(err)})
		return nil, err
	}
	startMS := ms(time.Since(t))
	for i := range fenced {
		fenced[i].DurationsMS["start"] = startMS
	}
	res := api.StartResult{
		Generation: g.n, Pid: g.pid, Cgroup: g.group.Path(), StartedAt: g.started, Fenced: fenced,
		Baseline: baseline, Worktree: reg, WorktreeCleaned: a.cleaned,
		DurationsMS: map[string]float64{"start": startMS, "total": ms(time.Since(a.arrived))},
	}
	if g.net != nil {
		info := g.net.Info()
		res.Network = &info
	}

	rt.mu.Lock()
	rt.move(g, stRunning)
	if d, _ := leaseOf(req.LeaseMS); d > 0 {
		rt.armLeaseLocked(g, d)
	}
	if a.worktree != "" {
		rt.baselines[filepath.Clean(a.worktree)] = baseline
	}
	rt.gens[g.n] = g
	rt.current = g
	rt.st.Started = &startedRecord{Generation: g.n, SpecHash: a.hash, Result: res}
	// The harness runs: its output may fill the runtime dir's filesystem
	// before these records are written, and the reserve is the next
	// fence's, not theirs. Its generation.json and state.json are one
	// fsync batch, after the harness's exec (not in its way); the audit
	// record follows them.
	var records durableBatch
	if g.dir != "" {
		rt.putGenerationRecord(&records, g)
	}
	rt.reserve.spare(func() { err = rt.saveWithLocked(&records) })
	rt.mu.Unlock()
	go rt.watch(g)
	if err != nil {
		// The harness runs and the token is durable; only the answer to an
		// identical retry is not (a retry after a restart is a conflict).
		rt.log.Error("start result not persisted", "generation", g.n, "error", err)
	}
	rt.reserve.spare(func() {
		rt.audit.Record("generation_started", g.n, map[string]any{
			"pid": g.pid, "cgroup": g.group.Path(), "network": req.Network, "labels": req.Labels, "command": req.Command,
		}, true)
	})
	rt.events.publish(api.EventStarted, g.n, &api.StartedData{PID: g.pid})
	rt.log.Info("generation started", "generation", g.n, "pid", g.pid, "cgroup", g.group.Path())
	return &res, nil
}

// prepareStart is what a start needs before its harness: the baseline its
// worktree starts from (on its branch when asked), the runtime dir's
// reserve, and the hand-off of what the previous generation abandoned in
// req.Env. A failure is audited (start_failed).
func (rt *Runtime) prepareStart(a *announcement, req *api.StartRequest, fenced []api.FenceReport) (baseline string, reg *api.Registration, err error) {
	baseline, reg, err = rt.baselineFor(a, fenced)
	if err != nil {
		rt.audit.Record("start_failed", a.n, map[string]any{"error": err.Error()}, true)
		rt.events.publish(api.EventFailed, a.n, &api.FailedData{Error: asAPIError(err)})
		return "", nil, err
	}
	if req.Branch != "" {
		if err := rt.putOnBranch(a, req.Branch, baseline); err != nil {
			rt.audit.Record("start_failed", a.n, map[string]any{"error": err.Error()}, true)
			return "", nil, err
		}
	}
	if !rt.reserve.ensure() {
		err := errs.New(api.CodeStartFailed, "the runtime dir's filesystem has no room for shim's reserve (%d bytes): "+
			"generation %d is not started, so that the next fence can still persist its token; free space in %s", rt.cfg.Reserve, a.n, rt.cfg.RuntimeDir)
		rt.audit.Record("start_failed", a.n, map[string]any{"error": err.Error()}, true)
		return "", nil, err
	}
	// The generation's dir and its hand-off, durable before anything of n
	// runs: made in the fence's last batch (endFence), or here.
	prep := a.prep
	if prep == nil {
		var names durableBatch
		if prep = rt.putStartRecords(a.n, req.Env, req.User, fenced, &names); prep.err == nil {
			names.commit()
			prep.durable(&names)
		}
	}
	if prep.err != nil {
		return "", nil, rt.startFailed(a.n, prep.err)
	}
	req.Env = prep.env
	return baseline, reg, nil
}

// startRecords are what a start writes before its harness runs: its
// generation's dir, the hand-off of the generation before it, and the
// harness's environment that names it.
type startRecords struct {
	env  []string
	dirs []string // the dirs whose entries must be durable: gen/, handoff/
	err  error    // START_FAILED: the start does not go on
}

// putStartRecords makes generation n's dir and writes its hand-off
// (withHandoff), both made durable with records.
func (rt *Runtime) putStartRecords(n uint64, env []string, user string, fenced []api.FenceReport, records *durableBatch) *startRecords {
	dir := rt.genDir(n)
	p := &startRecords{dirs: []string{filepath.Dir(dir), filepath.Join(rt.cfg.RuntimeDir, "handoff")}}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		p.err = errs.New(api.CodeStartFailed, "generation dir: %v", err)
		return p
	}
	records.syncDir(filepath.Dir(dir)) // its records' files are synced with their dir, this dir with its parent
	p.env, p.err = rt.withHandoff(env, n, user, fenced, records)
	return p
}

// durable checks, once records are committed, that p's records are.
func (p *startRecords) durable(records *durableBatch) {
	for _, dir := range p.dirs {
		if err := records.errorUnder(dir); err != nil && p.err == nil {
			p.err = errs.New(api.CodeStartFailed, "the generation's dir or hand-off is not durable: %v", err)
		}
	}
}

// startFailed audits and publishes a start that failed before its harness.
func (rt *Runtime) startFailed(n uint64, err error) error {
	rt.audit.Record("start_failed", n, map[string]any{"error": err.Error()}, true)
	rt.events.publish(api.EventFailed, n, &api.FailedData{Error: asAPIError(err)})
	return err
}

// baselineFor is the commit the new generation's worktree starts from: the
// one the fence's restore of that worktree resolved, else the announced
// revision (or the worktree's last baseline, or HEAD) resolved now.
func (rt *Runtime) baselineFor(a *announcement, fenced []api.FenceReport) (string, *api.Registration, error) {
	if a.worktree == "" {
		return "", nil, nil
	}
	for i := len(fenced) - 1; i >= 0; i-- {
		if w := fenced[i].Worktree; w != nil && w.Worktree == filepath.Clean(a.worktree) && w.Baseline != "" {
			return w.Baseline, w.Registration, nil
		}
	}
	wt, err := rt.openWorktree(a.ctx, a.worktree, a.opts, !a.fresh || len(fenced) > 0)
	if err != nil {
		return "", nil, restoreFailed(err, fenced, "worktree %s", a.worktree)
	}
	if err := rt.tidyWorktree(a, wt); err != nil {
		return "", nil, restoreFailed(err, fenced, "worktree %s", a.worktree)
	}
	rev := a.baseline
	if rev == "" {
		rev = rt.lastBaseline(a.worktree)
	}
	if rev == "" {
		rev = "HEAD"
	}
	commit, err := wt.ResolveBaseline(a.ctx, rev)
	if err != nil {
		return "", nil, restoreFailed(err, fenced, "baseline %q of worktree %s", rev, a.worktree)
	}
	reg := wt.Registration()
	return commit, &reg, nil
}

// lastBaseline is the baseline the worktree's latest generation started
// from, "" when none did.
func (rt *Runtime) lastBaseline(worktree string) string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.baselines[filepath.Clean(worktree)]
}

// fetchSpecOf checks an announcement's fetch and turns it, with the
// announcement's credentials, into the restore's. A fetch needs a worktree.
func fetchSpecOf(f *api.FetchSpec, worktree string, cs []api.Credential) (*fetchSpec, error) {
	if f == nil {
		return nil, nil
	}
	if worktree == "" {
		return nil, errs.New(api.CodeBadRequest, "fetch needs a worktree")
	}
	if f.SettleMS < 0 || time.Duration(f.SettleMS)*time.Millisecond > maxSettle {
		return nil, errs.New(api.CodeBadRequest, "fetch settle_ms must be between 0 and %d", maxSettle.Milliseconds())
	}
	spec := &fetchSpec{Remote: f.Remote, Branch: f.Branch, Settle: time.Duration(f.SettleMS) * time.Millisecond, Continue: f.Continue}
	if err := validFetchNames(f.Remote, f.Branch); err != nil {
		return nil, err
	}
	var err error
	if spec.Credentials, err = credsOf(cs); err != nil {
		return nil, err
	}
	return spec, nil
}

// remoteURLs is what a late registration takes the remote's URL from.
func remoteURLs(f *api.FetchSpec) map[string]string {
	if f == nil || f.RemoteURL == "" {
		return nil
	}
	name := f.Remote
	if name == "" {
		name = "origin"
	}
	return map[string]string{name: f.RemoteURL}
}

// credsOf turns API credentials into the broker's, validated (the
// broker's errors never quote a value).
func credsOf(cs []api.Credential) ([]creds.Credential, error) {
	out := make([]creds.Credential, 0, len(cs))
	for i, c := range cs {
		cc := creds.Credential{Protocol: c.Protocol, Host: c.Host, Path: c.Path, Username: c.Username, Password: c.Password}
		if err := cc.Validate(); err != nil {
			return nil, errs.New(api.CodeBadRequest, "credential %d: %v", i, err)
		}
		out = append(out, cc)
	}
	return out, nil
}

// putOnBranch puts the announcement's worktree, at its baseline, on the
// branch the announcement names.
func (rt *Runtime) putOnBranch(a *announcement, branch, baseline string) error {
	wt, err := rt.openWorktree(a.ctx, a.worktree, a.opts, true)
	if err != nil {
		return err
	}
	if err := wt.PutOnBranch(a.ctx, branch, baseline); err != nil {
		return errs.New(api.CodeOf(err), "worktree %s on branch %s: %v", a.worktree, branch, err)
	}
	return nil
}
