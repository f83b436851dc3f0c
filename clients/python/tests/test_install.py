"""The package installs offline, with what Debian's python3-pip brings
(pyproject.toml's [build-system]: setuptools, no index)."""

import os
import shutil
import subprocess
import sys

from conftest import REPO, need


def test_installs_offline_without_an_index(tmp_path):
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    need(pip.returncode == 0, f"{sys.executable} has no pip (apt-get install python3-pip, or scripts/deps)")
    # From a copy: setuptools builds in the source tree.
    src = tmp_path / "src"
    shutil.copytree(os.path.join(REPO, "clients", "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
    target = tmp_path / "target"
    env = dict(os.environ, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index",
                        "--target", str(target), str(src)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", "import shim_client; print(shim_client.__file__, shim_client.Code.WAIT_TIMEOUT)"],
                       capture_output=True, text=True, cwd=tmp_path, env=dict(env, PYTHONPATH=str(target)))
    assert r.returncode == 0 and r.stdout.startswith(str(target)), r.stdout + r.stderr
