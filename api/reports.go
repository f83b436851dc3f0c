package api

import "time"

// Connection is one socket of a generation open at its cut, as the kernel
// (or shim's egress proxy) reported it just before aborting it.
type Connection struct {
	// Via is "socket" for a socket of the generation's own (host mode, or
	// inside its namespace) and "proxy" for a connection through shim's
	// egress proxy (isolated mode).
	Via      string `json:"via"`
	Protocol string `json:"protocol"`         // tcp, udp, or mptcp (one MPTCP connection, its subflows folded in)
	Family   string `json:"family"`           // ipv4 or ipv6
	Local    string `json:"local,omitempty"`  // address:port
	Remote   string `json:"remote,omitempty"` // address:port; port 0 for a listener
	State    string `json:"state,omitempty"`  // TCP: established, syn_sent, fin_wait1, close_wait, listen, ...; UDP: established or unconnected
	UID      uint32 `json:"uid,omitempty"`    // the socket's owner (via socket)
	// What the proxy knew (via proxy only): the generation's end, "connect"
	// or "http", the host:port asked for, and the request line ("CONNECT
	// host:port" or "METHOD scheme://host/path": no userinfo, no query).
	Client    string `json:"client,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Target    string `json:"target,omitempty"`
	Request   string `json:"request,omitempty"`
	BytesUp   int64  `json:"bytes_up,omitempty"`
	BytesDown int64  `json:"bytes_down,omitempty"`
	// SendQueue is what the socket still held on the way out: bytes written
	// and not yet acknowledged by the peer, sent or not (dropped by the
	// abort); RecvQueue what had arrived and was not read. For mptcp both
	// are the MPTCP level's and TCP holds its data-level counts.
	SendQueue uint32   `json:"send_queue"`
	RecvQueue uint32   `json:"recv_queue"`
	TCP       *TCPInfo `json:"tcp_info,omitempty"` // the kernel's, read just before the abort
	// InFlight is true where a request may have reached the server whole
	// before the freeze: the connection was established (or closing) and
	// the peer had acknowledged payload, or the kernel did not say. A
	// listener, a connection still in its handshake, or one whose peer
	// acknowledged nothing beyond the SYN is not in flight. No in-sandbox
	// fence can take back what a server already received.
	InFlight bool `json:"in_flight"`
}

// TCPInfo is how far a connection's data got: the part of the kernel's
// struct tcp_info that says so.
type TCPInfo struct {
	BytesSent       uint64 `json:"bytes_sent"`       // tcpi_bytes_sent: payload bytes transmitted, retransmissions included
	BytesAcked      uint64 `json:"bytes_acked"`      // tcpi_bytes_acked: the SYN counts 1
	BytesReceived   uint64 `json:"bytes_received"`   // tcpi_bytes_received
	NotSentBytes    uint32 `json:"notsent_bytes"`    // tcpi_notsent_bytes: queued, never transmitted
	UnackedSegments uint32 `json:"unacked_segments"` // tcpi_unacked: segments sent and not acknowledged
}

// NetworkInfo describes a generation's network for status and fence
// reports, so that an operator can find its namespaces (inode numbers as in
// /proc/PID/ns/net) and its link.
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
// fetched after it was dead, compared with the baseline. A fetch that failed
// is reported in Error; it never fails the restore.
type FetchReport struct {
	Remote string `json:"remote"`
	Branch string `json:"branch"`
	// URL is the remote's URL from the pristine config (after
	// url.*.insteadOf), without userinfo.
	URL string `json:"url,omitempty"`
	// Ref is where the branch was fetched to: refs/shim/remote/<remote>/<branch>.
	Ref string `json:"ref,omitempty"`
	// Authenticated is true when a credential was registered for the URL,
	// so the fetching git was given the helper.
	Authenticated bool `json:"authenticated"`
	// FetchedCommit is the commit the remote branch pointed at.
	FetchedCommit string `json:"fetched_commit,omitempty"`
	// Baseline is the commit it is compared with.
	Baseline string `json:"baseline,omitempty"`
	// RemoteMoved is true when FetchedCommit is neither the baseline nor an
	// ancestor of it: the remote gained commits after the baseline, most
	// likely pushed by the abandoned generation.
	RemoteMoved bool `json:"remote_moved"`
	// RemoteCommits are those commits (fetched ^baseline), newest first,
	// at most 50; RemoteCommitCount counts all of them.
	RemoteCommits          []RemoteCommit `json:"remote_commits,omitempty"`
	RemoteCommitCount      int            `json:"remote_commit_count"`
	RemoteCommitsTruncated bool           `json:"remote_commits_truncated,omitempty"`
	// Error says why the fetch or the comparison failed ("" when it did not).
	Error      string  `json:"error,omitempty"`
	DurationMS float64 `json:"duration_ms"`
	// Settled is set on the re-check after the settle window: the remote
	// as it was then (see FenceReport and the remote_moved event).
	Settled bool `json:"settled,omitempty"`
}

// WorktreeReport is the "worktree" section of a fence report: what the
// restore step saved and reset (package gitguard fills the restore's part,
// the runtime the layer's and the lower's).
type WorktreeReport struct {
	Worktree string `json:"worktree"`
	// Baseline is the commit the worktree was reset to: BaselineRev
	// resolved after the pristine metadata was put back ("" when it did not
	// resolve).
	Baseline string `json:"baseline"`
	// BaselineRev is the baseline as Restore was asked for it (a commit id
	// or a ref name).
	BaselineRev    string `json:"baseline_rev,omitempty"`
	SnapshotRef    string `json:"snapshot_ref"`
	SnapshotCommit string `json:"snapshot_commit"`
	// SnapshotReused is true when the ref already held this generation's
	// snapshot (a repeated or interrupted Restore) and was kept.
	SnapshotReused bool `json:"snapshot_reused"`
	// HeadBefore is the commit HEAD pointed at before the restore ("" when
	// HEAD was unborn or unreadable).
	HeadBefore string `json:"head_before"`
	// Counts of paths that differ between the baseline and the snapshot.
	Modified       int          `json:"modified"`
	Added          int          `json:"added"`
	Deleted        int          `json:"deleted"`
	Paths          []PathChange `json:"paths"`
	PathsTruncated bool         `json:"paths_truncated,omitempty"`
	// Ignored lists the ignored files (directories end in "/") that were
	// not saved and have been removed; empty with include_ignored.
	Ignored          []string `json:"ignored,omitempty"`
	IgnoredTruncated bool     `json:"ignored_truncated,omitempty"`
	// NestedRepos are untracked directories holding their own repository:
	// the snapshot only records their HEAD commit (as a gitlink), not their
	// files or history; those without a commit are moved aside (see
	// NestedReposMovedTo).
	NestedRepos []string `json:"nested_repos,omitempty"`
	// NestedReposMovedTo is set when nested repositories without a commit
	// (which git cannot record) were found: they were left out of the
	// snapshot and moved, files and all, to <git dir>/shim-nested/<gen>/<path>
	// (this directory); they are listed in NestedRepos too.
	NestedReposMovedTo string `json:"nested_repos_moved_to,omitempty"`
	// ReplaceRefsMoved lists the refs/replace/* refs found after the
	// snapshot; each now lives at refs/shim/replace/<gen>/<name>.
	ReplaceRefsMoved []string `json:"replace_refs_moved,omitempty"`
	// RefsMoved lists every ref that differed from the trusted namespace
	// (created, moved or deleted by the harness, including anything
	// planted under refs/shim/): the trusted value is back, the harness's
	// is kept at SavedAs (refs/shim/harness/<gen>/<ref>).
	RefsMoved          []RefChange `json:"refs_moved,omitempty"`
	RefsMovedTruncated bool        `json:"refs_moved_truncated,omitempty"`
	// RefsRemoved lists what was removed from refs/, logs/ or packed-refs
	// because it was not a ref (a FIFO, a symlink, an unreadable or
	// malformed file), relative to the git dir.
	RefsRemoved          []string `json:"refs_removed,omitempty"`
	RefsRemovedTruncated bool     `json:"refs_removed_truncated,omitempty"`
	// RefsNotSaved counts the harness's refs past the 16,384 a fence keeps: listed in
	// RefsMoved (up to its cap) with no SavedAs, their values not kept.
	RefsNotSaved int `json:"refs_not_saved,omitempty"`
	// NotStored lists the files the snapshot did not store: larger than
	// MaxFileSize, or special files (FIFO, socket, device). They were
	// removed (a tracked path gets the baseline's version back).
	NotStored []NotStoredFile `json:"not_stored,omitempty"`
	// MaxFileSize is the cap in effect (--max-file-size).
	MaxFileSize int64 `json:"max_file_size"`
	// Repaired lists the permissions the restore added, as the owner, so
	// git could read or write (a mode-000 file, a read-only directory, a
	// read-only .git/objects), as "path: mode old -> new".
	Repaired []string `json:"repaired,omitempty"`
	// LocalCommits counts the commits of the abandoned generation that are
	// not in the baseline; they stay reachable through the snapshot's
	// parents.
	LocalCommits int `json:"local_commits"`
	// Cleaned lists what a killed git left behind and was removed (lock
	// files, rebase and merge state, temporary object files), relative to
	// the git dir.
	Cleaned []string `json:"cleaned,omitempty"`
	// MetadataRestored lists the git metadata (relative to the git dir) put
	// back from the trusted copy because the harness had changed it.
	MetadataRestored []string `json:"metadata_restored,omitempty"`
	// Fetch is the fetch of the remote branch (a start's fetch spec):
	// whether the remote moved past the baseline, and its new commits.
	Fetch *FetchReport `json:"fetch,omitempty"`
	// DurationsMS has the time of each step: metadata, refs, snapshot,
	// fetch (with WithFetch), clean, reset, verify, total; repair when a
	// step needed the full repair.
	DurationsMS map[string]float64 `json:"durations_ms"`
	// Registration is how the worktree's trusted metadata was taken
	// (on the report of the announcement that registered it).
	Registration *Registration `json:"registration,omitempty"`
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

// NotStoredFile is a file a snapshot listed instead of storing.
type NotStoredFile struct {
	Path string `json:"path"`
	// Type is "file" (larger than the cap), "fifo", "socket",
	// "char_device" or "block_device"; a layer's snapshot adds
	// "nested_git" (a .git directory below the worktree's top),
	// "pack_rejected", and the bounds of its walk (the layer keeps what
	// they leave out): "too_deep", a directory 1024 deep, whose entries are
	// not stored; "path_too_long", an entry whose path is longer than
	// PATH_MAX less its NUL (4095 bytes), not stored, nor anything below
	// it; "too_many_entries", a directory whose entries past the walk's
	// budgets are not stored ("." for the layer's top).
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Allocated is the space the file takes on disk (small for a sparse
	// file).
	Allocated int64 `json:"allocated"`
	// Hash is "sha256:<hex>" of the first HashedBytes bytes (files only).
	Hash        string `json:"hash,omitempty"`
	HashedBytes int64  `json:"hashed_bytes"`
	// Tracked: the baseline has the path (it comes back from there).
	Tracked bool `json:"tracked"`
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
	// Cleaned lists lock files and temporary files a killed git left
	// (relative to the git dir), removed.
	Cleaned []string `json:"cleaned,omitempty"`
	// SnapshotsPruned are the snapshot refs (refs/shim/abandoned/<gen>)
	// deleted since the previous report; with ObjectsPruned their objects
	// are gone too.
	SnapshotsPruned []string `json:"snapshots_pruned,omitempty"`
	// ObjectsPruned is true when the object store was repacked from the
	// remaining refs and the unreachable objects deleted: the objects of
	// SnapshotsPruned are gone too.
	ObjectsPruned bool `json:"objects_pruned,omitempty"`
	// Repack is "geometric" (new packs and loose objects rolled up), "full"
	// (everything reachable into one pack, the rest deleted) or "".
	Repack string `json:"repack,omitempty"`
	// RefsPacked is true when the loose refs were packed.
	RefsPacked bool `json:"refs_packed,omitempty"`
	// The object store before and after.
	PacksBefore int `json:"packs_before"`
	PacksAfter  int `json:"packs_after"`
	LooseBefore int `json:"loose_before"`
	LooseAfter  int `json:"loose_after"`
	// SnapshotsKept is how many snapshot refs remain.
	SnapshotsKept int `json:"snapshots_kept"`
	// Error is why a step failed (the worktree is still usable: maintenance
	// only ever removes what nothing reaches).
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
