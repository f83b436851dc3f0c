package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
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

// runInit is shim's main loop as PID 1: one place reaps, signals are
// forwarded, the control API and the credential broker serve, and SIGTERM
// (or the service's exit) shuts everything down.
func runInit(args []string) int {
	// First, before anything catches a signal: what shim was started with
	// ignored, which the service is started with (service.go).
	ignored := ignoredAtStart()
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	runtimeDir := fs.String("runtime-dir", defaultRuntimeDir(), "runtime dir (socket, state, audit log, generation output)")
	cgroupRoot := fs.String("cgroup-root", "", "cgroup dir shim owns (default: its own cgroup)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn, error (warn when a service command is given, so that its stderr carries only shim's warnings and errors)")
	grace := fs.Duration("grace", 8*time.Second, "on SIGTERM, how long the harness may take to exit before it is killed (under Docker's default 10s stop timeout)")
	mode := fs.String("mode", "", "force a fencing mode: cgroup2, cgroup1 or pidns (default: the best available)")
	mountProc := fs.Bool("mount-proc", false, "mount a fresh /proc (PID 1 of a new pid and mount namespace)")
	freezeTimeout := fs.Duration("freeze-timeout", 5*time.Second, "how long a freeze may take to be confirmed")
	killTimeout := fs.Duration("kill-timeout", 10*time.Second, "how long a killed generation may take to empty")
	subnet := fs.String("subnet", "", "link-local range for isolated generation networks (default 169.254.64.0/18)")
	keep := fs.Int("keep-snapshots", 0, "abandoned-edit refs kept per worktree (0 = all)")
	placement := fs.String("placement", "auto", "how harnesses enter their cgroup: auto, clone (clone3) or stub (re-exec, for seccomp that refuses clone3)")
	socketGroup := fs.Int("socket-group", -1, "group that may also use shim.sock (mode 0660), e.g. for a forwarded socket")
	exitGrace := fs.Duration("exit-grace", runtime.DefaultExitGrace, "after a harness exits, how long what it left running may go on before it is killed (its credentials and network are cut at once)")
	logMax := fs.Int64("log-max", runtime.DefaultLogMax, "cap in bytes of each generation's stdout and stderr files (what is past it is dropped and counted; -1 = no cap)")
	gitTimeout := fs.Duration("git-timeout", 60*time.Second, "deadline of every git shim runs")
	restoreTimeout := fs.Duration("restore-timeout", 5*time.Minute, "deadline of one worktree's save and restore")
	defMemory := fs.String("default-memory-max", "90%", "memory.max of a generation whose announcement sets none: bytes, a percentage of what shim's cgroup root may use, or 0 for none (only where the memory controller is available)")
	defPids := fs.String("default-pids-max", "90%", "pids.max of a generation whose announcement sets none: a number, a percentage of the pids shim's cgroup root may use, or 0 for none (only where the pids controller is available)")
	var worktrees strList
	fs.Var(&worktrees, "worktree", "register this worktree at start-up, before any harness runs (the trusted registration; repeatable)")
	var allowUIDs intList
	fs.Var(&allowUIDs, "allow-uid", "uid allowed on the control socket besides root (repeatable)")
	fs.Usage = func() {} // printed below: on stdout for -h, as tini does
	if err := fs.Parse(args); err != nil {
		out, code := os.Stderr, 2
		if errors.Is(err, flag.ErrHelp) {
			out, code = os.Stdout, 0
		}
		fmt.Fprintln(out, "usage: shim init [flags] [-- SERVICE CMD...]")
		fs.SetOutput(out)
		fs.PrintDefaults()
		return code
	}
	serviceArgv := fs.Args()
	level := *logLevel
	if len(serviceArgv) > 0 && !flagGiven(fs, "log-level") {
		// tini prints nothing unless it warns: the service's stderr is
		// shim's, and INFO lines there would be mixed into its output.
		level = "warn"
	}
	if *logFormat != "text" && *logFormat != "json" {
		fmt.Fprintln(os.Stderr, "shim init: --log-format must be text or json")
		return 2
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name: "shim", Level: hclog.LevelFromString(level), JSONFormat: *logFormat == "json", Output: os.Stderr,
	})

	// Signals next, so no SIGTERM is lost while setting up: which ones are
	// forwarded, dropped or left alone, and why, is in service.go.
	sigs := make(chan os.Signal, 128)
	signal.Notify(sigs, append(signalList(droppedSignals), forwardedSignals()...)...)

	// PID 1 must outlive the harness: exempt from the OOM killer (children
	// get the default score back when shim starts them), and with threads
	// made now, so that a harness that takes every pid cannot make the Go
	// runtime fail to start one (a fatal error, not an error).
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		log.Info("shim may not lower its OOM score here; its children get the highest instead", "error", err)
	}
	prewarmThreads(32)

	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			log.Error("cannot become a child subreaper", "error", err)
			return 1
		}
		log.Info("not PID 1: running as a child subreaper; orphans of harnesses are reaped here")
	}
	if *mountProc {
		if err := mountFreshProc(); err != nil {
			log.Error("--mount-proc", "error", err)
			return 1
		}
	}
	self, err := os.Executable()
	if err != nil {
		log.Error("cannot find shim's own binary", "error", err)
		return 1
	}
	if err := os.MkdirAll(*runtimeDir, 0o755); err != nil {
		log.Error("runtime dir", "error", err)
		return 1
	}
	// Reaping has a goroutine of its own, so a fork stuck in exec (a hung
	// filesystem) never stalls signal forwarding or shutdown.
	rp := reaper.New()
	reapCtx, stopReaping := context.WithCancel(context.Background())
	defer stopReaping()
	go rp.Loop(reapCtx)

	var rt *runtime.Runtime
	var servicePid atomic.Int64 // read by the cgroup manager's sweeps
	exempt := func(pid int) bool { return int64(pid) == servicePid.Load() || rt != nil && rt.IsPeer(pid) }
	cg, err := cgroup.New(cgroup.Config{Root: *cgroupRoot, Mode: cgroup.Mode(*mode), Exempt: exempt,
		MountDir: filepath.Join(*runtimeDir, "cgroup2")}, log.Named("cgroup"))
	if err != nil {
		log.Error("no way to fence generations here", "error", err)
		fmt.Fprintf(os.Stderr, "shim init: %v\n", err)
		return 1
	}
	if err := cg.AdoptSelf(); err != nil {
		log.Error("cannot move shim into its own cgroup leaf", "error", err)
		return 1
	}
	log.Info("fencing mode", "mode", cg.Mode(), "reason", cg.Reason())
	limits, err := defaultLimits(cg.Root(), *defMemory, *defPids)
	if err != nil {
		fmt.Fprintf(os.Stderr, "shim init: %v\n", err)
		return 2
	}

	rt, err = runtime.New(runtime.Config{
		RuntimeDir: *runtimeDir, Cgroups: cg, Reaper: rp, Log: log.Named("runtime"), ShimPath: self,
		AllowUIDs: allowUIDs, FreezeTimeout: *freezeTimeout, KillTimeout: *killTimeout,
		RestoreTimeout: *restoreTimeout, GitTimeout: *gitTimeout, ExitGrace: *exitGrace, LogMax: *logMax,
		DefaultLimits: limits, Subnet: *subnet, KeepSnapshots: *keep, Placement: *placement, Version: version,
	})
	if err != nil {
		log.Error("runtime", "error", err)
		fmt.Fprintf(os.Stderr, "shim init: %v\n", err)
		return 1
	}
	defer rt.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	broker, err := creds.NewBroker(filepath.Join(*runtimeDir, "cred.sock"), rt.Identify,
		func(event string, fields map[string]any) { rt.Audit(event, fields) }, log.Named("creds"))
	if err != nil {
		log.Error("credential broker", "error", err)
		return 1
	}
	rt.SetBroker(broker)
	go func() {
		if err := broker.Serve(); err != nil {
			log.Error("credential broker stopped", "error", err)
		}
	}()
	defer broker.Close()
	for _, wt := range worktrees {
		reg, err := rt.Register(ctx, api.RegisterRequest{Worktree: wt})
		if err != nil {
			log.Error("--worktree", "worktree", wt, "error", err)
			fmt.Fprintf(os.Stderr, "shim init: --worktree %s: %v\n", wt, err)
			return 1
		}
		log.Info("worktree registered", "worktree", wt, "late", reg.Late)
	}
	sock := filepath.Join(*runtimeDir, "shim.sock")
	go func() {
		if err := rt.Serve(ctx, sock, *socketGroup); err != nil {
			log.Error("control API stopped", "error", err)
		}
	}()
	log.Info("shim ready", "pid", os.Getpid(), "socket", sock, "version", version)

	var serviceDone, serviceExeced <-chan struct{}
	var svc *service
	var held []syscall.Signal // for the service, until it runs
	if len(serviceArgv) > 0 {
		svc, err = startService(rp, self, serviceArgv, ignored)
		if err != nil {
			log.Error("service command", "error", err)
			fmt.Fprintf(os.Stderr, "shim init: service command: %v\n", err)
			return 1
		}
		servicePid.Store(int64(svc.proc.Pid))
		serviceDone, serviceExeced = svc.proc.Done(), svc.execed
		log.Info("service started", "pid", svc.proc.Pid, "command", strings.Join(serviceArgv, " "))
	}

	// The start-up probes run beside the service; shim waits for them
	// before it exits, or a service that exits at once would leave the
	// probe's cgroup behind.
	prepared := make(chan struct{})
	go func() { defer close(prepared); rt.Prepare() }()
	var shutdown chan int
	var deadline time.Time // of the whole shutdown: one grace period, shared
	exitCode := 0
	startShutdown := func(reason string) {
		if shutdown != nil {
			return
		}
		log.Info("shutting down", "reason", reason, "grace", *grace)
		shutdown = make(chan int, 1)
		deadline = time.Now().Add(*grace)
		go func() { shutdown <- rt.Shutdown(*grace) }()
	}
	for {
		select {
		case sig := <-sigs:
			s := sig.(syscall.Signal)
			if droppedSignals.has(s) {
				continue
			}
			rt.ForwardSignal(s)
			switch {
			case serviceDone == nil:
			case serviceExeced != nil:
				held = append(held, s)
			default:
				log.Debug("forwarding signal to the service", "signal", s.String())
				svc.signal(s)
			}
			if s == unix.SIGTERM {
				startShutdown("SIGTERM")
			}
		case <-serviceExeced:
			serviceExeced = nil
			for _, s := range held {
				svc.signal(s)
			}
			held = nil
		case <-serviceDone:
			serviceDone = nil
			exitCode = svc.proc.Exit().Code
			rt.ForwardSignal(unix.SIGTERM)
			startShutdown(fmt.Sprintf("service exited with %d", exitCode))
		case code := <-shutdown:
			if svc == nil {
				exitCode = code
			} else if serviceDone != nil {
				exitCode = stopService(svc, time.Until(deadline))
			}
			select {
			case <-prepared:
			case <-time.After(*killTimeout):
				log.Warn("start-up probes still running at exit; a tmp-probe cgroup may be left", "waited", *killTimeout)
			}
			cancel()
			log.Info("shim exits", "exit_code", exitCode)
			return exitCode
		}
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
