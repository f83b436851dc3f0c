package gitguard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// prepareHead points HEAD back at the pristine branch (so every generation
// starts on the same branch, which updateRefs then moves to the baseline),
// or at the baseline when the pristine HEAD was detached.
func (g *Guard) prepareHead(gfd int, baseline string) error {
	head := g.st.Head
	if !strings.HasPrefix(head, "ref: ") {
		head = baseline + "\n"
	}
	if cur, _, err := readFileAt(gfd, "HEAD", 4096); err != nil || string(cur) != head {
		return writeFileAt(gfd, "HEAD", []byte(head), 0o644, g.uid, g.gid, nil)
	}
	return nil
}

// removeChanged removes, below the worktree and never through a symlink,
// the ignored paths listed during the snapshot (except keep paths), every
// path the baseline does not have, and every changed .gitattributes, then
// the directories that became empty. checkoutBaseline writes the
// baseline's versions of the rest.
func (g *Guard) removeChanged(wfd int, s *snap) error {
	for _, p := range bytes.Split(s.ignored, []byte{0}) {
		rel := strings.TrimSuffix(string(p), "/")
		if rel == "" || g.isKept(rel) {
			continue
		}
		if err := g.removeRel(wfd, rel); err != nil {
			return err
		}
	}
	for _, rel := range s.skipped {
		if err := g.removeRel(wfd, rel); err != nil {
			return err
		}
		g.pruneEmptyParents(wfd, rel)
	}
	for _, e := range parseRaw(s.diff) {
		// Added paths go; modified ones stay until checkout-index
		// overwrites them (an interrupted restore then still finds their
		// content), except .gitattributes files: checkout-index reads
		// attributes from the worktree first, so only the baseline's may be
		// there when it runs.
		if e.status != 'A' && (e.status == 'D' || e.srcMode == "160000" || path.Base(e.path) != ".gitattributes") {
			continue
		}
		if err := g.removeRel(wfd, e.path); err != nil {
			return err
		}
		g.pruneEmptyParents(wfd, e.path)
	}
	return nil
}

// removeRel removes wt/rel and everything below it, except keep paths
// below it. A path that cannot exist (a parent is missing, or is not a
// directory but, say, a symlink) is not an error: nothing is followed.
func (g *Guard) removeRel(wfd int, rel string) error {
	pfd, base, err := openParentAt(wfd, rel)
	if err != nil {
		if isNotExist(err) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil
		}
		return err
	}
	defer unix.Close(pfd)
	if !g.hasKeptBelow(rel) {
		if err := removeAllAt(pfd, base); err != nil {
			return fmt.Errorf("remove %s: %w", rel, err)
		}
		return nil
	}
	fd, err := openDirAt(pfd, base)
	if err != nil {
		if isNotExist(err) {
			return nil
		}
		return removeAllAt(pfd, base) // not a directory: holds no keep path
	}
	names, err := readDirNames(fd)
	unix.Close(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if c := rel + "/" + n; !g.isKept(c) {
			if err := g.removeRel(wfd, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// pruneEmptyParents removes the parent directories of rel that are empty,
// innermost first (rmdir: a directory that holds anything stays).
func (g *Guard) pruneEmptyParents(wfd int, rel string) {
	for dir := path.Dir(rel); dir != "." && dir != "/" && !g.isKept(dir); dir = path.Dir(dir) {
		pfd, base, err := openParentAt(wfd, dir)
		if err != nil {
			return
		}
		err = unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR)
		unix.Close(pfd)
		if err != nil {
			return
		}
	}
}

// checkoutBaseline gives the temporary index the baseline's entries for
// every path that differs (stageBaseline, unless the snapshot did already),
// writes those files (checkout-index -u, which
// records their stat data), and makes it the index. Entries that match
// the baseline keep the stat data the add just recorded, so nothing else
// is read or written.
func (g *Guard) checkoutBaseline(ctx context.Context, gfd int, s *snap) error {
	if !s.staged {
		if err := g.stageBaseline(ctx, s); err != nil {
			return err
		}
	}
	var co bytes.Buffer
	for _, e := range parseRaw(s.diff) {
		if e.status != 'A' {
			co.WriteString(e.path)
			co.WriteByte(0)
		}
	}
	if co.Len() > 0 {
		if _, err := g.git(ctx, gitOpts{index: g.tmpIndex, stdin: &co}, "checkout-index", "-f", "-u", "-z", "--stdin"); err != nil {
			return err
		}
	}
	if _, err := lstatAt(gfd, tmpIndexName); err != nil {
		if !isNotExist(err) {
			return err
		}
		// No index before and nothing to write (an empty baseline).
		return removeAllAt(gfd, "index")
	}
	if st, err := lstatAt(gfd, "index"); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := removeAllAt(gfd, "index"); err != nil {
			return err
		}
	}
	return unix.Renameat(gfd, tmpIndexName, gfd, "index")
}

// stageBaseline gives the temporary index the baseline's entries for every
// path that differs (update-index --index-info: removals first, so no
// file/directory conflict). Only the temporary index changes.
func (g *Guard) stageBaseline(ctx context.Context, s *snap) error {
	var rm, add bytes.Buffer
	for _, e := range parseRaw(s.diff) {
		if e.status == 'A' {
			fmt.Fprintf(&rm, "0 %s\t%s\x00", strings.Repeat("0", len(e.dstOID)), e.path)
			continue
		}
		fmt.Fprintf(&add, "%s %s\t%s\x00", e.srcMode, e.srcOID, e.path)
	}
	if rm.Len()+add.Len() > 0 {
		rm.Write(add.Bytes())
		if _, err := g.git(ctx, gitOpts{index: g.tmpIndex, stdin: &rm}, "update-index", "-z", "--index-info"); err != nil {
			return err
		}
	}
	s.staged = true
	return nil
}
