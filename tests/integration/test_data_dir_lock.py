"""One writer per data directory: blobrefd and --rebuild-index take flock(LOCK_EX) on
DATA_DIR/lock; a second one refuses with one line and a non-zero exit; --fsck (read-only) still
runs beside the server."""
import os
import subprocess
import time

import requests

from conftest import BIN_DIR, Server, free_port
from util_http import fsck, get, put, sha

ENV = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=1")


def run_second_daemon(data_dir, timeout=20):
    """Starts another blobrefd on data_dir and a fresh port. Returns (exit code, output) once it
    exits; fails the test if it becomes ready instead (two servers on one data dir)."""
    port = free_port()
    p = subprocess.Popen([str(BIN_DIR / "blobrefd"), "--listen", f"127.0.0.1:{port}", "--data",
                          str(data_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=ENV)
    deadline = time.monotonic() + timeout
    try:
        while p.poll() is None:
            assert time.monotonic() < deadline, "second blobrefd neither exited nor got ready"
            try:
                ready = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code
            except requests.RequestException:
                ready = None
            assert ready != 200, "a second blobrefd serves the same data directory"
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, p.stdout.read().decode(errors="replace")


def rebuild(data_dir):
    p = subprocess.run([str(BIN_DIR / "blobrefd"), "--rebuild-index", "--data", str(data_dir)],
                       capture_output=True, timeout=120, env=ENV)
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


def assert_refusal(rc, out, srv):
    assert rc != 0, out
    lines = [l for l in out.splitlines() if l.strip()]
    assert len(lines) == 1, out
    assert "in use by another blobrefd" in lines[0], out
    assert f"pid {srv.proc.pid}" in lines[0], out


def test_second_server_on_same_data_dir_refuses(server):
    data = b"only one writer"
    assert put(server, data).status_code == 201
    rc, out = run_second_daemon(server.data_dir)
    assert_refusal(rc, out, server)
    # The first one is untouched and keeps serving.
    assert server.alive()
    r = get(server, sha(data))
    assert r.status_code == 200 and r.content == data


def test_rebuild_index_beside_server_refuses(server):
    data = b"rebuild must wait"
    assert put(server, data).status_code == 201
    rc, out = rebuild(server.data_dir)
    assert_refusal(rc, out, server)
    assert "rebuild-index:" not in out  # it did not walk the stores
    assert server.alive()
    assert get(server, sha(data)).content == data


def test_fsck_runs_beside_server(server):
    data = b"fsck reads beside the server"
    assert put(server, data).status_code == 201
    rc, n, problems, out = fsck(server.data_dir, verify=True)
    assert (rc, n, problems) == (0, 1, 0), out
    # fsck took no lock: the server still holds its own, and a second server is still refused.
    rc, out = run_second_daemon(server.data_dir)
    assert_refusal(rc, out, server)


def test_lock_released_when_server_stops(tmp_path):
    srv = Server(tmp_path / "data").start()
    data = b"after the stop"
    assert put(srv, data).status_code == 201
    pid = srv.proc.pid
    assert srv.stop() == 0, srv.read_log()
    assert (tmp_path / "data" / "lock").read_text().strip() == str(pid)
    # Offline rebuild and a new server may now have it.
    rc, out = rebuild(tmp_path / "data")
    assert rc == 0 and "rebuild-index: 0 blobs indexed, 1 already there, 0 problems" in out, out
    srv2 = Server(tmp_path / "data").start()
    try:
        assert get(srv2, sha(data)).content == data
    finally:
        assert srv2.stop() == 0, srv2.read_log()
