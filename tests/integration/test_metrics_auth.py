"""[auth] private_metrics (issue 18): with it, /metrics and the reason of a failing /readyz need a
token with the metrics (or admin) scope; /healthz and /readyz's status stay public for load
balancers. Without it nothing changes: /metrics is public even with anonymous = none."""
import hashlib
import signal

import requests

from conftest import Server, free_port
from s3util import LazyServer
from util_http import TIMEOUT, assert_error, wait_until

TOKENS = {"reader": "read", "writer": "write", "watcher": "metrics", "boss": "read, write, admin"}


def tokens_conf():
    return "".join(f"[token {n}]\nsha256 = {hashlib.sha256(f'tok-{n}'.encode()).hexdigest()}\n"
                   f"scopes = {s}\n" for n, s in TOKENS.items())


def as_(name):
    return {"Authorization": f"Bearer tok-{name}"} if name else {}


def start(tmp_path, private, extra=""):
    text = f"[auth]\nanonymous = none\n{'private_metrics = true' if private else ''}\n"
    return Server(tmp_path / "data", config_text=text + tokens_conf() + extra).start()


def stop(srv):
    alive = srv.alive()
    assert srv.stop() == 0 and alive, srv.read_log()


def test_metrics_stay_public_without_private_metrics(tmp_path):
    srv = start(tmp_path, private=False)
    try:
        r = requests.get(f"{srv.url}/metrics", timeout=TIMEOUT)
        assert r.status_code == 200 and "blobref_" in r.text
        # while the API itself needs a token (anonymous = none)
        assert requests.get(f"{srv.url}/v1/blobs", timeout=TIMEOUT).status_code == 401
    finally:
        stop(srv)


def test_private_metrics_need_the_metrics_or_admin_scope(tmp_path):
    srv = start(tmp_path, private=True)
    try:
        url = f"{srv.url}/metrics"
        assert_error(requests.get(url, timeout=TIMEOUT), 401, "unauthorized")
        assert_error(requests.get(url, headers=as_("nobody"), timeout=TIMEOUT), 401, "unauthorized")
        for name in ("reader", "writer"):  # a write-only token learns no counters either
            assert_error(requests.get(url, headers=as_(name), timeout=TIMEOUT), 403, "forbidden")
        for name in ("watcher", "boss"):
            r = requests.get(url, headers=as_(name), timeout=TIMEOUT)
            assert r.status_code == 200 and "blobref_" in r.text, (name, r.text[:200])
        # probes stay public
        assert requests.get(f"{srv.url}/healthz", timeout=TIMEOUT).status_code == 200
        r = requests.get(f"{srv.url}/readyz", timeout=TIMEOUT)
        assert r.status_code == 200 and r.json() == {"status": "ready"}
        # the metrics scope grants nothing else
        assert_error(requests.get(f"{srv.url}/v1/blobs", headers=as_("watcher"), timeout=TIMEOUT),
                     403, "forbidden")
    finally:
        stop(srv)


def test_private_metrics_hide_why_readyz_fails(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    text = (f"[server]\nupload_store = up\n[auth]\nanonymous = none\nprivate_metrics = true\n"
            f"{tokens_conf()}[store up]\nkind = fs\nroot = {tmp_path / 'up'}\n"
            f"[store origin]\nkind = http\nurl = {dead}\n")
    srv = LazyServer(tmp_path / "data", config_text=text).start_unready()
    try:
        def readyz(who):
            return requests.get(f"{srv.url}/readyz", headers=as_(who), timeout=TIMEOUT)
        wait_until(lambda: readyz("watcher").status_code == 503 and
                   "origin" in readyz("watcher").json()["error"]["message"], timeout=20)
        for who in (None, "reader", "writer"):
            r = readyz(who)
            assert_error(r, 503, "not_ready")
            assert "origin" not in r.text and "127.0.0.1" not in r.text, (who, r.text)
        assert "origin" in readyz("boss").json()["error"]["message"]
    finally:
        stop(srv)


def test_private_metrics_follow_sighup(tmp_path):
    srv = start(tmp_path, private=False)
    try:
        url = f"{srv.url}/metrics"
        assert requests.get(url, timeout=TIMEOUT).status_code == 200
        conf = srv.data_dir / "blobref.conf"
        conf.write_text(conf.read_text().replace("[auth]\n", "[auth]\nprivate_metrics = true\n"))
        srv.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: requests.get(url, timeout=TIMEOUT).status_code == 401, timeout=10)
        assert requests.get(url, headers=as_("watcher"), timeout=TIMEOUT).status_code == 200
    finally:
        stop(srv)
