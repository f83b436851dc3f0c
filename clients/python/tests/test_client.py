"""The Python client against the real shim binary (conftest.py starts it)."""

import concurrent.futures
import io
import os
import re
import tempfile
import threading
import time

import pytest

from shim_client import CODES, Client, Code, EventType, FrameType, GenState, Network, ShimError, State, code_of

from conftest import REPO

SH = "/bin/sh"
ENV = ["PATH=/usr/bin:/bin"]


def raises(code: str, fn, *args, **kw) -> ShimError:
    with pytest.raises(ShimError) as ei:
        fn(*args, **kw)
    assert ei.value.code == code, str(ei.value)
    assert code_of(ei.value) == code
    return ei.value


def harness(shim, g: int, script: str, **kw):
    return shim.client.start(g, [SH, "-c", script], cwd=shim.worktree, env=ENV,
                             worktree=shim.worktree, **kw)


def wait_for_file(path: str, text: str, secs: float = 30) -> None:
    deadline = time.monotonic() + secs
    while True:
        with open(path) as f:
            if text in f.read():
                return
        assert time.monotonic() < deadline, f"{path} never held {text!r}"
        time.sleep(0.02)  # polling for the harness's edit


def wait_for_record(shim, g: int, ok, what: str, secs: float = 60):
    """Polls generation g's record until ok(record) holds; returns it."""
    deadline = time.monotonic() + secs
    while True:
        rec = shim.client.generation(g)
        if ok(rec):
            return rec
        assert time.monotonic() < deadline, f"generation {g} never {what}: {rec}"
        time.sleep(0.02)  # polling the record


def test_every_go_code_is_here():
    with open(os.path.join(REPO, "api", "api.go")) as f:
        go = dict(re.findall(r'\b(Code\w+)\s*=\s*"([A-Z_]+)"', f.read()))
    assert len(go) >= 20, go
    for name, value in go.items():
        assert value in CODES, f"{name} = {value!r} missing from shim_client.Code"
        assert getattr(Code, value) == value


def test_every_go_state_and_event_is_here():
    src = ""
    for name in ("types.go", "events.go"):
        with open(os.path.join(REPO, "api", name)) as f:
            src += f.read()
    go = re.findall(r'^\s*(State|Gen|Event|Network)(\w+)\s*=\s*"([a-z_]+)"', src, re.M)
    assert len(go) >= 20, go
    classes = {"State": State, "Gen": GenState, "Event": EventType, "Network": Network}
    for prefix, name, value in go:
        attr = re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()
        assert getattr(classes[prefix], attr, None) == value, f"{prefix}{name} = {value!r} missing"


def test_unreachable():
    with tempfile.TemporaryDirectory() as d:
        c = Client(d)
        raises(Code.UNREACHABLE, c.health)
        raises(Code.UNREACHABLE, c.start, 1, ["true"])
        raises(Code.UNREACHABLE, c.events)


def test_keep_lease_retries_unreachable():
    # Nothing listens: every renewal is UNREACHABLE, which keep_lease tries
    # again at the next tick instead of giving up; it returns once stopped.
    with tempfile.TemporaryDirectory() as d:
        c = Client(d)
        calls = []
        renew = c.renew

        def counting(*args, **kw):
            calls.append(args)
            return renew(*args, **kw)

        c.renew = counting
        stop = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(c.keep_lease, 1, 150, stop)
            deadline = time.monotonic() + 60
            while len(calls) < 3 and not fut.done():
                assert time.monotonic() < deadline, f"{len(calls)} renewals"
                time.sleep(0.02)  # polling the renewals counted
            stop.set()
            assert fut.result(timeout=60) is None
        assert calls[0] == (1, 150)
        raises(Code.BAD_REQUEST, c.keep_lease, 1, 0, stop)
        raises(Code.BAD_REQUEST, c.keep_lease, 1, None, stop)


def test_health_and_status(shim):
    assert shim.client.health() == {"ok": True}
    st = shim.client.status()
    assert st["mode"] == "cgroup2"
    assert st["runtime_dir"] == shim.runtime_dir
    assert [w["worktree"] for w in st.get("worktrees", [])] == [shim.worktree]


def test_announce_fence_snapshot_events(shim):
    c = shim.client
    g = shim.next_gen()
    label = {"task": f"py-{g}"}
    readme = os.path.join(shim.worktree, "README.md")
    with c.events(timeout=60) as events:
        first = harness(shim, g, "echo edited >> README.md; exec sleep 600", labels=label)
        assert first["generation"] == g and first["pid"] > 0
        assert not first.get("replayed")
        wait_for_file(readme, "edited")

        # An identical retry is answered with the first outcome, marked.
        again = harness(shim, g, "echo edited >> README.md; exec sleep 600", labels=label)
        assert again["replayed"] is True and again["pid"] == first["pid"]
        # The same generation with another spec is a conflict.
        raises(Code.GENERATION_CONFLICT, harness, shim, g, "exec sleep 601", labels=label)
        # Registering while a generation runs is refused.
        raises(Code.GENERATION_LIVE, c.register, shim.worktree)

        rec = c.generation(g)
        assert rec["state"] == "running" and rec["labels"] == label
        assert [r["generation"] for r in c.generations(label)] == [g]
        assert c.generations({"task": "no-such-task"}) == []
        assert g in [r["generation"] for r in c.generations()]

        # A wait's timeout is WAIT_TIMEOUT (as shim ctl wait --timeout):
        # it still runs, and a wait has no outcome to be unknown.
        e = raises(Code.WAIT_TIMEOUT, c.wait, g, timeout=0.2)
        assert e.status is None
        assert c.generation(g)["state"] == "running"

        # A precondition that does not hold fences nothing.
        raises(Code.NOT_CURRENT, harness, shim, g + 1, "exec sleep 600", if_current=g + 5)
        assert c.generation(g)["state"] == "running"

        res = harness(shim, g + 1, "exec sleep 600", if_current=g)
        assert res["generation"] == g + 1
        (rep,) = res["fenced"]
        assert rep["generation"] == g and rep["survivors"] == 0 and rep["killed"] >= 1
        assert rep["snapshot_ref"] == f"refs/shim/abandoned/{g}"
        with open(readme) as f:
            assert f.read() == "baseline\n"

        raises(Code.STALE_GENERATION, harness, shim, g, "exec sleep 600")

        seen = []
        for ev in events:
            seen.append((ev["type"], ev["generation"]))
            if ev["type"] == EventType.STARTED and ev["generation"] == g + 1:
                break
    assert (EventType.STARTED, g) in seen
    assert (EventType.FENCED, g) in seen

    snaps = c.snapshots(shim.worktree)
    assert g in [s["generation"] for s in snaps["snapshots"]]
    snap = c.snapshot(g, shim.worktree)
    assert snap["ref"] == f"refs/shim/abandoned/{g}"
    assert snap["modified"] == 1
    (listed,) = [s for s in snaps["snapshots"] if s["generation"] == g]
    assert (listed["modified"], listed["added"], listed["deleted"]) == (snap["modified"], snap["added"], snap["deleted"])
    raises(Code.NOT_FOUND, c.snapshot, g + 1, shim.worktree)

    c.signal(g + 1, "TERM")
    ex = c.wait(g + 1, timeout=60)
    assert ex["generation"] == g + 1 and ex["exit_code"] == 128 + 15 and not ex.get("fenced")
    raises(Code.NOT_RUNNING, c.signal, g + 1, "TERM")


def test_fence_and_end(shim):
    c = shim.client
    g = shim.next_gen()
    harness(shim, g, "exec sleep 600")
    raises(Code.NOT_CURRENT, c.fence, g + 1, if_current=g + 3)
    res = c.fence(g + 1, worktree=shim.worktree, if_current=g)
    assert res["generation"] == g + 1
    assert [r["generation"] for r in res["fenced"]] == [g]
    assert res["fenced"][0]["survivors"] == 0
    assert c.generation(g)["state"] == "fenced"

    h = g + 2
    harness(shim, h, "exec sleep 600")
    raises(Code.NOT_CURRENT, c.end, h, if_current=h - 1)
    res = c.end(h, if_current=h)
    assert [r["generation"] for r in res["fenced"]] == [h]
    assert c.generation(h)["state"] == "fenced"
    raises(Code.STALE_GENERATION, harness, shim, h - 1, "exec sleep 600")

    # A generation never announced is not ended unless the caller means it.
    k = h + 1
    harness(shim, k, "exec sleep 600")
    e = raises(Code.NOT_ANNOUNCED, c.end, k + 1000)
    assert e.status == 409
    assert c.status()["generation"] == k and c.generation(k)["state"] == "running"
    res = c.end(k + 1, force=True)
    assert [r["generation"] for r in res["fenced"]] == [k]
    assert c.status()["generation"] == k + 1


def test_bad_requests(shim):
    c = shim.client
    g = shim.next_gen()
    raises(Code.BAD_REQUEST, c.start, g, [""])  # an empty command (no command at all: an idle generation)
    raises(Code.BAD_REQUEST, c.start, g, ["/bin/true"], no_such_field=1)
    raises(Code.BAD_REQUEST, c.signal, 1, "NOSUCHSIGNAL")
    raises(Code.BAD_REQUEST, c.generation, -1)  # refused by the client, never sent
    raises(Code.BAD_REQUEST, c.start, 2**53, ["/bin/true"])  # above 2^53-1: by the client too
    # ... and by shim, whatever the client.
    raises(Code.BAD_REQUEST, c._call, "POST", "/v1/generations", {"generation": 2**53, "command": ["/bin/true"]})
    raises(Code.BAD_REQUEST, c._call, "POST", f"/v1/generations/{2**64 - 1}/end", {"force": True})
    e = raises(Code.METHOD_NOT_ALLOWED, c._call, "GET", "/v1/fence")
    assert e.status == 405
    e = raises(Code.NOT_FOUND, c.generation, 10**9)
    assert e.status == 404
    # Nothing above consumed a generation.
    assert shim.next_gen() == g


def test_lease_suspend_resume_stale(shim):
    c = shim.client
    g = shim.next_gen()
    with c.events(timeout=60) as events:
        res = harness(shim, g, "exec sleep 1000", lease_ms=50)
        assert res["generation"] == g
        # Nobody renews: the lease runs out, the generation is suspended
        # (frozen and cut), not killed.
        rec = wait_for_record(shim, g, lambda r: r["state"] == State.SUSPENDED
                              and r.get("lease", {}).get("suspended"), "suspended")
        lease = rec["lease"]
        assert lease["duration_ms"] == 50 and lease["suspensions"] >= 1 and not lease.get("killed")
        assert lease["suspended_at"] and lease["expires_at"]
        assert c.status()["state"] == State.SUSPENDED

        # A renewal resumes it.
        r = c.renew(g)
        assert r["generation"] == g and r["resumed"] is True and r["state"] == State.RUNNING
        assert r["lease"]["duration_ms"] == 50 and not r["lease"].get("suspended")
        assert r["lease"]["renewals"] >= 1
        # A longer lease from now (it may have run out again meanwhile).
        r = c.renew(g, 600000)
        assert r["state"] == State.RUNNING and r["lease"]["duration_ms"] == 600000
        assert c.generation(g)["state"] == State.RUNNING
        # An identical retry of the start renews the lease.
        again = harness(shim, g, "exec sleep 1000", lease_ms=600000)
        assert again["replayed"] is True and again["pid"] == res["pid"]
        assert c.generation(g)["lease"]["renewals"] >= r["lease"]["renewals"] + 1

        seen = []
        for ev in events:
            seen.append((ev["type"], ev["generation"]))
            if ev["type"] == EventType.RESUMED and ev["generation"] == g:
                break
        assert (EventType.LEASE_EXPIRED, g) in seen, seen

    # A newer generation fences it; its supervisor is superseded.
    harness(shim, g + 1, "exec sleep 1000")
    assert c.generation(g)["state"] == GenState.FENCED
    raises(Code.STALE_GENERATION, c.renew, g)
    raises(Code.STALE_GENERATION, c.keep_lease, g, 150, threading.Event())
    # g + 1 was announced without a lease: a renewal must give one.
    raises(Code.BAD_REQUEST, c.renew, g + 1)
    raises(Code.BAD_REQUEST, c.renew, g + 1, 10)
    raises(Code.BAD_REQUEST, c.renew, g + 1, 8 * 24 * 3600 * 1000)
    raises(Code.NOT_FOUND, c.renew, g + 1000)
    raises(Code.BAD_REQUEST, harness, shim, g + 2, "exec sleep 1000", lease_ms=10)
    c.end(g + 1)
    raises(Code.NOT_RUNNING, c.renew, g + 1, 1000)


def test_keep_lease(shim):
    c = shim.client
    g = shim.next_gen()
    harness(shim, g, "exec sleep 1000", lease_ms=600)
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(c.keep_lease, g, 600, stop)
        wait_for_record(shim, g, lambda r: r["lease"].get("renewals", 0) >= 3, "renewed 3 times")
        stop.set()
        assert fut.result(timeout=60) is None

        # Superseded: keep_lease raises STALE_GENERATION (NOT_RUNNING when
        # its renewal was already past the staleness check as the fence
        # began).
        fut = ex.submit(c.keep_lease, g, 600, threading.Event())
        harness(shim, g + 1, "exec sleep 1000")
        e = fut.exception(timeout=60)
        assert isinstance(e, ShimError), repr(e)
        assert e.code in (Code.STALE_GENERATION, Code.NOT_RUNNING), repr(e)
    c.end(g + 1)


def test_logs_follow_offsets_and_events_since(shim):
    c = shim.client
    g = shim.next_gen()
    harness(shim, g, "echo one; echo err >&2; echo two; exit 3")
    with c.logs(g, follow=True, timeout=60) as stream:
        out, err = stream.read_all()
    assert (out, err) == (b"one\ntwo\n", b"err\n")
    assert stream.last["type"] == FrameType.EXIT and stream.last["exit"]["exit_code"] == 3
    assert (stream.stdout_offset, stream.stderr_offset) == (8, 4)

    # Again from an offset: only what follows it, and an end frame.
    again = c.logs(g, stdout_offset=4, stderr_offset=4, timeout=60)
    frames = list(again)
    assert [f["type"] for f in frames] == [FrameType.STDOUT, FrameType.END]
    assert frames[0]["offset"] == 4 and frames[0]["data"] == b"two\n"
    raises(Code.NOT_FOUND, c.logs, g + 100)

    # Every event has a seq; since replays what is kept after it.
    seen = []
    with c.events(since=0, timeout=60) as events:
        for ev in events:
            assert ev["type"] != EventType.GAP, ev  # the session's shim keeps 4096
            seen.append(ev)
            if ev["type"] == EventType.EXITED and ev["generation"] == g:
                break
    seqs = [ev["seq"] for ev in seen]
    assert seqs == list(range(1, len(seqs) + 1))
    last = seen[-1]["seq"]
    with c.events_since(last - 1, seen[-2]["instance"], timeout=60) as events:
        assert next(events) == seen[-1]
    raises(Code.BAD_REQUEST, c.events, since=last + 10**6)
    raises(Code.BAD_REQUEST, c.events, since=last, instance="another-shim")


def test_exec_stream_stdin_detach_attach_and_fence(shim):
    c = shim.client
    g = shim.next_gen()
    idle = c.start(g, [], idle=True, cwd=shim.worktree, env=ENV, worktree=shim.worktree)
    assert idle["generation"] == g

    # Streamed: frames while it runs, the record at its exit frame.
    s = c.exec(g, [SH, "-c", "echo out; echo err >&2; echo tool >> README.md; exit 7"], timeout=60)
    out, err = io.BytesIO(), io.BytesIO()
    rec = s.wait(out, err)
    assert (out.getvalue(), err.getvalue()) == (b"out\n", b"err\n")
    assert rec["state"] == "exited" and rec["exit_code"] == 7 and s.id == rec["id"] and s.pid > 0
    assert (s.stdout_offset, s.stderr_offset) == (4, 4)

    # stdin sent whole, and stdin kept open for writes.
    assert c.exec(g, ["cat"], stdin=b"hello", timeout=60).wait(out := io.BytesIO()) and out.getvalue() == b"hello"
    call = c.exec_detached(g, ["cat"], open_stdin=True)
    assert call["state"] == "running"
    assert c.write_stdin(g, call["id"], b"abc")["written"] == 3
    c.write_stdin(g, call["id"], close=True)
    again = c.attach(g, call["id"], timeout=60)
    rec = again.wait(out := io.BytesIO())
    assert out.getvalue() == b"abc" and rec["exit_code"] == 0
    # Re-attach from an offset: only what follows it.
    assert c.attach(g, call["id"], stdout_offset=1, timeout=60).wait(out := io.BytesIO()) and out.getvalue() == b"bc"

    ids = [p["id"] for p in c.processes(g)]
    assert call["id"] in ids and c.process(g, call["id"])["exit_code"] == 0
    raises(Code.NOT_FOUND, c.process, g, "999999")

    # A timeout kills the call's tree; a signal its leader.
    rec = c.exec(g, ["sleep", "600"], timeout_ms=200, timeout=60).wait()
    assert rec["timed_out"] is True
    hung = c.exec_detached(g, ["sleep", "600"])
    c.signal_process(g, hung["id"], "TERM")
    assert c.attach(g, hung["id"], timeout=60).wait()["exit_code"] == 128 + 15

    # The next generation fences a running call with it: its stream ends
    # with a fenced frame, the call's edit is in the snapshot.
    running = c.exec(g, [SH, "-c", "echo started; exec sleep 600"], timeout=60)
    assert next(running)["type"] == FrameType.STARTED
    assert next(running)["data"] == b"started\n"
    nxt = harness(shim, shim.next_gen(), "exec sleep 600")
    fenced = nxt["fenced"][0]
    assert fenced["generation"] == g and fenced["survivors"] == 0
    assert running.id in [t["id"] for t in fenced.get("tool_calls", [])]
    rec = running.wait()
    assert running.last["type"] == FrameType.FENCED and rec["fenced"] is True
    raises(Code.STALE_GENERATION, c.exec, g, ["true"])
