"""Python client of shim's control API (standard library only).

shim's API is HTTP/1.1 + JSON over the unix socket <runtime-dir>/shim.sock,
under /v1/ (README.md, "API"; the wire types are Go's package api). Every
call returns the decoded JSON (plain dicts and lists, typed below as
TypedDicts) or raises ShimError with one of the stable codes in Code.

    from shim_client import Client, Code, ShimError
    c = Client("/run/shim")
    res = c.start(7, ["agent", "run"], worktree="/workspace", baseline=sha, lease_ms=30000)
"""

from .client import (
    Client,
    EventStream,
    LogStream,
    ProcessStream,
    ShimError,
    code_of,
    vsock_client,
)
from .codes import Code, EventType, FrameType, GenState, Network, State, CODES
from .types import (
    Abandoned,
    Credential,
    CutReport,
    Event,
    EventData,
    Exit,
    Frame,
    FenceReport,
    FenceResult,
    FetchSpec,
    Generation,
    Lease,
    Limits,
    Process,
    Registration,
    RenewResult,
    Snapshot,
    SnapshotList,
    StartResult,
    Status,
)

__all__ = [
    "Client",
    "EventStream",
    "LogStream",
    "ProcessStream",
    "ShimError",
    "code_of",
    "vsock_client",
    "Code",
    "CODES",
    "EventType",
    "FrameType",
    "GenState",
    "Network",
    "State",
    "Abandoned",
    "Credential",
    "CutReport",
    "Event",
    "EventData",
    "Exit",
    "Frame",
    "FenceReport",
    "FenceResult",
    "FetchSpec",
    "Generation",
    "Lease",
    "Limits",
    "Process",
    "Registration",
    "RenewResult",
    "Snapshot",
    "SnapshotList",
    "StartResult",
    "Status",
]
