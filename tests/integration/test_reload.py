"""Operations (issue 9): SIGHUP reloads what can change safely and names what needs a restart;
readiness over systemd's NOTIFY_SOCKET; conf/blobrefd.service passes systemd-analyze verify."""
import hashlib
import os
import shutil
import signal
import socket
import subprocess

import pytest
import requests

from conftest import BIN_DIR, ROOT, Server
from util_http import TIMEOUT, put, sha, wait_until


def token_section(name, scopes="read, write"):
    digest = hashlib.sha256(f"secret-{name}".encode()).hexdigest()
    return f"[token {name}]\nsha256 = {digest}\nscopes = {scopes}\n"


def bearer(name):
    return {"Authorization": f"Bearer secret-{name}"}


def sighup_and_wait(srv, marker):
    n = srv.read_log().count(marker)
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: srv.read_log().count(marker) > n, timeout=10), srv.read_log()


def test_sighup_reloads_tokens_and_limits_and_names_the_rest(tmp_path):
    base = "[server]\nmax_blob_size = 1MiB\n[auth]\nanonymous = none\n"
    srv = Server(tmp_path / "data", config_text=base + token_section("old")).start()
    conf = srv.data_dir / "blobref.conf"
    try:
        assert put(srv, os.urandom(2000), headers=bearer("old")).status_code == 201
        conf.write_text("[server]\nmax_blob_size = 1KiB\nthreads = 3\ncache_size = 1MiB\n"
                        "[auth]\nanonymous = none\n" + token_section("new"))
        sighup_and_wait(srv, "reload: 1 token(s)")
        assert put(srv, os.urandom(10), headers=bearer("old")).status_code == 401
        assert put(srv, os.urandom(10), headers=bearer("new")).status_code == 201
        r = put(srv, os.urandom(2000), headers=bearer("new"))
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
        log = srv.read_log()
        assert "reload: max_blob_size applied" in log
        assert "reload: threads changed but needs a restart" in log
        assert "reload: cache_size changed but needs a restart" in log
        # a config that does not load changes nothing
        conf.write_text("[server]\nmax_blob_size = lots\n")
        sighup_and_wait(srv, "reload failed, nothing changed")
        assert "max_blob_size: 'lots' is not a size" in srv.read_log()
        assert put(srv, os.urandom(10), headers=bearer("new")).status_code == 201
        assert put(srv, os.urandom(10), headers=bearer("old")).status_code == 401
        assert srv.alive()
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_sighup_under_load_drops_nothing(tmp_path):
    """Requests running while reloads swap the token table all succeed."""
    srv = Server(tmp_path / "data", config_text="[auth]\nanonymous = read\n" +
                 token_section("t")).start()
    try:
        errors = []
        data = os.urandom(100)
        assert put(srv, data, headers=bearer("t")).status_code == 201
        import threading
        stop = threading.Event()

        def client():
            s = requests.Session()
            while not stop.is_set():
                try:
                    r = s.get(f"{srv.url}/v1/blobs/{sha(data)}", headers=bearer("t"),
                              timeout=TIMEOUT)
                    if r.status_code != 200:
                        errors.append(r.status_code)
                except requests.RequestException as e:
                    errors.append(repr(e))
        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for _ in range(20):
            sighup_and_wait(srv, "reload: 1 token(s)")
        stop.set()
        for t in threads:
            t.join()
        assert errors == []
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_ready_and_stopping_over_notify_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(20)
    os.environ["NOTIFY_SOCKET"] = path
    try:
        srv = Server(tmp_path / "data").start()
    finally:
        del os.environ["NOTIFY_SOCKET"]
    try:
        assert sock.recv(4096).split(b"\n")[0] == b"READY=1"
        srv.proc.send_signal(signal.SIGHUP)
        assert sock.recv(4096) == b"RELOADING=1"
        assert sock.recv(4096).split(b"\n")[0] == b"READY=1"
    finally:
        assert srv.stop() == 0, srv.read_log()
    assert sock.recv(4096) == b"STOPPING=1"
    sock.close()


def test_systemd_unit_verifies(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is absent (Debian package systemd)")
    unit = (ROOT / "conf" / "blobrefd.service").read_text()
    assert "Type=notify" in unit and "NoNewPrivileges=yes" in unit
    assert "ProtectSystem=strict" in unit and "ExecReload=/bin/kill -HUP $MAINPID" in unit
    # verify checks that ExecStart's binary exists: point it at the one under test
    unit = unit.replace("/usr/local/bin/blobrefd", str(BIN_DIR / "blobrefd"))
    (tmp_path / "blobrefd.service").write_text(unit)
    r = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "blobrefd.service")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "", (r.stdout, r.stderr)
    # nothing about our unit (systemd may say things about units of the host)
    assert "blobrefd.service" not in r.stderr, r.stderr
