package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/reaper"
)

// What shim tells about generations: live ones from memory, fenced ones
// and those of an earlier shim from their records in the runtime dir.

// writeRecords puts generation n's records in the runtime dir, as a shim
// (this one or an earlier one) left them.
func writeRecords(t *testing.T, f *fixture, n uint64, rec *api.Generation, exit *api.Exit) {
	t.Helper()
	dir := f.rt.genDir(n)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if rec != nil {
		if err := writeJSON(filepath.Join(dir, "generation.json"), rec); err != nil {
			t.Fatal(err)
		}
	}
	if exit != nil {
		if err := writeJSON(filepath.Join(dir, "exit.json"), exit); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAFencedGenerationIsReadFromItsRecords(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "a"))
	f.mustStart(2, withWorktree("/w", "b"))
	rec, err := f.rt.Generation(1)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != api.GenFenced || rec.Cgroup != "/fake/gen-1" || rec.Worktree != "/w" || rec.Fence == nil || rec.Fence.SnapshotRef != "refs/shim/abandoned/1" {
		t.Errorf("record: %+v", rec)
	}
	if rec.Exit == nil || !rec.Exit.Fenced || rec.Exit.ExitCode != 137 {
		t.Errorf("exit: %+v", rec.Exit)
	}
	exit, err := f.rt.Wait(context.Background(), 1)
	if err != nil || !exit.Fenced || exit.Generation != 1 {
		t.Errorf("wait for a fenced generation: %+v %v", exit, err)
	}
}

func TestRecordsOfAnEarlierShim(t *testing.T) {
	f := newFixture(t)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	writeRecords(t, f, 3, &api.Generation{Generation: 3, State: api.StateRunning, Command: []string{"agent"}},
		&api.Exit{Generation: 3, ExitCode: 0, ExitedAt: at})
	writeRecords(t, f, 4, &api.Generation{Generation: 4, State: api.StateRunning}, &api.Exit{Generation: 4, ExitCode: 137, Fenced: true})
	writeRecords(t, f, 5, &api.Generation{Generation: 5, State: api.StateRunning}, nil)
	writeRecords(t, f, 6, &api.Generation{Generation: 6, Fence: &api.FenceReport{Generation: 6}}, &api.Exit{Generation: 6, ExitCode: 1})
	for n, want := range map[uint64]string{
		3: api.StateExited, // exited on its own, never fenced
		4: api.GenFenced,   // ended by a fence
		5: api.GenFenced,   // no exit record: whatever it said, it is not running here
		6: api.GenFenced,   // exited on its own, then fenced (its worktree restored)
	} {
		rec, err := f.rt.Generation(n)
		if err != nil || rec.State != want {
			t.Errorf("generation %d: state %q %v, want %q", n, rec.State, err, want)
		}
	}
	if rec, _ := f.rt.Generation(3); rec.Exit == nil || !rec.Exit.ExitedAt.Equal(at) || rec.Command[0] != "agent" {
		t.Errorf("record of 3: %+v", rec)
	}
	if exit, err := f.rt.Wait(context.Background(), 3); err != nil || !exit.ExitedAt.Equal(at) {
		t.Errorf("wait for 3: %+v %v", exit, err)
	}
	if _, err := f.rt.Wait(context.Background(), 5); codeOf(err) != api.CodeNotFound {
		t.Errorf("wait without an exit record: %v", err)
	}
	// A record that cannot be read is no record.
	os.WriteFile(filepath.Join(f.rt.genDir(3), "generation.json"), []byte("{"), 0o644)
	os.WriteFile(filepath.Join(f.rt.genDir(4), "exit.json"), []byte("{"), 0o644)
	if _, err := f.rt.Generation(3); codeOf(err) != api.CodeNotFound {
		t.Errorf("corrupt generation.json: %v", err)
	}
	if _, err := f.rt.Wait(context.Background(), 4); codeOf(err) != api.CodeNotFound {
		t.Errorf("corrupt exit.json: %v", err)
	}
	if rec, err := f.rt.Generation(4); err != nil || rec.Exit != nil || rec.State != api.GenFenced {
		t.Errorf("corrupt exit.json, record: %+v %v", rec, err)
	}
}

func TestARecordThatCannotBeWrittenDoesNotFailTheFence(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	os.RemoveAll(f.rt.genDir(1)) // exit.json and generation.json cannot be written
	if _, err := f.start(2); err != nil {
		t.Fatalf("fence: %v", err)
	}
	if _, err := f.rt.Generation(1); codeOf(err) != api.CodeNotFound {
		t.Errorf("record: %v", err)
	}
}

func TestStatusInEveryState(t *testing.T) {
	f := newFixture(t)
	f.rt.cfg.Version = "v-test"
	f.rt.cfg.Reaper = reaper.New()
	st := f.rt.Status()
	if st.State != api.StateIdle || st.Orphans != 0 || st.Current != nil || st.Pid != 0 || st.ShimPid != os.Getpid() || st.Subreaper != (os.Getpid() != 1) ||
		st.RuntimeDir != f.dir || st.Version != "v-test" || st.CgroupRoot != "/fake" || st.ModeReason != "fake" {
		t.Errorf("idle: %+v", st)
	}
	f.rt.Register(context.Background(), api.RegisterRequest{Worktree: "/a"})
	f.mustStart(1, withWorktree("/b", ""))
	if _, err := f.rt.Register(context.Background(), api.RegisterRequest{Worktree: "/c"}); api.CodeOf(err) != api.CodeGenerationLive {
		t.Errorf("register while a generation is live: %v", err)
	}
	var during api.Status
	f.s.group(1).onFreeze = func() { during = f.rt.Status() }
	f.s.group(1).killErr = errs.New(api.CodeFenceFailed, "survivor")
	f.start(2)
	if during.State != api.StateFencing || len(during.Live) != 1 || during.Live[0].State != api.StateFencing {
		t.Errorf("during the fence: %+v", during)
	}
	st = f.rt.Status()
	if st.State != api.StateFailed || st.Error == nil || st.Error.Code != api.CodeFenceFailed || st.Generation != 2 {
		t.Errorf("failed: %+v", st)
	}
	if len(st.Live) != 1 || st.Live[0].State != api.StateFailed || st.Current == nil || st.Pid != 0 {
		t.Errorf("failed, live: %+v current %+v pid %d", st.Live, st.Current, st.Pid)
	}
	if len(st.Worktrees) != 2 || st.Worktrees[0].Worktree != "/a" || st.Worktrees[1].Worktree != "/b" {
		t.Errorf("worktrees, sorted: %+v", st.Worktrees)
	}
	f.s.group(1).killErr = nil
	f.mustStart(2, func(r *api.StartRequest) { r.Linger = true })
	if st := f.rt.Status(); st.State != api.StateRunning || st.Error != nil || st.Pid != 1002 || len(st.Live) != 1 {
		t.Errorf("running after the retry: %+v", st)
	}
	f.s.group(2).proc.exit(0)
	f.rt.Wait(context.Background(), 2)
	if st := f.rt.Status(); st.State != api.StateExited || st.Pid != 0 || st.Current.State != api.StateExited {
		t.Errorf("exited: %+v", st)
	}
}

func TestARestartedShimAdoptsWhatThePreviousOneLeft(t *testing.T) {
	f := newFixture(t)
	left := &fakeGroup{name: "gen-3", j: f.j}
	git := &fakeGroup{name: "git-7", j: f.j}
	probe := &fakeGroup{name: "tmp-probe-1", j: f.j, killErr: errs.New(api.CodeFenceFailed, "busy")}
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s},
		list: []string{"shim", "gen-3", "gen-x", "git-7", "tmp-probe-1", "unrelated"},
		open: map[string]cgroup.Group{"gen-3": left, "git-7": git, "tmp-probe-1": probe}}
	f.rt.st.Live = map[uint64]liveRecord{3: {Worktree: "/w", Baseline: "b3", Pid: 300}, 2: {Worktree: "/w", Baseline: "b2"}, 1: {}}
	if err := f.rt.adoptLeftovers(); err != nil {
		t.Fatal(err)
	}
	// Shim's own throwaway cgroups are emptied and removed where they can be.
	if !git.removed || git.kills != 1 || probe.removed {
		t.Errorf("throwaway cgroups: git removed %v, probe removed %v", git.removed, probe.removed)
	}
	// gen-3 runs on: adopted; gen 2 was killed but never restored; gen 1 had no worktree.
	if f.stateOf(3) != stAdopted || f.stateOf(2) != stEmptied || f.stateOf(1) != stFenced {
		t.Fatalf("states: %s %s %s", f.stateOf(3), f.stateOf(2), f.stateOf(1))
	}
	st := f.rt.Status()
	if st.Generation != 3 || len(st.Live) != 2 || st.Live[1].State != api.GenAdopted || st.Live[1].Cgroup != "/fake/gen-3" || st.Live[1].Pid != 300 {
		t.Errorf("status: %+v", st)
	}
	// Waiting for it returns once its cgroup is empty, without a status.
	if exit, err := f.rt.Wait(context.Background(), 3); err != nil || !exit.Unknown || exit.ExitCode != -1 || exit.Generation != 3 {
		t.Errorf("wait for an adopted generation: %v %+v", err, exit)
	}
	if recs := auditRecords(t, f.dir, "generation_adopted"); len(recs) != 2 {
		t.Errorf("adoption records: %v", recs)
	}
	res := f.mustStart(4, withWorktree("/w", ""))
	if left.kills != 1 || !left.removed || f.stateOf(3) != stFenced || f.stateOf(2) != stFenced || len(res.Fenced) != 2 {
		t.Errorf("the next announcement: %+v %q", res.Fenced, f.j.all())
	}
	// Each restores the worktree to its own baseline, oldest first.
	if i, j := f.j.index("restore 2 "), f.j.index("restore 3 "); i < 0 || j < i {
		t.Errorf("restores: %q", f.j.all())
	}
}

func TestAdoptionFailsWhenTheLeftoversCannotBeRead(t *testing.T) {
	f := newFixture(t)
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, listErr: errors.New("EACCES")}
	if err := f.rt.adoptLeftovers(); err == nil || !strings.Contains(err.Error(), "list generation cgroups") {
		t.Errorf("list: %v", err)
	}
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, list: []string{"gen-5"}}
	if err := f.rt.adoptLeftovers(); err == nil {
		t.Error("a generation cgroup that cannot be opened is forgotten")
	}
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, list: []string{"gen-6"}, open: map[string]cgroup.Group{"gen-6": &fakeGroup{name: "gen-6", j: f.j}}}
	f.rt.audit.f.Close()
	if err := f.rt.adoptLeftovers(); codeOf(err) != api.CodeAuditFailed {
		t.Errorf("an adoption that cannot be recorded: %v", err)
	}
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}}
	f.rt.st.Live = map[uint64]liveRecord{7: {Worktree: "/w"}}
	if err := f.rt.adoptLeftovers(); codeOf(err) != api.CodeAuditFailed {
		t.Errorf("a pending restore that cannot be recorded: %v", err)
	}
}

func TestARuntimeDirWithHistoryRegistersWorktreesLate(t *testing.T) {
	f := newFixture(t)
	writeRecords(t, f, 1, &api.Generation{Generation: 1}, nil)
	rt := newRuntime(f.rt.cfg, persisted{}, f.rt.audit, fakeGroups{f.s}, f.s)
	if reg, err := rt.Register(context.Background(), api.RegisterRequest{Worktree: "/w"}); err != nil || !reg.Late {
		t.Errorf("a generation may have run here before: %+v %v", reg, err)
	}
	// And an announcement that fences nothing registers late too.
	if _, err := rt.Start(context.Background(), api.StartRequest{Generation: 5, Command: []string{"x"}, Worktree: "/v"}); err != nil {
		t.Fatal(err)
	}
	if f.j.index("open /v late=true") < 0 {
		t.Errorf("%q", f.j.all())
	}
}

func TestAFirstAnnouncementInAFreshSandboxRegistersTrusted(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", ""))
	if f.j.index("open /w late=false") < 0 || f.j.index("resolve HEAD") < 0 {
		t.Errorf("%q", f.j.all())
	}
}

func TestARefusedTransitionIsAnInternalError(t *testing.T) {
	g := &generation{state: stFenced}
	err := g.transition(stRunning)
	if codeOf(err) != api.CodeInternal || !strings.Contains(err.Error(), "fenced -> running") {
		t.Errorf("%v", err)
	}
	if e := asAPIError(err); e.Code != api.CodeInternal || !strings.Contains(e.Message, "not a valid transition") {
		t.Errorf("as the API reports it: %+v", e)
	}
}
