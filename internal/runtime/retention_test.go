package runtime

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/testutil"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitguard"
)

// Retention, maintenance and the token's floor over a long-lived sandbox.

func TestMaintenanceFollowsTheRestoreAndPrunesOnlyWhatThePolicyAllows(t *testing.T) {
	f := newFixture(t)
	f.rt.cfg.KeepSnapshots = 2
	var last *api.StartResult
	for n := uint64(1); n <= 5; n++ {
		last = f.mustStart(n, withWorktree("/w", "a"))
	}
	// Each fence: restore, then maintenance, then the next harness.
	r, s := f.j.index("restore 4"), f.j.index("start 5")
	if m := f.j.indexAfter(r, "maintain /w"); r < 0 || m < r || s < m {
		t.Fatalf("want restore 4, maintain /w, start 5 in order: %q", f.j.all())
	}
	rep := last.Fenced[0]
	if rep.Worktree == nil || rep.Worktree.Maintenance == nil || !slices.Equal(rep.Worktree.Maintenance.SnapshotsPruned, []string{"refs/shim/abandoned/2"}) {
		t.Fatalf("the fence that pruned generation 2's snapshot must say so: %+v", rep.Worktree)
	}
	if _, ok := rep.DurationsMS["maintain"]; !ok {
		t.Errorf("no maintain step timed: %v", rep.DurationsMS)
	}
}

// A layered worktree is maintained between fences: once the announcement
// is answered, beside the new generation, and reported on the next fence.
// Its snapshot refs, though, are pruned inside the fence, before the next
// harness starts: that harness can build on any commit a ref names, and
// the repack beside it must not delete one (the background maintenance
// prunes no ref: keep 0).
func TestLayeredMaintenanceRunsBetweenFencesAndPrunesOnlyWhatThePolicyAllows(t *testing.T) {
	f := newFixture(t)
	f.s.layered = true
	f.rt.cfg.KeepSnapshots = 2
	var last *api.StartResult
	for n := uint64(1); n <= 5; n++ {
		last = f.mustStart(n, withWorktree("/w", "a"))
	}
	waitMaintenance(f.rt)
	// Each fence: snapshot, refs pruned, the next harness, then
	// (answered) maintenance.
	r, s := f.j.index("layer-snapshot 4"), f.j.index("start 5")
	p := f.j.indexAfter(r, "prune-snapshots /w")
	if m := f.j.indexAfter(s, "maintain /w"); r < 0 || p < r || s < p || m < s {
		t.Fatalf("want layer-snapshot 4, prune-snapshots /w, start 5, maintain /w in order: %q", f.j.all())
	}
	// What the fence pruned is in its own report.
	rep := last.Fenced[0]
	if rep.Worktree == nil || rep.Worktree.Maintenance == nil || !slices.Equal(rep.Worktree.Maintenance.SnapshotsPruned, []string{"refs/shim/abandoned/2"}) {
		t.Fatalf("the fence that pruned generation 2's snapshot must say so: %+v", rep.Worktree)
	}
	if _, ok := rep.DurationsMS["prune_snapshots"]; !ok {
		t.Errorf("no prune_snapshots step timed: %v", rep.DurationsMS)
	}
	if _, ok := rep.DurationsMS["maintain"]; ok {
		t.Errorf("a maintain step inside the fence: %v", rep.DurationsMS)
	}
	// What the background maintenance did is reported on the next fence
	// that restores the worktree.
	rep = f.mustStart(6, withWorktree("/w", "a")).Fenced[0]
	if rep.Worktree == nil || rep.Worktree.Maintenance == nil {
		t.Fatalf("the fence after a maintenance must report it: %+v", rep.Worktree)
	}
	if _, ok := rep.Worktree.Maintenance.DurationsMS["background"]; !ok {
		t.Errorf("no maintenance timed: %v", rep.Worktree.Maintenance.DurationsMS)
	}
}

// A fence never waits for a repack: the maintenance the last answer
// started (here a repack that would never end) is ended by the next
// fence, after its freeze and before its restore (the layer's
// snapshot), and reported
// interrupted. The control: the same maintenance, let finish before the
// next fence, ran to its end and is not.
func TestAFenceEndsTheMaintenanceInFlightInsteadOfWaiting(t *testing.T) {
	f := newFixture(t)
	f.s.layered = true
	w := &fakeWorktree{j: f.j, path: "/w", maintainBlock: make(chan struct{})}
	f.s.trees["/w"] = w
	f.mustStart(1, withWorktree("/w", "a"))
	f.mustStart(2, withWorktree("/w", "a")) // answered; its maintenance does not end
	res := f.mustStart(3, withWorktree("/w", "a"))
	i, r := f.j.index("maintain /w interrupted"), f.j.index("layer-snapshot 2")
	if i < 0 || r < i || f.j.index("maintain /w done") >= 0 {
		t.Fatalf("want the maintenance interrupted before layer-snapshot 2: %q", f.j.all())
	}
	if m := res.Fenced[0].Worktree.Maintenance; m == nil || !m.Interrupted {
		t.Errorf("the interrupted maintenance is not reported: %+v", m)
	}
	// The control.
	close(w.maintainBlock)
	waitMaintenance(f.rt)
	if f.j.index("maintain /w done") < 0 {
		t.Fatalf("the control's maintenance did not run to its end: %q", f.j.all())
	}
	res = f.mustStart(4, withWorktree("/w", "a"))
	if m := res.Fenced[0].Worktree.Maintenance; m == nil || m.Interrupted {
		t.Errorf("a maintenance that ended by itself is reported interrupted: %+v", m)
	}
}

// indexAfter is the index of the first entry from i on that is exactly
// want, -1 when none is (or i is).
func (j *journal) indexAfter(i int, want string) int {
	all := j.all()
	for ; i >= 0 && i < len(all); i++ {
		if all[i] == want {
			return i
		}
	}
	return -1
}

// waitMaintenance waits for the maintenance in flight to end by itself.
func waitMaintenance(rt *Runtime) {
	rt.maint.mu.Lock()
	done := rt.maint.done
	rt.maint.mu.Unlock()
	if done != nil {
		<-done
	}
}

func TestASnapshotWhoseFenceIsPendingIsNeverPruned(t *testing.T) {
	f := newFixture(t)
	f.rt.cfg.KeepSnapshots = 1
	w := &fakeWorktree{j: f.j, path: "/w", snapshots: []uint64{1, 2, 3}}
	f.s.trees["/w"] = w
	f.rt.worktrees["/w"] = w
	f.rt.mu.Lock()
	f.rt.adopted(2, stEmptied) // its restore is pending
	f.rt.mu.Unlock()
	rep, err := w.Maintain(context.Background(), 1, f.rt.knownGeneration)
	if err != nil || !slices.Equal(w.snapshots, []uint64{2, 3}) || len(rep.SnapshotsPruned) != 1 {
		t.Errorf("kept %v (%+v %v): generation 2 is pending and must stay", w.snapshots, rep, err)
	}
}

func TestAFailedFenceMaintainsNothing(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "a"))
	f.s.trees["/w"].restoreErr = api.Errorf(api.CodeRestoreFailed, "injected")
	if _, err := f.start(2, withWorktree("/w", "a")); err == nil {
		t.Fatal("the fence should fail")
	}
	waitMaintenance(f.rt)
	if f.j.index("maintain") >= 0 {
		t.Errorf("maintenance after a failed fence: %q", f.j.all())
	}
}

func TestAStartThatFencesNothingTidiesTheWorktree(t *testing.T) {
	f := newFixture(t)
	f.s.trees["/w"] = &fakeWorktree{j: f.j, path: "/w", leftovers: []string{"index.lock", "gc.log.lock"}}
	res := f.mustStart(1, withWorktree("/w", "a"))
	if !slices.Equal(res.WorktreeCleaned, []string{"index.lock", "gc.log.lock"}) || f.j.index("tidy /w") > f.j.index("start 1") {
		t.Errorf("cleaned %v, journal %q", res.WorktreeCleaned, f.j.all())
	}
	// A tidy that fails fails the start: the worktree would not be usable.
	f.s.trees["/w"].tidyErr = api.Errorf(api.CodeRestoreFailed, "cannot remove index.lock")
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.start(3, withWorktree("/w", "a")); codeOf(err) != api.CodeRestoreFailed || f.j.index("start 3") >= 0 {
		t.Errorf("start with a worktree that cannot be tidied: %v %q", err, f.j.all())
	}
}

func TestRecordsAreKeptByCountAndBytesButNeverAKnownOrTheNewest(t *testing.T) {
	f := newFixture(t)
	for n := 1; n <= 6; n++ {
		d := filepath.Join(f.dir, "gen", strconv.Itoa(n))
		os.MkdirAll(d, 0o700)
		os.WriteFile(filepath.Join(d, "stdout"), make([]byte, 64<<10), 0o600)
	}
	f.rt.cfg.KeepGenerations = 3
	f.rt.mu.Lock()
	f.rt.adopted(1, stEmptied) // still known: its fence is pending
	f.rt.mu.Unlock()
	if got := f.rt.pruneRecords(false); !slices.Equal(got, []uint64{2, 3, 4}) {
		t.Errorf("pruned %v, want 2 3 4 (1 is pending)", got)
	}
	// Bytes: one record's worth is allowed; the newest always stays.
	f.rt.cfg.KeepGenerations, f.rt.cfg.KeepBytes = 0, 70<<10
	if got := f.rt.pruneRecords(false); !slices.Equal(got, []uint64{5}) {
		t.Errorf("pruned %v by bytes, want 5", got)
	}
	ret := f.rt.Status().Retention
	if ret == nil || ret.Records != 2 || ret.OldestRecord != 1 || ret.NewestRecord != 6 || ret.RecordsBytes < 128<<10 {
		t.Errorf("status retention %+v", ret)
	}
}

func TestTheAuditLogRotatesAndTheCurrentFileKeepsTheToken(t *testing.T) {
	dir := t.TempDir()
	a, err := openAudit(filepath.Join(dir, "audit.jsonl"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { a.Close() }()
	a.rotateAt(2<<10, 2, 4)
	a.Record("announced", 9, nil, true)
	for i := 0; i < 200; i++ {
		a.Record("credential_refused", 9, map[string]any{"i": i}, false)
	}
	files := auditFiles(dir)
	if len(files) != 3 {
		t.Fatalf("want audit.jsonl and 2 rotated files, got %v", files)
	}
	for _, p := range files {
		if fi, err := os.Stat(p); err != nil || fi.Size() > 3<<10 {
			t.Errorf("%s: %v %v", p, fi.Size(), err)
		}
	}
	// Every rotated-away record of generation 9's announcement is gone,
	// but the current file still says the token is 9.
	os.Remove(files[1])
	os.Remove(files[2])
	if got := auditFloor(files[0]); got != 9 {
		t.Errorf("floor from the current file %d, want 9", got)
	}
}

// Every form of state.json, with and without history elsewhere.
func TestEveryFormOfStateJSON(t *testing.T) {
	type history func(t *testing.T, dir string)
	genDir := func(t *testing.T, dir string) { os.MkdirAll(filepath.Join(dir, "gen", "5"), 0o700) }
	auditOnly := func(t *testing.T, dir string) {
		os.WriteFile(filepath.Join(dir, "audit.jsonl"), []byte(`{"event":"announced","generation":5,"kind":"fence","time":"x"}`+"\n"), 0o600)
	}
	rotatedOnly := func(t *testing.T, dir string) {
		os.WriteFile(filepath.Join(dir, "audit.jsonl"), []byte(`{"event":"audit_rotated","highest":5,"time":"x"}`+"\n"), 0o600)
	}
	for _, c := range []struct {
		name    string
		state   string // "" none; "DIR" a directory
		tmp     string // state.json.tmp
		history history
		floor   uint64 // the token shim starts from; 0 with fail
		fail    bool
	}{
		{name: "missing, no history", floor: 0},
		{name: "missing, gen dirs", history: genDir, floor: 5},
		{name: "missing, audit only (records pruned)", history: auditOnly, floor: 5},
		{name: "missing, rotated audit only", history: rotatedOnly, floor: 5},
		{name: "null with history", state: "null", history: genDir, fail: true},
		{name: "{} with history", state: "{}", history: auditOnly, fail: true},
		{name: "fields missing with history", state: `{"live": {}}`, history: genDir, fail: true},
		{name: "zero token with history", state: `{"highest": 0}`, history: genDir, fail: true},
		{name: "older copy", state: `{"highest": 3}`, history: genDir, floor: 5},
		{name: "wrong types", state: `{"highest": "5"}`, fail: true},
		{name: "an array", state: `[5]`, fail: true},
		{name: "a directory", state: "DIR", fail: true},
		{name: "truncated", state: `{"highest": 5, "sta`, fail: true},
		{name: "only a temporary file", tmp: `{"highest": 5, "started": {"generation": 5, "spec_hash": "x"}}`, floor: 5},
		{name: "only a truncated temporary file, gen dirs", tmp: `{"highest": 9`, history: genDir, floor: 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.history != nil {
				c.history(t, dir)
			}
			p := filepath.Join(dir, "state.json")
			switch c.state {
			case "":
			case "DIR":
				os.Mkdir(p, 0o700)
			default:
				os.WriteFile(p, []byte(c.state), 0o600)
			}
			if c.tmp != "" {
				os.WriteFile(p+".tmp", []byte(c.tmp), 0o600)
			}
			st, err := loadState(p)
			if err == nil {
				st, err = withHistoryFloor(dir, st)
			}
			if c.fail {
				if err == nil {
					t.Fatalf("started from %d; must fail closed", st.Highest)
				}
				if !strings.Contains(err.Error(), "recovery.md") {
					t.Errorf("the error must say how to recover: %v", err)
				}
				return
			}
			if err != nil || st.Highest != c.floor {
				t.Fatalf("token %d %v, want %d", st.Highest, err, c.floor)
			}
			if c.tmp != "" && st.Started != nil {
				t.Errorf("the temporary file was taken for the state: %+v", st.Started)
			}
		})
	}
}

// The snapshot refs of a registered worktree count for the floor when
// state.json is lost, and not while it is sound (the git dir is the
// harness's to write: a forged ref must not raise a sound token).
func TestSnapshotRefsCountOnlyWhenTheStateIsLost(t *testing.T) {
	testutil.NeedTool(t, "git") // a failure, not a skip, under SHIM_REQUIRE_INTEGRATION
	dir := t.TempDir()
	wt := filepath.Join(t.TempDir(), "wt")
	os.MkdirAll(wt, 0o755)
	if out, err := exec.Command("git", "-C", wt, "init", "-q").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	g, err := gitguard.New(gitguard.Config{Worktree: wt, StateDir: filepath.Join(dir, "worktrees", pathKey(wt))})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	refs := filepath.Join(wt, ".git", "refs", "shim", "abandoned")
	os.MkdirAll(refs, 0o755)
	os.WriteFile(filepath.Join(refs, "7"), []byte(strings.Repeat("a", 40)+"\n"), 0o644)
	os.WriteFile(filepath.Join(wt, ".git", "packed-refs"), []byte("# pack-refs\n"+strings.Repeat("b", 40)+" refs/shim/abandoned/8\n"), 0o644)
	// Lost: the floor is the refs'.
	st, err := withHistoryFloor(dir, persisted{})
	if err != nil || st.Highest != 8 {
		t.Errorf("lost state: %d %v, want 8", st.Highest, err)
	}
	// Emptied with refs only: corrupt.
	os.WriteFile(filepath.Join(dir, "state.json"), []byte("{}"), 0o600)
	if _, err := withHistoryFloor(dir, persisted{}); err == nil || !strings.Contains(err.Error(), "refs/shim/abandoned/8") {
		t.Errorf("{} with snapshot refs: %v", err)
	}
	// Sound: the refs do not raise it.
	os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"highest": 3}`), 0o600)
	if st, err := withHistoryFloor(dir, persisted{Highest: 3}); err != nil || st.Highest != 3 {
		t.Errorf("sound state raised by a ref: %d %v", st.Highest, err)
	}
}
