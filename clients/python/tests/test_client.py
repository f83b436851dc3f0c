"""The Python client against the real shim binary (conftest.py starts it)."""

import os
import re
import tempfile
import time

import pytest

from shim_client import CODES, Client, Code, EventType, ShimError, code_of

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


def test_every_go_code_is_here():
    with open(os.path.join(REPO, "api", "api.go")) as f:
        go = dict(re.findall(r'\b(Code\w+)\s*=\s*"([A-Z_]+)"', f.read()))
    assert len(go) >= 20, go
    for name, value in go.items():
        assert value in CODES, f"{name} = {value!r} missing from shim_client.Code"
        assert getattr(Code, value) == value


def test_unreachable():
    with tempfile.TemporaryDirectory() as d:
        c = Client(d)
        raises(Code.UNREACHABLE, c.health)
        raises(Code.UNREACHABLE, c.start, 1, ["true"])
        raises(Code.UNREACHABLE, c.events)


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

        # The caller's timeout ends a call shim has not answered.
        e = raises(Code.OUTCOME_UNKNOWN, c.wait, g, timeout=0.2)
        assert e.status is None

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


def test_bad_requests(shim):
    c = shim.client
    g = shim.next_gen()
    raises(Code.BAD_REQUEST, c.start, g, [])
    raises(Code.BAD_REQUEST, c.start, g, ["/bin/true"], no_such_field=1)
    raises(Code.BAD_REQUEST, c.signal, 1, "NOSUCHSIGNAL")
    raises(Code.BAD_REQUEST, c.generation, -1)  # refused by the client, never sent
    e = raises(Code.NOT_FOUND, c.generation, 10**9)
    assert e.status == 404
    # Nothing above consumed a generation.
    assert shim.next_gen() == g
