package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
)

// syncsInto records every fsync of the fixture's runtime dir in its
// journal ("fsync state.json.tmp", "fsync ." for the dir itself), with
// fail deciding which fail.
func (f *fixture) syncsInto(fail func(rel string) error) {
	h := func(path string) error {
		rel, err := filepath.Rel(f.dir, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			return nil
		}
		f.j.add("fsync %s", rel)
		if fail != nil {
			return fail(rel)
		}
		return nil
	}
	fsyncHook.Store(&h)
	f.t.Cleanup(func() { fsyncHook.Store(nil) })
}

// after is the journal's lines from the first one starting with prefix.
func (j *journal) after(t *testing.T, prefix string) []string {
	t.Helper()
	i := j.index(prefix)
	if i < 0 {
		t.Fatalf("no %q in %q", prefix, j.all())
	}
	return j.all()[i:]
}

// position is the index of line in lines, from, or -1.
func position(lines []string, from int, line string) int {
	for i := from; i < len(lines); i++ {
		if lines[i] == line {
			return i
		}
	}
	return -1
}

// The records of a fence and a start, durable in order and in batches:
// the token (state.json, then its name) before the "announced" record and
// before the restore; the fenced generation's record and state.json in one
// batch (both contents synced before either directory), then the "fenced"
// record; the started generation's record and state.json in one batch
// after its harness started, then "generation_started".
func TestAFenceAndAStartSyncTheirRecordsInOrderAndInBatches(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	f.syncsInto(nil)
	f.mustStart(2, withWorktree("/w", "next"))
	lines := f.j.after(t, "remove gen-1") // gen 1's exit record is its watcher's, before
	// Each group in order; within a group (one phase of a batch, synced
	// at once) any order.
	want := [][]string{
		// persist: the token, then the record that announces it
		{"fsync state.json.tmp"}, {"fsync ."}, {"fsync audit.jsonl"},
		{"restore 1 next"},
		// the fence's end: one batch, contents then names, then its
		// record; generation 2's dir and hand-off in it, so durable
		// before anything of generation 2 runs
		{"fsync gen/1/generation.json.tmp", "fsync state.json.tmp", "fsync handoff/2.json.tmp"},
		{"fsync gen/1", "fsync .", "fsync gen", "fsync handoff"}, {"fsync audit.jsonl"},
		{"start 2"},
		// the start's records, after its harness runs, then its record
		{"fsync gen/2/generation.json.tmp", "fsync state.json.tmp"}, {"fsync gen/2", "fsync ."}, {"fsync audit.jsonl"},
	}
	at, n := 0, 0
	for _, group := range want {
		left := map[string]bool{}
		for _, w := range group {
			left[w] = true
		}
		for ; len(left) > 0 && at < len(lines); at++ {
			if left[lines[at]] {
				delete(left, lines[at])
			} else if strings.HasPrefix(lines[at], "fsync ") || lines[at] == "start 2" || strings.HasPrefix(lines[at], "restore ") {
				t.Fatalf("%q before %q in %q", lines[at], group, lines)
			}
		}
		if len(left) > 0 {
			t.Fatalf("%v missing or out of order in %q", left, lines)
		}
		n += len(group)
	}
	var syncs []string
	for _, l := range lines {
		if strings.HasPrefix(l, "fsync ") {
			syncs = append(syncs, l)
		}
	}
	// 3 for the token and its record, 8 for the fence's end (with the
	// hand-off and the new generation's dir), 5 for the start's records,
	// each batch's in two phases of syncs made at once.
	if len(syncs) != n-2 {
		t.Errorf("%d syncs, want %d: %q", len(syncs), n-2, syncs)
	}
	var rec api.Generation
	if err := readJSON(filepath.Join(f.dir, "gen", "1", "generation.json"), &rec); err != nil || rec.Fence == nil || rec.State != api.GenFenced {
		t.Errorf("fence record %+v %v", rec, err)
	}
	if err := readJSON(filepath.Join(f.dir, "gen", "2", "generation.json"), &rec); err != nil || rec.Generation != 2 || rec.State != api.StateRunning {
		t.Errorf("start record %+v %v", rec, err)
	}
}

// Control: a token that cannot be made durable is recorded by nothing
// after it: no "announced" record, no new generation (TOKEN_NOT_PERSISTED).
// The restore still saves the dead generation's edits (nothing lost).
func TestATokenNotDurableIsRecordedByNothingAfterIt(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	failed := false
	f.syncsInto(func(rel string) error {
		if rel == "state.json.tmp" && !failed {
			failed = true
			return errors.New("injected: the disk is gone")
		}
		return nil
	})
	_, err := f.start(2, withWorktree("/w", "next"))
	if codeOf(err) != api.CodeTokenNotPersisted {
		t.Fatalf("start 2: %v", err)
	}
	lines := f.j.after(t, "kill gen-1")
	if position(lines, 0, "fsync audit.jsonl") >= 0 && position(lines, 0, "fsync audit.jsonl") < position(lines, 0, "fsync .") {
		t.Errorf("an audit record synced before the token's name: %q", lines)
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "start 2") || strings.HasPrefix(l, "fsync handoff") {
			t.Errorf("%q after a token that is not durable: %q", l, lines)
		}
	}
	b, _ := os.ReadFile(filepath.Join(f.dir, "audit.jsonl"))
	if strings.Contains(string(b), `"event":"announced","generation":2`) {
		t.Errorf("generation 2 recorded as announced with its token not durable")
	}
}

// A batch makes every file durable even when one of them fails, and says
// which failed; a failed file keeps its old content.
func TestABatchSaysWhichFileFailed(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "missing", "b.json")
	if err := os.WriteFile(a, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	var batch durableBatch
	batch.put(a, []byte("new"), 0o600)
	batch.put(b, []byte("new"), 0o600)
	if err := batch.commit(); err == nil {
		t.Fatal("a file in a missing directory was written")
	}
	if batch.errorOf(a) != nil || batch.errorOf(b) == nil {
		t.Errorf("errors: a %v, b %v", batch.errorOf(a), batch.errorOf(b))
	}
	if got, _ := os.ReadFile(a); string(got) != "new" {
		t.Errorf("a is %q", got)
	}
}
