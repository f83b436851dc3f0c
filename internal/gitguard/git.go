package gitguard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Runner runs one git command to completion, like exec.Cmd.Run: a non-zero
// exit is an error (an *exec.ExitError or one wrapping it), cmd.Stdin,
// cmd.Stdout and cmd.Stderr may be any reader and writers, and
// cmd.SysProcAttr.Credential must be kept as set. Run must kill git (with
// SIGKILL, or by killing its cgroup) as soon as ctx is done and then
// return: the per-call deadline (Config.GitTimeout) relies on it. Run may be
// called from several goroutines at once.
type Runner interface {
	Run(ctx context.Context, cmd *exec.Cmd) error
}

// NetworkRunner is a Runner that confines git away from the network (an
// empty network namespace) by default and can also run the one git that
// needs it: the fetch of Fetch and WithFetch. A Runner that does not
// implement it runs that git with Run too, so it must then give git the
// network it has (ExecRunner does: it confines nothing).
type NetworkRunner interface {
	Runner
	// RunWithNetwork is Run, except that cmd keeps the network namespace
	// of the caller (the sandbox's network).
	RunWithNetwork(ctx context.Context, cmd *exec.Cmd) error
}

// ExecRunner runs git as a plain child process and kills it when ctx ends.
type ExecRunner struct{}

// execWaitDelay bounds how long Wait keeps reading git's output after git
// exited: a child git started (a remote helper) may hold the pipes open.
const execWaitDelay = 5 * time.Second

// Run starts cmd, kills it if ctx is done first, and waits for it.
func (ExecRunner) Run(ctx context.Context, cmd *exec.Cmd) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = execWaitDelay
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	return waitOrKill(ctx, cmd)
}

// waitOrKill waits for the started cmd and kills it (SIGKILL, which also
// ends a stopped process) as soon as ctx is done. It returns only once its
// watcher goroutine has ended too.
func waitOrKill(ctx context.Context, cmd *exec.Cmd) error {
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
			_ = cmd.Process.Kill()
		case <-done:
		}
	}()
	//shimlint:allow onereaper: ExecRunner is the runner outside PID 1 (tests, ctl); as PID 1 the runtime gives gitguard the reaper's runner
	err := cmd.Wait()
	close(done)
	<-watched
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// GitError is a failed git invocation: the arguments (without the -c
// overrides), the exit error and the start of stderr.
type GitError struct {
	Args   []string
	Err    error
	Stderr string
}

func (e *GitError) Error() string {
	s := "git " + strings.Join(e.Args, " ") + ": " + e.Err.Error()
	if e.Stderr != "" {
		s += ": " + e.Stderr
	}
	return s
}

func (e *GitError) Unwrap() error { return e.Err }

// gitOpts are the per-call settings of one git invocation.
type gitOpts struct {
	index  string    // GIT_INDEX_FILE, "" for the real index
	stdin  io.Reader // nil: empty
	stdout io.Writer // nil: captured and returned
	env    []string  // extra variables (author, ...)
	quiet  bool      // do not keep stderr (used for probes)
	config []string  // extra -c settings of this call
	// network: run with the sandbox's network (NetworkRunner.RunWithNetwork).
	// Only the fetch sets it.
	network bool
	// timeout replaces Config.GitTimeout for this call (the fetch's own).
	timeout time.Duration
	// warnings, if set, receives git's stderr when it succeeds too
	// (warnings such as a directory it could not open).
	warnings *string
	// noRepo runs git outside any repository (GIT_DIR a path that does not
	// exist, cwd /): for `git config --file -` on bytes shim read itself, so
	// git opens nothing of the worktree.
	noRepo bool
}

// hardenedConfig are the -c overrides of every invocation. Command-line
// configuration has the highest precedence, so these win over anything a
// harness may have left in a config file (the pristine copy is restored
// first anyway; these also cover files the pristine config includes).
var hardenedConfig = []string{
	"core.fsmonitor=false",
	"core.hooksPath=/dev/null", // hooks are looked up under a non-directory: none runs
	"core.untrackedCache=false",
	"core.splitIndex=false",
	"core.commitGraph=false",    // a forged commit-graph could change what a commit's tree is
	"core.multiPackIndex=false", // likewise a forged multi-pack-index
	"core.bare=false",
	"core.fileMode=true",
	"core.symlinks=true",
	"core.trustctime=true",
	"core.checkStat=default",
	"core.autocrlf=false",
	"core.safecrlf=false",
	"core.attributesFile=/dev/null",
	"core.pager=cat",
	"core.editor=false",
	"sequence.editor=false",
	"core.askPass=",
	"core.sshCommand=false",
	"core.gitProxy=",
	"core.quotePath=false",
	"credential.helper=",
	"protocol.allow=never",
	"diff.external=",
	"submodule.recurse=false",
	"commit.gpgSign=false",
	"tag.gpgSign=false",
	"gc.auto=0",
	// What git writes at a fence (fast-import's pack, update-ref's refs)
	// reaches the disk before git exits (git 2.36+; older ones ignore
	// it); shim syncs the directories (syncRef).
	"core.fsync=objects,reference",
	"core.fsyncMethod=fsync",
	"core.logAllRefUpdates=false", // shim's own ref updates need no reflog (a planted one is only appended to)
	"maintenance.auto=false",
	"trace2.normalTarget=",
	"trace2.perfTarget=",
	"trace2.eventTarget=",
	"color.ui=false",
	"advice.addEmbeddedRepo=false",
	"advice.detachedHead=false",
	"advice.statusHints=false",
}

// noHome is git's HOME: a path that does not exist.
const noHome = "/nonexistent/shim"

// baseEnv is the fixed part of the environment. Nothing is inherited.
func (g *Guard) baseEnv() []string {
	return []string{
		"PATH=/usr/bin:/bin",
		// A HOME that does not exist: git reads no user configuration or
		// ignore file, and does not warn about one it cannot read (git
		// runs as the worktree owner, who cannot enter StateDir).
		"HOME=" + noHome,
		"XDG_CONFIG_HOME=" + noHome + "/.config",
		"LC_ALL=C",
		"TZ=UTC",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_ATTR_NOSYSTEM=1",
		"GIT_NO_REPLACE_OBJECTS=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_OPTIONAL_LOCKS=0",
		"GIT_PROTOCOL_FROM_USER=0",
		"GIT_NO_LAZY_FETCH=1",
		"GIT_ASKPASS=",
		"SSH_ASKPASS=",
		"GIT_EDITOR=false",
		"GIT_PAGER=cat",
		gitMalloc,
	}
}

// gitMalloc keeps glibc's malloc from giving memory back between the
// objects git writes: each object's zlib stream allocates about 256 KiB
// and frees it, and by default glibc trims (or unmaps) it every time, so
// the next object faults it in again. A fast-import of a generation's
// 150 changed files and their trees took 46 ms that way and 26 ms with
// these (medians of 11, this project's development VM). git is
// short-lived: what it keeps goes with it. Ignored by a git linked
// against another libc.
const gitMalloc = "GLIBC_TUNABLES=glibc.malloc.trim_threshold=67108864:glibc.malloc.mmap_threshold=33554432"

// args builds the full argument list: global options, the hardened -c
// overrides, the filter neutralisers, then the command.
func (g *Guard) args(extra, cmd []string) []string {
	a := make([]string, 0, 2+2*len(hardenedConfig)+8*len(g.filters)+len(cmd))
	a = append(a, "--no-pager", "--no-replace-objects")
	for _, c := range hardenedConfig {
		a = append(a, "-c", c)
	}
	for _, f := range g.filters {
		a = append(a,
			"-c", "filter."+f+".clean=",
			"-c", "filter."+f+".smudge=",
			"-c", "filter."+f+".process=",
			"-c", "filter."+f+".required=false")
	}
	for _, c := range extra {
		a = append(a, "-c", c)
	}
	return append(a, cmd...)
}

// git runs one hardened git command in the worktree and returns its stdout
// (unless o.stdout is set). Every invocation has its own deadline
// (Config.GitTimeout, or o.timeout) on top of ctx: a git blocked on a FIFO
// the harness planted, or stopped by it (same uid), is killed by the Runner
// then, and the error says it timed out (it wraps
// context.DeadlineExceeded).
func (g *Guard) git(ctx context.Context, o gitOpts, args ...string) ([]byte, error) {
	bin := g.gitBin
	if !strings.Contains(bin, "/") {
		// Look the binary up in the hardened PATH, not the shim's own.
		p, err := lookPath(bin)
		if err != nil {
			return nil, err
		}
		bin = p
	}
	cmd := exec.Command(bin, g.args(o.config, args)...)
	env := g.baseEnv()
	if o.noRepo {
		cmd.Dir = "/"
		env = append(env, "GIT_DIR="+noHome)
	} else {
		cmd.Dir = g.wt
		if g.wt != g.name {
			// A locked lower's view: git, given both paths, goes to the
			// worktree's top itself; its cwd does not name the view.
			cmd.Dir = "/"
		}
		env = append(env, "GIT_DIR="+g.gitDir, "GIT_WORK_TREE="+g.wt)
	}
	if o.index != "" {
		env = append(env, "GIT_INDEX_FILE="+o.index)
	}
	cmd.Env = append(env, o.env...)
	if o.stdin != nil {
		cmd.Stdin = o.stdin
	}
	var out bytes.Buffer
	if o.stdout != nil {
		cmd.Stdout = o.stdout
	} else {
		cmd.Stdout = &out
	}
	stderr := &capWriter{max: 4096}
	cmd.Stderr = stderr
	// Outside any repository nothing of the owner's is read or written, so
	// git runs as shim. Inside one it runs as the owner, so that what it
	// writes is the owner's, and with OwnerCaps: a process of the owner's
	// uid (a live harness, a `docker exec -u` of the same uid) can then
	// neither ptrace it nor open its /proc/<pid>/root, cwd, fd or mem (the
	// kernel asks a process that reaches into another for every
	// capability the other holds), so it cannot write the checkout
	// through git's view of it, nor take git over with its network and
	// broker grant.
	if g.asOwner && !o.noRepo {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential:  &syscall.Credential{Uid: uint32(g.uid), Gid: uint32(g.gid), Groups: g.ownerGroups()},
			AmbientCaps: OwnerCaps(),
		}
	}
	run := g.runner.Run
	if nr, ok := g.runner.(NetworkRunner); ok && o.network {
		run = nr.RunWithNetwork
	}
	timeout := o.timeout
	if timeout <= 0 {
		timeout = g.gitTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := run(cctx, cmd); err != nil {
		msg := ""
		if !o.quiet {
			msg = strings.TrimSpace(stderr.String())
		}
		return out.Bytes(), &GitError{Args: args, Err: deadlineError(ctx, cctx, timeout, err), Stderr: msg}
	}
	if o.warnings != nil {
		*o.warnings = stderr.String()
	}
	return out.Bytes(), nil
}

// deadlineError says so when err came from the per-call deadline (and not
// from the caller's ctx), wrapping context.DeadlineExceeded.
func deadlineError(ctx, cctx context.Context, timeout time.Duration, err error) error {
	if ctx.Err() != nil || !errors.Is(cctx.Err(), context.DeadlineExceeded) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("timed out after %s and was killed: %w", timeout, err)
	}
	return fmt.Errorf("timed out after %s and was killed (%v): %w", timeout, err, context.DeadlineExceeded)
}

// lookPath finds name in the hardened PATH only.
func lookPath(name string) (string, error) {
	for _, dir := range []string{"/usr/bin", "/bin", "/usr/local/bin"} {
		p := dir + "/" + name
		if err := syscall.Access(p, 1); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in /usr/bin, /bin or /usr/local/bin", name)
}

// capWriter keeps the first max bytes written to it.
type capWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (w *capWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.max - w.buf.Len(); room > 0 {
		if len(p) > room {
			w.buf.Write(p[:room])
		} else {
			w.buf.Write(p)
		}
	}
	return len(p), nil
}

func (w *capWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// parallel runs fns concurrently and returns the first error.
func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, f := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
