package gitguard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// state is StateDir/state.json, written once by the first Register.
type state struct {
	Version      int       `json:"version"`
	Worktree     string    `json:"worktree"`
	GitDir       string    `json:"git_dir"`
	RegisteredAt time.Time `json:"registered_at"`
	// Head is the pristine content of .git/HEAD; a symref (ref: ...) is put
	// back after each snapshot so every generation starts on the same branch.
	Head string `json:"head"`
	// Filters are the filter.<name>.* drivers of the pristine config; each
	// is neutralised with -c on every invocation.
	Filters []string `json:"filters,omitempty"`
	// Includes is true when the pristine config includes other files, which
	// the harness may be able to edit: then the filter names are read again
	// (with includes) on every Restore.
	Includes bool `json:"includes,omitempty"`
	// Optional metadata files that existed at registration.
	HasConfigWorktree bool `json:"has_config_worktree,omitempty"`
	HasAlternates     bool `json:"has_alternates,omitempty"`
	HasHooks          bool `json:"has_hooks,omitempty"`
	HasInfo           bool `json:"has_info,omitempty"`
	HasIndex          bool `json:"has_index,omitempty"`
}

const stateVersion = 1

// Names inside StateDir.
const (
	stateFile    = "state.json"
	pristineDir  = "pristine"
	trustedIndex = "index"
	// tmpIndexName is the temporary index of the snapshot, in the git dir
	// (git runs as the worktree owner and cannot write into StateDir).
	tmpIndexName = "shim-snapshot.index"
	// keepExcludeName holds the keep paths as ignore patterns while the
	// snapshot is taken.
	keepExcludeName = "shim-keep.exclude"
)

// open validates the worktree and fills the per-call fields of g. With
// needState it also requires and loads the registration state.
func (g *Guard) open(needState bool) error {
	resolved, err := filepath.EvalSymlinks(g.wt)
	if err != nil {
		return errorf(CodeWorktreeRefused, err, "worktree %s cannot be resolved", g.wt)
	}
	if resolved != g.wt {
		return errorf(CodeWorktreeRefused, nil, "worktree %s resolves to %s, outside its declared path", g.wt, resolved)
	}
	var st unix.Stat_t
	if err := unix.Lstat(g.wt, &st); err != nil {
		return errorf(CodeWorktreeRefused, err, "worktree %s", g.wt)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return errorf(CodeWorktreeRefused, nil, "worktree %s is not a directory", g.wt)
	}
	g.uid, g.gid = int(st.Uid), int(st.Gid)
	euid, egid := os.Geteuid(), os.Getegid()
	if euid != 0 && g.uid != euid {
		return errorf(CodeWorktreeRefused, nil, "worktree %s is owned by uid %d; shim runs as uid %d and cannot run git as the owner", g.wt, g.uid, euid)
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
	g.filters = nil
	s, err := g.loadState()
	if err != nil {
		return err
	}
	if s == nil && needState {
		return errorf(CodeBadRequest, nil, "worktree %s is not registered (state dir %s)", g.wt, g.cfg.StateDir)
	}
	if s != nil {
		if s.Worktree != g.wt || s.GitDir != gitDir {
			return errorf(CodeBadRequest, nil, "state dir %s belongs to worktree %s (git dir %s), not %s (git dir %s)",
				g.cfg.StateDir, s.Worktree, s.GitDir, g.wt, gitDir)
		}
		g.st = s
		g.filters = s.Filters
	}
	return nil
}

// findGitDir returns the git dir of the worktree and, when it is not .git
// but another directory inside the worktree (a gitfile), its relative path.
func (g *Guard) findGitDir() (string, string, error) {
	dotgit := filepath.Join(g.wt, ".git")
	var st unix.Stat_t
	if err := unix.Lstat(dotgit, &st); err != nil {
		return "", "", errorf(CodeWorktreeRefused, err, "%s is not a git repository", g.wt)
	}
	gitDir := dotgit
	inside := ""
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
	case unix.S_IFLNK:
		return "", "", errorf(CodeWorktreeRefused, nil, "%s is a symlink", dotgit)
	case unix.S_IFREG:
		data, err := os.ReadFile(dotgit)
		if err != nil || len(data) > 4096 {
			return "", "", errorf(CodeWorktreeRefused, err, "%s: unreadable gitfile", dotgit)
		}
		line, _, _ := strings.Cut(string(data), "\n")
		target, ok := strings.CutPrefix(strings.TrimSpace(line), "gitdir:")
		if !ok {
			return "", "", errorf(CodeWorktreeRefused, nil, "%s: not a gitfile", dotgit)
		}
		target = strings.TrimSpace(target)
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

func (g *Guard) loadState() (*state, error) {
	data, err := os.ReadFile(filepath.Join(g.cfg.StateDir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errorf(CodeInternal, err, "read state")
	}
	var s state
	if err := json.Unmarshal(data, &s); err != nil || s.Version != stateVersion {
		return nil, errorf(CodeInternal, err, "state %s is unreadable or of another version", filepath.Join(g.cfg.StateDir, stateFile))
	}
	return &s, nil
}

// Register validates the worktree and, on its first registration only,
// saves the trusted copies of the git metadata (config, config.worktree,
// HEAD, hooks/, info/, objects/info/alternates) and of the index into
// StateDir. It must run before the first harness can write the worktree;
// later calls only validate. A worktree that resolves outside its declared
// path, a .git that is a symlink or a gitfile pointing outside the worktree,
// or a directory that is not a repository is WORKTREE_REFUSED.
func (g *Guard) Register(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(false); err != nil {
		return err
	}
	if err := g.prepareStateDir(); err != nil {
		return err
	}
	if g.st != nil {
		return nil
	}
	s, err := g.savePristine(ctx)
	if err != nil {
		return err
	}
	data, _ := json.MarshalIndent(s, "", "  ")
	if err := writeFileAtomic(filepath.Join(g.cfg.StateDir, stateFile), data, nil); err != nil {
		return errorf(CodeInternal, err, "write state")
	}
	g.st = s
	g.filters = s.Filters
	return nil
}

// prepareStateDir creates StateDir (0700, owned by us, not a symlink).
func (g *Guard) prepareStateDir() error {
	sd := g.cfg.StateDir
	if err := os.MkdirAll(sd, 0o700); err != nil {
		return errorf(CodeInternal, err, "create state dir")
	}
	var st unix.Stat_t
	if err := unix.Lstat(sd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return errorf(CodeBadRequest, err, "state dir %s is not a directory", sd)
	}
	if int(st.Uid) != os.Geteuid() {
		return errorf(CodeBadRequest, nil, "state dir %s is owned by uid %d, not by us", sd, st.Uid)
	}
	if err := os.Chmod(sd, 0o700); err != nil {
		return errorf(CodeInternal, err, "chmod state dir")
	}
	return nil
}

// savePristine copies the metadata into StateDir/pristine (via a temporary
// directory renamed into place, so a crash leaves no half copy) and returns
// the state describing it.
func (g *Guard) savePristine(ctx context.Context) (*state, error) {
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return nil, errorf(CodeWorktreeRefused, err, "open git dir")
	}
	defer unix.Close(gfd)
	if _, err := lstatAt(gfd, "commondir"); err == nil {
		return nil, errorf(CodeWorktreeRefused, nil, "%s has a commondir file: linked worktrees are not supported", g.gitDir)
	}
	s := &state{Version: stateVersion, Worktree: g.wt, GitDir: g.gitDir, RegisteredAt: time.Now().UTC()}

	tmp := filepath.Join(g.cfg.StateDir, pristineDir+".tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return nil, errorf(CodeInternal, err, "clear %s", tmp)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, errorf(CodeInternal, err, "create %s", tmp)
	}
	pfd, err := openDir(tmp)
	if err != nil {
		return nil, errorf(CodeInternal, err, "open %s", tmp)
	}
	defer unix.Close(pfd)

	copyFile := func(name, dst string, required bool) (bool, error) {
		data, st, err := readFileAt(gfd, name, 16<<20)
		if err != nil {
			if isNotExist(err) && !required {
				return false, nil
			}
			return false, errorf(CodeWorktreeRefused, err, "read %s/%s", g.gitDir, name)
		}
		return true, writeFileAt(pfd, dst, data, st.Mode&0o7777, -1, -1, nil)
	}
	if _, err := copyFile("config", "config", true); err != nil {
		return nil, err
	}
	if s.HasConfigWorktree, err = copyFile("config.worktree", "config.worktree", false); err != nil {
		return nil, err
	}
	head, _, err := readFileAt(gfd, "HEAD", 4096)
	if err != nil || !validHead(string(head)) {
		return nil, errorf(CodeWorktreeRefused, err, "%s/HEAD is missing or invalid", g.gitDir)
	}
	s.Head = string(head)
	if ofd, err := openDirAt(gfd, "objects"); err == nil {
		if ifd, err := openDirAt(ofd, "info"); err == nil {
			data, st, rerr := readFileAt(ifd, "alternates", 1<<20)
			if rerr == nil {
				s.HasAlternates = true
				err = writeFileAt(pfd, "alternates", data, st.Mode, -1, -1, nil)
			}
			unix.Close(ifd)
			if err != nil {
				unix.Close(ofd)
				return nil, errorf(CodeInternal, err, "save alternates")
			}
		}
		unix.Close(ofd)
	}
	for _, d := range []struct {
		name string
		has  *bool
	}{{"hooks", &s.HasHooks}, {"info", &s.HasInfo}} {
		tree := map[string]fileEntry{}
		err := readTreeAt(gfd, d.name, "", tree)
		if err != nil {
			if isNotExist(err) {
				continue
			}
			return nil, errorf(CodeWorktreeRefused, err, "read %s/%s", g.gitDir, d.name)
		}
		*d.has = true
		if err := writeTreeAt(pfd, d.name, tree, 0o700, -1, -1); err != nil {
			return nil, errorf(CodeInternal, err, "save %s", d.name)
		}
	}
	// The trusted index: git's own stat record of the files at
	// registration. Snapshots and resets start from it rather than from the
	// index the harness leaves, whose entries it may have forged.
	if data, st, err := readFileAt(gfd, "index", 1<<31); err == nil {
		mt := st.Mtim
		if err := writeFileAtomic(filepath.Join(g.cfg.StateDir, trustedIndex), data, &mt); err != nil {
			return nil, errorf(CodeInternal, err, "save index")
		}
		s.HasIndex = true
	} else if !isNotExist(err) {
		return nil, errorf(CodeWorktreeRefused, err, "read %s/index", g.gitDir)
	}

	// Filter drivers of the pristine config, read by git itself (no
	// includes) from the file just copied.
	cfgOut, err := g.git(ctx, gitOpts{}, "config", "--file", filepath.Join(g.gitDir, "config"), "--no-includes", "-z", "--list")
	if err != nil {
		return nil, errorf(CodeWorktreeRefused, err, "read %s/config", g.gitDir)
	}
	s.Filters, s.Includes = parseConfigList(cfgOut)

	final := filepath.Join(g.cfg.StateDir, pristineDir)
	if err := os.RemoveAll(final); err != nil {
		return nil, errorf(CodeInternal, err, "clear %s", final)
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, errorf(CodeInternal, err, "save pristine copy")
	}
	return s, nil
}

// parseConfigList reads `git config -z --list` output and returns the filter
// driver names and whether include directives are present.
func parseConfigList(out []byte) (filters []string, includes bool) {
	seen := map[string]bool{}
	for _, rec := range bytes.Split(out, []byte{0}) {
		key, _, _ := strings.Cut(string(rec), "\n")
		lk := strings.ToLower(key)
		if strings.HasPrefix(lk, "include.") || strings.HasPrefix(lk, "includeif.") {
			includes = true
		}
		if !strings.HasPrefix(lk, "filter.") {
			continue
		}
		rest := key[len("filter."):]
		i := strings.LastIndexByte(rest, '.')
		if i <= 0 {
			continue
		}
		name := rest[:i]
		if !seen[name] && validFilterName(name) {
			seen[name] = true
			filters = append(filters, name)
		}
	}
	return filters, includes
}

// validFilterName rejects names that could not be passed as a -c key.
func validFilterName(n string) bool {
	return n != "" && !strings.ContainsAny(n, "=\n\x00")
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

// writeFileAtomic writes a file of StateDir (trusted, ours) via a temporary
// and rename; mtime, if set, is kept.
func writeFileAtomic(path string, data []byte, mtime *unix.Timespec) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if mtime != nil {
		if err := unix.UtimesNano(tmp, []unix.Timespec{*mtime, *mtime}); err != nil {
			return err
		}
	}
	return os.Rename(tmp, path)
}
