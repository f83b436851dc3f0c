package gitguard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/shimdev/shim/api"
	"golang.org/x/sys/unix"
)

// The snapshot does not `git add -A`: git would read every file it adds
// whatever its size (a 40 GiB sparse file made in a fraction of a second
// takes minutes) and fails on a FIFO at a tracked path. Instead git lists
// what differs (diff-files: the tracked paths whose stat data changed;
// ls-files --others: the untracked files), shim looks at each listed path
// (lstat, never followed), and update-index hashes only the regular files
// and symlinks within the cap. What git cannot list or read as the owner
// (a mode-000 directory or file) is repaired as the owner and listed again.

// HashBound is how much of a file that is not stored is read for
// NotStoredFile.Hash.
const HashBound = 1 << 20

// HashDeadline bounds the time all the hashes of one restore may take
// (a slow or stalling filesystem); a file not hashed by then has a hash of
// what was read.
const HashDeadline = 2 * time.Second

// NotStoredFile is a file a snapshot listed instead of storing.
type NotStoredFile = api.NotStoredFile

// errNeedRepair says git could not list part of the worktree as the owner
// (a directory it may not open or a file it may not stat).
var errNeedRepair = errors.New("git cannot read part of the worktree as its owner")

// listWorktree fills the temporary index from the worktree: the listing,
// the per-path decisions and update-index. Beside it run the ignored
// listing (unless ignored files are saved) and, without the ref namespace
// step, the replace refs.
func (g *Guard) listWorktree(ctx context.Context, wfd int, s *snap, rep *Report) error {
	excl := g.excludePathspecs()
	var changed, others []byte
	var warnChanged, warnOthers string
	fns := []func() error{
		func() (err error) {
			args := append([]string{"diff-files", "-z", "--name-only", "--no-renames", "--ignore-submodules=dirty", "--", "."}, excl...)
			changed, err = g.git(ctx, gitOpts{index: g.tmpIndex, warnings: &warnChanged}, args...)
			return err
		},
		func() (err error) {
			args := []string{"ls-files", "-z", "--others"}
			if !g.cfg.IncludeIgnored {
				args = append(args, "--exclude-standard")
			}
			args = append(append(args, "--", "."), excl...)
			others, err = g.git(ctx, gitOpts{index: g.tmpIndex, warnings: &warnOthers}, args...)
			return err
		},
	}
	if !g.cfg.IncludeIgnored {
		fns = append(fns, func() (err error) {
			s.ignored, err = g.git(ctx, gitOpts{index: g.tmpIndex},
				"ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory")
			return err
		})
	}
	if !g.refsKept {
		fns = append(fns, func() (err error) {
			s.replaceRefs, err = g.listReplaceRefs(ctx)
			return err
		})
	}
	if err := parallel(fns...); err != nil {
		return errorf(CodeRestoreFailed, err, "snapshot: list the worktree")
	}
	if w := warnChanged + warnOthers; strings.Contains(w, "Permission denied") {
		return fmt.Errorf("%w: %s", errNeedRepair, firstLines(w, 3))
	}
	d := &decisions{g: g, wfd: wfd, deadline: time.Now().Add(HashDeadline)}
	for _, p := range bytes.Split(changed, []byte{0}) {
		if len(p) > 0 {
			d.decide(string(p), true)
		}
	}
	for _, p := range bytes.Split(others, []byte{0}) {
		if len(p) > 0 {
			d.decide(string(p), false)
		}
	}
	if d.err != nil {
		return errorf(CodeRestoreFailed, d.err, "snapshot: look at the changed paths")
	}
	s.nested = d.nested
	s.notStored = d.notStored
	s.skipped = d.untracked
	rep.NotStored = d.notStored
	if len(d.unreadable) > 0 {
		fixed, err := g.repairFiles(wfd, d.unreadable)
		rep.Repaired = append(rep.Repaired, fixed...)
		if err != nil {
			return errorf(CodeRestoreFailed, err, "snapshot: repair unreadable files")
		}
	}
	return g.updateIndex(ctx, d)
}

// decisions is what listWorktree decided for each listed path.
type decisions struct {
	g          *Guard
	wfd        int
	deadline   time.Time
	add        bytes.Buffer // update-index --add --remove paths, NUL-terminated
	remove     bytes.Buffer // update-index --force-remove paths
	nested     []string
	notStored  []NotStoredFile
	untracked  []string // untracked paths not stored (all, not capped)
	unreadable []string
	err        error
}

// decide looks at one listed path: tracked (from diff-files) or untracked
// (from ls-files; a nested repository ends in "/").
func (d *decisions) decide(p string, tracked bool) {
	if d.err != nil {
		return
	}
	if dir, ok := strings.CutSuffix(p, "/"); ok {
		if nestedHasCommit(d.wfd, dir) {
			d.add.WriteString(dir + "\x00") // a gitlink to its HEAD
		} else {
			d.nested = append(d.nested, dir)
		}
		return
	}
	pfd, base, err := openParentAt(d.wfd, p)
	if err != nil {
		// A parent is gone, or is not a directory (a symlink, say, which
		// update-index refuses to look beyond): the entry leaves the index.
		d.remove.WriteString(p + "\x00")
		return
	}
	defer unix.Close(pfd)
	st, err := lstatAt(pfd, base)
	if err != nil {
		if !isNotExist(err) {
			d.err = err
			return
		}
		d.add.WriteString(p + "\x00")
		return
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if st.Size > d.g.maxFile {
			d.skip(pfd, base, p, "file", &st, tracked)
			return
		}
		if int(st.Uid) == d.g.uid && st.Mode&0o400 == 0 {
			d.unreadable = append(d.unreadable, p)
		}
	case unix.S_IFLNK, unix.S_IFDIR:
	case unix.S_IFIFO:
		d.skip(pfd, base, p, "fifo", &st, tracked)
		return
	case unix.S_IFSOCK:
		d.skip(pfd, base, p, "socket", &st, tracked)
		return
	case unix.S_IFCHR:
		d.skip(pfd, base, p, "char_device", &st, tracked)
		return
	default:
		d.skip(pfd, base, p, "block_device", &st, tracked)
		return
	}
	d.add.WriteString(p + "\x00")
}

// skip records a path the snapshot does not store.
func (d *decisions) skip(pfd int, base, p, typ string, st *unix.Stat_t, tracked bool) {
	f := NotStoredFile{Path: p, Type: typ, Size: st.Size, Allocated: st.Blocks * 512, Tracked: tracked}
	if typ == "file" {
		f.Hash, f.HashedBytes = hashPrefix(pfd, base, d.deadline)
	}
	if len(d.notStored) < maxListed {
		d.notStored = append(d.notStored, f)
	}
	if !tracked {
		d.untracked = append(d.untracked, p)
	}
	d.remove.WriteString(p + "\x00")
}

// hashPrefix hashes at most HashBound bytes of a regular file, stopping at
// the deadline (never through a symlink, never waiting on a FIFO).
func hashPrefix(pfd int, base string, deadline time.Time) (string, int64) {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", 0
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", 0
	}
	h := sha256.New()
	buf := make([]byte, 64<<10)
	var n int64
	for n < HashBound && time.Now().Before(deadline) {
		k, err := f.Read(buf[:min(int64(len(buf)), HashBound-n)])
		h.Write(buf[:k])
		n += int64(k)
		if err != nil {
			if err != io.EOF {
				return "", 0
			}
			break
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n
}

// repairFiles makes the owner's files git cannot read u+r, as the owner.
func (g *Guard) repairFiles(wfd int, paths []string) ([]string, error) {
	var changed []string
	err := g.ownerDo(func() error {
		p := &repairer{g: g}
		for _, rel := range paths {
			pfd, base, err := openParentAt(wfd, rel)
			if err != nil {
				continue
			}
			st, err := lstatAt(pfd, base)
			if err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
				err = p.chmodAt(pfd, base, rel, &st, 0o400)
			} else {
				err = nil
			}
			unix.Close(pfd)
			if err != nil {
				return err
			}
		}
		changed = p.changed
		return nil
	})
	return changed, err
}

// updateIndex applies the decisions to the temporary index: paths not
// stored leave it, the others are added, updated or removed (--replace: a
// file may take the place of a directory and the other way round). Every
// blob above core.bigFileThreshold is streamed into a pack.
func (g *Guard) updateIndex(ctx context.Context, d *decisions) error {
	if d.remove.Len() > 0 {
		if _, err := g.git(ctx, gitOpts{index: g.tmpIndex, stdin: &d.remove}, "update-index", "-z", "--force-remove", "--stdin"); err != nil {
			return errorf(CodeRestoreFailed, err, "snapshot: leave out the files not stored")
		}
	}
	if d.add.Len() > 0 {
		if _, err := g.git(ctx, gitOpts{index: g.tmpIndex, stdin: &d.add, config: []string{"core.bigFileThreshold=1"}},
			"update-index", "-z", "--add", "--remove", "--replace", "--stdin"); err != nil {
			return errorf(CodeRestoreFailed, err, "snapshot: add")
		}
	}
	return nil
}

// notStoredTrailers are the snapshot message's lines for the files it
// does not hold.
func notStoredTrailers(fs []NotStoredFile) string {
	var b strings.Builder
	for _, f := range fs {
		h := f.Hash
		if h == "" {
			h = "-"
		}
		fmt.Fprintf(&b, "Shim-Not-Stored: %s %d %s %s\n", f.Type, f.Size, h, quotePath(f.Path))
	}
	return b.String()
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(strings.TrimSpace(s), "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "; ")
}
