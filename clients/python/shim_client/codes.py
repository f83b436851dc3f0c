"""Stable error codes and the enumerations of shim's API (api/api.go,
api/types.go). A test checks that every code constant of api/api.go is here.
Each name is its wire value."""


class Code:
    BAD_REQUEST = "BAD_REQUEST"
    NOT_FOUND = "NOT_FOUND"
    STALE_GENERATION = "STALE_GENERATION"
    GENERATION_CONFLICT = "GENERATION_CONFLICT"
    FENCE_FAILED = "FENCE_FAILED"
    FREEZE_FAILED = "FREEZE_FAILED"
    CGROUP_ROOT_REFUSED = "CGROUP_ROOT_REFUSED"
    CUT_FAILED = "CUT_FAILED"
    AUDIT_FAILED = "AUDIT_FAILED"
    TOKEN_NOT_PERSISTED = "TOKEN_NOT_PERSISTED"
    RESTORE_FAILED = "RESTORE_FAILED"
    WORKTREE_REFUSED = "WORKTREE_REFUSED"
    START_FAILED = "START_FAILED"
    PEER_NOT_ALLOWED = "PEER_NOT_ALLOWED"
    NOT_RUNNING = "NOT_RUNNING"
    GENERATION_LIVE = "GENERATION_LIVE"
    CONTROLLER_MISSING = "CONTROLLER_MISSING"
    UNSUPPORTED = "UNSUPPORTED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    ISOLATION_UNAVAILABLE = "ISOLATION_UNAVAILABLE"
    NOT_CURRENT = "NOT_CURRENT"
    # An end of a generation above the highest announced, without force:
    # nothing was fenced.
    NOT_ANNOUNCED = "NOT_ANNOUNCED"
    # HTTP 405: the path exists with other methods.
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    INTERNAL = "INTERNAL"
    # The exec API (api/exec.go): an exec into a generation whose lease ran
    # out; a generation already running 256 tool calls; a write to a
    # closed stdin; a call that did not read its stdin in time.
    GENERATION_SUSPENDED = "GENERATION_SUSPENDED"
    TOO_MANY_CALLS = "TOO_MANY_CALLS"
    STDIN_CLOSED = "STDIN_CLOSED"
    STDIN_FULL = "STDIN_FULL"
    # Client side only: a tool call's output stream ended without its exit
    # or fenced frame; attach() again from the stream's offsets.
    STREAM_LOST = "STREAM_LOST"
    # Client side only: the shim could not be reached (nothing was sent).
    UNREACHABLE = "UNREACHABLE"
    # Client side only: the call's timeout ended it after it was sent; shim
    # may have carried it out. Retry with the same generation and spec (an
    # identical retry is answered with the first outcome, replayed true).
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    # wait()'s timeout (shim ctl wait --timeout) ran out: the generation had
    # not exited yet and still runs; a wait changes nothing, so there is
    # nothing to retry but the wait.
    WAIT_TIMEOUT = "WAIT_TIMEOUT"


CODES = frozenset(v for k, v in vars(Code).items() if not k.startswith("_"))


class State:
    """Status.state."""

    IDLE = "idle"
    RUNNING = "running"
    EXITED = "exited"
    FENCING = "fencing"
    FAILED = "failed"
    # The current generation's lease ran out: it is frozen and cut
    # (credentials refused, connections aborted), not killed, until a
    # renewal resumes it or a newer announcement fences it. Also a
    # generation record's state.
    SUSPENDED = "suspended"


class GenState:
    """Generation.state, besides running, suspended, exited, fencing and
    failed (State)."""

    ADOPTED = "adopted"
    FENCED = "fenced"
    # GONE: left by a previous shim with no process left; its exit is
    # unknown, its worktree restored at the next announcement.
    GONE = "gone"


class EventType:
    STARTED = "started"
    EXITED = "exited"
    QUIESCED = "quiesced"
    FENCING = "fencing"
    FENCED = "fenced"
    FAILED = "failed"
    REMOTE_MOVED = "remote_moved"
    SHUTDOWN = "shutdown"
    # A lease ran out: the generation was suspended (data.killed: it could
    # not be, and was killed instead).
    LEASE_EXPIRED = "lease_expired"
    RESUMED = "resumed"  # a renewal resumed a suspended generation
    # This reader missed the events from..to (lost of them): it fell behind
    # the events shim keeps, or asked for a since older than them.
    GAP = "gap"


class FrameType:
    """Types of the frames of a byte stream (api/stream.go): logs, exec."""
    STARTED = "started"
    STDOUT = "stdout"
    STDERR = "stderr"
    DROPPED = "dropped"  # bytes of stream not kept; offset: where it resumes
    EXIT = "exit"
    FENCED = "fenced"
    END = "end"  # a read that does not follow reached what is kept


class Network:
    HOST = "host"
    NONE = "none"
    ISOLATED = "isolated"
