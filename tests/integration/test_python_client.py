"""tools/python/blobref.py against the real blobrefd: every method, 100-continue really skipping
the body of a known blob, PIL reading a JPEG through open() with the bytes fetched counted,
verification of what comes back and the API's error codes in the exceptions."""
import hashlib
import io
import os
import random
import re
import sys
import time

import pytest
import requests

from conftest import ROOT, Server, free_port

sys.path.insert(0, str(ROOT / "tools" / "python"))
import blobref  # noqa: E402

T = 30


def sha(b):
    return hashlib.sha256(b).hexdigest()


def metric(srv, name, labels=""):
    """Sum of the /metrics samples of `name` whose labels contain `labels`."""
    text = requests.get(srv.url + "/metrics", timeout=T).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+]+)$", line)
        if m and m.group(1) == name and labels in (m.group(2) or ""):
            total += float(m.group(3))
    return total


def blob_path(srv, h):
    return srv.data_dir / "blobs" / "sha256" / h[:2] / h[2:4] / h


class CountingSocket:
    """Wraps a connected socket and counts every byte written through it."""

    def __init__(self, sock, counter):
        self._s, self._n = sock, counter

    def sendall(self, data, *a):
        self._n[0] += len(data)
        return self._s.sendall(data, *a)

    def send(self, data, *a):
        n = self._s.send(data, *a)
        self._n[0] += n
        return n

    def __getattr__(self, name):
        return getattr(self._s, name)


@pytest.fixture
def wire(monkeypatch):
    """Counts the bytes every http.client connection opened by the test writes to the wire."""
    import http.client
    counter = [0]
    orig = http.client.HTTPConnection.connect

    def connect(self):
        orig(self)
        self.sock = CountingSocket(self.sock, counter)

    monkeypatch.setattr(http.client.HTTPConnection, "connect", connect)
    return counter


def test_put_bytes_path_and_files(server, tmp_path):
    c = blobref.Client(server.url)
    data = os.urandom(200_000)
    h = c.put(data, content_type="image/x-test")
    assert h == sha(data)
    assert c.last_put == {"sha256": h, "size": len(data), "dedup": False,
                          "url": f"/v1/blobs/{h}"}
    assert c.last_put_bytes_sent == len(data)
    assert c.stat(h)["content_type"] == "image/x-test"
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    assert c.put(p) == h and c.last_put["dedup"] is True          # a pathlib.Path
    assert c.put(str(p)) == h and c.last_put["dedup"] is True     # a str path
    with open(p, "rb") as f:
        f.seek(0)
        assert c.put(f) == h and c.last_put["dedup"] is True      # a seekable file
    r, w = os.pipe()                                             # a file that cannot seek
    other = os.urandom(50_000)   # below the pipe buffer: the write does not block
    os.write(w, other)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        assert c.put(f) == sha(other)
    assert c.last_put["dedup"] is False and c.last_put_bytes_sent == len(other)
    assert c.get(sha(other)) == other
    with open(p, "rb") as f:      # a file positioned mid-way: the rest of it is the blob
        f.seek(1000)
        assert c.put(f) == sha(data[1000:])
    assert c.get(sha(data[1000:])) == data[1000:]
    assert c.put(b"") == sha(b"") and c.get(sha(b"")) == b""
    with pytest.raises(TypeError):
        c.put(12345)


def test_put_path_type_from_extension(server, tmp_path):
    """A path without content_type gets its extension's type (as `blobref put`); bytes and an
    unknown extension stay application/octet-stream; an explicit type wins."""
    c = blobref.Client(server.url)
    cases = [("cat.jpg", b"jpeg bytes", None, "image/jpeg"),
             ("song.MP3", b"mp3 bytes", None, "audio/mpeg"),
             ("data.unknownext", b"\x00\x01opaque\x00", None, "application/octet-stream"),
             ("forced.png", b"forced type", "application/x-forced", "application/x-forced")]
    for name, data, given, want in cases:
        p = tmp_path / name
        p.write_bytes(data)
        h = c.put(p, content_type=given)
        assert c.stat(h)["content_type"] == want, (name, c.stat(h))
    h = c.put(b"\x00raw bytes, no name\x00")  # the server detects nothing in these either
    assert c.stat(h)["content_type"] == "application/octet-stream"


def test_100_continue_skips_the_body_of_a_known_blob(server, wire):
    c = blobref.Client(server.url, expect_timeout=10)   # a loaded test machine: wait long
    data = os.urandom(3 << 20)
    received0 = metric(server, "blobref_received_bytes_total")
    h = c.put(data)
    first_wire = wire[0]
    assert c.last_put["dedup"] is False and c.last_put_bytes_sent == len(data)
    assert first_wire >= len(data)
    assert metric(server, "blobref_received_bytes_total") - received0 == len(data)

    h2 = c.put(data)
    second_wire = wire[0] - first_wire
    assert h2 == h and c.last_put["dedup"] is True
    assert c.last_put_bytes_sent == 0
    assert second_wire < 2048, f"{second_wire} bytes on the wire for a known 3 MiB blob"
    # the server received no body byte either
    assert metric(server, "blobref_received_bytes_total") - received0 == len(data)
    assert metric(server, "blobref_uploads_total", 'result="dedup"') == 1
    assert c.bytes_sent == len(data)


def test_get_and_fetch_many_verify(server):
    c = blobref.Client(server.url)
    blobs = [os.urandom(random.randint(0, 150_000)) for _ in range(40)]
    hashes = [c.put(b) for b in blobs]
    for h, b in zip(hashes[:5], blobs[:5]):
        assert c.get(h) == b
        assert c.get("sha256:" + h.upper()) == b      # the alias, any case
    got = c.fetch_many(hashes + hashes[:3], workers=8)
    assert got == dict(zip(hashes, blobs))
    missing = sha(b"never uploaded")
    with pytest.raises(blobref.NotFound) as e:
        c.fetch_many(hashes[:5] + [missing], workers=4)
    assert e.value.code == "not_found" and e.value.status == 404
    got = c.fetch_many(hashes[:5] + [missing], workers=4, skip_missing=True)
    assert set(got) == set(hashes[:5])
    assert c.fetch_many([]) == {}
    p = c.download(hashes[7], server.data_dir / "copy.bin")
    assert open(p, "rb").read() == blobs[7]


def test_get_detects_bytes_that_do_not_match(server):
    """Bytes altered on disk behind the server's back: small blobs (served from the verified
    cache) are refused by the server with 503, larger ones are sent as they are and the client
    catches them."""
    c = blobref.Client(server.url)
    small = os.urandom(3000)
    hs = c.put(small)
    bad = bytearray(small)
    bad[10] ^= 0xFF
    blob_path(server, hs).write_bytes(bytes(bad))
    with pytest.raises(blobref.BlobrefError) as e:
        c.get(hs)
    assert e.value.status == 503 and e.value.code == "store_unavailable"
    assert not isinstance(e.value, (blobref.NotFound, blobref.DigestMismatch))

    big = os.urandom(300_000)   # above cache_max_blob: sendfile from the file as it is
    hb = c.put(big)
    bad = bytearray(big)
    bad[250_000] ^= 0xFF
    blob_path(server, hb).write_bytes(bytes(bad))
    with pytest.raises(blobref.DigestMismatch) as e:
        c.get(hb)
    assert e.value.code == "digest_mismatch"
    with pytest.raises(blobref.DigestMismatch):
        c.fetch_many([hb])
    f = c.open(hb)
    assert f.read(1000) == big[:1000]      # a part is not verified...
    with pytest.raises(blobref.DigestMismatch):
        f.read()                           # ...reading it all in order is
    with pytest.raises(blobref.DigestMismatch):
        c.download(hb, server.data_dir / "bad.bin")
    assert not (server.data_dir / "bad.bin").exists()


def test_open_is_a_seekable_ranged_file(server):
    c = blobref.Client(server.url)
    data = os.urandom(1_000_000)
    h = c.put(data)
    f = c.open(h, buffer_size=16384)
    assert isinstance(f, io.BufferedReader) and f.seekable() and f.readable()
    assert not f.writable()
    assert f.size == len(data) and f.sha256 == h
    assert f.requests == 1 and f.bytes_fetched == 16384      # the first block, at open
    assert f.read(10) == data[:10] and f.requests == 1
    rng = random.Random(7)
    for _ in range(30):
        off = rng.randrange(len(data))
        n = rng.randrange(1, 50_000)
        f.seek(off)
        assert f.tell() == off
        assert f.read(n) == data[off:off + n]
    assert f.seek(-5, io.SEEK_END) == len(data) - 5
    assert f.read() == data[-5:] and f.read() == b""
    f.seek(len(data) + 10)
    assert f.read(10) == b""
    assert f.bytes_fetched < 31 * (50_000 + 16384)
    f.seek(0)
    assert f.read() == data and f.verified
    f.close()
    with c.open(h) as g:
        out = bytearray(len(data))
        assert g.readinto(out) == len(data) and bytes(out) == data
    e = c.put(b"")
    with c.open(e) as g:
        assert g.size == 0 and g.read() == b"" and g.verified
    with pytest.raises(blobref.NotFound):
        c.open(sha(b"absent"))


def test_pil_reads_a_jpeg_header_through_open(server):
    Image = pytest.importorskip("PIL.Image", reason="python3-pil is not installed")
    rng = random.Random(1)
    img = Image.frombytes("RGB", (1600, 1200), bytes(rng.getrandbits(8) for _ in range(1600 * 1200 * 3)))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=95)
    jpeg = buf.getvalue()
    assert len(jpeg) > 1_000_000
    c = blobref.Client(server.url)
    h = c.put(jpeg, content_type="image/jpeg")
    f = c.open(h)
    im = Image.open(f)
    assert im.format == "JPEG" and im.size == (1600, 1200) and im.mode == "RGB"
    assert f.content_type == "image/jpeg"
    assert f.bytes_fetched <= 65536 and f.bytes_fetched * 10 < len(jpeg), (f.bytes_fetched, len(jpeg))
    assert f.requests == 1
    im.load()                       # decoding reads the rest
    assert im.tobytes() == Image.open(io.BytesIO(jpeg)).tobytes()
    assert f.bytes_fetched == len(jpeg)


def test_lookup_in_batches(server):
    c = blobref.Client(server.url)
    present = [c.put(os.urandom(100)) for _ in range(5)]
    absent = [sha(str(i).encode()) for i in range(25_000)]
    before = metric(server, "blobref_http_requests_total", 'route="/v1/lookup"')
    r = c.lookup(absent[:12_000] + present + absent[12_000:])
    # (a request is counted once its answer is sent: the last one may lag a moment)
    lookups = lambda: metric(server, "blobref_http_requests_total", 'route="/v1/lookup"') - before
    deadline = time.time() + 5
    while lookups() < 3 and time.time() < deadline:
        time.sleep(0.02)
    assert lookups() == 3
    assert sorted(x["sha256"] for x in r["found"]) == sorted(present)
    for x in r["found"]:
        assert x["size"] == 100 and x["url"] == f"/v1/blobs/{x['sha256']}"
    assert len(r["missing"]) == 25_000 and set(r["missing"]) == set(absent)
    assert c.lookup([]) == {"found": [], "missing": []}
    r = c.lookup(["sha256:" + present[0]], batch_size=1)
    assert [x["sha256"] for x in r["found"]] == [present[0]]


def test_stat_and_quarantine(server):
    c = blobref.Client(server.url)
    data = b"stat me"
    h = c.put(data, content_type="text/plain")
    st = c.stat(h)
    assert st["sha256"] == h and st["size"] == len(data) and st["state"] == "live"
    assert st["content_type"] == "text/plain" and st["locations"][0]["store"] == "local"
    assert c.exists(h) and not c.exists(sha(b"nope"))
    with pytest.raises(blobref.NotFound) as e:
        c.stat(sha(b"nope"))
    assert (e.value.code, e.value.status) == ("not_found", 404)
    # quarantine by hand (no [token]: every client is admin)
    r = requests.delete(f"{server.url}/v1/blobs/{h}?reason=test", timeout=T)
    assert r.status_code == 200, r.text
    assert c.stat(h)["state"] == "quarantined"
    for call in (lambda: c.get(h), lambda: c.open(h), lambda: c.fetch_many([h])):
        with pytest.raises(blobref.Quarantined) as e:
            call()
        assert (e.value.code, e.value.status) == ("quarantined", 410)
        assert isinstance(e.value, blobref.BlobrefError)
    assert c.fetch_many([h], skip_missing=True) == {}
    assert not c.exists(h)


def test_iter_blobs(server):
    c = blobref.Client(server.url)
    r = requests.get(f"{server.url}/v1/blobs?limit=1", timeout=T)
    if r.status_code in (404, 405) and r.json()["error"]["code"] in ("no_route",
                                                                      "method_not_allowed"):
        pytest.skip("GET /v1/blobs (the listing) is not on this branch: the server answers "
                    f"{r.status_code} {r.json()['error']['code']}")
    hashes = sorted(c.put(os.urandom(50)) for _ in range(25))
    listed = [b["sha256"] for b in c.iter_blobs(limit=7)]
    assert listed == hashes
    assert [b["sha256"] for b in c.iter_blobs(after=hashes[9], limit=4)] == hashes[10:]
    requests.delete(f"{server.url}/v1/blobs/{hashes[3]}", timeout=T)
    assert [b["sha256"] for b in c.iter_blobs(state="quarantined")] == [hashes[3]]
    assert hashes[3] not in [b["sha256"] for b in c.iter_blobs(state="live")]


def test_iter_blobs_follows_the_listing_contract():
    """The paging logic against a stand-in for GET /v1/blobs (the contract: `{"blobs": [...],
    "next": hex or null}`, `after`, `limit`, `state`), while the real endpoint is not here."""
    import http.server
    import json
    import threading
    import urllib.parse
    keys = sorted(sha(str(i).encode()) for i in range(23))
    seen = []

    class Listing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            u = urllib.parse.urlsplit(self.path)
            q = dict(urllib.parse.parse_qsl(u.query))
            seen.append(q)
            after, limit = q.get("after", ""), int(q["limit"])
            rest = [k for k in keys if k > after]
            page = rest[:limit]
            body = json.dumps({"blobs": [{"sha256": k, "size": 1, "state": q.get("state", "live")}
                                         for k in page],
                               "next": page[-1] if len(rest) > limit else None}).encode()
            self.send_response(200 if u.path == "/v1/blobs" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listing)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        c = blobref.Client(f"http://127.0.0.1:{httpd.server_address[1]}")
        assert [b["sha256"] for b in c.iter_blobs(limit=5)] == keys
        assert [q.get("after") for q in seen] == [None] + [keys[i] for i in (4, 9, 14, 19)]
        assert all(q["limit"] == "5" for q in seen) and c.requests == 5
        seen.clear()
        got = list(c.iter_blobs(state="quarantined", after="sha256:" + keys[19], limit=100))
        assert [b["sha256"] for b in got] == keys[20:] and got[0]["state"] == "quarantined"
        assert seen == [{"limit": "100", "after": keys[19], "state": "quarantined"}]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_error_codes(tmp_path):
    token = "br_" + "ab" * 32
    conf = (f"[server]\nmax_blob_size = 100KiB\n[auth]\nanonymous = none\n"
            f"[token w]\nsha256 = {sha(token.encode())}\nscopes = read, write\n")
    srv = Server(tmp_path / "data", config_text=conf).start()
    try:
        anon = blobref.Client(srv.url)
        c = blobref.Client(srv.url, token=token)
        h = c.put(b"with a token")
        assert c.get(h) == b"with a token"
        for call in (lambda: anon.put(b"x"), lambda: anon.get(h), lambda: anon.open(h),
                     lambda: anon.stat(h), lambda: anon.lookup([h])):
            with pytest.raises(blobref.BlobrefError) as e:
                call()
            assert (e.value.code, e.value.status) == ("unauthorized", 401), e.value
        with pytest.raises(blobref.BlobrefError) as e:
            blobref.Client(srv.url, token="br_" + "00" * 32).get(h)
        assert (e.value.code, e.value.status) == ("unauthorized", 401)
        big = os.urandom(200 * 1024)
        with pytest.raises(blobref.BlobrefError) as e:
            c.put(big)
        assert (e.value.code, e.value.status) == ("too_large", 413)
        assert c.last_put_bytes_sent == 0        # refused on its headers: no body sent
        with pytest.raises(blobref.BlobrefError) as e:
            c.get("not-a-hash")
        assert e.value.code == "bad_hash" and e.value.status is None
        with pytest.raises(blobref.NotFound) as e:
            c._json("GET", "/v1/nowhere")
        assert e.value.code == "no_route"
    finally:
        assert srv.stop() == 0
    with pytest.raises(blobref.BlobrefError) as e:
        blobref.Client(f"http://127.0.0.1:{free_port()}", timeout=5).get(sha(b"x"))
    assert e.value.code == "connection_error" and e.value.status is None


def test_client_from_environment(server, monkeypatch):
    monkeypatch.setenv("BLOBREF_SERVER", server.url)
    c = blobref.Client()
    assert c.url == server.url
    h = c.put(b"env")
    assert c.get(h) == b"env"
