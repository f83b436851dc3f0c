package api

import "time"

// Connection is one socket of a generation open at its cut, as the kernel
// (or shim's egress proxy) reported it just before aborting it.
type Connection struct {
	// Via is "socket" for a socket of the generation's own (host mode, or
	// inside its namespace) and "proxy" for a connection through shim's
	// egress proxy (isolated mode).
	Via      string `json:"via"`
	Protocol string `json:"protocol"` // tcp, udp, or mptcp (one MPTCP connection, its subflows folded in)
	Family   string `json:"family"`   // ipv4 or ipv6
	Local    string `json:"local,omitempty"`
	Remote   string `json:"remote,omitempty"`
	State    string `json:"state,omitempty"` // established, syn_sent, close_wait, listen, ...
	UID      uint32 `json:"uid,omitempty"`
	// What the proxy knew: the generation's end, "connect" or "http", the
	// host:port asked for, and the request line (no userinfo, no query).
	Client    string `json:"client,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Target    string `json:"target,omitempty"`
	Request   string `json:"request,omitempty"`
	BytesUp   int64  `json:"bytes_up,omitempty"`
	BytesDown int64  `json:"bytes_down,omitempty"`
	// SendQueue is what was written and not yet acknowledged by the peer
	// (dropped by the abort); RecvQueue what had arrived and was not read.
	SendQueue uint32   `json:"send_queue"`
	RecvQueue uint32   `json:"recv_queue"`
	TCP       *TCPInfo `json:"tcp_info,omitempty"`
	// InFlight is true where a request may have reached the server whole
	// before the freeze: the peer had acknowledged payload. No in-sandbox
	// fence can take back what a server already received.
	InFlight bool `json:"in_flight"`
}

// TCPInfo is how far a connection's data got (the kernel's tcp_info).
type TCPInfo struct {
	BytesSent       uint64 `json:"bytes_sent"`
	BytesAcked      uint64 `json:"bytes_acked"` // the SYN counts 1
	BytesReceived   uint64 `json:"bytes_received"`
	NotSentBytes    uint32 `json:"notsent_bytes"`
	UnackedSegments uint32 `json:"unacked_segments"`
}

// NetworkInfo describes a generation's network.
type NetworkInfo struct {
	Mode             string   `json:"mode"`
	Generation       uint64   `json:"generation"`
	NetnsInode       uint64   `json:"netns_inode,omitempty"`
	EgressNetnsInode uint64   `json:"egress_netns_inode,omitempty"`
	HostLink         string   `json:"host_link,omitempty"`
	HostAddr         string   `json:"host_addr,omitempty"`
	PeerLink         string   `json:"peer_link,omitempty"`
	PeerAddr         string   `json:"peer_addr,omitempty"`
	Proxy            string   `json:"proxy,omitempty"`
	Allow            []string `json:"allow,omitempty"`
	Cut              bool     `json:"cut"`
}

// Registration says how shim took the trusted copy of a worktree's git
// metadata. Late is true when a generation may already have written the
// worktree: the trusted config was then built from a minimal safe set and
// Dropped lists what was left out (config keys, hooks, attributes,
// alternates).
type Registration struct {
	Worktree     string    `json:"worktree"`
	Late         bool      `json:"registered_late"`
	Dropped      []string  `json:"dropped,omitempty"`
	RegisteredAt time.Time `json:"registered_at,omitempty"`
}

// PathChange is one path of a snapshot that differs from the baseline.
type PathChange struct {
	Path string `json:"path"`
	// Change is "added", "modified", "deleted" or "type_changed".
	Change string `json:"change"`
}

// RemoteCommit is one commit the remote has and the baseline has not.
type RemoteCommit struct {
	Commit  string `json:"commit"`
	Subject string `json:"subject"`
}

// FetchReport is the push check of a fence: the fenced generation's branch
// fetched after it was dead, compared with the baseline.
type FetchReport struct {
	Remote                 string         `json:"remote"`
	Branch                 string         `json:"branch"`
	URL                    string         `json:"url,omitempty"` // without userinfo
	Ref                    string         `json:"ref,omitempty"` // refs/shim/remote/<remote>/<branch>
	Authenticated          bool           `json:"authenticated"`
	FetchedCommit          string         `json:"fetched_commit,omitempty"`
	Baseline               string         `json:"baseline,omitempty"`
	RemoteMoved            bool           `json:"remote_moved"` // the remote gained commits past the baseline
	RemoteCommits          []RemoteCommit `json:"remote_commits,omitempty"`
	RemoteCommitCount      int            `json:"remote_commit_count"`
	RemoteCommitsTruncated bool           `json:"remote_commits_truncated,omitempty"`
	Error                  string         `json:"error,omitempty"`
	DurationMS             float64        `json:"duration_ms"`
	// Settled is set on the re-check after the settle window: the remote
	// as it was then (see FenceReport and the remote_moved event).
	Settled bool `json:"settled,omitempty"`
}

// WorktreeReport is the "worktree" section of a fence report: what the
// restore step saved and reset.
type WorktreeReport struct {
	Worktree       string `json:"worktree"`
	Baseline       string `json:"baseline"`
	BaselineRev    string `json:"baseline_rev,omitempty"` // what the announcement asked for
	SnapshotRef    string `json:"snapshot_ref"`
	SnapshotCommit string `json:"snapshot_commit"`
	SnapshotReused bool   `json:"snapshot_reused"`
	HeadBefore     string `json:"head_before"`
	Modified       int    `json:"modified"`
	Added          int    `json:"added"`
	Deleted        int    `json:"deleted"`

	Paths              []PathChange       `json:"paths"`
	PathsTruncated     bool               `json:"paths_truncated,omitempty"`
	Ignored            []string           `json:"ignored,omitempty"`
	IgnoredTruncated   bool               `json:"ignored_truncated,omitempty"`
	NestedRepos        []string           `json:"nested_repos,omitempty"`
	NestedReposMovedTo string             `json:"nested_repos_moved_to,omitempty"`
	ReplaceRefsMoved   []string           `json:"replace_refs_moved,omitempty"`
	LocalCommits       int                `json:"local_commits"`
	Cleaned            []string           `json:"cleaned,omitempty"`
	MetadataRestored   []string           `json:"metadata_restored,omitempty"`
	Fetch              *FetchReport       `json:"fetch,omitempty"`
	Registration       *Registration      `json:"registration,omitempty"`
	DurationsMS        map[string]float64 `json:"durations_ms"`
	// SnapshotError says why a worktree layer could not be made a
	// snapshot (a full disk, a deadline): the fence still completed (the
	// checkout was never written), and the layer is kept, pinned, at
	// LayerDir until a person recovers it (docs/layers.md).
	SnapshotError string `json:"snapshot_error,omitempty"`
	LayerDir      string `json:"layer_dir,omitempty"`
	// MarkerError says why the layer could not be marked saved once its
	// snapshot ref was durable (a full disk): the snapshot stands.
	MarkerError string `json:"marker_error,omitempty"`
	// LayerBytes is what a bounded worktree layer held at the fence
	// (--worktree-layer-size), LayerLimitBytes its bound, and LayerFull
	// whether the harness had filled it (its writes in the worktree got
	// ENOSPC from then on; the snapshot holds what fit).
	LayerBytes      int64 `json:"layer_bytes,omitempty"`
	LayerLimitBytes int64 `json:"layer_limit_bytes,omitempty"`
	LayerFull       bool  `json:"layer_full,omitempty"`
	// Lower is a layered worktree's lower (the checkout every generation's
	// layer lies on) as the fence found it, checked before the snapshot.
	Lower *LowerCheck `json:"lower,omitempty"`
	// BaselineFromFetch: the worktree was put on the commit the fetch
	// found (FetchSpec.Continue), Baseline is that commit.
	BaselineFromFetch bool `json:"baseline_from_fetch,omitempty"`
	// Isolation is "layers" when the snapshot was made from the
	// generation's worktree layer, absent for the scan (NotStored lists
	// what either did not store).
	Isolation string `json:"isolation,omitempty"`

	// The scan restore's hardening (docs/worktree.md): refs that differed
	// from the trusted namespace (the harness's value kept at saved_as),
	// what was not a ref and was removed, files not stored (over the size
	// cap, or special) and the cap, permissions added as the owner.
	RefsMoved          []RefChange `json:"refs_moved,omitempty"`
	RefsMovedTruncated bool        `json:"refs_moved_truncated,omitempty"`
	RefsRemoved        []string    `json:"refs_removed,omitempty"`
	// RefsRemovedTruncated: more was removed than refs_removed lists
	// (1,000). RefsNotSaved: the harness's refs past the 16,384 a fence
	// keeps (listed in refs_moved with no saved_as).
	RefsRemovedTruncated bool            `json:"refs_removed_truncated,omitempty"`
	RefsNotSaved         int             `json:"refs_not_saved,omitempty"`
	NotStored            []NotStoredFile `json:"not_stored,omitempty"`
	MaxFileSize          int64           `json:"max_file_size"`
	Repaired             []string        `json:"repaired,omitempty"`
	// Maintenance is the repository maintenance run since the previous
	// fence that restored this worktree: maintenance runs between fences,
	// in the background once an announcement is answered, never inside a
	// fence (on the last report of the announcement that restored this
	// worktree; the audit log records each run that pruned or failed).
	Maintenance *MaintenanceReport `json:"maintenance,omitempty"`
}

// RefChange is one ref the abandoned generation created, moved or deleted:
// its trusted value (put back; "" when the harness created it), the
// harness's ("" when it deleted it) and where the harness's value is kept.
type RefChange struct {
	Ref     string `json:"ref"`
	Trusted string `json:"trusted,omitempty"`
	Harness string `json:"harness,omitempty"`
	SavedAs string `json:"saved_as,omitempty"`
}

// NotStoredFile is a file a snapshot listed instead of storing: larger than
// the cap, or a FIFO, socket or device (type "file", "fifo", "socket",
// "char_device", "block_device"; from a layer also "nested_git", a .git
// directory below the worktree's top). Hash is "sha256:<hex>" of its first
// hashed_bytes bytes.
type NotStoredFile struct {
	Path        string `json:"path"`
	Type        string `json:"type"`
	Size        int64  `json:"size"`
	Allocated   int64  `json:"allocated"`
	Hash        string `json:"hash,omitempty"`
	HashedBytes int64  `json:"hashed_bytes"`
	Tracked     bool   `json:"tracked"`
}

// LayerReport is the "layer" section of a fence report: what the
// generation wrote outside the worktree (its root layer), kept for
// forensics under Dir until later fences prune it.
type LayerReport struct {
	Dir            string   `json:"dir"`
	Kept           bool     `json:"kept"`
	Bytes          int64    `json:"bytes"`
	Paths          []string `json:"paths,omitempty"` // changed outside the worktree, deletions end in " (deleted)"
	PathsTruncated bool     `json:"paths_truncated,omitempty"`
}

// MaintenanceReport is what shim did to keep a worktree's repository flat
// between fences: locks a killed git left removed, snapshot refs pruned
// beyond --keep-snapshots, and the repack.
type MaintenanceReport struct {
	Cleaned []string `json:"cleaned,omitempty"`
	// SnapshotsPruned are the snapshot refs (refs/shim/abandoned/<gen>)
	// deleted since the previous report; with ObjectsPruned their objects are gone
	// too (a full repack kept only what the remaining refs reach).
	SnapshotsPruned []string `json:"snapshots_pruned,omitempty"`
	ObjectsPruned   bool     `json:"objects_pruned,omitempty"`
	// Repack is "geometric", "full" or "" (none was needed).
	Repack        string `json:"repack,omitempty"`
	RefsPacked    bool   `json:"refs_packed,omitempty"`
	PacksBefore   int    `json:"packs_before"`
	PacksAfter    int    `json:"packs_after"`
	LooseBefore   int    `json:"loose_before"`
	LooseAfter    int    `json:"loose_after"`
	SnapshotsKept int    `json:"snapshots_kept"`
	// Error is why a step failed; a failed maintenance never fails the
	// fence (it removes only what nothing reaches).
	Error string `json:"error,omitempty"`
	// Interrupted: the next fence ended this maintenance (a fence never
	// waits for a repack); what it had not done waits for the next run.
	Interrupted bool               `json:"interrupted,omitempty"`
	DurationsMS map[string]float64 `json:"durations_ms"`
}

// Retention is the retention policy and what it keeps now (status).
type Retention struct {
	KeepGenerations int   `json:"keep_generations"` // 0: all
	KeepBytes       int64 `json:"keep_bytes"`       // 0: no byte bound
	KeepSnapshots   int   `json:"keep_snapshots"`   // per worktree; 0: all
	// Records are the generations with a record in gen/<N>/, and their
	// size on disk.
	Records      int    `json:"records"`
	RecordsBytes int64  `json:"records_bytes"`
	OldestRecord uint64 `json:"oldest_record,omitempty"`
	NewestRecord uint64 `json:"newest_record,omitempty"`
	// AuditFiles are audit.jsonl and its rotated files (audit.jsonl.1 ...).
	AuditFiles      int   `json:"audit_files"`
	AuditBytes      int64 `json:"audit_bytes"`
	AuditMaxBytes   int64 `json:"audit_max_bytes"`
	AuditKeepFiles  int   `json:"audit_keep_files"`
	RuntimeDirBytes int64 `json:"runtime_dir_bytes"`
	// Snapshots counts the snapshot refs kept per registered worktree.
	Snapshots []WorktreeSnapshots `json:"snapshots,omitempty"`
}

// WorktreeSnapshots is how many snapshot refs a worktree keeps.
type WorktreeSnapshots struct {
	Worktree string `json:"worktree"`
	Kept     int    `json:"kept"`
	Oldest   uint64 `json:"oldest,omitempty"`
	Newest   uint64 `json:"newest,omitempty"`
}

// SnapshotList answers GET /v1/snapshots?worktree=DIR, newest first.
type SnapshotList struct {
	Worktree  string     `json:"worktree"`
	Snapshots []Snapshot `json:"snapshots"`
}

// Snapshot is one saved abandoned generation of a worktree.
// GET /v1/snapshots, GET /v1/snapshots/{n}
type Snapshot struct {
	Generation     uint64       `json:"generation"`
	Ref            string       `json:"ref"`
	Commit         string       `json:"commit"`
	Baseline       string       `json:"baseline"`
	HeadBefore     string       `json:"head_before,omitempty"`
	Created        time.Time    `json:"created"`
	Paths          []PathChange `json:"paths,omitempty"`
	PathsTruncated bool         `json:"paths_truncated,omitempty"`
	Modified       int          `json:"modified"`
	Added          int          `json:"added"`
	Deleted        int          `json:"deleted"`
}

// LowerCheck is what a fence found of a layered worktree's lower: shim
// keeps it read-only to every process but its own (docs/layers.md, "The
// lower's trust"), and every fence confirms it before the snapshot.
type LowerCheck struct {
	// Locked: the lock was confirmed (the same read-only mount, the same
	// directory as when shim locked it). When it was not, Error says why;
	// the lock was made again and the scan restore ran on the lower,
	// saving whatever differed from the baseline into the fenced
	// generation's snapshot and resetting it (the worktree section's
	// paths list it).
	Locked bool   `json:"locked"`
	Error  string `json:"error,omitempty"`
	// MetadataRestored lists the lower's git metadata (config, hooks,
	// info, alternates, HEAD) that differed from the trusted copy and was
	// put back; empty when it matched.
	MetadataRestored []string `json:"metadata_restored"`
	// VerifyMS is what the check took.
	VerifyMS float64 `json:"verify_ms"`
}
