package runtime

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
)

// Signal sends sig to generation n's harness, or to every process of the
// generation when all is set.
func (rt *Runtime) Signal(n uint64, sig unix.Signal, all bool) error {
	rt.mu.Lock()
	g, ok := rt.gens[n]
	if !ok || !g.running() && !all {
		rt.mu.Unlock()
		return errs.New(api.CodeNotRunning, "generation %d is not running", n)
	}
	pid, group := g.pid, g.group
	rt.mu.Unlock()
	if group == nil {
		return errs.New(api.CodeNotRunning, "generation %d has no cgroup (left by a previous shim)", n)
	}
	rt.audit.Record("signal", n, map[string]any{"signal": sig.String(), "all": all}, false)
	if !all {
		return unix.Kill(pid, sig)
	}
	if rt.groups.Mode() == cgroup.ModePidns {
		return errs.New(api.CodeUnsupported, "signalling every process of a generation needs cgroups (mode pidns)")
	}
	pids, err := group.Procs()
	if err != nil {
		return err
	}
	for _, p := range pids {
		unix.Kill(p, sig)
	}
	return nil
}

// ForwardSignal passes a signal shim received to the current harness.
func (rt *Runtime) ForwardSignal(sig unix.Signal) {
	rt.mu.Lock()
	g := rt.current
	running := g != nil && g.running()
	rt.mu.Unlock()
	if !running {
		return
	}
	rt.log.Debug("forwarding signal", "signal", sig.String(), "generation", g.n, "pid", g.pid)
	unix.Kill(g.pid, sig)
}

// Shutdown ends shim's work: the current harness has had the signal
// (forwarded by the caller); it gets grace to exit. An announcement still
// in flight when the grace ends is cancelled (its git is killed, its waits
// end), then every live generation is killed. So shim exits within grace
// plus the kill timeout, whatever is in flight. It returns the exit code
// shim should exit with: the current harness's (128+signal when killed), or
// 0 when none ran.
func (rt *Runtime) Shutdown(grace time.Duration) int {
	deadline := time.Now().Add(grace)
	rt.mu.Lock()
	rt.shuttingDown = true
	cur := rt.current
	frozen := cur != nil && cur.state == stSuspended // it cannot exit
	rt.mu.Unlock()
	rt.audit.Record("shutdown", 0, map[string]any{"grace_ms": grace.Milliseconds()}, true)
	rt.events.publish(api.EventShutdown, 0, nil)
	if cur != nil && cur.proc != nil && !frozen {
		select {
		case <-cur.exited:
		case <-time.After(time.Until(deadline)):
			rt.log.Warn("harness did not exit within the grace period; killing", "generation", cur.n, "grace", grace)
		}
	}
	rt.lockAnnounceBy(deadline)
	defer rt.announce.Unlock()
	rt.stopMaintenance()
	rt.mu.Lock()
	var live []*generation
	for _, g := range rt.sortedGensLocked(^uint64(0)) {
		// Quiesced and emptied ones are dead already: their restore
		// waits for the next shim.
		stopLeaseLocked(g)
		if g.transition(stFencing) == nil {
			live = append(live, g)
		}
	}
	rt.mu.Unlock()
	for _, g := range live {
		rt.killAtShutdown(g)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if err := rt.saveLocked(); err != nil {
		rt.log.Error("state not persisted at shutdown", "error", err)
	}
	if cur == nil || cur.exit == nil {
		return 0
	}
	return cur.exit.ExitCode
}

// lockAnnounceBy takes the announcement lock, cancelling the announcement
// holding it if it is still running at deadline.
func (rt *Runtime) lockAnnounceBy(deadline time.Time) {
	got := make(chan struct{})
	go func() { rt.announce.Lock(); close(got) }()
	select {
	case <-got:
		return
	case <-time.After(time.Until(deadline)):
	}
	rt.mu.Lock()
	cancel := rt.cancelAnnounce
	rt.mu.Unlock()
	if cancel != nil {
		rt.log.Warn("cancelling the announcement in flight to shut down")
		cancel()
	}
	<-got
}

// killAtShutdown ends one generation as a fence's first three steps do; its
// restore (if it had a worktree) is left to the next shim.
func (rt *Runtime) killAtShutdown(g *generation) {
	if g.group == nil {
		return // already emptied; its restore waits for the next shim
	}
	f := &fenceRun{ctx: context.Background(), g: g, rep: api.FenceReport{DurationsMS: map[string]float64{}}}
	if err := rt.freeze(f); err != nil {
		rt.log.Warn("freeze at shutdown not confirmed; killing anyway", "generation", g.n, "error", err)
	}
	if _, err := rt.cut(g, false); err != nil {
		rt.log.Warn("cut at shutdown not confirmed", "generation", g.n, "error", err)
	}
	err := rt.killAndRemove(f)
	if err != nil {
		rt.log.Error("generation not emptied at shutdown", "generation", g.n, "error", err)
	}
	rt.audit.Record("killed_at_shutdown", g.n, map[string]any{"killed": f.rep.Killed, "survivors": f.rep.Survivors}, true)
}

// CheckPeer decides whether a control-socket peer may talk to shim: its uid
// must be root or allowed, and it must not live inside a harness (or git)
// cgroup. pid 0 means the peer is outside shim's pid namespace (a supervisor
// on the host through a bind-mounted socket): it cannot be a harness process.
func (rt *Runtime) CheckPeer(pid, uid int) error {
	allowed := uid == 0
	for _, u := range rt.cfg.AllowUIDs {
		allowed = allowed || u == uid
	}
	if !allowed {
		return errs.New(api.CodePeerNotAllowed, "uid %d may not control shim (allowed: root and --allow-uid)", uid)
	}
	if pid == 0 {
		return nil
	}
	if rt.groups.Mode() == cgroup.ModePidns {
		return rt.checkPeerSession(pid)
	}
	name, err := rt.groups.GroupOf(pid)
	if err != nil {
		return errs.New(api.CodePeerNotAllowed, "cannot tell which cgroup peer pid %d is in: %v", pid, err)
	}
	if name != "" && name != "shim" {
		return errs.New(api.CodePeerNotAllowed, "peer pid %d runs inside %s; harness processes may not control shim", pid, name)
	}
	return nil
}

// checkPeerSession is the pidns-mode peer check, without cgroups: refuse a
// peer in the session of a live harness (harnesses start in their own
// session) or descended from one.
func (rt *Runtime) checkPeerSession(pid int) error {
	rt.mu.Lock()
	harness := map[int]uint64{}
	for _, g := range rt.gens {
		if g.pid != 0 {
			harness[g.pid] = g.n
		}
	}
	rt.mu.Unlock()
	for p, hops := pid, 0; p > 1 && hops < 64; hops++ {
		ppid, sid, err := procStat(p)
		if err != nil {
			return errs.New(api.CodePeerNotAllowed, "cannot inspect peer pid %d: %v", pid, err)
		}
		if n, ok := harness[sid]; ok {
			return errs.New(api.CodePeerNotAllowed, "peer pid %d is in the session of generation %d's harness", pid, n)
		}
		if n, ok := harness[p]; ok {
			return errs.New(api.CodePeerNotAllowed, "peer pid %d descends from generation %d's harness", pid, n)
		}
		p = ppid
	}
	return nil
}

// procStat reads ppid and session id from /proc/<pid>/stat.
func procStat(pid int) (ppid, sid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 4 {
		return 0, 0, fmt.Errorf("malformed stat")
	}
	ppid, _ = strconv.Atoi(f[1])
	sid, _ = strconv.Atoi(f[3])
	return ppid, sid, nil
}

// PeerConnected and PeerGone track connected control peers so that a pidns
// sweep spares the very client that asked for the fence.
func (rt *Runtime) PeerConnected(pid int) {
	rt.mu.Lock()
	rt.peers[pid]++
	rt.mu.Unlock()
}

// PeerGone ends what PeerConnected started.
func (rt *Runtime) PeerGone(pid int) {
	rt.mu.Lock()
	if rt.peers[pid]--; rt.peers[pid] <= 0 {
		delete(rt.peers, pid)
	}
	rt.mu.Unlock()
}

// IsPeer reports whether pid is a connected control peer.
func (rt *Runtime) IsPeer(pid int) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.peers[pid] > 0
}

// Identify maps a credential-broker caller to its generation, and says
// whether that generation is the current, running one.
func (rt *Runtime) Identify(pid int) (uint64, bool, error) {
	var n uint64
	if rt.groups.Mode() == cgroup.ModePidns {
		return 0, false, fmt.Errorf("credential callers cannot be identified without cgroups")
	}
	name, err := rt.groups.GroupOf(pid)
	if err != nil {
		return 0, false, err
	}
	if strings.HasPrefix(name, "git-") {
		// shim's own fetching git: answered with the fetch's grant only.
		rt.mu.Lock()
		defer rt.mu.Unlock()
		if key, ok := rt.gitGrants[name]; ok {
			return key, true, nil
		}
		return 0, false, fmt.Errorf("pid %d is in %s, which runs no fetch", pid, name)
	}
	if !strings.HasPrefix(name, "gen-") {
		return 0, false, fmt.Errorf("pid %d is not in a generation (cgroup %q)", pid, name)
	}
	n, err = strconv.ParseUint(strings.TrimPrefix(name, "gen-"), 10, 64)
	if err != nil {
		return 0, false, err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.starting != 0 && n == rt.starting {
		// Its harness already runs and may ask at once, before Start has
		// made it current; a failed start revokes its grant.
		return n, true, nil
	}
	// Only the current generation, running, below no announcement: from
	// the moment a newer one is admitted (the token is raised first), the
	// answer is no.
	g := rt.current
	return n, g != nil && g.n == n && g.state == stRunning && n >= rt.highest, nil
}
