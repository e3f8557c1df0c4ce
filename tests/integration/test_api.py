"""HTTP API of blobrefd against a real daemon: every documented status, headers, Range, 100-continue,
redirect mode, /meta, /v1/lookup, health, routing and concurrent identical uploads."""
import calendar
import json
import os
import random
import threading
import time

import pytest
import requests

from conftest import Server
from util_http import (TIMEOUT, HEX_RE, RFC3339_RE, RawConn, assert_error, assert_raw_error,
                       blob_files, curl, get, healthy, lookup, non_object_files, object_key,
                       object_path, parse_ranges, post, put, repr_digest, request_head, sha,
                       fsck, raw_exchange)

BLOB_10K = bytes(random.Random(10000).randrange(256) for _ in range(10000))


@pytest.fixture(scope="module")
def mserver(tmp_path_factory):
    """One server shared by the read-only tests of this module (holds BLOB_10K as text/plain)."""
    srv = Server(tmp_path_factory.mktemp("api") / "data").start()
    r = put(srv, BLOB_10K, headers={"Content-Type": "text/plain; charset=utf-8"})
    assert r.status_code == 201, (r.status_code, r.text)
    yield srv
    alive = srv.alive()
    rc = srv.stop()
    assert alive, "blobrefd died during the test:\n" + srv.read_log()
    assert rc == 0, f"blobrefd exited {rc} on SIGTERM:\n" + srv.read_log()


H10K = sha(BLOB_10K)


def rnd(n, seed=None):
    return random.Random(seed).randbytes(n) if seed is not None else os.urandom(n)


# ---------------------------------------------------------------------------------------------
# Uploads


def test_put_new_then_dedup_writes_nothing(server):
    data = rnd(70000)
    h = sha(data)
    r = put(server, data)
    assert r.status_code == 201, r.text
    assert r.json() == {"sha256": h, "size": 70000, "dedup": False, "url": f"/v1/blobs/{h}"}
    p = object_path(server, h)
    assert p.read_bytes() == data
    before = blob_files(server.data_dir / "blobs")
    time.sleep(0.02)
    r = put(server, data)
    assert r.status_code == 200, r.text
    assert r.json() == {"sha256": h, "size": 70000, "dedup": True, "url": f"/v1/blobs/{h}"}
    # Nothing written: the same files, same inodes, same mtimes.
    assert blob_files(server.data_dir / "blobs") == before
    assert non_object_files(server.data_dir / "blobs") == []


def test_put_sha256_prefix_alias(server):
    data = b"alias prefix body"
    h = sha(data)
    r = put(server, data, hexd="sha256:" + h)
    assert r.status_code == 201, r.text
    assert r.json()["sha256"] == h and r.json()["url"] == f"/v1/blobs/{h}"
    r = get(server, "sha256:" + h)
    assert r.status_code == 200 and r.content == data


def test_put_empty_blob(server):
    h = sha(b"")
    r = put(server, b"")
    assert r.status_code == 201, r.text
    assert r.json() == {"sha256": h, "size": 0, "dedup": False, "url": f"/v1/blobs/{h}"}
    r = get(server, h)
    assert r.status_code == 200 and r.content == b""
    assert r.headers["Content-Length"] == "0"
    r = get(server, h, headers={"Range": "bytes=0-"})
    assert r.status_code == 416
    assert r.headers["Content-Range"] == "bytes */0"


BAD_IDS = [
    "a" * 63, "a" * 65, "A" * 64, "ABCDEF" + "0" * 58, "g" * 64, "z" + "0" * 63,
    "sha256:" + "a" * 63, "sha256:" + "A" * 64, "sha256:" + "g" * 64, "sha256:", "sha256",
    "SHA256:" + "a" * 64, "md5:" + "a" * 32, "sha256:sha256:" + "a" * 64, "%20" + "a" * 64,
    "a" * 64 + "%20", "a" * 32 + "-" + "a" * 31, "0x" + "a" * 62, "a" * 128,
]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_hash_every_method(mserver, bad):
    url = f"{mserver.url}/v1/blobs/{bad}"
    assert_error(requests.put(url, data=b"x", timeout=TIMEOUT), 400, "bad_hash")
    assert_error(requests.get(url, timeout=TIMEOUT), 400, "bad_hash")
    assert_error(requests.get(url + "/meta", timeout=TIMEOUT), 400, "bad_hash")
    r = requests.head(url, timeout=TIMEOUT)
    assert r.status_code == 400 and r.content == b""


def test_bad_hash_empty_id(mserver):
    # api.md lists "empty" among the malformed ids: /v1/blobs/ names the blob route with an empty id.
    assert_error(requests.put(f"{mserver.url}/v1/blobs/", data=b"x", timeout=TIMEOUT), 400,
                 "bad_hash")
    assert_error(requests.get(f"{mserver.url}/v1/blobs/", timeout=TIMEOUT), 400, "bad_hash")


def test_digest_mismatch_keeps_nothing(server):
    data = rnd(50000)
    claimed = sha(b"something else")
    r = put(server, data, hexd=claimed)
    assert_error(r, 400, "digest_mismatch")
    assert blob_files(server.data_dir / "blobs") == {}
    assert_error(get(server, claimed), 404, "not_found")
    assert_error(get(server, sha(data)), 404, "not_found")
    assert lookup(server, [claimed, sha(data)]).json() == {"found": [],
                                                           "missing": [claimed, sha(data)]}
    # The right hash afterwards still works.
    assert put(server, data).status_code == 201


def test_post_new_then_dedup(server):
    data = rnd(12345)
    h = sha(data)
    r = post(server, data)
    assert r.status_code == 201, r.text
    assert r.json() == {"sha256": h, "size": 12345, "dedup": False, "url": f"/v1/blobs/{h}"}
    before = blob_files(server.data_dir / "blobs")
    r = post(server, data)
    assert r.status_code == 200, r.text
    assert r.json() == {"sha256": h, "size": 12345, "dedup": True, "url": f"/v1/blobs/{h}"}
    assert blob_files(server.data_dir / "blobs") == before
    # A PUT of the same bytes is a dedup too.
    r = put(server, data)
    assert r.status_code == 200 and r.json()["dedup"] is True
    assert get(server, h).content == data


def test_chunked_put_and_post(server):
    data = rnd(300000)

    def gen():
        for i in range(0, len(data), 7000):
            yield data[i:i + 7000]

    r = put(server, gen(), hexd=sha(data))
    assert r.status_code == 201, r.text
    assert r.json()["size"] == len(data)
    data2 = rnd(100001)

    def gen2():
        for i in range(0, len(data2), 4096):
            yield data2[i:i + 4096]

    r = post(server, gen2())
    assert r.status_code == 201, r.text
    assert r.json()["sha256"] == sha(data2) and r.json()["size"] == 100001
    assert get(server, sha(data)).content == data
    assert get(server, sha(data2)).content == data2


def test_content_type_stored_and_default(server):
    a, b, c = b"png-ish bytes", b"no type given", b"\x00\x01opaque\x00"
    assert put(server, a, headers={"Content-Type": "image/png"}).status_code == 201
    assert post(server, b).status_code == 201
    assert post(server, c).status_code == 201
    r = get(server, sha(a))
    assert r.headers["Content-Type"] == "image/png"
    assert requests.get(f"{server.url}/v1/blobs/{sha(a)}/meta",
                        timeout=TIMEOUT).json()["content_type"] == "image/png"
    r = get(server, sha(b))
    assert r.headers["Content-Type"] == "text/plain"  # detected from the bytes
    r = get(server, sha(c))
    assert r.headers["Content-Type"] == "application/octet-stream"  # nothing detected
    r = requests.head(f"{server.url}/v1/blobs/{sha(a)}", timeout=TIMEOUT)
    assert r.headers["Content-Type"] == "image/png"


def test_bad_content_type(server):
    data = b"ct too long"
    r = put(server, data, headers={"Content-Type": "a/" + "b" * 300})
    assert_error(r, 400, "bad_content_type")
    r = post(server, data, headers={"Content-Type": "text/plain\x01x"})
    assert_error(r, 400, "bad_content_type")
    assert_error(get(server, sha(data)), 404, "not_found")
    # 255 characters is still fine.
    ct = "a/" + "b" * 253
    assert put(server, data, headers={"Content-Type": ct}).status_code == 201
    assert get(server, sha(data)).headers["Content-Type"] == ct


LIMIT_CONF = """[server]
max_blob_size = 1MiB
max_lookup_hashes = 100
max_json_size = 1MiB
"""


@pytest.fixture
def small_server(tmp_path):
    srv = Server(tmp_path / "data", config_text=LIMIT_CONF).start()
    yield srv
    alive = srv.alive()
    rc = srv.stop()
    assert alive, srv.read_log()
    assert rc == 0, srv.read_log()


def test_too_large_by_content_length(small_server):
    srv = small_server
    big = rnd(1024 * 1024 + 1)
    head = request_head("PUT", f"/v1/blobs/{sha(big)}", [("Content-Length", str(len(big)))])
    resp, _ = raw_exchange(srv, head, b"")  # answered without sending any body byte
    assert resp is not None, "server closed without an answer"
    assert_raw_error(resp, 413, "too_large")
    head = request_head("POST", "/v1/blobs", [("Content-Length", str(10 * 1024 ** 3))])
    resp, _ = raw_exchange(srv, head, b"")
    assert_raw_error(resp, 413, "too_large")
    # Exactly the limit is accepted.
    ok = rnd(1024 * 1024)
    assert put(srv, ok).status_code == 201
    assert get(srv, sha(big)).status_code == 404
    assert non_object_files(srv.data_dir / "blobs") == []
    assert list(blob_files(srv.data_dir / "blobs")) == [object_key(sha(ok))]


@pytest.mark.parametrize("method", ["PUT", "POST"])
def test_too_large_chunked(small_server, method):
    srv = small_server
    piece = rnd(64 * 1024)
    total = 40  # 2.5 MiB > 1 MiB
    data = piece * total
    path = f"/v1/blobs/{sha(data)}" if method == "PUT" else "/v1/blobs"
    head = request_head(method, path, [("Transfer-Encoding", "chunked")])

    def body():
        for _ in range(total):
            yield b"%x\r\n" % len(piece) + piece + b"\r\n"
        yield b"0\r\n\r\n"

    resp, sent = raw_exchange(srv, head, body)
    assert resp is not None, "server closed without an answer"
    assert_raw_error(resp, 413, "too_large")
    assert wait_no_files(srv)
    assert get(srv, sha(data)).status_code == 404
    assert healthy(srv)


def wait_no_files(srv):
    deadline = time.time() + 5
    while time.time() < deadline:
        if blob_files(srv.data_dir / "blobs") == {}:
            return True
        time.sleep(0.05)
    print("left:", blob_files(srv.data_dir / "blobs"))
    return False


# ---------------------------------------------------------------------------------------------
# Reads


def check_blob_headers(r, data, ctype):
    h = sha(data)
    assert r.headers["ETag"] == f'"{h}"'
    assert r.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert r.headers["Accept-Ranges"] == "bytes"
    assert r.headers["Repr-Digest"] == repr_digest(data)
    assert r.headers["Content-Type"] == ctype
    assert r.headers["Content-Length"] == str(len(data))


def test_get_full_and_headers(mserver):
    r = get(mserver, H10K)
    assert r.status_code == 200
    assert r.content == BLOB_10K
    check_blob_headers(r, BLOB_10K, "text/plain; charset=utf-8")


def test_get_large_blob_byte_identical(server):
    data = rnd(3 * 1024 * 1024 + 17)
    assert put(server, data).status_code == 201
    r = get(server, sha(data))
    assert r.status_code == 200 and r.content == data
    check_blob_headers(r, data, "application/octet-stream")
    rc, out, err = curl("-o", "-", f"{server.url}/v1/blobs/{sha(data)}")
    assert rc == 0, err
    assert out == data


def test_head_same_headers_no_body(mserver):
    r = requests.head(f"{mserver.url}/v1/blobs/{H10K}", timeout=TIMEOUT)
    assert r.status_code == 200
    check_blob_headers(r, BLOB_10K, "text/plain; charset=utf-8")
    # On the wire: no body after the headers (the next bytes are the next response).
    c = RawConn(mserver)
    c.send(request_head("HEAD", f"/v1/blobs/{H10K}") + request_head("GET", "/healthz"))
    head = c.read_response(head_only=True)
    assert head.status == 200 and head.header("content-length") == "10000"
    nxt = c.read_response()
    assert nxt.status == 200 and json.loads(nxt.body)["status"] == "ok"
    c.close()


def test_get_unknown_is_404(mserver):
    assert_error(get(mserver, "0" * 64), 404, "not_found")
    assert_error(requests.get(f"{mserver.url}/v1/blobs/{'0' * 64}/meta", timeout=TIMEOUT), 404,
                 "not_found")
    r = requests.head(f"{mserver.url}/v1/blobs/{'0' * 64}", timeout=TIMEOUT)
    assert r.status_code == 404 and r.content == b""


def rng(mserver, spec, extra=None):
    headers = {"Range": spec}
    headers.update(extra or {})
    return get(mserver, H10K, headers=headers)


@pytest.mark.parametrize("spec,first,last", [
    ("bytes=0-499", 0, 499),          # RFC 9110 14.1.2 examples
    ("bytes=500-999", 500, 999),
    ("bytes=-500", 9500, 9999),
    ("bytes=9500-", 9500, 9999),
    ("bytes=0-0", 0, 0),
    ("bytes=-1", 9999, 9999),
    ("bytes=9990-20000", 9990, 9999),  # last-pos past the end is clamped
    ("bytes=-20000", 0, 9999),         # suffix longer than the blob: the whole blob
    ("bytes=0-", 0, 9999),
])
def test_single_range(mserver, spec, first, last):
    r = rng(mserver, spec)
    assert r.status_code == 206, (spec, r.status_code, r.text[:200])
    assert r.headers["Content-Range"] == f"bytes {first}-{last}/10000"
    assert r.headers["Content-Length"] == str(last - first + 1)
    assert r.headers["ETag"] == f'"{H10K}"'
    assert r.content == BLOB_10K[first:last + 1]


def check_multipart(r, expect):
    assert r.status_code == 206, r.status_code
    assert r.headers["Content-Type"].startswith("multipart/byteranges; boundary=")
    assert int(r.headers["Content-Length"]) == len(r.content)
    parts = parse_ranges(r.status_code, r.headers, r.content)
    assert [(p[0], p[1]) for p in parts] == expect
    for first, last, total, data, ph in parts:
        assert total == 10000
        assert data == BLOB_10K[first:last + 1]
        assert ph.get("content-type") == "text/plain; charset=utf-8"


def test_multi_range_rfc_example(mserver):
    check_multipart(rng(mserver, "bytes=0-0,-1"), [(0, 0), (9999, 9999)])


def test_multi_range_three(mserver):
    check_multipart(rng(mserver, "bytes=0-9, 20-29,100-199"), [(0, 9), (20, 29), (100, 199)])


def test_multi_range_64_allowed_65_rejected(mserver):
    spec = "bytes=" + ",".join(f"{i * 100}-{i * 100 + 9}" for i in range(64))
    check_multipart(rng(mserver, spec), [(i * 100, i * 100 + 9) for i in range(64)])
    spec = "bytes=" + ",".join(f"{i * 100}-{i * 100 + 9}" for i in range(65))
    r = rng(mserver, spec)
    assert_error(r, 416, "bad_range")


def test_multi_range_some_unsatisfiable(mserver):
    # RFC 9110 14.1.1: satisfiable when any range is; only satisfiable ranges are sent.
    r = rng(mserver, "bytes=0-9,20000-30000")
    assert r.status_code == 206
    parts = parse_ranges(r.status_code, r.headers, r.content)
    assert [(p[0], p[1], p[3]) for p in parts] == [(0, 9, BLOB_10K[0:10])]


@pytest.mark.parametrize("spec", ["bytes=10000-", "bytes=20000-30000", "bytes=10000-10000",
                                  "bytes=-0", "bytes=10000-,20000-"])
def test_unsatisfiable_416(mserver, spec):
    r = rng(mserver, spec)
    assert_error(r, 416, "range_not_satisfiable")
    assert r.headers["Content-Range"] == "bytes */10000"


@pytest.mark.parametrize("spec", ["bytes=", "bytes=abc", "bytes=5-2", "bytes=1-2-3", "bytes=--1",
                                  "bytes=-", "bytes=x-1", "bytes=1-x", "bytes=0-1;2-3",
                                  "bytes=+1-2", "bytes=0x10-0x20", "bytes=1.5-2"])
def test_malformed_range_416(mserver, spec):
    assert_error(rng(mserver, spec), 416, "bad_range")


def test_huge_range_number(mserver):
    # Syntactically a range, numerically beyond any size: 416, whichever code.
    r = rng(mserver, "bytes=99999999999999999999999999-")
    assert r.status_code == 416
    assert r.json()["error"]["code"] in ("bad_range", "range_not_satisfiable")
    assert healthy(mserver)


@pytest.mark.parametrize("spec", ["items=0-5", "Bytes0-5", "none"])
def test_non_bytes_unit_ignored(mserver, spec):
    r = rng(mserver, spec)
    assert r.status_code == 200
    assert r.content == BLOB_10K


def test_if_range(mserver):
    r = rng(mserver, "bytes=0-99", {"If-Range": f'"{H10K}"'})
    assert r.status_code == 206 and r.content == BLOB_10K[:100]
    r = rng(mserver, "bytes=0-99", {"If-Range": f'"{"1" * 64}"'})
    assert r.status_code == 200 and r.content == BLOB_10K
    # If-Range needs a strong match (RFC 9110 13.1.5): a weak tag never matches.
    r = rng(mserver, "bytes=0-99", {"If-Range": f'W/"{H10K}"'})
    assert r.status_code == 200 and r.content == BLOB_10K
    # A date cannot match: the server sends no Last-Modified.
    r = rng(mserver, "bytes=0-99", {"If-Range": "Tue, 15 Nov 1994 08:12:31 GMT"})
    assert r.status_code == 200 and r.content == BLOB_10K


@pytest.mark.parametrize("inm", [None, "*", '"1111", "{h}"', 'W/"{h}"'])
def test_if_none_match_304(mserver, inm):
    inm = f'"{H10K}"' if inm is None else inm.replace("{h}", H10K)
    r = get(mserver, H10K, headers={"If-None-Match": inm})
    assert r.status_code == 304, (inm, r.status_code)
    assert r.content == b""
    assert r.headers["ETag"] == f'"{H10K}"'
    r = requests.head(f"{mserver.url}/v1/blobs/{H10K}", headers={"If-None-Match": inm},
                      timeout=TIMEOUT)
    assert r.status_code == 304


def test_if_none_match_mismatch_200(mserver):
    r = get(mserver, H10K, headers={"If-None-Match": '"' + "2" * 64 + '"'})
    assert r.status_code == 200 and r.content == BLOB_10K
    # If-None-Match wins over Range (RFC 9110 13.2.2 order).
    r = get(mserver, H10K, headers={"If-None-Match": f'"{H10K}"', "Range": "bytes=0-1"})
    assert r.status_code == 304


# ---------------------------------------------------------------------------------------------
# Redirect mode


def redirect_conf(tmp_path, extra=""):
    return f"""[server]
{extra}
[store local]
kind = fs
root = {tmp_path}/data/blobs
serve = redirect
public_url = http://cdn.example/b
"""


def test_redirect_mode(tmp_path):
    srv = Server(tmp_path / "data", config_text=redirect_conf(tmp_path)).start()
    try:
        data = rnd(5000)
        h = sha(data)
        assert put(srv, data).status_code == 201
        r = requests.get(f"{srv.url}/v1/blobs/{h}", allow_redirects=False, timeout=TIMEOUT)
        assert r.status_code == 307, r.status_code
        assert r.headers["Location"] == f"http://cdn.example/b/{object_key(h)}"
        assert r.headers["Cache-Control"] == "private, max-age=60"
        # a HEAD is answered from the index (a presigned redirect target may be GET-only)
        r = requests.head(f"{srv.url}/v1/blobs/{h}", allow_redirects=False, timeout=TIMEOUT)
        assert r.status_code == 200 and "Location" not in r.headers, r.headers
        assert r.headers["Content-Length"] == str(len(data)) and r.headers["ETag"] == f'"{h}"'
        r = get(srv, "sha256:" + h, allow_redirects=False)
        assert r.status_code == 307
        assert r.headers["Location"] == f"http://cdn.example/b/{object_key(h)}"
        assert_error(get(srv, "3" * 64, allow_redirects=False), 404, "not_found")
        assert srv.alive()
    finally:
        assert srv.stop() == 0


def test_redirect_cache_max_age_and_prefix(tmp_path):
    conf = redirect_conf(tmp_path, "cache_max_age = 5m") + "prefix = pre/\n"
    srv = Server(tmp_path / "data", config_text=conf).start()
    try:
        data = rnd(100)
        h = sha(data)
        assert put(srv, data).status_code == 201
        assert (tmp_path / "data" / "blobs" / object_key(h, "pre/")).read_bytes() == data
        r = get(srv, h, allow_redirects=False)
        assert r.status_code == 307
        assert r.headers["Location"] == f"http://cdn.example/b/{object_key(h, 'pre/')}"
        assert r.headers["Cache-Control"] == "private, max-age=300"
    finally:
        assert srv.stop() == 0


# ---------------------------------------------------------------------------------------------
# /meta


def parse_time(s):
    assert RFC3339_RE.match(s), s
    return calendar.timegm(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S"))


@pytest.fixture
def touch_server(tmp_path):
    """dedup_touch_interval = 0s: every dedup hit refreshes last_upload_at (conf/blobref.conf)."""
    srv = Server(tmp_path / "data", config_text="[server]\ndedup_touch_interval = 0s\n").start()
    yield srv
    alive = srv.alive()
    rc = srv.stop()
    assert alive and rc == 0, srv.read_log()


def test_meta_fields(touch_server):
    server = touch_server
    data = rnd(4321)
    h = sha(data)
    t0 = time.time()
    assert put(server, data, headers={"Content-Type": "audio/ogg"}).status_code == 201
    m = requests.get(f"{server.url}/v1/blobs/{h}/meta", timeout=TIMEOUT)
    assert m.status_code == 200
    assert m.headers["Content-Type"].startswith("application/json")
    m = m.json()
    assert m["sha256"] == h and m["size"] == 4321 and m["content_type"] == "audio/ogg"
    assert m["state"] == "live"
    created = parse_time(m["created_at"])
    assert abs(created - t0) < 120
    assert parse_time(m["last_upload_at"]) >= created
    assert len(m["locations"]) == 1
    loc = m["locations"][0]
    assert loc["store"] == "local" and loc["key"] == object_key(h) and loc["role"] == "primary"
    assert "verified_at" in loc
    # A dedup hit moves last_upload_at, never created_at.
    time.sleep(1.1)
    assert put(server, data).status_code == 200
    m2 = requests.get(f"{server.url}/v1/blobs/sha256:{h}/meta", timeout=TIMEOUT).json()
    assert m2["created_at"] == m["created_at"]
    assert parse_time(m2["last_upload_at"]) > parse_time(m["last_upload_at"])
    assert m2["size"] == 4321 and m2["content_type"] == "audio/ogg"


def test_meta_dedup_touch_throttled_by_default(server):
    # Default dedup_touch_interval = 60s: a hit within a minute of the last one changes nothing.
    data = rnd(99)
    assert put(server, data).status_code == 201
    m = requests.get(f"{server.url}/v1/blobs/{sha(data)}/meta", timeout=TIMEOUT).json()
    time.sleep(1.1)
    assert put(server, data).status_code == 200
    assert requests.get(f"{server.url}/v1/blobs/{sha(data)}/meta", timeout=TIMEOUT).json() == m


# ---------------------------------------------------------------------------------------------
# /v1/lookup


def upload_many(srv, blobs, workers=8):
    """Uploads blobs (list of bytes) with a few keep-alive sessions; returns the statuses."""
    out = [None] * len(blobs)

    def work(k):
        s = requests.Session()
        for i in range(k, len(blobs), workers):
            out[i] = s.put(f"{srv.url}/v1/blobs/{sha(blobs[i])}", data=blobs[i],
                           timeout=TIMEOUT).status_code
        s.close()

    ts = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def test_lookup_large_mixed(server):
    n_present = 5000
    blobs = [b"lookup-%d" % i for i in range(n_present)]
    st = upload_many(server, blobs)
    assert st == [201] * n_present
    present = [sha(b) for b in blobs]
    missing = [sha(b"missing-%d" % i) for i in range(n_present + 10)]
    order = present + missing
    random.Random(7).shuffle(order)
    sent = [("sha256:" + h) if i % 3 == 0 else h for i, h in enumerate(order)]
    r = lookup(server, sent)
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    pset = set(present)
    want_found = [h for h in order if h in pset]
    assert [f["sha256"] for f in body["found"]] == want_found
    for f in body["found"]:
        assert f["url"] == f"/v1/blobs/{f['sha256']}"
    sizes = {sha(b): len(b) for b in blobs}
    assert all(f["size"] == sizes[f["sha256"]] for f in body["found"])
    assert body["missing"] == [h for h in order if h not in pset]  # in the order asked
    assert all(HEX_RE.match(m) for m in body["missing"])


def test_lookup_empty_and_small(mserver):
    r = lookup(mserver, [])
    assert r.status_code == 200 and r.json() == {"found": [], "missing": []}
    r = lookup(mserver, ["f" * 64, "sha256:" + H10K, "e" * 64])
    want = {"found": [{"sha256": H10K, "size": 10000, "url": f"/v1/blobs/{H10K}"}],
            "missing": ["f" * 64, "e" * 64]}
    assert r.json() == want
    # compact JSON and a newline, as every other answer (written in place, not by jansson)
    assert r.content == json.dumps(want, separators=(",", ":")).encode() + b"\n"
    assert r.headers["Content-Type"] == "application/json"
    assert r.headers["Cache-Control"] == "no-store"


def test_lookup_limits(small_server):
    srv = small_server
    r = lookup(srv, ["a" * 64] * 100)
    assert r.status_code == 200
    assert_error(lookup(srv, ["a" * 64] * 101), 413, "too_many_hashes")
    assert_error(lookup(srv, ["b" * 64] * 5000), 413, "too_many_hashes")


def test_lookup_bad_hash_names_index(mserver):
    hashes = ["a" * 64] * 12345 + ["nothex"] + ["b" * 64]
    body = assert_error(lookup(mserver, hashes), 400, "bad_hash")
    assert "12345" in body["error"]["message"], body


# ---------------------------------------------------------------------------------------------
# Health, routing


def test_health_ready(mserver):
    r = requests.get(mserver.url + "/healthz", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = requests.get(mserver.url + "/readyz", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json() == {"status": "ready"}


@pytest.mark.parametrize("path", ["/", "/nope", "/v1", "/v1/", "/v2/blobs", "/v1/blobsx",
                                  "/healthzz", f"/v1/blobs/{'a' * 64}/metax",
                                  f"/v1/blobs/{'a' * 64}/meta/x", "/v1/lookup/x"])
def test_no_route(mserver, path):
    assert_error(requests.get(mserver.url + path, timeout=TIMEOUT), 404, "no_route")


@pytest.mark.parametrize("method,path,allowed", [
    ("POST", "/healthz", {"GET"}),
    ("PUT", "/readyz", {"GET"}),
    ("GET", "/v1/lookup", {"POST"}),
    ("PUT", "/v1/blobs", {"GET", "HEAD", "POST"}),  # GET lists the index
    ("POST", f"/v1/blobs/{'a' * 64}", {"GET", "HEAD", "PUT"}),
    ("PUT", f"/v1/blobs/{'a' * 64}/meta", {"GET"}),
    ("PATCH", f"/v1/blobs/{'a' * 64}", {"GET", "HEAD", "PUT"}),
])
def test_method_not_allowed(mserver, method, path, allowed):
    r = requests.request(method, mserver.url + path, data=b"", timeout=TIMEOUT)
    assert_error(r, 405, "method_not_allowed")
    allow = {m.strip() for m in r.headers["Allow"].split(",")}
    assert allowed <= allow, allow
    assert method not in allow


# ---------------------------------------------------------------------------------------------
# Expect: 100-continue


def test_expect_100_known_blob_answered_before_body(mserver):
    c = RawConn(mserver)
    c.send(request_head("PUT", f"/v1/blobs/{H10K}", [("Content-Length", str(10 * 1024 * 1024)),
                                                      ("Expect", "100-continue")]))
    head_bytes = c.sent
    r = c.read_response()
    assert r.status == 200, (r.status, r.body)
    assert json.loads(r.body) == {"sha256": H10K, "size": 10000, "dedup": True,
                                  "url": f"/v1/blobs/{H10K}"}
    assert (r.header("connection") or "").lower() == "close"
    assert c.sent == head_bytes  # not one body byte was sent
    assert c.closed_by_peer(5)
    c.close()


def test_expect_100_known_blob_curl(mserver, tmp_path):
    f = tmp_path / "body"
    f.write_bytes(BLOB_10K * 200)  # curl only sees a file; the server decides by the URL's hash
    rc, out, err = curl("-o", str(tmp_path / "resp"), "-w", "%{http_code} %{size_upload}",
                        "-H", "Expect: 100-continue", "-T", str(f),
                        f"{mserver.url}/v1/blobs/{H10K}")
    assert rc == 0, err
    code, uploaded = out.decode().split()
    assert code == "200" and float(uploaded) == 0, out
    assert json.loads((tmp_path / "resp").read_bytes())["dedup"] is True


def test_expect_100_unknown_blob(server, tmp_path):
    data = rnd(200000)
    h = sha(data)
    c = RawConn(server)
    c.send(request_head("PUT", f"/v1/blobs/{h}", [("Content-Length", str(len(data))),
                                                   ("Expect", "100-continue")]))
    first = c.read_until(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 100 Continue\r\n"), first
    c.send(data)
    r = c.read_response()
    assert r.status == 201, r.body
    assert json.loads(r.body)["sha256"] == h
    c.close()
    assert get(server, h).content == data
    # curl too: everything uploaded, 201.
    data2 = rnd(300000)
    f = tmp_path / "b2"
    f.write_bytes(data2)
    rc, out, err = curl("-o", "/dev/null", "-w", "%{http_code} %{size_upload}",
                        "-H", "Expect: 100-continue", "-T", str(f),
                        f"{server.url}/v1/blobs/{sha(data2)}")
    assert rc == 0, err
    code, uploaded = out.decode().split()
    assert code == "201" and int(float(uploaded)) == len(data2)


# ---------------------------------------------------------------------------------------------
# Concurrency


@pytest.mark.parametrize("method", ["PUT", "POST"])
def test_50_identical_concurrent_uploads(server, method):
    data = rnd(512 * 1024)
    h = sha(data)
    n = 50
    barrier = threading.Barrier(n)
    results = [None] * n

    def one(i):
        s = requests.Session()
        try:
            barrier.wait(timeout=30)
            if method == "PUT":
                r = s.put(f"{server.url}/v1/blobs/{h}", data=data, timeout=60)
            else:
                r = s.post(f"{server.url}/v1/blobs", data=data, timeout=60)
            results[i] = (r.status_code, r.json())
        except Exception as e:  # noqa: BLE001 - recorded and asserted below
            results[i] = ("error", repr(e))
        finally:
            s.close()

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    codes = [r[0] for r in results]
    assert all(c in (200, 201) for c in codes), results
    assert codes.count(201) == 1, codes
    for code, body in results:
        assert body == {"sha256": h, "size": len(data), "dedup": code == 200,
                        "url": f"/v1/blobs/{h}"}
    files = blob_files(server.data_dir / "blobs")
    assert list(files) == [object_key(h)], files
    assert object_path(server, h).read_bytes() == data
    assert get(server, h).content == data
    rc, blobs, problems, out = fsck(server.data_dir, verify=True)
    assert (rc, blobs, problems) == (0, 1, 0), out


def test_no_space_507(tmp_path):
    """A store on a full file system: 507 no_space, nothing kept, the server stays up."""
    import subprocess
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        conf = f"[server]\nconnection_timeout = 5s\n[store local]\nkind = fs\nroot = {mnt}/blobs\n"
        srv = Server(tmp_path / "data", config_text=conf).start()
        try:
            big = rnd(3 * 1024 * 1024)
            for r in (put(srv, big), post(srv, big),
                      put(srv, iter([big[i:i + 65536] for i in range(0, len(big), 65536)]),
                          hexd=sha(big))):
                assert_error(r, 507, "no_space")
            assert wait_until_empty(mnt / "blobs"), blob_files(mnt / "blobs")
            assert_error(get(srv, sha(big)), 404, "not_found")
            small = rnd(1000)
            assert put(srv, small).status_code == 201
            assert get(srv, sha(small)).content == small
            assert srv.alive()
        finally:
            assert srv.stop() == 0, srv.read_log()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def wait_until_empty(root):
    deadline = time.time() + 5
    while blob_files(root) and time.time() < deadline:
        time.sleep(0.05)
    return not blob_files(root)
