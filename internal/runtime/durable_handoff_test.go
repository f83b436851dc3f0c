package runtime

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/shimdev/shim/api"
)

// Control: a hand-off that cannot be made durable (its sync fails in the
// fence's last batch) starts nothing of the new generation: the start
// fails (START_FAILED) after the fence, which stands.
func TestAHandoffNotDurableStartsNothing(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	f.syncsInto(func(rel string) error {
		if rel == filepath.Join("handoff", "2.json.tmp") {
			return errors.New("injected: the disk is gone")
		}
		return nil
	})
	res, err := f.start(2, withWorktree("/w", "next"))
	if codeOf(err) != api.CodeStartFailed {
		t.Fatalf("start 2: %v", err)
	}
	if res == nil || len(res.Fenced) != 1 || res.Fenced[0].Error != nil {
		t.Errorf("the fence of generation 1 does not stand: %+v", res)
	}
	if f.j.index("start 2") >= 0 {
		t.Errorf("generation 2 started with its hand-off not durable: %q", f.j.all())
	}
	if f.durable() != 2 {
		t.Errorf("token %d", f.durable())
	}
}
