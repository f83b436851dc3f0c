package gitguard

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pristineBranch is the branch the pristine HEAD names, or "".
func (g *Guard) pristineBranch() string {
	b, ok := strings.CutPrefix(strings.TrimSpace(g.st.Head), "ref: ")
	if !ok {
		return ""
	}
	return b
}

// updateRefs moves the pristine branch to the baseline and the replace
// refs the harness left aside, in one update-ref transaction. The branch is
// written as a plain ref (no-deref): a harness that made it a symref cannot
// redirect the update to another ref.
func (g *Guard) updateRefs(ctx context.Context, generation uint64, s *snap, rep *Report) error {
	var in strings.Builder
	if b := g.pristineBranch(); b != "" {
		fmt.Fprintf(&in, "option no-deref\nupdate %s %s\n", b, s.baseline)
	}
	in.WriteString(replaceRefCommands(generation, s.replaceRefs))
	if in.Len() == 0 {
		return nil
	}
	msg := fmt.Sprintf("shim: reset to the baseline (generation %d fenced)", generation)
	if _, err := g.git(ctx, gitOpts{stdin: strings.NewReader(in.String())}, "update-ref", "-m", msg, "--stdin"); err != nil {
		return fmt.Errorf("update refs: %w", err)
	}
	for _, r := range s.replaceRefs {
		rep.ReplaceRefsMoved = append(rep.ReplaceRefsMoved, r[0])
	}
	if b := g.pristineBranch(); b != "" {
		return g.trustRefs(map[string]string{b: s.baseline})
	}
	return nil
}

// listReplaceRefs lists refs/replace/* (name, object).
func (g *Guard) listReplaceRefs(ctx context.Context) ([][2]string, error) {
	out, err := g.git(ctx, gitOpts{}, "for-each-ref", "--format=%(refname)%00%(objectname)", "refs/replace/")
	if err != nil {
		return nil, err
	}
	var refs [][2]string
	for _, line := range strings.Split(string(out), "\n") {
		name, oid, ok := strings.Cut(line, "\x00")
		if ok && strings.HasPrefix(name, "refs/replace/") && isHex(oid) {
			refs = append(refs, [2]string{name, oid})
		}
	}
	return refs, nil
}

// replaceRefCommands are the update-ref --stdin lines that move each
// replace ref to refs/shim/replace/<gen>/<name> (never through a symref).
func replaceRefCommands(generation uint64, refs [][2]string) string {
	var b strings.Builder
	for _, r := range refs {
		dst := ReplaceRefPrefix + strconv.FormatUint(generation, 10) + "/" + strings.TrimPrefix(r[0], "refs/replace/")
		fmt.Fprintf(&b, "option no-deref\nupdate %s %s\noption no-deref\ndelete %s\n", dst, r[1], r[0])
	}
	return b.String()
}

// syncRef makes ref durable before anything that depends on it is
// recorded (a fence's state, the layer's marker): the loose ref's file, or
// packed-refs, and every directory from the git dir down to it, fsynced.
// Git syncs a ref's file (core.fsync) but not the directories a rename
// changed, and a power cut right after a fence left a snapshot ref empty.
func (g *Guard) syncRef(ref string) error {
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return err
	}
	dirs := []int{gfd}
	defer func() {
		for _, fd := range dirs {
			unix.Close(fd)
		}
	}()
	parts := strings.Split(ref, "/")
	fd := gfd
	for _, c := range parts[:len(parts)-1] {
		next, err := openDirAt(fd, c)
		if err != nil {
			break // no loose ref below: packed
		}
		dirs = append(dirs, next)
		fd = next
	}
	synced := false
	for _, f := range []struct {
		dir  int
		name string
	}{{fd, parts[len(parts)-1]}, {gfd, "packed-refs"}} {
		ffd, err := unix.Openat(f.dir, f.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			if err == unix.ENOENT {
				continue
			}
			return &os.PathError{Op: "open", Path: f.name, Err: err}
		}
		err = unix.Fsync(ffd)
		unix.Close(ffd)
		if err != nil {
			return &os.PathError{Op: "fsync", Path: f.name, Err: err}
		}
		synced = true
	}
	if !synced {
		return fmt.Errorf("%s is neither a loose ref nor in packed-refs", ref)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := unix.Fsync(dirs[i]); err != nil {
			return &os.PathError{Op: "fsync", Path: ref, Err: err}
		}
	}
	return nil
}
