package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/reaper"
)

// The fakes below stand in for the kernel and git so that every decision
// of the runtime is tested in milliseconds, without root. Each fake
// appends what it was asked to one shared journal, so tests assert order.

type journal struct {
	mu    sync.Mutex
	lines []string
}

func (j *journal) add(format string, args ...any) {
	j.mu.Lock()
	j.lines = append(j.lines, fmt.Sprintf(format, args...))
	j.mu.Unlock()
}

func (j *journal) all() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.lines...)
}

// index is the position of the first line starting with prefix, or -1.
func (j *journal) index(prefix string) int {
	for i, l := range j.all() {
		if strings.HasPrefix(l, prefix) {
			return i
		}
	}
	return -1
}

// fakeGroup is a cgroup whose processes are fake harnesses.
type fakeGroup struct {
	name string
	j    *journal
	mu   sync.Mutex
	proc *fakeProc
	// Set by tests: what Freeze and Kill return (nil: success), and hooks
	// that run inside them.
	freezeErr, killErr, thawErr error
	onFreeze, onKill            func()
	frozen, removed             bool
	freezeCalls, kills          int
	removeCalls                 int
}

func (g *fakeGroup) Name() string                { return g.name }
func (g *fakeGroup) Path() string                { return "/fake/" + g.name }
func (g *fakeGroup) CloneFD() (int, bool, error) { return -1, false, nil }
func (g *fakeGroup) Add(int) error               { return nil }
func (g *fakeGroup) Procs() ([]int, error)       { return nil, nil }
func (g *fakeGroup) Populated() (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.removed, nil
}
func (g *fakeGroup) WaitEmpty(context.Context) error { return nil }

func (g *fakeGroup) Freeze(ctx context.Context) error {
	g.j.add("freeze %s", g.name)
	g.mu.Lock()
	g.freezeCalls++
	hook, err := g.onFreeze, g.freezeErr
	g.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err == nil {
		g.mu.Lock()
		g.frozen = true
		g.mu.Unlock()
	}
	return err
}

func (g *fakeGroup) Kill(ctx context.Context) (cgroup.KillResult, error) {
	g.j.add("kill %s", g.name)
	g.mu.Lock()
	g.kills++
	hook, err := g.onKill, g.killErr
	g.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err != nil {
		return cgroup.KillResult{Killed: 3, Survivors: 1}, err
	}
	if g.proc != nil {
		g.proc.exit(137)
	}
	return cgroup.KillResult{Killed: 3}, nil
}

func (g *fakeGroup) Thaw(context.Context) error {
	g.j.add("thaw %s", g.name)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.frozen = false
	return g.thawErr
}

func (g *fakeGroup) Remove() error {
	g.j.add("remove %s", g.name)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.removeCalls++
	g.removed = true
	return nil
}

// fakeProc is a harness: it exits when its group is killed or the test
// says so.
type fakeProc struct {
	once sync.Once
	done chan struct{}
	e    reaper.Exit
}

func newFakeProc() *fakeProc { return &fakeProc{done: make(chan struct{})} }

func (p *fakeProc) Done() <-chan struct{} { return p.done }
func (p *fakeProc) Exit() reaper.Exit     { <-p.done; return p.e }
func (p *fakeProc) exit(code int) {
	p.once.Do(func() { p.e = reaper.Exit{Pid: 100, Code: code, At: time.Now()}; close(p.done) })
}

// fakeBroker records grants and revocations.
type fakeBroker struct {
	j       *journal
	mu      sync.Mutex
	granted map[uint64]int
}

func (b *fakeBroker) Grant(gen uint64, cs []creds.Credential) {
	b.mu.Lock()
	b.granted[gen] = len(cs)
	b.mu.Unlock()
}

func (b *fakeBroker) Suspend(gen uint64) int {
	b.j.add("suspend %d", gen)
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.granted[gen]
}

func (b *fakeBroker) Resume(gen uint64) { b.j.add("resume %d", gen) }

func (b *fakeBroker) Revoke(gen uint64) int {
	b.j.add("revoke %d", gen)
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.granted[gen]
	delete(b.granted, gen)
	return n
}

// fakeWorktree is a registered worktree whose restore the test controls.
type fakeWorktree struct {
	j          *journal
	path       string
	late       bool
	mu         sync.Mutex
	restoreErr error
	onRestore  func(ctx context.Context)
	restores   []uint64
	// snapshots are the generations with a snapshot; Maintain prunes
	// them like gitguard does (the newest keep, never a protected one).
	snapshots []uint64
	tidyErr   error
	leftovers []string // what Tidy removes
	// maintainBlock, when set, makes Maintain a long repack: it waits
	// for the channel to close, or for its context (the next fence).
	maintainBlock chan struct{}
}

func (w *fakeWorktree) Tidy(context.Context) ([]string, error) {
	w.j.add("tidy %s", w.path)
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.leftovers
	w.leftovers = nil
	return l, w.tidyErr
}

func (w *fakeWorktree) Maintain(ctx context.Context, keep int, protect func(uint64) bool) (*api.MaintenanceReport, error) {
	w.j.add("maintain %s", w.path)
	if b := w.maintainBlock; b != nil {
		select {
		case <-b:
			w.j.add("maintain %s done", w.path)
		case <-ctx.Done():
			w.j.add("maintain %s interrupted", w.path)
			return &api.MaintenanceReport{Repack: "geometric"}, ctx.Err()
		}
	}
	return w.prune(keep, protect), nil
}

// PruneSnapshots prunes like Maintain, without the repack.
func (w *fakeWorktree) PruneSnapshots(ctx context.Context, keep int, protect func(uint64) bool) (*api.MaintenanceReport, error) {
	w.j.add("prune-snapshots %s", w.path)
	return w.prune(keep, protect), nil
}

// prune drops the snapshots beyond the newest keep (0: none), never a
// protected one, like gitguard does.
func (w *fakeWorktree) prune(keep int, protect func(uint64) bool) *api.MaintenanceReport {
	w.mu.Lock()
	defer w.mu.Unlock()
	rep := &api.MaintenanceReport{}
	if keep == 0 || len(w.snapshots) <= keep {
		rep.SnapshotsKept = len(w.snapshots)
		return rep
	}
	var kept []uint64
	for i, n := range w.snapshots { // oldest first
		if i >= len(w.snapshots)-keep || protect(n) {
			kept = append(kept, n)
			continue
		}
		rep.SnapshotsPruned = append(rep.SnapshotsPruned, fmt.Sprintf("refs/shim/abandoned/%d", n))
	}
	w.snapshots = kept
	rep.SnapshotsKept, rep.ObjectsPruned = len(kept), len(rep.SnapshotsPruned) > 0
	return rep
}

func (w *fakeWorktree) Restore(ctx context.Context, gen uint64, rev string, f *fetchSpec) (*api.WorktreeReport, error) {
	w.j.add("restore %d %s", gen, rev)
	if f != nil {
		w.j.add("fetch %d %s/%s", gen, f.Remote, f.Branch)
	}
	w.mu.Lock()
	hook, err := w.onRestore, w.restoreErr
	w.restores = append(w.restores, gen)
	if err == nil && rev != "missing" {
		w.snapshots = append(w.snapshots, gen)
	}
	w.mu.Unlock()
	if hook != nil {
		hook(ctx)
	}
	rep := &api.WorktreeReport{Worktree: w.path, Baseline: fakeCommit(rev), BaselineRev: rev,
		SnapshotRef: fmt.Sprintf("refs/shim/abandoned/%d", gen), SnapshotCommit: "5a5a"}
	if rev == "missing" {
		return rep, api.Errorf(api.CodeRestoreFailed, "baseline %q does not resolve", rev)
	}
	return rep, err
}

func (w *fakeWorktree) PutOnBranch(ctx context.Context, branch, commit string) error {
	w.j.add("branch %s %s", branch, commit)
	return nil
}

func (w *fakeWorktree) Move(ctx context.Context, gen uint64, rev string, f *fetchSpec) (*api.WorktreeReport, error) {
	w.j.add("move %d %s", gen, rev)
	if f != nil {
		w.j.add("fetch %d %s/%s", gen, f.Remote, f.Branch)
	}
	return &api.WorktreeReport{Worktree: w.path, Baseline: fakeCommit(rev), BaselineRev: rev,
		SnapshotRef: fmt.Sprintf("refs/shim/abandoned/%d", gen), SnapshotCommit: "5a5a", SnapshotReused: true, DurationsMS: map[string]float64{}}, nil
}

func (w *fakeWorktree) SnapshotLayer(ctx context.Context, gen uint64, baseline, upper string) (*api.WorktreeReport, error) {
	w.j.add("layer-snapshot %d %s %s", gen, baseline, upper)
	w.mu.Lock()
	w.snapshots = append(w.snapshots, gen)
	w.mu.Unlock()
	return &api.WorktreeReport{Worktree: w.path, Baseline: fakeCommit(baseline), BaselineRev: baseline, Isolation: "layers",
		SnapshotRef: fmt.Sprintf("refs/shim/abandoned/%d", gen), SnapshotCommit: "1a1a", DurationsMS: map[string]float64{}}, nil
}

func (w *fakeWorktree) LayerCapable() bool { return true }

func (w *fakeWorktree) SnapshotIs(context.Context, uint64, string) bool { return true }

func (w *fakeWorktree) VerifyLower(context.Context) ([]string, error) {
	w.j.add("verify-lower %s", w.path)
	return nil, nil
}

func (w *fakeWorktree) ForgetKnown() { w.j.add("forget-known %s", w.path) }

func (w *fakeWorktree) SealPacks() error { return nil }

func (w *fakeWorktree) RemoteHead(context.Context, api.FetchReport, *fetchSpec) (string, error) {
	return "", nil
}

func (w *fakeWorktree) ResolveBaseline(ctx context.Context, rev string) (string, error) {
	w.j.add("resolve %s", rev)
	if rev == "missing" {
		return "", api.Errorf(api.CodeNotFound, "%q is not a commit", rev)
	}
	return fakeCommit(rev), nil
}

// fakeCommit is what a revision resolves to: "c0ffee"+rev, and a commit
// id (already "c0ffee...") to itself.
func fakeCommit(rev string) string {
	if strings.HasPrefix(rev, "c0ffee") {
		return rev
	}
	return "c0ffee" + rev
}

func (w *fakeWorktree) List(context.Context) ([]api.Snapshot, error) { return nil, nil }
func (w *fakeWorktree) Show(context.Context, uint64) (api.Snapshot, error) {
	return api.Snapshot{}, nil
}
func (w *fakeWorktree) Registration() api.Registration {
	return api.Registration{Worktree: w.path, Late: w.late}
}

// fakeStarter launches fake harnesses in fake groups.
type fakeStarter struct {
	j         *journal
	rt        *Runtime
	mu        sync.Mutex
	groups    map[uint64]*fakeGroup
	trees     map[string]*fakeWorktree
	startErr  error
	conns     []api.Connection
	abortErr  error
	openCalls int
	layered   bool // generations get a worktree layer at /layers/<n>
}

func (s *fakeStarter) start(ctx context.Context, req api.StartRequest, baseline string, early *earlyStart) (*generation, error) {
	s.j.add("start %d", req.Generation)
	if early != nil {
		early.taken = true
	}
	if s.startErr != nil {
		return nil, s.startErr
	}
	p := newFakeProc()
	grp := &fakeGroup{name: fmt.Sprintf("gen-%d", req.Generation), j: s.j, proc: p}
	s.mu.Lock()
	s.groups[req.Generation] = grp
	s.mu.Unlock()
	dir := s.rt.genDir(req.Generation)
	os.MkdirAll(dir, 0o700)
	g := &generation{n: req.Generation, spec: req, group: grp, proc: p, pid: int(1000 + req.Generation),
		started: time.Now(), dir: dir, baseline: baseline, state: stStarting,
		exited: make(chan struct{}), quiet: make(chan struct{})}
	if s.layered && req.Worktree != "" {
		g.layers = &layers.Plan{Generation: req.Generation,
			Worktrees: []layers.WorktreeLayer{{Path: req.Worktree, Upper: fmt.Sprintf("/layers/%d", req.Generation)}}}
	}
	return g, nil
}

func (s *fakeStarter) openWorktree(ctx context.Context, path string, o worktreeOpts) (worktree, error) {
	s.j.add("open %s late=%v", path, o.late)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.openCalls++
	w, ok := s.trees[path]
	if !ok {
		w = &fakeWorktree{j: s.j, path: path, late: o.late}
		s.trees[path] = w
	}
	return w, nil
}

func (s *fakeStarter) abortSockets(groups []cgroup.Group) ([]api.Connection, error) {
	for _, g := range groups {
		s.j.add("abort %s", g.Name())
	}
	return s.conns, s.abortErr
}

func (s *fakeStarter) prepare() {}

// startEarly begins every start early (journal "early N"); dropEarly
// journals what no start took over ("drop early N").
func (s *fakeStarter) startEarly(req api.StartRequest) *earlyStart {
	s.j.add("early %d", req.Generation)
	e := &earlyStart{done: make(chan struct{})}
	close(e.done)
	return e
}

func (s *fakeStarter) dropEarly(e *earlyStart, n uint64) {
	if e != nil && !e.taken {
		e.taken = true
		s.j.add("drop early %d", n)
	}
}

func (s *fakeStarter) group(n uint64) *fakeGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.groups[n]
}

// fakeGroups is the cgroup manager: cgroup2, every controller.
type fakeGroups struct{ s *fakeStarter }

func (f fakeGroups) Mode() cgroup.Mode { return cgroup.ModeCgroup2 }
func (f fakeGroups) Reason() string    { return "fake" }
func (f fakeGroups) Root() string      { return "/fake" }
func (f fakeGroups) Create(name string, l cgroup.Limits) (cgroup.Group, error) {
	return nil, errors.New("not used")
}
func (f fakeGroups) Open(name string) (cgroup.Group, error) { return nil, errors.New("not used") }
func (f fakeGroups) List() ([]string, error)                { return nil, nil }
func (f fakeGroups) Controllers() map[string]bool {
	return map[string]bool{"memory": true, "pids": true}
}
func (f fakeGroups) GroupOf(pid int) (string, error) {
	if pid >= 1000 {
		return fmt.Sprintf("gen-%d", pid-1000), nil
	}
	return "", nil
}

// fixture is a runtime on fakes, in a temporary runtime dir.
type fixture struct {
	t      *testing.T
	rt     *Runtime
	j      *journal
	s      *fakeStarter
	broker *fakeBroker
	dir    string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "gen"), 0o700); err != nil {
		t.Fatal(err)
	}
	audit, err := openAudit(filepath.Join(dir, "audit.jsonl"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { audit.Close() })
	j := &journal{}
	s := &fakeStarter{j: j, groups: map[uint64]*fakeGroup{}, trees: map[string]*fakeWorktree{}}
	cfg := withDefaults(Config{RuntimeDir: dir, ExitGrace: time.Hour})
	rt := newRuntime(cfg, persisted{}, audit, fakeGroups{s}, s)
	s.rt = rt
	b := &fakeBroker{j: j, granted: map[uint64]int{}}
	rt.SetBroker(b)
	return &fixture{t: t, rt: rt, j: j, s: s, broker: b, dir: dir}
}

func (f *fixture) start(n uint64, extra ...func(*api.StartRequest)) (*api.StartResult, error) {
	req := api.StartRequest{Generation: n, Command: []string{"agent"}}
	for _, e := range extra {
		e(&req)
	}
	return f.rt.Start(context.Background(), req)
}

func (f *fixture) mustStart(n uint64, extra ...func(*api.StartRequest)) *api.StartResult {
	f.t.Helper()
	res, err := f.start(n, extra...)
	if err != nil {
		f.t.Fatalf("start %d: %v", n, err)
	}
	return res
}

func withWorktree(path, baseline string) func(*api.StartRequest) {
	return func(r *api.StartRequest) { r.Worktree, r.Baseline = path, baseline }
}

// stateOf is generation n's state, or stFenced when it is gone.
func (f *fixture) stateOf(n uint64) genState {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	if g, ok := f.rt.gens[n]; ok {
		return g.state
	}
	return stFenced
}

// durable is the highest generation in state.json.
func (f *fixture) durable() uint64 {
	st, err := loadState(filepath.Join(f.dir, "state.json"))
	if err != nil {
		f.t.Fatalf("state.json: %v", err)
	}
	return st.Highest
}

func codeOf(err error) string {
	if err == nil {
		return ""
	}
	return api.CodeOf(err)
}

// inOrder fails t unless each step's first line comes after the one before.
func (j *journal) inOrder(t *testing.T, steps ...string) {
	t.Helper()
	last := -1
	for _, step := range steps {
		i := j.index(step)
		if i <= last {
			t.Fatalf("%q missing or out of order in %q", step, j.all())
		}
		last = i
	}
}
