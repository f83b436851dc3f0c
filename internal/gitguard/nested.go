package gitguard

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// nestedDirName is where Restore moves the untracked nested repositories
// that git cannot record (no commit checked out):
// <gitdir>/shim-nested/<gen>/<path>.
const nestedDirName = "shim-nested"

// openParentAt opens the directory holding rel (worktree-relative, no
// "..") below dirfd without following a symlink anywhere, and returns it
// with rel's last component.
func openParentAt(dirfd int, rel string) (int, string, error) {
	parts := strings.Split(rel, "/")
	fd, err := unix.Dup(dirfd)
	if err != nil {
		return -1, "", err
	}
	for _, c := range parts[:len(parts)-1] {
		if c == "" || c == "." || c == ".." {
			unix.Close(fd)
			return -1, "", fmt.Errorf("%s: invalid path", rel)
		}
		next, err := openDirAt(fd, c)
		unix.Close(fd)
		if err != nil {
			return -1, "", err
		}
		fd = next
	}
	base := parts[len(parts)-1]
	if base == "" || base == "." || base == ".." {
		unix.Close(fd)
		return -1, "", fmt.Errorf("%s: invalid path", rel)
	}
	return fd, base, nil
}

// nestedHasCommit reports whether the repository in wt/rel has a HEAD that
// resolves to an object id, read without following symlinks.
func nestedHasCommit(wfd int, rel string) bool {
	pfd, base, err := openParentAt(wfd, rel)
	if err != nil {
		return false
	}
	defer unix.Close(pfd)
	dfd, err := openDirAt(pfd, base)
	if err != nil {
		return false
	}
	defer unix.Close(dfd)
	gfd, err := openDirAt(dfd, ".git")
	if err != nil {
		return false // a gitfile or no .git: not confirmed
	}
	defer unix.Close(gfd)
	head, _, err := readFileAt(gfd, "HEAD", 4096)
	if err != nil {
		return false
	}
	h := strings.TrimSpace(string(head))
	if isHex(h) && (len(h) == 40 || len(h) == 64) {
		return true
	}
	ref, ok := strings.CutPrefix(h, "ref: ")
	if !ok || !strings.HasPrefix(ref, "refs/") || strings.Contains(ref, "..") {
		return false
	}
	if rfd, name, err := openParentAt(gfd, ref); err == nil {
		data, _, err := readFileAt(rfd, name, 4096)
		unix.Close(rfd)
		if v := strings.TrimSpace(string(data)); err == nil && isHex(v) && (len(v) == 40 || len(v) == 64) {
			return true
		}
	}
	packed, _, err := readFileAt(gfd, "packed-refs", 64<<20)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(packed), "\n") {
		if oid, name, ok := strings.Cut(line, " "); ok && name == ref && isHex(oid) {
			return true
		}
	}
	return false
}

// moveNested moves each nested repository (worktree-relative) to
// <gitdir>/shim-nested/<gen>/<path> with rename(2): same filesystem,
// nothing copied, nothing followed. A name already taken there (a repeated
// restore) gets a ".N" suffix. It returns the directory they went to.
func (g *Guard) moveNested(gfd int, generation uint64, paths []string) (string, error) {
	if len(paths) == 0 {
		return "", nil
	}
	wfd, err := openDir(g.wt)
	if err != nil {
		return "", err
	}
	defer unix.Close(wfd)
	gen := strconv.FormatUint(generation, 10)
	for _, p := range paths {
		src, base, err := openParentAt(wfd, p)
		if err != nil {
			return "", fmt.Errorf("%s: %w", p, err)
		}
		err = func() error {
			defer unix.Close(src)
			dst, err := g.mkdirAllAt(gfd, nestedDirName+"/"+gen+"/"+p)
			if err != nil {
				return err
			}
			defer unix.Close(dst)
			name := base
			for i := 1; ; i++ {
				if _, err := lstatAt(dst, name); isNotExist(err) {
					break
				} else if err != nil {
					return err
				}
				name = base + "." + strconv.Itoa(i)
			}
			if err := unix.Renameat(src, base, dst, name); err != nil {
				if errors.Is(err, unix.EXDEV) {
					return fmt.Errorf("the git dir is on another filesystem: %w", err)
				}
				return &os.PathError{Op: "rename", Path: p, Err: err}
			}
			return nil
		}()
		if err != nil {
			return "", fmt.Errorf("move nested repository %s: %w", p, err)
		}
	}
	return g.gitDir + "/" + nestedDirName + "/" + gen, nil
}

// mkdirAllAt creates the parent directories of rel below dirfd (owned by
// the worktree owner, never through a symlink) and returns the innermost
// one open.
func (g *Guard) mkdirAllAt(dirfd int, rel string) (int, error) {
	parts := strings.Split(rel, "/")
	fd, err := unix.Dup(dirfd)
	if err != nil {
		return -1, err
	}
	for _, c := range parts[:len(parts)-1] {
		if err := unix.Mkdirat(fd, c, 0o755); err == nil {
			_ = unix.Fchownat(fd, c, g.uid, g.gid, unix.AT_SYMLINK_NOFOLLOW)
		} else if !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, &os.PathError{Op: "mkdir", Path: c, Err: err}
		}
		next, err := openDirAt(fd, c)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}
