// Package gitguard saves and restores the worktree of an agent sandbox when
// shim fences an abandoned generation.
//
// The worktree and its .git directory are writable by the untrusted harness,
// so every git invocation is hardened (explicit environment, -c overrides
// that switch off every hook, filter, fsmonitor, pager, helper and protocol,
// run as the worktree owner rather than root) and the git metadata the
// harness could have used to redirect or run code (.git/config, hooks/,
// info/, HEAD, ...) is put back from a trusted copy taken at registration
// before any git runs.
//
// Restore never loses data: every abandoned edit (tracked changes and
// untracked files) is committed under refs/shim/abandoned/<generation>
// before the worktree is reset to the baseline and cleaned, and the result is
// verified; anything left over is a RESTORE_FAILED error (fail closed).
//
// What of git's formats shim reads and writes itself (loose objects, packs
// and their indexes, refs) is parsed by internal/gitformat; gitguard opens
// the files (through *at calls, never a harness's link) and decides.
package gitguard

import (
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// Codes used by this package: the control API's (package api), so the
// runtime passes them through unchanged.
const (
	CodeWorktreeRefused = api.CodeWorktreeRefused
	CodeRestoreFailed   = api.CodeRestoreFailed
	CodeNotFound        = api.CodeNotFound
	CodeBadRequest      = api.CodeBadRequest
	CodeInternal        = api.CodeInternal
)

// RefPrefix is the namespace of the snapshot refs: refs/shim/abandoned/<gen>.
const RefPrefix = "refs/shim/abandoned/"

// ReplaceRefPrefix is where Restore moves the replace refs (refs/replace/*)
// an abandoned generation left: refs/shim/replace/<gen>/<name>. Moved, not
// deleted, so nothing is lost; the next harness's git no longer sees
// replaced objects.
const ReplaceRefPrefix = "refs/shim/replace/"

// maxListed caps Report.Paths, Report.Ignored and Snapshot.Paths so a fence
// report stays small even when a harness touched a whole tree.
const maxListed = 1000

// Error is shim's one internal error type (package errs).
type Error = errs.Error

func errorf(code string, cause error, format string, args ...any) *Error {
	return errs.Wrap(code, cause, format, args...)
}

// Config describes one guarded worktree.
type Config struct {
	// Worktree is the absolute path of the checkout. It must not resolve
	// through a symlink to another place.
	Worktree string
	// View, when set, is where the guard reads and writes the checkout
	// instead of Worktree: a private writable bind of it (a layered
	// worktree's locked lower, layers.LockLower). Worktree stays its name
	// in reports and in the registration state.
	View string
	// ViewGroup is the group that may enter View's directory: every git
	// run as the owner gets it as its one supplementary group.
	ViewGroup uint32
	// StateDir is a private directory (created 0700 if missing) that holds
	// the trusted copies of the git metadata and the trusted index. It must
	// not be inside the worktree.
	StateDir string
	// Runner runs git; nil means ExecRunner. In shim the runtime supplies one
	// that confines git to a throwaway cgroup with no network.
	Runner Runner
	// Git is the git binary; "" means "git" looked up in PATH=/usr/bin:/bin.
	Git string
	// KeepPaths are worktree-relative paths that are neither saved nor
	// cleaned (e.g. a cache directory).
	KeepPaths []string
	// IncludeIgnored also saves ignored files in the snapshot; otherwise
	// they are only listed in the report (and removed by the clean).
	IncludeIgnored bool
	// KeepSnapshots is how many refs/shim/abandoned/* Restore keeps (the
	// newest ones); 0 keeps all.
	KeepSnapshots int
	// GitTimeout bounds every single git invocation (in addition to the
	// caller's ctx): a git the harness blocks (a FIFO planted where git
	// reads) or stops (SIGSTOP, same uid) is killed then and the step
	// fails, saying it timed out. 0 is DefaultGitTimeout. The fetch has its
	// own (FetchSpec.Timeout).
	GitTimeout time.Duration
	// MaxFileSize is the largest file a snapshot stores (bytes); 0 is
	// DefaultMaxFileSize. A larger file, and any special file (FIFO,
	// socket, device) where a file could be, is not stored: it is listed in
	// Report.NotStored (path, type, size, and a hash of at most
	// HashBound bytes, read within HashDeadline) and in the snapshot
	// commit's message, left out of its tree, and removed by the restore.
	MaxFileSize int64
}

// DefaultGitTimeout is Config.GitTimeout when it is 0.
const DefaultGitTimeout = 60 * time.Second

// DefaultMaxFileSize is Config.MaxFileSize when it is 0.
const DefaultMaxFileSize = 64 << 20

// Guard saves and restores one worktree. Its methods are safe for concurrent
// use; they are serialised internally.
type Guard struct {
	// moveOnly is the Restore in progress's WithSavedSnapshot (g.mu held).
	moveOnly bool
	cfg      Config
	runner   Runner
	gitBin   string
	// gitTimeout is Config.GitTimeout or its default.
	gitTimeout time.Duration
	// maxFile is Config.MaxFileSize or its default.
	maxFile int64
	wt      string   // cleaned absolute path where the checkout is read and written (Config.View or Worktree)
	name    string   // cleaned Config.Worktree: the worktree's name in reports and state
	keep    []string // KeepPaths plus an in-worktree git dir, cleaned, relative

	mu sync.Mutex
	// Filled by open() on every call: nothing is cached between calls, as
	// the harness may have changed the worktree in between.
	gitDir   string
	uid, gid int
	asOwner  bool
	st       *state
	filters  []string // filter names to neutralise on this call
	tmpIndex string
	// refsKept: the ref namespace is kept in StateDir/refs and restored
	// (a files backend; see refspace.go).
	refsKept bool
	// trusted is the trusted ref namespace once the refs step put it back.
	trusted refSet
	// looseScanned: per git dir, the loose-object fan-out directories an
	// earlier removeLeftovers read and found nothing to remove in, with
	// their stamp then (an unchanged stamp means no name was added since).
	looseScanned map[string]map[string]dirStamp
	// trees: per git dir, the tree of each baseline commit a layer
	// snapshot resolved (content-addressed: nothing a harness does
	// changes one), so that the next snapshot on that baseline runs no
	// git to resolve it.
	trees map[string]map[string]string
	// baseTrees: per git dir, the trees of the last baseline whose
	// harness history a layer snapshot read (its root and every subtree,
	// `ls-tree -r -d`; content-addressed, so never stale): the trees of
	// the repository's a harness's tree may name and still be whole.
	baseTrees map[string]baselineTrees
	// wholeTrees: per git dir, trees shim knows whole beyond the
	// baseline's: the ones its own imports wrote and the harness's trees
	// a history walk proved whole (history.go), so that a harness that
	// commits a tree the repository has already (a retried step redoing
	// its edit) needs no walk of the repository. Forgotten when a repack
	// may drop objects (Maintain). Guarded by wholeMu too: an import and
	// git's check of a history learn beside each other.
	wholeMu    sync.Mutex
	wholeTrees map[string]map[string]bool
	// unpruned: per git dir, snapshot refs were deleted (PruneSnapshots)
	// whose objects no full repack has dropped yet (g.mu held). Lost with
	// the process: the objects then wait for the next batch's repack.
	unpruned map[string]bool
}

// baselineTrees are the tree names of one baseline commit.
type baselineTrees struct {
	commit string
	trees  map[string]bool
}

// PathChange is one path of a snapshot that differs from the baseline.
type PathChange = api.PathChange

// Report describes one Restore: the fence report's "worktree" section,
// of which Restore fills all but the layer's and the lower's fields.
type Report = api.WorktreeReport

// Snapshot is one saved generation.
type Snapshot = api.Snapshot

// New checks the configuration and returns a Guard. It touches nothing on
// disk; Register does.
func New(cfg Config) (*Guard, error) {
	if cfg.Worktree == "" || !filepath.IsAbs(cfg.Worktree) {
		return nil, errorf(CodeBadRequest, nil, "worktree %q must be an absolute path", cfg.Worktree)
	}
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, errorf(CodeBadRequest, nil, "state dir %q must be an absolute path", cfg.StateDir)
	}
	wt := filepath.Clean(cfg.Worktree)
	if wt == "/" {
		return nil, errorf(CodeBadRequest, nil, "worktree must not be /")
	}
	sd := filepath.Clean(cfg.StateDir)
	if within(wt, sd) || within(sd, wt) {
		return nil, errorf(CodeBadRequest, nil, "state dir %q and worktree %q must not contain each other", sd, wt)
	}
	if cfg.KeepSnapshots < 0 {
		return nil, errorf(CodeBadRequest, nil, "keep snapshots must be >= 0")
	}
	if cfg.GitTimeout < 0 {
		return nil, errorf(CodeBadRequest, nil, "git timeout must be >= 0")
	}
	if cfg.MaxFileSize < 0 {
		return nil, errorf(CodeBadRequest, nil, "max file size must be >= 0")
	}
	g := &Guard{cfg: cfg, runner: cfg.Runner, gitBin: cfg.Git, wt: wt, name: wt, gitTimeout: cfg.GitTimeout, maxFile: cfg.MaxFileSize}
	if cfg.View != "" {
		if !filepath.IsAbs(cfg.View) {
			return nil, errorf(CodeBadRequest, nil, "view %q of worktree %s must be an absolute path", cfg.View, wt)
		}
		g.wt = filepath.Clean(cfg.View)
		if within(g.wt, sd) || within(sd, g.wt) {
			return nil, errorf(CodeBadRequest, nil, "state dir %q and view %q must not contain each other", sd, g.wt)
		}
	}
	if g.gitTimeout == 0 {
		g.gitTimeout = DefaultGitTimeout
	}
	if g.maxFile == 0 {
		g.maxFile = DefaultMaxFileSize
	}
	g.cfg.StateDir = sd
	if g.runner == nil {
		g.runner = ExecRunner{}
	}
	if g.gitBin == "" {
		g.gitBin = "git"
	}
	for _, p := range cfg.KeepPaths {
		c, err := cleanRel(p)
		if err != nil {
			return nil, err
		}
		g.keep = append(g.keep, c)
	}
	return g, nil
}

// cleanRel validates a worktree-relative keep path.
func cleanRel(p string) (string, error) {
	if p == "" || filepath.IsAbs(p) {
		return "", errorf(CodeBadRequest, nil, "keep path %q must be relative to the worktree", p)
	}
	c := filepath.Clean(p)
	if c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", errorf(CodeBadRequest, nil, "keep path %q must be inside the worktree", p)
	}
	if c == ".git" || strings.HasPrefix(c, ".git/") {
		return "", errorf(CodeBadRequest, nil, "keep path %q must not be in .git", p)
	}
	for _, r := range c {
		if r < 0x20 || r == 0x7f {
			return "", errorf(CodeBadRequest, nil, "keep path %q has a control character", p)
		}
	}
	return c, nil
}

// within reports whether p is dir or below it (both cleaned, absolute).
func within(dir, p string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// ownerGroups are the supplementary groups of a git run as the owner:
// the view's group when there is a view, none otherwise.
func (g *Guard) ownerGroups() []uint32 {
	if g.wt != g.name {
		return []uint32{g.cfg.ViewGroup}
	}
	return []uint32{}
}

// Worktree returns the guarded worktree path (its name, not its view).
func (g *Guard) Worktree() string { return g.name }
