"""Content types detected from the bytes (issue 23): an upload or import that names no type, or
application/octet-stream, gets the type libmagic finds in its first 4 KiB; an explicit type is
kept; active types (HTML, SVG) are never adopted, so such a blob stays a confined download; and a
server whose magic database cannot be loaded refuses to start."""
import json
import os
import struct
import subprocess
import zlib

import pytest
import requests

from conftest import BIN_DIR, Server, free_port
from util_http import TIMEOUT, get, post, put, sha, wait_until

CSP = "default-src 'none'; sandbox"


def png(extra=b""):
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff))
    raw = b"".join(b"\0" + b"\xff\x00\x00" * 4 for _ in range(4))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"") + extra)


JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + os.urandom(600)
PDF = b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog >>\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n"
TEXT = b"Plain words on a line.\nAnother line of ordinary text.\n" * 20
HTML = b"<!DOCTYPE html>\n<html><head><title>x</title></head><body><script>alert(1)</script>" \
       b"</body></html>\n"
SVG = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script>' \
      b"</svg>\n"


def meta_type(srv, h):
    r = requests.get(f"{srv.url}/v1/blobs/{h}/meta", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["content_type"]


@pytest.mark.parametrize("data,want", [
    (png(), "image/png"), (JPEG, "image/jpeg"), (PDF, "application/pdf"), (TEXT, "text/plain"),
    # over 4 KiB, sent in many small chunks: detection waits for the first 4 KiB
    (png(os.urandom(300_000)), "image/png"),
], ids=["png", "jpeg", "pdf", "text", "png-300k"])
@pytest.mark.parametrize("how", ["post no type", "put octet-stream", "put chunked"])
def test_type_detected_from_the_bytes(server, data, want, how):
    if how == "post no type":
        r = post(server, data)
    elif how == "put octet-stream":
        r = put(server, data, headers={"Content-Type": "application/octet-stream"})
    else:
        r = requests.put(f"{server.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT,
                         data=(data[i:i + 100] for i in range(0, len(data), 100)))
    assert r.status_code == 201, r.text
    assert meta_type(server, sha(data)) == want
    g = get(server, sha(data))
    assert g.status_code == 200 and g.content == data
    assert g.headers["Content-Type"] == want
    assert "Content-Disposition" not in g.headers  # passive: shown inline


def test_explicit_type_is_kept(server):
    data = png(b"kept")
    assert put(server, data, headers={"Content-Type": "application/x-mine"}).status_code == 201
    assert meta_type(server, sha(data)) == "application/x-mine"
    assert get(server, sha(data)).headers["Content-Type"] == "application/x-mine"


def test_only_the_first_4k_are_looked_at(server):
    data = b"\0" * 4096 + png()  # the PNG signature starts past the bytes detection reads
    assert post(server, data).status_code == 201
    assert meta_type(server, sha(data)) == "application/octet-stream"


@pytest.mark.parametrize("data", [HTML, SVG], ids=["html", "svg"])
def test_active_bytes_stay_a_confined_download(server, data):
    assert post(server, data).status_code == 201
    assert meta_type(server, sha(data)) == "application/octet-stream"
    r = get(server, sha(data))
    assert r.headers["Content-Type"] == "application/octet-stream"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Content-Security-Policy"] == CSP


def test_import_detects_like_uploads(tmp_path):
    """POST /v1/import and `blobref import` (which sends octet-stream for unknown extensions)."""
    srv = Server(tmp_path / "data").start()
    try:
        root = srv.data_dir / "blobs"
        items = {"in/api-pic": (png(b"api"), None), "in/api-doc": (PDF + b"api", ""),
                 "in/api-kept": (png(b"kept"), "image/x-kept"), "in/api-page": (HTML, None)}
        blobs = []
        for key, (data, ct) in items.items():
            (root / key).parent.mkdir(parents=True, exist_ok=True)
            (root / key).write_bytes(data)
            b = {"sha256": sha(data), "size": len(data), "store": "local", "key": key}
            if ct is not None:
                b["content_type"] = ct
            blobs.append(b)
        r = requests.post(f"{srv.url}/v1/import", json={"blobs": blobs}, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert [x["result"] for x in r.json()["results"]] == ["created"] * 4, r.text
        want = {"in/api-pic": "image/png", "in/api-doc": "application/pdf",
                "in/api-kept": "image/x-kept", "in/api-page": "application/octet-stream"}
        for key, (data, _) in items.items():
            assert meta_type(srv, sha(data)) == want[key], key

        tree = root / "cli"
        tree.mkdir()
        pic, txt = png(b"cli"), TEXT + b"cli"
        (tree / "photo").write_bytes(pic)      # no extension: the CLI sends octet-stream
        (tree / "notes.dat").write_bytes(txt)
        conf = srv.data_dir / "cli.conf"
        conf.write_text(f"[store local]\nkind = fs\nroot = {root}\n")
        p = subprocess.run([str(BIN_DIR / "blobref"), "--server", srv.url, "import", str(tree),
                            "-c", str(conf), "--store", "local", "--in-place"],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
        assert p.returncode == 0, p.stdout + p.stderr
        assert meta_type(srv, sha(pic)) == "image/png"
        assert meta_type(srv, sha(txt)) == "text/plain"
    finally:
        assert srv.stop() == 0, srv.read_log()


def ended(srv, jid):
    j = requests.get(f"{srv.url}/v1/jobs/{jid}", timeout=TIMEOUT).json()
    return j if j["state"] not in ("queued", "running") else None


def test_import_jobs_detect_like_uploads(tmp_path):
    """An import job (POST /v1/jobs kind=import, in place and copy) types each object by its key's
    extension first, then by libmagic on its first 4 KiB, else application/octet-stream."""
    root = tmp_path / "a"
    srv = Server(tmp_path / "data", f"[store a]\nkind = fs\nroot = {root}\n").start()
    try:
        items = {
            "in/photo.JPG": (os.urandom(700), "image/jpeg"),     # the extension wins over bytes
            "in/page.html": (TEXT, "text/html"),                # an active one: a download
            "in/scan": (PDF + b"job", "application/pdf"),       # no extension: the bytes
            "in/notes.dat": (TEXT + b"job", "text/plain"),      # unknown extension: the bytes
            "in/deep": (b"\0" * 4096 + png(), "application/octet-stream"),  # past the 4 KiB
            "in/rand": (os.urandom(900), "application/octet-stream"),
            "cp/pic": (png(b"copy"), "image/png"),              # copied to a sha256/ key
        }
        for key, (data, _) in items.items():
            (root / key).parent.mkdir(parents=True, exist_ok=True)
            (root / key).write_bytes(data)
        for prefix, mode in (("in/", "in-place"), ("cp/", "copy")):
            r = requests.post(f"{srv.url}/v1/jobs", json={"kind": "import", "store": "a",
                                                          "source": prefix, "mode": mode},
                              timeout=TIMEOUT)
            assert r.status_code == 202, r.text
            jid = r.json()["id"]
            end = wait_until(lambda: ended(srv, jid), timeout=120)
            assert end["state"] == "done" and end["items_failed"] == 0, end
        for key, (data, want) in items.items():
            assert meta_type(srv, sha(data)) == want, key
        g = get(srv, sha(items["in/page.html"][0]))
        assert g.headers["Content-Security-Policy"] == CSP and "attachment" in \
            g.headers["Content-Disposition"]
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_no_magic_database_no_start(tmp_path):
    bad = tmp_path / "no-such.mgc"
    port = free_port()
    p = subprocess.run([str(BIN_DIR / "blobrefd"), "--listen", f"127.0.0.1:{port}", "--data",
                        str(tmp_path / "data")], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MAGIC=str(bad), ASAN_OPTIONS="detect_leaks=1"))
    assert p.returncode != 0
    assert f"cannot load the magic database {bad}" in p.stderr + p.stdout, p.stderr + p.stdout
