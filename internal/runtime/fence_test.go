package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

func TestFenceRunsItsStepsInOrderAndNothingTheHarnessControlsComesFirst(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	g1 := f.s.group(1)
	g1.onFreeze = func() {
		// At the freeze: the token is raised in memory (a stale
		// announcement is refused, the broker refuses gen 1), nothing is
		// on disk yet.
		if n, cur, _ := f.rt.Identify(1001); n != 1 || cur {
			t.Errorf("broker still answers gen 1 at its freeze (current=%v)", cur)
		}
		if f.durable() != 1 {
			t.Errorf("state.json written before the freeze: %d", f.durable())
		}
	}
	g1.onKill = func() {
		if f.durable() != 1 {
			t.Errorf("token persisted before the kill")
		}
	}
	res := f.mustStart(2, withWorktree("/w", "next"))
	order := []string{"freeze gen-1", "revoke 1", "abort gen-1", "kill gen-1", "remove gen-1", "restore 1 next", "start 2"}
	last := -1
	for _, step := range order {
		i := f.j.index(step)
		if i <= last {
			t.Fatalf("step %q out of order in %q", step, f.j.all())
		}
		last = i
	}
	if f.durable() != 2 {
		t.Errorf("token not persisted: %d", f.durable())
	}
	if len(res.Fenced) != 1 || res.Fenced[0].Survivors != 0 || res.Fenced[0].SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("report: %+v", res.Fenced)
	}
	for _, k := range []string{"freeze", "cut", "kill", "persist", "restore", "start", "total"} {
		if _, ok := res.Fenced[0].DurationsMS[k]; !ok {
			t.Errorf("fence report lacks %s: %v", k, res.Fenced[0].DurationsMS)
		}
	}
	for _, k := range []string{"fence", "start", "total"} {
		if _, ok := res.DurationsMS[k]; !ok {
			t.Errorf("start result lacks %s: %v", k, res.DurationsMS)
		}
	}
	if res.Baseline != "c0ffeenext" {
		t.Errorf("new generation's baseline %q: want the restore's", res.Baseline)
	}
	if f.stateOf(1) != stFenced || f.stateOf(2) != stRunning {
		t.Errorf("states: %s %s", f.stateOf(1), f.stateOf(2))
	}
}

func TestAnUnconfirmedFreezeStillCutsAndKillsSkipsTheRestoreAndFailsClosed(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	f.s.group(1).freezeErr = api.Errorf(api.CodeFreezeFailed, "not frozen")
	_, err := f.start(2, withWorktree("/w", ""))
	if codeOf(err) != api.CodeFenceFailed {
		t.Fatalf("want FENCE_FAILED, got %v", err)
	}
	if f.j.index("revoke 1") < 0 || f.j.index("kill gen-1") < 0 {
		t.Errorf("cut or kill not tried after a failed freeze: %q", f.j.all())
	}
	if f.j.index("restore") >= 0 || f.j.index("start 2") >= 0 {
		t.Errorf("restore or start ran after a failed freeze: %q", f.j.all())
	}
	if st := f.rt.Status(); st.State != api.StateFailed || st.Error == nil {
		t.Errorf("status: %+v", st)
	}
	// The kill was confirmed: the retry resumes at the restore.
	f.s.group(1).freezeErr = nil
	kills := f.s.group(1).kills
	res, err := f.start(2, withWorktree("/w", ""))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if f.s.group(1).kills != kills || f.s.group(1).freezeCalls != 1 {
		t.Errorf("retry repeated freeze or kill of a dead generation")
	}
	if len(res.Fenced) != 1 || res.Fenced[0].SnapshotRef == "" || f.rt.Status().State != api.StateRunning {
		t.Errorf("retry: %+v %+v", res.Fenced, f.rt.Status())
	}
}

func TestAnUnconfirmedKillFailsAndTheRetryStartsAgainAtTheFreeze(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.s.group(1).killErr = api.Errorf(api.CodeFenceFailed, "1 survivor")
	res, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2})
	if codeOf(err) != api.CodeFenceFailed || len(res.Fenced) != 1 || res.Fenced[0].Survivors != 1 {
		t.Fatalf("fence: %v %+v", err, res)
	}
	if f.stateOf(1) != stFailed {
		t.Fatalf("state %s, want failed", f.stateOf(1))
	}
	if n, cur, _ := f.rt.Identify(1001); n != 1 || cur {
		t.Error("the broker answers a generation whose fence failed")
	}
	f.s.group(1).killErr = nil
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if g := f.s.group(1); g.freezeCalls != 2 || g.kills != 2 || f.stateOf(1) != stFenced {
		t.Errorf("retry: freezes %d kills %d state %s", g.freezeCalls, g.kills, f.stateOf(1))
	}
}

func TestATokenThatCannotBePersistedFailsClosedAfterTheKill(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	// state.json cannot be replaced: the rename onto a non-empty directory fails.
	os.Remove(filepath.Join(f.dir, "state.json"))
	os.MkdirAll(filepath.Join(f.dir, "state.json", "x"), 0o700)
	_, err := f.start(2)
	if codeOf(err) != api.CodeTokenNotPersisted {
		t.Fatalf("want TOKEN_NOT_PERSISTED, got %v", err)
	}
	if f.j.index("kill gen-1") < 0 || f.j.index("start 2") >= 0 {
		t.Errorf("gen 1 must be dead and gen 2 not started: %q", f.j.all())
	}
	// The token holds in memory: an older generation is still stale.
	if _, err := f.start(1); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("generation 1 after 2 was announced: %v", err)
	}
	if f.rt.Status().State != api.StateFailed {
		t.Errorf("status %s, want failed", f.rt.Status().State)
	}
	os.RemoveAll(filepath.Join(f.dir, "state.json"))
	if _, err := f.start(2); err != nil {
		t.Fatalf("retry once the disk is back: %v", err)
	}
	if f.durable() != 2 {
		t.Errorf("durable token %d", f.durable())
	}
}

func TestAFailedRestoreKeepsTheGenerationEmptiedAndTheRetryOnlyRestores(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	f.s.trees["/w"].restoreErr = api.Errorf(api.CodeRestoreFailed, "wedged")
	_, err := f.start(2, withWorktree("/w", ""))
	if codeOf(err) != api.CodeRestoreFailed || f.stateOf(1) != stEmptied {
		t.Fatalf("want RESTORE_FAILED and gen 1 emptied, got %v, %s", err, f.stateOf(1))
	}
	f.s.trees["/w"].restoreErr = nil
	if _, err := f.start(2, withWorktree("/w", "")); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if g := f.s.group(1); g.kills != 1 || len(f.s.trees["/w"].restores) != 2 {
		t.Errorf("kills %d restores %v", g.kills, f.s.trees["/w"].restores)
	}
}

func TestABaselineThatDoesNotResolveNeverKeepsAGenerationAlive(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	_, err := f.start(2, withWorktree("/w", "missing"))
	if err == nil || f.j.index("kill gen-1") < 0 || f.j.index("start 2") >= 0 {
		t.Fatalf("gen 1 must be killed and gen 2 not started: %v %q", err, f.j.all())
	}
	// With nothing to fence it is the same answer: the baseline is looked
	// up among the trusted refs, as after a fence.
	g := newFixture(t)
	if _, err := g.start(1, withWorktree("/w", "missing")); codeOf(err) != api.CodeRestoreFailed {
		t.Errorf("first start with an unknown baseline: %v", err)
	}
}

func TestStaleConflictAndReplay(t *testing.T) {
	f := newFixture(t)
	first := f.mustStart(3)
	again, err := f.start(3)
	if err != nil || again.Pid != first.Pid {
		t.Fatalf("identical retry: %v %+v", err, again)
	}
	if _, err := f.start(3, func(r *api.StartRequest) { r.Command = []string{"other"} }); codeOf(err) != api.CodeGenerationConflict {
		t.Errorf("different spec: %v", err)
	}
	if _, err := f.start(2); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("lower generation: %v", err)
	}
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 1}); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("lower fence: %v", err)
	}
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.start(4); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("below a fence: %v", err)
	}
	if _, err := f.start(5); err != nil {
		t.Errorf("the fenced number itself may start: %v", err)
	}
}

func TestConcurrentAnnouncementsOfOneGenerationHaveOneWinner(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, conflicts := 0, 0
	pids := map[int]bool{}
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cmd := "a"
			if i%2 == 1 {
				cmd = "b"
			}
			res, err := f.start(2, func(r *api.StartRequest) { r.Command = []string{cmd} })
			mu.Lock()
			defer mu.Unlock()
			switch codeOf(err) {
			case "":
				ok++
				pids[res.Pid] = true
			case api.CodeGenerationConflict:
				conflicts++
			default:
				t.Errorf("unexpected: %v", err)
			}
		}(i)
	}
	wg.Wait()
	starts := 0
	for _, l := range f.j.all() {
		if l == "start 2" {
			starts++
		}
	}
	// One announcement started generation 2; its identical retries got its
	// answer, the other spec was refused.
	if starts != 1 || len(pids) != 1 || ok != 4 || conflicts != 4 {
		t.Errorf("starts %d ok %d conflicts %d pids %v", starts, ok, conflicts, pids)
	}
}

func TestShutdownCancelsTheAnnouncementInFlight(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	inRestore := make(chan struct{})
	f.s.trees["/w"].onRestore = func(ctx context.Context) {
		close(inRestore)
		<-ctx.Done() // a git that never ends, until it is killed
	}
	f.s.trees["/w"].restoreErr = api.Errorf(api.CodeRestoreFailed, "killed at its deadline")
	done := make(chan error, 1)
	go func() { _, err := f.start(2, withWorktree("/w", "")); done <- err }()
	<-inRestore
	t0 := time.Now()
	f.rt.Shutdown(50 * time.Millisecond)
	if err := <-done; codeOf(err) != api.CodeRestoreFailed {
		t.Errorf("announcement: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("shutdown took %s with a restore in flight", d)
	}
	if _, err := f.start(3); codeOf(err) != api.CodeShuttingDown {
		t.Errorf("after shutdown: %v", err)
	}
}

func TestAnExitedHarnessLeavesNothingActing(t *testing.T) {
	f := newFixture(t)
	f.rt.cfg.ExitGrace = time.Millisecond
	f.mustStart(1)
	g := f.s.group(1)
	g.proc.exit(3)
	exit, err := f.rt.Wait(context.Background(), 1)
	if err != nil || exit.ExitCode != 3 {
		t.Fatalf("wait: %v %+v", err, exit)
	}
	// Wait returned: credentials revoked, network cut, the rest killed.
	for _, step := range []string{"revoke 1", "abort gen-1", "kill gen-1", "remove gen-1"} {
		if f.j.index(step) < 0 {
			t.Errorf("%s missing after the exit: %q", step, f.j.all())
		}
	}
	if f.stateOf(1) != stQuiesced {
		t.Errorf("state %s", f.stateOf(1))
	}
	// The next announcement only restores what is left: no second kill.
	f.mustStart(2)
	if g.kills != 1 || f.stateOf(1) != stFenced {
		t.Errorf("kills %d state %s", g.kills, f.stateOf(1))
	}
}

func TestLingerKeepsTheRestButCutsAtTheExit(t *testing.T) {
	f := newFixture(t)
	f.rt.cfg.ExitGrace = time.Millisecond
	f.mustStart(1, func(r *api.StartRequest) { r.Linger = true })
	f.s.group(1).proc.exit(0)
	if _, err := f.rt.Wait(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if f.j.index("revoke 1") < 0 || f.j.index("kill gen-1") >= 0 || f.stateOf(1) != stExited {
		t.Errorf("linger: %q state %s", f.j.all(), f.stateOf(1))
	}
	f.mustStart(2)
	if f.j.index("kill gen-1") < 0 {
		t.Error("the lingering rest must be killed by the next announcement")
	}
}

func TestRegistrationIsTrustedOnlyBeforeAnyGeneration(t *testing.T) {
	f := newFixture(t)
	if reg, err := f.rt.Register(context.Background(), api.RegisterRequest{Worktree: "/early"}); err != nil || reg.Late {
		t.Fatalf("setup registration: %+v %v", reg, err)
	}
	f.mustStart(1)
	res := f.mustStart(2, withWorktree("/late", ""))
	if res.Fenced[0].Worktree == nil || res.Fenced[0].Worktree.Worktree != "/late" {
		t.Fatalf("gen 1 may have written /late: it must be restored there: %+v", res.Fenced[0])
	}
	if f.j.index("open /late late=true") < 0 {
		t.Errorf("a worktree first named after a generation ran must register late: %q", f.j.all())
	}
	if _, err := f.rt.Register(context.Background(), api.RegisterRequest{Worktree: "rel"}); codeOf(err) != api.CodeBadRequest {
		t.Errorf("relative worktree: %v", err)
	}
}

func TestACutThatCannotBeConfirmedFailsTheFenceButStillKills(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.s.abortErr = errors.New("sock_diag refused")
	_, err := f.start(2)
	if codeOf(err) != api.CodeCutFailed || f.j.index("kill gen-1") < 0 || f.j.index("start 2") >= 0 {
		t.Fatalf("want CUT_FAILED after a kill, nothing started: %v %q", err, f.j.all())
	}
	f.s.abortErr = nil
	f.s.conns = []api.Connection{{Via: "socket", Remote: "169.254.1.1:443", SendQueue: 10, InFlight: true}}
	if _, err := f.start(2); err != nil {
		t.Fatalf("retry: %v", err)
	}
}

func TestTheCutReportsConnectionsInFlight(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.s.conns = []api.Connection{{Via: "socket", Remote: "169.254.1.1:443", SendQueue: 10}, {Via: "socket", InFlight: true}}
	res := f.mustStart(2)
	c := res.Fenced[0].Cut
	if c == nil || len(c.Connections) != 2 || !c.InFlight || c.SocketsDestroyed != 2 {
		t.Fatalf("cut: %+v", c)
	}
}

func TestAdoptedGenerationsAreFencedAndRestoresPendingAreDone(t *testing.T) {
	f := newFixture(t)
	f.rt.st.Live = map[uint64]liveRecord{4: {Worktree: "/w", Baseline: "b4"}}
	if err := f.rt.adoptLeftovers(); err != nil {
		t.Fatal(err)
	}
	if f.stateOf(4) != stEmptied || f.rt.Status().Generation != 4 {
		t.Fatalf("adopted: %s %+v", f.stateOf(4), f.rt.Status())
	}
	if _, err := f.start(3); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("below an adopted generation: %v", err)
	}
	res := f.mustStart(5)
	if len(res.Fenced) != 1 || f.j.index("restore 4 b4") < 0 || f.j.index("freeze") >= 0 {
		t.Errorf("pending restore: %+v %q", res.Fenced, f.j.all())
	}
}

// The push check of a fenced generation is made on the branch that
// generation was announced with, not on the new announcement's.
func TestThePushCheckChecksTheFencedGenerationsOwnBranch(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "b0"), func(r *api.StartRequest) { r.Fetch = &api.FetchSpec{Branch: "task-42"} })
	f.mustStart(2, withWorktree("/w", "b0"), func(r *api.StartRequest) { r.Fetch = &api.FetchSpec{Branch: "task-43"} })
	if f.j.index("fetch 1 /task-42") < 0 {
		t.Errorf("journal: %q", f.j.all())
	}
	// A fenced generation that named no branch: the announcement's.
	f.mustStart(3, withWorktree("/w", "b0"))
	f.mustStart(4, withWorktree("/w", "b0"), func(r *api.StartRequest) { r.Fetch = &api.FetchSpec{Branch: "task-44"} })
	if f.j.index("fetch 3 /task-44") < 0 {
		t.Errorf("journal: %q", f.j.all())
	}
}

// fetch continue: when the push check finds the remote moved past the
// baseline, the new generation starts from the fetched commit (what the
// abandoned call pushed), and the report says so.
func TestAFetchThatContinuesStartsTheNextGenerationFromWhatWasPushed(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "b0"))
	f.rt.worktrees["/w"] = settleWorktree{fakeWorktree: f.s.trees["/w"], fetch: &atFence}
	res := f.mustStart(2, withWorktree("/w", "b0"), func(r *api.StartRequest) { r.Fetch = &api.FetchSpec{Continue: true} })
	w := res.Fenced[0].Worktree
	if res.Baseline != "c0ffeef1" || w == nil || !w.BaselineFromFetch || f.j.index("move 1 f1") < 0 {
		t.Fatalf("baseline %s, report %+v, journal %q", res.Baseline, w, f.j.all())
	}
	// Without continue, the named baseline.
	f.rt.worktrees["/w"] = settleWorktree{fakeWorktree: f.s.trees["/w"], fetch: &atFence}
	res = f.mustStart(3, withWorktree("/w", "b0"), func(r *api.StartRequest) { r.Fetch = &api.FetchSpec{} })
	if res.Baseline != "c0ffeeb0" || res.Fenced[0].Worktree.BaselineFromFetch {
		t.Errorf("without continue: %s %+v", res.Baseline, res.Fenced[0].Worktree)
	}
}

// An announcement that names a branch puts the worktree on it at the
// baseline, before its harness starts; the push check of the fence that
// ends that generation checks that branch.
func TestAnAnnouncementsBranchIsWhereTheWorktreeIsPut(t *testing.T) {
	f := newFixture(t)
	onBranch := func(b string) func(*api.StartRequest) { return func(r *api.StartRequest) { r.Branch = b } }
	f.mustStart(1, withWorktree("/w", "b0"), onBranch("task-42"))
	f.j.inOrder(t, "open /w", "branch task-42 c0ffeeb0", "start 1")
	f.mustStart(2, withWorktree("/w", "b0"), onBranch("task-43"), func(r *api.StartRequest) { r.Fetch = &api.FetchSpec{} })
	f.j.inOrder(t, "fetch 1 /task-42", "branch task-43 c0ffeeb0", "start 2")
	if _, err := f.start(3, onBranch("task-44")); codeOf(err) != api.CodeBadRequest {
		t.Errorf("a branch without a worktree: %v", err)
	}
	if _, err := f.start(3, withWorktree("/w", "b0"), onBranch("a..b")); codeOf(err) != api.CodeBadRequest {
		t.Errorf("an invalid branch: %v", err)
	}
}
