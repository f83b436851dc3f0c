package gitguard

import (
	"errors"
	"fmt"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// The repair undoes what one command of the owner can do to stop git, which
// runs as the owner: a mode-000 file git cannot read, a mode-000 or
// read-only directory git cannot enter, list or write (in the worktree or
// in .git, e.g. a read-only objects/). It only adds owner permission bits
// (u+r on files, u+rwx on directories) to entries the owner owns, and it
// does so with the owner's filesystem credentials (ownerDo), so the kernel
// refuses anything the owner could not have done: a symlink swapped in
// reaches nothing the owner does not own. It never removes a bit.

// ownerDo runs fn on a locked OS thread whose filesystem uid and gid are the
// worktree owner's (setfsuid/setfsgid: the thread's permission checks, and
// only its, are the owner's, capabilities that override them dropped). When
// shim is the owner itself, fn simply runs. The thread is never handed back
// to the Go scheduler with changed credentials: if they cannot be put back
// it stays locked and ends with its goroutine. (Threads the runtime starts
// meanwhile are cloned from a template thread, not from a locked one.)
//
// Where the kernel has no setfsuid (gVisor answers ENOSYS), the thread's
// effective ids are the owner's instead (setresuid(-1, owner, -1) by a raw,
// per-thread syscall; the filesystem ids follow them): the same checks,
// and the kernel clears the thread's effective capabilities meanwhile and
// copies them back from the permitted set when the effective uid is root
// again; the restore checks both.
func (g *Guard) ownerDo(fn func() error) error {
	if !g.asOwner {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread's supplementary groups are the owner's gits' (the
		// view's group, or none): setgroups(2) itself is per thread.
		groups, gerr := unix.Getgroups()
		want := make([]int, 0, 1)
		for _, gid := range g.ownerGroups() {
			want = append(want, int(gid))
		}
		if gerr == nil {
			gerr = unix.Setgroups(want)
		}
		var ids threadIDs = fsIDs{}
		if !(fsIDs{}).supported() {
			ids = &effectiveIDs{}
		}
		ouid, ogid := os.Geteuid(), os.Getegid()
		var err error
		if gerr != nil || !ids.take(g.uid, g.gid) {
			err = fmt.Errorf("cannot take the owner's filesystem credentials (uid %d gid %d): %v", g.uid, g.gid, gerr)
		} else {
			err = fn()
		}
		ok := ids.restore(ouid, ogid)
		if gerr == nil {
			ok = unix.Setgroups(groups) == nil && ok
		}
		if ok {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// repairer collects what a repair changed, relative to its root's label.
type repairer struct {
	g       *Guard
	label   string // "" for the worktree, ".git/" style prefix for the git dir
	changed []string
	skip    func(rel string) bool
}

// chmodAt adds want to the mode of dirfd/name if st says the owner owns it
// and lacks a bit of want. It runs with the owner's credentials.
func (p *repairer) chmodAt(dirfd int, name, rel string, st *unix.Stat_t, want uint32) error {
	if int(st.Uid) != p.g.uid || st.Mode&want == want {
		return nil
	}
	mode := st.Mode&0o7777 | want
	if err := unix.Fchmodat(dirfd, name, mode, 0); err != nil {
		return &os.PathError{Op: "chmod", Path: p.label + rel, Err: err}
	}
	p.changed = append(p.changed, fmt.Sprintf("%s%s: mode %04o -> %04o", p.label, rel, st.Mode&0o7777, mode))
	st.Mode = st.Mode&^0o7777 | mode
	return nil
}

// tree repairs dirfd/name and everything below it (run by ownerDo): a
// directory must be u+rwx, a regular file u+r. Symlinks are not followed;
// entries of other owners are left as they are; directories skip rejects
// are not entered.
func (p *repairer) tree(dirfd int, name, rel string) error {
	st, err := lstatAt(dirfd, name)
	if err != nil {
		if isNotExist(err) {
			return nil
		}
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return p.chmodAt(dirfd, name, rel, &st, 0o400)
	case unix.S_IFDIR:
	default:
		return nil
	}
	if err := p.chmodAt(dirfd, name, rel, &st, 0o700); err != nil {
		return err
	}
	fd, err := openDirAt(dirfd, name)
	if err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil // not the owner's, or swapped: nothing the owner could repair
		}
		return err
	}
	defer unix.Close(fd)
	names, err := readDirNames(fd)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, n := range names {
		c := n
		if rel != "" {
			c = rel + "/" + n
		}
		if p.skip != nil && p.skip(c) {
			continue
		}
		if err := p.tree(fd, n, c); err != nil {
			return err
		}
	}
	return nil
}

// repairAll repairs the whole worktree (keep paths excepted) and the whole
// git dir. It is the second chance of a step that failed, or of a listing
// git could not complete: O(files), so it runs only then.
func (g *Guard) repairAll() ([]string, error) {
	var changed []string
	err := g.ownerDo(func() error {
		parent, base := path.Split(g.wt)
		pfd, err := openDir(path.Clean(parent))
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		w := &repairer{g: g, skip: func(rel string) bool { return g.isKept(rel) || rel == ".git" }}
		if err := w.tree(pfd, base, ""); err != nil {
			return err
		}
		changed = append(changed, w.changed...)
		gparent, gbase := path.Split(g.gitDir)
		gpfd, err := openDir(path.Clean(gparent))
		if err != nil {
			return err
		}
		defer unix.Close(gpfd)
		gr := &repairer{g: g, label: g.gitLabel()}
		if err := gr.tree(gpfd, gbase, ""); err != nil {
			return err
		}
		changed = append(changed, gr.changed...)
		return nil
	})
	return changed, err
}

// gitLabel is how repairs in the git dir are named: ".git/" for the usual
// layout, the git dir's path relative to the worktree otherwise.
func (g *Guard) gitLabel() string {
	if rel, ok := strings.CutPrefix(g.gitDir, g.wt+"/"); ok {
		return rel + "/"
	}
	return g.gitDir + "/"
}

// repairGitDirs makes the directories git writes into at a restore
// (the git dir, objects/ and its pack, info and fan-out directories)
// u+rwx for the owner: cheap (no file is listed but objects/), so it runs
// on every restore. Directories of refs/ and logs/ are seen to by the ref
// namespace step.
func (g *Guard) repairGitDirs(gfd int) ([]string, error) {
	var changed []string
	err := g.ownerDo(func() error {
		p := &repairer{g: g, label: g.gitLabel()}
		var st unix.Stat_t
		if err := unix.Fstat(gfd, &st); err != nil {
			return err
		}
		if int(st.Uid) == g.uid && st.Mode&0o700 != 0o700 {
			if err := unix.Fchmod(gfd, st.Mode&0o7777|0o700); err != nil {
				return &os.PathError{Op: "chmod", Path: g.gitDir, Err: err}
			}
			p.changed = append(p.changed, fmt.Sprintf("%s: mode %04o -> %04o", strings.TrimSuffix(p.label, "/"), st.Mode&0o7777, st.Mode&0o7777|0o700))
		}
		if err := p.dirAt(gfd, "objects", "objects"); err != nil {
			return err
		}
		ofd, err := openDirAt(gfd, "objects")
		if err != nil {
			return nil // git's problem: not ours to create
		}
		defer unix.Close(ofd)
		names, err := readDirNames(ofd)
		if err != nil {
			return err
		}
		for _, n := range names {
			if n == "pack" || n == "info" || (len(n) == 2 && isHex(n)) {
				if err := p.dirAt(ofd, n, "objects/"+n); err != nil {
					return err
				}
			}
		}
		if pfd, err := openDirAt(ofd, "pack"); err == nil {
			defer unix.Close(pfd)
			if packs, err := readDirNames(pfd); err == nil {
				for _, n := range packs {
					if st, err := lstatAt(pfd, n); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
						if err := p.chmodAt(pfd, n, "objects/pack/"+n, &st, 0o400); err != nil {
							return err
						}
					}
				}
			}
		}
		changed = p.changed
		return nil
	})
	return changed, err
}

// dirAt makes dirfd/name (rel in the report) u+rwx when it is a
// directory of the owner's.
func (p *repairer) dirAt(dirfd int, name, rel string) error {
	st, err := lstatAt(dirfd, name)
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	return p.chmodAt(dirfd, name, rel, &st, 0o700)
}

// repairParents makes every directory checkout-index writes into (the
// worktree and the parents of each path it writes) u+rwx for the owner:
// O(paths that differ), so it runs before every checkout.
func (g *Guard) repairParents(wfd int, paths []string) ([]string, error) {
	dirs := map[string]bool{".": true}
	for _, p := range paths {
		for d := path.Dir(p); d != "." && d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	list := make([]string, 0, len(dirs))
	for d := range dirs {
		list = append(list, d)
	}
	sort.Strings(list) // parents before children
	var changed []string
	err := g.ownerDo(func() error {
		p := &repairer{g: g}
		for _, d := range list {
			var st unix.Stat_t
			if d == "." {
				if err := unix.Fstat(wfd, &st); err != nil {
					return err
				}
				if int(st.Uid) == g.uid && st.Mode&0o700 != 0o700 {
					if err := unix.Fchmod(wfd, st.Mode&0o7777|0o700); err != nil {
						return &os.PathError{Op: "chmod", Path: g.wt, Err: err}
					}
					p.changed = append(p.changed, fmt.Sprintf(".: mode %04o -> %04o", st.Mode&0o7777, st.Mode&0o7777|0o700))
				}
				continue
			}
			pfd, base, err := openParentAt(wfd, d)
			if err != nil {
				continue // a parent is missing or not a directory: checkout-index creates it
			}
			st, err = lstatAt(pfd, base)
			if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				err = p.chmodAt(pfd, base, d, &st, 0o700)
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
