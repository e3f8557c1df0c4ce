"""Readiness of a cluster node (issue 20): a node on a reachable PostgreSQL index answers /readyz
200 within 30 s of its start although one `[table]` catalog fails (HTTP 500) and another hangs
(accepts, never answers), and it stays ready and serving while a reconcile run is stuck on it."""
import hashlib
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

from cluster_util import wait_for
from conftest import Server
from util_http import assert_error

TIMEOUT = 30


class HangingCatalog:
    """A TCP server that accepts every connection and never answers (a catalog behind a stuck
    load balancer) until release(); from then on it closes connections at once."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held, self.accepted, self.released = [], 0, False
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                if self.released:
                    conn.close()
                else:
                    self.held.append(conn)

    def release(self):
        with self.lock:
            self.released = True
            for c in self.held:
                c.close()
            self.held = []

    def close(self):
        self.release()
        self.sock.close()


class FailingCatalog:
    """An HTTP server answering 500 to everything; counts the requests."""

    def __init__(self):
        self.requests = 0
        catalog = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                catalog.requests += 1
                body = b'{"error": {"message": "catalog down", "code": 500}}'
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_ready_within_30s_while_a_catalog_fails_and_another_hangs(tmp_path, postgres):
    """The periodic reconcile (interval 1 s: it starts right after the node does) asks the failing
    catalog, then hangs on the other one; meanwhile the node became ready within 30 s of its
    start, and /readyz, uploads and reads go on while that run is stuck (POST /v1/reconcile is
    409: it is in progress). Once the catalog lets go, the run fails and nothing was changed."""
    hang, broken = HangingCatalog(), FailingCatalog()
    conf = (f"[store local]\nkind = fs\nroot = {tmp_path / 'blobs'}\n"
            f"[index]\nkind = postgres\ndsn = {postgres.database()}\n"
            "[reconcile]\ninterval = 1s\ngrace = 1s\nretention = 1s\nmax_fraction = 1\n"
            f"[table broken]\nlocation = rest:{broken.url}#ns.broken\ncolumn = h\n"
            f"[table stuck]\nlocation = rest:{hang.url}#ns.stuck\ncolumn = h\n")
    srv = Server(tmp_path / "node", conf)
    try:
        t0 = time.monotonic()
        srv.start(timeout=30)  # raises unless /readyz answered 200 within 30 s
        ready_s = time.monotonic() - t0
        wait_for(lambda: broken.requests >= 1 and hang.accepted >= 1, 20,
                 "the periodic run to ask both catalogs")
        stuck = requests.post(f"{srv.url}/v1/reconcile", timeout=TIMEOUT)
        rid = assert_error(stuck, 409, "reconcile_running")["id"]
        assert hang.held, "the run is not waiting on the hanging catalog: nothing was proved"
        assert requests.get(f"{srv.url}/readyz", timeout=5).status_code == 200
        data = hashlib.sha256(b"ready").digest() + os.urandom(2000)
        h = hashlib.sha256(data).hexdigest()
        assert requests.put(f"{srv.url}/v1/blobs/{h}", data=data, timeout=5).status_code == 201
        got = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=5)
        assert got.status_code == 200 and got.content == data
        assert requests.get(f"{srv.url}/readyz", timeout=5).status_code == 200
        print(f"\nready {ready_s:.2f} s after start; a run stuck on the hanging catalog, the node "
              "serving")
        hang.release()
        wait_for(lambda: requests.get(f"{srv.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT)
                 .json().get("state") == "failed", 30, "the stuck run to fail")
        got = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=5)
        assert got.status_code == 200 and got.content == data  # a failed run changes nothing
    finally:
        hang.release()
        alive = srv.alive()
        rc = srv.stop()
        hang.close()
        broken.close()
    assert alive and rc == 0, srv.read_log()[-3000:]
