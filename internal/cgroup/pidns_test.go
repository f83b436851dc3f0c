package cgroup

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pidnsReport is what the pidns helper prints as JSON.
type pidnsReport struct {
	Mode Mode
	// Before counts the `sleep 1000` processes in the group before the
	// fence: none of them can exit on its own during the test, unlike
	// the `sleep 1` of scriptNoTerm's loop, so each must be among those
	// the kill saw.
	Before     int
	Frozen     bool
	Result     KillResult
	ExemptLive bool
	Error      string
}

// TestPidnsSweep runs the test binary as PID 1 of a new pid (and mount)
// namespace, which sweeps the processes it started there.
func TestPidnsSweep(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFatal(t, "needs root")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		skipOrFatal(t, "needs python3 (a vfork parent)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SHIM_CGROUP_HELPER=pidns")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		if os.Getenv("SHIM_REQUIRE_INTEGRATION") != "1" && len(out) == 0 {
			t.Skipf("cannot create a pid namespace: %v", err)
		}
		t.Fatalf("helper: %v: %s", err, out)
	}
	var r pidnsReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	t.Logf("%+v", r)
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	if r.Mode != ModePidns || !r.Frozen || r.Result.Survivors != 0 || r.Result.Killed < r.Before || r.Before < 203 || !r.ExemptLive {
		t.Fatalf("bad sweep: %+v", r)
	}
}

// helperPidns is PID 1 of a fresh pid namespace: it mounts its own /proc,
// starts the hard cases, and fences them with a pidns Manager.
func helperPidns() int {
	r := pidnsReport{}
	defer func() {
		_ = json.NewEncoder(os.Stdout).Encode(r)
	}()
	fail := func(err error) int { r.Error = err.Error(); return 0 }
	if os.Getpid() != 1 {
		return fail(fmt.Errorf("helper is pid %d, not 1", os.Getpid()))
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail(err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fail(err)
	}
	service := exec.Command("sleep", "1000")
	if err := service.Start(); err != nil {
		return fail(err)
	}
	exempt := func(pid int) bool { return pid == service.Process.Pid }
	// Forced: auto mode would prefer a usable cgroup (or, on a host whose
	// shim cgroup is the top one, refuse).
	m, err := New(Config{Mode: ModePidns, Exempt: exempt}, nil)
	if err != nil {
		return fail(err)
	}
	r.Mode = m.Mode()
	g, err := m.Create("gen-1", Limits{})
	if err != nil {
		return fail(err)
	}
	// A vfork parent, as dash is for every simple command: glibc's
	// posix_spawn vforks, and the child blocks opening a FIFO no one
	// writes, before its exec; the parent waits in state D until then. A
	// sweep stops the child, and the parent, with the SIGSTOP pending,
	// never reaches state T.
	dir, err := os.MkdirTemp("", "shim-pidns-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		return fail(err)
	}
	vforkParent := exec.Command("python3", "-c", `import os, sys
os.posix_spawn("/bin/sleep", ["sleep", "1000"], {}, file_actions=[(os.POSIX_SPAWN_OPEN, 0, sys.argv[1], os.O_RDONLY, 0)])`, fifo)
	if err := vforkParent.Start(); err != nil {
		return fail(err)
	}
	cmds := []*exec.Cmd{vforkParent}
	for _, s := range []string{scriptSetsid, scriptNoTerm, scriptBusy, scriptDouble,
		`i=0; while [ $i -lt 200 ]; do sleep 1000 & i=$((i+1)); done; wait`} {
		c := exec.Command("sh", "-c", s)
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: s == scriptSetsid}
		if err := c.Start(); err != nil {
			return fail(err)
		}
		cmds = append(cmds, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Every long sleeper started: setsid's and the exec'd one, the
	// double-forked one and the loop's 200. Nothing else is counted: a
	// process that can exit by itself (scriptNoTerm's `sleep 1`) would
	// make the count one the kill cannot be compared with.
	_ = waitUntil(ctx, "", func() (bool, error) {
		p, err := g.Procs()
		r.Before = longSleepers(p)
		st, _, serr := procStat(vforkParent.Process.Pid)
		return r.Before >= 2+1+200 && serr == nil && st == 'D', err
	})
	pids, _ := g.Procs()
	if slices.Contains(pids, service.Process.Pid) {
		return fail(fmt.Errorf("exempt pid %d in Procs", service.Process.Pid))
	}
	if err := g.Freeze(ctx); err != nil {
		return fail(err)
	}
	r.Frozen = true
	if err := g.Thaw(ctx); err != nil {
		return fail(err)
	}
	if err := g.Freeze(ctx); err != nil {
		return fail(err)
	}
	if r.Result, err = g.Kill(ctx); err != nil {
		return fail(err)
	}
	st, _, err := procStat(service.Process.Pid)
	r.ExemptLive = err == nil && alive(service.Process.Pid, st)
	if err := g.Remove(); err != nil {
		return fail(err)
	}
	for _, c := range cmds {
		_ = c.Wait()
	}
	return 0
}

// longSleepers counts the `sleep 1000` processes among pids.
func longSleepers(pids []int) int {
	n := 0
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err == nil && string(b) == "sleep\x001000\x00" {
			n++
		}
	}
	return n
}

// IsDescendant follows the parents: a grandchild is the test's descendant,
// the test is not its child's, and no pid is a descendant of 0.
func TestIsDescendant(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 1000 & echo $!; wait")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var grandchild int
	if _, err := fmt.Fscan(out, &grandchild); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(grandchild, syscall.SIGKILL) })
	me := os.Getpid()
	if !IsDescendant(grandchild, me) || !IsDescendant(grandchild, cmd.Process.Pid) || !IsDescendant(cmd.Process.Pid, me) {
		t.Errorf("the grandchild %d (of %d, of the test %d) not found a descendant", grandchild, cmd.Process.Pid, me)
	}
	if IsDescendant(me, cmd.Process.Pid) || IsDescendant(cmd.Process.Pid, grandchild) || IsDescendant(grandchild, 0) {
		t.Error("a parent found its child's descendant, or a pid cgroup 0's")
	}
}
