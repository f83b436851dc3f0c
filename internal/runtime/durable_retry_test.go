package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/shimdev/shim/api"
	"golang.org/x/sys/unix"
)

// A file its caller wrote (putWritten: the hand-off) whose sync failed
// may have lost its content: Linux marks the pages clean after a failed
// writeback and reports the error once, so a retry of the batch (the
// reserve given up for state.json) that opens the file again and syncs
// it gets nil without its content on the disk. Such a file stays failed
// on the retry; a put file, written again from its bytes, is durable.
func TestAWrittenFileWhoseSyncFailedStaysFailedOnARetry(t *testing.T) {
	dir := t.TempDir()
	h, s := filepath.Join(dir, "h.json"), filepath.Join(dir, "s.json")
	if err := os.WriteFile(h+".tmp", []byte("hand-off"), 0o400); err != nil {
		t.Fatal(err)
	}
	var hSyncs, sSyncs atomic.Int32
	hook := func(path string) error {
		switch path {
		case h + ".tmp":
			if hSyncs.Add(1) == 1 {
				return errors.New("injected: writeback failed")
			}
		case s + ".tmp":
			if sSyncs.Add(1) == 1 {
				return errors.New("injected: writeback failed")
			}
		}
		return nil
	}
	fsyncHook.Store(&hook)
	t.Cleanup(func() { fsyncHook.Store(nil) })
	var batch durableBatch
	batch.putWritten(h)
	batch.put(s, []byte("state"), 0o600)
	if err := batch.commit(); err == nil {
		t.Fatal("first commit: no error with two syncs failed")
	}
	batch.commit() // the retry saveWithLocked's reserve makes
	if err := batch.errorOf(h); err == nil {
		t.Error("a written file whose sync failed passes for durable on the retry")
	}
	if _, err := os.Stat(h); err == nil {
		t.Error("a written file whose sync failed was renamed into place on the retry")
	}
	// the control: a put file is written again from its bytes on the
	// retry, so its second sync vouches for its content
	if err := batch.errorOf(s); err != nil {
		t.Errorf("control: the put file after the retry: %v", err)
	}
	if b, _ := os.ReadFile(s); string(b) != "state" {
		t.Errorf("control: the put file holds %q", b)
	}
}

// The same through a start: the hand-off's sync fails in the fence's
// last batch and state.json's finds the disk full there, so the batch is
// committed again with the reserve given up. The hand-off is not durable:
// nothing of generation 2 runs (START_FAILED). The control: with only
// the full disk, the retry makes everything durable and generation 2
// starts.
func TestAHandoffWhoseSyncFailedIsNotDurableAfterTheReserveRetry(t *testing.T) {
	for _, tc := range []struct {
		name        string
		handoffFail bool
	}{{"hand-off sync fails", true}, {"control: only the disk full", false}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			res, err := newReserve(filepath.Join(f.dir, "reserve"), 4096)
			if err != nil {
				t.Fatal(err)
			}
			f.rt.reserve = res
			f.mustStart(1, withWorktree("/w", "base"))
			var states, handoffs atomic.Int32
			f.syncsInto(func(rel string) error {
				switch rel {
				case "state.json.tmp":
					if states.Add(1) == 2 { // the fence's last batch (the first is the token's)
						return &os.PathError{Op: "fsync", Path: rel, Err: unix.ENOSPC}
					}
				case filepath.Join("handoff", "2.json.tmp"):
					if handoffs.Add(1) == 1 && tc.handoffFail {
						return errors.New("injected: writeback failed")
					}
				}
				return nil
			})
			_, err = f.start(2, withWorktree("/w", "next"))
			if states.Load() < 3 {
				t.Fatalf("the fence's last batch was not committed again (%d syncs of state.json)", states.Load())
			}
			if !tc.handoffFail {
				if err != nil {
					t.Fatalf("control: start 2: %v", err)
				}
				if _, err := os.Stat(filepath.Join(f.dir, "handoff", "2.json")); err != nil {
					t.Errorf("control: the hand-off: %v", err)
				}
				return
			}
			if codeOf(err) != api.CodeStartFailed {
				t.Fatalf("start 2 with its hand-off's sync failed: %v", err)
			}
			if f.j.index("start 2") >= 0 {
				t.Errorf("generation 2 started with its hand-off not durable: %q", f.j.all())
			}
			if f.durable() != 2 {
				t.Errorf("token %d", f.durable())
			}
		})
	}
}
