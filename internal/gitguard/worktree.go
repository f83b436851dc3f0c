package gitguard

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// open validates the worktree and fills the per-call fields of g. With
// needState it also requires and loads the registration state.
//
//shimlint:allow atpaths: EvalSymlinks resolves the supervisor's worktree path once, at registration; everything after goes through the dir fds it opens
func (g *Guard) open(needState bool) error {
	resolved, err := filepath.EvalSymlinks(g.wt)
	if err != nil {
		return errorf(CodeWorktreeRefused, err, "worktree %s cannot be resolved", g.name)
	}
	if resolved != g.wt {
		return errorf(CodeWorktreeRefused, nil, "worktree %s resolves to %s, outside its declared path", g.wt, resolved)
	}
	var st unix.Stat_t
	if err := unix.Lstat(g.wt, &st); err != nil {
		return errorf(CodeWorktreeRefused, err, "worktree %s", g.name)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return errorf(CodeWorktreeRefused, nil, "worktree %s is not a directory", g.name)
	}
	g.uid, g.gid = int(st.Uid), int(st.Gid)
	euid, egid := os.Geteuid(), os.Getegid()
	if euid != 0 && g.uid != euid {
		return errorf(CodeWorktreeRefused, nil, "worktree %s is owned by uid %d; shim runs as uid %d and cannot run git as the owner", g.name, g.uid, euid)
	}
	g.asOwner = g.uid != euid || (euid == 0 && g.gid != egid)

	gitDir, inside, err := g.findGitDir()
	if err != nil {
		return err
	}
	g.gitDir = gitDir
	g.keep = g.keep[:len(g.cfg.KeepPaths)]
	if inside != "" {
		g.keep = append(g.keep, inside)
	}
	g.tmpIndex = filepath.Join(gitDir, tmpIndexName)
	g.st = nil
	g.refsKept, g.trusted = false, nil
	g.filters = nil
	s, err := g.loadState()
	if err != nil {
		return err
	}
	if s == nil && needState {
		return errorf(CodeBadRequest, nil, "worktree %s is not registered (state dir %s)", g.name, g.cfg.StateDir)
	}
	if s != nil {
		if s.Worktree != g.name || s.GitDir != g.stateGitDir(gitDir) {
			return errorf(CodeBadRequest, nil, "state dir %s belongs to worktree %s (git dir %s), not %s (git dir %s)",
				g.cfg.StateDir, s.Worktree, s.GitDir, g.name, g.stateGitDir(gitDir))
		}
		g.st = s
		g.filters = s.Filters
	}
	return nil
}

// stateGitDir is git dir gd as the registration state names it: below
// the worktree's name, not its view.
func (g *Guard) stateGitDir(gd string) string {
	if rel, ok := strings.CutPrefix(gd, g.wt+"/"); ok {
		return filepath.Join(g.name, rel)
	}
	return gd
}

// findGitDir returns the git dir of the worktree and, when it is not .git
// but another directory inside the worktree (a gitfile), its relative path.
//
//shimlint:allow atpaths: the resolved path is checked to be inside the worktree before it is used
func (g *Guard) findGitDir() (string, string, error) {
	dotgit := filepath.Join(g.wt, ".git")
	var st unix.Stat_t
	if err := unix.Lstat(dotgit, &st); err != nil {
		return "", "", errorf(CodeWorktreeRefused, err, "%s is not a git repository", g.name)
	}
	gitDir := dotgit
	inside := ""
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
	case unix.S_IFLNK:
		return "", "", errorf(CodeWorktreeRefused, nil, "%s is a symlink", dotgit)
	case unix.S_IFREG:
		data, err := readGitfile(g.wt)
		if err != nil {
			return "", "", errorf(CodeWorktreeRefused, err, "%s: unreadable gitfile", dotgit)
		}
		target, ok := gitformat.ParseGitfile(data)
		if !ok {
			return "", "", errorf(CodeWorktreeRefused, nil, "%s: not a gitfile", dotgit)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(g.wt, target)
		}
		target = filepath.Clean(target)
		if !within(g.wt, target) || target == g.wt {
			return "", "", errorf(CodeWorktreeRefused, nil, "%s points to %s, outside the worktree", dotgit, target)
		}
		if r, err := filepath.EvalSymlinks(target); err != nil || r != target {
			return "", "", errorf(CodeWorktreeRefused, err, "%s points to %s, which is missing or goes through a symlink", dotgit, target)
		}
		gitDir = target
		inside = strings.TrimPrefix(target, g.wt+"/")
	default:
		return "", "", errorf(CodeWorktreeRefused, nil, "%s is not a directory or gitfile", dotgit)
	}
	for _, n := range []string{"objects", "refs"} {
		var s unix.Stat_t
		if err := unix.Lstat(filepath.Join(gitDir, n), &s); err != nil || s.Mode&unix.S_IFMT != unix.S_IFDIR {
			return "", "", errorf(CodeWorktreeRefused, err, "%s: %s is missing or not a directory: not a git repository", gitDir, n)
		}
	}
	return gitDir, inside, nil
}

// readGitfile reads wt/.git as a regular file (never a FIFO or a link).
func readGitfile(wt string) ([]byte, error) {
	wfd, err := openDir(wt)
	if err != nil {
		return nil, err
	}
	defer unix.Close(wfd)
	data, _, err := readFileAt(wfd, ".git", 4096)
	return data, err
}

// validHead accepts what git writes into HEAD: a symref to refs/ or an
// object id.
func validHead(h string) bool {
	h = strings.TrimSuffix(h, "\n")
	if strings.ContainsAny(h, "\n\x00") {
		return false
	}
	if ref, ok := strings.CutPrefix(h, "ref: "); ok {
		return strings.HasPrefix(ref, "refs/") && !strings.Contains(ref, "..") && !strings.ContainsAny(ref, " \t\\:?*[~^")
	}
	return isHex(h) && (len(h) == 40 || len(h) == 64)
}

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
