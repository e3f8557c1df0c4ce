"""Bad input gets a 4xx JSON error, changes nothing (no new files, index unchanged) and never takes
blobrefd down (PRODUCT.md invariant 8)."""
import json
import os
import socket
import time

import pytest
import requests

from conftest import Server
from util_http import (TIMEOUT, RawConn, assert_error, assert_raw_error, blob_files, fsck, get,
                       healthy, lookup, put, raw_exchange, request_head, sha, wait_until)

LIMITS = """[server]
max_blob_size = 1MiB
max_json_size = 1MiB
max_lookup_hashes = 1000
max_url_length = 1000
max_header_size = 4KiB
connection_timeout = 2s
"""

KNOWN = b"the one blob that is there before the bad input" * 50
HK = sha(KNOWN)


def start(path, conf):
    srv = Server(path, config_text=conf).start()
    r = put(srv, KNOWN, headers={"Content-Type": "text/x-known"})
    assert r.status_code == 201, r.text
    return srv


def finish(srv):
    alive = srv.alive()
    rc = srv.stop()
    assert alive, "blobrefd died:\n" + srv.read_log()
    assert rc == 0, f"blobrefd exited {rc}:\n" + srv.read_log()


@pytest.fixture(scope="module")
def lserver(tmp_path_factory):
    """Small limits and a 2 s connection timeout."""
    srv = start(tmp_path_factory.mktemp("bad") / "data", LIMITS)
    yield srv
    finish(srv)


@pytest.fixture(scope="module")
def dserver(tmp_path_factory):
    """Default limits."""
    srv = start(tmp_path_factory.mktemp("bad-default") / "data", None)
    yield srv
    finish(srv)


def snapshot(srv):
    files = blob_files(srv.data_dir / "blobs")
    meta = requests.get(f"{srv.url}/v1/blobs/{HK}/meta", timeout=TIMEOUT)
    assert meta.status_code == 200
    rc, n, problems, out = fsck(srv.data_dir, config=srv.data_dir / "blobref.conf"
                                if srv.config_text else None)
    assert rc == 0 and problems == 0, out
    return files, meta.json(), n


def assert_unchanged(srv, before, also_missing=()):
    """No new or changed file (temp files of aborted uploads may take a moment to go), the same
    record for the known blob, the same number of index entries, the given hashes absent."""
    assert healthy(srv), "server not healthy after bad input"
    files0 = before[0]
    if blob_files(srv.data_dir / "blobs") != files0:
        wait_until(lambda: blob_files(srv.data_dir / "blobs") == files0, timeout=5)
    assert blob_files(srv.data_dir / "blobs") == files0
    after = snapshot(srv)
    assert after[1] == before[1]
    assert after[2] == before[2], f"index entries {before[2]} -> {after[2]}"
    if also_missing:
        r = lookup(srv, list(also_missing))
        assert r.json()["found"] == [], r.json()


def closed_or_4xx(resp, allowed=range(400, 500)):
    """An answer from libmicrohttpd itself: a 4xx (any body) or a connection close."""
    assert resp is None or resp.status in allowed, (resp.status, resp.body[:200])


# ---------------------------------------------------------------------------------------------


def test_malformed_hashes(lserver):
    before = snapshot(lserver)
    for bad in ["a" * 63, "a" * 65, "A" * 64, "g" * 64, "sha256:" + "a" * 63, "sha256:",
                "sha256:" + "B" * 64, "-1", "a" * 64 + "x"]:
        assert_error(put(lserver, b"data", hexd=bad), 400, "bad_hash")
        assert_error(get(lserver, bad), 400, "bad_hash")
    for bad in ["x", "a" * 63, "A" * 64, "sha256:", "", "sha256:" + "a" * 65]:
        body = assert_error(lookup(lserver, [HK, bad]), 400, "bad_hash")
        assert "1" in body["error"]["message"]
    assert_unchanged(lserver, before, [sha(b"data")])


@pytest.mark.parametrize("method", ["PUT", "POST"])
def test_body_shorter_than_content_length_then_close(lserver, method):
    full = os.urandom(100000)
    part = full[:50000]
    before = snapshot(lserver)
    path = f"/v1/blobs/{sha(full)}" if method == "PUT" else "/v1/blobs"
    for how in ("close", "shutdown"):
        c = RawConn(lserver)
        c.send(request_head(method, path, [("Content-Length", str(len(full)))]) + part)
        time.sleep(0.2)
        if how == "shutdown":
            c.sock.shutdown(socket.SHUT_WR)
            c.closed_by_peer(5)  # the server may answer 400 or just close; it must not store
        c.close()
    time.sleep(0.5)
    assert_unchanged(lserver, before, [sha(full), sha(part)])


@pytest.mark.parametrize("method", ["PUT", "POST"])
def test_body_longer_than_content_length(lserver, method):
    a = os.urandom(30000)
    path = f"/v1/blobs/{sha(a)}" if method == "PUT" else "/v1/blobs"
    # The extra bytes are a pipelined request: they must be answered as one, not stored.
    c = RawConn(lserver)
    c.send(request_head(method, path, [("Content-Length", str(len(a)))]) + a
           + request_head("GET", "/healthz"))
    r1 = c.read_response()
    assert r1.status == 201, r1.body
    assert json.loads(r1.body)["sha256"] == sha(a) and json.loads(r1.body)["size"] == 30000
    try:
        r2 = c.read_response()
        assert r2.status == 200 and json.loads(r2.body)["status"] == "ok"
    except (EOFError, ConnectionResetError):
        pass  # closing after the first answer is allowed too
    c.close()
    assert get(lserver, sha(a)).content == a
    # Extra bytes that are no request at all: the blob is still exactly the declared bytes.
    b = os.urandom(20000)
    path = f"/v1/blobs/{sha(b)}" if method == "PUT" else "/v1/blobs"
    c = RawConn(lserver)
    c.send(request_head(method, path, [("Content-Length", str(len(b)))]) + b
           + b"\x00garbage that is not http\r\n\r\n")
    r1 = c.read_response()
    assert r1.status == 201 and json.loads(r1.body)["sha256"] == sha(b)
    c.close()
    r = get(lserver, sha(b))
    assert r.status_code == 200 and r.content == b
    assert healthy(lserver)


def test_digest_mismatch(lserver):
    data = os.urandom(40000)
    wrong = sha(b"not these bytes")
    before = snapshot(lserver)
    assert_error(put(lserver, data, hexd=wrong), 400, "digest_mismatch")
    assert_error(put(lserver, iter([data[:20000], data[20000:]]), hexd=wrong), 400,
                 "digest_mismatch")
    # With 100-continue: the unknown id gets "100 Continue", then the bytes are checked.
    c = RawConn(lserver)
    c.send(request_head("PUT", f"/v1/blobs/{wrong}", [("Content-Length", str(len(data))),
                                                       ("Expect", "100-continue")]))
    first = c.read_response()
    assert first.status == 100
    c.send(data)
    assert_raw_error(c.read_response(), 400, "digest_mismatch")
    c.close()
    assert_unchanged(lserver, before, [wrong, sha(data)])


def test_oversized_bodies(lserver):
    before = snapshot(lserver)
    big = os.urandom(1024 * 1024 + 100)
    for method, path in (("PUT", f"/v1/blobs/{sha(big)}"), ("POST", "/v1/blobs")):
        resp, _ = raw_exchange(lserver, request_head(method, path,
                                                     [("Content-Length", str(len(big)))]), big)
        assert resp is not None, f"{method} with Content-Length: closed without an answer"
        assert_raw_error(resp, 413, "too_large")
        resp, _ = raw_exchange(lserver, request_head(method, path,
                                                     [("Transfer-Encoding", "chunked")]),
                               lambda: iter([b"%x\r\n" % len(big) + big + b"\r\n0\r\n\r\n"]))
        assert resp is not None, f"{method} chunked: closed without an answer"
        assert_raw_error(resp, 413, "too_large")
    assert_unchanged(lserver, before, [sha(big)])


@pytest.mark.parametrize("spec,code", [
    ("bytes=", "bad_range"), ("bytes=a-b", "bad_range"), ("bytes=3-1", "bad_range"),
    ("bytes=" + ",".join(["0-0"] * 65), "bad_range"), ("bytes=" + "9" * 5000 + "-", None),
    ("bytes=99999-", "range_not_satisfiable"), ("bytes=-0", "range_not_satisfiable"),
])
def test_bad_ranges(lserver, spec, code):
    before = snapshot(lserver)
    r = get(lserver, HK, headers={"Range": spec})
    if code is None:  # the header is over max_header_size (4 KiB) here
        assert r.status_code in (416, 431), r.status_code
    else:
        assert_error(r, 416, code)
    assert_unchanged(lserver, before)


def test_headers_over_max_header_size(lserver):
    before = snapshot(lserver)
    many = [(f"X-Filler-{i}", "v" * 60) for i in range(100)]  # ~7 KiB > 4 KiB
    resp, _ = raw_exchange(lserver, request_head("GET", "/healthz", many))
    assert_raw_error(resp, 431, "headers_too_large")
    resp, _ = raw_exchange(lserver, request_head("PUT", f"/v1/blobs/{sha(b'h')}",
                                                 [("X-Big", "b" * 5000),
                                                  ("Content-Length", "1")]), b"h")
    assert_raw_error(resp, 431, "headers_too_large")
    # Under the limit is fine.
    resp, _ = raw_exchange(lserver, request_head("GET", "/healthz", many[:20]))
    assert resp.status == 200
    assert_unchanged(lserver, before, [sha(b"h")])


def test_headers_beyond_mhd_buffer(lserver):
    before = snapshot(lserver)
    for hdrs in ([(f"X-H{i}", "z" * 1000) for i in range(300)], [("X-Huge", "q" * (1 << 20))]):
        resp, _ = raw_exchange(lserver, request_head("GET", "/healthz", hdrs))
        closed_or_4xx(resp, (400, 413, 431))
    assert_unchanged(lserver, before)


def test_url_too_long_configured(lserver):
    before = snapshot(lserver)
    assert_error(requests.get(f"{lserver.url}/v1/blobs/{'a' * 1200}", timeout=TIMEOUT), 414,
                 "url_too_long")
    assert_error(put(lserver, b"u", hexd="a" * 1200), 414, "url_too_long")
    # 1000 is the limit: a shorter bad URL gets its ordinary error.
    assert_error(requests.get(f"{lserver.url}/v1/blobs/{'a' * 900}", timeout=TIMEOUT), 400,
                 "bad_hash")
    assert_unchanged(lserver, before)


def test_url_too_long_counts_query(lserver):
    # RFC 9110 15.5.15: 414 is about the whole request-target, query included.
    assert_error(requests.get(f"{lserver.url}/healthz?x={'q' * 2000}", timeout=TIMEOUT), 414,
                 "url_too_long")


def test_url_too_long_default(dserver):
    before = snapshot(dserver)
    assert_error(requests.get(f"{dserver.url}/v1/blobs/{'b' * 5000}", timeout=TIMEOUT), 414,
                 "url_too_long")
    resp, _ = raw_exchange(dserver, request_head("GET", "/v1/blobs/" + "c" * 300000))
    closed_or_4xx(resp, (400, 413, 414, 431))
    assert_unchanged(dserver, before)


def test_slow_header_client_disconnected(lserver):
    c = RawConn(lserver)
    c.send(b"GET /healthz HTTP/1.1\r\nHo")
    t0 = time.time()
    served = 0
    while time.time() - t0 < 1.5:  # meanwhile other clients are served
        r = requests.get(lserver.url + "/healthz", timeout=1)
        assert r.status_code == 200
        served += 1
        time.sleep(0.1)
    assert served >= 5
    closed = c.closed_by_peer(8)
    elapsed = time.time() - t0
    c.close()
    assert closed, "server kept a half-sent request open"
    assert elapsed < 8, elapsed
    assert healthy(lserver)


def test_slow_body_client_disconnected(lserver):
    before = snapshot(lserver)
    data = os.urandom(10000)
    c = RawConn(lserver)
    c.send(request_head("PUT", f"/v1/blobs/{sha(data)}", [("Content-Length", "10000")])
           + data[:100])
    t0 = time.time()
    closed = c.closed_by_peer(8)
    c.close()
    assert closed and time.time() - t0 < 8
    assert_unchanged(lserver, before, [sha(data)])


def test_many_slow_clients_others_served(lserver):
    conns = []
    for _ in range(50):
        c = RawConn(lserver)
        c.send(b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"ha")
        conns.append(c)
    t0 = time.time()
    for _ in range(10):
        r = lookup(lserver, [HK])
        assert r.status_code == 200 and r.json()["found"][0]["sha256"] == HK
    assert time.time() - t0 < 10
    closed = [c.closed_by_peer(8) for c in conns]
    for c in conns:
        c.close()
    assert all(closed), f"{closed.count(False)} slow connections still open"
    assert healthy(lserver)


@pytest.mark.parametrize("method,path", [
    ("BREW", "/healthz"), ("BREW", f"/v1/blobs/{HK}"), ("PATCH", f"/v1/blobs/{HK}"),
    ("PATCH", "/v1/lookup"), ("get", "/healthz"), ("PROPFIND", "/v1/blobs"),
    ("CONNECT", "/v1/blobs"), ("TRACE", "/healthz"),
])
def test_unknown_methods(lserver, method, path):
    before = snapshot(lserver)
    resp, _ = raw_exchange(lserver, request_head(method, path, [("Content-Length", "0")]))
    assert resp is not None and resp.status in (405, 501), (method, resp and resp.status)
    err = json.loads(resp.body)["error"]
    if resp.status == 405:
        assert err["code"] == "method_not_allowed"
        allow = {m.strip() for m in resp.header("allow").split(",")}
        assert method not in allow and allow, allow
    assert_unchanged(lserver, before)


def test_unknown_method_unknown_path(lserver):
    resp, _ = raw_exchange(lserver, request_head("BREW", "/coffee", [("Content-Length", "0")]))
    assert resp.status in (404, 405, 501)
    assert "code" in json.loads(resp.body)["error"]


INVALID_JSON = [b"", b"not json", b"{", b'{"hashes":[', b'{"hashes":["' + b"a" * 64 + b'"]',
                b'{"hashes":[]}}', b'{"hashes":[],}', b"{'hashes':[]}", b'{"hashes":[]} x',
                b'{"hashes":["\xff\xfe"]}', b'{"hashes":["a\x00b"]}', b"\x00",
                b'{"hashes":[' + b"1" * 400 + b"]}"]


@pytest.mark.parametrize("body", INVALID_JSON)
def test_invalid_json(lserver, body):
    before = snapshot(lserver)
    r = requests.post(f"{lserver.url}/v1/lookup", data=body, timeout=TIMEOUT,
                      headers={"Content-Type": "application/json"})
    assert_error(r, 400, "bad_json")
    assert_unchanged(lserver, before)


@pytest.mark.parametrize("body", [b"[" * 10000, b"[" * 10000 + b"]" * 10000,
                                  b'{"a":' * 5000 + b"1" + b"}" * 5000,
                                  b'{"x":' + b"[" * 40 + b"]" * 40 + b',"hashes":[]}',
                                  b'{"hashes":[],"x":' + b"[" * 33 + b"]" * 33 + b"}"])
def test_too_deep_json(lserver, body):
    r = requests.post(f"{lserver.url}/v1/lookup", data=body, timeout=TIMEOUT)
    assert_error(r, 400, "bad_json")
    assert healthy(lserver)


def test_depth_32_is_fine(lserver):
    # Nesting of 32 (object + array + 30 more) is within the documented limit.
    body = b'{"hashes":[],"x":' + b"[" * 30 + b"]" * 30 + b"}"
    r = requests.post(f"{lserver.url}/v1/lookup", data=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert r.json() == {"found": [], "missing": []}


@pytest.mark.parametrize("body", [b'{"hashes":"x"}', b'{"hashes":[1]}', b"[]", b"null", b"{}",
                                  b'{"hashes":null}', b'{"hashes":[null]}', b'"hashes"',
                                  b'{"hashes":[{"a":1}]}', b'{"hashes":[["' + b"a" * 64 + b'"]]}',
                                  b'{"hashes":{"0":"x"}}', b"42", b"true",
                                  b'{"hashes":["' + b"a" * 64 + b'",true]}'])
def test_wrongly_typed_json(lserver, body):
    before = snapshot(lserver)
    r = requests.post(f"{lserver.url}/v1/lookup", data=body, timeout=TIMEOUT)
    assert_error(r, 400, "bad_json")
    assert_unchanged(lserver, before)


def test_too_large_json(lserver, dserver):
    big = json.dumps({"hashes": [HK] * 900, "pad": "x" * (1024 * 1024)}).encode()
    assert_error(requests.post(f"{lserver.url}/v1/lookup", data=big, timeout=TIMEOUT), 413,
                 "body_too_large")
    # Chunked, so no Content-Length tells the size up front.
    assert_error(requests.post(f"{lserver.url}/v1/lookup", timeout=TIMEOUT,
                               data=iter([big[i:i + 65536] for i in range(0, len(big), 65536)])),
                 413, "body_too_large")
    big = b'{"hashes":[], "pad":"' + b"y" * (9 * 1024 * 1024) + b'"}'
    assert_error(requests.post(f"{dserver.url}/v1/lookup", data=big, timeout=TIMEOUT), 413,
                 "body_too_large")
    assert healthy(lserver) and healthy(dserver)


def test_too_many_hashes(lserver):
    assert_error(lookup(lserver, [HK] * 1001), 413, "too_many_hashes")
    r = lookup(lserver, [HK] * 1000)
    assert r.status_code == 200 and len(r.json()["found"]) == 1000


@pytest.mark.parametrize("target", [
    b"/v1/blobs/%00", b"/v1/blobs/%00" + b"a" * 63, b"/v1/blobs/a%00" + b"a" * 62,
    b"/v1/blobs/%01%02%03", b"/v1/blobs/%0d%0a" + b"a" * 62, b"/v1/blobs/%zz",
    b"/v1/blobs/%", b"/v1/blobs/%C3%A9" + b"a" * 62, b"/v1/blobs/..%2f..%2f..%2fetc%2fpasswd",
    b"/v1/blobs/sha256:%00" + b"a" * 63, b"/heal%00thz",
])
def test_nul_and_control_in_path_escaped(lserver, target):
    before = snapshot(lserver)
    head = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    resp, _ = raw_exchange(lserver, head)
    assert resp is not None
    assert resp.status in (400, 404), (target, resp.status, resp.body[:200])
    err = json.loads(resp.body)["error"]
    assert err["code"] in ("bad_hash", "no_route"), err
    assert_unchanged(lserver, before)


@pytest.mark.parametrize("target", [b"/v1/blobs/\x00abc", b"/v1/blobs/\x01\x02", b"/health\x7fz",
                                    b"/v1/blobs/\x1b[2J", b"/\xff\xfe", b"/v1/blobs/a b"])
def test_raw_control_bytes_in_path(lserver, target):
    before = snapshot(lserver)
    head = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    resp, _ = raw_exchange(lserver, head)
    closed_or_4xx(resp, list(range(400, 500)) + [505])
    if resp is not None and resp.header("content-type") and resp.body:
        if resp.header("content-type").startswith("application/json"):
            assert json.loads(resp.body)["error"]["code"] in ("bad_hash", "no_route")
    assert_unchanged(lserver, before)


@pytest.mark.parametrize("headers", [
    [("Content-Length", "abc")], [("Content-Length", "-1")],
    [("Content-Length", "5"), ("Content-Length", "6")],
    [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
    [("Transfer-Encoding", "gzip")], [("Content-Length", "99999999999999999999999")],
])
def test_bad_framing(lserver, headers):
    before = snapshot(lserver)
    wrong = sha(b"framing")  # any body the server might read is a digest mismatch
    resp, _ = raw_exchange(lserver, request_head("PUT", f"/v1/blobs/{wrong}", headers),
                           b"5\r\nhello\r\n0\r\n\r\n", timeout=8)
    closed_or_4xx(resp, (400, 411, 413, 501))
    assert_unchanged(lserver, before, [wrong, sha(b"hello")])


def test_bad_chunked_encoding(lserver):
    before = snapshot(lserver)
    for body in (b"zz\r\nhello\r\n0\r\n\r\n", b"5\r\nhelloXX0\r\n\r\n",
                 b"ffffffffffffffffffff\r\nx\r\n"):
        resp, _ = raw_exchange(lserver, request_head("POST", "/v1/blobs",
                                                     [("Transfer-Encoding", "chunked")]),
                               body, timeout=8)
        closed_or_4xx(resp)
    assert_unchanged(lserver, before, [sha(b"hello"), sha(b"x")])


def test_http11_without_host(lserver):
    resp, _ = raw_exchange(lserver, b"GET /healthz HTTP/1.1\r\n\r\n")
    closed_or_4xx(resp, (400,))
    resp, _ = raw_exchange(lserver, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert resp.status == 200 and json.loads(resp.body)["status"] == "ok"
    assert healthy(lserver)


def test_garbage_request_lines(lserver):
    for line in (b"\r\n\r\n", b"GARBAGE\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                 b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(200),
                 os.urandom(4096)):
        resp, _ = raw_exchange(lserver, line, timeout=6)
        closed_or_4xx(resp, (400, 404, 405, 414, 431, 505))
    assert healthy(lserver)
