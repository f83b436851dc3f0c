package runtime

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// Leases: a generation whose supervisor stops renewing is suspended
// (frozen, then cut), a renewal resumes it, a fence ends it as any other.
// The expiry is driven by calling leaseRanOut on an expired lease, as the
// timer does, so no test waits for time to pass but the one that shows the
// timer itself fires.

func withLease(ms int64) func(*api.StartRequest) {
	return func(r *api.StartRequest) { r.LeaseMS = ms }
}

// expire makes generation n's lease run out now, as its timer would.
func (f *fixture) expire(n uint64) {
	f.t.Helper()
	f.rt.mu.Lock()
	g := f.rt.gens[n]
	if g == nil || g.lease == nil {
		f.rt.mu.Unlock()
		f.t.Fatalf("generation %d has no lease", n)
	}
	g.lease.expires = time.Now().Add(-time.Millisecond)
	f.rt.mu.Unlock()
	f.rt.leaseRanOut(g)
}

func (f *fixture) lease(n uint64) api.Lease {
	f.t.Helper()
	rec, err := f.rt.Generation(n)
	if err != nil || rec.Lease == nil {
		f.t.Fatalf("generation %d lease: %v %+v", n, err, rec)
	}
	return *rec.Lease
}

func TestALeaseThatRunsOutSuspendsTheGenerationFrozenThenCutNotKilled(t *testing.T) {
	f := newFixture(t)
	withNetworks(f)
	f.mustStart(1, withLease(60_000))
	if _, cur, _ := f.rt.Identify(1001); !cur {
		t.Fatal("a running generation is refused credentials")
	}
	ch, stop := f.rt.Subscribe()
	defer stop()
	f.expire(1)
	f.j.inOrder(t, "freeze gen-1", "suspend 1", "netsuspend 1")
	if f.j.index("kill gen-1") >= 0 || f.j.index("revoke 1") >= 0 || f.j.index("netcut 1") >= 0 {
		t.Fatalf("a suspension killed or cut for good: %q", f.j.all())
	}
	if s := f.stateOf(1); s != stSuspended {
		t.Fatalf("state %s, want suspended", s)
	}
	if st := f.rt.Status(); st.State != api.StateSuspended || st.Current.State != api.StateSuspended {
		t.Fatalf("status %s, current %s", st.State, st.Current.State)
	}
	if _, cur, _ := f.rt.Identify(1001); cur {
		t.Fatal("a suspended generation is still answered by the broker")
	}
	l := f.lease(1)
	if !l.Suspended || l.SuspendedAt == nil || l.Suspensions != 1 || l.Killed || l.Cut == nil || l.Cut.TunnelsClosed != 1 {
		t.Fatalf("lease record: %+v", l)
	}
	if ev := <-ch; ev.Type != api.EventLeaseExpired || ev.Generation != 1 {
		t.Fatalf("event %+v", ev)
	}
	if recs := auditRecords(t, f.dir, "lease_expired"); len(recs) != 1 {
		t.Fatalf("audit: %v", recs)
	}
}

func TestARenewalResumesASuspendedGenerationCredentialsAndNetworkBeforeTheThaw(t *testing.T) {
	f := newFixture(t)
	withNetworks(f)
	f.mustStart(1, withLease(60_000))
	f.expire(1)
	res, err := f.rt.Renew(1, api.RenewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	f.j.inOrder(t, "netsuspend 1", "resume 1", "netresume 1", "thaw gen-1")
	if !res.Resumed || res.State != api.StateRunning || res.Lease.Suspended || res.Lease.DurationMS != 60_000 || res.Lease.Renewals != 1 {
		t.Fatalf("renewal: %+v", res)
	}
	if _, cur, _ := f.rt.Identify(1001); !cur {
		t.Fatal("a resumed generation is still refused credentials")
	}
	// A renewal of a running generation only moves its deadline.
	before := f.lease(1).ExpiresAt
	res, err = f.rt.Renew(1, api.RenewRequest{LeaseMS: 120_000})
	if err != nil || res.Resumed || !res.Lease.ExpiresAt.After(before) || res.Lease.DurationMS != 120_000 {
		t.Fatalf("second renewal: %+v %v", res, err)
	}
}

func TestARenewedLeaseDoesNotRunOutAtItsOldDeadline(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withLease(60_000))
	f.rt.mu.Lock()
	g := f.rt.gens[1]
	f.rt.mu.Unlock()
	// The old timer fires after the renewal: the deadline is the renewal's.
	if _, err := f.rt.Renew(1, api.RenewRequest{}); err != nil {
		t.Fatal(err)
	}
	f.rt.leaseRanOut(g)
	if s := f.stateOf(1); s != stRunning || f.j.index("freeze gen-1") >= 0 {
		t.Fatalf("state %s after a stale timer: %q", s, f.j.all())
	}
}

func TestTheLeaseTimerSuspendsByItself(t *testing.T) {
	f := newFixture(t)
	ch, stop := f.rt.Subscribe()
	defer stop()
	f.mustStart(1, withLease(50))
	for ev := range ch {
		if ev.Type == api.EventLeaseExpired {
			break
		}
	}
	if s := f.stateOf(1); s != stSuspended {
		t.Fatalf("state %s", s)
	}
}

func TestASuspensionThatCannotBeConfirmedKillsTheGeneration(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withLease(60_000))
	f.s.group(1).freezeErr = errors.New("cgroup.events: frozen 0")
	exited := f.exitedChan(1)
	f.expire(1)
	<-exited
	f.j.inOrder(t, "freeze gen-1", "revoke 1", "abort gen-1", "kill gen-1")
	l := f.lease(1)
	if !l.Killed || l.Error == nil {
		t.Fatalf("lease record: %+v", l)
	}
	if _, err := f.rt.Renew(1, api.RenewRequest{}); err != nil {
		t.Fatalf("renewal of an exited generation: %v", err)
	}
	if res, _ := f.rt.Renew(1, api.RenewRequest{}); res.State != api.StateExited || res.Resumed {
		t.Fatalf("renewal of a killed generation: %+v", res)
	}
}

func TestAThawThatIsNotConfirmedLeavesTheGenerationSuspended(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withLease(60_000))
	f.expire(1)
	f.s.group(1).thawErr = errors.New("cgroup.events: frozen 1")
	if _, err := f.rt.Renew(1, api.RenewRequest{}); err == nil {
		t.Fatal("a renewal whose thaw failed succeeded")
	}
	if s := f.stateOf(1); s != stSuspended {
		t.Fatalf("state %s", s)
	}
	if _, cur, _ := f.rt.Identify(1001); cur {
		t.Fatal("a generation still suspended is answered by the broker")
	}
	if i, j := f.j.index("thaw gen-1"), len(f.j.all())-1; f.j.all()[j] != "suspend 1" || i < 0 {
		t.Fatalf("not suspended again after the failed thaw: %q", f.j.all())
	}
}

func TestASuspendedGenerationIsFencedAsAnyOther(t *testing.T) {
	f := newFixture(t)
	withNetworks(f)
	f.mustStart(1, withLease(60_000))
	f.expire(1)
	res := f.mustStart(2)
	f.j.inOrder(t, "netsuspend 1", "revoke 1", "netcut 1", "kill gen-1", "start 2")
	if len(res.Fenced) != 1 || res.Fenced[0].StateBefore != api.StateSuspended {
		t.Fatalf("fenced: %+v", res.Fenced)
	}
	if _, err := f.rt.Renew(1, api.RenewRequest{}); codeOf(err) != api.CodeStaleGeneration {
		t.Fatalf("renewal of a fenced generation: %v", err)
	}
}

func TestRenewalErrors(t *testing.T) {
	f := newFixture(t)
	if _, err := f.rt.Renew(1, api.RenewRequest{}); codeOf(err) != api.CodeNotFound {
		t.Errorf("unannounced: %v", err)
	}
	f.mustStart(1)
	if _, err := f.rt.Renew(1, api.RenewRequest{}); codeOf(err) != api.CodeBadRequest {
		t.Errorf("no lease, none given: %v", err)
	}
	if res, err := f.rt.Renew(1, api.RenewRequest{LeaseMS: 60_000}); err != nil || res.Lease.DurationMS != 60_000 {
		t.Errorf("a lease given by a renewal: %+v %v", res, err)
	}
	for _, ms := range []int64{-1, 10, int64(8 * 24 * time.Hour / time.Millisecond)} {
		if _, err := f.rt.Renew(1, api.RenewRequest{LeaseMS: ms}); codeOf(err) != api.CodeBadRequest {
			t.Errorf("lease_ms %d: %v", ms, err)
		}
		if _, err := f.start(2, withLease(ms)); codeOf(err) != api.CodeBadRequest {
			t.Errorf("start with lease_ms %d: %v", ms, err)
		}
	}
	f.mustStart(2)
	if _, err := f.rt.Renew(1, api.RenewRequest{}); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("superseded: %v", err)
	}
	if _, err := f.rt.End(context.Background(), 2, api.EndRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rt.Renew(2, api.RenewRequest{LeaseMS: 60_000}); codeOf(err) != api.CodeNotRunning {
		t.Errorf("ended: %v", err)
	}
}

func TestAnIdenticalRetryRenewsTheLeaseAndTheLeaseIsNotPartOfTheIdentity(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withLease(60_000))
	f.expire(1)
	res, err := f.start(1, withLease(30_000))
	if err != nil || !res.Replayed {
		t.Fatalf("retry with another lease: %+v %v", res, err)
	}
	if s := f.stateOf(1); s != stRunning || f.lease(1).DurationMS != 30_000 {
		t.Fatalf("the retry did not renew: %s %+v", s, f.lease(1))
	}
}

func TestALeaseOutlivesARestartOfShimAndRunsOutForTheAdoptedGeneration(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withLease(60_000))
	st, err := loadState(f.rt.statePath())
	if err != nil || st.Live[1].LeaseMS != 60_000 {
		t.Fatalf("state.json: %+v %v", st.Live, err)
	}
	// A new runtime over the same dir adopts generation 1 with its lease.
	rt := newRuntime(f.rt.cfg, st, f.rt.audit, fakeGroups{f.s}, f.s)
	g := rt.adopted(1, stAdopted)
	g.group = f.s.group(1)
	if g.lease == nil || g.lease.dur != time.Minute {
		t.Fatalf("adopted lease: %+v", g.lease)
	}
	rt.mu.Lock()
	g.lease.expires = time.Now().Add(-time.Millisecond)
	rt.mu.Unlock()
	rt.leaseRanOut(g)
	if g.state != stSuspended {
		t.Fatalf("adopted state %s", g.state)
	}
	if res, err := rt.Renew(1, api.RenewRequest{}); err != nil || res.State != api.GenAdopted || !res.Resumed {
		t.Fatalf("renewal of the adopted generation: %+v %v", res, err)
	}
}
