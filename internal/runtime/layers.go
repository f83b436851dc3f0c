package runtime

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/gitguard"
	"github.com/shimdev/shim/internal/layers"
)

// maxLayerPaths bounds the paths a fence report lists of a root layer.
const maxLayerPaths = 200

// maxLayerWalk bounds the entries of a root layer the fence looks at.
const maxLayerWalk = 10000

// probeLayers decides the isolation mode once, at start: layers when
// shim was given a layers dir and a child can get them here (the probe
// mounts a root layer and pivots into it), scan otherwise, with the
// reason.
func (l *launcher) probeLayers() {
	iso := api.Isolation{Mode: layers.ModeScan}
	switch ly := l.rt.layers; {
	case ly == nil:
		iso.Reason = "layers are off (shim init --isolation scan)"
	default:
		reason := ly.Probe(context.Background(), l.cfg.ShimPath, func(cmd *exec.Cmd) error {
			return l.cfg.Reaper.Run(context.Background(), cmd, nil)
		})
		reason = layersRefused(reason, gitguard.CurrentOwnerGuard().Mode)
		if reason == "" {
			iso = api.Isolation{Mode: layers.ModeLayers, Dir: ly.Dir(), RootLayerBytes: ly.RootSize(), Persist: ly.Persist(),
				WorktreeLayerBytes: ly.WorktreeSize(), KeepLayers: ly.Keep(), KeepLayersBytes: ly.KeepBytes()}
		} else {
			iso.Reason = "a generation cannot get copy-on-write layers here: " + reason
			l.rt.log.Warn("generations share the sandbox's filesystem (isolation scan)", "reason", reason)
		}
	}
	l.rt.mu.Lock()
	l.rt.iso = iso
	l.rt.mu.Unlock()
}

// layersRefused is why a generation gets no layers ("" for layers): the
// layer probe's reason, or, where layers would work but shim's gits of a
// worktree's owner hold no ambient capability (the owner guard), that: a
// harness could reopen a file of the lower's view that one of them holds
// open (/proc/<git>/fd/N, which gVisor's rule leaves open). Fail closed.
func layersRefused(probe, guard string) string {
	if probe == "" && guard != gitguard.GuardAmbientCap {
		return "shim's gits of a worktree's owner hold no ambient capability here (status: weakened), " +
			"so the lower's view would be within a harness's reach through one"
	}
	return probe
}

func (rt *Runtime) isolationLocked() api.Isolation {
	if rt.iso.Mode == "" {
		// The start-up probe has not finished; the first announcement
		// waits for it.
		return api.Isolation{Mode: "probing"}
	}
	return rt.iso
}

// layered reports whether generations get layers.
func (rt *Runtime) layered() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.iso.Mode == layers.ModeLayers
}

// layeredWorktrees are the worktrees generation n gets a layer on: the
// announcement's, when its repository lives inside it. ok is false
// without layers; an announcement that requires them is then refused.
func (l *launcher) layeredWorktrees(n uint64, req api.StartRequest) (wts []string, ok bool, err error) {
	rt := l.rt
	if !rt.layered() {
		if req.RequireIsolation || l.cfg.RequireIsolation {
			rt.mu.Lock()
			why := rt.isolationLocked().Reason
			rt.mu.Unlock()
			return nil, false, errs.New(api.CodeIsolationUnavailable, "generation %d needs its own layers and this sandbox cannot give them: %s", n, why)
		}
		return nil, false, nil
	}
	if req.Worktree != "" {
		if wt := rt.registered(req.Worktree); wt != nil && wt.LayerCapable() {
			wts = []string{filepath.Clean(req.Worktree)}
		}
	}
	return wts, true, nil
}

// checkLayersDisk is the start's check that the layers dir can still take
// generation n's layers. When it cannot (its filesystem read-only after an
// error, failing, full), a generation that requires layers is refused
// (ISOLATION_UNAVAILABLE, naming the disk); otherwise the sandbox drops to
// the scan for good (dropLayers): a lost disk harms no later generation.
func (l *launcher) checkLayersDisk(n uint64, req api.StartRequest) error {
	rt := l.rt
	if !rt.layered() {
		return nil
	}
	room := rt.roomForLayers(n) // first: a full disk may be the fenced layers', pruned there
	why := l.rt.layers.Unusable()
	if why == "" {
		why = room
	}
	if why == "" {
		return nil
	}
	if req.RequireIsolation || l.cfg.RequireIsolation {
		return errs.New(api.CodeIsolationUnavailable, "generation %d needs its own layers and %s", n, why)
	}
	rt.dropLayers(why)
	return nil
}

// roomForLayers makes sure the layers reserve is held before generation n
// starts, so that its harness cannot take the room the next fence needs.
// Where a harness left less room than the reserve, the fenced
// generations' saved layers are pruned first (now, not after the answer:
// the forensic copies go before the next generation is short of room). It
// says why when the reserve cannot be held: layers would starve every
// later fence.
func (rt *Runtime) roomForLayers(n uint64) string {
	r := rt.layersReserve
	if r == nil || r.size <= 0 {
		return ""
	}
	if r.short() {
		rt.pruneLayers(n)
	}
	if r.ensure() {
		return ""
	}
	return fmt.Sprintf("the filesystem of the layers dir %s has no room for the reserve the fences need (%d bytes; a layer whose edits are saved nowhere else is pinned there, or something beside shim filled it)",
		rt.layers.Dir(), r.size)
}

// letGoIfShort lets the fenced generations' layers go now rather than
// once the announcement is answered when a harness left the layers'
// filesystem short of room: an overlay still mounted pins the files it
// looked up, and pruning its layer before the next start (roomForLayers)
// would free nothing.
func (rt *Runtime) letGoIfShort(a *announcement) {
	if len(a.held) == 0 || !rt.layersReserve.short() {
		return
	}
	for _, h := range a.held {
		h.release()
	}
	a.held = nil
}

// dropLayers turns layers off for the rest of this shim's life: status
// says isolation scan and why, every locked lower is unlocked (the next
// harnesses work in the checkouts themselves, restored by the scan) and
// every worktree's guard is opened again on the checkout itself.
func (rt *Runtime) dropLayers(why string) {
	rt.mu.Lock()
	rt.iso = api.Isolation{Mode: layers.ModeScan, Reason: "layers were lost: " + why}
	var paths []string
	for p := range rt.worktrees {
		paths = append(paths, p)
	}
	for _, p := range paths {
		delete(rt.worktrees, p) // opened again, without the view, when next named
	}
	rt.mu.Unlock()
	for _, p := range paths {
		if err := rt.layers.UnlockLower(p); err != nil {
			rt.log.Error("a lower could not be unlocked", "worktree", p, "error", err)
		}
	}
	rt.log.Error("the layers dir cannot take layers any more; generations share the sandbox's filesystem from now on (isolation scan)", "why", why)
	rt.audit.Record("layers_lost", 0, map[string]any{"why": why}, true)
}

// isLive reports whether generation n is not fenced yet (its layers may
// still be needed).
func (rt *Runtime) isLive(n uint64) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	_, ok := rt.gens[n]
	return ok
}

// registered is the worktree registered at path, nil when none is.
func (rt *Runtime) registered(path string) worktree {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.worktrees[filepath.Clean(path)]
}

// worktreeLayer is the layer generation g had on the worktree at path:
// the one its plan named or, for a generation adopted from a previous
// shim, the one that shim laid out for it. "" when it had none (the
// worktree is restored by the scan).
func (rt *Runtime) worktreeLayer(g *generation, path string) string {
	path = filepath.Clean(path)
	if g.layers != nil {
		for _, w := range g.layers.Worktrees {
			if w.Path == path {
				return w.Upper
			}
		}
		return ""
	}
	if rt.layers == nil || g.proc != nil {
		return ""
	}
	up := rt.layers.WorktreeUpper(path, g.n)
	if st, err := os.Lstat(up); err == nil && st.IsDir() {
		return up
	}
	return ""
}

// restoreLayer is the restore step of a generation that had a worktree
// layer: the lower is checked (checkLower), the layer becomes its
// snapshot; the lower, which nothing but shim can write, is at the
// generation's baseline already. Only when the announcement moves the
// baseline or asks for the push check does the scan restore run too (on a
// clean worktree, reusing the snapshot), and when the lower's lock was
// found gone (then saving what differs into the snapshot).
func (rt *Runtime) restoreLayer(ctx context.Context, f *fenceRun, wt worktree, rev string, fetch *fetchSpec, upper string) (*api.WorktreeReport, error) {
	lower, err := rt.checkLower(ctx, f, wt)
	if err != nil {
		return nil, err
	}
	rep, err := rt.snapshotLayer(ctx, f, wt, upper)
	if err != nil || rep == nil {
		return rep, err
	}
	rep.Lower = lower
	target := rep.Baseline
	if rev != "" && rev != "HEAD" && rev != rep.BaselineRev {
		if target, err = wt.ResolveBaseline(ctx, rev); err != nil {
			return rep, err
		}
	}
	unlocked := lower != nil && !lower.Locked
	if fetch == nil && target == rep.Baseline && !unlocked {
		return rep, nil
	}
	rt.lowerMoves(f)
	var scan *api.WorktreeReport
	if unlocked {
		// Anyone may have written the lower while it was not locked: the
		// scan restore saves what differs into the snapshot (it extends
		// the layer's) and resets it.
		scan, err = wt.Restore(ctx, f.g.n, target, fetch)
	} else {
		scan, err = wt.Move(ctx, f.g.n, target, fetch)
	}
	if scan != nil {
		rep.Baseline, rep.Fetch, rep.Cleaned, rep.MetadataRestored = scan.Baseline, scan.Fetch, scan.Cleaned, scan.MetadataRestored
		if unlocked {
			rep.SnapshotCommit, rep.Paths, rep.PathsTruncated = scan.SnapshotCommit, append(rep.Paths, scan.Paths...), rep.PathsTruncated || scan.PathsTruncated
			rep.Modified, rep.Added, rep.Deleted = rep.Modified+scan.Modified, rep.Added+scan.Added, rep.Deleted+scan.Deleted
		}
		for k, v := range scan.DurationsMS {
			if _, ok := rep.DurationsMS[k]; !ok {
				rep.DurationsMS[k] = v
			}
		}
	}
	return rep, err
}

// checkLower confirms, before its snapshot, that a layered worktree's
// lower is what every generation must find: still locked (read-only to
// every process but shim's; layers.CheckLower), its git metadata the
// trusted copy (what differs is put back and reported). A lock found gone
// is made again, and the caller restores the lower by the scan; a lock
// that cannot be made again, or metadata that cannot be checked, fails
// the restore (the generation is dead already: fail closed).
func (rt *Runtime) checkLower(ctx context.Context, f *fenceRun, wt worktree) (*api.LowerCheck, error) {
	if rt.layers == nil {
		return nil, nil
	}
	path := wt.Registration().Worktree
	began := time.Now()
	lc := &api.LowerCheck{Locked: true}
	if err := rt.layers.CheckLower(path); err != nil {
		lc.Locked, lc.Error = false, err.Error()
		rt.log.Error("the lower of a layered worktree was not locked any more; it is locked again and restored by the scan", "worktree", path, "error", err)
		rt.audit.Record("lower_unlocked", f.g.n, map[string]any{"worktree": path, "error": err.Error()}, true)
		if _, lerr := rt.layers.LockLower(path); lerr != nil {
			return nil, errs.New(api.CodeRestoreFailed, "generation %d was fenced; the lower of worktree %s is not locked (%v) and cannot be locked again: %v", f.g.n, path, err, lerr)
		}
		wt.ForgetKnown() // anyone may have written its objects meanwhile
	}
	changed, err := wt.VerifyLower(ctx)
	if err != nil {
		return nil, errs.New(api.CodeRestoreFailed, "generation %d was fenced; the git metadata of the lower of worktree %s cannot be checked: %v", f.g.n, path, err)
	}
	lc.MetadataRestored = append([]string{}, changed...)
	if len(changed) > 0 {
		rt.log.Error("the lower's git metadata differed from the trusted copy; put back", "worktree", path, "restored", changed)
		rt.audit.Record("lower_metadata_restored", f.g.n, map[string]any{"worktree": path, "restored": changed}, true)
	}
	lc.VerifyMS = float64(time.Since(began).Microseconds()) / 1000
	return lc, nil
}

// snapshotLayer makes generation f.g's worktree layer (upper) its
// snapshot. A snapshot the harness made impossible (a full disk) does not
// fail the fence: the layer is pinned and the report says where.
func (rt *Runtime) snapshotLayer(ctx context.Context, f *fenceRun, wt worktree, upper string) (*api.WorktreeReport, error) {
	rt.mu.Lock()
	base := f.g.baseline
	rt.mu.Unlock()
	if base == "" {
		base = "HEAD" // the lower's: no harness wrote it
	}
	rep, err := wt.SnapshotLayer(ctx, f.g.n, base, upper)
	if rep != nil && rt.layers != nil {
		if used, limit, full, ok := rt.layers.Usage(upper); ok {
			rep.LayerBytes, rep.LayerLimitBytes, rep.LayerFull = used, limit, full
			if full {
				rt.log.Warn("the generation filled its worktree layer; its snapshot holds what fit", "generation", f.g.n, "bytes", used)
			}
		}
	}
	if err != nil && rep != nil && rep.Baseline != "" && rt.layers != nil {
		// The harness can make its layer unsavable (it filled the disk the
		// commit needs): that must not stop its fence. The checkout was
		// never written, so the restore holds; the layer is kept, pinned,
		// and the report and the audit log say where.
		rep.SnapshotError, rep.LayerDir = err.Error(), filepath.Dir(upper)
		rep.SnapshotRef, rep.SnapshotCommit = "", ""
		if perr := rt.layers.Pin(f.g.n, "its snapshot failed: "+err.Error()); perr != nil {
			return rep, errs.New(api.CodeRestoreFailed, "%v, and its layer could not be pinned: %v", err, perr)
		}
		rt.log.Error("the worktree layer could not be saved as a commit; it is kept", "generation", f.g.n, "layer", rep.LayerDir, "error", err)
		rt.audit.Record("snapshot_failed", f.g.n, map[string]any{"layer": rep.LayerDir, "error": err.Error()}, true)
		err = nil
	}
	return rep, err
}

// rootLayerReport lists what generation g wrote outside its worktree and
// the shared paths (its root layer), for the fence report.
func (rt *Runtime) rootLayerReport(g *generation) *api.LayerReport {
	if rt.layers == nil || (g.layers == nil && g.proc != nil) {
		return nil
	}
	up := rt.layers.RootUpper(g.n)
	if _, err := os.Lstat(up); err != nil {
		return nil
	}
	rep := &api.LayerReport{Dir: up, Kept: rt.layers.Keep() > 0}
	// Its size is its tmpfs's, from statfs; the walk that lists it stops
	// after maxLayerWalk entries (a million empty files cost the fence
	// nothing).
	var fs unix.Statfs_t
	statfsOK := unix.Statfs(filepath.Dir(up), &fs) == nil
	if statfsOK {
		rep.Bytes = int64(fs.Blocks-fs.Bfree) * int64(fs.Bsize)
	}
	seen := 0
	filepath.WalkDir(up, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == up {
			return nil
		}
		if seen++; seen > maxLayerWalk {
			rep.PathsTruncated = true
			return filepath.SkipAll
		}
		rel := "/" + strings.TrimPrefix(p, up+"/")
		info, ierr := d.Info()
		if ierr != nil {
			return nil
		}
		st, _ := info.Sys().(*syscall.Stat_t)
		entry := rel
		switch {
		case info.Mode()&os.ModeCharDevice != 0 && st != nil && st.Rdev == 0:
			entry += " (deleted)"
		case info.Mode().IsRegular():
			if !statfsOK {
				rep.Bytes += info.Size()
			}
		case d.IsDir():
			if !opaque(p) {
				return nil // only its contents changed
			}
		}
		if len(rep.Paths) >= maxLayerPaths {
			rep.PathsTruncated = true
			return nil
		}
		rep.Paths = append(rep.Paths, entry)
		return nil
	})
	sort.Strings(rep.Paths)
	return rep
}

func opaque(dir string) bool {
	var v [8]byte
	n, err := unix.Lgetxattr(dir, "trusted.overlay.opaque", v[:])
	return err == nil && n == 1 && v[0] == 'y'
}

// heldMounts holds a layered generation's mount namespace open from its
// start, so that its overlays outlive its last process. Without it that
// process unmounts them on its way out, before the kernel counts it out
// of the cgroup, and overlayfs syncs the whole filesystem of its upper
// then: the fence's kill waited for that sync of the layers' filesystem
// (25 ms at 100 files, 85 ms at 5,000 on a container's volume, growing
// with whatever else that filesystem has to write). The fence reads the
// layer from its upper directory, which needs no unmount, and lets the
// namespace go after the snapshot, once the announcement that fenced it
// is answered (announcement.held); before that only when the lower is
// about to move (no overlay may be mounted on a lower that changes).
type heldMounts struct {
	once sync.Once
	f    *os.File
	ipc  *os.File // its IPC namespace, which tool calls enter too; nil when the stub sent none
}

// release lets the namespace go: the unmounts (and their sync) run in the
// calling goroutine's thread, now, if nothing else holds it.
func (h *heldMounts) release() {
	if h == nil {
		return
	}
	h.once.Do(func() {
		h.f.Close()
		if h.ipc != nil {
			h.ipc.Close()
		}
	})
}

// releasing are the held namespaces let go of in the background.
type releasing struct {
	mu      sync.Mutex
	pending []*heldMounts
}

// later lets hs go in the background, after the caller's answer.
func (r *releasing) later(hs []*heldMounts) {
	if len(hs) == 0 {
		return
	}
	r.mu.Lock()
	r.pending = append(r.pending, hs...)
	r.mu.Unlock()
	go r.now()
}

// now lets every pending one go, and returns once they are gone: one
// another goroutine is letting go of right now is waited for (release is
// a sync.Once, whose callers wait for the first), so each stays pending
// until it is gone.
func (r *releasing) now() {
	r.mu.Lock()
	hs := append([]*heldMounts(nil), r.pending...)
	r.mu.Unlock()
	for _, h := range hs {
		h.release()
	}
	r.mu.Lock()
	r.pending = slices.DeleteFunc(r.pending, func(h *heldMounts) bool { return slices.Contains(hs, h) })
	r.mu.Unlock()
}

// lowerMoves is called before a restore moves f's worktree's lower: no
// overlay of it may stay mounted, not f's generation's, nor one an
// earlier announcement is still letting go of.
func (rt *Runtime) lowerMoves(f *fenceRun) {
	f.g.mounts.release()
	rt.released.now()
}

// keepLayer reports whether generation n's layers must stay: it is not
// fenced yet, or its worktree layers' edits exist nowhere else (a marker
// that names no snapshot, a snapshot ref that does not name the marker's
// commit: a power cut before the ref was synced, a ref removed by hand).
// Such a layer is pinned, and status and the log say why. A layer of a
// worktree this shim has not registered is kept, unpinned, until it is.
func (rt *Runtime) keepLayer(n uint64) bool {
	if rt.isLive(n) {
		return true
	}
	for key, dir := range rt.layers.WorktreeLayers(n) {
		why := rt.layerUnsaved(n, key, dir)
		if why == "" {
			continue
		}
		if why == errUnknownWorktree {
			return true // kept, not pinned: decided once the worktree is registered again
		}
		if err := rt.layers.Pin(n, why); err != nil {
			rt.log.Error("a layer whose edits are saved nowhere else could not be pinned; it is kept", "generation", n, "layer", dir, "error", err)
		} else {
			rt.log.Error("a worktree layer's snapshot is not confirmed; the layer is pinned", "generation", n, "layer", dir, "why", why)
			rt.audit.Record("layer_pinned", n, map[string]any{"layer": dir, "why": why}, true)
		}
		return true
	}
	return false
}

// errUnknownWorktree is layerUnsaved's answer for a layer of a worktree
// this shim has not registered (yet: a restarted shim registers a
// worktree when it is next named): its snapshot cannot be checked now.
const errUnknownWorktree = "its worktree is not registered with this shim"

// layerUnsaved says why generation n's worktree layer at dir (worktree
// key) is not known saved, "" when its snapshot is confirmed.
func (rt *Runtime) layerUnsaved(n uint64, key, dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "snapshot"))
	commit := strings.TrimSpace(string(b))
	if commit == "" {
		// the marker could not be written (a full disk): the fence
		// recorded the snapshot in the generation's record too
		commit = rt.recordedSnapshot(n, key)
	}
	if commit == "" {
		if up, err := os.ReadDir(filepath.Join(dir, "upper")); err == nil && len(up) == 0 {
			return "" // an empty layer: nothing to lose
		}
		return "no snapshot of this layer is recorded beside it"
	}
	rt.mu.Lock()
	var wt worktree
	for p, w := range rt.worktrees {
		if layers.WorktreeKey(p) == key {
			wt = w
		}
	}
	rt.mu.Unlock()
	if wt == nil {
		return errUnknownWorktree
	}
	ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.GitTimeout)
	defer cancel()
	if !wt.SnapshotIs(ctx, n, commit) {
		return fmt.Sprintf("refs/shim/abandoned/%d does not name its snapshot %s (an empty or broken ref, a missing object)", n, commit)
	}
	return ""
}

// recordedSnapshot is the snapshot commit generation n's fence report
// (gen/<N>/generation.json) gives for the worktree of layers key key, ""
// when it gives none.
func (rt *Runtime) recordedSnapshot(n uint64, key string) string {
	var rec api.Generation
	if readJSON(filepath.Join(rt.genDir(n), "generation.json"), &rec) != nil || rec.Fence == nil || rec.Fence.Worktree == nil {
		return ""
	}
	if w := rec.Fence.Worktree; layers.WorktreeKey(w.Worktree) == key {
		return w.SnapshotCommit
	}
	return ""
}
