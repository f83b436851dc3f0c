package runtime

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// Where a new generation's worktree starts from (step 5's baseline) and
// how a worktree is registered by announcements.

func TestAnOmittedBaselineIsThePreviousGenerationsOnTheSameWorktree(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "a"))
	// Generation 1 is fenced by a fence that names no worktree: its own is
	// restored to its own baseline.
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if f.j.index("restore 1 c0ffeea") < 0 {
		t.Fatalf("%q", f.j.all())
	}
	// Nothing is left to fence: the baseline is resolved now, from the last one.
	res := f.mustStart(2, withWorktree("/w", ""))
	if f.j.index("resolve c0ffeea") < 0 || res.Baseline != "c0ffeea" {
		t.Errorf("baseline %q, journal %q", res.Baseline, f.j.all())
	}
	// An announced one wins.
	res = f.mustStart(3, withWorktree("/w", "z"))
	if res.Baseline != "c0ffeez" {
		t.Errorf("announced baseline: %q", res.Baseline)
	}
}

// A fence that names the worktree and a baseline resets the worktree to
// that baseline; the generation announced next without a baseline then
// starts from where the worktree is, not from where the fenced generation
// had started.
func TestAStartAfterAFenceToAnotherBaselineStartsFromIt(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "A"))
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2, Worktree: "/w", Baseline: "B"}); err != nil {
		t.Fatal(err)
	}
	if f.j.index("restore 1 B") < 0 {
		t.Fatalf("the fence did not reset to B: %q", f.j.all())
	}
	res := f.mustStart(2, withWorktree("/w", ""))
	// The fake resolves rev to "c0ffee"+rev; the fence's restore left the
	// worktree at c0ffeeB.
	if res.Baseline != "c0ffeeB" && res.Baseline != "c0ffeec0ffeeB" {
		t.Errorf("generation 2 starts from %q while the fence reset the worktree to c0ffeeB: "+
			"Fence's restore does not update rt.baselines, so baselineFor falls back to generation 1's baseline (A)", res.Baseline)
	}
}

func TestABaselineThatDoesNotResolveAfterAFenceIsARestoreFailure(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/a", "x"))
	// The fence restores /a; /b, named for the first time, does not resolve.
	_, err := f.start(2, withWorktree("/b", "missing"))
	if codeOf(err) != api.CodeRestoreFailed || f.stateOf(1) != stFenced || f.j.index("start 2") >= 0 {
		t.Errorf("want RESTORE_FAILED, gen 1 fenced, nothing started: %v %s %q", err, f.stateOf(1), f.j.all())
	}
	// Why nothing started is a fence decision: it must be in the audit log
	// (a harness that cannot be launched is recorded as start_failed).
	if recs := auditRecords(t, f.dir, "start_failed"); len(recs) != 1 {
		t.Errorf("no start_failed record: startGeneration returns baselineFor's error without an audit record or a failed event")
	}
}

func TestAWorktreeIsRegisteredAgainOnlyWhenItsOptionsChange(t *testing.T) {
	f := newFixture(t)
	if _, err := f.rt.Register(context.Background(), api.RegisterRequest{Worktree: "/w", KeepPaths: []string{"cache"}}); err != nil {
		t.Fatal(err)
	}
	keep := func(paths ...string) func(*api.StartRequest) {
		return func(r *api.StartRequest) { r.KeepPaths = paths }
	}
	f.mustStart(1, withWorktree("/w", ""), keep("cache"))
	if f.s.openCalls != 1 {
		t.Errorf("same options: opened %d times", f.s.openCalls)
	}
	f.mustStart(2, withWorktree("/w/", ""), keep("cache", "node_modules"))
	if f.s.openCalls != 2 {
		t.Errorf("new keep paths: opened %d times", f.s.openCalls)
	}
	f.mustStart(3, withWorktree("/w", ""), keep("cache", "node_modules"), func(r *api.StartRequest) { r.IncludeIgnored = true })
	if f.s.openCalls != 3 {
		t.Errorf("include_ignored: opened %d times", f.s.openCalls)
	}
	if recs := auditRecords(t, f.dir, "worktree_registered"); len(recs) != 1 || recs[0]["late"] != false {
		t.Errorf("registered: %v", recs)
	}
}

func TestAStartWhoseHarnessCannotBeLaunchedFencesAndReportsIt(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.s.startErr = errs.New(api.CodeStartFailed, "exec agent: no such file")
	ch, stop := f.rt.Subscribe()
	defer stop()
	res, err := f.start(2)
	if codeOf(err) != api.CodeStartFailed || res == nil || len(res.Fenced) != 1 || f.stateOf(1) != stFenced {
		t.Fatalf("%v %+v", err, res)
	}
	for ev := range ch {
		if ev.Type == api.EventFailed {
			if ev.Generation != 2 {
				t.Errorf("failed event %+v", ev)
			}
			break
		}
	}
	// The token moved: generation 2 may be announced again, 1 may not.
	f.s.startErr = nil
	if _, err := f.start(1); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("gen 1 after 2: %v", err)
	}
	if _, err := f.start(2); err != nil {
		t.Errorf("retry of 2: %v", err)
	}
}

// openErrStarter is a starter whose worktree registration fails, as
// gitguard refuses a worktree a harness made unsafe (.git pointing
// outside, a config it cannot trust).
type openErrStarter struct {
	*fakeStarter
	err error
}

func (s openErrStarter) openWorktree(ctx context.Context, path string, o worktreeOpts) (worktree, error) {
	s.j.add("open %s refused", path)
	return nil, s.err
}

func TestAWorktreeTheOldGenerationMadeUnsafeFailsTheRestoreNotTheKill(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.rt.launch = openErrStarter{fakeStarter: f.s, err: errs.New(api.CodeWorktreeRefused, ".git is a gitfile pointing outside")}
	_, err := f.start(2, withWorktree("/w", "main"))
	if codeOf(err) != api.CodeRestoreFailed || f.j.index("kill gen-1") < 0 || f.j.index("start 2") >= 0 {
		t.Fatalf("want RESTORE_FAILED after the kill and no start: %v %q", err, f.j.all())
	}
	if f.stateOf(1) != stEmptied || f.rt.Status().State != api.StateFailed {
		t.Errorf("gen 1 %s, status %s", f.stateOf(1), f.rt.Status().State)
	}
	// Nothing registers it outside a fence either.
	if _, err := f.rt.Register(context.Background(), api.RegisterRequest{Worktree: "/v"}); codeOf(err) != api.CodeWorktreeRefused {
		t.Errorf("register: %v", err)
	}
	// Once the worktree can be registered, the retry only restores.
	f.rt.launch = f.s
	if _, err := f.start(2, withWorktree("/w", "main")); err != nil {
		t.Fatal(err)
	}
	if f.s.group(1).kills != 1 || f.stateOf(1) != stFenced {
		t.Errorf("retry: kills %d state %s", f.s.group(1).kills, f.stateOf(1))
	}
}

func TestAStartWhoseWorktreeCannotBeRegisteredStartsNothing(t *testing.T) {
	f := newFixture(t)
	f.rt.launch = openErrStarter{fakeStarter: f.s, err: errs.New(api.CodeWorktreeRefused, "not a git worktree")}
	// What registration finds in the git metadata is read once nothing
	// older runs: a restore's failure, as when it follows a fence.
	if _, err := f.start(1, withWorktree("/w", "")); codeOf(err) != api.CodeRestoreFailed || f.j.index("start 1") >= 0 {
		t.Errorf("%v %q", err, f.j.all())
	}
	w := f.call(allowedPeer, "POST", "/v1/worktrees", `{"worktree": "/w"}`)
	wantError(t, w, 422, api.CodeWorktreeRefused, "not a git worktree")
}

func TestAHarnessNotReapedAfterTheKillFailsTheFence(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	g := f.s.group(1)
	proc := g.proc
	g.proc = nil // the kill empties the cgroup, but the reaper never reports the harness
	f.rt.cfg.KillTimeout = 10 * time.Millisecond
	_, err := f.start(2)
	if codeOf(err) != api.CodeFenceFailed || !strings.Contains(err.Error(), "not reaped") || f.j.index("start 2") >= 0 {
		t.Fatalf("%v %q", err, f.j.all())
	}
	if g.removed || f.stateOf(1) != stFailed {
		t.Errorf("an unconfirmed kill removed the cgroup (%v) or left state %s", g.removed, f.stateOf(1))
	}
	proc.exit(137) // the reaper catches up: the retry confirms the kill
	f.rt.mu.Lock()
	exited := f.rt.gens[1].exited
	f.rt.mu.Unlock()
	<-exited // its exit recorded (written with an fsync), not raced against the 10 ms kill timeout
	if _, err := f.start(2); err != nil || g.kills != 2 || !g.removed {
		t.Errorf("retry: %v kills %d removed %v", err, g.kills, g.removed)
	}
}

func TestAFenceWhoseOutcomeCannotBePersistedFailsClosed(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "a"))
	// The token is durable; then, during the restore, state.json becomes
	// unwritable: the outcome cannot be recorded and nothing starts.
	f.s.trees["/w"].onRestore = func(context.Context) {
		os.Remove(filepath.Join(f.dir, "state.json"))
		os.MkdirAll(filepath.Join(f.dir, "state.json", "x"), 0o700)
	}
	_, err := f.start(2, withWorktree("/w", ""))
	if codeOf(err) != api.CodeTokenNotPersisted || f.j.index("start 2") >= 0 {
		t.Fatalf("%v %q", err, f.j.all())
	}
	if st := f.rt.Status(); st.State != api.StateFailed || st.Error == nil || st.Error.Code != api.CodeTokenNotPersisted {
		t.Errorf("status %+v", st.Error)
	}
}

func TestShutdownDuringAStartsFenceStartsNothing(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "a"))
	ch, stop := f.rt.Subscribe()
	defer stop()
	code := make(chan int, 1)
	f.s.trees["/w"].onRestore = func(context.Context) {
		go func() { code <- f.rt.Shutdown(time.Hour) }()
		for ev := range ch {
			if ev.Type == api.EventShutdown {
				return // shim is shutting down; the restore goes on
			}
		}
	}
	_, err := f.start(2, withWorktree("/w", ""))
	if codeOf(err) != api.CodeShuttingDown || f.j.index("start 2") >= 0 {
		t.Errorf("%v %q", err, f.j.all())
	}
	if c := <-code; c != 137 {
		t.Errorf("shutdown exit code %d: the current harness was killed by the fence", c)
	}
}

func TestStartValidatesWhateverTheCaller(t *testing.T) {
	f := newFixture(t)
	for _, req := range []api.StartRequest{
		{},
		{Generation: 1, Command: []string{"x"}, Fetch: &api.FetchSpec{}},
		{Generation: 1, Command: []string{"x"}, Worktree: "/w", Fetch: &api.FetchSpec{SettleMS: -5}},
	} {
		if _, err := f.rt.Start(context.Background(), req); codeOf(err) != api.CodeBadRequest {
			t.Errorf("%+v: %v", req, err)
		}
	}
	if f.rt.Status().Generation != 0 {
		t.Error("a refused start moved the token")
	}
}

// removeErrGroup is a cgroup that is empty but cannot be removed.
type removeErrGroup struct{ *fakeGroup }

func (g removeErrGroup) Remove() error {
	g.j.add("remove %s refused", g.name)
	return errs.New(api.CodeFenceFailed, "rmdir %s: device or resource busy", g.name)
}

func TestACgroupThatCannotBeRemovedFailsTheFence(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.rt.mu.Lock()
	f.rt.gens[1].group = removeErrGroup{f.s.group(1)}
	f.rt.mu.Unlock()
	_, err := f.start(2)
	if codeOf(err) != api.CodeFenceFailed || f.stateOf(1) != stFailed || f.j.index("start 2") >= 0 {
		t.Errorf("%v %s %q", err, f.stateOf(1), f.j.all())
	}
}

func TestAFetchThatFailsAtTheFenceIsReportedAndTheFenceGoesOn(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "b0"))
	failed := atFence
	failed.Error, failed.FetchedCommit, failed.RemoteMoved = "fetch: 403", "", false
	called := make(chan api.FetchReport, 1)
	f.rt.worktrees["/w"] = settleWorktree{fakeWorktree: f.s.trees["/w"], fetch: &failed, called: called}
	res, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2, Worktree: "/w", Fetch: &api.FetchSpec{SettleMS: 1}})
	if err != nil || res.Fenced[0].Worktree.Fetch.Error != "fetch: 403" || f.stateOf(1) != stFenced {
		t.Fatalf("%v %+v", err, res)
	}
	if recs := auditRecords(t, f.dir, "worktree_fetched"); len(recs) != 1 || recs[0]["error"] != "fetch: 403" {
		t.Errorf("worktree_fetched: %v", recs)
	}
	select {
	case <-called:
		t.Error("a fetch that failed is checked again after the settle window")
	default:
	}
}

func TestDefaults(t *testing.T) {
	c := withDefaults(Config{})
	if c.Log == nil || c.FreezeTimeout != 5*time.Second || c.KillTimeout != 10*time.Second || c.RestoreTimeout != 5*time.Minute ||
		c.GitTimeout != time.Minute || c.ExitGrace != DefaultExitGrace || c.LogMax != DefaultLogMax || c.Reserve != DefaultReserve {
		t.Errorf("defaults: %+v", c)
	}
	c = withDefaults(Config{FreezeTimeout: time.Second, LogMax: -1, Reserve: -1, ExitGrace: time.Millisecond})
	if c.FreezeTimeout != time.Second || c.LogMax != -1 || c.Reserve != -1 || c.ExitGrace != time.Millisecond {
		t.Errorf("explicit values: %+v", c)
	}
}

func TestCloseEndsTheAuditLog(t *testing.T) {
	f := newFixture(t)
	if err := f.rt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.audit.Record("after", 0, nil, true); codeOf(err) != api.CodeAuditFailed {
		t.Errorf("record after Close: %v", err)
	}
}

// --if-current: an announcement is admitted only while the generation it
// names is the highest announced; otherwise nothing is fenced (two
// supervisors that recovered the same step cannot fence each other back
// and forth). An identical retry is still answered as before.
func TestIfCurrentAdmitsOnlyWhileTheNamedGenerationIsCurrent(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	one, two := uint64(1), uint64(2)
	withIf := func(m *uint64) func(*api.StartRequest) { return func(r *api.StartRequest) { r.IfCurrent = m } }
	res := f.mustStart(2, withIf(&one))
	if len(res.Fenced) != 1 {
		t.Fatalf("start 2 if-current 1: %+v", res)
	}
	// The other supervisor, also recovering from generation 1.
	if _, err := f.start(3, withIf(&one)); codeOf(err) != api.CodeNotCurrent || f.stateOf(2) != stRunning {
		t.Fatalf("start 3 if-current 1: %v, gen 2 %s", err, f.stateOf(2))
	}
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 3, IfCurrent: &one}); codeOf(err) != api.CodeNotCurrent {
		t.Fatalf("fence 3 if-current 1: %v", err)
	}
	if again, err := f.start(2, withIf(&one)); err != nil || again.Pid != res.Pid {
		t.Fatalf("an identical retry of 2: %v %+v", err, again)
	}
	if _, err := f.start(3, withIf(&two)); err != nil || f.stateOf(2) != stFenced {
		t.Fatalf("start 3 if-current 2: %v", err)
	}
}

// End fences the generation itself and starts nothing; it never starts
// again, the next one does.
func TestEndFencesTheGenerationItselfAndStartsNothing(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "b0"))
	res, err := f.rt.End(context.Background(), 1, api.EndRequest{})
	if err != nil || len(res.Fenced) != 1 || res.Fenced[0].Generation != 1 || f.stateOf(1) != stFenced {
		t.Fatalf("end 1: %v %+v", err, res)
	}
	if f.j.index("restore 1") < 0 || f.j.index("start 2") >= 0 {
		t.Errorf("journal: %q", f.j.all())
	}
	if _, err := f.start(1); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("start 1 after its end: %v", err)
	}
	if st := f.rt.Status(); st.Generation != 1 || st.Current != nil {
		t.Errorf("status after the end: %+v", st)
	}
	if res := f.mustStart(2); len(res.Fenced) != 0 {
		t.Errorf("start 2 fenced %+v", res.Fenced)
	}
	two := uint64(2)
	if _, err := f.rt.End(context.Background(), 3, api.EndRequest{IfCurrent: &two}); codeOf(err) != api.CodeNotAnnounced || f.stateOf(2) != stRunning {
		t.Errorf("end 3, never announced: %v", err)
	}
	if _, err := f.rt.End(context.Background(), 3, api.EndRequest{IfCurrent: &two, Force: true}); err != nil || f.stateOf(2) != stFenced {
		t.Errorf("end 3 if-current 2, forced: %v", err)
	}
}
