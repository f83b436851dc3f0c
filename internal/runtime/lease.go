package runtime

import (
	"context"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// A lease is how a generation knows its supervisor is still there. When
// nobody renews it in time the generation is suspended: frozen, then cut
// as at a fence (the broker refuses it, every connection is aborted) but
// not killed, so a supervisor back from a deploy finds it as it was and
// either renews (it runs on) or fences it (its work is saved as usual).
// Nothing it does while its supervisor is gone reaches the network or the
// credentials.
//
// A suspension and a renewal each hold the generation's leaseMu for all
// they do. A renewal thaws under Runtime.mu, so no fence can begin between
// its check and its thaw; a fence that begins after a suspension simply
// finds the generation frozen.

// minLease is the shortest lease accepted.
const minLease = 50 * time.Millisecond

// maxLease is the longest (a week: a longer one is no lease).
const maxLease = 7 * 24 * time.Hour

// leaseState is a generation's lease. Guarded by Runtime.mu.
type leaseState struct {
	dur      time.Duration
	expires  time.Time
	timer    *time.Timer
	rec      api.Lease
	resumeTo genState // where a renewal puts a suspended generation back
}

// leaseOf validates a lease in milliseconds (0: none).
func leaseOf(ms int64) (time.Duration, error) {
	if ms < 0 || ms > 0 && ms < minLease.Milliseconds() || ms > maxLease.Milliseconds() {
		return 0, errs.New(api.CodeBadRequest, "lease_ms must be between %d and %d (got %d)", minLease.Milliseconds(), maxLease.Milliseconds(), ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// armLeaseLocked starts g's lease, or renews it: it runs out d from now.
// Runtime.mu held.
func (rt *Runtime) armLeaseLocked(g *generation, d time.Duration) {
	l := g.lease
	if l == nil {
		l = &leaseState{}
		g.lease = l
	}
	l.dur, l.expires = d, time.Now().Add(d)
	l.rec.DurationMS, l.rec.ExpiresAt = d.Milliseconds(), l.expires.UTC()
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timer = time.AfterFunc(d, func() { rt.leaseRanOut(g) })
}

// stopLeaseLocked ends g's lease timer (its harness exited, it is fenced).
// Runtime.mu held.
func stopLeaseLocked(g *generation) {
	if g.lease != nil && g.lease.timer != nil {
		g.lease.timer.Stop()
	}
}

// leaseRanOut suspends g when its lease ran out and nobody renewed it
// meanwhile: the broker refuses it from the moment its state says so, then
// it is frozen and cut. Where the freeze or the cut cannot be confirmed it
// is killed instead (fail closed: a generation nobody supervises does not
// run on); its worktree is restored by the next announcement, as after an
// exit.
func (rt *Runtime) leaseRanOut(g *generation) {
	g.leaseMu.Lock()
	defer g.leaseMu.Unlock()
	rt.mu.Lock()
	l := g.lease
	if l == nil || time.Now().Before(l.expires) || rt.shuttingDown || g.state != stRunning && g.state != stAdopted {
		rt.mu.Unlock()
		return
	}
	from := g.state
	rt.move(g, stSuspended)
	now := time.Now().UTC()
	l.resumeTo = from
	l.rec.Suspended, l.rec.SuspendedAt, l.rec.Suspensions = true, &now, l.rec.Suspensions+1
	l.rec.Cut, l.rec.Error, l.rec.FrozenAt = nil, nil, nil
	rt.mu.Unlock()

	// Frozen first, recorded after: a sync of state.json before the
	// freeze was time the harness ran on with its lease out (a push
	// begun then landed after suspended_at).
	t := time.Now()
	rep, frozenAt, err := rt.suspend(g)
	rt.mu.Lock()
	l.rec.FrozenAt = frozenAt
	if err := rt.saveLocked(); err != nil { // a restarted shim adopts it suspended
		rt.log.Warn("suspension not recorded in state.json", "generation", g.n, "error", err)
	}
	rt.mu.Unlock()
	fields := map[string]any{"lease_ms": l.dur.Milliseconds(), "cut": rep, "duration_ms": ms(time.Since(t))}
	killed := false
	if err != nil {
		rt.log.Error("a generation whose lease ran out could not be suspended; it is cut and killed", "generation", g.n, "error", err)
		fields["error"] = err.Error()
		// As a fence: what it has in flight is aborted before the kill
		// (killed processes close their sockets gracefully, flushing what
		// is queued), and its credentials are revoked.
		if _, cerr := rt.cut(g, false); cerr != nil {
			fields["cut_error"] = cerr.Error()
		}
		if g.group != nil {
			ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.KillTimeout)
			_, kerr := g.group.Kill(ctx)
			cancel()
			killed = kerr == nil
			if kerr != nil {
				rt.log.Error("nor killed; the next announcement fences it", "generation", g.n, "error", kerr)
				fields["kill_error"] = kerr.Error()
			}
		}
	}
	fields["killed"] = killed
	rt.mu.Lock()
	l.rec.Cut, l.rec.Killed = rep, killed
	if killed {
		l.rec.Suspended = false // dead, not suspended
	}
	if err != nil {
		l.rec.Error = asAPIError(err)
	}
	rt.mu.Unlock()
	rt.audit.Record("lease_expired", g.n, fields, true)
	rt.events.publish(api.EventLeaseExpired, g.n, &api.LeaseExpiredData{Killed: killed})
	what := "suspended"
	if err != nil {
		what = "not suspended: cut and killed"
		if !killed {
			what = "not suspended nor killed: the next announcement fences it"
		}
	}
	rt.log.Warn("lease ran out: generation "+what, "generation", g.n, "lease_ms", l.dur.Milliseconds())
}

// suspend freezes g until the kernel confirms it, then cuts it (a
// suspension's cut: credentials refused, connections aborted). frozenAt
// is when the freeze was confirmed (nil: it was not).
func (rt *Runtime) suspend(g *generation) (rep *api.CutReport, frozenAt *time.Time, err error) {
	if g.group != nil {
		g.calls.withoutSpawns(func() {
			ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.FreezeTimeout)
			err = g.group.Freeze(ctx)
			cancel()
		})
		if err != nil {
			return nil, nil, err
		}
		now := time.Now().UTC()
		frozenAt = &now
	}
	rep, err = rt.cut(g, true)
	return rep, frozenAt, err
}

// Renew renews generation n's lease (req.LeaseMS from now, or the one it
// was announced with). A suspended generation is resumed: its network and
// credentials back, then thawed. A generation below the token is stale (its
// supervisor was superseded); one no longer live is NOT_RUNNING.
func (rt *Runtime) Renew(n uint64, req api.RenewRequest) (*api.RenewResult, error) {
	d, err := leaseOf(req.LeaseMS)
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	g, ok := rt.gens[n]
	highest := rt.highest
	rt.mu.Unlock()
	switch {
	case n < highest:
		return nil, staleError(n, highest)
	case !ok && n > highest:
		return nil, errs.New(api.CodeNotFound, "generation %d has not been announced", n)
	case !ok:
		return nil, errs.New(api.CodeNotRunning, "generation %d is no longer live", n)
	}
	g.leaseMu.Lock()
	defer g.leaseMu.Unlock()
	res, err := rt.renewLocked(g, d)
	if err != nil {
		return nil, err
	}
	if res.Resumed {
		rt.audit.Record("lease_resumed", n, map[string]any{"suspensions": res.Lease.Suspensions}, false)
		rt.events.publish(api.EventResumed, n, nil)
		rt.log.Info("lease renewed: generation resumed", "generation", n)
	}
	return res, nil
}

// renewLocked is Renew under Runtime.mu (taken here): no fence begins
// between its look at g's state and its thaw.
func (rt *Runtime) renewLocked(g *generation, d time.Duration) (*api.RenewResult, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if g.n < rt.highest {
		// A newer announcement came while a suspension held leaseMu.
		return nil, staleError(g.n, rt.highest)
	}
	if d == 0 && g.lease != nil {
		d = g.lease.dur
	}
	if d == 0 {
		return nil, errs.New(api.CodeBadRequest, "generation %d was announced without a lease: give lease_ms", g.n)
	}
	res := &api.RenewResult{Generation: g.n}
	switch g.state {
	case stRunning, stAdopted:
		rt.armLeaseLocked(g, d)
	case stSuspended:
		if err := rt.resumeLocked(g); err != nil {
			return nil, err
		}
		rt.armLeaseLocked(g, d)
		res.Resumed = true
	case stExited, stQuiesced:
		// Its harness is gone: nothing to lease any more.
		stopLeaseLocked(g)
	default:
		return nil, errs.New(api.CodeNotRunning, "generation %d is being fenced", g.n)
	}
	if g.lease != nil {
		if res.State = g.apiState(); res.State != api.StateExited {
			g.lease.rec.Renewals++
		}
		res.Lease = g.lease.rec
	}
	res.State = g.apiState()
	return res, nil
}

// resumeLocked ends g's suspension: the broker answers it again and its
// proxy serves it again, then it is thawed; it is running (or adopted)
// again. Runtime.mu held: no fence begins meanwhile. A thaw the kernel
// does not confirm is suspended again (frozen, refused) and the renewal
// fails.
func (rt *Runtime) resumeLocked(g *generation) error {
	if b := rt.broker; b != nil {
		b.Resume(g.n)
	}
	if g.net != nil {
		g.net.Resume()
	}
	if g.group != nil {
		ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.FreezeTimeout)
		defer cancel()
		if err := g.group.Thaw(ctx); err != nil {
			fctx, fcancel := context.WithTimeout(context.Background(), rt.cfg.FreezeTimeout)
			ferr := g.group.Freeze(fctx)
			fcancel()
			if b := rt.broker; b != nil {
				b.Suspend(g.n)
			}
			if g.net != nil {
				_, _ = g.net.Suspend(g.group)
			}
			return errs.New(api.CodeInternal, "generation %d: thaw not confirmed (%v); suspended again (freeze: %v)", g.n, err, ferr)
		}
	}
	rt.move(g, g.lease.resumeTo)
	g.lease.rec.Suspended, g.lease.rec.SuspendedAt, g.lease.rec.FrozenAt = false, nil, nil
	if err := rt.saveLocked(); err != nil {
		rt.log.Warn("resumption not recorded in state.json", "generation", g.n, "error", err)
	}
	return nil
}
