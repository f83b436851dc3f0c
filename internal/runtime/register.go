package runtime

import (
	"context"
	"path/filepath"
	"slices"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// Worktrees: their registration (the trusted state a fence restores to)
// and opening a registered one.

// openWorktree returns the worktree's guard, registering it on first use.
// Registration takes the trusted copy of its git metadata; it is trusted
// only when nothing can have written the worktree before (late false: shim
// init --worktree, shim ctl register, or the first announcement of a shim
// that never saw a generation, fencing none). Otherwise the trusted config
// is built from a minimal safe set (api.Registration says what was dropped).
func (rt *Runtime) openWorktree(ctx context.Context, path string, o worktreeOpts, late bool) (worktree, error) {
	path = filepath.Clean(path)
	rt.mu.Lock()
	wt, ok := rt.worktrees[path]
	same := ok && rt.worktreeOpts[path].equal(o)
	o.late = late
	if !late {
		o.remoteURLs = nil // a trusted registration keeps the config's own
	}
	rt.mu.Unlock()
	if same {
		return wt, nil
	}
	wt, err := rt.launch.openWorktree(ctx, path, o)
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	rt.worktrees[path] = wt
	rt.worktreeOpts[path] = o
	rt.mu.Unlock()
	if reg := wt.Registration(); !ok {
		rt.audit.Record("worktree_registered", 0, map[string]any{"worktree": path, "late": reg.Late, "dropped": reg.Dropped}, true)
		if reg.Late {
			rt.log.Warn("worktree registered late: its trusted config is a minimal safe set", "worktree", path, "dropped", reg.Dropped)
		}
	}
	return wt, nil
}

// Register registers a worktree before any harness runs there (shim init
// --worktree, shim ctl register): the one trusted registration.
func (rt *Runtime) Register(ctx context.Context, req api.RegisterRequest) (api.Registration, error) {
	if req.Worktree == "" || !filepath.IsAbs(req.Worktree) {
		return api.Registration{}, errs.New(api.CodeBadRequest, "worktree must be an absolute path, not %q", req.Worktree)
	}
	rt.announce.Lock()
	defer rt.announce.Unlock()
	rt.mu.Lock()
	late := !rt.neverSawAGenerationLocked()
	live := 0
	for _, g := range rt.gens {
		if g.state != stEmptied && g.state != stQuiesced {
			live++
		}
	}
	rt.mu.Unlock()
	if live > 0 {
		// Registering runs git as the worktree's owner: with a harness of
		// that uid alive it could stop that git (holding the announcement
		// lock) or take it over. An announcement naming the worktree
		// registers it after the fence instead.
		return api.Registration{}, errs.New(api.CodeGenerationLive,
			"a generation is live: register at sandbox setup, or name the worktree in the next announcement (it is registered once the older generations are dead)")
	}
	wt, err := rt.openWorktree(ctx, req.Worktree, worktreeOpts{keepPaths: req.KeepPaths, includeIgnored: req.IncludeIgnored}, late)
	if err != nil {
		return api.Registration{}, err
	}
	return wt.Registration(), nil
}

// neverSawAGenerationLocked reports whether no harness can have run in this
// sandbox as far as shim knows: no token, no generation history in the
// runtime dir, none adopted or started. rt.mu held.
func (rt *Runtime) neverSawAGenerationLocked() bool {
	return rt.highest == 0 && !rt.history && len(rt.gens) == 0 && rt.current == nil
}

func (o worktreeOpts) equal(p worktreeOpts) bool {
	return o.includeIgnored == p.includeIgnored && slices.Equal(o.keepPaths, p.keepPaths)
}
