package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/gitguard"
	"github.com/shimdev/shim/internal/reaper"
)

// openWorktree registers the worktree at path with gitguard (once) and
// returns it; every git it runs goes through gitRunner.
func (l *launcher) openWorktree(ctx context.Context, path string, o worktreeOpts) (worktree, error) {
	guard, err := gitguard.New(gitguard.Config{
		Worktree:       path,
		StateDir:       filepath.Join(l.cfg.RuntimeDir, "worktrees", pathKey(path)),
		Runner:         gitRunner{l},
		KeepPaths:      o.keepPaths,
		IncludeIgnored: o.includeIgnored,
		KeepSnapshots:  l.cfg.KeepSnapshots,
	})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, l.cfg.GitTimeout)
	defer cancel()
	if err := guard.Register(rctx); err != nil {
		return nil, err
	}
	return &guardWorktree{g: guard, l: l, reg: api.Registration{Worktree: path, Late: o.late}}, nil
}

// guardWorktree is a gitguard.Guard as the runtime's worktree.
type guardWorktree struct {
	g   *gitguard.Guard
	l   *launcher
	reg api.Registration
}

func (w *guardWorktree) Registration() api.Registration { return w.reg }

func (w *guardWorktree) Restore(ctx context.Context, gen uint64, rev string, fetch *fetchSpec) (*api.WorktreeReport, error) {
	var opts []gitguard.RestoreOption
	if fetch != nil {
		opts = append(opts, gitguard.WithFetch(gitguard.FetchSpec{Remote: fetch.Remote, Branch: fetch.Branch, Credentials: fetch.Credentials}))
	}
	rep, err := w.g.Restore(ctx, gen, rev, opts...)
	var out *api.WorktreeReport
	if rep != nil {
		out = &api.WorktreeReport{}
		convert(rep, out)
		out.BaselineRev = rev
		reg := w.reg
		out.Registration = &reg
	}
	return out, err
}

func (w *guardWorktree) RemoteHead(ctx context.Context, first api.FetchReport, fetch *fetchSpec) (string, error) {
	return "", fmt.Errorf("not yet")
}

func (w *guardWorktree) ResolveBaseline(ctx context.Context, rev string) (string, error) {
	return w.g.ResolveBaseline(ctx, rev)
}

func (w *guardWorktree) List(ctx context.Context) ([]api.Snapshot, error) {
	list, err := w.g.List(ctx)
	var out []api.Snapshot
	convert(list, &out)
	return out, err
}

func (w *guardWorktree) Show(ctx context.Context, gen uint64) (api.Snapshot, error) {
	s, err := w.g.Show(ctx, gen)
	var out api.Snapshot
	convert(s, &out)
	return out, err
}

// convert copies a gitguard report into its api twin: the api types carry
// the same JSON fields, so the wire format is gitguard's.
func convert(from, to any) {
	b, err := json.Marshal(from)
	if err == nil {
		_ = json.Unmarshal(b, to)
	}
}

// validFetchNames checks a fetch's remote and branch names.
func validFetchNames(remote, branch string) error {
	if err := (gitguard.FetchSpec{Remote: remote, Branch: branch}).Validate(); err != nil {
		return api.Errorf(api.CodeBadRequest, "%v", err)
	}
	return nil
}

// gitRunner runs gitguard's git commands through the one reaper, in a
// throwaway cgroup that is killed afterwards and, where the sandbox allows,
// in an empty network namespace. It is a gitguard.NetworkRunner: the one git
// that fetches at a fence (RunWithNetwork) keeps shim's network, and only
// that one.
type gitRunner struct{ l *launcher }

// Run runs git without network where the sandbox allows it.
func (r gitRunner) Run(ctx context.Context, cmd *exec.Cmd) error { return r.run(ctx, cmd, false) }

// RunWithNetwork runs git in shim's own network namespace (the fetch).
func (r gitRunner) RunWithNetwork(ctx context.Context, cmd *exec.Cmd) error {
	return r.run(ctx, cmd, true)
}

func (r gitRunner) run(ctx context.Context, cmd *exec.Cmd, network bool) error {
	l, rt := r.l, r.l.rt
	l.prepare()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if l.newNetForGit && !network {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNET
	}
	var group cgroup.Group
	if l.cfg.Cgroups.Mode() != cgroup.ModePidns {
		rt.mu.Lock()
		rt.gitSeq++
		name := fmt.Sprintf("git-%d", rt.gitSeq)
		rt.mu.Unlock()
		g, err := l.cfg.Cgroups.Create(name, cgroup.Limits{})
		if err != nil {
			return fmt.Errorf("git cgroup: %w", err)
		}
		group = g
		defer func() {
			kctx, cancel := context.WithTimeout(context.Background(), l.cfg.KillTimeout)
			defer cancel()
			if _, err := g.Kill(kctx); err == nil {
				g.Remove()
			} else {
				rt.log.Error("git cgroup not emptied", "cgroup", g.Path(), "error", err)
			}
		}()
	}
	return l.cfg.Reaper.Run(ctx, cmd, func(c *exec.Cmd) (*reaper.Process, error) { return l.spawn(c, group) })
}
