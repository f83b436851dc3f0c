package runtime

import (
	"context"
	"testing"

	"github.com/shimdev/shim/api"
)

// A generation that ran on a worktree layer is restored by making the
// layer its snapshot: no scan of the worktree, whose lower no harness
// wrote.
func TestALayeredGenerationIsSavedFromItsLayerWithoutAScan(t *testing.T) {
	f := newFixture(t)
	f.s.layered = true
	f.mustStart(1, withWorktree("/w", "b0"))
	res := f.mustStart(2, withWorktree("/w", "b0"))
	if f.j.index("layer-snapshot 1 c0ffeeb0 /layers/1") < 0 || f.j.index("restore 1") >= 0 {
		t.Fatalf("journal: %q", f.j.all())
	}
	w := res.Fenced[0].Worktree
	if w == nil || w.Isolation != "layers" || w.SnapshotRef != "refs/shim/abandoned/1" || res.Baseline != "c0ffeeb0" {
		t.Errorf("report %+v, baseline %s", w, res.Baseline)
	}
}

// A new baseline, or a push check, still needs the scan restore, after the
// layer's snapshot (which the scan then reuses).
func TestALayeredGenerationWithANewBaselineIsSavedThenMoved(t *testing.T) {
	for name, req := range map[string]api.FenceRequest{
		"baseline": {Generation: 2, Worktree: "/w", Baseline: "b1"},
		"fetch":    {Generation: 2, Worktree: "/w", Fetch: &api.FetchSpec{}},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.s.layered = true
			f.mustStart(1, withWorktree("/w", "b0"))
			if _, err := f.rt.Fence(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			snap, scan := f.j.index("layer-snapshot 1"), f.j.index("move 1")
			if snap < 0 || scan < snap {
				t.Fatalf("journal: %q", f.j.all())
			}
		})
	}
}

// Without layers the scan restore runs, as before.
func TestAGenerationWithoutLayersIsRestoredByTheScan(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "b0"))
	f.mustStart(2, withWorktree("/w", "b0"))
	if f.j.index("restore 1") < 0 || f.j.index("layer-snapshot") >= 0 {
		t.Fatalf("journal: %q", f.j.all())
	}
}
