"""The client: one short HTTP/1.1 connection over the unix socket per call."""

import base64
import http.client
import json
import os
import socket
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote, urlencode

from .codes import Code
from .types import (
    Event,
    Exit,
    Frame,
    FenceResult,
    Generation,
    Process,
    Registration,
    RenewResult,
    Snapshot,
    SnapshotList,
    StartResult,
    Status,
)

_DEFAULT = object()  # "the client's timeout", as opposed to None: no timeout


class ShimError(Exception):
    """A failed call: the API's stable code (Code.*), its message, and for a
    failed announcement the fence reports of what was fenced before it
    failed. status is the HTTP status (None for the client-side codes
    UNREACHABLE and OUTCOME_UNKNOWN)."""

    def __init__(self, code: str, message: str, fenced: Optional[List[Dict[str, Any]]] = None,
                 status: Optional[int] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.fenced = fenced or []
        self.status = status


def code_of(exc: BaseException) -> str:
    """The stable code of an exception raised by this client (INTERNAL for
    any other exception)."""
    return exc.code if isinstance(exc, ShimError) else Code.INTERNAL


class _UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over AF_UNIX: only connect differs."""

    def __init__(self, path: str, timeout: Optional[float]):
        super().__init__("shim", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _VsockHTTPConnection(http.client.HTTPConnection):
    """http.client over AF_VSOCK (Linux): only connect differs."""

    def __init__(self, cid: int, port: int, timeout: Optional[float]):
        super().__init__("shim", timeout=timeout)
        self._addr = (cid, port)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._addr)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def vsock_client(cid: int, port: int, *, timeout: Optional[float] = None) -> "Client":
    """A Client of the shim in the VM whose context id is cid, serving the
    control API on vsock port (shim init --listen vsock:PORT; it admits the
    host, CID 2, only): shim ctl --connect vsock:CID:PORT. Every verb is
    the same; AF_VSOCK is Linux's (socket.AF_VSOCK)."""
    if not hasattr(socket, "AF_VSOCK"):
        raise ShimError(Code.UNREACHABLE, "this Python has no AF_VSOCK (Linux only)")
    c = Client(socket_path=f"vsock:{cid}:{port}", timeout=timeout)
    c._new_connection = lambda t: _VsockHTTPConnection(cid, port, t)  # type: ignore[method-assign]
    return c


# The highest generation shim accepts (api.MaxGeneration): 2^53-1.
MAX_GENERATION = 2**53 - 1


def _gen(n: int) -> str:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n > MAX_GENERATION:
        raise ShimError(Code.BAD_REQUEST, f"generation {n!r} is not an integer from 0 to {MAX_GENERATION} (2^53-1)")
    return str(n)


def _clean(fields: Mapping[str, Any]) -> Dict[str, Any]:
    # None means "not given": shim decodes strictly and treats an absent
    # field as its zero value.
    return {k: v for k, v in fields.items() if v is not None}


def _next_line(resp: http.client.HTTPResponse, close) -> bytes:
    """The next non-empty NDJSON line of a stream; StopIteration (after
    close) at its end; a read error closes it and propagates."""
    while True:
        try:
            line = resp.readline()
        except BaseException:
            close()
            raise
        if not line:
            close()
            raise StopIteration
        line = line.strip()
        if line:
            return line


class EventStream:
    """GET /v1/events: iterate for Event dicts until shim closes the stream
    (at shutdown) or close() is called; usable as a context manager. With a
    timeout, waiting longer than that for the next event raises
    TimeoutError and closes the stream."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self._conn = conn
        self._resp = resp

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        return json.loads(_next_line(self._resp, self.close))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LogStream:
    """GET /v1/generations/{n}/logs: iterate for Frame dicts (data decoded
    to bytes) until the stream's last frame (end; with follow, exit or
    fenced once the generation is over), which is yielded too and kept in
    last. stdout_offset and stderr_offset are where the stream stopped: a
    reader cut off (last None) reads again from them. Usable as a context
    manager; close() ends it early."""

    def __init__(self, conn: _UnixHTTPConnection, resp: http.client.HTTPResponse,
                 stdout_offset: int, stderr_offset: int):
        self._conn = conn
        self._resp = resp
        self.stdout_offset = stdout_offset
        self.stderr_offset = stderr_offset
        self.last: Optional[Frame] = None

    def __iter__(self) -> Iterator[Frame]:
        return self

    def __next__(self) -> Frame:
        if self.last is not None:
            raise StopIteration
        f = json.loads(_next_line(self._resp, self.close))
        f["data"] = base64.b64decode(f["data"]) if f.get("data") else b""
        t = f.get("type")
        if t == "stdout":
            self.stdout_offset = f.get("offset", 0) + len(f["data"])
        elif t == "stderr":
            self.stderr_offset = f.get("offset", 0) + len(f["data"])
        elif t == "dropped":
            if f.get("stream") == "stderr":
                self.stderr_offset = f.get("offset", 0)
            else:
                self.stdout_offset = f.get("offset", 0)
        elif t in ("end", "exit", "fenced"):
            self.last = f
            self.close()
        return f

    def read_all(self) -> Tuple[bytes, bytes]:
        """Reads the stream to its end; returns (stdout, stderr)."""
        out, err = [], []
        for f in self:
            if f["type"] == "stdout":
                out.append(f["data"])
            elif f["type"] == "stderr":
                err.append(f["data"])
        return b"".join(out), b"".join(err)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "LogStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ProcessStream(LogStream):
    """A tool call's output (Client.exec, Client.attach): the frames of a
    LogStream, first a started frame (id and pid, kept here) when the call
    was just started, and last an exit or fenced frame whose process is the
    call's record. wait() reads to that frame and returns the record."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                 stdout_offset: int = 0, stderr_offset: int = 0, id: str = ""):
        super().__init__(conn, resp, stdout_offset, stderr_offset)
        self.id = id
        self.pid = 0
        self.process: Optional[Process] = None

    def __next__(self) -> Frame:
        f = super().__next__()
        if f.get("type") == "started":
            self.id, self.pid = f.get("id", ""), f.get("pid", 0)
        elif f.get("type") in ("exit", "fenced"):
            self.process = f.get("process")
        return f

    def wait(self, stdout: Any = None, stderr: Any = None) -> Process:
        """Reads to the last frame, writing the output to stdout and stderr
        (binary file objects, or None to drop it), and returns the call's
        record. A stream cut before its last frame is STREAM_LOST: attach()
        again from stdout_offset and stderr_offset."""
        for f in self:
            if f["type"] == "stdout" and stdout is not None:
                stdout.write(f["data"])
            elif f["type"] == "stderr" and stderr is not None:
                stderr.write(f["data"])
        if self.process is None:
            raise ShimError(Code.STREAM_LOST, f"tool call {self.id}: its output stream ended without its exit "
                            f"(stdout at {self.stdout_offset}, stderr at {self.stderr_offset}): attach again")
        return self.process


class Client:
    """A client of one shim. runtime_dir defaults to $SHIM_RUNTIME_DIR, else
    /run/shim (as shim ctl); socket_path overrides <runtime_dir>/shim.sock.

    timeout (seconds, None: none) bounds every call that is not given its
    own. A call the timeout ends after it was sent raises ShimError
    OUTCOME_UNKNOWN: shim may have carried it out; retry with the same
    generation and spec. A shim that cannot be reached raises UNREACHABLE.
    """

    def __init__(self, runtime_dir: Optional[str] = None, *, socket_path: Optional[str] = None,
                 timeout: Optional[float] = None):
        if socket_path is None:
            if runtime_dir is None:
                runtime_dir = os.environ.get("SHIM_RUNTIME_DIR") or "/run/shim"
            socket_path = os.path.join(runtime_dir, "shim.sock")
        self.socket_path = socket_path
        self.timeout = timeout

    # -- transport

    def _new_connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        return _UnixHTTPConnection(self.socket_path, timeout)

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        conn = self._new_connection(timeout)
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            raise ShimError(Code.UNREACHABLE, f"cannot reach shim at {self.socket_path}: {e}") from e
        return conn

    def _call(self, method: str, path: str, body: Any = None, timeout: Any = _DEFAULT) -> Any:
        if timeout is _DEFAULT:
            timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        conn = self._connect(timeout)

        def bound() -> None:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("timed out")
                conn.sock.settimeout(left)

        try:
            headers = {}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            bound()
            conn.request(method, path, body=data, headers=headers)
            bound()
            resp = conn.getresponse()
            bound()
            raw = resp.read()
        except socket.timeout as e:
            raise ShimError(
                Code.OUTCOME_UNKNOWN,
                f"{method} {path}: timed out after {timeout}s before shim answered; "
                "the outcome is unknown: retry with the same generation and spec") from e
        except (OSError, http.client.HTTPException) as e:
            raise ShimError(Code.UNREACHABLE, f"{method} {path}: the connection to shim at "
                            f"{self.socket_path} failed: {e!r}") from e
        finally:
            conn.close()
        return _decode(resp.status, raw)

    # -- verbs

    def health(self, *, timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """GET /v1/health: {"ok": true}."""
        return self._call("GET", "/v1/health", timeout=timeout)

    def status(self, *, timeout: Any = _DEFAULT) -> Status:
        """GET /v1/status."""
        return self._call("GET", "/v1/status", timeout=timeout)

    def start(self, generation: int, command: Sequence[str], *, timeout: Any = _DEFAULT,
              **fields: Any) -> StartResult:
        """POST /v1/generations: announce generation and start command; every
        older generation is fenced first. fields are the other fields of the
        start request by their wire names (cwd, user, env, worktree,
        baseline, keep_paths, include_ignored, network, allow, credentials,
        limits, labels, fetch, linger, require_isolation, if_current,
        lease_ms, ...). With lease_ms the generation is suspended (frozen
        and cut, not killed) unless renew() or keep_lease() renews it in
        time; an identical retry renews it too (lease_ms is not part of the
        announcement's identity)."""
        req = _clean(fields)
        req["generation"] = int(_gen(generation))
        req["command"] = list(command)
        return self._call("POST", "/v1/generations", req, timeout)

    def fence(self, generation: int, *, timeout: Any = _DEFAULT, **fields: Any) -> FenceResult:
        """POST /v1/fence: fence every generation older than generation and
        start nothing (fields: worktree, baseline, keep_paths,
        include_ignored, fetch, credentials, if_current)."""
        req = _clean(fields)
        req["generation"] = int(_gen(generation))
        return self._call("POST", "/v1/fence", req, timeout)

    def end(self, generation: int, *, if_current: Optional[int] = None, force: bool = False,
            timeout: Any = _DEFAULT) -> FenceResult:
        """POST /v1/generations/{n}/end: fence generation itself, start
        nothing; it can never start again. A generation above the highest
        announced raises NOT_ANNOUNCED (nothing fenced) unless force."""
        return self._call("POST", f"/v1/generations/{_gen(generation)}/end",
                          _clean({"if_current": if_current, "force": force or None}), timeout)

    def renew(self, generation: int, lease_ms: Optional[int] = None, *,
              timeout: Any = _DEFAULT) -> RenewResult:
        """POST /v1/generations/{n}/lease: renew generation's lease for
        lease_ms from now (None: the one in force, as announced or last
        renewed). A suspended generation resumes (resumed: True, state
        running). STALE_GENERATION: a newer generation was announced, this
        supervisor is superseded (stop); NOT_RUNNING: it is being fenced or
        gone; NOT_FOUND: never announced; BAD_REQUEST: no lease given and
        none announced, or lease_ms out of range (50 ms to a week)."""
        return self._call("POST", f"/v1/generations/{_gen(generation)}/lease",
                          _clean({"lease_ms": lease_ms}), timeout)

    def keep_lease(self, generation: int, lease_ms: int, stop: threading.Event) -> None:
        """Renews generation's lease (lease_ms each time) every third of
        lease_ms until stop is set (it then returns None) or a renewal is
        refused (it raises that ShimError: STALE_GENERATION, NOT_RUNNING,
        ...). A renewal that did not reach shim or was not answered
        (UNREACHABLE, OUTCOME_UNKNOWN; each is bounded by a third of the
        lease) is tried again at the next tick: the lease runs out only if
        that lasts a whole lease. It blocks: run it in a thread beside the
        one waiting for the generation (Go's client.KeepLease)."""
        _gen(generation)
        if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms <= 0:
            raise ShimError(Code.BAD_REQUEST, f"lease_ms {lease_ms!r} is not a positive integer")
        every = lease_ms / 3000.0
        next_at = time.monotonic() + every
        while not stop.wait(max(0.0, next_at - time.monotonic())):
            # After a renewal that took longer than a tick, the next one
            # comes at once, and only one (as with a Go ticker).
            next_at = max(next_at + every, time.monotonic())
            try:
                self.renew(generation, lease_ms, timeout=every)
            except ShimError as e:
                if stop.is_set():
                    return None
                if e.code in (Code.UNREACHABLE, Code.OUTCOME_UNKNOWN):
                    continue
                raise
        return None

    def register(self, worktree: str, *, timeout: Any = _DEFAULT, **fields: Any) -> Registration:
        """POST /v1/worktrees: register a worktree before any harness runs
        there (fields: keep_paths, include_ignored)."""
        req = _clean(fields)
        req["worktree"] = worktree
        return self._call("POST", "/v1/worktrees", req, timeout)

    def generations(self, labels: Optional[Mapping[str, str]] = None, *,
                    timeout: Any = _DEFAULT) -> List[Generation]:
        """GET /v1/generations?label=k=v...: the kept records whose labels
        hold every k=v of labels (None: all), oldest first."""
        path = "/v1/generations"
        if labels:
            path += "?" + urlencode([("label", f"{k}={v}") for k, v in labels.items()])
        return self._call("GET", path, timeout=timeout) or []

    def generation(self, n: int, *, timeout: Any = _DEFAULT) -> Generation:
        """GET /v1/generations/{n}: one generation's record."""
        return self._call("GET", f"/v1/generations/{_gen(n)}", timeout=timeout)

    def wait(self, n: int, *, timeout: Any = _DEFAULT) -> Exit:
        """GET /v1/generations/{n}/wait: blocks until generation n's harness
        has exited (and the rest of it is gone); its exit record. A timeout
        that runs out raises WAIT_TIMEOUT (the generation still runs; a
        wait changes nothing, waiting again is all there is to do)."""
        try:
            return self._call("GET", f"/v1/generations/{_gen(n)}/wait", timeout=timeout)
        except ShimError as e:
            if e.code != Code.OUTCOME_UNKNOWN:
                raise
            raise ShimError(Code.WAIT_TIMEOUT, f"generation {n} had not exited when the wait's timeout ran out; "
                            "it still runs") from e

    def signal(self, n: int, signal: str, *, all: bool = False,
               timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """POST /v1/generations/{n}/signal: signal ("TERM", "SIGKILL", "9")
        to generation n's harness, or with all=True to all of its
        processes."""
        return self._call("POST", f"/v1/generations/{_gen(n)}/signal",
                          _clean({"signal": signal, "all": all or None}), timeout)

    def events(self, *, since: Optional[int] = None, instance: Optional[str] = None,
               timeout: Optional[float] = None) -> EventStream:
        """GET /v1/events[?since=SEQ]: returns once shim is subscribed
        (every event after this call returns is in the stream). With since,
        the events shim kept after seq since (0: all it kept) come first.
        Every event has a seq; a reader that fell behind what shim keeps
        gets an event of type gap (from, to, lost) for the events it
        missed, never a silent loss. Pass the instance of the event whose
        seq is since: a since of another shim (it restarted, and numbers
        its events from 1 again) raises BAD_REQUEST (so does one ahead of
        the newest event): read again with since=0."""
        path = "/v1/events"
        if since is not None:
            path += "?" + urlencode(_clean({"since": _gen(since), "instance": instance}))
        elif instance is not None:
            raise ShimError(Code.BAD_REQUEST, "instance goes with since")
        conn, resp = self._stream(path, timeout)
        return EventStream(conn, resp)

    def events_since(self, since: int, instance: Optional[str] = None, *,
                     timeout: Optional[float] = None) -> EventStream:
        """events(since=since, instance=instance)."""
        return self.events(since=since, instance=instance, timeout=timeout)

    def logs(self, n: int, *, follow: bool = False, stdout_offset: int = 0, stderr_offset: int = 0,
             timeout: Optional[float] = None) -> LogStream:
        """GET /v1/generations/{n}/logs: generation n's kept output from the
        offsets, as frames (LogStream). Without follow it ends with an end
        frame at what is kept so far; with follow it waits for more and
        ends, once the generation is over, with an exit or fenced frame
        (its exit record in exit). A dropped frame says how many bytes of a
        stream were not kept (past shim's --log-max) and where it resumes.
        timeout bounds each wait for the next line (None: none)."""
        q = urlencode({"stdout_offset": int(stdout_offset), "stderr_offset": int(stderr_offset),
                       "follow": "1" if follow else "0"})
        conn, resp = self._stream(f"/v1/generations/{_gen(n)}/logs?{q}", timeout)
        return LogStream(conn, resp, int(stdout_offset), int(stderr_offset))

    def _stream(self, path: str, timeout: Optional[float], method: str = "GET", body: Any = None):
        conn = self._connect(timeout)
        try:
            if body is None:
                conn.request(method, path)
            else:
                conn.request(method, path, body=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
        except socket.timeout as e:
            conn.close()
            raise ShimError(Code.OUTCOME_UNKNOWN, f"{method} {path}: timed out after {timeout}s") from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise ShimError(Code.UNREACHABLE, f"{method} {path}: {e!r}") from e
        if resp.status != 200:
            try:
                raw = resp.read()
            finally:
                conn.close()
            _decode(resp.status, raw)
        return conn, resp

    # -- tool calls (docs/exec.md)

    @staticmethod
    def _exec_body(command: Sequence[str], env: Optional[Mapping[str, str]], cwd: Optional[str],
                   user: Optional[str], stdin: Optional[bytes], open_stdin: bool, tty: bool,
                   rows: Optional[int], cols: Optional[int], timeout_ms: Optional[int],
                   labels: Optional[Mapping[str, str]], detach: bool) -> Dict[str, Any]:
        return _clean({
            "command": list(command),
            "env": [f"{k}={v}" for k, v in env.items()] if env else None,
            "cwd": cwd, "user": user,
            "stdin": open_stdin or None,
            "stdin_data": base64.b64encode(stdin).decode() if stdin else None,
            "tty": tty or None, "rows": rows, "cols": cols,
            "timeout_ms": timeout_ms, "labels": dict(labels) if labels else None,
            "detach": detach or None,
        })

    def exec(self, generation: int, command: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[str] = None, user: Optional[str] = None, stdin: Optional[bytes] = None,
             open_stdin: bool = False, tty: bool = False, rows: Optional[int] = None,
             cols: Optional[int] = None, timeout_ms: Optional[int] = None,
             labels: Optional[Mapping[str, str]] = None,
             timeout: Optional[float] = None) -> ProcessStream:
        """POST /v1/generations/{n}/processes: runs command as a tool call
        inside generation n (its namespaces, layers, user and environment
        plus env; its own child cgroup) and streams its output: iterate the
        ProcessStream for frames, or wait() for the record. stdin is sent
        whole then closed; open_stdin keeps it open for write_stdin().
        timeout_ms kills the call's whole tree (the record says timed_out);
        timeout bounds each wait for the next line (None: none)."""
        body = self._exec_body(command, env, cwd, user, stdin, open_stdin, tty, rows, cols, timeout_ms,
                               labels, False)
        conn, resp = self._stream(f"/v1/generations/{_gen(generation)}/processes", timeout,
                                  method="POST", body=body)
        return ProcessStream(conn, resp)

    def exec_detached(self, generation: int, command: Sequence[str], *, timeout: Any = _DEFAULT,
                      **options: Any) -> Process:
        """exec() with detach: answers with the call's record at once; read
        its output later with attach()."""
        body = self._exec_body(command, options.get("env"), options.get("cwd"), options.get("user"),
                               options.get("stdin"), options.get("open_stdin", False),
                               options.get("tty", False), options.get("rows"), options.get("cols"),
                               options.get("timeout_ms"), options.get("labels"), True)
        return self._call("POST", f"/v1/generations/{_gen(generation)}/processes", body, timeout=timeout)

    def attach(self, generation: int, id: str, *, follow: bool = True, stdout_offset: int = 0,
               stderr_offset: int = 0, timeout: Optional[float] = None) -> ProcessStream:
        """GET .../processes/{id}/output: a call's kept output again from
        the offsets (a supervisor that restarted finds its calls again);
        with follow, until it ends."""
        q = urlencode({"stdout_offset": int(stdout_offset), "stderr_offset": int(stderr_offset),
                       "follow": "1" if follow else "0"})
        conn, resp = self._stream(f"/v1/generations/{_gen(generation)}/processes/{id}/output?{q}", timeout)
        return ProcessStream(conn, resp, int(stdout_offset), int(stderr_offset), id)

    def processes(self, generation: int, *, timeout: Any = _DEFAULT) -> List[Process]:
        """GET /v1/generations/{n}/processes: its tool calls' records."""
        return self._call("GET", f"/v1/generations/{_gen(generation)}/processes", timeout=timeout) or []

    def process(self, generation: int, id: str, *, timeout: Any = _DEFAULT) -> Process:
        """GET /v1/generations/{n}/processes/{id}: one call's record."""
        return self._call("GET", f"/v1/generations/{_gen(generation)}/processes/{id}", timeout=timeout)

    def signal_process(self, generation: int, id: str, signal: str, *, all: bool = False,
                       timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """Signals a call's leader, or with all every process of its cgroup."""
        return self._call("POST", f"/v1/generations/{_gen(generation)}/processes/{id}/signal",
                          _clean({"signal": signal, "all": all or None}), timeout=timeout)

    def write_stdin(self, generation: int, id: str, data: bytes = b"", *, close: bool = False,
                    timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """Writes data to a call's stdin (started with open_stdin) and/or
        closes it: {"written": N, "closed": bool}."""
        return self._call("POST", f"/v1/generations/{_gen(generation)}/processes/{id}/stdin",
                          _clean({"data": base64.b64encode(data).decode() if data else None,
                                  "close": close or None}), timeout=timeout)

    def resize(self, generation: int, id: str, rows: int, cols: int, *,
               timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """Sets a TTY call's window size."""
        return self._call("POST", f"/v1/generations/{_gen(generation)}/processes/{id}/resize",
                          {"rows": rows, "cols": cols}, timeout=timeout)

    def snapshots(self, worktree: str = "", *, timeout: Any = _DEFAULT) -> SnapshotList:
        """GET /v1/snapshots?worktree=: the abandoned-edit snapshots of a
        worktree ("" = the only registered one), newest first."""
        return self._call("GET", "/v1/snapshots?worktree=" + quote(worktree, safe=""), timeout=timeout)

    def snapshot(self, n: int, worktree: str = "", *, timeout: Any = _DEFAULT) -> Snapshot:
        """GET /v1/snapshots/{n}?worktree=: generation n's snapshot."""
        return self._call("GET", f"/v1/snapshots/{_gen(n)}?worktree=" + quote(worktree, safe=""),
                          timeout=timeout)


def _decode(status: int, raw: bytes) -> Any:
    if status >= 300:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict) or not body.get("code"):
            text = raw.decode("utf-8", "replace").strip()
            raise ShimError(Code.INTERNAL, f"HTTP {status}: {text}", status=status)
        raise ShimError(body["code"], body.get("message", ""), body.get("fenced"), status)
    if not raw.strip():
        return None
    return json.loads(raw)
