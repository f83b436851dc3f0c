package layers

// Retention: which fenced generations' layers stay (pinned ones, whose
// edits exist nowhere else; the newest under Config.Keep and KeepBytes)
// and which go (Prune), and what the kept ones cost on disk.

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/shimdev/shim/api"
	"golang.org/x/sys/unix"
)

// Pin keeps generation gen's layers whatever --keep-layers says (its
// worktree layer could not be saved as a commit, why): only a person
// removes DIR/pinned/<gen>, once the layer is recovered. The file holds
// why (as much as fits: a full disk may leave it empty).
func (l *Layers) Pin(gen uint64, why string) error {
	d := filepath.Join(l.cfg.Dir, "pinned")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return err
	}
	p := filepath.Join(d, strconv.FormatUint(gen, 10))
	// The reason goes in first, then the pin takes effect (a rename): a
	// reader never sees a pin without its reason, unless the disk had no
	// room for one (then the pin alone).
	if err := os.WriteFile(p+".tmp", []byte(why+"\n"), 0o600); err == nil {
		if err := os.Rename(p+".tmp", p); err == nil {
			return nil
		}
	}
	os.Remove(p + ".tmp")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// PinnedLayer is a pinned generation's layers: where they are, why they
// are kept, what they take.
type PinnedLayer = api.PinnedLayer

// Pinned lists the pinned layers, oldest first (at most 100: a person
// has more to do than read a longer list).
func (l *Layers) Pinned() []PinnedLayer {
	es, _ := os.ReadDir(filepath.Join(l.cfg.Dir, "pinned"))
	var out []PinnedLayer
	for _, e := range es {
		n, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil {
			continue // a reason being written (.tmp)
		}
		b, _ := os.ReadFile(filepath.Join(l.cfg.Dir, "pinned", e.Name()))
		if len(b) > 4096 {
			b = b[:4096]
		}
		out = append(out, PinnedLayer{Generation: n, Why: strings.TrimSpace(string(b))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Generation < out[j].Generation })
	if len(out) > 100 {
		out = out[:100]
	}
	for i := range out {
		out[i].Bytes = l.layerBytes(out[i].Generation, 1<<62)
	}
	return out
}

func (l *Layers) pinned(gen uint64) bool {
	_, err := os.Lstat(filepath.Join(l.cfg.Dir, "pinned", strconv.FormatUint(gen, 10)))
	return err == nil
}

// Prune keeps the layers of the newest Keep fenced generations below
// current, as many of them as fit in KeepBytes beside the pinned ones
// (and every generation at or above it, every one live says is not fenced
// yet, and the pinned ones), and removes the rest.
func (l *Layers) Prune(current uint64, live func(uint64) bool) error {
	l.pruneMu.Lock() // one at a time: fences may end close together
	defer l.pruneMu.Unlock()
	gens := map[uint64]bool{}
	collect := func(dir string) {
		es, _ := os.ReadDir(dir)
		for _, e := range es {
			if n, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && n < current && !l.pinned(n) && !live(n) {
				gens[n] = true
			}
		}
	}
	collect(l.rootDir())
	keys, _ := os.ReadDir(filepath.Join(l.cfg.Dir, "wt"))
	for _, k := range keys {
		collect(filepath.Join(l.cfg.Dir, "wt", k.Name()))
	}
	var old []uint64
	for n := range gens {
		old = append(old, n)
	}
	sort.Slice(old, func(i, j int) bool { return old[i] > old[j] })
	var errs []error
	var kept int64
	if l.cfg.KeepBytes > 0 {
		// Pinned layers stay whatever they take, and take from the
		// bound first: the forensic ones go before they would.
		for _, p := range l.Pinned() {
			kept += p.Bytes
		}
	}
	var keep []uint64
	for i, n := range old {
		if i < l.cfg.Keep && l.cfg.KeepBytes > 0 {
			kept += l.layerBytes(n, l.cfg.KeepBytes-kept)
		}
		if i >= l.cfg.Keep || (l.cfg.KeepBytes > 0 && kept > l.cfg.KeepBytes) {
			errs = append(errs, l.Remove(n))
		} else {
			keep = append(keep, n)
		}
	}
	for i := len(keep) - 1; i >= 0 && l.shortOfRoom(); i-- {
		errs = append(errs, l.Remove(keep[i])) // the oldest kept first
	}
	return errors.Join(errs...)
}

// shortOfRoom reports whether Dir's filesystem has less room available
// than MinFree.
func (l *Layers) shortOfRoom() bool {
	if l.cfg.MinFree <= 0 {
		return false
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(l.cfg.Dir, &fs); err != nil {
		return false
	}
	return int64(fs.Bavail)*int64(fs.Bsize) < l.cfg.MinFree
}

// layerBytes is what generation gen's layers take on their filesystems
// (blocks, not apparent sizes): its root layer's tmpfs as statfs counts
// it, its worktree layers walked. A walk stops once it has counted more
// than limit bytes or met maxPruneWalk entries (a million empty files
// cost blocks of inodes, not bytes): more than limit, then.
func (l *Layers) layerBytes(gen uint64, limit int64) int64 {
	g := strconv.FormatUint(gen, 10)
	var n int64
	rd := filepath.Join(l.rootDir(), g)
	var fs unix.Statfs_t
	if mounted(rd) && unix.Statfs(rd, &fs) == nil {
		n += int64(fs.Blocks-fs.Bfree) * int64(fs.Bsize)
	} else {
		n += treeBytes(rd, limit-n)
	}
	keys, _ := os.ReadDir(filepath.Join(l.cfg.Dir, "wt"))
	for _, k := range keys {
		if n > limit {
			break
		}
		d := filepath.Join(l.cfg.Dir, "wt", k.Name(), g)
		if used, _, _, ok := l.Usage(filepath.Join(d, "upper")); ok {
			n += used
		} else {
			n += treeBytes(d, limit-n)
		}
	}
	return n
}

// treeBytes sums the blocks of the tree at dir (nothing followed), up to
// just over limit; a tree of more than maxPruneWalk entries counts as
// more than limit.
func treeBytes(dir string, limit int64) int64 {
	var n int64
	seen := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if seen++; seen > maxPruneWalk {
			n = limit + 1
			return filepath.SkipAll
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			n += st.Blocks * 512
		}
		if n > limit {
			return filepath.SkipAll
		}
		return nil
	})
	return n
}
