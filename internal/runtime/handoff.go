package runtime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// The hand-off: every generation that follows another is told, in its
// environment and in a small file, what the one before it left (its
// snapshot, what it changed, whether it pushed: api.Abandoned). It is
// built from the fence report, written durably before the generation
// starts, and holds no secret.

// Environment variables of the hand-off. Any the supervisor set are
// replaced: these are shim's.
const (
	EnvPreviousGeneration     = "SHIM_PREVIOUS_GENERATION"
	EnvPreviousSnapshotRef    = "SHIM_PREVIOUS_SNAPSHOT_REF"
	EnvPreviousSnapshotCommit = "SHIM_PREVIOUS_SNAPSHOT_COMMIT"
	EnvPreviousPushed         = "SHIM_PREVIOUS_PUSHED"
	EnvAbandonedFile          = "SHIM_ABANDONED_FILE"
)

// Bounds of a hand-off file: it is read by an agent, not a forensic
// record (that is the fence report, in gen/<N>/generation.json).
const (
	handoffMaxPaths     = 100
	handoffMaxPathBytes = 64 << 10
)

// withHandoff is env for generation n's processes with the hand-off of
// the generation before it: the file written (durably, before anything of
// n runs, readable by user only) and the variables that name it. fenced
// are the reports of the announcement that starts n; when it fenced
// nothing (an earlier fence or end did), the newest record below n is
// used. With no generation before n, env comes back as it is, minus any
// hand-off variable the supervisor set. Every start of a generation calls
// it, whatever runs in it (a harness, or only tool calls). The file's
// name is durable once names is committed (the start's batch).
func (rt *Runtime) withHandoff(env []string, n uint64, user string, fenced []api.FenceReport, names *durableBatch) ([]string, error) {
	env = withoutHandoffEnv(env)
	rep := rt.previousReport(n, fenced)
	if rep == nil {
		return env, nil
	}
	h := abandonedFrom(n, rep)
	cred, _, err := lookupUser(user)
	if err != nil {
		return nil, err
	}
	// No user: the harness runs as shim's own uid (root in production;
	// the user running the unit tests otherwise).
	uid, gid := os.Geteuid(), os.Getegid()
	if cred != nil {
		uid, gid = int(cred.Uid), int(cred.Gid)
	}
	path, err := writeHandoffFile(filepath.Join(rt.cfg.RuntimeDir, "handoff"), h, uid, gid, names)
	switch {
	case err != nil && isNoSpace(err):
		// A full runtime dir (a harness can fill the filesystem it is
		// on) never stops a start: the fence's reserve is not spent on
		// this, and the variables still say where the work went.
		rt.log.Warn("hand-off file not written: the runtime dir's filesystem is full; the generation gets the hand-off in its environment only",
			"generation", n, "error", err)
		rt.audit.Record("handoff_not_written", n, map[string]any{"previous": h.PreviousGeneration, "error": err.Error()}, false)
		path = ""
	case err != nil:
		return nil, errs.New(api.CodeStartFailed, "generation %d: the hand-off of generation %d could not be written: %v", n, h.PreviousGeneration, err)
	}
	return handoffEnv(env, h, path), nil
}

// writeHandoffFile is writeHandoff; the tests fill the disk through it.
var writeHandoffFile = writeHandoff

// handoffEnv adds h's variables to env (which has none of them), and
// SHIM_ABANDONED_FILE when path is not "".
func handoffEnv(env []string, h *api.Abandoned, path string) []string {
	out := append(slices.Clip(env),
		EnvPreviousGeneration+"="+strconv.FormatUint(h.PreviousGeneration, 10),
		EnvPreviousPushed+"="+h.Pushed)
	if path != "" {
		out = append(out, EnvAbandonedFile+"="+path)
	}
	if h.SnapshotRef != "" {
		out = append(out, EnvPreviousSnapshotRef+"="+h.SnapshotRef, EnvPreviousSnapshotCommit+"="+h.SnapshotCommit)
	}
	return out
}

// withoutHandoffEnv is env without any hand-off variable, in a new slice.
func withoutHandoffEnv(env []string) []string {
	out := make([]string, 0, len(env)+5)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case EnvPreviousGeneration, EnvPreviousSnapshotRef, EnvPreviousSnapshotCommit, EnvPreviousPushed, EnvAbandonedFile:
			continue
		}
		out = append(out, kv)
	}
	return out
}

// previousReport is the fence report of the generation n follows: the
// newest fenced by n's own announcement, else the newest record below n
// that has one (n was announced after a fence or end that fenced it).
func (rt *Runtime) previousReport(n uint64, fenced []api.FenceReport) *api.FenceReport {
	var best *api.FenceReport
	for i := range fenced {
		if fenced[i].Generation < n && (best == nil || fenced[i].Generation > best.Generation) {
			best = &fenced[i]
		}
	}
	if best != nil {
		return best
	}
	ents, _ := os.ReadDir(filepath.Join(rt.cfg.RuntimeDir, "gen"))
	var prev uint64
	for _, e := range ents {
		if m, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && m < n && m > prev {
			prev = m
		}
	}
	if prev == 0 {
		return nil
	}
	var rec api.Generation
	if readJSON(filepath.Join(rt.genDir(prev), "generation.json"), &rec) != nil || rec.Fence == nil {
		return nil
	}
	return rec.Fence
}

// abandonedFrom is the hand-off to generation n of the fence report rep.
func abandonedFrom(n uint64, rep *api.FenceReport) *api.Abandoned {
	h := &api.Abandoned{Generation: n, PreviousGeneration: rep.Generation, StateBefore: rep.StateBefore,
		Exit: rep.Exit, Pushed: api.PushedUnknown}
	if w := rep.Worktree; w != nil {
		h.Worktree, h.SnapshotRef, h.SnapshotCommit, h.Baseline = w.Worktree, w.SnapshotRef, w.SnapshotCommit, w.Baseline
		h.Modified, h.Added, h.Deleted, h.LocalCommits = w.Modified, w.Added, w.Deleted, w.LocalCommits
		h.SnapshotError = w.SnapshotError
		var size int
		for _, p := range w.Paths {
			if len(h.Paths) == handoffMaxPaths || size+len(p.Path) > handoffMaxPathBytes {
				h.PathsTruncated = true
				break
			}
			size += len(p.Path)
			h.Paths = append(h.Paths, p)
		}
		h.PathsTruncated = h.PathsTruncated || w.PathsTruncated
		if f := w.Fetch; f != nil {
			h.Remote, h.Branch = f.Remote, f.Branch
			switch {
			case f.Error != "":
			case f.RemoteMoved:
				h.Pushed, h.RemoteCommits = api.PushedYes, f.RemoteCommitCount
			default:
				h.Pushed = api.PushedNo
			}
		}
	} else if rep.SnapshotRef != "" {
		h.SnapshotRef, h.SnapshotCommit, h.Baseline = rep.SnapshotRef, rep.SnapshotCommit, rep.Baseline
	}
	if l := rep.Layer; l != nil {
		var size int
		for _, p := range l.Paths {
			if len(h.OutsidePaths) == handoffMaxPaths || size+len(p) > handoffMaxPathBytes {
				h.OutsidePathsTruncated = true
				break
			}
			size += len(p)
			h.OutsidePaths = append(h.OutsidePaths, p)
		}
		h.OutsidePathsTruncated = h.OutsidePathsTruncated || l.PathsTruncated
	}
	return h
}

// writeHandoff writes h to dir/<N>.json, owned by uid:gid, mode 0440,
// durably once names is committed (the file synced, renamed, the
// directory synced), and removes the
// hand-offs of older generations (each is read by its own generation
// only, and the fence report keeps everything they said). dir is root's,
// 0711: a harness may read its own file by name, and list or plant
// nothing.
func writeHandoff(dir string, h *api.Abandoned, uid, gid int, names *durableBatch) (string, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return "", err
	}
	name := strconv.FormatUint(h.Generation, 10) + ".json"
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o400)
	if err != nil {
		return "", err
	}
	err = writeAll(f, append(b, '\n'), uid, gid)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	names.putWritten(path) // synced and renamed with the batch
	pruneHandoffs(dir, h.Generation)
	return path, nil
}

func writeAll(f *os.File, b []byte, uid, gid int) error {
	if _, err := f.Write(b); err != nil {
		return err
	}
	if err := f.Chown(uid, gid); err != nil {
		return err
	}
	return f.Chmod(0o440)
}

// pruneHandoffs removes the hand-off files of generations below n.
func pruneHandoffs(dir string, n uint64) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		num, ok := strings.CutSuffix(e.Name(), ".json")
		if m, err := strconv.ParseUint(num, 10, 64); ok && err == nil && m < n {
			_ = os.Remove(filepath.Join(dir, e.Name())) // root's dir: only an I/O error fails it, and the next start tries again
		}
	}
}
