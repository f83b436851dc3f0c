package runtime

import (
	"context"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
)

// The new generation's stub begins once every older generation is frozen,
// beside the cut, the kill and the restore, and the start takes it over.
func TestAStartBeginsEarlyOnceEveryOlderGenerationIsFrozen(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	if f.j.index("early 1") >= 0 {
		t.Fatalf("a start that fences nothing began early: %q", f.j.all())
	}
	f.mustStart(2, withWorktree("/w", "next"))
	f.j.inOrder(t, "freeze gen-1", "early 2", "revoke 1", "kill gen-1", "restore 1 next", "start 2")
	if f.j.index("drop early") >= 0 {
		t.Errorf("the start did not take over what began early: %q", f.j.all())
	}
}

// A freeze that is not confirmed begins nothing: the new generation has no
// business starting before the old one is stopped.
func TestAnUnconfirmedFreezeBeginsNoStart(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	f.s.group(1).freezeErr = api.Errorf(api.CodeFreezeFailed, "not frozen")
	if _, err := f.start(2, withWorktree("/w", "")); codeOf(err) != api.CodeFenceFailed {
		t.Fatalf("want FENCE_FAILED, got %v", err)
	}
	if f.j.index("early 2") >= 0 || f.j.index("start 2") >= 0 {
		t.Errorf("a start began after a failed freeze: %q", f.j.all())
	}
}

// A fence that fails after the freeze (here its restore) undoes what began
// early: nothing of the new generation is left (fail closed).
func TestAFenceThatFailsUndoesWhatBeganEarly(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	f.s.trees["/w"].restoreErr = api.Errorf(api.CodeRestoreFailed, "wedged")
	if _, err := f.start(2, withWorktree("/w", "")); codeOf(err) != api.CodeRestoreFailed {
		t.Fatalf("want RESTORE_FAILED, got %v", err)
	}
	f.j.inOrder(t, "freeze gen-1", "early 2", "kill gen-1", "drop early 2")
	if f.j.index("start 2") >= 0 {
		t.Errorf("started after a failed fence: %q", f.j.all())
	}
}

// A fence announcement (no start) begins nothing.
func TestAFenceBeginsNoStart(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if f.j.index("early") >= 0 {
		t.Errorf("a fence began a start: %q", f.j.all())
	}
}

// Dropping what began early kills and removes it and revokes nothing:
// nothing was granted yet, a revocation is for good, and the start of the
// same generation that follows a failed fence (the supervisor's retry)
// must get its credentials.
func TestDroppingAnEarlyStartRevokesNothing(t *testing.T) {
	f := newFixture(t)
	l := &launcher{rt: f.rt, cfg: f.rt.cfg}
	r, w, err := readySocket()
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	g := &fakeGroup{name: "gen-5", j: f.j}
	e := &earlyStart{done: make(chan struct{}), group: g, stub: &layerStub{ready: &stubReady{r: r}}}
	close(e.done)
	l.dropEarly(e, 5)
	if got := strings.Join(f.j.all(), ","); got != "kill gen-5,remove gen-5" {
		t.Errorf("drop: %q, want the kill and the removal only", got)
	}
	l.dropEarly(e, 5) // once only
	if n := len(f.j.all()); n != 2 {
		t.Errorf("dropped twice: %q", f.j.all())
	}
}

// A start that fails before its grant revokes nothing either: the
// supervisor's corrected retry of the same generation gets its
// credentials.
func TestAStartUndoneBeforeItsGrantRevokesNothing(t *testing.T) {
	f := newFixture(t)
	l := &launcher{rt: f.rt, cfg: f.rt.cfg}
	l.undo(7, &fakeGroup{name: "gen-7", j: f.j}, &fakeNet{j: f.j, n: 7}, false)
	if got := strings.Join(f.j.all(), ","); got != "netcut 7,netclose 7,kill gen-7,remove gen-7" {
		t.Errorf("undo before the grant: %q", got)
	}
}
