package runtime

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"

	"github.com/shimdev/shim/internal/gitguard"
)

// The fencing token's floor: at start the token is never below the highest
// generation recorded anywhere shim keeps history, so that a state.json that
// was lost, emptied or replaced by an older copy cannot let a stale
// generation in again. The sources, in the runtime dir (shim's own):
//
//   - gen/<N>/ (each started generation's records; retention keeps the
//     newest);
//   - audit.jsonl and its rotated files: every "announced" record (written
//     right after the token is persisted, for starts and fences alike),
//     "shim_started" and "audit_rotated" (both carry the token then, so the
//     current file alone holds the floor whatever was rotated away);
//   - state.json.tmp, a save that was interrupted: never taken for the
//     state (its live generations and start result are ignored), but a
//     token it holds counts as a floor.
//
// And, only when state.json is missing or holds no token, the snapshot refs
// (refs/shim/abandoned/<N>) of the registered worktrees: their git dirs are
// the harness's to write, so while state.json is sound a forged ref cannot
// raise the token (which would refuse the supervisor's next generations).
type floorSource struct {
	gen  uint64
	from string // where it was read, for the error and the audit record
}

// recordsFloor is the highest generation of the runtime dir's own history.
func recordsFloor(dir string) floorSource {
	var f floorSource
	raise := func(n uint64, from string) {
		if n > f.gen {
			f = floorSource{n, from}
		}
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "gen"))
	for _, e := range ents {
		if n, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && e.IsDir() {
			raise(n, filepath.Join(dir, "gen", e.Name()))
		}
	}
	for _, p := range auditFiles(dir) {
		raise(auditFloor(p), p)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "state.json.tmp")); err == nil {
		var tmp struct {
			Highest uint64 `json:"highest"`
		}
		if json.Unmarshal(b, &tmp) == nil {
			raise(tmp.Highest, filepath.Join(dir, "state.json.tmp"))
		}
	}
	return f
}

// refsFloor is the highest generation of a snapshot ref of a worktree
// registered in dir/worktrees.
func refsFloor(dir string) floorSource {
	var f floorSource
	ents, _ := os.ReadDir(filepath.Join(dir, "worktrees"))
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		wt, gens := gitguard.SnapshotGenerations(filepath.Join(dir, "worktrees", e.Name()))
		for _, n := range gens {
			if n > f.gen {
				f = floorSource{n, wt + " refs/shim/abandoned/" + strconv.FormatUint(n, 10)}
			}
		}
	}
	return f
}

// auditFloor is the highest token an audit file records. Lines are
// prefiltered by their event before they are decoded: the file may hold
// tens of megabytes of routine records.
func auditFloor(path string) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var hi uint64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(`"event":"announced"`)) && !bytes.Contains(line, []byte(`"event":"shim_started"`)) &&
			!bytes.Contains(line, []byte(`"event":"audit_rotated"`)) {
			continue
		}
		var rec struct {
			Event      string `json:"event"`
			Generation uint64 `json:"generation"`
			Highest    uint64 `json:"highest"`
		}
		if json.Unmarshal(line, &rec) != nil {
			continue
		}
		n := rec.Highest
		if rec.Event == "announced" {
			n = rec.Generation
		}
		hi = max(hi, n)
	}
	return hi
}
