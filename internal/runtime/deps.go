package runtime

import (
	"context"
	"os/exec"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/reaper"
)

// The runtime decides; the packages below it act. These are the consumer's
// view of each of them, as small as the decisions need, so that every rule
// of the fence is unit-tested against fakes (fakes_test.go) and the kernel
// only by the real tests of each package and the integration tests.

// groups is the cgroup manager as the runtime uses it.
type groups interface {
	Mode() cgroup.Mode
	Reason() string
	Root() string
	Create(name string, l cgroup.Limits) (cgroup.Group, error)
	Open(name string) (cgroup.Group, error)
	List() ([]string, error)
	GroupOf(pid int) (string, error)
	// Controllers reports which controllers generation cgroups can use.
	Controllers() map[string]bool
}

// layerSet is the layers dir (layers.Layers) as the runtime uses it:
// every generation's copy-on-write layers, the locked lowers of the
// layered worktrees, and the fenced generations' layers kept for
// forensics.
type layerSet interface {
	// Probe says why generations cannot get layers here ("": they can).
	Probe(ctx context.Context, shimPath string, run func(*exec.Cmd) error) string
	// Unusable says why the layers dir cannot take a generation's layers
	// now ("": it can); a start checks it.
	Unusable() string
	// NewPlan lays out generation gen's layers (worktree layers on wts);
	// Remove drops them.
	NewPlan(gen uint64, wts []string) (*layers.Plan, error)
	Remove(gen uint64) error
	// RootUpper and WorktreeUpper are where generation gen's layers are.
	RootUpper(gen uint64) string
	WorktreeUpper(path string, gen uint64) string
	// WorktreeLayers are generation gen's worktree layers, by worktree key.
	WorktreeLayers(gen uint64) map[string]string
	// Usage is how full a worktree layer is (ok false: unknown).
	Usage(upper string) (used, limit int64, full, ok bool)
	// Pin keeps generation gen's layers whatever the pruning says, and
	// why; Pinned lists them; Prune drops fenced layers beyond the bounds
	// (never one live says is needed).
	Pin(gen uint64, why string) error
	Pinned() []layers.PinnedLayer
	Prune(current uint64, live func(uint64) bool) error
	// LockLower makes a worktree's checkout the read-only lower of its
	// generations and returns the view shim works through; CheckLower
	// says whether it still is; UnlockLower undoes it.
	LockLower(path string) (string, error)
	CheckLower(path string) error
	UnlockLower(path string) error
	// LowerGroup is the gid of shim's gits that may enter the views.
	LowerGroup() uint32
	// What status reports of the isolation.
	Dir() string
	RootSize() int64
	WorktreeSize() int64
	Persist() []string
	Keep() int
	KeepBytes() int64
}

// credBroker hands a generation's git the credentials of its announcement.
type credBroker interface {
	Grant(gen uint64, cs []creds.Credential)
	Revoke(gen uint64) int
	// Suspend refuses gen until Resume, keeping its grants (a lease that
	// ran out); Resume undoes it unless gen was revoked meanwhile.
	Suspend(gen uint64) int
	Resume(gen uint64)
}

// genNetwork is a generation's own network namespace (modes none and
// isolated).
type genNetwork interface {
	// Run runs fn on a thread inside the generation's namespace (the fork
	// of the harness).
	Run(fn func() error) error
	// Env is what the harness needs to use it (the proxy variables).
	Env() []string
	Info() api.NetworkInfo
	// Cut aborts every connection of the generation (group), through the
	// proxy and in its namespace, and deletes its link; confirmed or
	// CUT_FAILED.
	Cut(group cgroup.Group) (api.CutReport, error)
	// Suspend aborts every connection as Cut does but keeps the link, and
	// refuses every new one through the proxy until Resume (a lease that
	// ran out; the generation is frozen).
	Suspend(group cgroup.Group) (api.CutReport, error)
	Resume()
	// Close releases it once the generation is gone.
	Close() error
}

// process is a harness as the reaper tracks it.
type process interface {
	Done() <-chan struct{}
	Exit() reaper.Exit
}

// worktree is one registered worktree's save and restore.
type worktree interface {
	// Restore saves generation gen's edits and resets the worktree to rev
	// (resolved among the trusted refs after the trusted metadata is put
	// back), optionally fetching first.
	Restore(ctx context.Context, gen uint64, rev string, fetch *fetchSpec) (*api.WorktreeReport, error)
	// PutOnBranch puts the worktree, at commit, on branch (created or
	// moved there; HEAD names it).
	PutOnBranch(ctx context.Context, branch, commit string) error
	// Move puts a worktree that holds nothing but a baseline (a layer's
	// lower; one Restore just reset) on rev, optionally fetching first;
	// generation gen's snapshot, which exists, is kept as it is.
	Move(ctx context.Context, gen uint64, rev string, fetch *fetchSpec) (*api.WorktreeReport, error)
	// RemoteHead asks the remote of an earlier push check where its branch
	// is now (the settle-window re-check), without touching the worktree.
	RemoteHead(ctx context.Context, first api.FetchReport, fetch *fetchSpec) (string, error)
	// ResolveBaseline resolves rev to a commit.
	ResolveBaseline(ctx context.Context, rev string) (string, error)
	// SnapshotLayer makes generation gen's worktree layer (upper; the
	// lower is at baseline) its snapshot commit.
	SnapshotLayer(ctx context.Context, gen uint64, baseline, upper string) (*api.WorktreeReport, error)
	// SnapshotIs reports whether generation gen's snapshot ref names
	// commit, a commit the repository has (gitguard.Guard.SnapshotIs).
	SnapshotIs(ctx context.Context, gen uint64, commit string) bool
	// VerifyLower puts the trusted git metadata back where the locked
	// lower's differs and says what it put back (gitguard.Guard.VerifyLower).
	VerifyLower(ctx context.Context) ([]string, error)
	// ForgetKnown drops what the worktree's guard knows whole of its
	// repository, for a lower found unlocked (gitguard.Guard.ForgetKnown).
	ForgetKnown()
	// LayerCapable reports whether a layer on the worktree holds all a
	// harness can write to it (its repository is its own .git).
	LayerCapable() bool
	// SealPacks makes the repository's packs shim's and read-only, so
	// that a harness's git writing an object a pack has cannot copy the
	// whole pack up into its layer (gitguard.Guard.SealPacks). For a
	// layered worktree's lower only.
	SealPacks() error
	List(ctx context.Context) ([]api.Snapshot, error)
	Show(ctx context.Context, gen uint64) (api.Snapshot, error)
	Registration() api.Registration
	// Tidy removes the locks and temporary files of a killed git; only
	// while no generation is live.
	Tidy(ctx context.Context) ([]string, error)
	// Maintain prunes snapshots beyond keep (never one protect names; 0
	// prunes none) and repacks, dropping the objects of snapshots pruned
	// earlier; only while no generation is live, or with keep 0 beside
	// generations started after the last PruneSnapshots.
	Maintain(ctx context.Context, keep int, protect func(uint64) bool) (*api.MaintenanceReport, error)
	// PruneSnapshots deletes the snapshot refs beyond keep (never one
	// protect names) and the reflog entries nothing reaches, leaving
	// their objects to the next Maintain; only while no generation is
	// live (gitguard.Guard.PruneSnapshots).
	PruneSnapshots(ctx context.Context, keep int, protect func(uint64) bool) (*api.MaintenanceReport, error)
}

// worktreeOpts are the per-announcement options of a worktree's restore.
type worktreeOpts struct {
	keepPaths      []string
	includeIgnored bool
	late           bool // a generation may have written it already
	remoteURLs     map[string]string
}

// starter launches a generation's harness (step 5) and runs the git of
// the restore step; launcher is the real one.
type starter interface {
	// start launches the harness, taking over what startEarly began for
	// it (early may be nil).
	start(ctx context.Context, req api.StartRequest, baseline string, early *earlyStart) (*generation, error)
	// startEarly begins, beside the fence, the part of req's start that
	// does not depend on it (nil: nothing begun); dropEarly undoes it
	// when no start follows.
	startEarly(req api.StartRequest) *earlyStart
	dropEarly(e *earlyStart, n uint64)
	// openWorktree registers (once) and returns the worktree at path.
	openWorktree(ctx context.Context, path string, o worktreeOpts) (worktree, error)
	// abortSockets aborts the TCP connections a host-mode generation (its
	// cgroup and its tool calls') has in shim's own network namespace, in
	// one dump, and reports them.
	abortSockets(groups []cgroup.Group) ([]api.Connection, error)
	// prepare runs the start-up probes.
	prepare()
	// checkShape checks, with a few stat calls before anything is fenced,
	// that req's worktree is a git worktree (WORKTREE_REFUSED) and its
	// command exists (START_FAILED); see admission.go.
	checkShape(req api.StartRequest) error
}
