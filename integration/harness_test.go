// Package integration runs the real shim binary as PID 1 of pid and mount
// namespaces the tests create, under a cgroup subtree the tests create, and
// removes all of it afterwards. Nothing here signals, freezes or moves a
// process it did not start.
package integration

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/client"
	"github.com/shimdev/shim/internal/sandbox"
	"github.com/shimdev/shim/internal/testutil"
)

var shimBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shim-it-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shimBin = filepath.Join(dir, "shim")
	// As released: static, with the signal-state constructor (cgo).
	build := exec.Command("../scripts/build", shimBin)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build shim:", err)
		os.Exit(1)
	}
	os.Chmod(dir, 0o755)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireRoot skips a test that needs root and cgroup2, or fails it when CI
// demands integration tests (SHIM_REQUIRE_INTEGRATION=1).
func requireRoot(t testing.TB) {
	t.Helper()
	testutil.NeedRoot(t)
	testutil.Need(t, cgroup2Mount() != "", "needs a cgroup2 mount")
}

// cgroup2Mount finds a writable cgroup2 mount (testutil.Cgroup2Mount).
func cgroup2Mount() string { return testutil.Cgroup2Mount() }

func randName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Shim is one shim init running as PID 1 of its own namespaces.
type Shim struct {
	t          testing.TB
	RuntimeDir string
	CgroupRoot string
	Cmd        *exec.Cmd
	Log        *syncBuffer
	Client     *client.Client
	sb         *sandbox.Sandbox
	done       <-chan struct{} // closed when shim exited
}

type shimOpts struct {
	cgroupRoot string   // default: a fresh dir under the cgroup2 mount
	runtimeDir string   // default: a fresh temp dir
	args       []string // extra init flags
	newNet     bool     // own network namespace
	brokenLog  bool     // shim's stdout and stderr are a pipe nobody reads any more
	stdout     *os.File // shim's stdout, when not its log (stderr)
	service    []string
}

// stdoutOf is o.stdout as an io.Writer (nil when unset, not a typed nil).
func stdoutOf(o shimOpts) io.Writer {
	if o.stdout == nil {
		return nil
	}
	return o.stdout
}

// startShim starts shim init as PID 1 of new pid and mount namespaces and
// waits until its control socket answers. Cleanup kills it and removes its
// cgroups.
func startShim(t testing.TB, o shimOpts) *Shim {
	t.Helper()
	requireRoot(t)
	if o.runtimeDir == "" {
		o.runtimeDir = t.TempDir()
		// The sandbox's layers dir is in it, and shim's gits run as a
		// worktree's owner must pass through to it (docs/layers.md).
		if err := os.Chmod(filepath.Dir(o.runtimeDir), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if o.cgroupRoot == "" {
		o.cgroupRoot = filepath.Join(cgroup2Mount(), randName("shim-it-"))
		t.Cleanup(func() { removeCgroupTree(t, o.cgroupRoot) })
	}
	args := append([]string{"--log-level", "debug", "--grace", "2s"}, o.args...)
	if !hasArg(o.args, "--isolation") {
		// The tests written before layers exchange files with their
		// harness outside the worktree: they run in the scan isolation,
		// the layer tests (layers_test.go) ask for auto.
		args = append(args, "--isolation", "scan")
	}
	log := &syncBuffer{}
	var out io.Writer = log
	if o.brokenLog {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		r.Close() // the reader is gone before shim writes a line
		defer w.Close()
		out = w
	}
	sb, err := sandbox.Start(sandbox.Options{Bin: shimBin, RuntimeDir: o.runtimeDir, CgroupRoot: o.cgroupRoot,
		Args: args, Service: o.service, NewNet: o.newNet, Out: out, Stdout: stdoutOf(o)})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	s := &Shim{t: t, RuntimeDir: o.runtimeDir, CgroupRoot: o.cgroupRoot, Cmd: sb.Cmd, Log: log, Client: sb.Client, sb: sb, done: sb.Done()}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("shim log:\n%s", log.String())
		}
	})
	return s
}

// Stop kills shim (PID 1: the kernel then kills its whole pid namespace).
func (s *Shim) Stop() { s.sb.Stop(0) }

// Wait waits for shim to exit and returns its exit code.
func (s *Shim) Wait(timeout time.Duration) (int, bool) { return s.sb.Wait(timeout) }

// Ctl runs `shim ctl` against this shim.
func (s *Shim) Ctl(args ...string) (stdout, stderr string, code int) {
	return runCtl(s.RuntimeDir, args...)
}

func runCtl(runtimeDir string, args ...string) (string, string, int) {
	cmd := exec.Command(shimBin, append([]string{"ctl", "--runtime-dir", runtimeDir}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	return out.String(), errb.String(), code
}

// MustCtl runs ctl and decodes its JSON answer into v, failing on error.
func (s *Shim) MustCtl(v any, args ...string) {
	s.t.Helper()
	out, errs, code := s.Ctl(args...)
	if code != 0 {
		s.t.Fatalf("shim ctl %s: exit %d: %s", strings.Join(args, " "), code, errs)
	}
	if v != nil {
		if err := json.Unmarshal([]byte(out), v); err != nil {
			s.t.Fatalf("shim ctl %s: bad JSON %q: %v", strings.Join(args, " "), out, err)
		}
	}
}

// PidnsProcs lists the host pids of every process in shim's pid namespace
// (shim included), with their state letter.
func (s *Shim) PidnsProcs() map[int]string {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", s.Cmd.Process.Pid))
	if err != nil {
		return nil
	}
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || l != ns {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		st := string(b)
		if i := strings.LastIndexByte(st, ')'); i > 0 && len(st) > i+2 {
			out[pid] = st[i+2 : i+3]
		}
	}
	return out
}

// eventually polls cond until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeCgroupTree kills and removes a cgroup subtree a test created.
func removeCgroupTree(t testing.TB, root string) {
	if _, err := os.Stat(root); err != nil {
		return
	}
	var dirs []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if _, err := os.Stat(filepath.Join(d, "cgroup.kill")); err == nil {
			os.WriteFile(filepath.Join(d, "cgroup.kill"), []byte("1"), 0)
		} else if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
		}
		for j := 0; j < 250; j++ {
			if err := os.Remove(d); err == nil || os.IsNotExist(err) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s left behind", d)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the shim's stdout and stderr.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// script writes an executable shell script into dir and returns its path.
func script(t testing.TB, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func readLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func hasArg(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}
