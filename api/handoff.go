package api

// Abandoned tells a generation what the generation before it left behind,
// so that a recovered agent can pick the work up instead of redoing it.
// shim writes it, before the generation starts, to the file named by the
// generation's $SHIM_ABANDONED_FILE (<runtime-dir>/handoff/<N>.json, mode
// 0440, owned by the generation's uid), and puts its main fields in the
// environment: SHIM_PREVIOUS_GENERATION, SHIM_PREVIOUS_SNAPSHOT_REF,
// SHIM_PREVIOUS_SNAPSHOT_COMMIT, SHIM_PREVIOUS_PUSHED. It holds no secret:
// paths, refs, commits and counts, from the fence report.
type Abandoned struct {
	// Generation is the generation this is for; PreviousGeneration the one
	// it follows (the newest fenced before it).
	Generation         uint64 `json:"generation"`
	PreviousGeneration uint64 `json:"previous_generation"`
	// StateBefore is how its fence found it: running, exited, adopted, ...
	StateBefore string `json:"state_before,omitempty"`
	// Exit is its harness's exit record, when it had one.
	Exit *Exit `json:"exit,omitempty"`
	// Its worktree's snapshot: every changed, new and deleted path as a
	// commit (its own commits as parents) at SnapshotRef, on top of
	// Baseline. Empty when it had no worktree.
	Worktree       string `json:"worktree,omitempty"`
	SnapshotRef    string `json:"snapshot_ref,omitempty"`
	SnapshotCommit string `json:"snapshot_commit,omitempty"`
	Baseline       string `json:"baseline,omitempty"`
	Modified       int    `json:"modified"`
	Added          int    `json:"added"`
	Deleted        int    `json:"deleted"`
	LocalCommits   int    `json:"local_commits"`
	// Paths are the changed paths, at most 100 (PathsTruncated: more).
	Paths          []PathChange `json:"paths,omitempty"`
	PathsTruncated bool         `json:"paths_truncated,omitempty"`
	// SnapshotError says why its worktree layer could not be made a
	// snapshot (the layer is kept for a person; docs/layers.md).
	SnapshotError string `json:"snapshot_error,omitempty"`
	// OutsidePaths are what it changed outside the worktree (its root
	// layer, kept for forensics, not given to this generation), at most
	// 100.
	OutsidePaths          []string `json:"outside_paths,omitempty"`
	OutsidePathsTruncated bool     `json:"outside_paths_truncated,omitempty"`
	// Pushed is "true" when the fence's push check found the remote
	// branch moved past the baseline (likely its pushes: RemoteCommits of
	// them), "false" when it found it had not, "unknown" when there was no
	// push check (announce with fetch) or it failed. A push a server
	// finished receiving after the fence shows later, in the remote_moved
	// event.
	Pushed        string `json:"pushed"`
	Remote        string `json:"remote,omitempty"`
	Branch        string `json:"branch,omitempty"`
	RemoteCommits int    `json:"remote_commits,omitempty"`
}

// Values of Abandoned.Pushed (and $SHIM_PREVIOUS_PUSHED).
const (
	PushedYes     = "true"
	PushedNo      = "false"
	PushedUnknown = "unknown"
)
