package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
)

// state.json is the fencing token's durable copy, and the reserve is what
// keeps it writable when a harness fills the filesystem.

func TestStateJSONKeepsEverythingARestartedShimNeeds(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state.json")
	st := persisted{
		Highest: 12,
		Started: &startedRecord{Generation: 12, SpecHash: "abc", Result: api.StartResult{Generation: 12, Pid: 77, Cgroup: "/cg/gen-12"}},
		Live:    map[uint64]liveRecord{11: {Worktree: "/w", Baseline: "c0ffee", Pid: 70}, 12: {Pid: 77}},
		Failed:  &api.Error{Code: api.CodeRestoreFailed, Message: "generation 11 not fenced"},
	}
	if err := st.save(p); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(p)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%+v %+v %+v %+v", got.Highest, *got.Started, got.Live, *got.Failed) !=
		fmt.Sprintf("%+v %+v %+v %+v", st.Highest, *st.Started, st.Live, *st.Failed) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, st)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state.json mode %v %v", fi.Mode(), err)
	}
	if _, err := os.Stat(p + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the temporary file is left behind: %v", err)
	}
	// A save replaces the file as a whole.
	st2 := persisted{Highest: 13}
	if err := st2.save(p); err != nil {
		t.Fatal(err)
	}
	if got, _ := loadState(p); got.Highest != 13 || got.Started != nil || got.Live != nil || got.Failed != nil {
		t.Errorf("after the second save: %+v", got)
	}
}

func TestAMissingStateFileIsAFreshSandbox(t *testing.T) {
	st, err := loadState(filepath.Join(t.TempDir(), "state.json"))
	if err != nil || st.Highest != 0 || st.Started != nil {
		t.Errorf("%+v %v", st, err)
	}
}

func TestACorruptStateFileFailsClosed(t *testing.T) {
	for name, body := range map[string]string{
		"empty":        "",
		"truncated":    `{"highest": 9, "started": {"generation"`,
		"not json":     "highest=9\n",
		"wrong type":   `{"highest": "9"}`,
		"negative":     `{"highest": -1}`,
		"too large":    `{"highest": 1e30}`,
		"array":        `[9]`,
		"live keys":    `{"highest": 9, "live": {"x": {}}}`,
		"nul bytes":    "\x00\x00\x00\x00",
		"trailing nul": `{"highest": 9}` + "\x00",
	} {
		p := filepath.Join(t.TempDir(), "state.json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		st, err := loadState(p)
		if err == nil {
			t.Errorf("%s: read as %+v; a state file shim cannot read must not start from a lower token", name, st)
			continue
		}
		if !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: the error must say which file is corrupt: %v", name, err)
		}
	}
	// A state file that cannot be read at all is no fresh start either.
	dir := filepath.Join(t.TempDir(), "state.json")
	os.Mkdir(dir, 0o700)
	if _, err := loadState(dir); err == nil {
		t.Error("a state.json that is a directory reads as a fresh sandbox")
	}
}

func TestSaveFailsWhenTheStateCannotBeMadeDurable(t *testing.T) {
	st := persisted{Highest: 3}
	if err := st.save(filepath.Join(t.TempDir(), "no", "such", "state.json")); err == nil {
		t.Error("save into a missing directory succeeded")
	}
	// The rename onto a non-empty directory fails after the temp file was written.
	p := filepath.Join(t.TempDir(), "state.json")
	os.MkdirAll(filepath.Join(p, "x"), 0o700)
	if err := st.save(p); err == nil {
		t.Error("save whose rename fails succeeded")
	}
}

func TestTheReserveIsGivenUpForAWriteThatFindsTheDiskFullAndTakenBack(t *testing.T) {
	p := filepath.Join(t.TempDir(), "reserve")
	r, err := newReserve(p, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Size() != 1<<16 || !r.held {
		t.Fatalf("reserve not taken: %v %v", fi, err)
	}
	calls := 0
	err = r.retry(func() error {
		calls++
		if calls == 1 {
			return &fs.PathError{Op: "write", Path: "state.json.tmp", Err: unix.ENOSPC}
		}
		// The second try runs with the reserve's blocks free.
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("retried with the reserve still in place: %v", err)
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("retry: %v after %d calls", err, calls)
	}
	// Room is back: the reserve is taken again for the next full disk.
	if fi, err := os.Stat(p); err != nil || fi.Size() != 1<<16 || !r.held {
		t.Errorf("reserve not taken back: %v %v", fi, err)
	}
}

func TestTheReserveIsSpentOnlyOnAFullDisk(t *testing.T) {
	p := filepath.Join(t.TempDir(), "reserve")
	r, err := newReserve(p, 4096)
	if err != nil {
		t.Fatal(err)
	}
	// Another failure is not retried and keeps the reserve.
	calls := 0
	eio := errors.New("input/output error")
	if err := r.retry(func() error { calls++; return eio }); err != eio || calls != 1 || !r.held {
		t.Errorf("EIO: %v after %d calls, held %v", err, calls, r.held)
	}
	// Still full after the reserve is gone: the error is returned, and the
	// reserve is not taken back while the disk is full.
	calls = 0
	full := fmt.Errorf("audit: %w", unix.EDQUOT)
	if err := r.retry(func() error { calls++; return full }); !errors.Is(err, unix.EDQUOT) || calls != 2 || r.held {
		t.Errorf("full twice: %v after %d calls, held %v", err, calls, r.held)
	}
	// With the reserve already spent, a full disk is not retried.
	calls = 0
	if err := r.retry(func() error { calls++; return full }); err == nil || calls != 1 {
		t.Errorf("full, no reserve: %v after %d calls", err, calls)
	}
	// The next write that succeeds takes it back.
	if err := r.retry(func() error { return nil }); err != nil || !r.held {
		t.Errorf("after room came back: %v held %v", err, r.held)
	}
}

func TestNoReserveMeansOneTry(t *testing.T) {
	for _, r := range []*reserve{nil, mustReserve(t, 0), mustReserve(t, -1)} {
		calls := 0
		if err := r.retry(func() error { calls++; return unix.ENOSPC }); !errors.Is(err, unix.ENOSPC) || calls != 1 {
			t.Errorf("%+v: %v after %d calls", r, err, calls)
		}
	}
	if _, err := newReserve(filepath.Join(t.TempDir(), "no", "reserve"), 4096); err == nil {
		t.Error("a reserve that cannot be created is no error")
	}
	if !isNoSpace(&fs.PathError{Err: unix.ENOSPC}) || !isNoSpace(unix.EDQUOT) || isNoSpace(unix.EIO) || isNoSpace(nil) {
		t.Error("isNoSpace")
	}
}

func mustReserve(t *testing.T, size int64) *reserve {
	t.Helper()
	p := filepath.Join(t.TempDir(), "reserve")
	r, err := newReserve(p, size)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("size %d made a reserve file", size)
	}
	return r
}

func TestTheRuntimeSavesThroughTheReserve(t *testing.T) {
	f := newFixture(t)
	r, err := newReserve(filepath.Join(f.dir, "reserve"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	f.rt.reserve = r
	f.mustStart(1, withWorktree("/w", "b"))
	f.mustStart(2)
	st, err := loadState(filepath.Join(f.dir, "state.json"))
	if err != nil || st.Highest != 2 || st.Started == nil || st.Started.Generation != 2 || len(st.Live) != 1 {
		t.Errorf("state.json: %+v %v", st, err)
	}
	if st.Started.Result.Pid != 1002 || st.Started.SpecHash == "" {
		t.Errorf("the start's answer for a retry: %+v", st.Started)
	}
}

func TestAnAuditRecordThatCannotBeWrittenIsAuditFailed(t *testing.T) {
	dir := t.TempDir()
	a, err := openAudit(filepath.Join(dir, "audit.jsonl"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Record("fenced", 3, map[string]any{"generation": 99, "event": "forged", "killed": 2}, true); err != nil {
		t.Fatal(err)
	}
	// A value JSON cannot hold is recorded as a marshal error, not lost.
	if err := a.Record("odd", 0, map[string]any{"ch": make(chan int)}, false); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := a.Record("announced", 4, nil, true); codeOf(err) != api.CodeAuditFailed || !strings.Contains(err.Error(), "announced") {
		t.Errorf("write to a closed log: %v", err)
	}
	recs := auditRecords(t, dir, "fenced")
	// The record's own keys are never overwritten by fields.
	if len(recs) != 1 || recs[0]["generation"] != float64(3) || recs[0]["killed"] != float64(2) || recs[0]["time"] == nil {
		t.Errorf("fenced: %v", recs)
	}
	if recs := auditRecords(t, dir, "odd"); len(recs) != 1 || recs[0]["marshal_error"] == nil || recs[0]["generation"] != nil {
		t.Errorf("odd: %v", recs)
	}
	if _, err := openAudit(filepath.Join(dir, "no", "audit.jsonl"), nil); err == nil {
		t.Error("an audit log that cannot be opened is no error")
	}
}

func TestAFenceWhoseRecordCannotBeWrittenFailsClosed(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.rt.audit.f.Close() // the disk under audit.jsonl is gone
	_, err := f.start(2)
	if codeOf(err) != api.CodeAuditFailed {
		t.Fatalf("want AUDIT_FAILED, got %v", err)
	}
	if f.j.index("kill gen-1") < 0 || f.j.index("start 2") >= 0 {
		t.Errorf("gen 1 must be dead and gen 2 not started: %q", f.j.all())
	}
	if st := f.rt.Status(); st.State != api.StateFailed || st.Error == nil || st.Error.Code != api.CodeAuditFailed {
		t.Errorf("status: %+v", st.Error)
	}
}

func TestTheTokenNeverGoesBelowTheHistory(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "gen", "5"), 0o700)
	os.MkdirAll(filepath.Join(dir, "gen", "3"), 0o700)
	// state.json lost, history kept: the floor is the history's.
	st, err := withHistoryFloor(dir, persisted{})
	if err != nil || st.Highest != 5 {
		t.Fatalf("missing state.json: %+v %v", st, err)
	}
	// A token above the history stays.
	if st, _ := withHistoryFloor(dir, persisted{Highest: 9}); st.Highest != 9 {
		t.Fatalf("token lowered to %d", st.Highest)
	}
	// state.json with no token ("null", "{}") while history exists: corrupt.
	for _, body := range []string{"null", "{}"} {
		os.WriteFile(filepath.Join(dir, "state.json"), []byte(body), 0o600)
		loaded, err := loadState(filepath.Join(dir, "state.json"))
		if err == nil {
			_, err = withHistoryFloor(dir, loaded)
		}
		if err == nil {
			t.Errorf("state.json %q with history must fail closed", body)
		}
	}
	// A leftover temporary file is never the state.
	os.Remove(filepath.Join(dir, "state.json"))
	os.WriteFile(filepath.Join(dir, "state.json.tmp"), []byte(`{"highest": 1}`), 0o600)
	if st, err := loadState(filepath.Join(dir, "state.json")); err != nil || st.Highest != 0 {
		t.Errorf("leftover tmp file read as the state: %+v %v", st, err)
	}
}
