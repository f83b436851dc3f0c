package integration

// Tests of `shim init -- CMD` as an init in tini's place: exit codes,
// process groups and the terminal, signal forwarding, the signal state the
// service starts with, quiet logs and no cgroup left behind. Each runs shim
// as PID 1 of new pid and mount namespaces and as a child subreaper, and
// most run Debian's tini the same way as the reference.

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/testutil"
)

// helperArg makes the test binary a helper program instead of a test run:
// the helper is started by the inits under test (see runHelper).
const helperArg = "__shim_it_helper"

func init() {
	if len(os.Args) > 2 && os.Args[1] == helperArg {
		os.Exit(runHelper(os.Args[2], os.Args[3:]))
	}
}

// initOpts is one run of an init (shim, or tini for reference) with a
// service.
type initOpts struct {
	tini    bool             // run /usr/bin/tini instead of shim
	pid1    bool             // PID 1 of new pid and mount namespaces; else a child subreaper
	tty     bool             // a pseudo-terminal as controlling terminal and stdio
	nested  bool             // with pid1 and tty: the session's leader and foreground group are outside the namespace (unshare -fp)
	ignore  []syscall.Signal // started with exactly these ignored (tini's sigconf-test); nil: as the test was
	block   []syscall.Signal // started with exactly these blocked; nil: as the test was
	args    []string         // extra shim init flags
	env     []string         // extra environment
	service []string
}

func (o initOpts) name() string {
	n := "shim"
	if o.tini {
		n = "tini"
	}
	if o.pid1 && o.nested {
		return n + "-pid1-nested"
	}
	if o.pid1 {
		return n + "-pid1"
	}
	return n + "-subreaper"
}

// initRun is a running init. Its processes live in a cgroup of the test's
// own, killed and removed at cleanup.
type initRun struct {
	t      testing.TB
	cmd    *exec.Cmd
	out    *syncBuffer // stdout and stderr (the terminal's output with tty)
	master *os.File    // the terminal's master side, with tty
	cgroup string      // shim's cgroup root
	done   chan struct{}
	code   int
}

// everyInit is the four ways the tests run an init: shim and tini, each
// as PID 1 and as a subreaper.
var everyInit = []initOpts{{pid1: true}, {}, {tini: true, pid1: true}, {tini: true}}

func startInit(t testing.TB, o initOpts) *initRun {
	t.Helper()
	requireRoot(t)
	if o.tini {
		testutil.NeedTool(t, "tini")
	}
	// The run starts in cg/run; shim's own cgroup root is cg/root, where
	// it moves itself (and no process of the test is).
	cg := filepath.Join(cgroup2Mount(), randName("shim-it-init-"))
	for _, d := range []string{cg, filepath.Join(cg, "run")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var argv []string
	switch {
	case o.tini && o.pid1:
		argv = []string{"/usr/bin/tini", "--"}
	case o.tini:
		argv = []string{"/usr/bin/tini", "-s", "--"}
	default:
		argv = []string{shimBin, "init", "--runtime-dir", t.TempDir(), "--cgroup-root", filepath.Join(cg, "root"),
			"--isolation", "scan"} // the PID-1 behaviour is the same either way; no layers dir on the host
		if o.pid1 {
			argv = append(argv, "--mount-proc")
		}
		argv = append(append(argv, o.args...), "--")
	}
	argv = append(argv, o.service...)
	if o.ignore != nil || o.block != nil {
		argv = append([]string{helperBin(t), helperArg, "sigconf", sigNums(o.ignore), sigNums(o.block), "--"}, argv...)
	}
	if o.nested {
		argv = append([]string{helperBin(t), helperArg, "forkns", "--"}, argv...)
	}
	cgfd, err := unix.Open(filepath.Join(cg, "run"), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(cgfd)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, o.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, UseCgroupFD: true, CgroupFD: cgfd}
	if o.pid1 && !o.nested {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
	}
	r := &initRun{t: t, cmd: cmd, out: &syncBuffer{}, cgroup: filepath.Join(cg, "root"), done: make(chan struct{})}
	var slave *os.File
	if o.tty {
		r.master, slave = openPty(t)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
		go io.Copy(r.out, r.master)
	} else {
		cmd.Stdout, cmd.Stderr = r.out, r.out
	}
	cmd.WaitDelay = 10 * time.Second // output still open after the init exited
	if err := cmd.Start(); err != nil {
		removeCgroupTree(t, cg)
		t.Fatalf("start %s: %v", o.name(), err)
	}
	if slave != nil {
		slave.Close()
	}
	go func() {
		err := cmd.Wait()
		r.code = cmd.ProcessState.ExitCode()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				r.code = 128 + int(ws.Signal())
			}
		}
		close(r.done)
	}()
	t.Cleanup(func() {
		// Everything the run started is in cg: a subreaper's service
		// outlives the init, and would hold its output open.
		r.cmd.Process.Kill()
		os.WriteFile(filepath.Join(cg, "cgroup.kill"), []byte("1"), 0)
		<-r.done
		removeCgroupTree(t, cg)
		if r.master != nil {
			r.master.Close()
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", o.name(), r.out.String())
		}
	})
	return r
}

// wait waits for the init to exit and returns its exit code.
func (r *initRun) wait(timeout time.Duration) int {
	r.t.Helper()
	select {
	case <-r.done:
		return r.code
	case <-time.After(timeout):
		r.t.Fatalf("init still running after %s; output:\n%s", timeout, r.out.String())
		return 0
	}
}

func (r *initRun) alive() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// waitFor waits until the output matches re at least n times.
func (r *initRun) waitFor(re *regexp.Regexp, n int) {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(re.FindAllString(r.out.String(), -1)) < n {
		if !r.alive() {
			r.t.Fatalf("init exited (code %d) before %d× %q appeared", r.code, n, re)
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %d× %q", n, re)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *initRun) count(re *regexp.Regexp) int { return len(re.FindAllString(r.out.String(), -1)) }

func (r *initRun) signal(sig syscall.Signal) {
	r.t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("signal %v to the init: %v", sig, err)
	}
}

func (r *initRun) typeKeys(s string) {
	r.t.Helper()
	if _, err := r.master.WriteString(s); err != nil {
		r.t.Fatal(err)
	}
}

// foreground is the terminal's foreground process group (a pid of the
// test's namespace).
func (r *initRun) foreground() int {
	var pgrp int
	var err error
	c, _ := r.master.SyscallConn()
	c.Control(func(fd uintptr) { pgrp, err = unix.IoctlGetInt(int(fd), unix.TIOCGPGRP) })
	if err != nil {
		r.t.Fatalf("TIOCGPGRP: %v", err)
	}
	return pgrp
}

// openPty opens a pseudo-terminal pair; neither becomes the test's
// controlling terminal. The master stays pollable, so closing it ends the
// copy of its output.
func openPty(t testing.TB) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	var n uint32
	c, _ := m.SyscallConn()
	c.Control(func(fd uintptr) {
		if err = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); err == nil {
			n, err = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
		}
	})
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m, s
}

func helperBin(t testing.TB) string {
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func helper(t testing.TB, mode string) []string { return []string{helperBin(t), helperArg, mode} }

func sigNums(sigs []syscall.Signal) string {
	var s []string
	for _, sig := range sigs {
		s = append(s, strconv.Itoa(int(sig)))
	}
	return strings.Join(s, ",")
}

// procStat is the pid, process group and session of /proc/PID/stat text.
func procStat(t testing.TB, stat string) (pid, pgrp, sid int) {
	t.Helper()
	i := strings.LastIndexByte(stat, ')')
	f := strings.Fields(stat[i+1:])
	if i < 0 || len(f) < 4 {
		t.Fatalf("not a stat line: %q", stat)
	}
	pid, _ = strconv.Atoi(strings.Fields(stat)[0])
	pgrp, _ = strconv.Atoi(f[2])
	sid, _ = strconv.Atoi(f[3])
	return pid, pgrp, sid
}

func TestInitExitCodes(t *testing.T) {
	dir := t.TempDir()
	noexec := filepath.Join(dir, "noexec")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Found in PATH but not executable: execvp's EACCES, 126.
	if err := os.WriteFile(filepath.Join(dir, "shim-it-noexec"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	noShebang := filepath.Join(dir, "noshebang")
	if err := os.WriteFile(noShebang, []byte("exit 9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		service []string
		want    int
	}{
		{"own code", []string{"sh", "-c", "exit 3"}, 3},
		{"zero", []string{"true"}, 0},
		{"killed by a signal", []string{"sh", "-c", "kill -KILL $$"}, 128 + 9},
		{"not found", []string{"shim-it-no-such-command"}, 127},
		{"no such path", []string{filepath.Join(dir, "missing")}, 127},
		{"not executable", []string{noexec}, 126},
		{"a directory", []string{dir}, 126},
		{"not executable in PATH", []string{"shim-it-noexec"}, 126},
		{"no #! line (run by sh, as execvp does)", []string{noShebang}, 9},
	}
	for _, o := range everyInit {
		t.Run(o.name(), func(t *testing.T) {
			for _, c := range cases {
				o := o
				o.service = c.service
				o.env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin:" + dir}
				if got := startInit(t, o).wait(20 * time.Second); got != c.want {
					t.Errorf("%s: exit %d, want %d", c.name, got, c.want)
				}
			}
		})
	}
	t.Run("help", func(t *testing.T) {
		for _, arg := range []string{"-h", "--help"} {
			cmd := exec.Command(shimBin, "init", arg)
			out, err := cmd.Output()
			if err != nil || !strings.Contains(string(out), "-runtime-dir") {
				t.Errorf("shim init %s: %v, stdout %q", arg, err, out)
			}
		}
		testutil.NeedTool(t, "tini")
		if err := exec.Command("tini", "-h").Run(); err != nil {
			t.Errorf("reference: tini -h: %v", err)
		}
	})
	t.Run("killed by a forwarded SIGTERM", func(t *testing.T) {
		for _, o := range everyInit {
			o.service = []string{"sh", "-c", "echo ready; exec sleep 1000"}
			r := startInit(t, o)
			r.waitFor(regexp.MustCompile(`ready`), 1)
			r.signal(syscall.SIGTERM)
			if got := r.wait(20 * time.Second); got != 128+15 {
				t.Errorf("%s: exit %d, want %d", o.name(), got, 128+15)
			}
		}
	})
}

// TestInitServiceProcessGroup: the service leads a process group of its
// own, in the init's session (tini's isolate_child).
func TestInitServiceProcessGroup(t *testing.T) {
	for _, o := range everyInit {
		t.Run(o.name(), func(t *testing.T) {
			o.service = []string{"cat", "/proc/self/stat"}
			r := startInit(t, o)
			if code := r.wait(20 * time.Second); code != 0 {
				t.Fatalf("exit %d: %s", code, r.out.String())
			}
			out := strings.TrimSpace(r.out.String())
			pid, pgrp, _ := procStat(t, out[strings.LastIndex(out, "\n")+1:])
			if pgrp != pid {
				t.Fatalf("service pid %d is in process group %d, want its own", pid, pgrp)
			}
		})
	}
}

// TestInitHarnessOwnSession: each generation's harness leads a session
// (and so a process group) of its own.
func TestInitHarnessOwnSession(t *testing.T) {
	s := startShim(t, shimOpts{service: []string{"sleep", "1000"}})
	var r api.StartResult
	s.MustCtl(&r, "start", "--generation", "1", "--", "sleep", "1000")
	var pids []string
	eventually(t, 10*time.Second, "the harness in its cgroup", func() bool {
		b, _ := os.ReadFile(filepath.Join(r.Cgroup, "cgroup.procs"))
		pids = strings.Fields(string(b))
		return len(pids) == 1
	})
	stat, err := os.ReadFile("/proc/" + pids[0] + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	pid, pgrp, sid := procStat(t, string(stat))
	if pgrp != pid || sid != pid {
		t.Fatalf("harness %d: process group %d, session %d; want both its own", pid, pgrp, sid)
	}
}

var (
	reReady  = regexp.MustCompile(`ready pid=(\d+)`)
	reSigN   = func(sig syscall.Signal) *regexp.Regexp { return regexp.MustCompile(fmt.Sprintf(`sig %d\r?\n`, sig)) }
	reAnySig = regexp.MustCompile(`sig (\d+)\r?\n`)
)

// TestInitTerminalSignalsOnce: with a terminal, the service's group is the
// foreground group, so Ctrl-C reaches the service once (from the terminal)
// and not a second time from the init. After each key, a SIGUSR1 sent to
// the init and forwarded behind it marks the point by which a duplicate
// SIGINT would have arrived.
func TestInitTerminalSignalsOnce(t *testing.T) {
	for _, o := range everyInit {
		t.Run(o.name(), func(t *testing.T) {
			o.tty, o.service = true, helper(t, "signals")
			r := startInit(t, o)
			r.waitFor(reReady, 1)
			fg := r.foreground()
			if fg == r.cmd.Process.Pid {
				t.Fatalf("the init's group %d is the terminal's foreground group, not the service's", fg)
			}
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", fg))
			if err != nil {
				t.Fatal(err)
			}
			if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); f[1] != strconv.Itoa(r.cmd.Process.Pid) {
				t.Fatalf("foreground group %d is not led by the init's child (parent %s)", fg, f[1])
			}
			for i := 1; i <= 5; i++ {
				r.typeKeys("\x03")
				r.waitFor(reSigN(syscall.SIGINT), i)
				r.signal(syscall.SIGUSR1)
				r.waitFor(reSigN(syscall.SIGUSR1), i)
			}
			if n := r.count(reSigN(syscall.SIGINT)); n != 5 {
				t.Fatalf("5 Ctrl-C reached the service %d times", n)
			}
		})
	}
}

// TestInitJobControl: an interactive dash run as the service gets the
// terminal, hands it to a job, gets it back when the job stops (Ctrl-Z),
// resumes it with fg, and exits with its own code. The nested layout is
// the one where dash used to exit 2 ("Cannot set tty process group"): it
// found the terminal's foreground group outside its pid namespace and
// could not give it back.
func TestInitJobControl(t *testing.T) {
	testutil.NeedTool(t, "dash")
	for _, o := range append(everyInit, initOpts{pid1: true, nested: true}, initOpts{tini: true, pid1: true, nested: true}) {
		t.Run(o.name(), func(t *testing.T) {
			o.tty, o.service, o.env = true, []string{"dash", "-i"}, []string{"PS1=PROMPT> "}
			r := startInit(t, o)
			prompt := regexp.MustCompile(`PROMPT> `)
			r.waitFor(prompt, 1)
			shell := r.foreground()
			onJob := func(want bool) func() bool {
				return func() bool { return r.alive() && (r.foreground() != shell) == want }
			}
			r.typeKeys("cat\n")
			eventually(t, 20*time.Second, "cat in the foreground", onJob(true))
			r.typeKeys("\x1a") // Ctrl-Z
			eventually(t, 20*time.Second, "the shell back in the foreground", onJob(false))
			r.waitFor(regexp.MustCompile(`Stopped`), 1)
			r.typeKeys("fg\n")
			eventually(t, 20*time.Second, "cat in the foreground again", onJob(true))
			r.typeKeys("\x03")
			eventually(t, 20*time.Second, "the shell back after Ctrl-C", onJob(false))
			r.typeKeys("exit 7\n")
			if code := r.wait(20 * time.Second); code != 7 {
				t.Fatalf("exit %d, want 7 (2 is dash's 'Cannot set tty process group')", code)
			}
		})
	}
}

// forwardedByShim is every signal shim forwards (cmd/shim/service.go).
func forwardedByShim() []syscall.Signal {
	out := []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
		syscall.SIGALRM, syscall.SIGSTKFLT, syscall.SIGCONT, syscall.SIGTSTP, syscall.SIGXCPU, syscall.SIGXFSZ,
		syscall.SIGVTALRM, syscall.SIGWINCH, syscall.SIGIO, syscall.SIGPWR}
	for s := syscall.Signal(35); s <= 64; s++ {
		out = append(out, s)
	}
	return out
}

// TestInitForwardsSignals: every signal shim forwards reaches the service
// (tini's run shows the same list), SIGTERM last, after which the service
// exits 0 and so does the init.
func TestInitForwardsSignals(t *testing.T) {
	for _, o := range everyInit {
		t.Run(o.name(), func(t *testing.T) {
			o.service = helper(t, "signals")
			r := startInit(t, o)
			r.waitFor(reReady, 1)
			for _, sig := range forwardedByShim() {
				n := r.count(reSigN(sig))
				r.signal(sig)
				r.waitFor(reSigN(sig), n+1)
			}
			if !o.tini {
				// Caught and dropped, not forwarded; shim survives them.
				for _, sig := range []syscall.Signal{syscall.SIGPIPE, syscall.SIGSEGV, syscall.SIGABRT, syscall.SIGBUS,
					syscall.SIGFPE, syscall.SIGILL, syscall.SIGTRAP, syscall.SIGSYS} {
					r.signal(sig)
				}
				n := r.count(reSigN(syscall.SIGUSR1))
				r.signal(syscall.SIGUSR1)
				r.waitFor(reSigN(syscall.SIGUSR1), n+1)
				for _, m := range reAnySig.FindAllStringSubmatch(r.out.String(), -1) {
					if n, _ := strconv.Atoi(m[1]); slices.Contains([]int{7, 8, 4, 5, 6, 11, 13, 31}, n) {
						t.Errorf("signal %d was forwarded", n)
					}
				}
			}
			r.signal(syscall.SIGTERM)
			r.waitFor(reSigN(syscall.SIGTERM), 1)
			if code := r.wait(20 * time.Second); code != 0 {
				t.Fatalf("exit %d after the service exited 0", code)
			}
		})
	}
	t.Run("ignored at start", func(t *testing.T) {
		// tini blocks every signal and takes it with sigtimedwait, which
		// an ignored signal still reaches: it forwards a SIGHUP it was
		// started with ignored. The service starts with SIGHUP ignored
		// (TestInitServiceSignalState); this one installs a handler.
		for _, o := range everyInit {
			o.ignore, o.service = []syscall.Signal{syscall.SIGHUP}, helper(t, "signals")
			r := startInit(t, o)
			r.waitFor(reReady, 1)
			r.signal(syscall.SIGHUP)
			r.waitFor(reSigN(syscall.SIGHUP), 1)
		}
	})
}

// TestInitGraceThenKill: a service that ignores SIGTERM is killed after
// --grace, and shim exits with 128+SIGKILL. (tini waits for it forever.)
func TestInitGraceThenKill(t *testing.T) {
	for _, pid1 := range []bool{true, false} {
		o := initOpts{pid1: pid1, args: []string{"--grace", "1s"}, service: helper(t, "ignoreterm")}
		t.Run(o.name(), func(t *testing.T) {
			r := startInit(t, o)
			r.waitFor(reReady, 1)
			start := time.Now()
			r.signal(syscall.SIGTERM)
			if code := r.wait(20 * time.Second); code != 128+9 {
				t.Fatalf("exit %d, want %d", code, 128+9)
			}
			if d := time.Since(start); d < time.Second {
				t.Fatalf("killed after %s, before the 1s grace", d)
			}
		})
	}
}

// TestInitServiceSignalState: the service starts with the signal mask and
// ignored signals the init was started with (tini's sigconf test), read
// from the service's /proc/PID/status. Most of these the Go runtime
// changes before shim's main runs (cmd/shim/sigstate_nocgo.go); shim's
// constructor (sigstate_cgo.go) records them before it does.
func TestInitServiceSignalState(t *testing.T) {
	rt := syscall.Signal(40) // a real-time signal
	cases := []struct {
		name          string
		ignore, block []syscall.Signal
	}{
		{"SIGTERM blocked", nil, []syscall.Signal{syscall.SIGTERM}},
		{"SIGQUIT SIGUSR1 SIGPIPE SIGTERM ignored", []syscall.Signal{syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGPIPE, syscall.SIGTERM}, nil},
		{"mixed", []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGTSTP, syscall.SIGTTOU, syscall.SIGQUIT, syscall.SIGUSR2, rt},
			[]syscall.Signal{syscall.SIGUSR1, syscall.SIGALRM, syscall.SIGTTIN, syscall.SIGWINCH, syscall.SIGTERM, syscall.SIGINT, rt}},
		{"none", []syscall.Signal{}, []syscall.Signal{}},
	}
	for _, o := range everyInit {
		t.Run(o.name(), func(t *testing.T) {
			for _, c := range cases {
				o := o
				o.ignore, o.block, o.service = c.ignore, c.block, []string{"cat", "/proc/self/status"}
				r := startInit(t, o)
				if code := r.wait(20 * time.Second); code != 0 {
					t.Fatalf("%s: exit %d", c.name, code)
				}
				ign, blk := sigField(t, r.out.String(), "SigIgn"), sigField(t, r.out.String(), "SigBlk")
				if wantIgn, wantBlk := mask(c.ignore...), mask(c.block...); ign != wantIgn || blk != wantBlk {
					t.Errorf("%s: service started with SigIgn %016x SigBlk %016x, want %016x %016x", c.name, ign, blk, wantIgn, wantBlk)
				}
			}
		})
	}
}

// TestInitBinaryStatic: the binary scripts/build makes (with cgo, for the
// constructor) needs no dynamic loader or shared library, so it runs in
// any sandbox image as the CGO_ENABLED=0 one did.
func TestInitBinaryStatic(t *testing.T) {
	f, err := elf.Open(shimBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("%s has a %v program header: not static", shimBin, p.Type)
		}
	}
	info, err := buildinfo.ReadFile(shimBin)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range info.Settings {
		if s.Key == "CGO_ENABLED" && s.Value != "1" {
			t.Fatalf("built with CGO_ENABLED=%s: the signal-state constructor is missing", s.Value)
		}
	}
}

func mask(sigs ...syscall.Signal) uint64 {
	var m uint64
	for _, s := range sigs {
		m |= 1 << (s - 1)
	}
	return m
}

func sigField(t testing.TB, status, name string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + `:\s*([0-9a-f]+)$`).FindStringSubmatch(status)
	if m == nil {
		t.Fatalf("no %s in %q", name, status)
	}
	v, _ := strconv.ParseUint(m[1], 16, 64)
	return v
}

// TestInitQuietByDefault: with a service, shim writes no INFO lines into
// the stderr it shares with it; --log-level info brings them back.
func TestInitQuietByDefault(t *testing.T) {
	for _, pid1 := range []bool{true, false} {
		o := initOpts{pid1: pid1, service: []string{"sh", "-c", "echo service-out; echo service-err >&2"}}
		t.Run(o.name(), func(t *testing.T) {
			r := startInit(t, o)
			if code := r.wait(20 * time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			out := r.out.String()
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if line != "service-out" && line != "service-err" && !strings.Contains(line, "[WARN]") && !strings.Contains(line, "[ERROR]") {
					t.Errorf("line %q in the service's output", line)
				}
			}
			if !strings.Contains(out, "service-out\n") || !strings.Contains(out, "service-err\n") {
				t.Fatalf("the service's own lines are missing: %q", out)
			}
			o.args = []string{"--log-level", "info"}
			r = startInit(t, o)
			r.wait(20 * time.Second)
			if !strings.Contains(r.out.String(), "[INFO]") {
				t.Fatalf("--log-level info: no INFO line in %q", r.out.String())
			}
		})
	}
}

// TestInitLeavesNoCgroup: a service that exits at once leaves only shim's
// own leaf in the cgroup root (the start-up probe's cgroup used to stay,
// 23 times in 90).
func TestInitLeavesNoCgroup(t *testing.T) {
	for _, pid1 := range []bool{true, false} {
		o := initOpts{pid1: pid1, service: []string{"true"}}
		t.Run(o.name(), func(t *testing.T) {
			for i := 0; i < 15; i++ {
				r := startInit(t, o)
				if code := r.wait(20 * time.Second); code != 0 {
					t.Fatalf("run %d: exit %d", i, code)
				}
				ents, err := os.ReadDir(r.cgroup)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range ents {
					if e.IsDir() && e.Name() != "shim" {
						t.Fatalf("run %d: cgroup %s left behind", i, e.Name())
					}
				}
			}
		})
	}
}

// runHelper is the test binary run as a helper program:
//
//	signals                 print "ready pid=N", then "sig N" for each signal received; exit 0 on SIGTERM
//	ignoreterm              ignore SIGTERM, print "ready pid=N", run until killed
//	sigconf IGN BLK -- CMD  exec CMD with the signals IGN ignored and BLK blocked (comma lists)
//	forkns -- CMD           run CMD as PID 1 of new pid and mount namespaces, exit with its code
func runHelper(mode string, args []string) int {
	switch mode {
	case "signals":
		var all []os.Signal
		for s := syscall.Signal(1); s <= 64; s++ {
			switch s {
			case syscall.SIGKILL, syscall.SIGSTOP, syscall.SIGCHLD, syscall.SIGURG, syscall.SIGPROF, 32, 33, 34:
				continue
			}
			all = append(all, s)
		}
		c := make(chan os.Signal, 64)
		signal.Notify(c, all...)
		fmt.Printf("ready pid=%d\n", os.Getpid())
		for s := range c {
			fmt.Printf("sig %d\n", s)
			if s == syscall.SIGTERM {
				return 0
			}
		}
	case "ignoreterm":
		signal.Ignore(syscall.SIGTERM)
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGUSR1)
		fmt.Printf("ready pid=%d\n", os.Getpid())
		for range c {
		}
	case "forkns":
		c := exec.Command(args[1], args[2:]...)
		c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
		c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
		if err := c.Run(); err != nil {
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return c.ProcessState.ExitCode()
	case "sigconf":
		if len(args) < 4 || args[2] != "--" {
			return 2
		}
		// Exactly these, whatever the test was started with: SIG_IGN on
		// IGN and SIG_DFL on any other at SIG_IGN (a handler becomes
		// SIG_DFL at the exec), the mask BLK on the exec'ing thread. The
		// kernel's calls, as signal.Ignore cannot touch 32..34.
		goruntime.LockOSThread()
		sets := [2]uint64{}
		for i, list := range args[:2] {
			for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' }) {
				n, _ := strconv.Atoi(f)
				sets[i] |= 1 << (n - 1)
			}
		}
		err := setSignalState(sets[0], sets[1])
		if err == nil {
			err = syscall.Exec(args[3], args[3:], os.Environ())
		}
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 2
}

// setSignalState sets SIG_IGN on the signals in ign, SIG_DFL on every other
// one at SIG_IGN, and the calling thread's mask to blk. The handler is the
// first field of the kernel's struct sigaction on amd64 and arm64.
func setSignalState(ign, blk uint64) error {
	for sig := 1; sig <= 64; sig++ {
		if sig == int(syscall.SIGKILL) || sig == int(syscall.SIGSTOP) {
			continue
		}
		var old [8]uintptr
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), 0, uintptr(unsafe.Pointer(&old)), 8, 0, 0); e != 0 {
			return fmt.Errorf("signal %d: %w", sig, e)
		}
		act := [8]uintptr{}
		switch {
		case ign&(1<<(sig-1)) != 0:
			act[0] = 1 // SIG_IGN
		case old[0] != 1:
			continue
		}
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
			return fmt.Errorf("signal %d: %w", sig, e)
		}
	}
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&blk)), 0, 8, 0, 0); e != 0 {
		return fmt.Errorf("signal mask: %w", e)
	}
	return nil
}

// TestPidnsSweepSparesTheServicesChildren: in pidns mode a fence sweeps
// every process of the namespace but shim and the service; what the
// service runs (a daemon's workers: git daemon's git-daemon) is spared too,
// or the fence ends the service and shim with it. Control: the harness's
// own processes in the same namespace are swept.
func TestPidnsSweepSparesTheServicesChildren(t *testing.T) {
	requireRoot(t)
	dir := testutil.HarnessDir(t, -1)
	child := filepath.Join(dir, "child")
	s := startShim(t, shimOpts{args: []string{"--mode", "pidns"},
		service: []string{"sh", "-c", "sleep 1000 & echo $! > " + child + "; wait"}})
	eventually(t, 10*time.Second, "the service's child", func() bool { b, _ := os.ReadFile(child); return len(b) > 0 })
	var r1 api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--", "sh", "-c", "sleep 1000 & sleep 1000")
	eventually(t, 10*time.Second, "gen 1's two processes", func() bool { return len(s.PidnsProcs()) >= 6 })
	var r2 api.StartResult
	s.MustCtl(&r2, "start", "--generation", "2", "--", "sleep", "1000")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || r2.Fenced[0].Killed < 3 {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	// Left: shim, the service, its child and gen 2.
	procs := s.PidnsProcs()
	if len(procs) != 4 {
		t.Fatalf("processes after the fence: %v, want shim, the service, its child and gen 2", procs)
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.State != api.StateRunning {
		t.Fatalf("status after the fence: %+v", st)
	}
}

// A process the supervisor entered into the namespace from outside (docker
// exec, nsenter: its parent is outside, /proc says 0), and what it runs,
// are not the generation's: a pidns sweep spares them, as a fence with
// cgroups leaves alone what is outside the generation's cgroup. The
// generation's own setsid daemon, whose parent is inside, is killed beside
// them: no process of a generation can pass for one entered from outside.
func TestPidnsSweepSparesWhatWasEnteredFromOutside(t *testing.T) {
	requireRoot(t)
	testutil.NeedTool(t, "nsenter")
	s := startShim(t, shimOpts{args: []string{"--mode", "pidns"}})
	var r1 api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--", "sh", "-c", "setsid sleep 1000 & sleep 1000")
	eventually(t, 10*time.Second, "gen 1's three processes", func() bool { return len(s.PidnsProcs()) >= 4 })
	entered := exec.Command("nsenter", "--target", strconv.Itoa(s.Cmd.Process.Pid), "--pid", "--", "sh", "-c", "sleep 1000 & wait")
	if err := entered.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { entered.Process.Kill(); entered.Wait() })
	eventually(t, 10*time.Second, "the entered sh and its sleep", func() bool { return len(s.PidnsProcs()) >= 6 })
	var r2 api.StartResult
	s.MustCtl(&r2, "start", "--generation", "2", "--", "sleep", "1000")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || r2.Fenced[0].Killed < 3 {
		t.Fatalf("fence: %+v (the daemon must be killed, what was entered spared)", r2.Fenced)
	}
	// Left: shim, gen 2, and the entered sh with its sleep.
	if procs := s.PidnsProcs(); len(procs) != 4 {
		t.Fatalf("processes after the fence: %v, want shim, gen 2, the entered sh and its sleep", procs)
	}
	// The entered sh is nsenter's child: still there, not a zombie.
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", entered.Process.Pid, entered.Process.Pid))
	if err != nil || len(strings.Fields(string(kids))) != 1 {
		t.Fatalf("nsenter's children: %q, %v", kids, err)
	}
	if st, err := os.ReadFile("/proc/" + strings.TrimSpace(string(kids)) + "/stat"); err != nil || strings.Contains(string(st), ") Z ") {
		t.Fatalf("the entered sh: %q, %v", st, err)
	}
}
