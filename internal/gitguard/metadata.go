package gitguard

import (
	"bytes"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Names a killed or interrupted git leaves in the git dir that make the next
// git refuse to run or resume an operation (merge, rebase, bisect, ...).
var leftoverNames = map[string]bool{
	"MERGE_HEAD": true, "MERGE_MSG": true, "MERGE_MODE": true, "MERGE_RR": true,
	"MERGE_AUTOSTASH": true, "AUTO_MERGE": true, "CHERRY_PICK_HEAD": true,
	"REVERT_HEAD": true, "REBASE_HEAD": true, "SQUASH_MSG": true,
	"rebase-merge": true, "rebase-apply": true, "sequencer": true,
	tmpIndexName: true, keepExcludeName: true,
	// What the harness's own git leaves that the next generation's git
	// would act on: rerere's recorded resolutions (a present rr-cache turns
	// rerere on), the last fetch and the pre-reset HEAD.
	"rr-cache": true, "FETCH_HEAD": true, "ORIG_HEAD": true,
}

// removeLeftovers removes lock files, merge/rebase/bisect state and
// temporary object files from the git dir and returns what it removed,
// relative to the git dir. Linked worktrees (worktrees/) and submodule git
// dirs (modules/) are not touched.
func (g *Guard) removeLeftovers(gfd int) ([]string, error) {
	l := &leftovers{}
	err := l.topLevel(gfd)
	if err == nil {
		err = l.refLocks(gfd)
	}
	if err == nil {
		err = g.objectLeftovers(gfd, l)
	}
	return l.removed, err
}

// leftovers collects what removeLeftovers removed.
type leftovers struct{ removed []string }

func (l *leftovers) rm(dirfd int, name, rel string) error {
	if err := removeAllAt(dirfd, name); err != nil {
		return err
	}
	l.removed = append(l.removed, rel)
	return nil
}

// topLevel removes the leftovers directly in the git dir.
func (l *leftovers) topLevel(gfd int) error {
	names, err := readDirNames(gfd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if leftoverNames[n] || strings.HasPrefix(n, "BISECT_") || strings.HasSuffix(n, ".lock") ||
			strings.HasPrefix(n, ".shim-tmp-") || strings.HasPrefix(n, tmpIndexName) {
			if err := l.rm(gfd, n, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// refLocks removes refs/**/*.lock.
func (l *leftovers) refLocks(gfd int) error {
	fd, err := openDirAt(gfd, "refs")
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	return l.walkLocks(fd, "refs/")
}

func (l *leftovers) walkLocks(dirfd int, prefix string) error {
	names, err := readDirNames(dirfd)
	if err != nil {
		return err
	}
	for _, n := range names {
		st, err := lstatAt(dirfd, n)
		if err != nil {
			continue
		}
		if strings.HasSuffix(n, ".lock") {
			if err := l.rm(dirfd, n, prefix+n); err != nil {
				return err
			}
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			fd, err := openDirAt(dirfd, n)
			if err != nil {
				return err
			}
			err = l.walkLocks(fd, prefix+n+"/")
			unix.Close(fd)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// isTmpObject matches temporary object and pack files and locks.
func isTmpObject(n string) bool {
	return strings.HasPrefix(n, "tmp_") || strings.HasPrefix(n, ".tmp-") || strings.HasSuffix(n, ".lock")
}

// objectLeftovers removes, in objects/, tmp_obj_* in the fan-out dirs,
// tmp_* and .tmp-* packs, quarantine dirs (incoming-*) and locks of
// commit-graph and friends.
//
// A loose-object fan-out directory whose inode and ctime are those it had
// when an earlier scan found nothing to remove holds no new name: adding,
// removing or renaming an entry sets the directory's ctime to the current
// time, and nobody but root can set a ctime. Only a ctime well before that
// scan is remembered (timestamps are coarse, so a name added during the
// scan could otherwise leave the ctime unchanged).
func (g *Guard) objectLeftovers(gfd int, l *leftovers) error {
	ofd, err := openDirAt(gfd, "objects")
	if err != nil {
		return err
	}
	defer unix.Close(ofd)
	onames, err := readDirNames(ofd)
	if err != nil {
		return err
	}
	scanStart := metadataNow()
	seen := g.looseScanned[g.gitDir]
	fresh := map[string]dirStamp{}
	defer func() {
		if g.looseScanned == nil {
			g.looseScanned = map[string]map[string]dirStamp{}
		}
		g.looseScanned[g.gitDir] = fresh
	}()
	for _, n := range onames {
		var stamp dirStamp
		if len(n) == 2 && isHex(n) {
			if st, err := lstatAt(ofd, n); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				stamp = dirStamp{dev: st.Dev, ino: st.Ino, ctime: st.Ctim}
				if old, ok := seen[n]; ok && old == stamp {
					fresh[n] = stamp
					continue
				}
			}
		}
		switch {
		case isTmpObject(n) || strings.HasPrefix(n, "incoming-"):
			if err := l.rm(ofd, n, "objects/"+n); err != nil {
				return err
			}
		case n == "pack" || n == "info" || (len(n) == 2 && isHex(n)):
			clean, err := l.objectsSubdir(ofd, n, stamp, scanStart)
			if err != nil {
				return err
			}
			if clean {
				fresh[n] = stamp
			}
		}
	}
	return nil
}

// objectsSubdir removes the temporary files of objects/<n> (and of
// objects/info/commit-graphs) and reports whether the directory, a fan-out
// one with the given stamp, held none and may be skipped next time.
func (l *leftovers) objectsSubdir(ofd int, n string, stamp dirStamp, scanStart time.Time) (bool, error) {
	fd, err := openDirAt(ofd, n)
	if err != nil {
		return false, nil // a symlink or file here is git's problem, never followed
	}
	defer unix.Close(fd)
	sub, err := readDirNames(fd)
	if err != nil {
		return false, err
	}
	clean := false
	if stamp.ino != 0 {
		var st unix.Stat_t
		clean = unix.Fstat(fd, &st) == nil && st.Dev == stamp.dev && st.Ino == stamp.ino && st.Ctim == stamp.ctime &&
			time.Unix(st.Ctim.Unix()).Before(scanStart.Add(-2*time.Second)) && !slices.ContainsFunc(sub, isTmpObject)
	}
	for _, s := range sub {
		if isTmpObject(s) {
			if err := l.rm(fd, s, "objects/"+n+"/"+s); err != nil {
				return false, err
			}
		}
	}
	if n != "info" {
		return clean, nil
	}
	cfd, err := openDirAt(fd, "commit-graphs")
	if err != nil {
		return clean, nil
	}
	defer unix.Close(cfd)
	cs, err := readDirNames(cfd)
	if err != nil {
		return clean, nil
	}
	for _, s := range cs {
		if isTmpObject(s) {
			if err := l.rm(cfd, s, "objects/info/commit-graphs/"+s); err != nil {
				return clean, err
			}
		}
	}
	return clean, nil
}

// metadataNow is the clock of removeLeftovers (a test moves it on).
var metadataNow = time.Now

// dirStamp identifies a directory's state: its ctime changes whenever an
// entry is added, removed or renamed.
type dirStamp struct {
	dev, ino uint64
	ctime    unix.Timespec
}

// restoreMetadata puts back the trusted copies of config, config.worktree,
// hooks/, info/ and objects/info/alternates, removes a commondir file, and
// repairs an invalid HEAD. It returns what it changed, relative to the git
// dir. Files it writes belong to the worktree owner.
func (g *Guard) restoreMetadata(gfd int) ([]string, error) {
	pfd, err := openDir(g.stateFile(pristineDir))
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "open pristine copy")
	}
	defer unix.Close(pfd)
	m := &metadataSync{g: g, pfd: pfd}
	err = m.files(gfd)
	if err == nil {
		err = m.alternates(gfd)
	}
	for _, d := range []struct {
		name string
		has  bool
	}{{"hooks", g.st.HasHooks}, {"info", g.st.HasInfo}} {
		if err == nil {
			err = m.dir(gfd, d.name, d.has)
		}
	}
	if err != nil {
		return m.changed, err
	}
	return dedupe(m.changed), nil
}

// metadataSync makes the git dir's metadata equal to the pristine copy
// (open at pfd) and records what it changed.
type metadataSync struct {
	g       *Guard
	pfd     int
	changed []string
}

// syncFile makes dirfd/name equal to the pristine file pname, or absent
// when present is false.
func (m *metadataSync) syncFile(dirfd int, name, pname, rel string, present bool) error {
	cur, st, cerr := readFileAt(dirfd, name, 16<<20)
	if !present {
		if cerr != nil && isNotExist(cerr) {
			return nil
		}
		m.changed = append(m.changed, rel)
		return removeAllAt(dirfd, name)
	}
	want, pst, err := readFileAt(m.pfd, pname, 16<<20)
	if err != nil {
		return err
	}
	if cerr == nil && bytes.Equal(cur, want) && int(st.Uid) == m.g.uid && st.Mode&0o7777 == pst.Mode&0o7777 {
		return nil
	}
	m.changed = append(m.changed, rel)
	return writeFileAt(dirfd, name, want, pst.Mode, m.g.uid, m.g.gid, nil)
}

// files syncs config and config.worktree, removes a commondir (which would
// make git take refs, objects and config from elsewhere) and repairs HEAD.
func (m *metadataSync) files(gfd int) error {
	g := m.g
	if err := m.syncFile(gfd, "config", "config", "config", true); err != nil {
		return err
	}
	if err := m.syncFile(gfd, "config.worktree", "config.worktree", "config.worktree", g.st.HasConfigWorktree); err != nil {
		return err
	}
	if err := m.syncFile(gfd, "commondir", "", "commondir", false); err != nil {
		return err
	}
	if head, _, err := readFileAt(gfd, "HEAD", 4096); err != nil || !validHead(string(head)) {
		m.changed = append(m.changed, "HEAD")
		return writeFileAt(gfd, "HEAD", []byte(g.st.Head), 0o644, g.uid, g.gid, nil)
	}
	return nil
}

// alternates syncs objects/info/alternates and removes http-alternates.
func (m *metadataSync) alternates(gfd int) error {
	g := m.g
	ofd, err := openDirAt(gfd, "objects")
	if err != nil {
		return err
	}
	defer unix.Close(ofd)
	ifd, err := openDirAt(ofd, "info")
	if err != nil && isNotExist(err) && g.st.HasAlternates {
		if err = unix.Mkdirat(ofd, "info", 0o755); err == nil {
			_ = unix.Fchownat(ofd, "info", g.uid, g.gid, unix.AT_SYMLINK_NOFOLLOW)
			ifd, err = openDirAt(ofd, "info")
		}
	}
	switch {
	case err == nil:
		defer unix.Close(ifd)
		if err := m.syncFile(ifd, "alternates", "alternates", "objects/info/alternates", g.st.HasAlternates); err != nil {
			return err
		}
		return m.syncFile(ifd, "http-alternates", "", "objects/info/http-alternates", false)
	case isNotExist(err):
		return nil
	default:
		// objects/info is a symlink or file: replace it.
		m.changed = append(m.changed, "objects/info")
		return removeAllAt(ofd, "info")
	}
}

// dir makes the git dir's directory name (hooks, info) equal to the
// pristine one, or absent when the registration had none.
func (m *metadataSync) dir(gfd int, name string, has bool) error {
	g := m.g
	want := map[string]fileEntry{}
	if has {
		if err := readTreeAt(m.pfd, name, "", want); err != nil {
			return err
		}
	}
	cur := map[string]fileEntry{}
	cerr := readTreeAt(gfd, name, "", cur)
	if cerr != nil && !isNotExist(cerr) {
		cur = nil // a symlink or file where the directory should be
	}
	if !has && cerr != nil && isNotExist(cerr) {
		return nil
	}
	diff := treeDiff(want, cur)
	if cur == nil {
		diff = []string{""}
	}
	if cerr != nil && isNotExist(cerr) && has {
		diff = append(diff, "")
	}
	if len(diff) == 0 {
		return nil
	}
	for _, p := range diff {
		if p == "" {
			m.changed = append(m.changed, name)
		} else {
			m.changed = append(m.changed, name+"/"+p)
		}
	}
	if err := removeAllAt(gfd, name); err != nil {
		return err
	}
	if has {
		return writeTreeAt(gfd, name, want, 0o755, g.uid, g.gid)
	}
	return nil
}

// treeDiff returns the sorted relative paths where two trees differ.
func treeDiff(a, b map[string]fileEntry) []string {
	var d []string
	for p, ea := range a {
		eb, ok := b[p]
		if !ok || ea.dir != eb.dir || ea.mode != eb.mode || !bytes.Equal(ea.data, eb.data) {
			d = append(d, p)
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			d = append(d, p)
		}
	}
	sort.Strings(d)
	return d
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	out := s[:0]
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
