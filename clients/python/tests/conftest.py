"""Starts the real shim binary for the client tests: shim init as PID 1 of
fresh pid and mount namespaces (unshare), its own runtime dir, cgroup
subtree and layers dir, and a tiny git worktree registered at setup.

$SHIM_BIN names the binary; without it scripts/build builds one. The tests
skip when they cannot run (not root, no cgroup2, no unshare or git), and
fail instead when SHIM_REQUIRE_INTEGRATION=1."""

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from shim_client import Client, ShimError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def need(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("SHIM_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"cannot run ({why}) but SHIM_REQUIRE_INTEGRATION=1", pytrace=False)
    pytest.skip(why)


def cgroup2_mount() -> str:
    """The cgroup2 mount: /sys/fs/cgroup on a pure host, /sys/fs/cgroup/unified
    on a hybrid one ("" when there is none)."""
    mounts = {}
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                mounts[parts[1]] = parts[2]
    for m in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if mounts.get(m) == "cgroup2":
            return m
    return ""


def remove_cgroup_tree(root: str) -> None:
    """Kills and removes root and every cgroup below it, deepest first (only
    called on the root this fixture named)."""
    dirs = []
    for d, _, _ in os.walk(root):
        dirs.append(d)
    for d in reversed(dirs):
        try:
            with open(os.path.join(d, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:
            pass
        deadline = time.monotonic() + 5
        while True:
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)  # the kernel empties the cgroup


def git(cwd: str, *args: str) -> str:
    env = {"PATH": PATH, "HOME": cwd, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


class Shim:
    def __init__(self, runtime_dir: str, worktree: str, proc: subprocess.Popen, log: str):
        self.runtime_dir = runtime_dir
        self.worktree = worktree
        self.proc = proc
        self.log = log
        self.client = Client(runtime_dir)

    def next_gen(self) -> int:
        return self.client.status()["generation"] + 1

    def stop(self) -> None:
        """SIGTERM to shim (the child of the unshare this fixture started;
        unshare does not forward it), then waits; SIGKILL to unshare
        (--kill-child takes shim with it) if shim does not exit."""
        if self.proc.poll() is not None:
            return
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            kids = []
        for pid in kids:
            os.kill(pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def shim_binary(tmp: str) -> str:
    b = os.environ.get("SHIM_BIN")
    if b:
        return b
    out = os.path.join(tmp, "shim")
    subprocess.run([os.path.join(REPO, "scripts", "build"), out], check=True)
    return out


@pytest.fixture(scope="session")
def shim():
    need(os.geteuid() == 0, "needs root")
    mnt = cgroup2_mount()
    need(mnt != "", "no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified")
    for tool in ("unshare", "git"):
        need(shutil.which(tool) is not None, f"needs {tool}")
    tmp = tempfile.mkdtemp(prefix="shim-client-py-")
    cgroot = os.path.join(mnt, "shim-client-py-" + secrets.token_hex(4))
    s = None
    try:
        binary = shim_binary(tmp)
        runtime_dir = os.path.join(tmp, "run")
        worktree = os.path.join(tmp, "wt")
        os.mkdir(runtime_dir)
        os.mkdir(worktree)
        git(worktree, "init", "-q", "-b", "main")
        with open(os.path.join(worktree, "README.md"), "w") as f:
            f.write("baseline\n")
        git(worktree, "add", "README.md")
        git(worktree, "commit", "-q", "-m", "baseline")
        log = os.path.join(tmp, "shim.log")
        with open(log, "wb") as logf:
            proc = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private",
                 binary, "init", "--runtime-dir", runtime_dir, "--cgroup-root", cgroot,
                 "--layers", os.path.join(tmp, "layers"), "--mount-proc", "--isolation", "scan",
                 "--log-level", "warn", "--grace", "2s"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env={"PATH": PATH})
        s = Shim(runtime_dir, worktree, proc, log)
        probe = Client(runtime_dir, timeout=1)
        deadline = time.monotonic() + 15
        while True:
            try:
                probe.health()
                break
            except ShimError as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    with open(log) as f:
                        pytest.fail(f"shim not ready ({e}); exit {proc.poll()}; log:\n{f.read()}")
                time.sleep(0.02)  # polling for a socket that is not there yet
        s.client.register(worktree)
        yield s
    finally:
        if s is not None:
            s.stop()
        remove_cgroup_tree(cgroot)
        shutil.rmtree(tmp, ignore_errors=True)
