package api

import (
	"fmt"
	"time"
)

// Generation states, as reported by status.
const (
	StateIdle    = "idle"    // no generation running
	StateRunning = "running" // the current generation's harness is running
	StateExited  = "exited"  // the current generation's harness exited on its own
	StateFencing = "fencing" // a fence is in progress
	StateFailed  = "failed"  // a fence could not be confirmed; nothing starts until a newer announcement succeeds
	// StateSuspended: the current generation's lease ran out; it is frozen
	// and cut (credentials refused, connections aborted) until its
	// supervisor renews the lease or a newer announcement fences it.
	StateSuspended = "suspended"
)

// States of one generation's record (Generation.State), besides
// StateRunning, StateExited, StateFencing and StateFailed.
const (
	GenAdopted = "adopted" // left by a previous shim; fenced at the next announcement
	GenFenced  = "fenced"  // ended by a fence (or shutdown); its cgroup is gone
	// GenGone: left by a previous shim with no process left (they died
	// with it, or with the sandbox); its exit is unknown, its worktree is
	// restored at the next announcement.
	GenGone = "gone"
)

// Network modes of a generation.
const (
	NetworkHost     = "host"
	NetworkNone     = "none"
	NetworkIsolated = "isolated"
)

// StartRequest announces generation N and the harness it runs.
// POST /v1/generations
type StartRequest struct {
	Generation uint64   `json:"generation"`
	Command    []string `json:"command"`
	Cwd        string   `json:"cwd,omitempty"`
	User       string   `json:"user,omitempty"` // "UID[:GID]"
	Env        []string `json:"env,omitempty"`  // K=V; the harness gets only these (plus what shim adds)
	Worktree   string   `json:"worktree,omitempty"`
	Baseline   string   `json:"baseline,omitempty"` // commit id or ref of the last pushed state
	// KeepPaths (worktree-relative) are neither saved nor cleaned at the
	// fence this announcement triggers, e.g. a cache dir.
	KeepPaths []string `json:"keep_paths,omitempty"`
	// IncludeIgnored also saves ignored files into the snapshot.
	IncludeIgnored bool              `json:"include_ignored,omitempty"`
	Network        string            `json:"network,omitempty"` // host (default), none, isolated
	Allow          []string          `json:"allow,omitempty"`   // HOST[:PORT] the isolated proxy lets through
	Credentials    []Credential      `json:"credentials,omitempty"`
	Limits         *Limits           `json:"limits,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"` // free-form, echoed in status and audit (e.g. workflow and step ids)
	// Fetch, with a worktree, fetches a branch at the fence's restore (with
	// Credentials) and reports whether the remote moved past the baseline.
	Fetch *FetchSpec `json:"fetch,omitempty"`
	// Linger keeps what the harness left running after it exited until the
	// next announcement (credentials and network are cut at the exit
	// anyway). Without it, the rest of the generation is killed after
	// shim's exit grace (--exit-grace).
	Linger bool `json:"linger,omitempty"`
	// RequireIsolation refuses the announcement (ISOLATION_UNAVAILABLE,
	// after the fence) when this sandbox cannot give the generation its
	// own layers. Not part of the announcement's identity.
	RequireIsolation bool `json:"require_isolation,omitempty"`
	// IfCurrent, when set, admits the announcement only while the highest
	// generation announced so far is exactly this one (NOT_CURRENT
	// otherwise, nothing fenced): two supervisors that both recovered the
	// same step cannot fence each other back and forth. Not part of the
	// announcement's identity: an identical retry is answered as before.
	IfCurrent *uint64 `json:"if_current,omitempty"`
	// Branch, with a worktree, puts the worktree on this branch for the
	// generation: refs/heads/<branch> is created or moved to the baseline
	// and HEAD names it (without it the worktree is on the branch it was
	// registered on). The push check of the fence that ends this
	// generation checks this branch unless its fetch names another.
	Branch string `json:"branch,omitempty"`
	// LeaseMS, when set, is the generation's lease in milliseconds (at
	// least 50): unless its supervisor renews it (POST
	// /v1/generations/{n}/lease) before it runs out, the generation is
	// suspended: frozen and cut as at a fence (credentials refused, every
	// connection aborted), not killed, until a renewal resumes it or a
	// newer announcement fences it. It runs from the harness's start. Not
	// part of the announcement's identity: an identical retry renews it.
	LeaseMS int64 `json:"lease_ms,omitempty"`
	// Idle starts a generation without a harness (Command empty): it
	// holds its cgroup, namespaces, layers, credentials, network and
	// lease and runs only the tool calls sent to it (POST
	// /v1/generations/{n}/processes) until it is ended or fenced. An
	// announcement without a command is idle.
	Idle bool `json:"idle,omitempty"`
}

// RenewRequest renews generation n's lease. POST /v1/generations/{n}/lease
type RenewRequest struct {
	// LeaseMS is the new lease from now (and its length from then on); 0
	// keeps the length it has (the announced one, unless a renewal gave
	// another). A renewal may give a lease to a generation announced
	// without one.
	LeaseMS int64 `json:"lease_ms,omitempty"`
}

// Lease is a generation's lease as its record reports it.
type Lease struct {
	DurationMS int64     `json:"duration_ms"`
	ExpiresAt  time.Time `json:"expires_at"`
	// Suspended is true from the moment the lease ran out (the broker
	// refuses the generation from then on) until a renewal; it is frozen
	// and cut once Cut is set. SuspendedAt is when that last began.
	Suspended   bool       `json:"suspended,omitempty"`
	SuspendedAt *time.Time `json:"suspended_at,omitempty"`
	// FrozenAt is when the kernel confirmed the suspension's freeze:
	// nothing of the generation ran after it. A request its server records
	// after FrozenAt was delivered before: its connection is in Cut's
	// Connections, in_flight (a server may read a request the kernel
	// received before the cut's reset, and carry it out).
	FrozenAt *time.Time `json:"frozen_at,omitempty"`
	// Suspensions counts the times it ran out; Renewals the renewals.
	Suspensions int `json:"suspensions,omitempty"`
	Renewals    int `json:"renewals,omitempty"`
	// Cut is what the last suspension cut (credentials, connections).
	Cut *CutReport `json:"cut,omitempty"`
	// Killed is true when a suspension could not be confirmed (the freeze
	// or the cut) and the generation was killed instead: fail closed; Error
	// says why.
	Killed bool   `json:"killed,omitempty"`
	Error  *Error `json:"error,omitempty"`
}

// RenewResult answers a renewal.
type RenewResult struct {
	Generation uint64 `json:"generation"`
	// State is the generation's state after the renewal: running (resumed
	// or still running), exited (the lease no longer matters) or adopted.
	State   string `json:"state"`
	Resumed bool   `json:"resumed,omitempty"` // it was suspended and runs again
	Lease   Lease  `json:"lease"`
}

// FetchSpec asks the restore step of a fence to fetch one branch, with the
// announcement's credentials, into refs/shim/remote/<remote>/<branch> after
// the abandoned generation is dead, and to report in the worktree section's
// "fetch" whether the remote gained commits past the baseline (likely pushes
// by the abandoned generation). The remote is never written. A fetch that
// fails is reported there and does not fail the fence.
type FetchSpec struct {
	// Remote names a remote of the worktree's registered .git/config;
	// "" is "origin".
	Remote string `json:"remote,omitempty"`
	// Branch is the remote branch; "" is the branch the worktree's HEAD
	// named when shim registered it.
	Branch string `json:"branch,omitempty"`
	// RemoteURL is the remote's URL as the supervisor knows it. A worktree
	// registered late (a generation may have written it first) takes the
	// remote's URL from here, never from the config the harness left; give
	// it whenever the worktree may be registered late.
	RemoteURL string `json:"remote_url,omitempty"`
	// SettleMS, when set, runs the push check once more that many
	// milliseconds after the fence (at most 600000), for pushes a server
	// finished receiving late; a move then is published as a remote_moved
	// event and stored in the fenced generation's record.
	SettleMS int64 `json:"settle_ms,omitempty"`
	// Continue starts the new generation from the commit the fetch found
	// on the remote when the remote moved past the baseline (continue from
	// what the abandoned call pushed) instead of the baseline named; the
	// worktree report says baseline_from_fetch.
	Continue bool `json:"continue,omitempty"`
}

// Credential is one secret the generation's git may obtain through the
// credential broker. It is held in memory only and never echoed.
type Credential struct {
	Protocol string `json:"protocol"`
	Host     string `json:"host"`
	Path     string `json:"path,omitempty"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// String never shows the secret, so a Credential printed into a log by
// mistake leaks nothing. (JSON does carry it: the start request is the one
// way it reaches shim, and shim never writes requests anywhere.)
func (c Credential) String() string {
	return fmt.Sprintf("{%s://%s@%s/%s password:REDACTED}", c.Protocol, c.Username, c.Host, c.Path)
}

// GoString is String for %#v.
func (c Credential) GoString() string { return c.String() }

// Limits are optional per-generation cgroup limits.
type Limits struct {
	MemoryMax int64  `json:"memory_max,omitempty"` // bytes
	PidsMax   int64  `json:"pids_max,omitempty"`
	CPUMax    string `json:"cpu_max,omitempty"` // cpu.max syntax: "QUOTA PERIOD"
}

// StartResult answers a start request.
type StartResult struct {
	// Replayed is true when this is the answer to an identical retry of
	// a start shim had already carried out (nothing was done again).
	Replayed bool `json:"replayed,omitempty"`
	// State and Exit, on a replayed answer only, say what became of the
	// generation since (a Generation.State: running, exited, fenced,
	// gone...; its exit record when it exited): a replay never says a
	// harness runs that is gone.
	State      string        `json:"state,omitempty"`
	Exit       *Exit         `json:"exit,omitempty"`
	Generation uint64        `json:"generation"`
	Pid        int           `json:"pid"`
	Cgroup     string        `json:"cgroup"`
	StartedAt  time.Time     `json:"started_at"`
	Fenced     []FenceReport `json:"fenced"`
	Network    *NetworkInfo  `json:"network,omitempty"`
	Baseline   string        `json:"baseline,omitempty"`
	// DurationsMS: "fence" is steps 1-4 for every older generation
	// together, "start" is step 5 (the new harness's cgroup, network,
	// credentials and exec), "total" is from the announcement's arrival to
	// the new harness running.
	DurationsMS map[string]float64 `json:"durations_ms"`
	// Worktree is how the announcement's worktree was registered, when
	// this announcement registered it.
	Worktree *Registration `json:"worktree,omitempty"`
	// WorktreeCleaned lists what a killed git had left in the worktree's
	// git dir (lock files, temporary objects; relative to the git dir) and
	// was removed before the harness started, when no fence restored the
	// worktree (a fence's restore reports its own in worktree.cleaned).
	WorktreeCleaned []string `json:"worktree_cleaned,omitempty"`
}

// FencedReports is what the announcement fenced (nil-safe).
func (r *StartResult) FencedReports() []FenceReport {
	if r == nil {
		return nil
	}
	return r.Fenced
}

// FenceRequest fences every generation older than Generation and starts
// nothing. POST /v1/fence
type FenceRequest struct {
	Generation     uint64   `json:"generation"`
	Worktree       string   `json:"worktree,omitempty"`
	Baseline       string   `json:"baseline,omitempty"`
	KeepPaths      []string `json:"keep_paths,omitempty"`
	IncludeIgnored bool     `json:"include_ignored,omitempty"`
	// Fetch as in StartRequest; Credentials are used for that fetch only
	// (a fence starts no harness to grant them to).
	Fetch       *FetchSpec   `json:"fetch,omitempty"`
	Credentials []Credential `json:"credentials,omitempty"`
	// IfCurrent as in StartRequest.
	IfCurrent *uint64 `json:"if_current,omitempty"`
}

// EndRequest ends generation Generation itself: it is fenced (freeze,
// cut, kill, snapshot, restore) and nothing starts; the token stays at
// Generation, and Generation can never start again (the next start is
// Generation+1 or higher). For the cleanup at the end of a workflow.
// POST /v1/generations/{n}/end
type EndRequest struct {
	// IfCurrent as in StartRequest.
	IfCurrent *uint64 `json:"if_current,omitempty"`
	// Force ends a generation never announced (above the highest seen):
	// every generation is fenced and the token moves to it. Without it
	// that is NOT_ANNOUNCED and nothing is fenced.
	Force bool `json:"force,omitempty"`
}

// FenceResult answers a fence request.
type FenceResult struct {
	Generation uint64        `json:"generation"`
	Fenced     []FenceReport `json:"fenced"`
}

// FencedReports is what the fence ended (nil-safe).
func (r *FenceResult) FencedReports() []FenceReport {
	if r == nil {
		return nil
	}
	return r.Fenced
}

// FenceReport says how one older generation was ended.
type FenceReport struct {
	Generation  uint64 `json:"generation"`
	StateBefore string `json:"state_before"` // running, exited or adopted
	Killed      int    `json:"killed"`
	Survivors   int    `json:"survivors"`
	// DurationsMS has one entry per step of this generation's fence:
	// "freeze" (until the kernel confirmed it), "cut" (credentials,
	// connections, network), "kill" (until the cgroup was empty and
	// removed), "persist" (the fencing token written to state.json; shared
	// by every generation of the announcement), "restore" (worktree saved
	// and reset), "total" (freeze to restore end, this generation only),
	// and for a start, "start" (step 5: the new harness, the same figure as
	// StartResult.DurationsMS["start"]). A step that did not run has no
	// entry.
	DurationsMS map[string]float64 `json:"durations_ms"`
	Cut         *CutReport         `json:"cut,omitempty"`
	Worktree    *WorktreeReport    `json:"worktree,omitempty"`
	// Layer is what the generation wrote outside the worktree (isolation
	// "layers" only).
	Layer *LayerReport `json:"layer,omitempty"`
	// Copied from the worktree section for the contract's flat fields.
	SnapshotRef    string `json:"snapshot_ref,omitempty"`
	SnapshotCommit string `json:"snapshot_commit,omitempty"`
	Baseline       string `json:"baseline,omitempty"`
	Exit           *Exit  `json:"exit,omitempty"`
	Error          *Error `json:"error,omitempty"`
	// RecordsPruned are the generations whose records (gen/<N>/: output,
	// exit and generation records) this announcement removed under the
	// retention policy (--keep-generations, --keep-bytes); set on the last
	// report of the announcement.
	RecordsPruned []uint64 `json:"records_pruned,omitempty"`
	// ToolCalls are the tool calls (exec) that were running when the
	// generation was frozen: frozen, cut and killed with it.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// CutReport says what the cut step revoked and closed.
type CutReport struct {
	CredentialsRevoked int  `json:"credentials_revoked"`
	TunnelsClosed      int  `json:"tunnels_closed"`     // proxied connections with an upstream, aborted
	ConnectionsClosed  int  `json:"connections_closed"` // proxy client connections, aborted
	SocketsDestroyed   int  `json:"sockets_destroyed"`  // the generation's own sockets, destroyed through sock_diag
	LinkDeleted        bool `json:"link_deleted"`
	// Connections are the generation's TCP connections open at the cut
	// (right after the freeze), each aborted with a reset and its queued
	// bytes dropped.
	Connections []Connection `json:"connections,omitempty"`
	// InFlight is true when any of Connections may have delivered a whole
	// request to its server before the freeze (see Connection.InFlight).
	InFlight bool `json:"in_flight"`
	// AbortUnsupported says why connections could not be aborted here (no
	// CAP_NET_ADMIN, no SOCK_DESTROY in the kernel): then queued bytes may
	// still be delivered after the fence; the kill ends the connections.
	AbortUnsupported string             `json:"abort_unsupported,omitempty"`
	DurationsMS      map[string]float64 `json:"durations_ms,omitempty"` // credentials, connections, tunnels, link
}

// Exit is a generation's exit record (gen/<N>/exit.json).
type Exit struct {
	Generation uint64    `json:"generation"`
	Pid        int       `json:"pid"`
	ExitCode   int       `json:"exit_code"` // 128+signal when killed
	Signal     int       `json:"signal,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	ExitedAt   time.Time `json:"exited_at"`
	Fenced     bool      `json:"fenced"` // ended by a fence or shutdown, not on its own
	// CutAt is when what a harness that exited on its own left running
	// was frozen (host mode) and its credentials and network cut: nothing
	// of it acts after this (between ExitedAt and CutAt a daemon it left
	// still ran).
	CutAt *time.Time `json:"cut_at,omitempty"`
	// Unknown: the generation was left by a previous shim, which was its
	// parent; this shim saw it end (its cgroup empty) but not its exit
	// status (ExitCode is -1).
	Unknown bool `json:"unknown,omitempty"`
}

// Generation is one generation's record. GET /v1/generations/{n}
type Generation struct {
	Generation uint64            `json:"generation"`
	State      string            `json:"state"` // running, suspended, exited, fenced, or adopted (left by a previous shim, fenced at the next announcement)
	Pid        int               `json:"pid,omitempty"`
	Cgroup     string            `json:"cgroup,omitempty"`
	Command    []string          `json:"command,omitempty"`
	StartedAt  time.Time         `json:"started_at"`
	Exit       *Exit             `json:"exit,omitempty"`
	Worktree   string            `json:"worktree,omitempty"`
	Network    string            `json:"network,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Stdout     string            `json:"stdout,omitempty"` // file path in the runtime dir
	Stderr     string            `json:"stderr,omitempty"`
	// StdoutDropped and StderrDropped count the bytes of output not kept:
	// past --log-max, or when the runtime dir's filesystem was full.
	StdoutDropped int64 `json:"stdout_dropped,omitempty"`
	StderrDropped int64 `json:"stderr_dropped,omitempty"`
	// Limits are the cgroup limits the generation runs under (the
	// announcement's, or shim's defaults where the controller is there).
	Limits *Limits `json:"limits,omitempty"`
	// Linger: what the harness left running is kept until the next
	// announcement instead of being killed after the exit grace.
	Linger bool `json:"linger,omitempty"`
	// Isolation is "layers" or "scan", as the generation was started.
	Isolation string `json:"isolation,omitempty"`
	// PushCheck is the settle-window re-check of the fence's fetch, when one
	// was asked for (FetchSpec.SettleMS).
	PushCheck *FetchReport `json:"push_check,omitempty"`
	// Fence is the report of the fence that ended it, once fenced.
	Fence *FenceReport `json:"fence,omitempty"`
	// Lease is its lease, when it was announced with one.
	Lease *Lease `json:"lease,omitempty"`
	// Idle: a generation without a harness, for tool calls.
	Idle bool `json:"idle,omitempty"`
}

// Status answers GET /v1/status.
type Status struct {
	Generation uint64       `json:"generation"` // highest generation seen
	State      string       `json:"state"`
	Pid        int          `json:"pid"` // pid of the current harness, 0 when none
	Mode       string       `json:"mode"`
	ModeReason string       `json:"mode_reason,omitempty"`
	ShimPid    int          `json:"shim_pid"`
	Subreaper  bool         `json:"subreaper"` // true when shim is not PID 1
	CgroupRoot string       `json:"cgroup_root,omitempty"`
	RuntimeDir string       `json:"runtime_dir"`
	Current    *Generation  `json:"current,omitempty"`
	Live       []Generation `json:"live,omitempty"`  // generations not yet fenced
	Error      *Error       `json:"error,omitempty"` // why the state is failed
	Orphans    uint64       `json:"orphans_reaped"`
	Version    string       `json:"version"`
	// Worktrees are the registered worktrees.
	Worktrees []Registration `json:"worktrees,omitempty"`
	// Isolation says whether generations get copy-on-write layers.
	Isolation Isolation `json:"isolation"`
	// Retention is what the runtime dir and the worktrees keep, and its
	// size.
	Retention *Retention `json:"retention,omitempty"`
	// Weakened lists the guarantees this sandbox gives only in part, found
	// by the start-up probes (empty while they run, and where every
	// guarantee holds): the README, "Security notes".
	Weakened []Weakness `json:"weakened,omitempty"`
}

// Weakness is one guarantee the sandbox gives only in part: a stable
// code (Weak*) and what the probe found.
type Weakness struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// The stable codes of Status.Weakened.
const (
	// WeakOwnerGitPtraceScope: shim's gits of a worktree's owner hold no
	// ambient capability (gVisor has no PR_CAP_AMBIENT); the runtime's own
	// ptrace rule keeps ptrace and /proc/<pid>/mem, root and cwd from a
	// same-uid harness, not everything (the message says what is open).
	WeakOwnerGitPtraceScope = "OWNER_GIT_PTRACE_SCOPE"
	// WeakOwnerGitUnprotected: nothing keeps those gits out of a same-uid
	// harness's reach.
	WeakOwnerGitUnprotected = "OWNER_GIT_UNPROTECTED"
	// WeakPeerCredUnreliable: SO_PEERCRED reports shim's own credentials
	// for a peer of another uid; only the control socket's file mode
	// checks uids.
	WeakPeerCredUnreliable = "PEERCRED_UNRELIABLE"
)

// Isolation is how generations are kept apart from each other.
type Isolation struct {
	// Mode is "layers" (each generation in its own mount and IPC
	// namespaces on an overlay root, its worktree an overlay) or "scan"
	// (the sandbox's filesystem shared; the worktree restored by a scan);
	// "probing" for the moment after start-up before shim knows (the first
	// announcement waits for the probe).
	Mode string `json:"mode"`
	// Reason says why the mode is "scan".
	Reason string `json:"reason,omitempty"`
	// Dir is where the layers live; RootLayerBytes bounds what one
	// generation writes outside its worktree and the shared paths.
	Dir            string   `json:"dir,omitempty"`
	RootLayerBytes int64    `json:"root_layer_bytes,omitempty"`
	Persist        []string `json:"persist,omitempty"`
	// WorktreeLayerBytes bounds a generation's worktree layer (a tmpfs
	// of its own, --worktree-layer-size); 0: the layer is on Dir's
	// filesystem, durable and bounded only by that filesystem.
	WorktreeLayerBytes int64 `json:"worktree_layer_bytes,omitempty"`
	// KeepLayers and KeepLayersBytes bound the fenced generations' layers
	// kept for forensics: how many, and how many bytes in all.
	KeepLayers      int   `json:"keep_layers,omitempty"`
	KeepLayersBytes int64 `json:"keep_layers_bytes,omitempty"`
	// Pinned are the layers kept until a person recovers them (their
	// snapshot failed, or could not be confirmed): never pruned, they
	// count against KeepLayersBytes. At most 100, oldest first.
	Pinned []PinnedLayer `json:"pinned,omitempty"`
	// ReserveBytes is the room kept on the layers' filesystem for the
	// fences (--layers-reserve); ReserveHeldBytes what is held of it now
	// (less, or 0, after a harness filled the filesystem and the fence
	// used it; taken again before the next generation starts).
	ReserveBytes     int64 `json:"reserve_bytes,omitempty"`
	ReserveHeldBytes int64 `json:"reserve_held_bytes,omitempty"`
}

// PinnedLayer is one pinned generation's layers (docs/layers.md).
type PinnedLayer struct {
	Generation uint64 `json:"generation"`
	Why        string `json:"why"`
	Bytes      int64  `json:"bytes"`
}

// RegisterRequest registers a worktree before any harness runs there.
// POST /v1/worktrees
type RegisterRequest struct {
	Worktree       string   `json:"worktree"`
	KeepPaths      []string `json:"keep_paths,omitempty"`
	IncludeIgnored bool     `json:"include_ignored,omitempty"`
}

// SignalRequest sends a signal to a generation's harness.
// POST /v1/generations/{n}/signal
type SignalRequest struct {
	Signal string `json:"signal"`        // "TERM", "SIGTERM" or a number
	All    bool   `json:"all,omitempty"` // every process of the generation, not only the harness
}
