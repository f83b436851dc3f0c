package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The generation's life, written out by hand (not read from the table it
// checks): every pair of states is tried, the listed ones must pass, every
// other one must fail and leave the state as it was. A state added to the
// type without a line here fails the test.
func TestEveryTransitionIsTheModelsAndNoOther(t *testing.T) {
	model := map[genState][]genState{
		stStarting:  {stRunning, stFencing},                      // the harness runs; or a newer announcement fences it first
		stRunning:   {stExited, stFencing, stSuspended},          // it exits; it is fenced; its lease runs out
		stExited:    {stQuiesced, stFencing},                     // what it left is killed; or it is fenced first
		stQuiesced:  {stEmptied},                                 // the next fence finds it empty
		stAdopted:   {stFencing, stSuspended},                    // a previous shim's: fenced, or its lease runs out
		stSuspended: {stRunning, stAdopted, stExited, stFencing}, // renewed (back as it was); exits frozen; fenced
		stFencing:   {stEmptied, stFailed},                       // the kill confirmed, or a step failed
		stEmptied:   {stFenced, stEmptied},                       // the restore done; a retried restore
		stFailed:    {stFencing},                                 // a retry
		stFenced:    {},                                          // the end
	}
	var all []genState
	for s := range len(stateNames) {
		all = append(all, genState(s))
		if _, ok := model[genState(s)]; !ok {
			t.Errorf("state %s has no line in the model", genState(s))
		}
	}
	for _, from := range all {
		for _, to := range all {
			want := false
			for _, s := range model[from] {
				want = want || s == to
			}
			g := &generation{state: from}
			err := g.transition(to)
			var te *stateTransitionError
			switch {
			case want && (err != nil || g.state != to):
				t.Errorf("%s -> %s: the model allows it, the runtime refused: %v", from, to, err)
			case !want && !errors.As(err, &te):
				t.Errorf("%s -> %s: not in the model but allowed (err %v)", from, to, err)
			case !want && g.state != from:
				t.Errorf("%s -> %s: a refused transition changed the state to %s", from, to, g.state)
			}
		}
	}
	if stFenced.String() != "fenced" || stSuspended.String() != "suspended" || genState(99).String() != "genState(99)" {
		t.Errorf("state names: %s %s %s", stFenced, stSuspended, genState(99))
	}
}

// A move the model refuses is a bug of shim: it is logged and audited, the
// state stays, and PID 1 goes on (no panic).
func TestAMoveTheModelRefusesIsAuditedNotDropped(t *testing.T) {
	f := newFixture(t)
	g := &generation{n: 7, state: stFenced}
	f.rt.mu.Lock()
	f.rt.move(g, stRunning)
	f.rt.mu.Unlock()
	if g.state != stFenced {
		t.Fatalf("state %s after a refused move", g.state)
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "audit.jsonl"))
	if err != nil || !strings.Contains(string(b), `"event":"state_bug"`) || !strings.Contains(string(b), `fenced -\u003e running`) {
		t.Fatalf("audit: %v %s", err, b)
	}
}
