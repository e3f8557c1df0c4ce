"""blobrefd raises its soft RLIMIT_NOFILE toward max_connections * 2 + stores + 256 (up to the
hard limit) and warns when the hard limit is too low."""
import pathlib
import re

import pytest

import conftest
from conftest import Server
from util_http import get, put, sha

REAL_BIN = conftest.BIN_DIR


def limited_bin_dir(tmp_path, monkeypatch, soft, hard):
    """A bin dir whose blobrefd starts the real one under ulimit -Sn soft / -Hn hard."""
    d = tmp_path / "bin"
    d.mkdir()
    wrapper = d / "blobrefd"
    wrapper.write_text(f"#!/bin/bash\nulimit -Sn {soft} && ulimit -Hn {hard} || exit 99\n"
                       f"exec {REAL_BIN / 'blobrefd'} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(conftest, "BIN_DIR", d)


def open_files_limit(pid):
    text = pathlib.Path(f"/proc/{pid}/limits").read_text()
    m = re.search(r"^Max open files\s+(\d+)\s+(\d+)", text, re.M)
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("max_connections,stores", [(1024, 1), (100, 2)])
def test_soft_limit_raised(tmp_path, monkeypatch, max_connections, stores):
    limited_bin_dir(tmp_path, monkeypatch, 64, 8192)
    conf = f"[server]\nmax_connections = {max_connections}\n"
    for i in range(stores):
        conf += f"[store s{i}]\nkind = fs\nroot = {tmp_path}/blobs{i}\n"
    srv = Server(tmp_path / "data", config_text=conf).start()
    try:
        want = max_connections * 2 + stores + 256
        assert open_files_limit(srv.proc.pid) == (want, 8192)
        assert "open files limit raised from 64 to %d" % want in srv.read_log()
        assert "EMFILE" not in srv.read_log()
        data = b"with enough descriptors"
        assert put(srv, data).status_code == 201
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_warns_when_hard_limit_too_low(tmp_path, monkeypatch):
    limited_bin_dir(tmp_path, monkeypatch, 64, 512)
    srv = Server(tmp_path / "data").start()
    try:
        assert open_files_limit(srv.proc.pid) == (512, 512)  # as far as it could go
        log = srv.read_log()
        lines = [l for l in log.splitlines() if "open files limit is 512" in l]
        assert len(lines) == 1, log
        assert "below the 2305 that max_connections = 1024 needs" in lines[0], log
        data = b"still serves"
        assert put(srv, data).status_code == 201
        assert get(srv, sha(data)).content == data
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_never_lowers_a_higher_limit(tmp_path, monkeypatch):
    limited_bin_dir(tmp_path, monkeypatch, 5000, 8192)
    srv = Server(tmp_path / "data").start()
    try:
        assert open_files_limit(srv.proc.pid) == (5000, 8192)
        assert "open files limit" not in srv.read_log()
    finally:
        assert srv.stop() == 0, srv.read_log()
