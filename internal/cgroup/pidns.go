package cgroup

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pidnsGroup is a virtual group of pidns mode: shim is PID 1 of its own pid
// namespace and there is no cgroup, so a group is "every process of the
// namespace" except shim itself, the Exempt ones, and processes that
// entered the namespace from outside (parent pid 0 here: `docker exec`,
// e.g. the `shim ctl` asking for the fence; their children are swept).
// Only one generation runs at a time, so this is the generation to fence.
type pidnsGroup struct {
	m    *Manager
	name string
}

func (g *pidnsGroup) Name() string                { return g.name }
func (g *pidnsGroup) Path() string                { return "" }
func (g *pidnsGroup) CloneFD() (int, bool, error) { return -1, false, nil }
func (g *pidnsGroup) Add(pid int) error           { return nil }

// member reports whether a sweep may signal pid.
func (g *pidnsGroup) member(pid int) bool {
	if pid <= 1 || pid == os.Getpid() {
		return false
	}
	if g.m.exempt != nil && g.m.exempt(pid) {
		return false
	}
	_, ppid, err := procStat(pid)
	return err == nil && ppid != 0
}

// Procs lists the processes a sweep would hit.
func (g *pidnsGroup) Procs() ([]int, error) {
	ps, err := g.states()
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(ps))
	for p := range ps {
		out = append(out, p)
	}
	sort.Ints(out)
	return out, nil
}

// proc is a sweepable process as /proc/PID/stat shows it.
type proc struct {
	state byte // R, S, D, T, t, ...
	ppid  int
}

// states maps every sweepable live process to its state and parent.
func (g *pidnsGroup) states() (map[int]proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]proc{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 || pid == os.Getpid() {
			continue
		}
		st, ppid, err := procStat(pid)
		if err != nil || ppid == 0 || !alive(pid, st) {
			continue
		}
		if g.m.exempt != nil && g.m.exempt(pid) {
			continue
		}
		out[pid] = proc{state: st, ppid: ppid}
	}
	return out, nil
}

// Freeze stops every process with SIGSTOP, repeatedly, until a pass finds
// no process it had not seen and all are stopped (state T or t) or held
// (stoppedVforkParent).
func (g *pidnsGroup) Freeze(ctx context.Context) error {
	seen := map[int]bool{}
	err := waitUntil(ctx, "", func() (bool, error) {
		ps, err := g.states()
		if err != nil {
			return false, err
		}
		stoppedChild := map[int]bool{} // parents of a stopped process
		for _, pr := range ps {
			if pr.state == 'T' || pr.state == 't' {
				stoppedChild[pr.ppid] = true
			}
		}
		done := true
		for p, pr := range ps {
			if !seen[p] {
				seen[p], done = true, false
			}
			if pr.state == 'T' || pr.state == 't' || pr.state == 'D' && stoppedChild[p] && stopPending(p) {
				continue
			}
			done = false
			if err := signalIf(p, unix.SIGSTOP, g.member); err != nil {
				return false, err
			}
		}
		return done, nil
	})
	if err != nil {
		return newError(CodeFreezeFailed, err, "pidns sweep: not every process of the namespace stopped")
	}
	return nil
}

// Thaw sends SIGCONT to every process and waits until none is in state T
// or has a SIGSTOP pending (a vfork parent that Freeze left in D: SIGCONT
// discards the pending stop, or it would stop later on its own).
func (g *pidnsGroup) Thaw(ctx context.Context) error {
	err := waitUntil(ctx, "", func() (bool, error) {
		ps, err := g.states()
		if err != nil {
			return false, err
		}
		done := true
		for p, pr := range ps {
			if pr.state == 'T' || pr.state == 'D' && stopPending(p) {
				done = false
				if err := signalIf(p, unix.SIGCONT, g.member); err != nil {
					return false, err
				}
			}
		}
		return done, nil
	})
	if err != nil {
		return newError(CodeFreezeFailed, err, "pidns sweep: processes still stopped")
	}
	return nil
}

// Kill sends SIGKILL to every process, repeatedly, until none is left.
// Zombies (waiting for shim's reaper) count as gone.
func (g *pidnsGroup) Kill(ctx context.Context) (KillResult, error) {
	pids, err := g.Procs()
	if err != nil {
		return KillResult{}, newError(CodeFenceFailed, err, "pidns sweep: list processes")
	}
	res := KillResult{Killed: len(pids)}
	err = waitUntil(ctx, "", func() (bool, error) {
		pids, err := g.Procs()
		if err != nil {
			return false, err
		}
		for _, p := range pids {
			if err := signalIf(p, unix.SIGKILL, g.member); err != nil {
				return false, err
			}
		}
		return len(pids) == 0, nil
	})
	return finishKill(g, res, err)
}

func (g *pidnsGroup) Populated() (bool, error) {
	p, err := g.Procs()
	return len(p) > 0, err
}

func (g *pidnsGroup) WaitEmpty(ctx context.Context) error {
	return waitEmptyErr(g, waitUntil(ctx, "", func() (bool, error) {
		p, err := g.Populated()
		return !p, err
	}))
}

// Remove forgets the group; it fails while any sweepable process lives.
func (g *pidnsGroup) Remove() error {
	if p, err := g.Procs(); err != nil || len(p) > 0 {
		if err == nil {
			err = fmt.Errorf("pidns group %s: processes %v still running", g.name, p)
		}
		return err
	}
	g.m.mu.Lock()
	delete(g.m.virtual, g.name)
	g.m.mu.Unlock()
	return nil
}

// stopPending reports whether a SIGSTOP is pending for pid. With a stopped
// child, that is how a vfork parent looks once it is as stopped as it can
// be: dash vforks every simple command, and a sweep that stops the child
// between vfork and exec leaves the parent in state D, in the kernel, until
// the child execs or exits, with the SIGSTOP pending. It never reaches T,
// but it runs nothing either: it leaves the kernel only when the child
// runs again, and then stops on the pending SIGSTOP before any of its own
// code. So Freeze counts a process in state D with a stopped child and a
// SIGSTOP pending as stopped (a process in D for another reason stops the
// same way when it leaves the kernel).
func stopPending(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if ok && (name == "SigPnd" || name == "ShdPnd") {
			if set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && set&(1<<(unix.SIGSTOP-1)) != 0 {
				return true
			}
		}
	}
	return false
}
