package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shimdev/shim/api"
)

// persisted is state.json: what a restarted shim must remember so that the
// fencing token survives it. It never holds a secret.
type persisted struct {
	// Highest is the highest generation ever announced; lower ones are stale.
	Highest uint64 `json:"highest"`
	// Started is the announcement that started Highest, kept so that an
	// identical retry gets the same answer and a different one is refused.
	Started *startedRecord `json:"started,omitempty"`
	// Live are generations whose cgroups may still exist, with what a
	// restarted shim needs to fence them.
	Live map[uint64]liveRecord `json:"live,omitempty"`
	// Failed is why the last fence failed, while the state is failed.
	Failed *api.Error `json:"failed,omitempty"`
	// Ended is the generation last ended by shim ctl end: it never starts
	// again.
	Ended uint64 `json:"ended,omitempty"`
}

type startedRecord struct {
	Generation uint64          `json:"generation"`
	SpecHash   string          `json:"spec_hash"`
	Result     api.StartResult `json:"result"`
}

type liveRecord struct {
	Worktree string `json:"worktree,omitempty"`
	Baseline string `json:"baseline,omitempty"`
	Pid      int    `json:"pid,omitempty"`
	// LeaseMS is the generation's lease: a restarted shim that adopts it
	// starts the lease again from the adoption.
	LeaseMS int64 `json:"lease_ms,omitempty"`
	// Suspended: its lease had run out (it is frozen and cut).
	Suspended bool `json:"suspended,omitempty"`
}

func loadState(path string) (persisted, error) {
	var st persisted
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("state file %s cannot be read (%v): shim does not start without its fencing token; "+
			"if it is really lost, move it away to start from the highest generation shim has a record of (see docs/recovery.md)", path, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		// Fail closed: a state file we cannot read could hide the fencing
		// token; starting from zero would accept stale generations.
		return st, fmt.Errorf("state file %s is corrupt (%v); move it away to start from the highest generation shim has a record of (see docs/recovery.md)", path, err)
	}
	return st, nil
}

// save writes state.json atomically: temp file, fsync, rename, fsync dir.
func (st *persisted) save(path string) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeDurable(path, b, 0o600)
}

// withHistoryFloor makes the fencing token no lower than the highest
// generation recorded anywhere shim keeps history (floor.go). A state.json
// that exists but holds no token ("null", "{}", fields missing) while
// there is history is corrupt: shim refuses to start and says how to
// recover (docs/recovery.md). A state.json that is missing while there is
// history starts from that floor.
func withHistoryFloor(dir string, st persisted) (persisted, error) {
	floor := recordsFloor(dir)
	path := filepath.Join(dir, "state.json")
	_, statErr := os.Stat(path)
	exists := statErr == nil
	if !exists || st.Highest == 0 {
		// state.json lost or empty: the worktrees' snapshot refs count too.
		if r := refsFloor(dir); r.gen > floor.gen {
			floor = r
		}
	}
	if exists && st.Highest == 0 && floor.gen > 0 {
		return st, fmt.Errorf("state file %s holds no fencing token but shim has a record of generation %d (%s): "+
			"it is corrupt; move it away to start from that floor (shim then refuses every generation up to %d; see docs/recovery.md)",
			path, floor.gen, floor.from, floor.gen)
	}
	if floor.gen > st.Highest {
		st.Highest = floor.gen
		st.Started = nil
	}
	return st, nil
}
