package runtime

// The early start: a layered start's stub begun beside the fence (steps
// 2-4), once nothing older runs, and taken over by the start, or dropped
// when the fence fails.

import (
	"context"
	"slices"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
)

// earlyStart is the part of a start begun beside the fence of the
// generations before it (startEarly): the new generation's cgroup and
// its layer stub, whose exec and Go start-up cost a start milliseconds
// (20 in a container whose root is fuse-overlayfs). start takes it over,
// or undoes it; so does dropEarly when no start comes.
type earlyStart struct {
	done  chan struct{} // closed once begun, or given up
	group cgroup.Group  // nil: nothing was begun
	stub  *layerStub
	taken bool // by start or dropEarly; only their goroutine reads or writes it
}

// startEarly begins generation req's start where that can be done before
// the older generations are fenced: cgroups, layers, the sandbox's network (an
// isolated or empty one is made at the start, and the stub must be forked
// inside it), a worktree already registered. It runs once every older
// generation is frozen: nothing older can run, and nothing a harness
// can influence is touched. It returns at once (nil when there is
// nothing to begin); the work goes on beside the fence.
func (l *launcher) startEarly(req api.StartRequest) *earlyStart {
	// Without cgroups (pidns mode) every process in the namespace but
	// shim is the older generations' until their kill: so would the stub.
	if m := l.rt.groups.Mode(); m != cgroup.ModeCgroup2 && m != cgroup.ModeCgroup1 {
		return nil
	}
	if req.Network != api.NetworkHost || !l.rt.layered() {
		return nil
	}
	n := req.Generation
	wts, ok, err := l.layeredWorktrees(n, req)
	if err != nil || !ok || req.Worktree != "" && len(wts) == 0 {
		return nil // a worktree not registered yet: start registers it, and lays out its layer then
	}
	e := &earlyStart{done: make(chan struct{})}
	go func() {
		defer close(e.done)
		group, err := l.newGroup(context.Background(), n, req)
		if err != nil {
			l.rt.log.Debug("no early start", "generation", n, "error", err)
			return
		}
		stub, err := l.newStub(n, wts, group, func(fn func() error) error { return fn() })
		if err != nil {
			l.rt.log.Debug("no early start", "generation", n, "error", err)
			l.removeStarted(n, group)
			return
		}
		e.group, e.stub = group, stub
	}()
	return e
}

// take hands start what e began for req, once it is done: its cgroup
// and its stub, when the layers it laid out are still the ones req gets
// (a worktree registered since gets a layer the stub was not given).
// Otherwise what e began is undone and start begins again.
func (e *earlyStart) take(l *launcher, req api.StartRequest) (*layerStub, cgroup.Group) {
	if e == nil {
		return nil, nil
	}
	<-e.done
	wts, ok, err := l.layeredWorktrees(req.Generation, req)
	if e.taken || e.group == nil || err != nil || !ok || !slices.Equal(wts, e.stub.wts) || e.stub.exited() {
		l.dropEarly(e, req.Generation)
		return nil, nil
	}
	e.taken = true
	return e.stub, e.group
}

// dropEarly undoes what e began, unless start took it over. Nothing was
// granted to n yet, so nothing is revoked: a start of n that follows (the
// supervisor's retry after a failed fence) gets its credentials.
func (l *launcher) dropEarly(e *earlyStart, n uint64) {
	if e == nil {
		return
	}
	<-e.done
	if e.taken || e.group == nil {
		return
	}
	e.taken = true
	e.stub.ready.r.Close()
	l.removeStarted(n, e.group)
}
