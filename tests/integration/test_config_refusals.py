"""Config that cannot mean what it says (issue 18) stops blobrefd with FILE:LINE, at start-up and
on SIGHUP (where nothing changes): `[auth] anonymous` other than read or none, a bad
trusted_proxies entry, a key set twice, a bad tls_priorities, absurd durations; short durations
meant for tests load with a warning naming the line."""
import hashlib
import os
import signal

import pytest
import requests

from conftest import Server
from util_http import put, wait_until

REFUSED = [
    ("[server]\ncache_size = 0\n[auth]\nanonymous = admin\n",
     r"blobref\.conf:4: \[auth\] anonymous: 'admin' must be read or none"),
    ("[auth]\nanonymous = read, write\n", r"blobref\.conf:2: \[auth\] anonymous: 'read, write'"),
    ("[server]\ntrusted_proxies = 10.0.0.1, 10.0.0.0/40\n",
     r"blobref\.conf:2: \[server\] trusted_proxies: '10\.0\.0\.0/40' is not an IP address or CIDR"),
    ("[server]\nmax_blob_size = 1MiB\ncache_size = 0\nmax_blob_size = 2MiB\n",
     r"blobref\.conf:4: \[server\] max_blob_size is set twice \(first on line 2\)"),
    ("[server]\ntls_priorities = NORMAL:+VERS-TLS9.9\n",
     r"blobref\.conf:2: \[server\] tls_priorities: 'NORMAL:\+VERS-TLS9\.9' is not a GnuTLS"),
    ("[reconcile]\ninterval = 100ms\n",
     r"blobref\.conf:2: \[reconcile\] interval: 100ms is out of range \(0 = off, or at least 1s\)"),
    ("[reconcile]\ngrace = 0\n", r"blobref\.conf:2: \[reconcile\] grace: 0 is out of range"),
]


@pytest.mark.parametrize("text,message", REFUSED)
def test_refused_at_startup(tmp_path, text, message):
    srv = Server(tmp_path / "data", config_text=text)
    with pytest.raises(RuntimeError, match=message):
        srv.start(timeout=10)


def test_refused_on_reload_changes_nothing_and_warnings_name_the_line(tmp_path):
    digest = hashlib.sha256(b"secret-w").hexdigest()
    base = (f"[reconcile]\ninterval = 0\ngrace = 5m\n[auth]\nanonymous = read\n"
            f"[token w]\nsha256 = {digest}\nscopes = read, write, admin\n")
    srv = Server(tmp_path / "data", config_text=base).start()
    conf = srv.data_dir / "blobref.conf"
    try:
        assert "blobref.conf:3: [reconcile] grace = 5m is under 1h" in srv.read_log()
        assert put(srv, os.urandom(100)).status_code == 401  # anonymous may only read
        conf.write_text(base.replace("anonymous = read", "anonymous = admin"))
        n = srv.read_log().count("reload failed, nothing changed")
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: srv.read_log().count("reload failed, nothing changed") > n,
                          timeout=10), srv.read_log()
        assert "blobref.conf:5: [auth] anonymous: 'admin' must be read or none" in srv.read_log()
        assert put(srv, os.urandom(100)).status_code == 401
        r = requests.post(f"{srv.url}/v1/import", json={"blobs": []})
        assert r.status_code == 401, r.text
    finally:
        assert srv.stop() == 0, srv.read_log()
