package gitguard

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// state is StateDir/state.json, written by the first registration (and
// again when the first trusted index is saved).
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
	// Late and Dropped are the RegisterReport of the registration.
	Late    bool     `json:"late,omitempty"`
	Dropped []string `json:"dropped,omitempty"`
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

// RegisterOptions are the options of a worktree's first registration.
type RegisterOptions struct {
	// Late says a generation may already have written the worktree: the
	// metadata found there is not trusted. The pristine config is then
	// built from a minimal safe set of its keys (see RegisterWith), no hook
	// is kept, info/ keeps only exclude, and objects/info/alternates,
	// config.worktree and the index are not taken over.
	Late bool
	// RemoteURLs (remote name -> URL, from the announcement) override or
	// add remote.<name>.url in the pristine config of a late registration:
	// https, http, file URLs or plain paths only. Only with Late.
	RemoteURLs map[string]string
}

// RegisterReport says how the worktree was registered. A later call returns
// the report of the first registration.
type RegisterReport struct {
	Late bool `json:"late"`
	// Dropped lists what a late registration did not take over, relative
	// to the git dir: config keys as git lists them (lower-case section
	// and name, e.g. "core.fsmonitor", "url.<base>.insteadof",
	// "include.path"), "hooks/<name>" (sample hooks are not listed),
	// "info/<name>" (e.g. "info/attributes"), "objects/info/alternates",
	// "config.worktree" and "index".
	Dropped []string `json:"dropped,omitempty"`
}

// Register is RegisterWith with no options: a trusted registration.
func (g *Guard) Register(ctx context.Context) error {
	_, err := g.RegisterWith(ctx, RegisterOptions{})
	return err
}

// RegisterWith validates the worktree and, on its first registration only,
// saves the pristine copies of the git metadata (config, config.worktree,
// HEAD, hooks/, info/, objects/info/alternates) and of the index into
// StateDir, which every Restore puts back before git runs; later calls only
// validate and return the first registration's report.
//
// A trusted registration (the default) copies the metadata as it is: it
// must run before the first harness can write the worktree. A late one
// (opts.Late) trusts none of it and keeps only core.repositoryformatversion,
// core.filemode, core.symlinks, core.ignorecase, core.precomposeunicode,
// core.logallrefupdates, core.bare (written false), extensions.objectformat,
// remote.<name>.url (https, http, file or a plain path; opts.RemoteURLs
// override or add), remote.<name>.fetch, branch.<name>.remote,
// branch.<name>.merge, user.name and user.email; it writes an empty hooks
// directory, keeps info/exclude only, and drops objects/info/alternates,
// config.worktree and the index (the first restore re-reads every file).
// Everything dropped is listed in the report. The config is read by shim
// (a regular file, never followed, never waited on) and parsed by hardened
// git from stdin, without includes.
//
// Registration writes nothing into the worktree. A worktree that resolves
// outside its declared path, a .git that is a symlink or a gitfile pointing
// outside the worktree, a directory that is not a repository, a linked
// worktree, or metadata that is not a regular file is WORKTREE_REFUSED.
func (g *Guard) RegisterWith(ctx context.Context, opts RegisterOptions) (RegisterReport, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(opts.RemoteURLs) > 0 && !opts.Late {
		return RegisterReport{}, errorf(CodeBadRequest, nil, "remote URLs are only taken at a late registration (a trusted one copies the config as it is)")
	}
	if err := validRemoteURLs(opts.RemoteURLs); err != nil {
		return RegisterReport{}, err
	}
	if err := g.open(false); err != nil {
		return RegisterReport{}, err
	}
	if err := g.prepareStateDir(); err != nil {
		return RegisterReport{}, err
	}
	if g.st != nil {
		return RegisterReport{Late: g.st.Late, Dropped: g.st.Dropped}, nil
	}
	s, err := g.savePristine(ctx, opts)
	if err != nil {
		return RegisterReport{}, err
	}
	// The pristine copies are on disk before the state that says they
	// exist (a power cut must not leave a registration without them).
	if err := syncFS(g.cfg.StateDir); err != nil {
		return RegisterReport{}, errorf(CodeInternal, err, "sync the pristine copy")
	}
	if err := g.saveState(s); err != nil {
		return RegisterReport{}, errorf(CodeInternal, err, "write state")
	}
	g.st = s
	g.filters = s.Filters
	return RegisterReport{Late: s.Late, Dropped: s.Dropped}, nil
}

// stateFile is the path of name in StateDir.
func (g *Guard) stateFile(name string) string { return filepath.Join(g.cfg.StateDir, name) }

// saveState writes StateDir/state.json.
func (g *Guard) saveState(s *state) error {
	data, _ := json.MarshalIndent(s, "", "  ")
	return writeFileAtomic(g.stateFile(stateFile), data, nil)
}

// readFileTrusted reads a file of StateDir, which only we write.
//
//shimlint:allow atpaths: its callers pass paths in shim's state dir (root, 0700)
func readFileTrusted(path string) ([]byte, error) { return os.ReadFile(path) }

//shimlint:allow atpaths: the state dir is shim's own (root, 0700)
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

// prepareStateDir creates StateDir (0700, owned by us, not a symlink).
//
//shimlint:allow atpaths: the state dir is shim's own (root, 0700)
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

// writeFileAtomic writes a file of StateDir (trusted, ours) via a temporary
// and rename; mtime, if set, is kept.
//
//shimlint:allow atpaths: its callers pass paths in shim's state dir (root, 0700)
func writeFileAtomic(path string, data []byte, mtime *unix.Timespec) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && mtime != nil {
		err = unix.UtimesNano(tmp, []unix.Timespec{*mtime, *mtime})
	}
	if err == nil {
		// StateDir's files are what a restarted shim trusts: durable
		// (file, rename, directory) before the call returns.
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// syncFS flushes the filesystem dir is on (syncfs(2)): once, after many
// files were written (a registration's pristine copy).
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}
