package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

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
}

func loadState(path string) (persisted, error) {
	var st persisted
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		// Fail closed: a state file we cannot read could hide the fencing
		// token; starting from zero would accept stale generations.
		return st, fmt.Errorf("state file %s is corrupt (%v); move it away only if no older generation can still be announced", path, err)
	}
	return st, nil
}

// save writes state.json atomically: temp file, fsync, rename, fsync dir.
func (st *persisted) save(path string) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// withHistoryFloor makes the fencing token no lower than the highest
// generation the runtime dir has a record of (gen/<N>/): a state.json that
// was lost while the history stayed must not let an older generation in
// again. A state.json that exists but holds no token ("null", "{}") while
// there is history is corrupt: shim refuses to start and says how to
// recover.
func withHistoryFloor(dir string, st persisted) (persisted, error) {
	floor := uint64(0)
	ents, _ := os.ReadDir(filepath.Join(dir, "gen"))
	for _, e := range ents {
		if n, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && e.IsDir() && n > floor {
			floor = n
		}
	}
	path := filepath.Join(dir, "state.json")
	if _, err := os.Stat(path); err == nil && st.Highest == 0 && floor > 0 {
		return st, fmt.Errorf("state file %s holds no fencing token but the runtime dir has records up to generation %d: "+
			"it is corrupt; move it away to start from that floor (shim then refuses every generation up to %d)", path, floor, floor)
	}
	if floor > st.Highest {
		st.Highest = floor
		st.Started = nil
	}
	return st, nil
}
