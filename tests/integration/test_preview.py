"""Held and quarantined blobs previewable by an admin (issue 23): GET /v1/blobs/{hash}/preview
serves a blob in any state but deleting, to the admin scope only, never redirected (even from a
redirect store), private and no-store, and a download unless it is a passive image type;
`blobref get --preview` fetches it through the real CLI."""
import hashlib
import os
import subprocess

import pytest
import requests

from conftest import BIN_DIR, Server
from util_http import TIMEOUT, assert_error, put, sha

CSP = "default-src 'none'; sandbox"
PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(3000)
TEXT = b"held words\n" * 50
HTML = b"<html><script>alert(1)</script></html>"


def bearer(name):
    return {"Authorization": f"Bearer secret-{name}"}


@pytest.fixture
def srv(tmp_path):
    tokens = "".join(f"[token {n}]\nsha256 = {hashlib.sha256(f'secret-{n}'.encode()).hexdigest()}"
                     f"\nscopes = {s}\n" for n, s in (("admin", "read, write, admin"),
                                                      ("reader", "read")))
    s = Server(tmp_path / "data", config_text=(
        f"[auth]\nanonymous = read\n{tokens}"
        f"[store local]\nkind = fs\nroot = {tmp_path / 'blobs'}\nserve = redirect\n"
        "public_url = http://cdn.example/b\n")).start()
    yield s
    alive = s.alive()
    assert s.stop() == 0 and alive, s.read_log()


def preview(srv, h, who="admin", **kw):
    return requests.get(f"{srv.url}/v1/blobs/{h}/preview", headers=kw.pop("headers", {}) |
                        bearer(who), timeout=TIMEOUT, allow_redirects=False, **kw)


def hold(srv, h):
    r = requests.delete(f"{srv.url}/v1/blobs/{h}", params={"reason": "looks odd"},
                        headers=bearer("admin"), timeout=TIMEOUT)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("data,ctype,inline", [
    (PNG, "image/png", True), (TEXT, "text/plain", False), (HTML, "text/html", False),
], ids=["png-inline", "text-download", "html-download"])
def test_an_admin_previews_a_held_blob(srv, data, ctype, inline):
    assert put(srv, data, headers={"Content-Type": ctype} | bearer("admin")).status_code == 201
    h = sha(data)
    live = preview(srv, h)  # a live blob previews too (the normal GET would redirect it)
    assert live.status_code == 200 and live.content == data, (live.status_code, live.headers)
    hold(srv, h)
    assert_error(requests.get(f"{srv.url}/v1/blobs/{h}", timeout=TIMEOUT), 410, "quarantined")
    r = preview(srv, h)
    assert r.status_code == 200 and r.content == data, (r.status_code, r.headers)
    assert r.headers["Content-Type"] == ctype
    assert r.headers["Cache-Control"] == "private, no-store"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Content-Security-Policy"] == CSP
    assert r.headers.get("Content-Disposition") == (None if inline else "attachment")
    part = preview(srv, h, headers={"Range": "bytes=0-3"})
    assert part.status_code == 206 and part.content == data[:4]
    assert part.headers["Cache-Control"] == "private, no-store"


def test_only_admins_and_never_a_redirect_or_a_missing_blob(srv):
    assert put(srv, PNG, headers={"Content-Type": "image/png"} | bearer("admin")).status_code \
        == 201
    h = sha(PNG)
    normal = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=TIMEOUT, allow_redirects=False)
    assert normal.status_code == 307  # the store redirects ordinary reads
    hold(srv, h)
    assert_error(preview(srv, h, who="reader"), 403, "forbidden")
    assert_error(requests.get(f"{srv.url}/v1/blobs/{h}/preview", timeout=TIMEOUT), 401,
                 "unauthorized")
    assert_error(preview(srv, "ab" * 32), 404, "not_found")
    assert_error(preview(srv, "xyz"), 400, "bad_hash")
    r = requests.post(f"{srv.url}/v1/blobs/{h}/restore", headers=bearer("admin"), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert preview(srv, h).status_code == 200


def test_cli_get_preview(srv, tmp_path):
    assert put(srv, TEXT, headers=bearer("admin")).status_code == 201
    h = sha(TEXT)
    hold(srv, h)

    def cli(*args, token="admin"):
        return subprocess.run([str(BIN_DIR / "blobref"), "--server", srv.url, "--token",
                               f"secret-{token}", "get", *args, h], capture_output=True,
                              timeout=60, env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))

    p = cli()
    assert p.returncode == 1 and b"quarantined" in p.stderr, p.stderr
    p = cli("--preview")
    assert p.returncode == 0 and p.stdout == TEXT, p.stderr
    out = tmp_path / "held.txt"
    p = cli("--preview", "-o", str(out))
    assert p.returncode == 0 and out.read_bytes() == TEXT, p.stderr
    p = cli("--preview", token="reader")
    assert p.returncode == 1 and b"forbidden" in p.stderr, p.stderr
