"""The http store (a read-only origin) against a small threaded Python web server on 127.0.0.1:
proxied reads with ranges, redirects, an origin that lost a file, and an origin so slow that 200
reads hang on it while the server must stay fast for everyone else.

Blobs get into the index of an http store the way an operator would move a folder behind a web
server: they are uploaded to an fs store, and the server is restarted with that store's name now
pointing at an http origin serving the same folder."""
import http.server
import os
import random
import re
import socket
import statistics
import threading
import time

import pytest
import requests

from s3util import LazyServer, stop_checked
from util_http import (TIMEOUT, assert_error, fsck, get, parse_ranges, put, repr_digest, sha,
                       wait_until)

KiB = 1024


class Origin:
    """A threaded web server over `root` with single-range support. drip=(bytes, seconds) sends
    the body that many bytes at a time with that pause in between. Counts requests in flight."""

    def __init__(self, root, drip=None):
        self.root, self.drip = str(root), drip
        self.active = 0
        self.requests = []
        self.lock = threading.Lock()
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.serve(head=True)

            def do_GET(self):
                self.serve(head=False)

            def serve(self, head):
                with origin.lock:
                    origin.active += 1
                    origin.requests.append((self.command, self.path, self.headers.get("Range")))
                try:
                    self._serve(head)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                finally:
                    with origin.lock:
                        origin.active -= 1

            def _serve(self, head):
                p = os.path.join(origin.root, self.path.lstrip("/"))
                if self.path.endswith("/") or not os.path.isfile(p):
                    body = b"not here"
                    self.send_response(404 if not self.path.endswith("/") else 200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if not head:
                        self.wfile.write(body)
                    return
                data = open(p, "rb").read()
                n = len(data)
                first, last, status = 0, n - 1, 200
                m = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range") or "")
                if m and (m.group(1) or m.group(2)):
                    if m.group(1):
                        first = int(m.group(1))
                        last = min(int(m.group(2)), n - 1) if m.group(2) else n - 1
                    else:
                        first = max(0, n - int(m.group(2)))
                    status = 206
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(last - first + 1))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {first}-{last}/{n}")
                self.end_headers()
                if head:
                    return
                body = data[first:last + 1]
                if origin.drip:
                    step, pause = origin.drip
                    for i in range(0, len(body), step):
                        self.wfile.write(body[i:i + step])
                        self.wfile.flush()
                        time.sleep(pause)
                else:
                    self.wfile.write(body)

        class Srv(http.server.ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 512

        self.httpd = Srv(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def key_of(h):
    return f"sha256/{h[:2]}/{h[2:4]}/{h}"


def http_site(tmp_path, blobs, drip=None, serve="proxy", public_url=None, server_keys=""):
    """Uploads blobs into an fs store `origin` (root tmp_path/site), then restarts the server with
    `origin` an http store over an Origin serving that folder, and fs store `up` for uploads.
    A blob may be (bytes, content type). Returns (server, origin)."""
    site = tmp_path / "site"
    data_dir = tmp_path / "data"
    first = LazyServer(data_dir, config_text=f"[store origin]\nkind = fs\nroot = {site}\n").start()
    for b in blobs:
        data, ctype = b if isinstance(b, tuple) else (b, None)
        r = put(first, data, headers={"Content-Type": ctype} if ctype else None)
        assert r.status_code == 201, r.text
    stop_checked(first)
    origin = Origin(site, drip=drip)
    conf = (f"[server]\nupload_store = up\n{server_keys}\n"
            f"[store up]\nkind = fs\nroot = {tmp_path / 'up'}\n"
            f"[store origin]\nkind = http\nurl = {origin.url}\nserve = {serve}\n" +
            (f"public_url = {public_url}\n" if public_url else ""))
    srv = LazyServer(data_dir, config_text=conf)
    srv.start()
    return srv, origin


SMALL = random.Random(1).randbytes(9000)
BIG = random.Random(2).randbytes(700 * KiB + 3)


@pytest.fixture
def site(tmp_path):
    made = []

    def make(*a, **kw):
        srv, origin = http_site(tmp_path, *a, **kw)
        made.append((srv, origin))
        return srv, origin

    yield make
    for srv, origin in made:
        stop_checked(srv)
        origin.close()


def test_http_proxy_reads(site):
    srv, origin = site([SMALL, BIG])
    for data in (SMALL, BIG):
        h, n = sha(data), len(data)
        for spec, a, z in [("0-99", 0, 99), ("-300", n - 300, n - 1), (f"{n // 3}-", n // 3, n - 1),
                           (f"{n // 2}-{n // 2 + 4095}", n // 2, n // 2 + 4095)]:
            r = get(srv, h, headers={"Range": "bytes=" + spec})
            assert r.status_code == 206, (spec, r.status_code, r.text[:200])
            assert r.headers["Content-Range"] == f"bytes {a}-{z}/{n}"
            assert r.content == data[a:z + 1]
        r = get(srv, h)
        assert r.status_code == 200 and r.content == data
        assert r.headers["ETag"] == f'"{h}"' and r.headers["Repr-Digest"] == repr_digest(data)
        r = get(srv, h, headers={"Range": "bytes=0-0,10-19,-5"})
        parts = parse_ranges(r.status_code, r.headers, r.content)
        assert [(p[0], p[1], p[3]) for p in parts] == [(0, 0, data[:1]), (10, 19, data[10:20]),
                                                       (n - 5, n - 1, data[-5:])]
        assert_error(get(srv, h, headers={"Range": f"bytes={n}-"}), 416, "range_not_satisfiable")
    # the origin saw ranged GETs only (no whole-body fetch for a range of the big blob)
    big_gets = [rq for rq in origin.requests if rq[0] == "GET" and sha(BIG) in rq[1]]
    assert big_gets and all(rq[2] and rq[2].startswith("bytes=") for rq in big_gets), big_gets
    # uploads go to the fs store `up`, reads of them never touch the origin
    other = b"uploaded after the switch"
    assert put(srv, other).status_code == 201
    assert get(srv, sha(other)).content == other


def test_http_redirect(site):
    srv, origin = site([SMALL], serve="redirect")
    h = sha(SMALL)
    r = get(srv, h, allow_redirects=False)
    assert r.status_code == 307
    assert r.headers["Location"] == origin.url + key_of(h)
    assert r.headers["Cache-Control"] == "private, max-age=60"
    assert requests.get(r.headers["Location"], timeout=TIMEOUT).content == SMALL


def test_http_redirect_public_url(site):
    srv, origin = site([SMALL], serve="redirect", public_url="https://img.example/x/")
    r = get(srv, sha(SMALL), allow_redirects=False)
    assert r.status_code == 307
    assert r.headers["Location"] == "https://img.example/x/" + key_of(sha(SMALL))


def test_http_redirect_proxies_active_types(site):
    """An http origin sets its own headers, so it cannot promise a download: an active type (HTML
    here) is proxied with blobrefd's confining headers instead of redirected (issue 18)."""
    html = b"<html><script>document.title='ran'</script></html>"
    srv, origin = site([SMALL, (html, "text/html")], serve="redirect")
    assert get(srv, sha(SMALL), allow_redirects=False).status_code == 307
    for headers in ({}, {"Range": "bytes=0-5"}):
        r = get(srv, sha(html), headers=headers, allow_redirects=False)
        assert r.status_code in (200, 206), (r.status_code, r.headers)
        assert html.startswith(r.content)
        assert r.headers["Content-Disposition"] == "attachment"
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Content-Security-Policy"] == "default-src 'none'; sandbox"


def test_http_origin_lost_the_file(site, tmp_path):
    srv, origin = site([SMALL, BIG])
    for data in (SMALL, BIG):
        os.unlink(tmp_path / "site" / key_of(sha(data)))
        # HEAD of the whole blob is answered from the index: the origin is not asked
        r = requests.head(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT)
        assert r.status_code == 200 and r.headers["Content-Length"] == str(len(data))
        # a read gets the origin's 404: 503 store_unavailable naming the store and the status
        body = assert_error(get(srv, sha(data)), 503, "store_unavailable")
        assert "store origin" in body["error"]["message"], body
        assert "404" in body["error"]["message"], body
        assert_error(get(srv, sha(data), headers={"Range": "bytes=0-9"}), 503, "store_unavailable")
    # fsck asks the origin (HEAD) and reports both as missing
    rc, blobs, problems, out = fsck(srv.data_dir, config=srv.data_dir / "blobref.conf")
    assert rc == 1 and blobs == 2 and problems == 2, out
    assert sha(SMALL) in out and sha(BIG) in out, out


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def test_slow_origin_does_not_stall_others(site):
    """200 proxied reads hang on an origin that drips 1 KiB every 100 ms; meanwhile HEADs and GETs
    of a blob in the fs store must stay fast."""
    srv, origin = site([BIG], drip=(KiB, 0.1), server_keys="connection_timeout = 2m\n")
    local = random.Random(3).randbytes(30000)
    assert put(srv, local).status_code == 201
    n_slow = 200
    socks = []
    try:
        req = (f"GET /v1/blobs/{sha(BIG)} HTTP/1.1\r\nHost: x\r\n\r\n").encode()
        for _ in range(n_slow):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(req)
            socks.append(s)
        assert wait_until(lambda: origin.active >= n_slow, timeout=20), origin.active
        # every slow read has its answer head and is receiving drips
        for s in socks[:5]:
            assert s.recv(64).startswith(b"HTTP/1.1 200"), "no answer head"
        heads, gets = [], []
        with requests.Session() as sess:
            url = f"{srv.url}/v1/blobs/{sha(local)}"
            for _ in range(200):
                t0 = time.monotonic()
                r = sess.head(url, timeout=TIMEOUT)
                heads.append(time.monotonic() - t0)
                assert r.status_code == 200
            for _ in range(50):
                t0 = time.monotonic()
                r = sess.get(url, timeout=TIMEOUT)
                gets.append(time.monotonic() - t0)
                assert r.status_code == 200 and r.content == local
        still = origin.active
        for name, xs in (("HEAD", heads), ("GET", gets)):
            print(f"{name} x{len(xs)} while {still} reads hang on the origin: "
                  f"p50 {statistics.median(xs) * 1000:.1f} ms, p99 {percentile(xs, 99) * 1000:.1f} ms,"
                  f" max {max(xs) * 1000:.1f} ms")
        assert still >= n_slow * 0.9, still  # the slow reads were still in flight throughout
        assert percentile(heads, 99) < 0.2 and percentile(gets, 99) < 0.2, (heads, gets)
    finally:
        for s in socks:
            s.close()
    # closing the clients cancels the origin transfers
    assert wait_until(lambda: origin.active == 0, timeout=15), origin.active
