package runtime

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/creds"
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

// launcher starts processes in generation cgroups. It learns once, at start,
// whether this sandbox lets clone3 place a child straight into a cgroup
// (Docker's default seccomp profile refuses clone3) and whether it may make
// network namespaces for git.
type launcher struct {
	cfg            Config
	log            hclog.Logger
	once           sync.Once
	cloneIntoGroup bool
	newNetForGit   bool
}

func newLauncher(cfg Config, log hclog.Logger) launcher {
	return launcher{cfg: cfg, log: log}
}

// probe tries CLONE_INTO_CGROUP and CLONE_NEWNET once each with a child that
// exits at once, and remembers what works.
func (l *launcher) probe(rt *Runtime) {
	l.once.Do(func() {
		m := l.cfg.Cgroups
		if m.Mode() == cgroup.ModeCgroup2 {
			if g, err := m.Create(fmt.Sprintf("tmp-probe-%d", os.Getpid()), cgroup.Limits{}); err == nil {
				if fd, ok, err := g.CloneFD(); err == nil && ok {
					cmd := exec.Command(l.cfg.ShimPath, ProbeArg)
					cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
					l.cloneIntoGroup = l.cfg.Placement != "stub" && rt.cfg.Reaper.Run(context.Background(), cmd, nil) == nil
					unix.Close(fd)
				}
				ctx, cancel := context.WithTimeout(context.Background(), l.cfg.KillTimeout)
				g.Kill(ctx)
				cancel()
				g.Remove()
			}
			if !l.cloneIntoGroup {
				l.log.Info("clone3 into a cgroup is refused here (seccomp?); placing harnesses with a re-exec stub")
			}
		}
		cmd := exec.Command(l.cfg.ShimPath, ProbeArg)
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		l.newNetForGit = rt.cfg.Reaper.Run(context.Background(), cmd, nil) == nil
		if !l.newNetForGit {
			l.log.Warn("cannot create network namespaces (no CAP_SYS_ADMIN?); git runs at fences with the sandbox's network")
		}
	})
}

// Prepare runs the start-up probes now rather than at the first
// announcement, so they never count in a fence. The caller must already be
// reaping (the probes' children exit through the reaper).
func (rt *Runtime) Prepare() { rt.launch.probe(rt) }

// spawn starts cmd inside group g (nil: where shim is) through the reaper.
// cmd.SysProcAttr must be set and cmd.ExtraFiles empty.
func (l *launcher) spawn(rt *Runtime, cmd *exec.Cmd, g cgroup.Group) (*reaper.Process, error) {
	l.probe(rt)
	if g == nil || l.cfg.Cgroups.Mode() == cgroup.ModePidns {
		return rt.cfg.Reaper.Start(cmd)
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
			return rt.cfg.Reaper.Start(cmd)
		}
	}
	// The stub waits on fd 3 until it has been moved into the cgroup.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer w.Close()
	cmd.Args = append([]string{"shim", StubArg, cmd.Path}, cmd.Args...)
	cmd.Path = l.cfg.ShimPath
	cmd.ExtraFiles = []*os.File{r}
	p, err := rt.cfg.Reaper.Start(cmd)
	r.Close()
	if err != nil {
		return nil, err
	}
	if err := g.Add(p.Pid); err != nil {
		unix.Kill(p.Pid, unix.SIGKILL)
		return nil, fmt.Errorf("move pid %d into %s: %w", p.Pid, g.Path(), err)
	}
	if _, err := w.Write([]byte{1}); err != nil {
		unix.Kill(p.Pid, unix.SIGKILL)
		return nil, err
	}
	return p, nil
}

// RunStub is the placement stub's main: wait for the go-ahead on fd 3, then
// exec the harness. args are: PATH ARGV0 ARGS...
func RunStub(args []string) int {
	sync := os.NewFile(3, "sync")
	var b [1]byte
	n, _ := sync.Read(b[:])
	sync.Close()
	if n != 1 || len(args) < 2 {
		fmt.Fprintln(os.Stderr, "shim: placement stub was not released; not starting the harness")
		return 127
	}
	err := unix.Exec(args[0], args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "shim: exec %s: %v\n", args[0], err)
	return 127
}

// start launches a generation's harness: its cgroup, its network, its
// credentials, its output files, then the process itself.
func (l *launcher) start(ctx context.Context, rt *Runtime, req api.StartRequest, baseline string) (g *generation, err error) {
	n := req.Generation
	dir := rt.genDir(n)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, api.Errorf(api.CodeStartFailed, "generation dir: %v", err)
	}
	cred, home, err := lookupUser(req.User)
	if err != nil {
		return nil, err
	}
	if len(req.Credentials) > 0 {
		// A harness that cannot reach cred.sock would only find out when
		// git fails to authenticate: refuse the start with the reason.
		if err := reachableBy(filepath.Join(l.cfg.RuntimeDir, "cred.sock"), cred); err != nil {
			return nil, api.Errorf(api.CodeStartFailed, "credentials cannot be served to the harness: %v", err)
		}
	}
	env := harnessEnv(req, home)
	path, err := lookPath(req.Command[0], env)
	if err != nil {
		return nil, api.Errorf(api.CodeStartFailed, "%v", err)
	}

	name := fmt.Sprintf("gen-%d", n)
	if old, err := l.cfg.Cgroups.Open(name); err == nil {
		// Left by a start that failed half-way: empty it before reuse.
		kctx, cancel := context.WithTimeout(ctx, l.cfg.KillTimeout)
		_, kerr := old.Kill(kctx)
		cancel()
		if kerr != nil || old.Remove() != nil {
			return nil, api.Errorf(api.CodeStartFailed, "cgroup %s is left from an earlier attempt and cannot be emptied", name)
		}
	}
	var limits cgroup.Limits
	if req.Limits != nil {
		limits = cgroup.Limits{MemoryMax: req.Limits.MemoryMax, PidsMax: req.Limits.PidsMax, CPUMax: req.Limits.CPUMax}
	}
	group, err := l.cfg.Cgroups.Create(name, limits)
	if err != nil {
		if api.CodeOf(err) == api.CodeInternal {
			err = api.Errorf(api.CodeStartFailed, "create cgroup %s: %v", name, err)
		}
		return nil, err
	}
	var netw *creds.Network
	defer func() {
		if err == nil {
			return
		}
		if rt.broker != nil {
			rt.broker.Revoke(n)
		}
		if netw != nil {
			netw.Cut()
			netw.Close()
		}
		kctx, cancel := context.WithTimeout(context.Background(), l.cfg.KillTimeout)
		defer cancel()
		if _, kerr := group.Kill(kctx); kerr == nil {
			group.Remove()
		}
	}()

	if req.Network != api.NetworkHost {
		netw, err = creds.NewNetwork(n, creds.NetworkConfig{
			Mode: creds.NetworkMode(req.Network), Allow: req.Allow, Subnet: l.cfg.Subnet,
			Audit: rt.auditFunc(n), Log: l.log.Named("net"),
		})
		if err != nil {
			return nil, api.Errorf(api.CodeStartFailed, "network %s: %v", req.Network, err)
		}
		env = append(env, proxyEnv(netw.Env(), req.Env)...)
	}
	if len(req.Credentials) > 0 {
		if rt.broker == nil {
			return nil, api.Errorf(api.CodeUnsupported, "no credential broker is running")
		}
		cs := make([]creds.Credential, 0, len(req.Credentials))
		for _, c := range req.Credentials {
			cs = append(cs, creds.Credential{Protocol: c.Protocol, Host: c.Host, Path: c.Path, Username: c.Username, Password: c.Password})
		}
		rt.broker.Grant(n, cs)
		env = append(env, creds.HarnessEnv(l.cfg.ShimPath, filepath.Join(l.cfg.RuntimeDir, "cred.sock"))...)
	}

	stdout, err := os.OpenFile(filepath.Join(dir, "stdout"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return nil, api.Errorf(api.CodeStartFailed, "stdout file: %v", err)
	}
	defer stdout.Close()
	stderr, err := os.OpenFile(filepath.Join(dir, "stderr"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return nil, api.Errorf(api.CodeStartFailed, "stderr file: %v", err)
	}
	defer stderr.Close()
	cwd := req.Cwd
	if cwd == "" {
		cwd = req.Worktree
	}
	if cwd == "" {
		cwd = "/"
	}
	cmd := &exec.Cmd{
		Path: path, Args: req.Command, Env: env, Dir: cwd, Stdout: stdout, Stderr: stderr,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Credential: cred},
	}
	var proc *reaper.Process
	run := func() error {
		var err error
		proc, err = l.spawn(rt, cmd, group)
		return err
	}
	if netw != nil {
		err = netw.Run(run)
	} else {
		err = run()
	}
	if err != nil {
		return nil, api.Errorf(api.CodeStartFailed, "start %s: %v", req.Command[0], err)
	}
	g = &generation{
		n: n, spec: req, group: group, net: netw, proc: proc, pid: proc.Pid, started: time.Now().UTC(),
		dir: dir, baseline: baseline, exited: make(chan struct{}),
	}
	rec := api.Generation{Generation: n, Pid: g.pid, Cgroup: group.Path(), Command: req.Command, StartedAt: g.started,
		Worktree: req.Worktree, Network: req.Network, Labels: req.Labels,
		Stdout: filepath.Join(dir, "stdout"), Stderr: filepath.Join(dir, "stderr")}
	if werr := writeJSON(filepath.Join(dir, "generation.json"), rec); werr != nil {
		l.log.Warn("generation record not written", "generation", n, "error", werr)
	}
	go rt.watch(g)
	return g, nil
}

// watch records the harness's exit when the reaper collects it.
func (rt *Runtime) watch(g *generation) {
	e := g.proc.Exit()
	rt.mu.Lock()
	exit := api.Exit{Generation: g.n, Pid: e.Pid, ExitCode: e.Code, Signal: e.Signal,
		StartedAt: g.started, ExitedAt: e.At, Fenced: g.fenced}
	rt.mu.Unlock()
	// The record is on disk before anyone is told the generation exited.
	if err := writeJSON(filepath.Join(g.dir, "exit.json"), exit); err != nil {
		rt.log.Error("exit record not written", "generation", g.n, "error", err)
	}
	rt.mu.Lock()
	g.exit = &exit
	close(g.exited)
	rt.mu.Unlock()
	rt.audit.Record("generation_exited", g.n, map[string]any{"exit": exit}, false)
	rt.events.publish("exited", g.n, map[string]any{"exit_code": exit.ExitCode, "signal": exit.Signal, "fenced": exit.Fenced})
	rt.log.Info("harness exited", "generation", g.n, "exit_code", exit.ExitCode, "fenced", exit.Fenced)
}

// auditFunc adapts the audit log for the credential broker and proxy.
func (rt *Runtime) auditFunc(gen uint64) creds.Audit {
	return func(event string, fields map[string]any) { rt.audit.Record(event, gen, fields, false) }
}

// harnessEnv is exactly the env the supervisor gave, plus PATH and HOME
// defaults and SHIM_GENERATION; nothing of shim's own environment.
func harnessEnv(req api.StartRequest, home string) []string {
	env := append([]string{}, req.Env...)
	has := func(k string) bool {
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				return true
			}
		}
		return false
	}
	if !has("PATH") {
		env = append(env, "PATH="+defaultPath)
	}
	if !has("HOME") && home != "" {
		env = append(env, "HOME="+home)
	}
	return append(env, "SHIM_GENERATION="+strconv.FormatUint(req.Generation, 10))
}

// proxyEnv is the network's proxy variables, except that a NO_PROXY or
// no_proxy the supervisor set wins: in an isolated namespace a direct
// connection reaches only the generation's own loopback, so the list cannot
// widen what the harness reaches; it lets the supervisor send an allowed
// loopback destination of the sandbox (e.g. --allow 127.0.0.1:8080 with
// NO_PROXY=localhost,::1) through the proxy. The proxy variables themselves
// always come from shim.
func proxyEnv(netEnv, reqEnv []string) []string {
	set := map[string]bool{}
	for _, kv := range reqEnv {
		if k, _, ok := strings.Cut(kv, "="); ok && (k == "NO_PROXY" || k == "no_proxy") {
			set[k] = true
		}
	}
	if len(set) == 0 {
		return netEnv
	}
	out := make([]string, 0, len(netEnv))
	for _, kv := range netEnv {
		k, _, _ := strings.Cut(kv, "=")
		if (k == "NO_PROXY" || k == "no_proxy") && (set["NO_PROXY"] || set["no_proxy"]) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// lookPath finds file on the harness's PATH (not shim's).
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	path := defaultPath
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			path = kv[5:]
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, file)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found on the harness's PATH", file)
}

// lookupUser parses "UID[:GID]" or "NAME[:GROUP]"; "" runs as shim's user.
// Supplementary groups are always dropped.
func lookupUser(spec string) (*syscall.Credential, string, error) {
	if spec == "" {
		return nil, "", nil
	}
	name, grp, hasGroup := strings.Cut(spec, ":")
	var uid, gid uint64
	home := ""
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		uid, gid = n, n
		if u, err := user.LookupId(name); err == nil {
			gid, _ = strconv.ParseUint(u.Gid, 10, 32)
			home = u.HomeDir
		}
	} else {
		u, err := user.Lookup(name)
		if err != nil {
			return nil, "", api.Errorf(api.CodeBadRequest, "user %q: %v", name, err)
		}
		uid, _ = strconv.ParseUint(u.Uid, 10, 32)
		gid, _ = strconv.ParseUint(u.Gid, 10, 32)
		home = u.HomeDir
	}
	if hasGroup {
		if n, err := strconv.ParseUint(grp, 10, 32); err == nil {
			gid = n
		} else {
			g, err := user.LookupGroup(grp)
			if err != nil {
				return nil, "", api.Errorf(api.CodeBadRequest, "group %q: %v", grp, err)
			}
			gid, _ = strconv.ParseUint(g.Gid, 10, 32)
		}
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, home, nil
}

// reachableBy says why the harness user cred cannot connect to the unix
// socket at path, or returns nil: it needs search permission on every
// directory above the socket and write permission on the socket, with the
// harness's uid and primary gid only (supplementary groups are dropped).
// Root can always connect. A directory or socket with a POSIX ACL is not
// judged (the mode bits do not tell), so an ACL never causes a refusal.
func reachableBy(path string, cred *syscall.Credential) error {
	if cred == nil || cred.Uid == 0 {
		return nil
	}
	may := func(p string, bit uint32) error {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %v", p, err)
		}
		if n, _ := unix.Getxattr(p, "system.posix_acl_access", nil); n > 0 {
			return nil
		}
		ok := st.Mode&bit != 0
		switch {
		case st.Uid == cred.Uid:
			ok = st.Mode&(bit<<6) != 0
		case st.Gid == cred.Gid:
			ok = st.Mode&(bit<<3) != 0
		}
		if !ok {
			return fmt.Errorf("uid %d gid %d cannot use %s (mode %#o, owner %d:%d); make the runtime dir and its parents searchable by the harness user",
				cred.Uid, cred.Gid, p, st.Mode&0o7777, st.Uid, st.Gid)
		}
		return nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		if err := may(dir, 0o1); err != nil {
			return err
		}
		if dir == "/" {
			break
		}
	}
	return may(abs, 0o2)
}

// validateStart checks and normalises a start request.
func validateStart(req *api.StartRequest) error {
	if req.Generation == 0 {
		return api.Errorf(api.CodeBadRequest, "generation must be a positive integer")
	}
	if len(req.Command) == 0 || req.Command[0] == "" {
		return api.Errorf(api.CodeBadRequest, "command is required")
	}
	switch req.Network {
	case "":
		req.Network = api.NetworkHost
	case api.NetworkHost, api.NetworkNone, api.NetworkIsolated:
	default:
		return api.Errorf(api.CodeBadRequest, "network must be host, none or isolated, not %q", req.Network)
	}
	if len(req.Allow) > 0 && req.Network != api.NetworkIsolated {
		return api.Errorf(api.CodeBadRequest, "allow needs network isolated")
	}
	for _, p := range []struct{ name, v string }{{"worktree", req.Worktree}, {"cwd", req.Cwd}} {
		if p.v != "" && !filepath.IsAbs(p.v) {
			return api.Errorf(api.CodeBadRequest, "%s must be an absolute path, not %q", p.name, p.v)
		}
	}
	if (req.Baseline != "" || len(req.KeepPaths) > 0 || req.IncludeIgnored) && req.Worktree == "" {
		return api.Errorf(api.CodeBadRequest, "baseline, keep_paths and include_ignored need a worktree")
	}
	for _, p := range req.KeepPaths {
		if p == "" || filepath.IsAbs(p) || strings.HasPrefix(filepath.Clean(p), "..") {
			return api.Errorf(api.CodeBadRequest, "keep path %q must be relative to the worktree and inside it", p)
		}
	}
	for _, kv := range req.Env {
		if !strings.Contains(kv, "=") {
			return api.Errorf(api.CodeBadRequest, "env entry %q is not K=V", kv)
		}
	}
	for i, c := range req.Credentials {
		// The broker's own validation (its errors never quote a value):
		// an invalid credential is refused here rather than dropped at
		// grant time, which would start a harness without it.
		cc := creds.Credential{Protocol: c.Protocol, Host: c.Host, Path: c.Path, Username: c.Username, Password: c.Password}
		if err := cc.Validate(); err != nil {
			return api.Errorf(api.CodeBadRequest, "credential %d: %v", i, err)
		}
	}
	return nil
}

// gitRunner runs gitguard's git commands through the one reaper, in a
// throwaway cgroup that is killed afterwards and, where the sandbox allows,
// in an empty network namespace. It is a gitguard.NetworkRunner: the one git
// that fetches at a fence (RunWithNetwork) keeps shim's network, and only
// that one.
type gitRunner struct{ rt *Runtime }

// Run runs git without network where the sandbox allows it.
func (r gitRunner) Run(ctx context.Context, cmd *exec.Cmd) error { return r.run(ctx, cmd, false) }

// RunWithNetwork runs git in shim's own network namespace (the fetch).
func (r gitRunner) RunWithNetwork(ctx context.Context, cmd *exec.Cmd) error {
	return r.run(ctx, cmd, true)
}

func (r gitRunner) run(ctx context.Context, cmd *exec.Cmd, network bool) error {
	rt := r.rt
	l := &rt.launch
	l.probe(rt)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if l.newNetForGit && !network {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNET
	}
	var group cgroup.Group
	if rt.cfg.Cgroups.Mode() != cgroup.ModePidns {
		rt.mu.Lock()
		rt.gitSeq++
		name := fmt.Sprintf("git-%d", rt.gitSeq)
		rt.mu.Unlock()
		g, err := rt.cfg.Cgroups.Create(name, cgroup.Limits{})
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
	return rt.cfg.Reaper.Run(ctx, cmd, func(c *exec.Cmd) (*reaper.Process, error) { return l.spawn(rt, c, group) })
}
