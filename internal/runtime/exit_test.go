package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
)

// What happens after a harness exits on its own, the per-generation
// network, and the settle-window re-check of the fence's push check.

// fakeNet is a generation's own network namespace.
type fakeNet struct {
	j      *journal
	n      uint64
	mu     sync.Mutex
	cutErr error
}

func (n *fakeNet) Run(fn func() error) error { return fn() }
func (n *fakeNet) Env() []string {
	return []string{"HTTPS_PROXY=http://169.254.0.1:3128", "NO_PROXY=localhost"}
}
func (n *fakeNet) Info() api.NetworkInfo {
	return api.NetworkInfo{Mode: api.NetworkIsolated, Generation: n.n, Proxy: "169.254.0.1:3128"}
}
func (n *fakeNet) Cut(cgroup.Group) (api.CutReport, error) {
	n.j.add("netcut %d", n.n)
	n.mu.Lock()
	defer n.mu.Unlock()
	return api.CutReport{TunnelsClosed: 1, ConnectionsClosed: 2, LinkDeleted: true,
		Connections: []api.Connection{{Via: "proxy", Target: "api.example:443", InFlight: true}, {Via: "socket"}},
		DurationsMS: map[string]float64{"tunnels": 0.1, "link": 0.2}}, n.cutErr
}
func (n *fakeNet) Close() error { n.j.add("netclose %d", n.n); return nil }
func (n *fakeNet) Suspend(cgroup.Group) (api.CutReport, error) {
	n.j.add("netsuspend %d", n.n)
	return api.CutReport{TunnelsClosed: 1, DurationsMS: map[string]float64{}}, nil
}
func (n *fakeNet) Resume() { n.j.add("netresume %d", n.n) }

// netStarter gives every generation its own fakeNet (network none or
// isolated).
type netStarter struct {
	*fakeStarter
	nets map[uint64]*fakeNet
}

func (s netStarter) start(ctx context.Context, req api.StartRequest, baseline string, early *earlyStart) (*generation, error) {
	g, err := s.fakeStarter.start(ctx, req, baseline, early)
	if err != nil {
		return nil, err
	}
	n := &fakeNet{j: s.j, n: req.Generation}
	s.nets[req.Generation] = n
	g.net = n
	return g, nil
}

func withNetworks(f *fixture) netStarter {
	s := netStarter{fakeStarter: f.s, nets: map[uint64]*fakeNet{}}
	f.rt.launch = s
	return s
}

// exitedChan is generation n's exited channel.
func (f *fixture) exitedChan(n uint64) <-chan struct{} {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	return f.rt.gens[n].exited
}

func TestAGenerationWithItsOwnNetworkIsCutThroughItAndReleasedAfterTheKill(t *testing.T) {
	f := newFixture(t)
	withNetworks(f)
	f.mustStart(1)
	res := f.mustStart(2)
	order := []string{"freeze gen-1", "revoke 1", "netcut 1", "kill gen-1", "remove gen-1", "netclose 1", "start 2"}
	last := -1
	for _, step := range order {
		i := f.j.index(step)
		if i <= last {
			t.Fatalf("%q out of order in %q", step, f.j.all())
		}
		last = i
	}
	if f.j.index("abort") >= 0 {
		t.Errorf("a generation with its own network was also cut in shim's: %q", f.j.all())
	}
	c := res.Fenced[0].Cut
	if c == nil || c.TunnelsClosed != 1 || c.ConnectionsClosed != 2 || !c.LinkDeleted || !c.InFlight || len(c.Connections) != 2 {
		t.Fatalf("cut report: %+v", c)
	}
	for _, k := range []string{"credentials", "tunnels", "link"} {
		if _, ok := c.DurationsMS[k]; !ok {
			t.Errorf("cut durations lack %s: %v", k, c.DurationsMS)
		}
	}
	if res.Network == nil || res.Network.Generation != 2 || res.Network.Mode != api.NetworkIsolated {
		t.Errorf("the new generation's network: %+v", res.Network)
	}
}

func TestANetworkCutThatFailsFailsTheFenceWithCutFailedButStillKills(t *testing.T) {
	for _, cutErr := range []error{errors.New("netlink: EBUSY"), errs.New(api.CodeCutFailed, "link not deleted")} {
		f := newFixture(t)
		s := withNetworks(f)
		f.mustStart(1)
		s.nets[1].cutErr = cutErr
		_, err := f.start(2)
		if codeOf(err) != api.CodeCutFailed || f.j.index("kill gen-1") < 0 || f.j.index("start 2") >= 0 {
			t.Errorf("%v: want CUT_FAILED after the kill and no start: %v %q", cutErr, err, f.j.all())
		}
	}
}

func TestAnExitedHarnessIsCutAtOnceAndItsRestKilledAfterTheGrace(t *testing.T) {
	f := newFixture(t)
	withNetworks(f)
	f.rt.cfg.ExitGrace = time.Millisecond
	ch, stop := f.rt.Subscribe()
	defer stop()
	f.mustStart(1)
	f.s.group(1).proc.exit(0)
	if _, err := f.rt.Wait(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	order := []string{"revoke 1", "netcut 1", "kill gen-1", "remove gen-1", "netclose 1"}
	last := -1
	for _, step := range order {
		i := f.j.index(step)
		if i <= last {
			t.Fatalf("%q out of order in %q", step, f.j.all())
		}
		last = i
	}
	if f.stateOf(1) != stQuiesced || f.rt.Status().State != api.StateExited {
		t.Errorf("states: %s %s", f.stateOf(1), f.rt.Status().State)
	}
	var types []string
	for len(types) < 3 {
		types = append(types, (<-ch).Type)
	}
	if fmt.Sprint(types) != fmt.Sprint([]string{api.EventStarted, api.EventExited, api.EventQuiesced}) {
		t.Errorf("events %v", types)
	}
	if recs := auditRecords(t, f.dir, "generation_quiesced"); len(recs) != 1 || recs[0]["killed"] != float64(3) {
		t.Errorf("quiesced record: %v", recs)
	}
}

func TestAnExitWhoseLeftoversCannotBeKilledStaysExitedAndTheNextFenceKills(t *testing.T) {
	f := newFixture(t)
	f.rt.cfg.ExitGrace = time.Millisecond
	f.mustStart(1)
	g := f.s.group(1)
	tried := make(chan struct{})
	var once sync.Once
	g.mu.Lock()
	g.killErr = errs.New(api.CodeFenceFailed, "1 survivor")
	g.onKill = func() { once.Do(func() { close(tried) }) }
	g.mu.Unlock()
	g.proc.exit(0)
	<-tried // quiesce's kill, failed (its error was taken before the hook ran)
	g.mu.Lock()
	g.killErr, g.onKill = nil, nil
	g.mu.Unlock()
	if st := f.stateOf(1); st != stExited {
		t.Fatalf("state %s after an unconfirmed kill, want exited", st)
	}
	res := f.mustStart(2)
	if g.kills != 2 || f.stateOf(1) != stFenced || res.Fenced[0].StateBefore != api.StateExited {
		t.Errorf("kills %d, state %s, report %+v", g.kills, f.stateOf(1), res.Fenced[0])
	}
}

func TestAFenceDuringTheExitGraceTakesOverAndTheExitStaysItsOwn(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "a"))
	g := f.s.group(1)
	g.proc.exit(4)
	<-f.exitedChan(1)
	f.mustStart(2, withWorktree("/w", ""))
	if g.kills != 1 {
		t.Errorf("kills %d: the grace timer and the fence both killed", g.kills)
	}
	// The exit happened on its own: the record says so, and the fence.
	rec, err := f.rt.Generation(1)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != api.GenFenced || rec.Exit == nil || rec.Exit.Fenced || rec.Exit.ExitCode != 4 || rec.Fence == nil {
		t.Errorf("record: state %s exit %+v fence %v", rec.State, rec.Exit, rec.Fence != nil)
	}
	if exit, err := f.rt.Wait(context.Background(), 1); err != nil || exit.ExitCode != 4 {
		t.Errorf("wait after the fence: %+v %v", exit, err)
	}
}

// settleWorktree is a worktree whose restore reports a push check and
// whose remote the test moves.
type settleWorktree struct {
	*fakeWorktree
	fetch  *api.FetchReport // what Restore reports
	head   string           // what RemoteHead answers
	err    error
	called chan api.FetchReport
}

func (w settleWorktree) Restore(ctx context.Context, gen uint64, rev string, f *fetchSpec) (*api.WorktreeReport, error) {
	rep, err := w.fakeWorktree.Restore(ctx, gen, rev, f)
	if rep != nil && f != nil && w.fetch != nil {
		fr := *w.fetch
		rep.Fetch = &fr
	}
	return rep, err
}

func (w settleWorktree) RemoteHead(_ context.Context, first api.FetchReport, _ *fetchSpec) (string, error) {
	if w.called != nil {
		w.called <- first
	}
	return w.head, w.err
}

var atFence = api.FetchReport{Remote: "origin", Branch: "main", URL: "https://git.example/r.git",
	FetchedCommit: "f1", Baseline: "b0", RemoteMoved: true, RemoteCommitCount: 1,
	RemoteCommits: []api.RemoteCommit{{Commit: "f1", Subject: "pushed by gen 1"}}}

func TestTheSettleReCheckStoresWhereTheRemoteIsNow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		head  string
		err   error
		moved bool // published as remote_moved
		want  api.FetchReport
	}{
		{"moved", "f2", nil, true, api.FetchReport{FetchedCommit: "f2", RemoteMoved: true}},
		{"reset to the baseline", "b0", nil, true, api.FetchReport{FetchedCommit: "b0", RemoteMoved: false}},
		{"branch deleted", "", nil, true, api.FetchReport{FetchedCommit: "", RemoteMoved: false}},
		{"unchanged", "f1", nil, false, api.FetchReport{FetchedCommit: "f1", RemoteMoved: true, RemoteCommitCount: 1}},
		{"unreachable", "", errors.New("ls-remote: 503"), false, api.FetchReport{FetchedCommit: "f1", RemoteMoved: true, RemoteCommitCount: 1, Error: "ls-remote: 503"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			dir := f.rt.genDir(1)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := writeJSON(filepath.Join(dir, "generation.json"), api.Generation{Generation: 1, State: api.GenFenced}); err != nil {
				t.Fatal(err)
			}
			ch, stop := f.rt.Subscribe()
			defer stop()
			wt := settleWorktree{fakeWorktree: &fakeWorktree{j: f.j, path: "/w"}, head: tc.head, err: tc.err}
			f.rt.settle(1, wt, atFence, &fetchSpec{Settle: time.Millisecond})
			rec, err := f.rt.Generation(1)
			if err != nil || rec.PushCheck == nil {
				t.Fatalf("record: %+v %v", rec, err)
			}
			pc := rec.PushCheck
			if !pc.Settled || pc.FetchedCommit != tc.want.FetchedCommit || pc.RemoteMoved != tc.want.RemoteMoved ||
				pc.RemoteCommitCount != tc.want.RemoteCommitCount || pc.Error != tc.want.Error || pc.Branch != "main" {
				t.Errorf("push check %+v, want %+v", pc, tc.want)
			}
			if (len(pc.RemoteCommits) == 0) != (pc.RemoteCommitCount == 0) {
				t.Errorf("commits %v with count %d", pc.RemoteCommits, pc.RemoteCommitCount)
			}
			recs := auditRecords(t, f.dir, "push_check_settled")
			if len(recs) != 1 || recs[0]["first_commit"] != "f1" || recs[0]["fetched_commit"] != tc.want.FetchedCommit {
				t.Errorf("audit: %v", recs)
			}
			select {
			case ev := <-ch:
				if d, ok := ev.Data.(*api.RemoteMovedData); !tc.moved || ev.Type != api.EventRemoteMoved || !ok || d.AtFence != "f1" || d.Now != tc.want.FetchedCommit {
					t.Errorf("event %+v (moved: %v)", ev, tc.moved)
				}
			default:
				if tc.moved {
					t.Error("no remote_moved event")
				}
			}
		})
	}
}

func TestTheSettleReCheckOfAnAdoptedGenerationIsAuditedOnly(t *testing.T) {
	f := newFixture(t)
	wt := settleWorktree{fakeWorktree: &fakeWorktree{j: f.j, path: "/w"}, head: "f2"}
	f.rt.settle(3, wt, atFence, &fetchSpec{Settle: time.Millisecond})
	if _, err := f.rt.Generation(3); codeOf(err) != api.CodeNotFound {
		t.Errorf("a record was made up: %v", err)
	}
	if len(auditRecords(t, f.dir, "push_check_settled")) != 1 {
		t.Error("not audited")
	}
}

func TestAFenceWithASettleWindowChecksTheRemoteAgainAfterIt(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "b0"))
	wt := settleWorktree{fakeWorktree: f.s.trees["/w"], fetch: &atFence, head: "f2", called: make(chan api.FetchReport, 4)}
	f.rt.mu.Lock()
	f.rt.worktrees["/w"] = wt
	f.rt.mu.Unlock()
	ch, stop := f.rt.Subscribe()
	defer stop()
	res, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2, Worktree: "/w",
		Fetch: &api.FetchSpec{Remote: "origin", Branch: "main", SettleMS: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if w := res.Fenced[0].Worktree; w == nil || w.Fetch == nil || w.Fetch.FetchedCommit != "f1" {
		t.Fatalf("the fence's push check: %+v", res.Fenced[0].Worktree)
	}
	if recs := auditRecords(t, f.dir, "worktree_fetched"); len(recs) != 1 || recs[0]["remote_moved"] != true || recs[0]["url"] != atFence.URL {
		t.Errorf("worktree_fetched: %v", recs)
	}
	if first := <-wt.called; first.FetchedCommit != "f1" {
		t.Errorf("re-check asked with %+v", first)
	}
	for moved := false; !moved; {
		select {
		case ev := <-ch:
			if moved = ev.Type == api.EventRemoteMoved; moved && (ev.Generation != 1 || ev.Data.(*api.RemoteMovedData).Now != "f2") {
				t.Errorf("remote_moved %+v", ev)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no remote_moved event")
		}
	}
	// The event is published after the record is stored.
	if rec, err := f.rt.Generation(1); err != nil || rec.PushCheck == nil || rec.PushCheck.FetchedCommit != "f2" || rec.Fence == nil {
		t.Errorf("record after the re-check: %+v %v", rec.PushCheck, err)
	}
}

func TestOnlyAPushCheckThatRanIsCheckedAgain(t *testing.T) {
	f := newFixture(t)
	called := make(chan api.FetchReport, 8)
	wt := settleWorktree{fakeWorktree: &fakeWorktree{j: f.j, path: "/w"}, head: "f2", called: called}
	f.rt.worktrees["/w"] = wt
	spec := &fetchSpec{Settle: time.Millisecond}
	failed, noURL, valid, elsewhere := atFence, atFence, atFence, atFence
	failed.Branch, failed.Error = "failed", "fetch: 403"
	noURL.Branch, noURL.URL = "no-url", ""
	valid.Branch = "valid"
	elsewhere.Branch = "elsewhere"
	reports := []api.FenceReport{
		{Generation: 1},
		{Generation: 2, Worktree: &api.WorktreeReport{Worktree: "/w"}},
		{Generation: 3, Worktree: &api.WorktreeReport{Worktree: "/w", Fetch: &failed}},
		{Generation: 4, Worktree: &api.WorktreeReport{Worktree: "/w", Fetch: &noURL}},
		{Generation: 5, Worktree: &api.WorktreeReport{Worktree: "/other", Fetch: &elsewhere}},
		{Generation: 6, Worktree: &api.WorktreeReport{Worktree: "/w/", Fetch: &valid}},
	}
	// No settle window, or no fetch: nothing is checked again.
	f.rt.settleLater(&announcement{fetch: &fetchSpec{}}, reports)
	f.rt.settleLater(&announcement{}, reports)
	f.rt.settleLater(&announcement{fetch: spec}, reports)
	if first := <-called; first.Branch != "valid" {
		t.Errorf("re-checked %q", first.Branch)
	}
	select {
	case first := <-called:
		t.Errorf("also re-checked %q", first.Branch)
	default:
	}
}
