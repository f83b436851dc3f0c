package runtime

import (
	"context"
	"path/filepath"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitguard"
)

// A worktree is maintained only while nothing of its owner's that shim
// started can run: after a fence whose every run is confirmed (the older
// generations are dead, the new one is not started), or at a start that
// fenced nothing. The git that maintenance runs is gitguard's hardened git,
// serialised with every other git on that worktree.

// maintainAfterFence is the last step of a successful fence: every
// worktree it restored is maintained once (snapshot refs pruned beyond
// --keep-snapshots, never one whose generation is still known here;
// objects repacked), reported on the last run that restored it, and the
// runtime dir's records are pruned under the retention policy. A failed
// maintenance is reported and logged, never a failed fence: it removes only
// what nothing reaches.
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
		t := time.Now()
		ctx, cancel := context.WithTimeout(a.ctx, rt.cfg.RestoreTimeout)
		rep, err := wt.Maintain(ctx, rt.cfg.KeepSnapshots, rt.knownGeneration)
		cancel()
		f.rep.DurationsMS["maintain"] = ms(time.Since(t))
		if rep != nil {
			f.rep.Worktree.Maintenance = rep
		}
		if err != nil {
			rt.log.Warn("worktree maintenance failed; the fence goes on", "worktree", path, "error", err)
		}
		if w := f.rep.Worktree; w.Isolation == "layers" {
			rt.sealPacks(path, wt) // what the snapshot and the repack wrote
		}
		if rep != nil && (len(rep.SnapshotsPruned) > 0 || err != nil) {
			rt.audit.Record("worktree_maintained", f.g.n, map[string]any{"worktree": path, "snapshots_pruned": rep.SnapshotsPruned,
				"objects_pruned": rep.ObjectsPruned, "repack": rep.Repack, "error": rep.Error}, true)
		}
	}
	f := runs[len(runs)-1]
	t := time.Now()
	f.rep.RecordsPruned = rt.pruneRecords(a.kind == "start")
	f.rep.DurationsMS["retention"] = ms(time.Since(t))
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
