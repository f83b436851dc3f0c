package runtime

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
)

// scriptedWorktree is a fakeWorktree whose layer paths answer what the
// test says: the lower's metadata check, the layer's snapshot, the
// snapshot ref's check.
type scriptedWorktree struct {
	*fakeWorktree
	verifyErr     error
	verifyChanged []string
	snapErr       error
	snapNoBase    bool // the snapshot failed before it knew the baseline
	snapIs        func(gen uint64, commit string) bool
	scanPaths     []api.PathChange
}

func newScripted(j *journal, path string) *scriptedWorktree {
	return &scriptedWorktree{fakeWorktree: &fakeWorktree{j: j, path: path}}
}

func (w *scriptedWorktree) VerifyLower(context.Context) ([]string, error) {
	w.j.add("verify-lower %s", w.path)
	return w.verifyChanged, w.verifyErr
}

func (w *scriptedWorktree) SnapshotLayer(ctx context.Context, gen uint64, baseline, upper string) (*api.WorktreeReport, error) {
	rep, _ := w.fakeWorktree.SnapshotLayer(ctx, gen, baseline, upper)
	rep.Paths = []api.PathChange{{Path: "layer.txt", Change: "added"}}
	rep.Added = 1
	if w.snapNoBase {
		return nil, w.snapErr
	}
	return rep, w.snapErr
}

func (w *scriptedWorktree) Restore(ctx context.Context, gen uint64, rev string, f *fetchSpec) (*api.WorktreeReport, error) {
	rep, err := w.fakeWorktree.Restore(ctx, gen, rev, f)
	if rep != nil {
		rep.Paths, rep.Modified = w.scanPaths, len(w.scanPaths)
		rep.SnapshotCommit = "5ca9"
	}
	return rep, err
}

func (w *scriptedWorktree) SnapshotIs(_ context.Context, gen uint64, commit string) bool {
	w.j.add("snapshot-is %d %s", gen, commit)
	return w.snapIs == nil || w.snapIs(gen, commit)
}

// layeredRun is a fence run of generation 3 (baseline c0ffeeb0) whose
// mount namespace is held by an open file, for restoreLayer.
func layeredRun(t *testing.T) (*fenceRun, *os.File) {
	t.Helper()
	ns, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	g := &generation{n: 3, baseline: "c0ffeeb0", mounts: &heldMounts{f: ns}}
	return &fenceRun{g: g, a: &announcement{}}, ns
}

// released reports whether the held namespace was let go (closed).
func released(ns *os.File) bool {
	_, err := ns.Stat()
	return errors.Is(err, os.ErrClosed)
}

// The restore of a layered worktree, rule by rule: the lower is checked
// before the layer is read, and a lower that cannot be confirmed fails
// the restore (the generation is dead already; its layer is not
// touched); the layer becomes the snapshot; the lower moves only for a
// new baseline, a push check or a lost lock, and then every overlay of it
// is let go first.
func TestRestoreLayerFailsClosedAndMovesTheLowerOnlyWhenItMust(t *testing.T) {
	type want struct {
		code      string   // the error's; "" none
		journal   []string // in this order
		never     []string // prefixes that must not appear
		released  bool     // the generation's mount namespace let go
		lockedRep *bool    // rep.Lower.Locked
	}
	yes, no := true, false
	for _, tc := range []struct {
		name  string
		setup func(*fakeLayers, *scriptedWorktree)
		rev   string
		fetch *fetchSpec
		want  want
	}{
		{name: "locked lower, same baseline: the layer is the snapshot, nothing moves",
			rev:  "b0",
			want: want{journal: []string{"check-lower /w", "verify-lower /w", "layer-snapshot 3 c0ffeeb0"}, never: []string{"move", "restore", "lock-lower"}, lockedRep: &yes}},
		{name: "HEAD is the baseline: nothing to resolve",
			rev:  "HEAD",
			want: want{journal: []string{"layer-snapshot 3"}, never: []string{"resolve", "move"}}},
		{name: "a new baseline moves the lower after the snapshot",
			rev:  "b1",
			want: want{journal: []string{"check-lower /w", "layer-snapshot 3", "resolve b1", "move 3 c0ffeeb1"}, never: []string{"restore"}, released: true}},
		{name: "a push check moves the lower with the fetch",
			rev: "b0", fetch: &fetchSpec{Remote: "origin", Branch: "main"},
			want: want{journal: []string{"layer-snapshot 3", "move 3 c0ffeeb0", "fetch 3 origin/main"}, released: true}},
		{name: "a baseline that does not resolve fails after the snapshot, nothing moves",
			rev:  "missing",
			want: want{code: api.CodeNotFound, journal: []string{"layer-snapshot 3", "resolve missing"}, never: []string{"move", "restore"}}},
		{name: "a lock found gone is made again and the scan restores the lower",
			rev:   "b0",
			setup: func(l *fakeLayers, _ *scriptedWorktree) { l.checkErr = errors.New("remounted rw") },
			want:  want{journal: []string{"check-lower /w", "lock-lower /w", "verify-lower /w", "layer-snapshot 3", "restore 3 c0ffeeb0"}, never: []string{"move"}, released: true, lockedRep: &no}},
		{name: "a lock that cannot be made again fails the restore before the layer is read",
			rev: "b0",
			setup: func(l *fakeLayers, _ *scriptedWorktree) {
				l.checkErr, l.lockErr = errors.New("remounted rw"), errors.New("EBUSY")
			},
			want: want{code: api.CodeRestoreFailed, journal: []string{"check-lower /w", "lock-lower /w"}, never: []string{"verify-lower", "layer-snapshot", "restore", "move", "remove-layers"}}},
		{name: "metadata that cannot be checked fails the restore before the layer is read",
			rev:   "b0",
			setup: func(_ *fakeLayers, w *scriptedWorktree) { w.verifyErr = errors.New("git timed out") },
			want:  want{code: api.CodeRestoreFailed, journal: []string{"check-lower /w", "verify-lower /w"}, never: []string{"layer-snapshot", "restore", "move", "remove-layers"}}},
		{name: "a snapshot the harness made impossible pins the layer and the fence goes on",
			rev:   "b0",
			setup: func(_ *fakeLayers, w *scriptedWorktree) { w.snapErr = errors.New("no space left on device") },
			want:  want{journal: []string{"layer-snapshot 3", "pin 3"}, never: []string{"move", "restore", "remove-layers"}}},
		{name: "an unsavable layer that cannot be pinned fails the restore",
			rev: "b0",
			setup: func(l *fakeLayers, w *scriptedWorktree) {
				w.snapErr, l.pinErr = errors.New("no space left on device"), errors.New("read-only file system")
			},
			want: want{code: api.CodeRestoreFailed, journal: []string{"layer-snapshot 3", "pin 3"}, never: []string{"move", "remove-layers"}}},
		{name: "a snapshot that failed before it knew its baseline fails the restore unpinned",
			rev: "b0",
			setup: func(_ *fakeLayers, w *scriptedWorktree) {
				w.snapErr, w.snapNoBase = api.Errorf(api.CodeRestoreFailed, "the layer cannot be read"), true
			},
			want: want{code: api.CodeRestoreFailed, journal: []string{"layer-snapshot 3"}, never: []string{"pin", "move"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ly := f.withLayers()
			wt := newScripted(f.j, "/w")
			if tc.setup != nil {
				tc.setup(ly, wt)
			}
			run, held := layeredRun(t)
			rep, err := f.rt.restoreLayer(context.Background(), run, wt, tc.rev, tc.fetch, "/layers/3/upper")
			if got := codeOf(err); got != tc.want.code {
				t.Fatalf("error %v (code %q), want code %q; journal %q", err, got, tc.want.code, f.j.all())
			}
			f.j.inOrder(t, tc.want.journal...)
			for _, p := range tc.want.never {
				if i := f.j.index(p); i >= 0 {
					t.Errorf("%q must not happen: %q", p, f.j.all())
				}
			}
			if got := released(held); got != tc.want.released {
				t.Errorf("mount namespace released %v, want %v", got, tc.want.released)
			}
			if tc.want.lockedRep != nil && (rep == nil || rep.Lower == nil || rep.Lower.Locked != *tc.want.lockedRep) {
				t.Errorf("lower report %+v, want locked %v", rep, *tc.want.lockedRep)
			}
		})
	}
}

// A lower found unlocked may hold anyone's writes: the scan's snapshot
// extends the layer's, and the report counts both and names the error.
func TestALowerFoundUnlockedIsSavedIntoTheSnapshotAndReported(t *testing.T) {
	f := newFixture(t)
	ly := f.withLayers()
	ly.checkErr = errors.New("the lower's mount is read-write")
	wt := newScripted(f.j, "/w")
	wt.scanPaths = []api.PathChange{{Path: "lower.txt", Change: "modified"}}
	run, _ := layeredRun(t)
	rep, err := f.rt.restoreLayer(context.Background(), run, wt, "b0", nil, "/layers/3/upper")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lower == nil || rep.Lower.Locked || !strings.Contains(rep.Lower.Error, "read-write") {
		t.Fatalf("lower report %+v", rep.Lower)
	}
	if rep.SnapshotCommit != "5ca9" || len(rep.Paths) != 2 || rep.Added != 1 || rep.Modified != 1 {
		t.Errorf("the scan's snapshot must extend the layer's: %+v", rep)
	}
	if len(auditRecords(t, f.dir, "lower_unlocked")) != 1 {
		t.Error("the lost lock is not in the audit log")
	}
}

// A lower found unlocked may hold anyone's objects: what the guard knew
// whole of its repository is forgotten before the snapshot reads a history
// against it. Control: a locked lower keeps it.
func TestALowerFoundUnlockedForgetsWhatWasKnownWhole(t *testing.T) {
	for _, unlocked := range []bool{true, false} {
		f := newFixture(t)
		ly := f.withLayers()
		if unlocked {
			ly.checkErr = errors.New("the lower's mount is read-write")
		}
		wt := newScripted(f.j, "/w")
		run, _ := layeredRun(t)
		if _, err := f.rt.restoreLayer(context.Background(), run, wt, "b0", nil, "/layers/3/upper"); err != nil {
			t.Fatal(err)
		}
		if got := f.j.index("forget-known /w") >= 0; got != unlocked {
			t.Errorf("lower unlocked %v: forgotten %v (%v)", unlocked, got, f.j.all())
		}
	}
}

// What differed in the lower's git metadata is put back, reported and
// audited; the restore goes on.
func TestLowerMetadataThatDifferedIsReportedAndAudited(t *testing.T) {
	f := newFixture(t)
	f.withLayers()
	wt := newScripted(f.j, "/w")
	wt.verifyChanged = []string{"config", "hooks/pre-commit"}
	run, _ := layeredRun(t)
	rep, err := f.rt.restoreLayer(context.Background(), run, wt, "b0", nil, "/layers/3/upper")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lower == nil || !rep.Lower.Locked || strings.Join(rep.Lower.MetadataRestored, ",") != "config,hooks/pre-commit" {
		t.Fatalf("lower report %+v", rep.Lower)
	}
	if len(auditRecords(t, f.dir, "lower_metadata_restored")) != 1 {
		t.Error("the restored metadata is not in the audit log")
	}
}

// A snapshot that failed on a full layer keeps the layer, pinned, and the
// report says where and why instead of naming a snapshot.
func TestAnUnsavableLayerIsReportedWhereItIsKept(t *testing.T) {
	f := newFixture(t)
	ly := f.withLayers()
	ly.usage = &fakeUsage{used: 100, limit: 100, full: true}
	wt := newScripted(f.j, "/w")
	wt.snapErr = errors.New("no space left on device")
	run, _ := layeredRun(t)
	rep, err := f.rt.restoreLayer(context.Background(), run, wt, "b0", nil, "/layers/3/upper")
	if err != nil {
		t.Fatal(err)
	}
	if rep.SnapshotRef != "" || rep.SnapshotCommit != "" || rep.LayerDir != "/layers/3" || !strings.Contains(rep.SnapshotError, "no space") {
		t.Errorf("report %+v", rep)
	}
	if !rep.LayerFull || rep.LayerBytes != 100 || rep.LayerLimitBytes != 100 {
		t.Errorf("the full layer is not reported: %+v", rep)
	}
	if !strings.Contains(ly.pins[3], "no space") {
		t.Errorf("pinned %v", ly.pins)
	}
	if len(auditRecords(t, f.dir, "snapshot_failed")) != 1 {
		t.Error("the failed snapshot is not in the audit log")
	}
}
