package runtime

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/shimdev/shim/internal/layers"
)

// fakeLayers is the layers dir (layerSet) as the decisions see it: what
// the kernel would answer is set by the test, what the runtime asks is
// journaled. Layers live under dir, a temporary directory, so the
// decisions that look at a layer's files find real ones.
type fakeLayers struct {
	j   *journal
	dir string
	mu  sync.Mutex
	// Set by tests: what each call answers (zero: success).
	probe, unusable                       string
	planErr, lockErr, checkErr, unlockErr error
	pinErr, pruneErr                      error
	usage                                 *fakeUsage
	group                                 uint32
	keep                                  int
	pins                                  map[uint64]string
	prunedLive                            map[uint64]bool // Prune's answers of live, by generation
}

type fakeUsage struct {
	used, limit int64
	full        bool
}

func newFakeLayers(j *journal, dir string) *fakeLayers {
	return &fakeLayers{j: j, dir: dir, pins: map[uint64]string{}, prunedLive: map[uint64]bool{}}
}

func (l *fakeLayers) Probe(context.Context, string, func(*exec.Cmd) error) string {
	return l.probe
}
func (l *fakeLayers) Unusable() string { return l.unusable }

func (l *fakeLayers) NewPlan(gen uint64, wts []string) (*layers.Plan, error) {
	l.j.add("plan %d %v", gen, wts)
	if l.planErr != nil {
		return nil, l.planErr
	}
	p := &layers.Plan{Generation: gen}
	for _, w := range wts {
		p.Worktrees = append(p.Worktrees, layers.WorktreeLayer{Path: w, Upper: l.WorktreeUpper(w, gen)})
	}
	return p, nil
}

func (l *fakeLayers) Remove(gen uint64) error {
	l.j.add("remove-layers %d", gen)
	return nil
}

func (l *fakeLayers) RootUpper(gen uint64) string {
	return filepath.Join(l.dir, "root", strconv.FormatUint(gen, 10), "upper")
}

func (l *fakeLayers) WorktreeUpper(path string, gen uint64) string {
	return filepath.Join(l.dir, "wt", layers.WorktreeKey(path), strconv.FormatUint(gen, 10), "upper")
}

// WorktreeLayers are the worktree layer dirs of gen that exist under dir.
func (l *fakeLayers) WorktreeLayers(gen uint64) map[string]string {
	out := map[string]string{}
	keys, _ := filepath.Glob(filepath.Join(l.dir, "wt", "*", strconv.FormatUint(gen, 10)))
	for _, d := range keys {
		out[filepath.Base(filepath.Dir(d))] = d
	}
	return out
}

func (l *fakeLayers) Usage(string) (used, limit int64, full, ok bool) {
	if l.usage == nil {
		return 0, 0, false, false
	}
	return l.usage.used, l.usage.limit, l.usage.full, true
}

func (l *fakeLayers) Pin(gen uint64, why string) error {
	l.j.add("pin %d", gen)
	if l.pinErr != nil {
		return l.pinErr
	}
	l.mu.Lock()
	l.pins[gen] = why
	l.mu.Unlock()
	return nil
}

func (l *fakeLayers) Pinned() []layers.PinnedLayer {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []layers.PinnedLayer
	for n, why := range l.pins {
		out = append(out, layers.PinnedLayer{Generation: n, Why: why})
	}
	return out
}

// Prune asks live about every generation below current, as the real one
// asks about each layer it would remove.
func (l *fakeLayers) Prune(current uint64, live func(uint64) bool) error {
	l.j.add("prune %d", current)
	for n := uint64(1); n < current; n++ {
		keep := live(n)
		l.mu.Lock()
		l.prunedLive[n] = keep
		l.mu.Unlock()
	}
	return l.pruneErr
}

func (l *fakeLayers) LockLower(path string) (string, error) {
	l.j.add("lock-lower %s", path)
	if l.lockErr != nil {
		return "", l.lockErr
	}
	return filepath.Join(l.dir, "view", layers.WorktreeKey(path)), nil
}

func (l *fakeLayers) CheckLower(path string) error {
	l.j.add("check-lower %s", path)
	return l.checkErr
}

func (l *fakeLayers) UnlockLower(path string) error {
	l.j.add("unlock-lower %s", path)
	return l.unlockErr
}

func (l *fakeLayers) LowerGroup() uint32  { return l.group }
func (l *fakeLayers) Dir() string         { return l.dir }
func (l *fakeLayers) RootSize() int64     { return 1 << 30 }
func (l *fakeLayers) WorktreeSize() int64 { return 2 << 30 }
func (l *fakeLayers) Persist() []string   { return []string{"/persist"} }
func (l *fakeLayers) Keep() int           { return l.keep }
func (l *fakeLayers) KeepBytes() int64    { return 0 }

// withLayers gives f's runtime fake layers and isolation layers, as a
// probe that found them usable would.
func (f *fixture) withLayers() *fakeLayers {
	f.t.Helper()
	ly := newFakeLayers(f.j, f.t.TempDir())
	f.rt.layers = ly
	f.rt.mu.Lock()
	f.rt.iso.Mode = layers.ModeLayers
	f.rt.mu.Unlock()
	return ly
}
