package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitguard"
	"github.com/shimdev/shim/internal/layers"
	"golang.org/x/sys/unix"
)

// writeLayer lays out generation n's worktree layer of path under the
// fake layers: its upper holding files, and its snapshot marker when
// marker is not "".
func writeLayer(t *testing.T, ly *fakeLayers, path string, n uint64, marker string, files ...string) string {
	t.Helper()
	up := ly.WorktreeUpper(path, n)
	if err := os.MkdirAll(up, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if err := os.WriteFile(filepath.Join(up, name), []byte("edit"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if marker != "" {
		if err := os.WriteFile(filepath.Join(filepath.Dir(up), "snapshot"), []byte(marker+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Dir(up)
}

// A fenced generation's layer goes only once its edits are known saved:
// a layer with no snapshot marker and edits, or a snapshot ref that does
// not name the marker's commit, is pinned (kept for good, and said why);
// a layer of a worktree this shim has not registered yet is kept without
// a pin, decided once it is; a live generation's layers always stay.
func TestALayerGoesOnlyOnceItsEditsAreKnownSaved(t *testing.T) {
	for _, tc := range []struct {
		name     string
		live     bool
		marker   string
		files    []string
		record   string // the snapshot commit gen/3/generation.json gives
		register bool
		refOK    bool
		pinErr   error
		keep     bool
		pinned   bool
	}{
		{name: "live", live: true, files: []string{"a"}, keep: true},
		{name: "saved: the ref names the marker's commit", marker: "abc", files: []string{"a"}, register: true, refOK: true},
		{name: "an empty layer without a marker has nothing to lose"},
		{name: "edits without a marker are pinned", files: []string{"a"}, register: true, keep: true, pinned: true},
		{name: "a ref that does not name the marker's commit is pinned", marker: "abc", files: []string{"a"}, register: true, keep: true, pinned: true},
		{name: "the record stands in for a marker the full disk kept out", record: "abc", files: []string{"a"}, register: true, refOK: true},
		{name: "a worktree not registered yet: kept, not pinned", marker: "abc", files: []string{"a"}, keep: true},
		{name: "a pin that fails still keeps the layer", files: []string{"a"}, register: true, pinErr: errors.New("EROFS"), keep: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ly := f.withLayers()
			ly.pinErr = tc.pinErr
			writeLayer(t, ly, "/w", 3, tc.marker, tc.files...)
			if tc.live {
				f.rt.gens[3] = &generation{n: 3}
			}
			if tc.record != "" {
				writeRecord(t, f, 3, &api.WorktreeReport{Worktree: "/w", SnapshotCommit: tc.record})
			}
			if tc.register {
				wt := newScripted(f.j, "/w")
				wt.snapIs = func(n uint64, commit string) bool { return tc.refOK && n == 3 && commit == "abc" }
				f.rt.worktrees["/w"] = wt
			}
			if got := f.rt.keepLayer(3); got != tc.keep {
				t.Errorf("kept %v, want %v (journal %q)", got, tc.keep, f.j.all())
			}
			if _, got := ly.pins[3]; got != tc.pinned {
				t.Errorf("pinned %v, want %v", got, tc.pinned)
			}
			if got := len(auditRecords(t, f.dir, "layer_pinned")) > 0; got != tc.pinned {
				t.Errorf("audited a pin %v, want %v", got, tc.pinned)
			}
		})
	}
}

func writeRecord(t *testing.T, f *fixture, n uint64, wt *api.WorktreeReport) {
	t.Helper()
	dir := f.rt.genDir(n)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := api.Generation{Generation: n, Fence: &api.FenceReport{Worktree: wt}}
	if err := writeJSON(filepath.Join(dir, "generation.json"), rec); err != nil {
		t.Fatal(err)
	}
}

// Pruning asks keepLayer about every older generation: the fake's Prune
// records what it was told.
func TestPruningKeepsWhatIsNotKnownSaved(t *testing.T) {
	f := newFixture(t)
	ly := f.withLayers()
	writeLayer(t, ly, "/w", 1, "", "unsaved")
	f.rt.worktrees["/w"] = newScripted(f.j, "/w")
	ly.pruneErr = errors.New("busy")
	f.rt.pruneLayers(3)
	if !ly.prunedLive[1] || ly.prunedLive[2] {
		t.Fatalf("prune was told %v: the unsaved layer 1 stays, the empty 2 goes", ly.prunedLive)
	}
}

// A start checks that the layers dir can take the layers: when it cannot
// (a failing disk, no room for the fences' reserve), a generation that
// requires layers is refused and the layers stay on; otherwise layers
// are dropped for good: every lower unlocked, every worktree opened
// again on the checkout, status says why.
func TestALostLayersDirRefusesWhatRequiresLayersElseDropsThem(t *testing.T) {
	for _, tc := range []struct {
		name              string
		unusable          string
		noRoom            bool
		require, required bool // the request's, the runtime's
		code              string
		dropped           bool
	}{
		{name: "usable"},
		{name: "unusable, required by the request", unusable: "read-only filesystem", require: true, code: api.CodeIsolationUnavailable},
		{name: "unusable, required by shim", unusable: "read-only filesystem", required: true, code: api.CodeIsolationUnavailable},
		{name: "unusable: dropped", unusable: "read-only filesystem", dropped: true},
		{name: "no room for the reserve: dropped", noRoom: true, dropped: true},
		{name: "no room for the reserve, required", noRoom: true, require: true, code: api.CodeIsolationUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ly := f.withLayers()
			ly.unusable = tc.unusable
			ly.unlockErr = errors.New("an unlock that fails is logged")
			if tc.noRoom {
				// a reserve whose file cannot be made is never held
				f.rt.layersReserve = &reserve{path: filepath.Join(f.dir, "missing", "reserve"), size: 1 << 20}
			}
			f.rt.cfg.RequireIsolation = tc.required
			f.rt.worktrees["/w"] = newScripted(f.j, "/w")
			l := newLauncher(f.rt)
			err := l.checkLayersDisk(4, api.StartRequest{Generation: 4, RequireIsolation: tc.require})
			if got := codeOf(err); got != tc.code {
				t.Fatalf("error %v, want code %q", err, tc.code)
			}
			if err != nil && !strings.Contains(err.Error(), "generation 4 needs its own layers") {
				t.Errorf("the refusal does not say why: %v", err)
			}
			if got := !f.rt.layered(); got != tc.dropped {
				t.Fatalf("dropped %v, want %v", got, tc.dropped)
			}
			if !tc.dropped {
				return
			}
			if f.j.index("unlock-lower /w") < 0 || f.rt.registered("/w") != nil {
				t.Errorf("a dropped layers dir must unlock and forget every lower: %q", f.j.all())
			}
			st := f.rt.Status()
			if st.Isolation.Mode != layers.ModeScan || !strings.HasPrefix(st.Isolation.Reason, "layers were lost: ") {
				t.Errorf("status isolation %+v", st.Isolation)
			}
			if len(auditRecords(t, f.dir, "layers_lost")) != 1 {
				t.Error("the loss is not in the audit log")
			}
		})
	}
}

// Where the layers dir is short of room, the fenced generations' layers
// are pruned before the reserve is taken again.
func TestAShortLayersDirIsPrunedBeforeTheReserveIsTaken(t *testing.T) {
	f := newFixture(t)
	f.withLayers()
	f.rt.layersReserve = &reserve{path: filepath.Join(f.dir, "missing", "reserve"), size: 1 << 20}
	if why := f.rt.roomForLayers(5); !strings.Contains(why, "no room for the reserve") {
		t.Fatalf("why %q", why)
	}
	if f.j.index("prune 5") < 0 {
		t.Fatalf("not pruned first: %q", f.j.all())
	}
	f.rt.layersReserve = &reserve{path: filepath.Join(f.dir, "reserve"), size: 4096}
	if why := f.rt.roomForLayers(5); why != "" {
		t.Fatalf("a reserve that can be taken: %q", why)
	}
}

// Which worktrees a generation gets a layer on, and when a start that
// requires layers is refused.
func TestLayeredWorktrees(t *testing.T) {
	capable := func(f *fixture) { f.rt.worktrees["/w"] = newScripted(f.j, "/w") }
	for _, tc := range []struct {
		name     string
		layered  bool
		req      api.StartRequest
		setup    func(*fixture)
		wts      []string
		ok       bool
		code     string
		required bool
	}{
		{name: "scan", req: api.StartRequest{Worktree: "/w"}},
		{name: "scan, the request requires layers", req: api.StartRequest{Worktree: "/w", RequireIsolation: true}, code: api.CodeIsolationUnavailable},
		{name: "scan, shim requires layers", required: true, req: api.StartRequest{}, code: api.CodeIsolationUnavailable},
		{name: "layers, no worktree", layered: true, ok: true},
		{name: "layers, a registered worktree", layered: true, req: api.StartRequest{Worktree: "/w/"}, setup: capable, wts: []string{"/w"}, ok: true},
		{name: "layers, a worktree not registered yet", layered: true, req: api.StartRequest{Worktree: "/w"}, ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.layered {
				f.withLayers()
			} else {
				f.rt.iso = api.Isolation{Mode: layers.ModeScan, Reason: "no overlayfs"}
			}
			f.rt.cfg.RequireIsolation = tc.required
			if tc.setup != nil {
				tc.setup(f)
			}
			wts, ok, err := newLauncher(f.rt).layeredWorktrees(7, tc.req)
			if codeOf(err) != tc.code || ok != tc.ok || fmt.Sprint(wts) != fmt.Sprint(tc.wts) {
				t.Fatalf("got %v %v %v, want %v %v code %q", wts, ok, err, tc.wts, tc.ok, tc.code)
			}
			if err != nil && !strings.Contains(err.Error(), "no overlayfs") {
				t.Errorf("the refusal does not say why layers are off: %v", err)
			}
		})
	}
}

// The start-up probe decides the isolation once: layers with what status
// shows of them, or the scan with the reason.
func TestTheProbeDecidesTheIsolation(t *testing.T) {
	f := newFixture(t)
	if got := f.rt.Status().Isolation.Mode; got != "probing" {
		t.Fatalf("before the probe: %q", got)
	}
	newLauncher(f.rt).probeLayers()
	if iso := f.rt.Status().Isolation; iso.Mode != layers.ModeScan || !strings.Contains(iso.Reason, "layers are off") {
		t.Fatalf("no layers: %+v", iso)
	}
	ly := f.withLayers()
	ly.probe = "overlayfs is not available"
	newLauncher(f.rt).probeLayers()
	if iso := f.rt.Status().Isolation; iso.Mode != layers.ModeScan || !strings.Contains(iso.Reason, "overlayfs is not available") {
		t.Fatalf("a failed probe: %+v", iso)
	}
	// Layers work, but the owner's gits could not be given the ambient
	// capability: no layers, and the reason says so.
	prev := gitguard.CurrentOwnerGuard()
	t.Cleanup(func() { gitguard.SetOwnerGuard(prev) })
	gitguard.SetOwnerGuard(gitguard.OwnerGuard{Mode: gitguard.GuardPtraceScope})
	ly.probe, ly.keep = "", 3
	newLauncher(f.rt).probeLayers()
	if iso := f.rt.Status().Isolation; iso.Mode != layers.ModeScan || !strings.Contains(iso.Reason, "no ambient capability") {
		t.Fatalf("under the ptrace_scope guard: %+v", iso)
	}
	gitguard.SetOwnerGuard(gitguard.OwnerGuard{Mode: gitguard.GuardAmbientCap, Caps: []uintptr{unix.CAP_NET_BIND_SERVICE}})
	newLauncher(f.rt).probeLayers()
	iso := f.rt.Status().Isolation
	if iso.Mode != layers.ModeLayers || iso.Dir != ly.dir || iso.KeepLayers != 3 || iso.RootLayerBytes != 1<<30 || iso.WorktreeLayerBytes != 2<<30 || len(iso.Persist) != 1 {
		t.Fatalf("layers: %+v", iso)
	}
}

// A fenced generation's worktree layer is the one its plan named; an
// adopted one's (no plan, no process) is where the previous shim laid it
// out, if it is there.
func TestTheWorktreeLayerOfAFencedGeneration(t *testing.T) {
	f := newFixture(t)
	ly := f.withLayers()
	planned := &generation{n: 2, proc: newFakeProc(), layers: &layers.Plan{Worktrees: []layers.WorktreeLayer{{Path: "/w", Upper: "/u/2"}}}}
	if got := f.rt.worktreeLayer(planned, "/w/"); got != "/u/2" {
		t.Errorf("planned: %q", got)
	}
	if got := f.rt.worktreeLayer(planned, "/other"); got != "" {
		t.Errorf("a worktree the plan does not name: %q", got)
	}
	if got := f.rt.worktreeLayer(&generation{n: 2, proc: newFakeProc()}, "/w"); got != "" {
		t.Errorf("a generation started without layers: %q", got)
	}
	adopted := &generation{n: 3}
	if got := f.rt.worktreeLayer(adopted, "/w"); got != "" {
		t.Errorf("an adopted generation whose layer is not there: %q", got)
	}
	dir := writeLayer(t, ly, "/w", 3, "")
	if got := f.rt.worktreeLayer(adopted, "/w"); got != filepath.Join(dir, "upper") {
		t.Errorf("an adopted generation's layer: %q", got)
	}
}

// The fence report lists what a generation wrote outside its worktree
// (its root layer), bounded; a generation without layers has none.
func TestTheRootLayerReportListsWhatChangedBounded(t *testing.T) {
	f := newFixture(t)
	ly := f.withLayers()
	g := &generation{n: 4, layers: &layers.Plan{}}
	if rep := f.rt.rootLayerReport(g); rep != nil {
		t.Fatalf("no root layer on disk: %+v", rep)
	}
	up := ly.RootUpper(4)
	os.MkdirAll(filepath.Join(up, "etc"), 0o700)
	os.WriteFile(filepath.Join(up, "etc", "hosts"), []byte("x"), 0o600)
	rep := f.rt.rootLayerReport(g)
	if rep == nil || rep.Dir != up || rep.Kept || strings.Join(rep.Paths, ",") != "/etc/hosts" || rep.PathsTruncated {
		t.Fatalf("report %+v: a directory whose contents changed is not listed itself", rep)
	}
	for i := range maxLayerPaths {
		os.WriteFile(filepath.Join(up, fmt.Sprintf("f%03d", i)), nil, 0o600)
	}
	rep = f.rt.rootLayerReport(g)
	if len(rep.Paths) != maxLayerPaths || !rep.PathsTruncated {
		t.Fatalf("%d paths, truncated %v", len(rep.Paths), rep.PathsTruncated)
	}
	if rep := f.rt.rootLayerReport(&generation{n: 4, proc: newFakeProc()}); rep != nil {
		t.Errorf("a generation started without layers: %+v", rep)
	}
	f.rt.layers = nil
	if rep := f.rt.rootLayerReport(g); rep != nil {
		t.Errorf("without layers: %+v", rep)
	}
}

// Held mount namespaces are let go once, in the background or now; now
// returns only once every pending one is gone.
func TestHeldNamespacesAreLetGoOnceAndNowWaits(t *testing.T) {
	var r releasing
	files := make([]*os.File, 3)
	hs := make([]*heldMounts, 3)
	for i := range hs {
		var err error
		if files[i], err = os.Open(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		hs[i] = &heldMounts{f: files[i]}
	}
	hs[2].ipc = files[2]
	r.later(hs[:2])
	r.later(nil)
	r.later(hs[2:])
	r.now()
	for i, f := range files {
		if !released(f) {
			t.Errorf("namespace %d still held after now", i)
		}
	}
	if len(r.pending) != 0 {
		t.Errorf("pending %d", len(r.pending))
	}
	hs[0].release() // a second release does nothing
	var nilHeld *heldMounts
	nilHeld.release()
}

// A fence whose harness left the layers' filesystem short lets its
// fenced generations' namespaces go at once, not after the answer.
func TestAShortLayersDirLetsTheFencedNamespacesGoAtOnce(t *testing.T) {
	f := newFixture(t)
	f.withLayers()
	ns, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := &announcement{held: []*heldMounts{{f: ns}}}
	f.rt.layersReserve = &reserve{path: filepath.Join(f.dir, "reserve"), size: 4096}
	f.rt.layersReserve.ensure()
	f.rt.letGoIfShort(a)
	if released(ns) || len(a.held) != 1 {
		t.Fatal("room enough: the namespaces wait for the answer")
	}
	f.rt.layersReserve.release()
	f.rt.letGoIfShort(a)
	if !released(ns) || a.held != nil {
		t.Fatal("short of room: the namespaces go now")
	}
}
