package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Group is one child of the root: a generation ("gen-N") or a helper
// group ("git-*", "tmp-*").
type Group interface {
	Name() string
	// Path is the cgroup directory ("" in pidns mode).
	Path() string
	// CloneFD returns an open fd of the cgroup directory for
	// SysProcAttr.UseCgroupFD (CLONE_INTO_CGROUP), so a process starts
	// inside the group with no window outside it. ok is false in cgroup1
	// and pidns mode (use Add after start). The caller closes fd.
	CloneFD() (fd int, ok bool, err error)
	// Add moves a process into the group (cgroup.procs); a no-op in pidns
	// mode. It refuses PID 1 and the caller.
	Add(pid int) error
	// Procs lists the live processes of the group and its descendant
	// cgroups, sorted. Exited processes awaiting the reaper are left out.
	Procs() ([]int, error)
	// Freeze requests the freeze and waits for the kernel to confirm it
	// (cgroup2: "frozen 1" in cgroup.events; cgroup1: freezer.state
	// FROZEN) until ctx ends; then Code FREEZE_FAILED. The request is
	// not undone on failure: Kill still works, Thaw undoes it.
	Freeze(ctx context.Context) error
	// Thaw undoes Freeze and waits for the kernel to confirm it.
	Thaw(ctx context.Context) error
	// Kill kills every process of the group and waits until it is empty.
	// On ctx's end it returns Code FENCE_FAILED and the survivors.
	Kill(ctx context.Context) (KillResult, error)
	// Populated reports whether any live process is in the group.
	Populated() (bool, error)
	// WaitEmpty waits until the group holds no live process; on ctx's end
	// Code FENCE_FAILED naming the remaining pids.
	WaitEmpty(ctx context.Context) error
	// Remove deletes the group (and any sub-cgroups a harness made). It
	// fails if a process is still inside; it never kills. Removing a group
	// that is already gone is not an error.
	Remove() error
}

// KillResult is what Kill did.
type KillResult struct {
	Killed       int   // processes in the group when the kill started
	Survivors    int   // processes still there at the end (0 on success)
	SurvivorPids []int // their pids
}

// sweepInterval bounds each freeze wait and empty wait of a kill sweep, so
// a stuck freeze does not stop the SIGKILLs.
const sweepInterval = 50 * time.Millisecond

// sweeper is a group killed by freezing, SIGKILLing each process and
// thawing, repeatedly: cgroup1, and cgroup2 without cgroup.kill.
type sweeper interface {
	Procs() ([]int, error)
	setFrozen(bool) error
	isFrozen() (bool, error)
	member(pid int) bool
}

// sweepKill kills by freeze / SIGKILL each / thaw until the group is empty
// or ctx ends. Freezing first stops fork loops from outrunning the kills.
func sweepKill(ctx context.Context, s sweeper) error {
	for {
		pids, err := s.Procs()
		if err != nil || len(pids) == 0 {
			return err
		}
		if err := s.setFrozen(true); err == nil {
			fctx, cancel := context.WithTimeout(ctx, sweepInterval)
			_ = waitUntil(fctx, "", s.isFrozen) // best effort: kill anyway
			cancel()
		}
		if pids, err = s.Procs(); err != nil {
			return err
		}
		for _, p := range pids {
			if err := signalIf(p, unix.SIGKILL, s.member); err != nil {
				return err
			}
		}
		// cgroup1 frozen tasks only die once thawed.
		_ = s.setFrozen(false)
		wctx, cancel := context.WithTimeout(ctx, sweepInterval)
		_ = waitUntil(wctx, "", func() (bool, error) {
			p, err := s.Procs()
			return len(p) == 0, err
		})
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// finishKill fills in the survivors after a kill ended with cause and
// returns FENCE_FAILED if there are any. A group that emptied at the last
// moment counts as done.
func finishKill(g Group, res KillResult, cause error) (KillResult, error) {
	if cause == nil {
		return res, nil
	}
	pids, err := g.Procs()
	if err != nil {
		res.Survivors = max(res.Killed, 1) // unknown: fail closed
		return res, newError(CodeFenceFailed, errors.Join(cause, err), fmt.Sprintf("group %s: cannot confirm it is empty", g.Name()))
	}
	if len(pids) == 0 {
		return res, nil
	}
	res.Survivors, res.SurvivorPids = len(pids), pids
	return res, newError(CodeFenceFailed, cause, fmt.Sprintf("group %s not empty after kill: %d survivors %v", g.Name(), len(pids), pids))
}

// waitEmptyErr turns a WaitEmpty timeout into FENCE_FAILED with the pids.
func waitEmptyErr(g Group, cause error) error {
	if cause == nil {
		return nil
	}
	pids, err := g.Procs()
	if err == nil && len(pids) == 0 {
		return nil
	}
	return newError(CodeFenceFailed, cause, fmt.Sprintf("group %s not empty: processes %v", g.Name(), pids))
}

func checkAdd(pid int) error {
	if pid <= 1 || pid == os.Getpid() {
		return newError(CodeBadRequest, nil, fmt.Sprintf("refusing to move pid %d into a generation", pid))
	}
	return nil
}

// gone reports whether err says the group directory no longer exists.
func gone(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// ---- cgroup2 ----

type v2Group struct {
	name, path string
	cg         string // cgroup path, for membership checks
	hasKill    bool
}

func (g *v2Group) Name() string { return g.name }
func (g *v2Group) Path() string { return g.path }

func (g *v2Group) CloneFD() (int, bool, error) {
	fd, err := unix.Open(g.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false, fmt.Errorf("open cgroup %s: %w", g.path, err)
	}
	return fd, true, nil
}

func (g *v2Group) Add(pid int) error {
	if err := checkAdd(pid); err != nil {
		return err
	}
	return writeFile(filepath.Join(g.path, "cgroup.procs"), strconv.Itoa(pid))
}

func (g *v2Group) Procs() ([]int, error) { return treePids(g.path) }

func (g *v2Group) member(pid int) bool {
	pc, err := readProcCgroup(pid)
	if err != nil {
		return false
	}
	_, ok := under(g.cg, pc.unified)
	return ok
}

// events reads a key of cgroup.events; a removed group reads as "0"
// (neither populated nor frozen: there is nothing left to run).
func (g *v2Group) events(key string) (string, error) {
	v, err := readKV(filepath.Join(g.path, "cgroup.events"), key)
	if gone(err) {
		return "0", nil
	}
	return v, err
}

func (g *v2Group) setFrozen(on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	err := writeFile(filepath.Join(g.path, "cgroup.freeze"), v)
	if gone(err) {
		return nil
	}
	return err
}

func (g *v2Group) isFrozen() (bool, error) {
	v, err := g.events("frozen")
	if err != nil {
		return false, err
	}
	if _, serr := os.Stat(g.path); gone(serr) {
		return true, nil
	}
	return v == "1", nil
}

func (g *v2Group) Freeze(ctx context.Context) error {
	if err := g.setFrozen(true); err != nil {
		return newError(CodeFreezeFailed, err, "freeze "+g.name)
	}
	if err := waitUntil(ctx, filepath.Join(g.path, "cgroup.events"), g.isFrozen); err != nil {
		return newError(CodeFreezeFailed, err, "freeze of "+g.name+" not confirmed by the kernel (cgroup.events frozen 0)")
	}
	return nil
}

func (g *v2Group) Thaw(ctx context.Context) error {
	if err := g.setFrozen(false); err != nil {
		return newError(CodeFreezeFailed, err, "thaw "+g.name)
	}
	err := waitUntil(ctx, filepath.Join(g.path, "cgroup.events"), func() (bool, error) {
		v, err := g.events("frozen")
		return v == "0", err
	})
	if err != nil {
		return newError(CodeFreezeFailed, err, "thaw of "+g.name+" not confirmed by the kernel (cgroup.events frozen 1)")
	}
	return nil
}

func (g *v2Group) Populated() (bool, error) {
	v, err := g.events("populated")
	return v == "1", err
}

func (g *v2Group) waitEmpty(ctx context.Context) error {
	return waitUntil(ctx, filepath.Join(g.path, "cgroup.events"), func() (bool, error) {
		p, err := g.Populated()
		return !p, err
	})
}

func (g *v2Group) WaitEmpty(ctx context.Context) error { return waitEmptyErr(g, g.waitEmpty(ctx)) }

func (g *v2Group) Kill(ctx context.Context) (KillResult, error) {
	pids, err := g.Procs()
	if err != nil {
		return KillResult{}, newError(CodeFenceFailed, err, "list processes of "+g.name)
	}
	res := KillResult{Killed: len(pids)}
	if g.hasKill {
		err := writeFile(filepath.Join(g.path, "cgroup.kill"), "1")
		switch {
		case err == nil:
			return finishKill(g, res, g.waitEmpty(ctx))
		case gone(err):
			if _, serr := os.Stat(g.path); gone(serr) {
				return res, nil // the group is gone, so it is empty
			}
		default:
			return finishKill(g, res, err)
		}
	}
	return finishKill(g, res, sweepKill(ctx, g))
}

func (g *v2Group) Remove() error { return removeWithRetry(g) }

// removeWithRetry removes the group's tree. rmdir can report EBUSY for a
// moment after the last process left; retry briefly when the group reads
// as empty, never when it is populated.
func removeWithRetry(g Group) error {
	var err error
	for i := 0; i < 50; i++ {
		if err = removeTree(g.Path()); err == nil || !errors.Is(err, unix.EBUSY) {
			return err
		}
		if p, perr := g.Populated(); perr != nil || p {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
	return err
}

// ---- cgroup1 freezer ----

type v1Group struct {
	name, path string
	cg         string
}

func (g *v1Group) Name() string                { return g.name }
func (g *v1Group) Path() string                { return g.path }
func (g *v1Group) CloneFD() (int, bool, error) { return -1, false, nil }

func (g *v1Group) Add(pid int) error {
	if err := checkAdd(pid); err != nil {
		return err
	}
	return writeFile(filepath.Join(g.path, "cgroup.procs"), strconv.Itoa(pid))
}

func (g *v1Group) Procs() ([]int, error) { return treePids(g.path) }

func (g *v1Group) member(pid int) bool {
	pc, err := readProcCgroup(pid)
	if err != nil {
		return false
	}
	_, ok := under(g.cg, pc.freezer)
	return ok
}

func (g *v1Group) setFrozen(on bool) error {
	v := "THAWED"
	if on {
		v = "FROZEN"
	}
	err := writeFile(filepath.Join(g.path, "freezer.state"), v)
	if gone(err) {
		return nil
	}
	return err
}

// state reads freezer.state (reading it is what makes the kernel notice a
// completed freeze); a removed group reads as "" with ok.
func (g *v1Group) state() (string, error) {
	data, err := os.ReadFile(filepath.Join(g.path, "freezer.state"))
	if gone(err) {
		return "", nil
	}
	return strings.TrimSpace(string(data)), err
}

func (g *v1Group) isFrozen() (bool, error) {
	s, err := g.state()
	return s == "FROZEN" || s == "", err
}

// Freeze writes FROZEN, and again at every look that finds the group still
// FREEZING: the v1 freezer freezes the tasks it finds at each write, and
// one forked while it walked them (a fork loop) can be missed and keep the
// group FREEZING for good (runc retries the same way; cgroup v2 has no
// such gap). It never thaws to retry: the generation must not run again.
func (g *v1Group) Freeze(ctx context.Context) error {
	if err := g.setFrozen(true); err != nil {
		return newError(CodeFreezeFailed, err, "freeze "+g.name)
	}
	frozen := func() (bool, error) {
		s, err := g.state()
		if err != nil || s == "FROZEN" || s == "" {
			return err == nil, err
		}
		return false, g.setFrozen(true)
	}
	if err := waitUntil(ctx, "", frozen); err != nil {
		s, _ := g.state()
		return newError(CodeFreezeFailed, err, fmt.Sprintf("freeze of %s not confirmed by the kernel (freezer.state %s)", g.name, s))
	}
	return nil
}

func (g *v1Group) Thaw(ctx context.Context) error {
	if err := g.setFrozen(false); err != nil {
		return newError(CodeFreezeFailed, err, "thaw "+g.name)
	}
	err := waitUntil(ctx, "", func() (bool, error) {
		s, err := g.state()
		return s == "THAWED" || s == "", err
	})
	if err != nil {
		return newError(CodeFreezeFailed, err, "thaw of "+g.name+" not confirmed by the kernel")
	}
	return nil
}

func (g *v1Group) Populated() (bool, error) {
	p, err := g.Procs()
	return len(p) > 0, err
}

func (g *v1Group) WaitEmpty(ctx context.Context) error {
	return waitEmptyErr(g, waitUntil(ctx, "", func() (bool, error) {
		p, err := g.Populated()
		return !p, err
	}))
}

func (g *v1Group) Kill(ctx context.Context) (KillResult, error) {
	pids, err := g.Procs()
	if err != nil {
		return KillResult{}, newError(CodeFenceFailed, err, "list processes of "+g.name)
	}
	res := KillResult{Killed: len(pids)}
	return finishKill(g, res, sweepKill(ctx, g))
}

func (g *v1Group) Remove() error { return removeWithRetry(g) }
