package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// What shim records durably, and in which order. A record that says a
// decision was made is synced after everything it depends on; records
// that do not depend on one another are synced together, in one batch
// (durableBatch): on a journalling filesystem the syncs of files written
// before the first of them share that first sync's journal commit, so k
// records cost two commits (their contents, then their names), not 2k.

// fsyncHook, when set (tests), is called with every file or directory
// shim syncs, right before the sync: the order of the calls is the order
// of durability. An error it returns is the sync's (nothing is synced).
var fsyncHook atomic.Pointer[func(path string) error]

// fsync syncs f (a file or a directory).
func fsync(f *os.File) error {
	if h := fsyncHook.Load(); h != nil {
		if err := (*h)(f.Name()); err != nil {
			return err
		}
	}
	return f.Sync()
}

// writeDurable replaces path with b durably: a temporary file written and
// fsynced, renamed over path, the directory fsynced. Once it returns, a
// power cut leaves path whole (the old or the new content), never empty.
func writeDurable(path string, b []byte, mode os.FileMode) error {
	var batch durableBatch
	batch.put(path, b, mode)
	return batch.commit()
}

// syncDir fsyncs directory dir: the entries made or renamed in it are
// durable once it returns.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return fsync(d)
}

// durableBatch is whole-file replacements (and directories whose new
// entries must last) made durable together: every file is written to its
// temporary file, all of them are synced, renamed over their paths, and
// every directory concerned synced once. Nothing in a batch is ordered
// against anything else in it: what depends on its files is written once
// commit returned.
type durableBatch struct {
	files   []batchFile
	dirs    []string         // synced with the files' directories
	dirErrs map[string]error // set by commit
}

type batchFile struct {
	path    string
	b       []byte
	mode    os.FileMode
	written bool // its caller wrote path+".tmp" (putWritten)
	renamed bool // by an earlier commit: only its dir is synced again
	// lost: a written file's sync failed. Linux reports a failed
	// writeback once and marks its pages clean, so a retry that opened
	// and synced the file again would get nil without its content on the
	// disk: it stays failed (a put file is written again from b).
	lost error
	err  error // set by commit
}

// put adds path's new content.
func (d *durableBatch) put(path string, b []byte, mode os.FileMode) {
	d.files = append(d.files, batchFile{path: path, b: b, mode: mode})
}

// putWritten adds path+".tmp", a file its caller wrote in full (not
// synced), to be synced and renamed to path.
func (d *durableBatch) putWritten(path string) {
	d.files = append(d.files, batchFile{path: path, written: true})
}

// syncDir adds dir, whose entries (a directory just made in it) must
// last.
func (d *durableBatch) syncDir(dir string) { d.dirs = append(d.dirs, dir) }

// commit makes the batch durable: nil when every file and directory is,
// else every failure joined (errorOf says which file's). A file that
// failed keeps its old content; the others are durable all the same. It
// may run again (a retry with room made): it starts from the beginning.
func (d *durableBatch) commit() error {
	tmps := make([]*os.File, len(d.files))
	for i := range d.files {
		f := &d.files[i]
		f.err = nil
		switch {
		case f.renamed:
		case f.lost != nil:
			f.err = f.lost
		case f.written:
			tmps[i], f.err = os.OpenFile(f.path+".tmp", os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		default:
			tmps[i], f.err = writeTemp(f.path+".tmp", f.b, f.mode)
		}
	}
	synced := syncAll(tmps) // the contents: one commit
	for i := range d.files {
		if tmps[i] == nil {
			continue
		}
		err := synced[i]
		if cerr := tmps[i].Close(); err == nil {
			err = cerr
		}
		d.files[i].err = err
		if err != nil && d.files[i].written {
			d.files[i].lost = err
		}
	}
	// Renamed only once every content is synced: a rename before the
	// next file's sync would need a commit of its own.
	for i := range d.files {
		if tmps[i] != nil && d.files[i].err == nil {
			d.files[i].err = os.Rename(d.files[i].path+".tmp", d.files[i].path)
			d.files[i].renamed = d.files[i].err == nil
		}
	}
	var errs []error
	dirs := d.dirsToSync()
	d.dirErrs = map[string]error{}
	for j, err := range syncDirs(dirs) { // the names: one commit
		d.dirErrs[dirs[j]] = err
		for i := range d.files {
			if d.files[i].err == nil && filepath.Dir(d.files[i].path) == dirs[j] {
				d.files[i].err = err
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range d.files {
		if f.err != nil {
			errs = append(errs, f.err)
		}
	}
	return errors.Join(errs...)
}

// syncAll syncs every file of fs (nil ones are skipped) at once, one
// goroutine each: the syncs of one batch wait for one journal commit and
// one flush of the disk's cache together, where one after another each
// waits for a flush of its own (ext4 flushes the cache at every fsync,
// even with nothing left to commit). It returns each one's error.
func syncAll(fs []*os.File) []error {
	out := make([]error, len(fs))
	var wg sync.WaitGroup
	for i, f := range fs {
		if f == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = fsync(f)
		}()
	}
	wg.Wait()
	return out
}

// syncDirs syncs the directories dirs at once (syncAll).
func syncDirs(dirs []string) []error {
	out := make([]error, len(dirs))
	fs := make([]*os.File, len(dirs))
	for i, dir := range dirs {
		fs[i], out[i] = os.Open(dir)
	}
	for i, err := range syncAll(fs) {
		if fs[i] != nil {
			fs[i].Close()
			out[i] = err
		}
	}
	return out
}

// errorOf is why path (put in d, or a directory d synced) is not
// durable after commit, or nil.
func (d *durableBatch) errorOf(path string) error {
	for _, f := range d.files {
		if f.path == path {
			return f.err
		}
	}
	return d.dirErrs[filepath.Clean(path)]
}

// errorUnder is why dir, or a file put in d in dir, is not durable after
// commit, or nil.
func (d *durableBatch) errorUnder(dir string) error {
	dir = filepath.Clean(dir)
	for _, f := range d.files {
		if filepath.Dir(f.path) == dir && f.err != nil {
			return f.err
		}
	}
	return d.dirErrs[dir]
}

// dirsToSync are the directories of the files written and the batch's
// own, each once, in the order they came.
func (d *durableBatch) dirsToSync() []string {
	var out []string
	seen := map[string]bool{}
	add := func(dir string) {
		if !seen[dir] {
			seen[dir] = true
			out = append(out, dir)
		}
	}
	for _, f := range d.files {
		if f.err == nil {
			add(filepath.Dir(f.path))
		}
	}
	for _, dir := range d.dirs {
		add(filepath.Clean(dir))
	}
	return out
}

// writeTemp writes b to a new tmp (replacing a stale one), unsynced but
// on its way to the disk: its writeback starts now (sync_file_range), so
// that its blocks are allocated in the journal transaction the batch's
// first sync commits, and its own sync then has nothing left to commit
// (with delayed allocation, a file whose writeback starts only at its
// fsync needs a commit of its own).
func writeTemp(tmp string, b []byte, mode os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	_ = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE) // a hint: the fsync is the guarantee
	return f, nil
}
