package runtime

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/gitguard"
	"github.com/shimdev/shim/internal/network"
	"github.com/shimdev/shim/internal/reaper"
)

// openWorktree registers the worktree at path with gitguard (once: a
// registered worktree keeps its first registration) and returns it; every
// git it runs goes through gitRunner.
func (l *launcher) openWorktree(ctx context.Context, path string, o worktreeOpts) (worktree, error) {
	view, err := l.lockLower(path)
	if err != nil {
		return nil, err
	}
	guard, err := gitguard.New(gitguard.Config{
		Worktree:       path,
		View:           view,
		ViewGroup:      l.lowerGroup(),
		StateDir:       filepath.Join(l.cfg.RuntimeDir, "worktrees", pathKey(path)),
		Runner:         gitRunner{l},
		KeepPaths:      o.keepPaths,
		IncludeIgnored: o.includeIgnored,
		// Snapshots are pruned by the maintenance after the fence
		// (maintain.go), in batches, with their objects.
		KeepSnapshots: 0,
		GitTimeout:    l.cfg.GitTimeout,
	})
	if err != nil {
		return nil, err
	}
	rr, err := guard.RegisterWith(ctx, gitguard.RegisterOptions{Late: o.late, RemoteURLs: o.remoteURLs})
	if err != nil {
		return nil, err
	}
	return &guardWorktree{g: guard, l: l,
		reg: api.Registration{Worktree: path, Late: rr.Late, Dropped: rr.Dropped, RegisteredAt: time.Now().UTC()}}, nil
}

// lockLower locks the lower of a worktree that generations get layers on
// (layers.LockLower) before anything of it is registered, and returns the
// view shim works through; "" where generations run on the worktree
// itself (the scan) or its repository lives elsewhere (no layer).
func (l *launcher) lockLower(path string) (string, error) {
	l.prepare() // the isolation probe
	if !l.rt.layered() {
		return "", nil
	}
	if st, err := os.Lstat(filepath.Join(path, ".git")); err != nil || !st.IsDir() {
		return "", nil // no layer: gitguard says why it refuses, or the scan restores it
	}
	view, err := l.rt.layers.LockLower(path)
	if err != nil {
		return "", errs.New(api.CodeWorktreeRefused, "the checkout %s cannot be made read-only for harnesses (its generations' lower): %v", path, err)
	}
	return view, nil
}

// lowerGroup is the group of shim's gits that may enter the locked
// lowers' views (0 without layers).
func (l *launcher) lowerGroup() uint32 {
	if l.rt.layers == nil {
		return 0
	}
	return l.rt.layers.LowerGroup()
}

// guardWorktree is a gitguard.Guard as the runtime's worktree.
type guardWorktree struct {
	g   *gitguard.Guard
	l   *launcher
	reg api.Registration
}

func (w *guardWorktree) Registration() api.Registration { return w.reg }

func (w *guardWorktree) Restore(ctx context.Context, gen uint64, rev string, fetch *fetchSpec) (*api.WorktreeReport, error) {
	return w.restore(ctx, gen, rev, fetch)
}

func (w *guardWorktree) PutOnBranch(ctx context.Context, branch, commit string) error {
	return w.g.PutOnBranch(ctx, branch, commit)
}

func (w *guardWorktree) Move(ctx context.Context, gen uint64, rev string, fetch *fetchSpec) (*api.WorktreeReport, error) {
	return w.restore(ctx, gen, rev, fetch, gitguard.WithSavedSnapshot())
}

func (w *guardWorktree) restore(ctx context.Context, gen uint64, rev string, fetch *fetchSpec, opts ...gitguard.RestoreOption) (*api.WorktreeReport, error) {
	if fetch != nil {
		auth, done := w.l.fetchAuth(fetch)
		defer done()
		opts = append(opts, gitguard.WithFetch(gitguard.FetchSpec{Remote: fetch.Remote, Branch: fetch.Branch, Auth: auth}))
	}
	rep, err := w.g.Restore(ctx, gen, rev, opts...)
	if rep == nil {
		return nil, err
	}
	return w.report(rep), err
}

func (w *guardWorktree) SnapshotLayer(ctx context.Context, gen uint64, baseline, upper string) (*api.WorktreeReport, error) {
	rep, err := w.g.SnapshotLayer(ctx, gen, baseline, upper)
	if rep == nil {
		return nil, err
	}
	return w.report(rep), err
}

// report is a restore's report with the worktree's registration; a copy,
// so nothing of gitguard's is changed, and paths an empty list, not null.
func (w *guardWorktree) report(rep *gitguard.Report) *api.WorktreeReport {
	out := *rep
	if out.Paths == nil {
		out.Paths = []api.PathChange{}
	}
	reg := w.reg
	out.Registration = &reg
	return &out
}

func (w *guardWorktree) SnapshotIs(ctx context.Context, gen uint64, commit string) bool {
	return w.g.SnapshotIs(ctx, gen, commit)
}

func (w *guardWorktree) VerifyLower(ctx context.Context) ([]string, error) {
	return w.g.VerifyLower(ctx)
}

func (w *guardWorktree) ForgetKnown() { w.g.ForgetKnown() }

func (w *guardWorktree) LayerCapable() bool { return w.g.GitDirInside() }

func (w *guardWorktree) SealPacks() error { return w.g.SealPacks() }

func (w *guardWorktree) RemoteHead(ctx context.Context, first api.FetchReport, fetch *fetchSpec) (string, error) {
	auth, done := w.l.fetchAuth(fetch)
	defer done()
	return w.g.RemoteHead(ctx, first.URL, first.Branch, auth)
}

func (w *guardWorktree) ResolveBaseline(ctx context.Context, rev string) (string, error) {
	return w.g.ResolveBaseline(ctx, rev)
}

func (w *guardWorktree) List(ctx context.Context) ([]api.Snapshot, error) {
	list, err := w.g.List(ctx)
	if list == nil {
		list = []api.Snapshot{}
	}
	return list, err
}

func (w *guardWorktree) Show(ctx context.Context, gen uint64) (api.Snapshot, error) {
	s, err := w.g.Show(ctx, gen)
	if s == nil {
		return api.Snapshot{}, err
	}
	return *s, err
}

// fetchAuth lets shim's own fetching git ask the broker for the
// announcement's credentials, as a harness's git does: the secret goes from
// the broker to git-remote-http over cred.sock, never through an
// environment or argv. The grant is keyed by a number no generation has
// and answered only to the git cgroup that runs the fetch (gitRunner with
// network); done revokes it.
func (l *launcher) fetchAuth(fetch *fetchSpec) (*gitguard.FetchAuth, func()) {
	rt := l.rt
	rt.mu.Lock()
	b := rt.broker
	if b == nil || len(fetch.Credentials) == 0 {
		rt.mu.Unlock()
		return nil, func() {}
	}
	rt.fetchSeq++
	key := fetchKeyBase + rt.fetchSeq
	rt.fetchKey = key
	rt.mu.Unlock()
	b.Grant(key, fetch.Credentials)
	list := fetch.Credentials
	auth := &gitguard.FetchAuth{
		Has: func(protocol, host, path, user string) bool {
			_, ok := creds.Match(list, protocol, host, path, user)
			return ok
		},
		Helper: creds.HelperCommand(l.cfg.ShimPath),
		Env: []string{creds.EnvCredSock + "=" + filepath.Join(l.cfg.RuntimeDir, "cred.sock"),
			envFetchGrant + "=" + strconv.FormatUint(key, 10)},
	}
	return auth, func() {
		b.Revoke(key)
		rt.mu.Lock()
		if rt.fetchKey == key {
			rt.fetchKey = 0
		}
		rt.mu.Unlock()
	}
}

// envFetchGrant names, in the fetching git's environment, the broker key
// of its own fetch (a number, not a secret): gitRunner binds that git's
// cgroup to it, so two fetches at once (a restore's and a settle re-check)
// each get their own grant.
const envFetchGrant = "SHIM_FETCH_GRANT"

// fetchGrantOf is the fetch key a git's environment names, 0 when none.
func fetchGrantOf(env []string) uint64 {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, envFetchGrant+"="); ok {
			if n, err := strconv.ParseUint(v, 10, 64); err == nil && n > fetchKeyBase {
				return n
			}
		}
	}
	return 0
}

// fetchKeyBase numbers the broker grants of shim's own fetches, above any
// generation an announcement can name in practice (2^63).
const fetchKeyBase = uint64(1) << 63

// validFetchNames checks a fetch's remote and branch names.
func validFetchNames(remote, branch string) error {
	if err := (gitguard.FetchSpec{Remote: remote, Branch: branch}).Validate(); err != nil {
		return errs.New(api.CodeBadRequest, "%v", err)
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
	l.prepare() // decides the owner guard: a git built before it gets the guard's capabilities now
	if c := cmd.SysProcAttr; c != nil && c.Credential != nil && c.Credential.Uid != 0 {
		c.AmbientCaps = gitguard.OwnerCaps()
	}
	if err := outOfReach(cmd); err != nil {
		return err
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	spawn := l.spawn
	switch {
	case network || !l.newNetForGit:
	case l.gitNet != nil:
		spawn = spawnIn(l.gitNet, l.spawn)
	default:
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNET
	}
	var group cgroup.Group
	if l.rt.groups.Mode() != cgroup.ModePidns {
		rt.mu.Lock()
		rt.gitSeq++
		name := fmt.Sprintf("git-%d", rt.gitSeq)
		rt.mu.Unlock()
		g, err := l.rt.groups.Create(name, cgroup.Limits{})
		if err != nil {
			return fmt.Errorf("git cgroup: %w", err)
		}
		group = g
		if network {
			// The fetching git (and the helper it runs) may ask the broker
			// for the fetch's grant, and only while it runs.
			if key := fetchGrantOf(cmd.Env); key != 0 {
				rt.mu.Lock()
				rt.gitGrants[name] = key
				rt.mu.Unlock()
			}
			defer func() {
				rt.mu.Lock()
				delete(rt.gitGrants, name)
				rt.mu.Unlock()
			}()
		}
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
	return l.cfg.Reaper.Run(ctx, cmd, func(c *exec.Cmd) (*reaper.Process, error) { return spawn(c, group) })
}

// outOfReach is the rule of docs/layers.md, "The lower's trust": no
// process shim starts as a harness's uid outside a generation is within
// that harness's reach. A git to run as another uid than root must hold
// gitguard.OwnerCaps; one that does not is refused, not run.
func outOfReach(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil || cmd.SysProcAttr.Credential == nil {
		return nil
	}
	c := cmd.SysProcAttr.Credential
	if !gitguard.OwnerProtected(c.Uid, cmd.SysProcAttr.AmbientCaps) {
		return errs.New(api.CodeInternal, "git as uid %d would be within reach of a harness of that uid and was not run: "+
			"shim needs CAP_NET_BIND_SERVICE or CAP_AUDIT_WRITE to put its gits out of that reach (it has %v)", c.Uid, gitguard.OwnerCaps())
	}
	return nil
}

// spawnIn is spawn, forking in network n (its namespace).
func spawnIn[P any](n *network.Network, spawn func(*exec.Cmd, cgroup.Group) (P, error)) func(*exec.Cmd, cgroup.Group) (P, error) {
	return func(c *exec.Cmd, g cgroup.Group) (p P, err error) {
		rerr := n.Run(func() error {
			p, err = spawn(c, g)
			return nil
		})
		if err == nil {
			err = rerr
		}
		return p, err
	}
}
