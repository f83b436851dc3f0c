package runtime

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/layers"
)

// What the runtime answers about itself and its generations: status,
// records, wait, events.

// Status reports the state machine.
func (rt *Runtime) Status() api.Status {
	ret := rt.retention()
	var pinned []api.PinnedLayer
	if rt.layers != nil {
		pinned = rt.layers.Pinned()
	}
	reserveHeld := rt.layersReserve.heldBytes()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s := api.Status{
		Retention:  ret,
		Generation: rt.highest,
		State:      rt.stateLocked(),
		Mode:       string(rt.groups.Mode()),
		ModeReason: rt.groups.Reason(),
		ShimPid:    os.Getpid(),
		Subreaper:  os.Getpid() != 1,
		CgroupRoot: rt.groups.Root(),
		RuntimeDir: rt.cfg.RuntimeDir,
		Error:      rt.st.Failed,
		Version:    rt.cfg.Version,
		Isolation:  rt.isolationLocked(),
		Weakened:   rt.weak,
	}
	s.Isolation.Pinned = pinned // listed after layers were lost too: they hold edits saved nowhere else
	if s.Isolation.Mode == layers.ModeLayers {
		if r := rt.layersReserve; r != nil && r.size > 0 {
			s.Isolation.ReserveBytes, s.Isolation.ReserveHeldBytes = r.size, reserveHeld
		}
	}
	if rt.cfg.Reaper != nil {
		s.Orphans = rt.cfg.Reaper.Orphans()
	}
	if g := rt.current; g != nil {
		rec := rt.recordLocked(g)
		s.Current = &rec
		if g.running() {
			s.Pid = g.pid
		}
	}
	for _, g := range rt.sortedGensLocked(^uint64(0)) {
		s.Live = append(s.Live, rt.recordLocked(g))
	}
	paths := make([]string, 0, len(rt.worktrees))
	for p := range rt.worktrees {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		s.Worktrees = append(s.Worktrees, rt.worktrees[p].Registration())
	}
	return s
}

// sortedGensLocked lists the known generations below n, oldest first.
func (rt *Runtime) sortedGensLocked(below uint64) []*generation {
	out := make([]*generation, 0, len(rt.gens))
	for n, g := range rt.gens {
		if n < below {
			out = append(out, g)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n < out[j].n })
	return out
}

func (rt *Runtime) stateLocked() string {
	switch {
	case rt.fencing:
		return api.StateFencing
	case rt.st.Failed != nil:
		return api.StateFailed
	case rt.current != nil && rt.current.state == stSuspended:
		return api.StateSuspended
	case rt.current != nil && rt.current.running():
		return api.StateRunning
	case rt.current != nil:
		return api.StateExited
	}
	return api.StateIdle
}

func (rt *Runtime) recordLocked(g *generation) api.Generation {
	rec := api.Generation{
		Generation: g.n, Pid: g.pid, Command: g.spec.Command, StartedAt: g.started, Exit: g.exit,
		Worktree: g.spec.Worktree, Network: g.spec.Network, Labels: g.spec.Labels, State: g.apiState(),
		Stdout: filepath.Join(g.dir, "stdout"), Stderr: filepath.Join(g.dir, "stderr"),
		Limits: g.spec.Limits, Linger: g.spec.Linger, Idle: g.spec.Idle,
	}
	if g.group != nil {
		rec.Cgroup = g.group.Path()
	}
	if g.lease != nil {
		l := g.lease.rec
		rec.Lease = &l
	}
	if g.out != nil {
		rec.StdoutDropped, rec.StderrDropped = g.out.dropped()
	}
	return rec
}

// Generation returns one generation's record, live or from its directory.
func (rt *Runtime) Generation(n uint64) (api.Generation, error) {
	rt.mu.Lock()
	if g, ok := rt.gens[n]; ok {
		defer rt.mu.Unlock()
		return rt.recordLocked(g), nil
	}
	rt.mu.Unlock()
	var rec api.Generation
	if err := readJSON(filepath.Join(rt.genDir(n), "generation.json"), &rec); err != nil {
		return rec, errs.New(api.CodeNotFound, "generation %d is not known here", n)
	}
	rec.State = api.GenFenced
	var exit api.Exit
	if readJSON(filepath.Join(rt.genDir(n), "exit.json"), &exit) == nil {
		rec.Exit = &exit
		if !exit.Fenced && rec.Fence == nil {
			rec.State = api.StateExited
		}
	}
	return rec, nil
}

// Generations lists every generation shim keeps a record of (this shim's
// and a previous one's, within the retention policy), oldest first, those
// whose labels hold every k=v of labels only. A supervisor restarted after
// a deploy finds "its" generation by the labels it announced.
func (rt *Runtime) Generations(labels map[string]string) ([]api.Generation, error) {
	ents, err := os.ReadDir(filepath.Join(rt.cfg.RuntimeDir, "gen"))
	if err != nil && !os.IsNotExist(err) {
		return nil, errs.New(api.CodeInternal, "list generation records: %v", err)
	}
	var ns []uint64
	for _, e := range ents {
		if n, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && n > 0 {
			ns = append(ns, n)
		}
	}
	slices.Sort(ns)
	out := []api.Generation{}
	for _, n := range ns {
		rec, err := rt.Generation(n)
		if err != nil {
			continue // a record being written or pruned
		}
		match := true
		for k, v := range labels {
			if rec.Labels[k] != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, rec)
		}
	}
	return out, nil
}

// Wait blocks until nothing of generation n acts any more (its harness
// exited and what it left was killed, or it was fenced) and returns its exit
// record. With linger, it returns at the harness's exit.
func (rt *Runtime) Wait(ctx context.Context, n uint64) (api.Exit, error) {
	rt.mu.Lock()
	g, ok := rt.gens[n]
	rt.mu.Unlock()
	if ok && g.proc == nil {
		// Left by a previous shim: not this shim's child, so no exit
		// status; it ends when its cgroup is empty (it exited, or a fence
		// killed it).
		if g.group != nil {
			if err := g.group.WaitEmpty(ctx); err != nil {
				if ctx.Err() != nil {
					return api.Exit{}, ctx.Err()
				}
				return api.Exit{}, errs.New(api.CodeInternal, "generation %d: %v", n, err)
			}
		}
		return api.Exit{Generation: n, Pid: g.pid, ExitCode: -1, StartedAt: g.started, ExitedAt: time.Now().UTC(), Unknown: true}, nil
	}
	if ok {
		select {
		case <-g.quiet:
			<-g.exited
			rt.mu.Lock()
			defer rt.mu.Unlock()
			return *g.exit, nil
		case <-ctx.Done():
			return api.Exit{}, ctx.Err()
		}
	}
	var exit api.Exit
	if err := readJSON(filepath.Join(rt.genDir(n), "exit.json"), &exit); err != nil {
		return exit, errs.New(api.CodeNotFound, "generation %d has no exit record", n)
	}
	return exit, nil
}

// Subscribe streams events until the returned function is called.
func (rt *Runtime) Subscribe() (<-chan api.Event, func()) { return rt.events.subscribe() }
