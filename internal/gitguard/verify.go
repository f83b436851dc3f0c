package gitguard

import (
	"bytes"
	"context"
	"strings"

	"golang.org/x/sys/unix"
)

// verify checks that HEAD is the baseline, that the index and every
// tracked file equal it (diff-index HEAD: index entries against the tree,
// files against the index's stat data), and that nothing untracked,
// ignored or not, is left outside the keep paths (ls-files --others
// without exclude rules). Untracked directories that hold nothing but
// directories (or fifos and sockets) are removed here; anything else left
// is RESTORE_FAILED.
func (g *Guard) verify(ctx context.Context, wfd int, baseline string) error {
	var head, changed, others []byte
	excl := g.excludePathspecs()
	err := parallel(
		func() (err error) {
			head, err = g.git(ctx, gitOpts{}, "rev-parse", "-q", "--verify", "HEAD^{commit}")
			return err
		},
		func() (err error) {
			args := append([]string{"diff-index", "-z", "--name-only", "--no-renames", "--ignore-submodules=all", "HEAD", "--", "."}, excl...)
			changed, err = g.git(ctx, gitOpts{}, args...)
			return err
		},
		func() (err error) {
			args := append([]string{"ls-files", "-z", "--others", "--directory", "--", "."}, excl...)
			others, err = g.git(ctx, gitOpts{}, args...)
			return err
		},
	)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "verify")
	}
	if h := strings.TrimSpace(string(head)); h != baseline {
		return errorf(CodeRestoreFailed, nil, "verify: HEAD is %s, not the baseline %s", h, baseline)
	}
	var left []string
	for _, p := range bytes.Split(changed, []byte{0}) {
		if len(p) > 0 {
			left = append(left, "changed "+string(p))
		}
	}
	for _, p := range bytes.Split(others, []byte{0}) {
		rel := strings.TrimSuffix(string(p), "/")
		if rel == "" || g.isKept(rel) {
			continue
		}
		if !g.removeEmpty(wfd, rel) {
			left = append(left, "untracked "+string(p))
		}
	}
	if len(left) > 0 {
		n := len(left)
		if n > 20 {
			left = left[:20]
		}
		return errorf(CodeRestoreFailed, nil, "verify: %d entries differ from the baseline after reset and clean: %s", n, strings.Join(left, "; "))
	}
	return nil
}

// removeEmpty removes wt/rel if it holds no data: a directory whose
// entries are all such (keep paths below it stay, and so does it), a fifo
// or a socket. It reports false, removing nothing more, at the first
// regular file, symlink or device, and never follows a symlink.
func (g *Guard) removeEmpty(wfd int, rel string) bool {
	pfd, base, err := openParentAt(wfd, rel)
	if err != nil {
		return false
	}
	defer unix.Close(pfd)
	st, err := lstatAt(pfd, base)
	if err != nil {
		return isNotExist(err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFIFO, unix.S_IFSOCK:
		return unix.Unlinkat(pfd, base, 0) == nil
	case unix.S_IFDIR:
	default:
		return false
	}
	fd, err := openDirAt(pfd, base)
	if err != nil {
		return false
	}
	names, err := readDirNames(fd)
	unix.Close(fd)
	if err != nil {
		return false
	}
	kept := false
	for _, n := range names {
		c := rel + "/" + n
		if g.isKept(c) {
			kept = true
			continue
		}
		if !g.removeEmpty(wfd, c) {
			return false
		}
	}
	return kept || unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR) == nil
}
