package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// reserve is space kept on the runtime dir's filesystem for shim's own
// state and audit writes: a file of preallocated blocks that is given up
// when a write finds the filesystem full (whatever filled it: a harness
// writing elsewhere on the same filesystem), so the fencing token and the
// fence's audit record are still written. It is taken again when there is
// room.
type reserve struct {
	mu   sync.Mutex
	path string
	size int64
	held bool
	// spared: writes running under spare, which never give the reserve up.
	spared int
}

// newReserve preallocates size bytes at path (size <= 0: no reserve). A
// filesystem that cannot preallocate (tmpfs can; some cannot) gets the
// file written out instead.
func newReserve(path string, size int64) (*reserve, error) {
	r := &reserve{path: path, size: size}
	if size <= 0 {
		return r, nil
	}
	return r, r.take()
}

// minReserve is the least reserve worth keeping: state.json and a fence's
// audit records take a few KiB.
const minReserve = 256 << 10

// take (re)creates the reserve file: its full size, or, on a filesystem
// with less room left (after the reserve was spent), what room there is
// down to minReserve. r.mu held or not yet shared.
func (r *reserve) take() error {
	err := r.takeSize(r.size)
	if err != nil && isNoSpace(err) {
		var st unix.Statfs_t
		if unix.Statfs(filepath.Dir(r.path), &st) == nil {
			if avail := int64(st.Bavail)*int64(st.Bsize) - minReserve/4; avail >= minReserve {
				err = r.takeSize(min(avail, r.size))
			}
		}
	}
	return err
}

func (r *reserve) takeSize(size int64) error {
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) {
			os.Remove(r.path)
			return err
		}
		buf := make([]byte, 1<<16)
		for n := int64(0); n < size; n += int64(len(buf)) {
			if _, err := f.Write(buf); err != nil {
				os.Remove(r.path)
				return err
			}
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	r.held = true
	return nil
}

// retry runs write; if it fails for lack of space and the reserve is held,
// the reserve is released and write runs once more. After a success with
// the reserve released, it tries to take the reserve again.
func (r *reserve) retry(write func() error) error {
	err := write()
	if r == nil || r.size <= 0 {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil && isNoSpace(err) && r.held && r.spared == 0 {
		if rerr := os.Remove(r.path); rerr == nil || os.IsNotExist(rerr) {
			r.held = false
			err = write()
		}
	}
	if err == nil && !r.held {
		_ = r.take() // best effort: room may be back
	}
	return err
}

// spare runs fn with the reserve kept, whatever fn's writes meet: for what
// is written once a new harness runs, whose output may fill the
// filesystem before it (the start's own records, which may be lost), so
// that the reserve is still there for the next fence's token.
func (r *reserve) spare(fn func()) {
	if r == nil {
		fn()
		return
	}
	r.mu.Lock()
	r.spared++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.spared--
		r.mu.Unlock()
	}()
	fn()
}

// ensure reports whether the reserve is held, taking it again if it was
// given up and there is room now. Without it the next fence could not
// persist its token, so no new generation starts (its output would fill
// the room left).
func (r *reserve) ensure() bool {
	if r == nil || r.size <= 0 {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held {
		_ = r.take()
	}
	return r.held
}

// release gives the reserve up for writes that need the room now and that
// nothing a harness runs can compete with: the layers reserve, at a
// layered fence's restore (every older generation dead, the new one not
// started yet), for the snapshot's objects and the layer's marker.
func (r *reserve) release() {
	if r == nil || r.size <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held && r.spared == 0 {
		if err := os.Remove(r.path); err == nil || os.IsNotExist(err) {
			r.held = false
		}
	}
}

// short reports whether the filesystem has less room beside the reserve
// than the reserve itself (or the reserve is not held): whatever took it
// (a harness's writes) has to go before the next generation starts.
func (r *reserve) short() bool {
	if r == nil || r.size <= 0 {
		return false
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(r.path), &st); err != nil {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.held || int64(st.Bavail)*int64(st.Bsize) < r.size
}

// heldBytes is what the reserve holds now (0: given up).
func (r *reserve) heldBytes() int64 {
	if r == nil || r.size <= 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held {
		return 0
	}
	var st unix.Stat_t
	if unix.Stat(r.path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// isNoSpace reports whether err is ENOSPC or EDQUOT.
func isNoSpace(err error) bool { return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) }
