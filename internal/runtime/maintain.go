package runtime

import (
	"context"
	"path/filepath"
	"sync"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitguard"
)

// A layered worktree is maintained between fences, never inside one:
// after an announcement whose fence restored it is answered, in the
// background, while the new generation runs on its own layer (no harness
// writes the repository, the lower). The next announcement ends a
// maintenance still running (its git killed through its context) before
// its own restore, so a fence never waits for a repack, and never shares
// the disk with one. What it did is reported on the next fence that
// restores that worktree, and in the audit log. Its snapshot refs are
// pruned inside the fence, though (a few ref files, and a git only when
// a batch is due): a generation can build on any commit a ref or reflog
// of the lower names, and a repack beside it must not delete one; what
// was pruned before it started it cannot name. A worktree a harness
// writes itself (isolation scan) is maintained inside the fence, after
// the restore, while nothing of its owner's that shim started can run:
// a prune beside a live git could delete the objects it is writing.
// Either way: pruned are only snapshot refs beyond --keep-snapshots,
// never one whose generation is still known here, and what nothing
// reaches; the git is gitguard's hardened git, serialised with every
// other git on that worktree; a repack cut short leaves what it had not
// rolled up yet.

// maintenance is the background maintenance run of the last answered
// announcement, if any, and what each worktree's last one did.
type maintenance struct {
	mu      sync.Mutex
	cancel  context.CancelFunc // ends the run in flight; nil when none
	done    chan struct{}      // closed when the run in flight is over
	by      uint64             // the announcement that scheduled it
	reports map[string]*api.MaintenanceReport
}

// maintainAfterFence is the last step of a successful fence: the pending
// report of each worktree it restored goes into that restore's report,
// the packs the snapshot wrote are sealed, the worktrees are marked for
// maintenance once the announcement is answered (maintainLater), and the
// runtime dir's records are pruned under the retention policy.
func (rt *Runtime) maintainAfterFence(a *announcement, runs []*fenceRun, persistErr error) {
	if persistErr != nil || len(runs) == 0 {
		return
	}
	last := map[string]*fenceRun{}
	for _, f := range runs {
		if !f.stopped() {
			return // fail closed: the fence is not over
		}
		if w := f.rep.Worktree; w != nil && w.Worktree != "" {
			last[filepath.Clean(w.Worktree)] = f
		}
	}
	for path, f := range last {
		rt.mu.Lock()
		wt := rt.worktrees[path]
		rt.mu.Unlock()
		if wt == nil {
			continue
		}
		j := maintainJob{path: path, wt: wt, gen: f.g.n, layered: f.rep.Worktree.Isolation == "layers"}
		if !j.layered {
			t := time.Now()
			ctx, cancel := context.WithTimeout(a.ctx, rt.cfg.RestoreTimeout)
			f.rep.Worktree.Maintenance = rt.runMaintenance(ctx, j)
			cancel()
			f.rep.DurationsMS["maintain"] = ms(time.Since(t))
			continue
		}
		f.rep.Worktree.Maintenance = rt.maint.take(path)
		t := time.Now()
		rt.pruneSnapshots(a.ctx, j, f.rep.Worktree)
		f.rep.DurationsMS["prune_snapshots"] = ms(time.Since(t))
		rt.sealPacks(path, wt) // what the snapshot wrote
		a.maintain = append(a.maintain, j)
	}
	f := runs[len(runs)-1]
	t := time.Now()
	f.rep.RecordsPruned = rt.pruneRecords(a.kind == "start")
	f.rep.DurationsMS["retention"] = ms(time.Since(t))
}

// A maintainJob is one worktree to maintain after an answer.
type maintainJob struct {
	path    string
	wt      worktree
	gen     uint64 // the fenced generation whose restore it follows
	layered bool
}

// pruneSnapshots prunes a layered worktree's snapshot refs inside the
// fence, before the next generation starts (the objects go in the
// background maintenance after the answer), and adds what it pruned to
// the restore's report. A failure is logged and audited; the fence goes
// on (nothing is lost: the refs stay, and are pruned by a later fence).
func (rt *Runtime) pruneSnapshots(ctx context.Context, j maintainJob, w *api.WorktreeReport) {
	pctx, cancel := context.WithTimeout(ctx, rt.cfg.RestoreTimeout)
	rep, err := j.wt.PruneSnapshots(pctx, rt.cfg.KeepSnapshots, rt.knownGeneration)
	cancel()
	if err != nil {
		rt.log.Warn("pruning snapshot refs failed; the fence goes on", "worktree", j.path, "error", err)
	}
	if rep == nil || (len(rep.SnapshotsPruned) == 0 && err == nil) {
		return
	}
	if w.Maintenance == nil {
		w.Maintenance = &api.MaintenanceReport{DurationsMS: map[string]float64{}}
	}
	m := w.Maintenance
	m.SnapshotsPruned = append(m.SnapshotsPruned, rep.SnapshotsPruned...)
	m.SnapshotsKept = rep.SnapshotsKept
	if err != nil && m.Error == "" {
		m.Error = err.Error()
	}
	rt.audit.Record("worktree_maintained", j.gen, map[string]any{"worktree": j.path, "snapshots_pruned": rep.SnapshotsPruned,
		"objects_pruned": false, "error": rep.Error}, true)
}

// maintainLater starts announcement n's maintenance in the background
// (after its answer); the next announcement's fence ends it
// (stopMaintenance).
func (rt *Runtime) maintainLater(n uint64, jobs []maintainJob) {
	if len(jobs) == 0 {
		return
	}
	rt.stopMaintenance()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	rt.maint.mu.Lock()
	rt.maint.cancel, rt.maint.done, rt.maint.by = cancel, done, n
	rt.maint.mu.Unlock()
	go func() {
		defer close(done)
		defer cancel()
		for _, j := range jobs {
			rt.maintainOne(ctx, j)
		}
	}()
}

// maintainOne maintains one layered worktree in the background and keeps
// its report for the next fence that restores it.
func (rt *Runtime) maintainOne(ctx context.Context, j maintainJob) {
	t := time.Now()
	mctx, cancel := context.WithTimeout(ctx, rt.cfg.RestoreTimeout)
	rep := rt.runMaintenance(mctx, j)
	cancel()
	rep.DurationsMS["background"] = ms(time.Since(t))
	rep.Interrupted = ctx.Err() != nil // by the next fence: what it had not done waits for the next run
	rt.maint.mu.Lock()
	if rt.maint.reports == nil {
		rt.maint.reports = map[string]*api.MaintenanceReport{}
	}
	if prev := rt.maint.reports[j.path]; prev != nil {
		rep.SnapshotsPruned = append(prev.SnapshotsPruned, rep.SnapshotsPruned...) // none reported yet is lost
	}
	rt.maint.reports[j.path] = rep
	rt.maint.mu.Unlock()
}

// runMaintenance maintains one worktree: its report (never nil), the
// packs it wrote sealed, a failure logged, a pruning or failure audited.
// A layered worktree's refs were pruned in the fence (pruneSnapshots):
// here, beside the next generation, only objects go.
func (rt *Runtime) runMaintenance(ctx context.Context, j maintainJob) *api.MaintenanceReport {
	keep := rt.cfg.KeepSnapshots
	if j.layered {
		keep = 0
	}
	rep, err := j.wt.Maintain(ctx, keep, rt.knownGeneration)
	if rep == nil {
		rep = &api.MaintenanceReport{}
	}
	if rep.DurationsMS == nil {
		rep.DurationsMS = map[string]float64{}
	}
	if err != nil && rep.Error == "" {
		rep.Error = err.Error()
	}
	if err != nil && ctx.Err() == nil {
		rt.log.Warn("worktree maintenance failed; the fence goes on", "worktree", j.path, "error", err)
	}
	if j.layered && (rep.Repack != "" || err != nil) {
		// What the repack wrote, or may have before it failed (a
		// maintenance that wrote nothing leaves the packs as the fence
		// sealed them).
		rt.sealPacks(j.path, j.wt)
	}
	if len(rep.SnapshotsPruned) > 0 || err != nil {
		rt.audit.Record("worktree_maintained", j.gen, map[string]any{"worktree": j.path, "snapshots_pruned": rep.SnapshotsPruned,
			"objects_pruned": rep.ObjectsPruned, "repack": rep.Repack, "error": rep.Error, "interrupted": ctx.Err() != nil}, true)
	}
	return rep
}

// take returns (and forgets) the report of path's last maintenance.
func (m *maintenance) take(path string) *api.MaintenanceReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	rep := m.reports[path]
	delete(m.reports, path)
	return rep
}

// stopMaintenance ends the maintenance in flight, if any: its git is
// killed through its context, and it returns once the run is over (a
// kill, not a repack, is waited for).
func (rt *Runtime) stopMaintenance() {
	rt.maint.mu.Lock()
	cancel, done := rt.maint.cancel, rt.maint.done
	rt.maint.cancel, rt.maint.done = nil, nil
	rt.maint.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// knownGeneration reports whether generation n is still known here (live,
// or its fence pending): its snapshot is never pruned.
func (rt *Runtime) knownGeneration(n uint64) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	_, ok := rt.gens[n]
	return ok
}

// tidyWorktree removes what a killed git left in the announcement's
// worktree when no fence restored it (nothing older was live there), so the
// new harness's first git does not fail on a stale index.lock. It runs
// only once every older generation is dead (after fenceBelow succeeded).
func (rt *Runtime) tidyWorktree(a *announcement, wt worktree) error {
	cleaned, err := wt.Tidy(a.ctx)
	if len(cleaned) > 0 {
		a.cleaned = cleaned
		rt.log.Info("removed what a killed git left in the worktree", "worktree", a.worktree, "cleaned", cleaned)
		rt.audit.Record("worktree_tidied", a.n, map[string]any{"worktree": a.worktree, "cleaned": cleaned}, true)
	}
	return err
}

func (w *guardWorktree) Tidy(ctx context.Context) ([]string, error) { return w.g.Tidy(ctx) }

func (w *guardWorktree) Maintain(ctx context.Context, keep int, protect func(uint64) bool) (*api.MaintenanceReport, error) {
	return w.g.Maintain(ctx, gitguard.MaintainOptions{KeepSnapshots: keep, Protect: protect})
}

func (w *guardWorktree) PruneSnapshots(ctx context.Context, keep int, protect func(uint64) bool) (*api.MaintenanceReport, error) {
	return w.g.PruneSnapshots(ctx, gitguard.MaintainOptions{KeepSnapshots: keep, Protect: protect})
}
