"""tools/python as a package: `pip install` offline with Debian's pip and setuptools (into a
--target folder and into a venv with --system-site-packages), then import and the fsspec
entry point from a fresh interpreter in a temp dir, against the real blobrefd."""
import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

DEBIAN_PYTHON = "/usr/bin/python3"
SRC = ROOT / "tools" / "python"


def need_debian_pip():
    probe = ("import importlib.util as u, sys; "   # not imported: pip then setuptools clash
             "sys.exit(not all(u.find_spec(m) for m in ('pip', 'setuptools', 'wheel')))")
    r = subprocess.run([DEBIAN_PYTHON, "-c", probe], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{DEBIAN_PYTHON} lacks pip/setuptools/wheel: {r.stderr.strip()[-200:]}")


def copy_source(tmp_path):
    """A copy of tools/python: a build writes build/ and *.egg-info beside its sources, and
    tests running in parallel must not share them (nor dirty the work tree)."""
    dst = tmp_path / "src"
    shutil.copytree(SRC, dst, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                            "*.egg-info", "examples"))
    return dst


def offline_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1",
               HOME=str(tmp_path), http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    return env


def pip_install(python, args, tmp_path):
    r = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        *args], capture_output=True, text=True, env=offline_env(tmp_path),
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


PROBE = r"""
import hashlib, os, sys
import blobref, fsspec
assert not blobref.__file__.startswith(sys.argv[1]), blobref.__file__   # not the work tree
data = os.urandom(70000)
h = blobref.Client().put(data)
# no `import blobref_fsspec`: the protocol comes from the installed entry point
with fsspec.open("blobref://" + h, block_size=4096) as f:
    f.seek(60000)
    part = f.read(100)
assert part == data[60000:60100]
print("OK", blobref.__version__, h, blobref.__file__)
"""


def run_probe(python, tmp_path, server, extra_env=None):
    env = offline_env(tmp_path)
    env["BLOBREF_SERVER"] = server.url
    env.update(extra_env or {})
    r = subprocess.run([python, "-c", PROBE, str(SRC)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("OK "), r.stdout
    return r.stdout.split()


def test_pip_install_target_offline(server, tmp_path):
    need_debian_pip()
    target = tmp_path / "site"
    pip_install(DEBIAN_PYTHON, ["--target", str(target), str(copy_source(tmp_path))], tmp_path)
    assert (target / "blobref.py").is_file() and (target / "blobref_fsspec.py").is_file()
    eps = list(target.glob("blobref-*.dist-info/entry_points.txt"))
    assert eps and "blobref = blobref_fsspec:BlobrefFileSystem" in eps[0].read_text()
    _, version, h, path = run_probe(DEBIAN_PYTHON, tmp_path, server,
                                    {"PYTHONPATH": str(target)})
    assert path.startswith(str(target))
    assert len(h) == 64


def test_pip_install_venv_offline(server, tmp_path):
    need_debian_pip()
    r = subprocess.run([DEBIAN_PYTHON, "-m", "venv", "--system-site-packages",
                        str(tmp_path / "venv")], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"python3 -m venv is unavailable (python3-venv): {r.stderr[-200:]}")
    py = str(tmp_path / "venv" / "bin" / "python")
    pip_install(py, [str(copy_source(tmp_path))], tmp_path)
    _, version, h, path = run_probe(py, tmp_path, server)
    assert path.startswith(str(tmp_path / "venv"))
    r = subprocess.run([py, "-m", "pip", "show", "blobref"], capture_output=True, text=True,
                       env=offline_env(tmp_path))
    assert f"Version: {version}" in r.stdout, r.stdout
    # the system's site-packages were not touched
    r = subprocess.run([DEBIAN_PYTHON, "-c", "import blobref"], capture_output=True,
                       text=True, cwd="/", env=offline_env(tmp_path))
    assert r.returncode != 0
