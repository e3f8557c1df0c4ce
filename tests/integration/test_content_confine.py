"""Stored content never runs on the API origin (issue 18): every blob reply (GET, HEAD, 200, 206,
multipart, 304, 416, cached or from the file) carries nosniff and a sandboxing CSP; active types
(HTML, SVG, anything not on the passive list) are downloads; redirect stores that cannot promise
a download proxy active types instead; and in a real browser an HTML or SVG blob with a script,
opened on the console's origin with a token in sessionStorage, runs nothing."""
import http.server
import os
import threading
import time

import pytest
import requests

from conftest import Server
from util_http import TIMEOUT, get, parse_ranges, put, sha

CSP = "default-src 'none'; sandbox"
SMALL = 1000          # served from the small-blob cache
BIG = 200 * 1024      # over cache_max_blob (64 KiB): served from the file


def body(ctype, n, seed):
    return (f"<!-- {ctype} {seed} -->".encode() + os.urandom(n))[:n]


def assert_confined(r, attachment):
    assert r.headers.get("X-Content-Type-Options") == "nosniff", (r.status_code, r.headers)
    assert r.headers.get("Content-Security-Policy") == CSP, (r.status_code, r.headers)
    if attachment:
        assert r.headers.get("Content-Disposition") == "attachment", (r.status_code, r.headers)
    else:
        assert "Content-Disposition" not in r.headers, (r.status_code, r.headers)


KINDS = [("text/html", True), ("image/svg+xml", True), ("application/xhtml+xml", True),
         ("text/javascript", True), ("image/png", False), ("text/plain; charset=utf-8", False),
         ("application/octet-stream", False), ("video/mp4", False)]


@pytest.mark.parametrize("size", [SMALL, BIG])
@pytest.mark.parametrize("ctype,attachment", KINDS)
def test_every_blob_reply_is_confined(server, ctype, attachment, size):
    data = body(ctype, size, 1)
    h = sha(data)
    assert put(server, data, headers={"Content-Type": ctype}).status_code == 201
    etag = f'"{h}"'
    replies = {
        "200": get(server, h),
        "HEAD": requests.head(f"{server.url}/v1/blobs/{h}", timeout=TIMEOUT),
        "206": get(server, h, headers={"Range": "bytes=0-9"}),
        "206 multipart": get(server, h, headers={"Range": "bytes=0-1,5-9"}),
        "304": get(server, h, headers={"If-None-Match": etag}),
        "416": get(server, h, headers={"Range": f"bytes={size + 10}-"}),
    }
    want = {"200": 200, "HEAD": 200, "206": 206, "206 multipart": 206, "304": 304, "416": 416}
    for kind, r in replies.items():
        assert r.status_code == want[kind], (kind, r.status_code, r.text[:200])
        assert_confined(r, attachment)
    assert replies["200"].content == data
    assert replies["200"].headers["Content-Type"] == ctype
    parts = parse_ranges(206, replies["206 multipart"].headers, replies["206 multipart"].content)
    assert [p[3] for p in parts] == [data[0:2], data[5:10]]


def test_redirect_store_proxies_active_types(tmp_path):
    """An fs store with serve = redirect sends passive types to public_url, whose server sets its
    own headers; an active type is proxied, with ours, instead."""
    srv = Server(tmp_path / "data", config_text=(
        f"[store local]\nkind = fs\nroot = {tmp_path / 'blobs'}\nserve = redirect\n"
        "public_url = http://cdn.example/b\n")).start()
    try:
        png, html = body("image/png", 3000, 2), b"<html><script>alert(1)</script></html>"
        assert put(srv, png, headers={"Content-Type": "image/png"}).status_code == 201
        assert put(srv, html, headers={"Content-Type": "text/html"}).status_code == 201
        r = get(srv, sha(png), allow_redirects=False)
        assert r.status_code == 307 and r.headers["Location"].startswith("http://cdn.example/b/")
        r = get(srv, sha(html), allow_redirects=False)
        assert r.status_code == 200 and r.content == html, (r.status_code, r.headers)
        assert r.headers["Content-Type"] == "text/html"
        assert_confined(r, attachment=True)
    finally:
        alive = srv.alive()
        assert srv.stop() == 0 and alive, srv.read_log()


# ---- in a browser ------------------------------------------------------------------------------

TOKEN = "secret-admin"
HTML = b"""<!doctype html><html><body><script>
document.title = 'ran';
new Image().src = 'http://127.0.0.1:PORT/ping?html=' + encodeURIComponent(sessionStorage.getItem('blobref.token'));
</script></body></html>"""
SVG = b"""<svg xmlns="http://www.w3.org/2000/svg" onload="new Image().src='http://127.0.0.1:PORT/ping?svgload='">
<script>new Image().src = 'http://127.0.0.1:PORT/ping?svg=' + encodeURIComponent(sessionStorage.getItem('blobref.token'));</script>
<rect width="10" height="10"/></svg>"""


class Marker:
    """A loopback web server that records every /ping and serves /page/NAME as given (the same
    scripts on another origin, without our headers: they must run there, or the test proves
    nothing)."""

    def __init__(self):
        self.pings, self.pages = [], {}
        marker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.startswith("/ping"):
                    marker.pings.append(self.path)
                    self.send_response(204)
                    self.end_headers()
                    return
                page = marker.pages.get(self.path)
                self.send_response(200 if page else 404)
                if page:
                    self.send_header("Content-Type", page[0])
                    self.send_header("Content-Length", str(len(page[1])))
                self.end_headers()
                if page:
                    self.wfile.write(page[1])

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def open_page(b, url):
    """Navigates the page to url and waits until the browser is done with it: the load event of
    a rendered document, or the download (denied) of an attachment."""
    b.events.clear()
    b.call("Page.navigate", url=url)
    deadline = time.time() + 15
    while not any(e["method"] in ("Page.loadEventFired", "Page.downloadWillBegin",
                                  "Browser.downloadWillBegin", "Page.frameStoppedLoading")
                  for e in b.events):
        assert time.time() < deadline, f"{url}: no load or download: {b.events[-5:]}"
        b.eval("1")


def test_scripts_in_blobs_never_run_in_a_browser(tmp_path):
    from test_ui import CHROMIUM, Browser, token_conf
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (tools/install-deps.sh test installs it)")
    marker = Marker()
    html = HTML.replace(b"PORT", str(marker.port).encode())
    svg = SVG.replace(b"PORT", str(marker.port).encode())
    marker.pages = {"/page/html": ("text/html", html), "/page/svg": ("image/svg+xml", svg)}
    srv = Server(tmp_path / "data", config_text="[auth]\nanonymous = read\n" +
                 token_conf("admin", "read, write, admin")).start()
    b = Browser(tmp_path / "chromium")
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for data, ctype in [(html, "text/html"), (svg, "image/svg+xml")]:
            assert put(srv, data, headers=dict(auth, **{"Content-Type": ctype})).status_code == 201
        b.call("Browser.setDownloadBehavior", behavior="deny")
        # the console's origin, with the admin token where the console keeps it
        b.goto(srv.url + "/ui/")
        b.wait("document.readyState === 'complete'")
        b.eval(f"sessionStorage.setItem('blobref.token', {TOKEN!r}); 1")
        for data in (html, svg):
            open_page(b, f"{srv.url}/v1/blobs/{sha(data)}")
            # a script would have set the title and pinged before the load event
            assert b.eval("document.title") != "ran"
        assert marker.pings == [], marker.pings  # nothing ran, the token never left
        b.goto(srv.url + "/ui/")
        b.wait("document.readyState === 'complete'")
        assert b.eval("sessionStorage.getItem('blobref.token')") == TOKEN
        # the control: the same bytes from another origin, without our headers, do run
        for name in ("html", "svg"):
            open_page(b, f"http://127.0.0.1:{marker.port}/page/{name}")
            deadline = time.time() + 10
            while not any(f"?{name}=" in p for p in marker.pings):
                assert time.time() < deadline, (name, marker.pings)
                b.eval("1")
    finally:
        b.close()
        marker.close()
        alive = srv.alive()
        assert srv.stop() == 0 and alive, srv.read_log()
