package runtime

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitguard"
)

// Retention: a sandbox reused for a whole project lives through thousands
// of generations, so what shim keeps per generation is bounded by policy:
// gen/<N>/ (output, exit and generation records) by count and bytes
// (Config.KeepGenerations, KeepBytes), snapshot refs by count
// (Config.KeepSnapshots, in maintain.go, with their objects), audit.jsonl
// by rotation (Config.AuditMaxBytes, AuditKeep; audit.go). A generation
// still known here (live, or its fence pending) is never pruned, and
// neither is the newest record: with the audit log, it is where the
// fencing token's floor is read from when state.json is lost (floor.go).

// genRecord is one gen/<N>/ directory.
type genRecord struct {
	n    uint64
	dir  string
	size int64
}

// listRecords lists gen/<N>/, oldest first, with their size on disk.
func listRecords(runtimeDir string) []genRecord {
	root := filepath.Join(runtimeDir, "gen")
	ents, _ := os.ReadDir(root)
	var out []genRecord
	for _, e := range ents {
		n, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil || !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		out = append(out, genRecord{n: n, dir: dir, size: diskUsage(dir)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n < out[j].n })
	return out
}

// diskUsage is the space the files below p take (allocated blocks).
func diskUsage(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += blocksOf(fi)
		}
		return nil
	})
	return n
}

// pruneRecords removes the oldest gen/<N>/ until at most KeepGenerations
// remain (one fewer before a start: its own comes next) and they take at
// most KeepBytes, except the newest and any generation still known here.
// It returns the generations removed.
func (rt *Runtime) pruneRecords(starting bool) []uint64 {
	keepN, keepB := rt.cfg.KeepGenerations, rt.cfg.KeepBytes
	if keepN <= 0 && keepB <= 0 {
		return nil
	}
	if starting && keepN > 1 {
		keepN--
	}
	recs := listRecords(rt.cfg.RuntimeDir)
	if len(recs) == 0 {
		return nil
	}
	var total int64
	for _, r := range recs {
		total += r.size
	}
	count := len(recs)
	newest := recs[len(recs)-1].n
	var removed []uint64
	for _, r := range recs {
		if !((keepN > 0 && count > keepN) || (keepB > 0 && total > keepB)) {
			break
		}
		if r.n == newest || rt.knownGeneration(r.n) {
			continue
		}
		if err := os.RemoveAll(r.dir); err != nil {
			rt.log.Warn("generation record not pruned", "generation", r.n, "error", err)
			continue
		}
		removed = append(removed, r.n)
		count--
		total -= r.size
	}
	if len(removed) > 0 {
		rt.audit.Record("records_pruned", 0, map[string]any{"generations": removed, "kept": count, "kept_bytes": total}, true)
	}
	return removed
}

// retention is what status reports of the retention policy. It reads the
// runtime dir and the registered worktrees' refs (files only, no git), so
// it is called without rt.mu.
func (rt *Runtime) retention() *api.Retention {
	r := &api.Retention{KeepGenerations: rt.cfg.KeepGenerations, KeepBytes: rt.cfg.KeepBytes, KeepSnapshots: rt.cfg.KeepSnapshots,
		AuditMaxBytes: rt.cfg.AuditMaxBytes, AuditKeepFiles: rt.cfg.AuditKeep}
	recs := listRecords(rt.cfg.RuntimeDir)
	r.Records = len(recs)
	for _, g := range recs {
		r.RecordsBytes += g.size
	}
	if len(recs) > 0 {
		r.OldestRecord, r.NewestRecord = recs[0].n, recs[len(recs)-1].n
	}
	for _, p := range auditFiles(rt.cfg.RuntimeDir) {
		if fi, err := os.Lstat(p); err == nil {
			r.AuditFiles++
			r.AuditBytes += fi.Size()
		}
	}
	r.RuntimeDirBytes = diskUsage(rt.cfg.RuntimeDir)
	rt.mu.Lock()
	paths := make([]string, 0, len(rt.worktrees))
	for p := range rt.worktrees {
		paths = append(paths, p)
	}
	rt.mu.Unlock()
	sort.Strings(paths)
	for _, p := range paths {
		_, gens := gitguard.SnapshotGenerations(rt.worktreeStateDir(p))
		ws := api.WorktreeSnapshots{Worktree: p, Kept: len(gens)}
		for _, n := range gens {
			if ws.Oldest == 0 || n < ws.Oldest {
				ws.Oldest = n
			}
			ws.Newest = max(ws.Newest, n)
		}
		r.Snapshots = append(r.Snapshots, ws)
	}
	return r
}

// worktreeStateDir is gitguard's StateDir of the worktree at path.
func (rt *Runtime) worktreeStateDir(path string) string {
	return filepath.Join(rt.cfg.RuntimeDir, "worktrees", pathKey(path))
}

func blocksOf(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
