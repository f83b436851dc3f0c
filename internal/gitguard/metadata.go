package gitguard

import (
	"bytes"
	"path/filepath"
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
}

// removeLeftovers removes lock files, merge/rebase/bisect state and
// temporary object files from the git dir and returns what it removed,
// relative to the git dir. Linked worktrees (worktrees/) and submodule git
// dirs (modules/) are not touched.
func (g *Guard) removeLeftovers(gfd int) ([]string, error) {
	var removed []string
	rm := func(dirfd int, name, rel string) error {
		if err := removeAllAt(dirfd, name); err != nil {
			return err
		}
		removed = append(removed, rel)
		return nil
	}
	names, err := readDirNames(gfd)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if leftoverNames[n] || strings.HasPrefix(n, "BISECT_") || strings.HasSuffix(n, ".lock") ||
			strings.HasPrefix(n, ".shim-tmp-") || strings.HasPrefix(n, tmpIndexName) {
			if err := rm(gfd, n, n); err != nil {
				return removed, err
			}
		}
	}
	// refs/**/*.lock
	var walkLocks func(dirfd int, prefix string) error
	walkLocks = func(dirfd int, prefix string) error {
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
				if err := rm(dirfd, n, prefix+n); err != nil {
					return err
				}
				continue
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				fd, err := openDirAt(dirfd, n)
				if err != nil {
					return err
				}
				err = walkLocks(fd, prefix+n+"/")
				unix.Close(fd)
				if err != nil {
					return err
				}
			}
		}
		return nil
	}
	if fd, err := openDirAt(gfd, "refs"); err == nil {
		err = walkLocks(fd, "refs/")
		unix.Close(fd)
		if err != nil {
			return removed, err
		}
	}
	// objects: tmp_obj_* in the fan-out dirs, tmp_* and .tmp-* packs,
	// quarantine dirs (incoming-*), locks of commit-graph and friends.
	ofd, err := openDirAt(gfd, "objects")
	if err != nil {
		return removed, err
	}
	defer unix.Close(ofd)
	onames, err := readDirNames(ofd)
	if err != nil {
		return removed, err
	}
	isTmp := func(n string) bool {
		return strings.HasPrefix(n, "tmp_") || strings.HasPrefix(n, ".tmp-") || strings.HasSuffix(n, ".lock")
	}
	// A loose-object fan-out directory whose inode and ctime are those it
	// had when an earlier scan found nothing to remove holds no new name:
	// adding, removing or renaming an entry sets the directory's ctime to
	// the current time, and nobody but root can set a ctime. Only a ctime
	// well before that scan is remembered (timestamps are coarse, so a name
	// added during the scan could otherwise leave the ctime unchanged).
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
		case isTmp(n) || strings.HasPrefix(n, "incoming-"):
			if err := rm(ofd, n, "objects/"+n); err != nil {
				return removed, err
			}
		case n == "pack" || n == "info" || (len(n) == 2 && isHex(n)):
			fd, err := openDirAt(ofd, n)
			if err != nil {
				continue // a symlink or file here is git's problem, never followed
			}
			sub, err := readDirNames(fd)
			if err == nil && stamp.ino != 0 {
				var st unix.Stat_t
				if unix.Fstat(fd, &st) == nil && st.Dev == stamp.dev && st.Ino == stamp.ino && st.Ctim == stamp.ctime &&
					time.Unix(st.Ctim.Unix()).Before(scanStart.Add(-2*time.Second)) && !slices.ContainsFunc(sub, isTmp) {
					fresh[n] = stamp
				}
			}
			if err == nil {
				for _, s := range sub {
					if isTmp(s) {
						if err = rm(fd, s, "objects/"+n+"/"+s); err != nil {
							break
						}
					}
				}
			}
			if err == nil && n == "info" {
				if cfd, cerr := openDirAt(fd, "commit-graphs"); cerr == nil {
					if cs, rerr := readDirNames(cfd); rerr == nil {
						for _, s := range cs {
							if isTmp(s) {
								if err = rm(cfd, s, "objects/info/commit-graphs/"+s); err != nil {
									break
								}
							}
						}
					}
					unix.Close(cfd)
				}
			}
			unix.Close(fd)
			if err != nil {
				return removed, err
			}
		}
	}
	return removed, nil
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
	pdir := filepath.Join(g.cfg.StateDir, pristineDir)
	pfd, err := openDir(pdir)
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "open pristine copy")
	}
	defer unix.Close(pfd)
	var changed []string

	// syncFile makes dirfd/name equal to the pristine file pname, or absent
	// when present is false.
	syncFile := func(dirfd int, name, pname, rel string, present bool) error {
		cur, st, cerr := readFileAt(dirfd, name, 16<<20)
		if !present {
			if cerr != nil && isNotExist(cerr) {
				return nil
			}
			changed = append(changed, rel)
			return removeAllAt(dirfd, name)
		}
		want, pst, err := readFileAt(pfd, pname, 16<<20)
		if err != nil {
			return err
		}
		if cerr == nil && bytes.Equal(cur, want) && int(st.Uid) == g.uid && st.Mode&0o7777 == pst.Mode&0o7777 {
			return nil
		}
		changed = append(changed, rel)
		return writeFileAt(dirfd, name, want, pst.Mode, g.uid, g.gid, nil)
	}
	if err := syncFile(gfd, "config", "config", "config", true); err != nil {
		return changed, err
	}
	if err := syncFile(gfd, "config.worktree", "config.worktree", "config.worktree", g.st.HasConfigWorktree); err != nil {
		return changed, err
	}
	// A commondir file would make git take refs, objects and config from
	// elsewhere.
	if err := syncFile(gfd, "commondir", "", "commondir", false); err != nil {
		return changed, err
	}
	if head, _, err := readFileAt(gfd, "HEAD", 4096); err != nil || !validHead(string(head)) {
		changed = append(changed, "HEAD")
		if err := writeFileAt(gfd, "HEAD", []byte(g.st.Head), 0o644, g.uid, g.gid, nil); err != nil {
			return changed, err
		}
	}
	ofd, err := openDirAt(gfd, "objects")
	if err != nil {
		return changed, err
	}
	ifd, err := openDirAt(ofd, "info")
	if err != nil && isNotExist(err) && g.st.HasAlternates {
		if err = unix.Mkdirat(ofd, "info", 0o755); err == nil {
			_ = unix.Fchownat(ofd, "info", g.uid, g.gid, unix.AT_SYMLINK_NOFOLLOW)
			ifd, err = openDirAt(ofd, "info")
		}
	}
	if err == nil {
		err = syncFile(ifd, "alternates", "alternates", "objects/info/alternates", g.st.HasAlternates)
		if err == nil {
			err = syncFile(ifd, "http-alternates", "", "objects/info/http-alternates", false)
		}
		unix.Close(ifd)
	} else if isNotExist(err) {
		err = nil
	} else {
		// objects/info is a symlink or file: replace it.
		changed = append(changed, "objects/info")
		err = removeAllAt(ofd, "info")
	}
	unix.Close(ofd)
	if err != nil {
		return changed, err
	}

	for _, d := range []struct {
		name string
		has  bool
	}{{"hooks", g.st.HasHooks}, {"info", g.st.HasInfo}} {
		want := map[string]fileEntry{}
		if d.has {
			if err := readTreeAt(pfd, d.name, "", want); err != nil {
				return changed, err
			}
		}
		cur := map[string]fileEntry{}
		cerr := readTreeAt(gfd, d.name, "", cur)
		if cerr != nil && !isNotExist(cerr) {
			cur = nil // a symlink or file where the directory should be
		}
		if !d.has && cerr != nil && isNotExist(cerr) {
			continue
		}
		diff := treeDiff(want, cur)
		if cur == nil {
			diff = []string{""}
		}
		if cerr != nil && isNotExist(cerr) && d.has {
			diff = append(diff, "")
		}
		if len(diff) == 0 {
			continue
		}
		for _, p := range diff {
			if p == "" {
				changed = append(changed, d.name)
			} else {
				changed = append(changed, d.name+"/"+p)
			}
		}
		if err := removeAllAt(gfd, d.name); err != nil {
			return changed, err
		}
		if d.has {
			if err := writeTreeAt(gfd, d.name, want, 0o755, g.uid, g.gid); err != nil {
				return changed, err
			}
		}
	}
	return dedupe(changed), nil
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
