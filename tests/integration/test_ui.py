"""The operator console (issue 13) in a real browser: Debian's headless chromium, driven over the
Chrome DevTools Protocol (python3-websocket), against a real blobrefd with tokens, a reconcile
table and some blobs. The page runs under the CSP blobrefd sends (the browser enforces it: a
blocked inline script or style would be a console error), and any console error, uncaught
exception or failed resource fails the test. Screenshots of each view go to
build/ui-screenshots/ (BLOBREF_UI_SCREENSHOTS overrides)."""
import base64
import hashlib
import io
import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

import pytest
import requests

from conftest import ROOT, Server
from reconcile_util import IceTable, recon_conf

websocket = pytest.importorskip("websocket", reason="python3-websocket is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = pathlib.Path(os.environ.get("BLOBREF_UI_SCREENSHOTS", ROOT / "build" / "ui-screenshots"))
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
ADMIN, READER = "secret-admin", "secret-reader"
TEXT = b"hello from the blobref console test\n" * 4


def sha(data):
    return hashlib.sha256(data).hexdigest()


def png_bytes(w=96, h=64):
    from PIL import Image, ImageDraw
    im = Image.new("RGB", (w, h), (37, 99, 235))
    ImageDraw.Draw(im).ellipse((w // 4, h // 4, 3 * w // 4, 3 * h // 4), fill=(250, 204, 21))
    out = io.BytesIO()
    im.save(out, format="PNG")
    return out.getvalue()


def token_conf(name, scopes):
    return (f"[token {name}]\nsha256 = {hashlib.sha256(f'secret-{name}'.encode()).hexdigest()}\n"
            f"scopes = {scopes}\n")


class Browser:
    """A headless chromium and a CDP session on its one page. Every event received is kept;
    errors() returns the console errors, exceptions and failed loads among them."""

    def __init__(self, profile):
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={profile}",
             "--window-size=1280,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = pathlib.Path(profile) / "DevToolsActivePort"
        deadline = time.time() + 30
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        port = int(port_file.read_text().split("\n")[0])
        pages = [t for t in requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
                 if t["type"] == "page"]
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self.next_id = 0
        self.events = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def call(self, method, **params):
        self.next_id += 1
        my = self.next_id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, timeout=15, what=None):
        deadline = time.time() + timeout
        while True:
            v = self.eval(expr)
            if v:
                return v
            if time.time() > deadline:
                body = self.eval("document.body ? document.body.innerText : ''")
                raise AssertionError(f"timed out waiting for {what or expr}; page says:\n{body}")
            time.sleep(0.1)

    def goto(self, url):
        self.call("Page.navigate", url=url)

    def hash(self, h):
        """Goes to a view (#overview, #blob/HEX...) and waits until it has rendered."""
        self.eval(f"location.hash = {json.dumps(h)}")
        self.wait(f"(() => {{ const v = document.getElementById('view');"
                  f" return v && v.dataset.ready === '1' && location.hash === {json.dumps(h)}; }})()",
                  what=f"view {h}")

    def click(self, element_id):
        self.eval(f"document.getElementById({json.dumps(element_id)}).click()")

    def text(self, selector):
        return self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                         f" return e ? e.textContent : null; }})()")

    def screenshot(self, name):
        SHOTS.mkdir(parents=True, exist_ok=True)
        data = self.call("Page.captureScreenshot", format="png",
                         captureBeyondViewport=True)["data"]
        path = SHOTS / name
        path.write_bytes(base64.b64decode(data))
        return path

    def errors(self):
        self.eval("1")  # drain what arrived
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(("exception", p["exceptionDetails"].get("exception", {})
                            .get("description") or p["exceptionDetails"].get("text")))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(("console." + p["type"], [a.get("value", a.get("description"))
                                                     for a in p.get("args", [])]))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(("log", p["entry"].get("source"), p["entry"].get("text"),
                            p["entry"].get("url")))
        return out

    def close(self):
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def expected_probe_failure(err):
    """The console finds out whether its caller may use admin routes with POST /v1/import of an
    empty list (an admin route that changes nothing); the browser logs its 401/403 as a failed
    resource. That one request, and nothing else, may fail."""
    return (err[0] == "log" and err[1] == "network" and str(err[3]).endswith("/v1/import")
            and ("401" in err[2] or "403" in err[2]))


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (tools/install-deps.sh test installs it)")
    tmp = tmp_path_factory.mktemp("ui")
    table = IceTable(tmp / "images")
    png = png_bytes()
    others = [os.urandom(3000 + i) for i in range(3)]
    text = TEXT
    held = os.urandom(1200)
    # the table references the image and the text; the random blobs are not referenced
    table.write_data({"f1.parquet": [sha(png), sha(text)]})
    table.append("f1.parquet")
    conf = recon_conf(table, grace="1s", extra="[auth]\nanonymous = read\n" +
                      token_conf("admin", "read, write, admin") + token_conf("reader", "read"))
    srv = Server(tmp / "data", config_text=conf).start()
    w = {"Authorization": f"Bearer {ADMIN}"}
    for data, ctype in [(png, "image/png"), (text, "text/plain")] + \
            [(o, "application/octet-stream") for o in others + [held]]:
        r = requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data, timeout=10,
                         headers=dict(w, **{"Content-Type": ctype}))
        assert r.status_code == 201, r.text
    r = requests.delete(f"{srv.url}/v1/blobs/{sha(held)}?reason=legal-hold", headers=w, timeout=10)
    assert r.status_code == 200, r.text
    browser = Browser(tmp / "chromium")
    try:
        yield srv, browser, {"png": sha(png), "text": sha(text), "held": sha(held),
                             "others": [sha(o) for o in others]}
    finally:
        browser.close()
        alive = srv.alive()
        assert srv.stop() == 0 and alive, srv.read_log()


def test_console_in_a_browser(console):
    srv, b, h = console
    t0 = time.monotonic()
    b.goto(srv.url + "/ui/#overview")
    b.wait("document.getElementById('view') && document.getElementById('view').dataset.ready === '1'",
           what="the overview")

    # overview: 5 blobs uploaded, 1 of them held by an admin
    assert b.text("#card-live .value") == "5"
    assert b.text("#card-quarantined .value") == "1"
    assert "1 held" in b.text("#card-quarantined .extra")
    assert "%" in b.text("#card-fill .value")
    assert "healthy" in b.text("#stores tbody")
    # per store: the 5 live blobs (the held one is not counted) and their bytes
    assert b.text("#stores tbody .store-blobs") == "5"
    # (one store holds every live blob: its bytes are the index's live bytes)
    assert b.text("#stores tbody .store-bytes") == b.text("#card-live .extra") != "0 B"
    assert b.text("#readyz") == "/readyz: ready"
    assert "store_write" in b.text("#steps tbody")
    assert b.eval("document.querySelectorAll('#chart-requests canvas, #chart-uploads canvas').length") == 2
    assert "2xx: " in b.text("#chart-requests .u-legend"), b.text("#chart-requests .u-legend")
    assert b.eval("document.getElementById('chart-requests').dataset.kind") == "lines"
    # anonymous: read-only, so no admin button anywhere
    assert b.text("#token-state") == "no token"
    assert not b.eval("document.body.classList.contains('admin')")

    # traffic for the rate charts, then the next poll (every 5 s), then the picture
    # (BLOBREF_UI_POLLS=N waits N polls: docs/console-overview.png was taken with 8)
    for poll in range(int(os.environ.get("BLOBREF_UI_POLLS", "1"))):
        b.eval("document.getElementById('view').dataset.seen = '1'")
        for i in range(10 + 7 * (poll % 4)):
            requests.get(f"{srv.url}/v1/blobs/{h['png']}", timeout=10)
            if i % (2 + poll % 3) == 0:
                requests.put(f"{srv.url}/v1/blobs/{h['text']}", data=TEXT, timeout=10,
                             headers={"Authorization": f"Bearer {ADMIN}"})
            if i % 5 == 0:
                requests.get(f"{srv.url}/v1/blobs/{'0' * 64}", timeout=10)  # a 404
        b.wait("(() => { const v = document.getElementById('view');"
               " return !v.dataset.seen && v.dataset.ready === '1'; })()", timeout=10,
               what="the next poll")
    b.screenshot("overview.png")

    # blob search: a hash typed as sha256:<hex> shows the record and an image preview
    b.hash("#blob")
    b.eval(f"document.getElementById('blob-search').value = 'sha256:{h['png']}'")
    b.eval("document.getElementById('blob-form').requestSubmit()")
    b.wait(f"location.hash === '#blob/{h['png']}' && document.getElementById('view').dataset.ready === '1'")
    b.wait("(() => { const i = document.getElementById('blob-img');"
           " return i && i.complete && i.naturalWidth > 0; })()", what="the image preview")
    assert b.eval("document.getElementById('blob-img').naturalWidth") == 96
    assert "image/png" in b.text("#blob-detail")
    assert b.text("#blob-state") == "live"
    assert "local" in b.text("#blob-locations")
    assert b.eval("document.getElementById('blob-quarantine')") is None  # no token: no actions
    assert b.eval("document.querySelectorAll('#blob-table tbody tr').length") == 6
    # why it is here: the table, its snapshot (with its time) and the data file referencing it
    b.wait("document.getElementById('blob-why-text') !== null")
    assert b.text("#blob-why-text") == "referenced"
    refs = requests.get(f"{srv.url}/v1/blobs/{h['png']}/refs", timeout=30).json()
    [snap] = refs["tables"][0]["snapshots"]
    assert b.eval("document.querySelectorAll('#blob-refs tbody tr').length") == 1
    row = b.text("#blob-refs tbody tr")
    assert "images (iceberg)" in row and str(snap["id"]) in row and "f1.parquet" in row, row
    assert snap["timestamp"][:10] in row, row  # the snapshot's commit date is shown
    b.screenshot("blob.png")

    # a held blob shows as such
    b.hash(f"#blob/{h['held']}")
    assert "quarantined (held by an admin)" in b.text("#blob-state")
    assert "legal-hold" in b.text("#blob-detail")
    b.wait("document.getElementById('blob-why-text') !== null")
    assert b.text("#blob-why-text") == "held by an admin: legal-hold"
    assert b.eval("document.getElementById('blob-restore')") is None
    assert "only an admin can preview them" in b.text("#blob-preview")

    # reconcile without a token: the runs, no dry-run button
    b.hash("#reconcile")
    assert b.eval("document.getElementById('dry-run')") is None
    assert b.text("#no-runs") == "No runs yet."
    assert b.text("#next-run").startswith("No periodic run scheduled")  # interval = 0 here

    # a read-only token is not admin either
    b.eval(f"document.getElementById('token-input').value = '{READER}'")
    b.eval("document.getElementById('token-form').requestSubmit()")
    b.wait("document.getElementById('token-state').textContent === 'token set'")
    b.wait("document.getElementById('view').dataset.ready === '1'")
    assert b.eval("document.getElementById('dry-run')") is None

    # the admin token (kept in sessionStorage only) brings the dry-run button; it works
    b.eval(f"document.getElementById('token-input').value = '{ADMIN}'")
    b.eval("document.getElementById('token-form').requestSubmit()")
    b.wait("document.getElementById('token-state').textContent === 'token set · admin'")
    assert b.eval("sessionStorage.getItem('blobref.token')") == ADMIN
    assert b.eval("localStorage.length") == 0
    b.wait("(() => { const d = document.getElementById('dry-run'); return d && d.offsetParent !== null; })()",
           what="the dry-run button")
    b.click("dry-run")
    b.wait("/^#reconcile\\/\\d+$/.test(location.hash) && document.getElementById('view').dataset.ready === '1'"
           " && !!document.getElementById('run-title')", timeout=30, what="the dry run's report")
    assert "dry run" in b.text("#run-title")
    assert b.text("#run-state") == "done"
    run_id = int(b.eval("location.hash.split('/')[1]"))
    rep = requests.get(f"{srv.url}/v1/reconcile/runs/{run_id}", timeout=10).json()
    assert rep["dry_run"] is True and rep["state"] == "done"
    # what a real run would do: the three unreferenced blobs past grace (1 s) are quarantined
    assert rep["blobs"]["quarantined"] == 3, rep
    assert "3" in b.text("#view")
    # the run page lists those three blobs, each linked to its blob page
    links = b.eval("Array.from(document.querySelectorAll('#run-list-quarantined a'))"
                   ".map((a) => a.getAttribute('href'))")
    assert sorted(links) == sorted(f"#blob/{x}" for x in h["others"]), links
    assert "quarantined (3)" in b.text("#run-list-quarantined h4")
    b.screenshot("reconcile-run.png")
    b.hash("#reconcile")
    assert b.eval("document.querySelectorAll('#runs tbody tr').length") == 1
    assert b.eval("document.querySelectorAll('#chart-runs canvas').length") == 1
    # one bar group per run, on a UTC time axis of at least an hour with the run inside it;
    # legends carry the values (the dry run would quarantine 3)
    assert b.eval("document.getElementById('chart-runs').dataset.kind") == "bars"
    lo, hi = (float(b.eval(f"document.getElementById('chart-runs').dataset.{k}"))
              for k in ("xMin", "xMax"))
    started = b.eval(f"Date.parse({json.dumps(rep['started_at'])}) / 1000")
    assert hi - lo >= 3600 and lo < started < hi, (lo, started, hi)
    legend = b.text("#chart-runs .u-legend")
    assert "quarantined: 3" in legend and "bytes reclaimed:" in legend, legend
    assert b.text("#chart-runs .u-title").endswith(" · UTC"), b.text("#chart-runs .u-title")
    assert b.text("#last-run").startswith(f"Last run: #{run_id}, started ") and \
        b.text("#last-run").find(" UTC") > 0, b.text("#last-run")
    b.screenshot("reconcile.png")
    # the dry run changed nothing
    assert requests.get(f"{srv.url}/v1/blobs/{h['others'][0]}/meta", timeout=10).json()["state"] == "live"

    # with a token the image comes through fetch + a blob: URL (img cannot send Authorization)
    b.hash(f"#blob/{h['png']}")
    b.wait("(() => { const i = document.getElementById('blob-img');"
           " return i && i.complete && i.naturalWidth > 0 && i.src.startsWith('blob:'); })()",
           what="the image preview from a blob: URL")
    # anything else: a hex dump of its first bytes, fetched with a Range request, as text
    b.hash(f"#blob/{h['text']}")
    b.wait("!!document.getElementById('blob-hexdump')")
    assert b.text("#blob-hexdump").startswith("00000000  68 65 6c 6c 6f 20 66 72")
    assert "hello from the b" in b.text("#blob-hexdump")
    # quarantine by hand, then restore, through the admin routes
    b.click("blob-quarantine")
    b.wait("(document.getElementById('blob-state') || {}).textContent === 'quarantined (held by an admin)'")
    assert requests.get(f"{srv.url}/v1/blobs/{h['text']}", timeout=10).status_code == 410
    # held, it is still previewed for the admin, through GET .../preview
    b.wait("(document.getElementById('blob-hexdump') || {}).textContent.includes('hello from the b')",
           what="the held blob's preview")
    assert b.text("#blob-hexdump").startswith("00000000  68 65 6c 6c 6f 20 66 72")
    b.screenshot("blob-held-preview.png")
    b.click("blob-restore")
    b.wait("(document.getElementById('blob-state') || {}).textContent === 'live'")
    assert requests.get(f"{srv.url}/v1/blobs/{h['text']}", timeout=10).status_code == 200

    # jobs (admin): an import job listed with its progress, polled until it ends
    r = requests.post(f"{srv.url}/v1/jobs", headers={"Authorization": f"Bearer {ADMIN}"},
                      json={"kind": "import", "store": "local", "source": "sha256/"}, timeout=10)
    assert r.status_code == 202, r.text
    jid = r.json()["id"]
    b.hash("#jobs")
    b.wait(f"(() => {{ const r = document.getElementById('job-{jid}');"
           " return r && r.textContent.includes('done'); })()", what="the finished job")
    row = b.text(f"#job-{jid}")
    assert "import" in row and "local:sha256/" in row and "100%" in row, row
    assert b.eval(f"document.querySelector('#job-{jid} progress').value") == 1

    errors = [e for e in b.errors() if not expected_probe_failure(e)]
    assert errors == [], errors
    # and the CSP is enforced: an inline style or script would have shown up above
    b.eval("document.body.setAttribute('style', 'color: red')")
    b.eval("(() => { const s = document.createElement('script'); s.textContent = 'window.pwned = 1';"
           " document.body.append(s); })()")
    deadline = time.time() + 5
    while True:  # the violation reports arrive as events, after the calls
        blocked = [e for e in b.errors() if e[0] == "log" and e[1] == "security"]
        if len(blocked) >= 2 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert len(blocked) == 2 and all("Content Security Policy" in e[2] for e in blocked), blocked
    assert b.eval("window.pwned === undefined")
    assert time.monotonic() - t0 < 60 + 5 * int(os.environ.get("BLOBREF_UI_POLLS", "1"))


def test_console_files_headers(console):
    srv = console[0]
    r = requests.get(f"{srv.url}/ui", allow_redirects=False, timeout=10)
    assert r.status_code == 308 and r.headers["Location"] == "/ui/"
    page = requests.get(f"{srv.url}/ui/", timeout=10)
    assert page.status_code == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert page.headers["Cache-Control"] == "no-cache"
    assert page.headers["Content-Security-Policy"] == CSP
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert "<script>" not in page.text and "style=" not in page.text  # nothing inline
    assert "http://" not in page.text and "https://" not in page.text  # no CDN
    # every asset the page names is hashed, long-cached, typed, with an ETag; HEAD works
    import re
    names = re.findall(r'(?:src|href)="([^"#:]+)"', page.text)
    hashed = [n for n in names if re.fullmatch(r"\w+\.[0-9a-f]{8}\.(js|css)", n)]
    assert len(hashed) == 4, names
    for n in hashed:
        r = requests.get(f"{srv.url}/ui/{n}", timeout=10)
        assert r.status_code == 200, n
        assert r.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert r.headers["Content-Type"].startswith(
            "text/javascript" if n.endswith(".js") else "text/css")
        assert r.headers["Content-Security-Policy"] == CSP
        assert hashlib.sha256(r.content).hexdigest()[:8] == n.split(".")[1]
        assert r.headers["ETag"] == f'"{hashlib.sha256(r.content).hexdigest()[:16]}"'
        again = requests.get(f"{srv.url}/ui/{n}", headers={"If-None-Match": r.headers["ETag"]},
                             timeout=10)
        assert again.status_code == 304 and again.content == b""
        head = requests.head(f"{srv.url}/ui/{n}", timeout=10)
        assert head.status_code == 200 and head.content == b""
        assert int(head.headers["Content-Length"]) == len(r.content)
    lic = requests.get(f"{srv.url}/ui/licenses.txt", timeout=10)
    assert lic.status_code == 200 and "uPlot" in lic.text and "MIT" in lic.text
    for bad in ("/ui/nope.js", "/ui/app.js", "/ui/x/y"):
        r = requests.get(srv.url + bad, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] in ("not_found", "no_route"), bad
    assert requests.post(f"{srv.url}/ui/", timeout=10).status_code == 405
    # the {file} segment of the route matcher: one segment, an encoded slash stays in it, and
    # absolute-form targets are routed by their path
    assert requests.get(f"{srv.url}/ui/x%2Fapp.js", timeout=10).status_code == 404
    assert requests.get(f"{srv.url}/ui/index.html", timeout=10).text == page.text
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(f"GET {srv.url}/ui/licenses.txt HTTP/1.1\r\nHost: x\r\n"
                     "Connection: close\r\n\r\n".encode())
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert raw.startswith(b"HTTP/1.1 200 ") and b"uPlot" in raw
    # hash routes still parse their segment
    assert requests.get(f"{srv.url}/v1/blobs/nothex/meta", timeout=10).json()["error"]["code"] == "bad_hash"


def test_refused_dry_run_shows_as_refused(tmp_path):
    """A dry run that max_fraction refuses is shown as refused on the run page and in the list
    (its state is "done": the run completed; its `refused` says why nothing would change)."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (tools/install-deps.sh test installs it)")
    table = IceTable(tmp_path / "t")
    kept = os.urandom(100)
    table.write_data({"a.parquet": [sha(kept)]})
    table.append("a.parquet")
    srv = Server(tmp_path / "data", config_text=recon_conf(table, grace="1s",
                                                            max_fraction="0.1")).start()
    browser = None
    try:
        for data in [kept] + [os.urandom(200 + i) for i in range(3)]:
            assert requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data,
                                timeout=10).status_code == 201
        time.sleep(1.3)  # past grace
        rid = requests.post(f"{srv.url}/v1/reconcile?dry_run=1", timeout=10).json()["id"]
        for _ in range(300):
            rep = requests.get(f"{srv.url}/v1/reconcile/runs/{rid}", timeout=10).json()
            if rep["state"] != "running":
                break
            time.sleep(0.05)
        assert rep["state"] == "done" and rep["refused"], rep
        browser = Browser(tmp_path / "chromium")
        browser.goto(f"{srv.url}/ui/#reconcile/{rid}")
        browser.wait("document.getElementById('view') && document.getElementById('view')"
                     ".dataset.ready === '1' && !!document.getElementById('run-state')",
                     what="the run page")
        assert browser.text("#run-state") == "refused"
        assert "max_fraction" in browser.text("#view")
        browser.hash("#reconcile")
        assert "refused" in browser.text("#runs tbody")
    finally:
        if browser:
            browser.close()
        srv.stop()


def test_counts_only_run_and_why_in_grace_or_leased(tmp_path):
    """With [reconcile] lists = false the run page says it recorded counts only (instead of an
    empty list); the blob page says why an unreferenced blob is not quarantined yet: in grace
    until T, or leased by L until T (as GET /v1/blobs/{hash}/refs does)."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (tools/install-deps.sh test installs it)")
    table = IceTable(tmp_path / "t")
    kept, young, leased = os.urandom(100), os.urandom(101), os.urandom(102)
    table.write_data({"a.parquet": [sha(kept)]})
    table.append("a.parquet")
    srv = Server(tmp_path / "data", config_text=recon_conf(table, grace="1h", lists="false")).start()
    browser = None
    try:
        lease = requests.post(f"{srv.url}/v1/leases", json={"ttl": "2h", "name": "ui-job"},
                              timeout=10).json()
        for data, params in ((kept, {}), (young, {}), (leased, {"lease": lease["id"]})):
            assert requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data, params=params,
                                timeout=10).status_code == 201
        rid = requests.post(f"{srv.url}/v1/reconcile", timeout=10).json()["id"]
        for _ in range(600):
            rep = requests.get(f"{srv.url}/v1/reconcile/runs/{rid}", timeout=10).json()
            if rep["state"] != "running":
                break
            time.sleep(0.05)
        assert rep["state"] == "done" and rep["lists"] is None and rep["blobs"]["pending"] == 2
        browser = Browser(tmp_path / "chromium")
        browser.goto(f"{srv.url}/ui/#reconcile/{rid}")
        browser.wait("document.getElementById('view') && document.getElementById('view')"
                     ".dataset.ready === '1' && !!document.getElementById('run-lists')",
                     what="the run page")
        assert "recorded counts only" in browser.text("#run-lists")
        for data, start in ((young, "unreferenced, in grace until "),
                            (leased, f"unreferenced, leased by {lease['id']} (ui-job) until ")):
            why = requests.get(f"{srv.url}/v1/blobs/{sha(data)}/refs", timeout=30).json()["why"]
            assert why.startswith(start), why
            browser.hash(f"#blob/{sha(data)}")
            browser.wait(f"(document.getElementById('blob-why-text') || {{}}).textContent === "
                         f"{json.dumps(why)}", what="the blob's why")
    finally:
        if browser:
            browser.close()
        srv.stop()
