package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/reaper"
	"github.com/shimdev/shim/internal/runtime"
)

type intList []int

func (l *intList) String() string { return fmt.Sprint(*l) }
func (l *intList) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	*l = append(*l, n)
	return nil
}

func defaultRuntimeDir() string {
	if d := os.Getenv("SHIM_RUNTIME_DIR"); d != "" {
		return d
	}
	return "/run/shim"
}

// DefaultLowerGroup is --lower-group: a gid no distribution gives anyone
// (65534 is nogroup; 65532 is distroless's nonroot).
const DefaultLowerGroup = 65533

// runInit is shim's main as PID 1, like tini's: the options, the setup
// (one place reaps, the control API and the credential broker serve, the
// service starts), then the loop that forwards signals and ends everything
// on SIGTERM or the service's exit.
func runInit(args []string) int {
	// First, before anything catches a signal: the signal mask and ignored
	// signals shim was started with, which the service starts with
	// (sigstate.go).
	started := startSignalState()
	setMemoryBudget()
	o, code, ok := parseInit(args)
	if !ok {
		return code
	}
	if err := needRoot(os.Geteuid()); err != nil {
		fmt.Fprintf(os.Stderr, "shim init: %v\n", err)
		return 1
	}
	p, code, err := setupInit(o, started)
	if err != nil {
		if p != nil && p.log != nil {
			p.log.Error("shim cannot start", "error", err)
		}
		fmt.Fprintf(os.Stderr, "shim init: %v\n", err)
		if p != nil {
			p.close()
		}
		return code
	}
	defer p.close()
	return p.loop()
}

// gcPercent is shim init's GOGC: PID 1's live heap is a few MiB, and
// what a fence allocates (a layer's paths, git's answers) is garbage a
// moment later; at Go's default (100) the heap may double its live size
// before a collection, which was most of shim's peak RSS during a fence
// (issue 27: at most ~2x the idle RSS). A collection of a heap this small
// costs microseconds. GOGC in the environment still decides.
const gcPercent = 25

func setMemoryBudget() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}

// needRoot refuses to run shim init as another user than root: every way
// it has to fence (cgroups it owns, namespaces, mounts, the OOM score) is
// root's, and without this each of them failed in turn into one long
// error that never said why.
func needRoot(euid int) error {
	if euid == 0 {
		return nil
	}
	return fmt.Errorf("must run as root: it runs as uid %d, and fencing needs root's cgroups, namespaces and mounts "+
		"(in a container, root of the container's user namespace will do)", euid)
}

// initOpts are shim init's flags.
type initOpts struct {
	runtimeDir, cgroupRoot, logFormat, level, mode, subnet, placement string
	defMemory, defPids                                                string
	isolation, layersDir                                              string
	persist                                                           []string
	keepLayers                                                        int
	worktreeLayerSize, keepLayersBytes, layersReserve                 int64
	rootLayerSize                                                     int64
	lowerGroup                                                        uint
	requireIsolation                                                  bool
	grace, freezeTimeout, killTimeout, exitGrace, gitTimeout          time.Duration
	restoreTimeout                                                    time.Duration
	mountProc                                                         bool
	copyOutput                                                        bool
	eventsKept                                                        int
	keep, keepGens, auditKeep, socketGroup                            int
	logMax, execOutputMax, reserve, keepBytes, auditMax               int64
	worktrees                                                         []string
	listen                                                            []string // --listen: vsock:PORT, serial:NAME (vm.go)
	allowUIDs                                                         []int
	service                                                           []string
}

// parseInit parses the flags; ok false means exit with code now (-h: 0,
// after printing the usage on stdout as tini does).
func parseInit(args []string) (o initOpts, code int, ok bool) {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	var persist, worktrees, listen strList
	var allowUIDs intList
	initFlags(fs, &o)
	fs.Var(&persist, "persist", "a path every generation shares as it is, outside the layers (a package cache; repeatable)")
	fs.Var(&worktrees, "worktree", "register this worktree at start-up, before any harness runs (the trusted registration; repeatable)")
	fs.Var(&allowUIDs, "allow-uid", "uid allowed on the control socket besides root (repeatable)")
	fs.Var(&listen, "listen", "also serve the control API on vsock:PORT (the host, CID 2, only) or serial:NAME (a virtio-serial port); repeatable (docs/microvm.md)")
	fs.Usage = func() {} // printed below: on stdout for -h, as tini does
	if err := fs.Parse(args); err != nil {
		out, code := os.Stderr, 2
		if errors.Is(err, flag.ErrHelp) {
			out, code = os.Stdout, 0
		}
		fmt.Fprintln(out, "usage: shim init [flags] [-- SERVICE CMD...]")
		fs.SetOutput(out)
		fs.PrintDefaults()
		return o, code, false
	}
	o.worktrees, o.allowUIDs, o.service, o.persist, o.listen = worktrees, allowUIDs, fs.Args(), persist, listen
	if err := checkInit(&o, fs); err != nil {
		fmt.Fprintf(os.Stderr, "shim init: %v\n", err)
		return o, 2, false
	}
	return o, 0, true
}

// initFlags defines shim init's flags into o.
func initFlags(fs *flag.FlagSet, o *initOpts) {
	fs.StringVar(&o.runtimeDir, "runtime-dir", defaultRuntimeDir(), "runtime dir (socket, state, audit log, generation output)")
	fs.StringVar(&o.cgroupRoot, "cgroup-root", "", "cgroup dir shim owns (default: its own cgroup)")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.level, "log-level", "info", "log level: trace, debug, info, warn, error (warn when a service command is given, so that its stderr carries only shim's warnings and errors)")
	fs.DurationVar(&o.grace, "grace", 8*time.Second, "on SIGTERM, how long the harness may take to exit before it is killed (under Docker's default 10s stop timeout)")
	fs.StringVar(&o.mode, "mode", "", "force a fencing mode: cgroup2, cgroup1 or pidns (default: the best available)")
	fs.BoolVar(&o.mountProc, "mount-proc", false, "mount a fresh /proc (PID 1 of a new pid and mount namespace)")
	fs.DurationVar(&o.freezeTimeout, "freeze-timeout", 5*time.Second, "how long a freeze may take to be confirmed")
	fs.DurationVar(&o.killTimeout, "kill-timeout", 10*time.Second, "how long a killed generation may take to empty")
	fs.StringVar(&o.subnet, "subnet", "", "link-local range for isolated generation networks (default 169.254.64.0/18)")
	fs.IntVar(&o.keep, "keep-snapshots", 100, "abandoned-edit refs kept per worktree, the newest (pruned in batches of a tenth, objects included, after a fence; 0 = all)")
	fs.IntVar(&o.keepGens, "keep-generations", 100, "per-generation records (gen/<N>/: output, exit and generation records) kept, the newest (0 = all)")
	fs.Int64Var(&o.keepBytes, "keep-bytes", 256<<20, "bytes the per-generation records may take together; the oldest go first (0 = no bound)")
	fs.Int64Var(&o.auditMax, "audit-max-bytes", runtime.DefaultAuditMaxBytes, "rotate audit.jsonl past this size (-1 = never)")
	fs.IntVar(&o.auditKeep, "audit-keep", runtime.DefaultAuditKeep, "rotated audit files kept (audit.jsonl.1 ...)")
	fs.StringVar(&o.placement, "placement", "auto", "how harnesses enter their cgroup: auto, clone (clone3) or stub (re-exec, for seccomp that refuses clone3)")
	fs.IntVar(&o.socketGroup, "socket-group", -1, "group that may also use shim.sock (mode 0660), e.g. for a forwarded socket")
	fs.DurationVar(&o.exitGrace, "exit-grace", runtime.DefaultExitGrace, "after a harness exits, how long what it left running may go on before it is killed (its credentials and network are cut at once)")
	fs.Int64Var(&o.execOutputMax, "exec-output-max", runtime.DefaultExecOutputMax, "cap in bytes of each tool call's stdout and stderr files (the rest is dropped and counted; -1 = no cap)")
	fs.Int64Var(&o.logMax, "log-max", runtime.DefaultLogMax, "cap in bytes of each generation's stdout and stderr files (what is past it is dropped and counted; -1 = no cap)")
	fs.BoolVar(&o.copyOutput, "copy-output", false, "copy every harness's output to shim's stdout, each line prefixed [gen N] (stderr lines [gen N stderr]), for docker logs; bounded: lines a slow stdout cannot take are dropped and counted, never waited for")
	fs.IntVar(&o.eventsKept, "events-kept", runtime.DefaultEventsKept, "events kept for GET /v1/events?since=SEQ (a reader further behind gets a gap event)")
	fs.Int64Var(&o.reserve, "reserve", runtime.DefaultReserve, "bytes kept free on the runtime dir's filesystem for state.json and the fence's audit records (-1 = none)")
	fs.DurationVar(&o.gitTimeout, "git-timeout", 60*time.Second, "deadline of every git shim runs")
	fs.DurationVar(&o.restoreTimeout, "restore-timeout", 5*time.Minute, "deadline of one worktree's save and restore")
	fs.StringVar(&o.defMemory, "default-memory-max", "90%", "memory.max of a generation whose announcement sets none: bytes, a percentage of what shim's cgroup root may use, or 0 for none (only where the memory controller is available)")
	fs.StringVar(&o.defPids, "default-pids-max", "90%", "pids.max of a generation whose announcement sets none: a number, a percentage of the pids shim's cgroup root may use, or 0 for none (only where the pids controller is available)")
	fs.StringVar(&o.isolation, "isolation", "auto", "auto: each generation in its own mount and IPC namespaces on copy-on-write layers where the sandbox allows (overlayfs, CAP_SYS_ADMIN), else scan; scan: the sandbox's filesystem shared, the worktree restored by a scan")
	fs.StringVar(&o.layersDir, "layers", "/var/lib/shim/layers", "where generations' layers live (durable: a worktree layer holds abandoned edits until its fence has saved them)")
	fs.IntVar(&o.keepLayers, "keep-layers", 1, "fenced generations whose layers are kept for forensics")
	fs.UintVar(&o.lowerGroup, "lower-group", DefaultLowerGroup, "the group of shim's own gits, the only one besides root that may enter the layered worktrees' writable views (no harness may have it)")
	fs.Int64Var(&o.rootLayerSize, "root-layer-size", 1<<30, "bytes a generation may write outside its worktree and the shared paths (its root layer, a tmpfs)")
	fs.Int64Var(&o.worktreeLayerSize, "worktree-layer-size", 0, "bytes a generation may write in its worktree (its worktree layer then a tmpfs of that size: bounded, but lost with the sandbox); 0: on the layers dir's filesystem, durable, bounded by that filesystem only")
	fs.Int64Var(&o.layersReserve, "layers-reserve", runtime.DefaultLayersReserve, "bytes kept on the layers dir's filesystem that no harness can take: the fence's snapshot and markers get them when a harness filled the filesystem, and the fenced generations' kept layers go first when it is short of room (-1 = none)")
	fs.Int64Var(&o.keepLayersBytes, "keep-layers-bytes", 1<<30, "bytes the layers kept for forensics take in all (the oldest go first); 0: no bound beyond --keep-layers")
	fs.BoolVar(&o.requireIsolation, "require-isolation", false, "refuse every announcement (ISOLATION_UNAVAILABLE, after the fence) when generations cannot get layers")
}

// checkInit refuses what the flags cannot mean, and settles what depends
// on another flag.
func checkInit(o *initOpts, fs *flag.FlagSet) error {
	if err := checkListen(o.listen); err != nil {
		return err
	}
	if o.isolation != "auto" && o.isolation != "scan" {
		return errors.New("--isolation must be auto or scan")
	}
	if o.worktreeLayerSize < 0 || o.keepLayersBytes < 0 {
		return errors.New("--worktree-layer-size and --keep-layers-bytes must be 0 (no bound) or a number of bytes")
	}
	if o.eventsKept < 1 || o.eventsKept > 1<<16 {
		return errors.New("--events-kept must be between 1 and 65536 (each event kept is memory of PID 1)")
	}
	if o.lowerGroup == 0 || o.lowerGroup >= 1<<32-1 {
		return errors.New("--lower-group must be a gid other than 0")
	}
	for _, p := range o.persist {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("--persist %q must be an absolute path", p)
		}
	}
	if len(o.service) > 0 && !flagGiven(fs, "log-level") {
		// tini prints nothing unless it warns: the service's stderr is
		// shim's, and INFO lines there would be mixed into its output.
		o.level = "warn"
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return errors.New("--log-format must be text or json")
	}
	return nil
}

// pid1 is a running shim init: everything setupInit made, which close
// releases.
type pid1 struct {
	o      initOpts
	log    hclog.Logger
	sigs   chan os.Signal
	rp     *reaper.Reaper
	rt     *runtime.Runtime
	broker *creds.Broker
	svc    *service // nil without a service command
	// prepared is closed once the start-up probes are done; shim waits for
	// them before it exits, or a service that exits at once would leave the
	// probe's cgroup behind.
	prepared   chan struct{}
	servicePid atomic.Int64 // read by the cgroup manager's sweeps
	closers    []func()
}

func (p *pid1) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

// setupInit makes shim PID 1 of its sandbox. On error it returns the exit
// code and what it made so far (close releases it).
func setupInit(o initOpts, started sigState) (*pid1, int, error) {
	p := &pid1{o: o, prepared: make(chan struct{})}
	p.log = hclog.New(&hclog.LoggerOptions{
		Name: "shim", Level: hclog.LevelFromString(o.level), JSONFormat: o.logFormat == "json", Output: os.Stderr,
	})
	// Signals next, so no SIGTERM is lost while setting up: which ones are
	// forwarded, dropped or left alone, and why, is in service.go.
	p.sigs = make(chan os.Signal, 128)
	signal.Notify(p.sigs, append(signalList(droppedSignals), forwardedSignals()...)...)
	protectPID1(p.log)
	if err := p.becomeInit(); err != nil {
		return p, 1, err
	}
	self, err := os.Executable()
	if err != nil {
		return p, 1, fmt.Errorf("cannot find shim's own binary: %w", err)
	}
	if err := os.MkdirAll(o.runtimeDir, 0o755); err != nil {
		return p, 1, fmt.Errorf("runtime dir: %w", err)
	}
	// Reaping has a goroutine of its own, so a fork stuck in exec (a hung
	// filesystem) never stalls signal forwarding or shutdown.
	p.rp = reaper.New()
	reapCtx, stopReaping := context.WithCancel(context.Background())
	p.closers = append(p.closers, stopReaping)
	go p.rp.Loop(reapCtx)

	if code, err := p.startRuntime(self); err != nil {
		return p, code, err
	}
	if err := p.startServing(); err != nil {
		return p, 1, err
	}
	if len(o.service) > 0 {
		svc, err := startService(p.rp, self, o.service, started)
		if err != nil {
			return p, 1, fmt.Errorf("service command: %w", err)
		}
		p.svc = svc
		p.servicePid.Store(int64(svc.proc.Pid))
		p.log.Info("service started", "pid", svc.proc.Pid, "command", strings.Join(o.service, " "))
	}
	go func() { defer close(p.prepared); p.rt.Prepare() }()
	return p, 0, nil
}

// protectPID1 makes PID 1 outlive the harness: exempt from the OOM killer
// (children get the default score back when shim starts them, or the
// highest where shim may not lower its own), and with threads made now, so
// that a harness that takes every pid cannot make the Go runtime fail to
// start one (a fatal error, not an error).
func protectPID1(log hclog.Logger) {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		log.Info("shim may not lower its OOM score here; its children get the highest instead", "error", err)
	}
	prewarmThreads(32)
}

// becomeInit makes shim the reaper of its sandbox: PID 1 already, or a
// child subreaper; with --mount-proc, with a /proc of its own.
func (p *pid1) becomeInit() error {
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("cannot become a child subreaper: %w", err)
		}
		p.log.Info("not PID 1: running as a child subreaper; orphans of harnesses are reaped here")
	}
	if p.o.mountProc {
		if err := mountFreshProc(); err != nil {
			return fmt.Errorf("--mount-proc: %w", err)
		}
	}
	return nil
}

// startRuntime finds the fencing mode and starts the generation state
// machine.
func (p *pid1) startRuntime(self string) (int, error) {
	o := p.o
	exempt := func(pid int) bool {
		// The service and what it runs (git daemon's children, say): a
		// sweep that killed them would end the service, and shim with it.
		// The control peers, and what the supervisor entered from outside
		// the namespace (docker exec): not the generation's.
		// One walk up the parents for both (a harness can fork a deep
		// chain: each walk is up to 256 reads of /proc).
		svc := int(p.servicePid.Load())
		if pid == svc && svc > 0 || p.rt != nil && p.rt.IsPeer(pid) {
			return true
		}
		l := cgroup.LineageOf(pid, svc)
		return l.Descends || l.Outside
	}
	cg, err := cgroup.New(cgroup.Config{Root: o.cgroupRoot, Mode: cgroup.Mode(o.mode), Exempt: exempt,
		MountDir: filepath.Join(o.runtimeDir, "cgroup2")}, p.log.Named("cgroup"))
	if err != nil {
		return 1, fmt.Errorf("no way to fence generations here: %w", err)
	}
	if err := cg.AdoptSelf(); err != nil {
		return 1, fmt.Errorf("cannot move shim into its own cgroup leaf: %w", err)
	}
	p.log.Info("fencing mode", "mode", cg.Mode(), "reason", cg.Reason())
	limits, err := defaultLimits(cg.Root(), o.defMemory, o.defPids)
	if err != nil {
		return 2, err
	}
	var ly *layers.Layers
	if o.isolation == "auto" {
		ly = layers.New(layers.Config{Dir: o.layersDir, RootSize: o.rootLayerSize, Persist: o.persist,
			Bind: []string{o.runtimeDir}, Keep: o.keepLayers, KeepBytes: o.keepLayersBytes, WorktreeSize: o.worktreeLayerSize,
			LowerGroup: uint32(o.lowerGroup), MinFree: max(o.layersReserve, 0)})
		p.closers = append(p.closers, func() { ly.Release() })
	}
	var copyOut *runtime.CopyOutput
	if o.copyOutput {
		copyOut = runtime.NewCopyOutput(os.Stdout, 0)
		p.closers = append(p.closers, copyOut.Close)
	}
	rt, err := runtime.New(runtime.Config{
		Layers: ly, RequireIsolation: o.requireIsolation, EventsKept: o.eventsKept, CopyOutput: copyOut,
		RuntimeDir: o.runtimeDir, Cgroups: cg, Reaper: p.rp, Log: p.log.Named("runtime"), ShimPath: self,
		AllowUIDs: o.allowUIDs, FreezeTimeout: o.freezeTimeout, KillTimeout: o.killTimeout,
		RestoreTimeout: o.restoreTimeout, GitTimeout: o.gitTimeout, ExitGrace: o.exitGrace, LogMax: o.logMax, ExecOutputMax: o.execOutputMax, Reserve: o.reserve,
		LayersReserve: o.layersReserve,
		DefaultLimits: limits, Subnet: o.subnet, KeepSnapshots: o.keep, Placement: o.placement, Version: version,
		KeepGenerations: o.keepGens, KeepBytes: o.keepBytes, AuditMaxBytes: o.auditMax, AuditKeep: o.auditKeep,
	})
	if err != nil {
		return 1, err
	}
	p.rt = rt
	p.closers = append(p.closers, func() { rt.Close() })
	return 0, nil
}

// startServing starts the credential broker, registers the --worktree
// worktrees (before anything can announce a generation), then serves the
// control API.
func (p *pid1) startServing() error {
	o, rt := p.o, p.rt
	ctx, cancel := context.WithCancel(context.Background())
	p.closers = append(p.closers, cancel)
	broker, err := creds.NewBroker(filepath.Join(o.runtimeDir, "cred.sock"), rt.Identify,
		func(event string, fields map[string]any) { rt.Audit(event, fields) }, p.log.Named("creds"))
	if err != nil {
		return fmt.Errorf("credential broker: %w", err)
	}
	p.broker = broker
	rt.SetBroker(broker)
	go func() {
		if err := broker.Serve(); err != nil {
			p.log.Error("credential broker stopped", "error", err)
		}
	}()
	p.closers = append(p.closers, func() { broker.Close() })
	for _, wt := range o.worktrees {
		reg, err := rt.Register(ctx, api.RegisterRequest{Worktree: wt})
		if err != nil {
			return fmt.Errorf("--worktree %s: %w", wt, err)
		}
		p.log.Info("worktree registered", "worktree", wt, "late", reg.Late)
	}
	sock := filepath.Join(o.runtimeDir, "shim.sock")
	go func() {
		if err := rt.Serve(ctx, sock, o.socketGroup); err != nil {
			p.log.Error("control API stopped", "error", err)
		}
	}()
	p.serveChannels(ctx)
	p.log.Info("shim ready", "pid", os.Getpid(), "socket", sock, "version", version)
	markReady()
	return nil
}

// loop is tini's loop: forward signals, note the service's exit, and end
// everything once: SIGTERM or the service's exit starts the shutdown
// (harness signalled, --grace, killed), and its end is shim's exit.
func (p *pid1) loop() int {
	var serviceDone, serviceExeced <-chan struct{}
	if p.svc != nil {
		serviceDone, serviceExeced = p.svc.proc.Done(), p.svc.execed
	}
	var held []syscall.Signal // for the service, until its own program runs
	var shutdown chan int
	var deadline time.Time // of the whole shutdown: one grace period, shared
	exitCode := 0
	startShutdown := func(reason string) {
		if shutdown != nil {
			return
		}
		p.log.Info("shutting down", "reason", reason, "grace", p.o.grace)
		shutdown = make(chan int, 1)
		deadline = time.Now().Add(p.o.grace)
		go func() { shutdown <- p.rt.Shutdown(p.o.grace) }()
	}
	for {
		select {
		case sig := <-p.sigs:
			s := sig.(syscall.Signal)
			if droppedSignals.has(s) {
				continue
			}
			p.rt.ForwardSignal(s)
			switch {
			case serviceDone == nil:
			case serviceExeced != nil:
				held = append(held, s)
			default:
				p.log.Debug("forwarding signal to the service", "signal", s.String())
				p.svc.signal(s)
			}
			if s == unix.SIGTERM {
				startShutdown("SIGTERM")
			}
		case <-serviceExeced:
			serviceExeced = nil
			for _, s := range held {
				p.svc.signal(s)
			}
			held = nil
		case <-serviceDone:
			serviceDone = nil
			exitCode = p.svc.proc.Exit().Code
			p.rt.ForwardSignal(unix.SIGTERM)
			startShutdown(fmt.Sprintf("service exited with %d", exitCode))
		case code := <-shutdown:
			if p.svc == nil {
				exitCode = code
			} else if serviceDone != nil {
				exitCode = stopService(p.svc, time.Until(deadline))
			}
			p.waitPrepared()
			p.log.Info("shim exits", "exit_code", exitCode)
			return exitCode
		}
	}
}

// waitPrepared waits (at most --kill-timeout) for the start-up probes.
func (p *pid1) waitPrepared() {
	select {
	case <-p.prepared:
	case <-time.After(p.o.killTimeout):
		p.log.Warn("start-up probes still running at exit; a tmp-probe cgroup may be left", "waited", p.o.killTimeout)
	}
}

// stopService gives the service what is left of the grace period after
// SIGTERM (already forwarded), then kills it.
func stopService(s *service, left time.Duration) int {
	select {
	case <-s.proc.Done():
		return s.proc.Exit().Code
	case <-time.After(max(left, 0)):
	}
	s.signal(unix.SIGKILL)
	return s.proc.Exit().Code
}

// flagGiven reports whether the flag name was set on the command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// mountFreshProc mounts a /proc of shim's own pid namespace. It refuses
// unless shim is PID 1 and in a mount namespace of its own: remounting the
// host's /proc would break the host.
func mountFreshProc() error {
	if os.Getpid() != 1 {
		return errors.New("only PID 1 of a new pid namespace may mount a fresh /proc")
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	// With the old /proc, /proc/1 is the init of the namespace that mounted it.
	theirs, err := os.Readlink("/proc/1/ns/mnt")
	if err == nil && theirs == self {
		return errors.New("shim shares its mount namespace with the host's init; start it in a new mount namespace")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	return nil
}
