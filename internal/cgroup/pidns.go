package cgroup

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"

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

// states maps every sweepable live process to its state letter.
func (g *pidnsGroup) states() (map[int]byte, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]byte{}
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
		out[pid] = st
	}
	return out, nil
}

// Freeze stops every process with SIGSTOP, repeatedly, until a pass finds
// no process it had not seen and all are stopped (state T or t).
func (g *pidnsGroup) Freeze(ctx context.Context) error {
	seen := map[int]bool{}
	err := waitUntil(ctx, "", func() (bool, error) {
		ps, err := g.states()
		if err != nil {
			return false, err
		}
		done := true
		for p, st := range ps {
			if !seen[p] {
				seen[p], done = true, false
			}
			if st != 'T' && st != 't' {
				done = false
				if err := signalIf(p, unix.SIGSTOP, g.member); err != nil {
					return false, err
				}
			}
		}
		return done, nil
	})
	if err != nil {
		return newError(CodeFreezeFailed, err, "pidns sweep: not every process of the namespace stopped")
	}
	return nil
}

// Thaw sends SIGCONT to every process and waits until none is in state T.
func (g *pidnsGroup) Thaw(ctx context.Context) error {
	err := waitUntil(ctx, "", func() (bool, error) {
		ps, err := g.states()
		if err != nil {
			return false, err
		}
		done := true
		for p, st := range ps {
			if st == 'T' {
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
