package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/network"
	"github.com/shimdev/shim/internal/reaper"
)

// StubArg is the hidden first argument of the placement stub: shim re-execs
// itself with it where clone3 (CLONE_INTO_CGROUP) is refused, moves the stub
// into the generation's cgroup, and only then lets it exec the harness.
const StubArg = "__place"

// ProbeArg makes shim exit 0 at once; it is what the start-up probe runs.
const ProbeArg = "__probe"

// defaultPath is the harness's PATH when its env names none (Docker's).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// launcher is the real starter: it starts processes in generation cgroups
// through the one reaper. It learns once, at start, whether this sandbox
// lets clone3 place a child straight into a cgroup (Docker's default
// seccomp profile refuses clone3) and whether it may make network
// namespaces for git.
type launcher struct {
	rt             *Runtime
	cfg            Config
	once           sync.Once
	cloneIntoGroup bool
	newNetForGit   bool
	gitNet         *network.Network // the one empty network the gits without network start in; nil: each in a namespace of its own
	childOOM       []byte           // oom_score_adj of every child (see childOOMScore)
	ids            sync.Map         // cgroup path -> cgroup2 id of the generations started
}

func newLauncher(rt *Runtime) *launcher {
	return &launcher{rt: rt, cfg: rt.cfg, childOOM: childOOMScore()}
}

// childOOMScore is the OOM score a child of shim gets. Shim asks to be
// exempt from the OOM killer (-1000, shim init) and children would inherit
// that: they get the default (0) back. Where shim may not lower its own
// score (no CAP_SYS_RESOURCE, as in many VMs and containers), children get
// the highest score (1000) instead, which any process may set on itself:
// either way the OOM killer picks a harness before PID 1.
func childOOMScore() []byte {
	b, _ := os.ReadFile("/proc/self/oom_score_adj")
	if strings.TrimSpace(string(b)) == "-1000" {
		return []byte("0")
	}
	return []byte("1000")
}

// prepare tries CLONE_INTO_CGROUP and CLONE_NEWNET once each with a child
// that exits at once, and remembers what works. The probe's cgroup is
// removed whatever the child did.
func (l *launcher) prepare() {
	l.once.Do(func() {
		m := l.rt.groups
		if m.Mode() == cgroup.ModeCgroup2 {
			l.cloneIntoGroup = l.cfg.Placement != "stub" && l.probeClone(m)
			if !l.cloneIntoGroup {
				l.rt.log.Info("clone3 into a cgroup is refused here (seccomp?); placing harnesses with a re-exec stub")
			}
		}
		cmd := exec.Command(l.cfg.ShimPath, ProbeArg)
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		l.newNetForGit = l.cfg.Reaper.Run(context.Background(), cmd, nil) == nil
		if !l.newNetForGit {
			l.rt.log.Warn("cannot create network namespaces (no CAP_SYS_ADMIN?); git runs at fences with the sandbox's network")
		} else if n, err := network.New(0, network.Config{Mode: network.ModeNone}); err == nil {
			// One namespace for every such git, made once: one of its own
			// per git cost each about a millisecond, and the kernel more
			// work after it exited. Only shim's gits are ever in it.
			l.gitNet = n
		}
		weak := l.probeOwnerGuard()
		l.rt.mu.Lock()
		l.rt.weak = weak
		l.rt.mu.Unlock()
		l.probeLayers()
	})
}

func (l *launcher) probeClone(m groups) bool {
	g, err := m.Create(fmt.Sprintf("tmp-probe-%d", os.Getpid()), cgroup.Limits{})
	if err != nil {
		return false
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.KillTimeout)
		defer cancel()
		if _, err := g.Kill(ctx); err == nil {
			g.Remove()
		}
	}()
	fd, ok, err := g.CloneFD()
	if err != nil || !ok {
		return false
	}
	defer unix.Close(fd)
	cmd := exec.Command(l.cfg.ShimPath, ProbeArg)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	return l.cfg.Reaper.Run(context.Background(), cmd, nil) == nil
}

// Prepare runs the start-up probes now rather than at the first
// announcement, so they never count in a fence. The caller must already be
// reaping (the probes' children exit through the reaper).
func (rt *Runtime) Prepare() { rt.launch.prepare() }

// spawn starts cmd inside group g (nil: where shim is) through the reaper.
// cmd.SysProcAttr must be set. The child does not
// keep shim's OOM immunity.
func (l *launcher) spawn(cmd *exec.Cmd, g cgroup.Group) (*reaper.Process, error) {
	l.prepare()
	p, err := l.place(cmd, g)
	if err == nil {
		l.setOOMScore(p.Pid) // the stub had it set before it was released
	}
	return p, err
}

func (l *launcher) place(cmd *exec.Cmd, g cgroup.Group) (*reaper.Process, error) {
	if g == nil || l.rt.groups.Mode() == cgroup.ModePidns {
		return l.cfg.Reaper.Start(cmd)
	}
	if l.cloneIntoGroup {
		fd, ok, err := g.CloneFD()
		if err != nil {
			return nil, err
		}
		if ok {
			defer unix.Close(fd)
			cmd.SysProcAttr.UseCgroupFD = true
			cmd.SysProcAttr.CgroupFD = fd
			return l.cfg.Reaper.Start(cmd)
		}
	}
	// The stub waits on its sync fd (after cmd's own extra files, so
	// theirs keep their numbers) until it has been moved into the cgroup.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer w.Close()
	syncFD := 3 + len(cmd.ExtraFiles)
	cmd.Args = append([]string{"shim", StubArg, strconv.Itoa(syncFD), cmd.Path}, cmd.Args...)
	cmd.Path = l.cfg.ShimPath
	cmd.ExtraFiles = append(cmd.ExtraFiles, r)
	p, err := l.cfg.Reaper.Start(cmd)
	r.Close()
	if err != nil {
		return nil, err
	}
	if err := g.Add(p.Pid); err != nil {
		unix.Kill(p.Pid, unix.SIGKILL)
		return nil, fmt.Errorf("move pid %d into %s: %w", p.Pid, g.Path(), err)
	}
	l.setOOMScore(p.Pid)
	if _, err := w.Write([]byte{1}); err != nil {
		unix.Kill(p.Pid, unix.SIGKILL)
		return nil, err
	}
	return p, nil
}

// setOOMScore gives a child its OOM score (childOOMScore): right after
// exec for a child cloned into its cgroup, before the release for one
// placed by the stub (no window there).
func (l *launcher) setOOMScore(pid int) {
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", l.childOOM, 0)
}

// RunStub is the placement stub's main: wait for the go-ahead on the sync
// fd, then exec the harness. args are: FD PATH ARGV0 ARGS...
func RunStub(args []string) int {
	fd, err := strconv.Atoi(firstOr(args, ""))
	if err != nil || fd < 3 || len(args) < 3 {
		fmt.Fprintln(os.Stderr, "shim: placement stub: bad arguments; not starting the harness")
		return 127
	}
	args = args[1:]
	sync := os.NewFile(uintptr(fd), "sync")
	var b [1]byte
	n, _ := sync.Read(b[:])
	sync.Close()
	if n != 1 {
		fmt.Fprintln(os.Stderr, "shim: placement stub was not released; not starting the harness")
		return 127
	}
	if len(args) > 2 && args[2] == layers.StubArg && isThisBinary(args[0]) {
		// The harness of a layered generation: the layer stub is this
		// binary too, run here rather than exec'd again (an exec of shim
		// costs a start milliseconds, more in a container).
		return layers.RunStub(args[3:])
	}
	err = unix.Exec(args[0], args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "shim: exec %s: %v\n", args[0], err)
	return 127
}

// isThisBinary reports whether path is the running executable's file.
func isThisBinary(path string) bool {
	var a, b unix.Stat_t
	return unix.Stat(path, &a) == nil && unix.Stat("/proc/self/exe", &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino
}

func firstOr(s []string, def string) string {
	if len(s) == 0 {
		return def
	}
	return s[0]
}

// start launches a generation's harness: its cgroup, its network, its
// credentials, its output, then the process itself (through the layer
// stub early began, when it could be taken over). On failure everything
// it made is undone.
func (l *launcher) start(ctx context.Context, req api.StartRequest, baseline string, early *earlyStart) (g *generation, err error) {
	rt, n := l.rt, req.Generation
	if err := l.checkLayersDisk(n, req); err != nil {
		l.dropEarly(early, n)
		return nil, err
	}
	stub, group := early.take(l, req)
	iso := &isolation{group: group}
	defer func() {
		if err != nil && stub != nil {
			stub.ready.r.Close()
		}
		if err != nil && iso.group != nil {
			// A revocation is for good: only what was granted is revoked
			// (a start that failed before its grant, on a cgroup taken
			// over from an early start, leaves n's credentials to a retry).
			l.undo(n, iso.group, iso.netw, iso.granted)
		}
	}()
	dir := rt.genDir(n)
	if err := genDirReady(dir); err != nil {
		return nil, err
	}
	cred, home, err := l.harnessUser(req)
	if err != nil {
		return nil, err
	}
	env := harnessEnv(req, home)
	path, argv, err := harnessCommand(req, env)
	if err != nil {
		return nil, err
	}
	wts, layered, err := l.layeredWorktrees(n, req)
	if err != nil {
		return nil, err
	}
	if env, err = l.isolate(ctx, n, req, iso, env); err != nil {
		return nil, err
	}
	group, netw, in := iso.group, iso.netw, iso.in
	if layered {
		if len(wts) > 0 {
			rt.sealOnce(wts[0], rt.registered(wts[0]))
		}
		if stub == nil {
			if stub, err = l.newStub(n, wts, group, in); err != nil {
				return nil, err
			}
		}
	}
	out, wOut, wErr, err := newOutputs(filepath.Join(dir, "stdout"), filepath.Join(dir, "stderr"), l.cfg.LogMax)
	if err != nil {
		return nil, errs.New(api.CodeStartFailed, "output files: %v", err)
	}
	defer wOut.Close()
	defer wErr.Close()
	out.copyTo(l.cfg.CopyOutput, n)
	cwd := harnessCwd(req)
	cmd := &exec.Cmd{
		Path: path, Args: argv, Env: env, Dir: cwd, Stdout: wOut, Stderr: wErr,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Credential: holderCred(req, cred)},
	}
	g = &generation{n: n, group: group, net: netw, dir: dir, out: out, baseline: baseline, state: stStarting,
		exited: make(chan struct{}), quiet: make(chan struct{})}
	if err := l.spawnHarness(ctx, g, stub, cmd, in); err != nil {
		out.stdout.abort()
		out.stderr.abort()
		return nil, errs.New(api.CodeStartFailed, "start %s: %v", req.Command[0], err)
	}
	l.begin(out, req, g.pid)
	req.Limits = apiLimits(l.limitsFor(req))
	g.spec, g.started = req, time.Now().UTC()
	g.calls = newCalls(env, cwd, req.User)
	return g, nil
}

// isolation is what a start gave its generation so far: its cgroup, its
// network, whether its credentials were granted (what a failed start
// undoes), and how to run a call in its network.
type isolation struct {
	group   cgroup.Group
	netw    genNetwork
	granted bool
	in      func(func() error) error
}

// isolate gives generation n its cgroup (unless an early start made it),
// its network (the proxy's variables added to env) and its credentials
// (granted into env), recording each in iso as it is made.
func (l *launcher) isolate(ctx context.Context, n uint64, req api.StartRequest, iso *isolation, env []string) ([]string, error) {
	var err error
	if iso.group == nil {
		if iso.group, err = l.newGroup(ctx, n, req); err != nil {
			return env, err
		}
	}
	if req.Network != api.NetworkHost {
		if iso.netw, err = newGenNetwork(l.rt, n, req); err != nil {
			return env, errs.New(api.CodeStartFailed, "network %s: %v", req.Network, err)
		}
		env = append(env, proxyEnv(iso.netw.Env(), req.Env)...)
	}
	if len(req.Credentials) > 0 {
		if env, err = l.grant(n, req.Credentials, env); err != nil {
			return env, err
		}
		iso.granted = true
	}
	iso.in = func(fn func() error) error { return fn() }
	if iso.netw != nil {
		iso.in = iso.netw.Run
	}
	return env, nil
}

// harnessUser resolves the harness's user (its credential and home) and
// refuses one the start cannot serve: a member of shim's --lower-group,
// or one that could not reach cred.sock for the credentials it is given.
func (l *launcher) harnessUser(req api.StartRequest) (*syscall.Credential, string, error) {
	cred, home, err := lookupUser(req.User)
	if err != nil {
		return nil, "", err
	}
	if lg := l.lowerGroup(); lg != 0 && cred != nil && cred.Gid == lg {
		return nil, "", errs.New(api.CodeBadRequest, "gid %d is shim's --lower-group (it enters the locked checkouts): no harness may have it", lg)
	}
	if len(req.Credentials) > 0 {
		// A harness that cannot reach cred.sock would only find out when
		// git fails to authenticate: refuse the start with the reason.
		if err := reachableBy(filepath.Join(l.cfg.RuntimeDir, "cred.sock"), cred); err != nil {
			return nil, "", errs.New(api.CodeStartFailed, "credentials cannot be served to the harness: %v", err)
		}
	}
	return cred, home, nil
}

// spawnHarness starts the harness, through its layer stub (which execs it
// in its layers) or spawned into g's cgroup, and fills g's process, pid,
// mounts and layer plan.
func (l *launcher) spawnHarness(ctx context.Context, g *generation, stub *layerStub, cmd *exec.Cmd, in func(func() error) error) error {
	if stub != nil {
		g.proc, g.layers = stub.proc, stub.plan
		mounts, err := stub.launch(ctx, cmd)
		if err != nil {
			return err
		}
		g.mounts, g.pid = mounts, stub.proc.Pid
		return nil
	}
	var proc *reaper.Process
	if err := in(func() (err error) { proc, err = l.spawn(cmd, g.group); return err }); err != nil {
		return err
	}
	g.proc, g.pid = proc, proc.Pid
	return nil
}

// genDirReady makes a generation's dir durably, unless prepareStart made
// it (synced with the hand-off) already.
func genDirReady(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errs.New(api.CodeStartFailed, "generation dir: %v", err)
	}
	// Its records' files are synced with their dir, this dir with its parent.
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return errs.New(api.CodeStartFailed, "generation dir: %v", err)
	}
	return nil
}

// harnessCwd is where a generation's harness (and by default its tool
// calls) start: the announcement's cwd, else its worktree, else /.
func harnessCwd(req api.StartRequest) string {
	if req.Cwd != "" {
		return req.Cwd
	}
	if req.Worktree != "" {
		return req.Worktree
	}
	return "/"
}

// putGenerationRecord puts gen/N/generation.json, the record of a
// generation just started, in records (the start's batch with state.json:
// a failure is logged, the generation runs).
func (rt *Runtime) putGenerationRecord(records *durableBatch, g *generation) {
	req := g.spec
	rec := api.Generation{Generation: g.n, Pid: g.pid, Cgroup: g.group.Path(), Command: req.Command, StartedAt: g.started,
		Worktree: req.Worktree, Network: req.Network, Labels: req.Labels, State: api.StateRunning,
		Stdout: filepath.Join(g.dir, "stdout"), Stderr: filepath.Join(g.dir, "stderr"), Limits: req.Limits, Linger: req.Linger,
		Isolation: isolationOf(g.layers), Idle: req.Idle}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		rt.log.Warn("generation record not written", "generation", g.n, "error", err)
		return
	}
	records.put(filepath.Join(g.dir, "generation.json"), append(b, '\n'), 0o644)
}

// newGroup creates generation n's cgroup with the announcement's limits
// (and shim's defaults) and learns its id.
func (l *launcher) newGroup(ctx context.Context, n uint64, req api.StartRequest) (cgroup.Group, error) {
	group, err := l.freshGroup(ctx, fmt.Sprintf("gen-%d", n), l.limitsFor(req))
	if err != nil {
		return nil, err
	}
	if l.rt.groups.Mode() == cgroup.ModeCgroup2 {
		l.ids.Delete(group.Path()) // a new cgroup of the same name has a new id
		if _, err := l.cgroupID(group.Path()); err != nil {
			l.removeStarted(n, group)
			return nil, errs.New(api.CodeStartFailed, "cgroup id of %s: %v", group.Path(), err)
		}
	}
	return group, nil
}

func isolationOf(p *layers.Plan) string {
	if p == nil {
		return layers.ModeScan
	}
	return layers.ModeLayers
}

// freshGroup creates the generation's cgroup, emptying one a start that
// failed half-way left behind.
func (l *launcher) freshGroup(ctx context.Context, name string, limits cgroup.Limits) (cgroup.Group, error) {
	if old, err := l.rt.groups.Open(name); err == nil {
		kctx, cancel := context.WithTimeout(ctx, l.cfg.KillTimeout)
		_, kerr := old.Kill(kctx)
		cancel()
		if kerr != nil || old.Remove() != nil {
			return nil, errs.New(api.CodeStartFailed, "cgroup %s is left from an earlier attempt and cannot be emptied", name)
		}
	}
	group, err := l.rt.groups.Create(name, limits)
	if err != nil {
		if api.CodeOf(err) == api.CodeInternal {
			err = errs.New(api.CodeStartFailed, "create cgroup %s: %v", name, err)
		}
		return nil, err
	}
	return group, nil
}

// undo cuts and kills what a failed start made, and revokes n's
// credentials if revoke.
func (l *launcher) undo(n uint64, group cgroup.Group, netw genNetwork, revoke bool) {
	if b := l.rt.credBroker(); b != nil && revoke {
		b.Revoke(n)
	}
	if netw != nil {
		netw.Cut(group)
		netw.Close()
	}
	l.removeStarted(n, group)
}

// removeStarted kills what a start of n made in group, removes group and
// n's layers (nothing of it ran). It revokes nothing: before the grant
// there is nothing to revoke, and a revocation is for good.
func (l *launcher) removeStarted(n uint64, group cgroup.Group) {
	defer func() {
		if ly := l.rt.layers; ly != nil {
			ly.Remove(n)
		}
	}()
	kctx, cancel := context.WithTimeout(context.Background(), l.cfg.KillTimeout)
	defer cancel()
	if _, kerr := group.Kill(kctx); kerr == nil {
		group.Remove()
	}
}

// grant gives generation n's git the announcement's credentials through
// the broker, and the harness what it needs to ask for them (never the
// secret).
func (l *launcher) grant(n uint64, cs []api.Credential, env []string) ([]string, error) {
	b := l.rt.credBroker()
	if b == nil {
		return nil, errs.New(api.CodeUnsupported, "no credential broker is running")
	}
	list, err := credsOf(cs)
	if err != nil {
		return nil, err
	}
	b.Grant(n, list)
	return append(env, creds.HarnessEnv(l.cfg.ShimPath, filepath.Join(l.cfg.RuntimeDir, "cred.sock"))...), nil
}

// limitsFor is the announcement's limits, with shim's defaults for the
// kinds it leaves unset where the controller is available (a default is
// never a reason to refuse a start; an explicit limit is).
func (l *launcher) limitsFor(req api.StartRequest) cgroup.Limits {
	var lim cgroup.Limits
	if req.Limits != nil {
		lim = cgroup.Limits{MemoryMax: req.Limits.MemoryMax, PidsMax: req.Limits.PidsMax, CPUMax: req.Limits.CPUMax}
	}
	have := l.rt.groups.Controllers()
	d := l.cfg.DefaultLimits
	if lim.MemoryMax == 0 && d.MemoryMax > 0 && have["memory"] {
		lim.MemoryMax = d.MemoryMax
	}
	if lim.PidsMax == 0 && d.PidsMax > 0 && have["pids"] {
		lim.PidsMax = d.PidsMax
	}
	return lim
}
