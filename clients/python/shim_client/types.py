"""Typed views of the main wire types (api/types.go, api/reports.go).

They are TypedDicts: at run time every result is the plain dict json.loads
made, so fields shim adds later are there too. total=False because shim
omits empty optional fields."""

from typing import Any, Dict, List, TypedDict


class Credential(TypedDict, total=False):
    protocol: str
    host: str
    path: str
    username: str
    password: str


class Limits(TypedDict, total=False):
    memory_max: int
    pids_max: int
    cpu_max: str


class FetchSpec(TypedDict, total=False):
    remote: str
    branch: str
    remote_url: str
    settle_ms: int


class Exit(TypedDict, total=False):
    generation: int
    pid: int
    exit_code: int
    signal: int
    started_at: str
    exited_at: str
    fenced: bool


class Registration(TypedDict, total=False):
    worktree: str
    registered_late: bool
    dropped: List[str]
    registered_at: str


class CutReport(TypedDict, total=False):
    credentials_revoked: int
    tunnels_closed: int
    connections_closed: int
    sockets_destroyed: int
    link_deleted: bool
    connections: List[Dict[str, Any]]
    in_flight: bool
    abort_unsupported: str
    durations_ms: Dict[str, float]


class FenceReport(TypedDict, total=False):
    generation: int
    state_before: str
    killed: int
    survivors: int
    durations_ms: Dict[str, float]
    cut: CutReport
    worktree: Dict[str, Any]
    layer: Dict[str, Any]
    snapshot_ref: str
    snapshot_commit: str
    baseline: str
    exit: Exit
    error: Dict[str, str]
    records_pruned: List[int]


class Lease(TypedDict, total=False):
    """A generation's lease, in its record (Generation.lease) and in a
    renewal's answer. suspended is true while it has run out and the
    generation is frozen and cut; killed when a suspension could not be
    confirmed and the generation was killed instead (error says why)."""
    duration_ms: int
    expires_at: str
    suspended: bool
    suspended_at: str
    suspensions: int
    renewals: int
    cut: CutReport
    killed: bool
    error: Dict[str, str]


class RenewResult(TypedDict, total=False):
    """POST /v1/generations/{n}/lease. state: running (resumed or still
    running), exited (the lease no longer matters) or adopted."""
    generation: int
    state: str
    resumed: bool
    lease: Lease


class StartResult(TypedDict, total=False):
    replayed: bool
    # On a replayed answer only: what became of the generation since
    # (a Generation state; "gone" when its harness died with a previous
    # shim) and its exit record when it exited.
    state: str
    exit: Exit
    generation: int
    pid: int
    cgroup: str
    started_at: str
    fenced: List[FenceReport]
    network: Dict[str, Any]
    baseline: str
    durations_ms: Dict[str, float]
    worktree: Registration
    worktree_cleaned: List[str]


class FenceResult(TypedDict, total=False):
    generation: int
    fenced: List[FenceReport]


class Generation(TypedDict, total=False):
    generation: int
    state: str
    pid: int
    cgroup: str
    command: List[str]
    started_at: str
    exit: Exit
    worktree: str
    network: str
    labels: Dict[str, str]
    stdout: str
    stderr: str
    limits: Limits
    linger: bool
    isolation: str
    push_check: Dict[str, Any]
    fence: FenceReport
    lease: Lease


class Status(TypedDict, total=False):
    generation: int
    state: str
    pid: int
    mode: str
    mode_reason: str
    shim_pid: int
    subreaper: bool
    cgroup_root: str
    runtime_dir: str
    current: Generation
    live: List[Generation]
    error: Dict[str, str]
    orphans_reaped: int
    version: str
    worktrees: List[Registration]
    isolation: Dict[str, Any]
    retention: Dict[str, Any]


class Snapshot(TypedDict, total=False):
    generation: int
    ref: str
    commit: str
    baseline: str
    head_before: str
    created: str
    paths: List[Dict[str, str]]
    paths_truncated: bool
    modified: int
    added: int
    deleted: int


class SnapshotList(TypedDict, total=False):
    worktree: str
    snapshots: List[Snapshot]


class EventData(TypedDict, total=False):
    """An event's data; which keys it has depends on the event's type:
    started: pid; exited: exit_code, signal, fenced; quiesced: killed;
    fencing: by; fenced: killed, survivors; failed: error ({"code",
    "message"}); remote_moved: remote, branch, at_fence, now;
    lease_expired: killed (a bool); resumed, shutdown, gap: none."""
    pid: int
    exit_code: int
    signal: int
    fenced: bool
    killed: Any  # a count, or for lease_expired a bool
    survivors: int
    by: int
    error: Dict[str, str]
    remote: str
    branch: str
    at_fence: str
    now: str


class Event(TypedDict, total=False):
    seq: int  # 1, 2, ... for this shim; a gap event has none
    instance: str  # the shim that numbered it (new at each start of shim)
    type: str
    generation: int
    time: str
    data: EventData  # which keys: by type, see EventData
    # a gap event's: events from..to (lost of them) never reach this reader
    to: int
    lost: int
    # "from" is a Python keyword: ev["from"]


class Process(TypedDict, total=False):
    """A tool call's record (api.Process): GET .../processes/{id}."""
    id: str
    generation: int
    pid: int
    command: List[str]
    cwd: str
    user: str
    tty: bool
    labels: Dict[str, str]
    cgroup: str
    state: str  # "running" or "exited"
    started_at: str
    exited_at: str
    exit_code: int  # 128+signal when killed
    signal: int
    timed_out: bool
    timeout_ms: int
    fenced: bool  # its generation was fenced (or ended) while it ran
    stdout_bytes: int
    stderr_bytes: int
    stdout_kept: int
    stderr_kept: int
    stdout: str
    stderr: str
    leftover: int


class Frame(TypedDict, total=False):
    """One line of a byte stream (logs, a tool call's output). data is
    bytes here (base64 on the wire, decoded by the client)."""
    type: str
    stream: str
    offset: int
    data: bytes
    bytes: int
    exit: Exit
    id: str  # started
    pid: int  # started
    process: Process  # exit, fenced (a tool call's)


class Abandoned(TypedDict, total=False):
    """The hand-off file at $SHIM_ABANDONED_FILE (api.Abandoned)."""
    generation: int
    previous_generation: int
    state_before: str
    exit: Exit
    worktree: str
    snapshot_ref: str
    snapshot_commit: str
    baseline: str
    modified: int
    added: int
    deleted: int
    local_commits: int
    paths: List[Dict[str, str]]
    paths_truncated: bool
    outside_paths: List[str]
    pushed: str  # "true", "false" or "unknown"
