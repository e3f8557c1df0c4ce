"""Hostile clients (issue 9): request smuggling through odd header names and transfer codings,
query strings that exhaust libmicrohttpd's connection pool, absolute-form targets, duplicate Host,
If-Range lists, HEAD ranges in the byte counters, `Content-Length: 00`, token scopes, a full index
volume, and SIGTERM during a streaming upload."""
import hashlib
import os
import re
import signal
import subprocess
import time

import pytest
import requests

from conftest import BIN_DIR, Server
from util_http import (TIMEOUT, RawConn, assert_error, assert_raw_error, get, healthy, put,
                       raw_exchange, request_head, sha)

KNOWN = b"a blob that is there before the hostile requests" * 40
HK = sha(KNOWN)
HIDDEN = b"the bytes of a request smuggled inside another one: "


@pytest.fixture(scope="module")
def hserver(tmp_path_factory):
    """Default limits (so a hang shows as the 30 s connection timeout, not as a quick close)."""
    srv = Server(tmp_path_factory.mktemp("hostile") / "data").start()
    assert put(srv, KNOWN).status_code == 201
    yield srv
    alive = srv.alive()
    rc = srv.stop()
    assert alive, "blobrefd died:\n" + srv.read_log()
    assert rc == 0, f"blobrefd exited {rc}:\n" + srv.read_log()


def hidden_put(case):
    """A PUT of a blob of its own for each case (the server is shared by the module)."""
    data = HIDDEN + case.encode()
    return request_head("PUT", f"/v1/blobs/{sha(data)}", [("Content-Length", str(len(data)))]) + data


def answer_then_close(srv, data, timeout=2.0):
    """Sends data on a new connection; returns the first response (None if closed without one;
    an AssertionError if nothing comes within timeout) and whether the server then closed the
    connection."""
    c = RawConn(srv, timeout=timeout)
    try:
        c.send(data)
        try:
            resp = c.read_response()
        except (EOFError, ConnectionResetError):
            return None, True
        except TimeoutError:
            raise AssertionError(f"no answer within {timeout} s") from None
        return resp, c.closed_by_peer(timeout)
    finally:
        c.close()


# ---- 1. request smuggling -----------------------------------------------------------------------

SMUGGLING = {
    # the body (a hidden PUT) is invisible to a server that misses the spaced name
    "space-before-colon": lambda c: (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length : %d\r\n\r\n" % len(hidden_put(c))
        + hidden_put(c)),
    "tab-before-colon": lambda c: (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length\t: %d\r\n\r\n" % len(hidden_put(c))
        + hidden_put(c)),
    # a proxy reading the chunked framing would see one request, we would see two
    "spaced-te-beside-cl": lambda c: (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
        b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + hidden_put(c)),
    "te-chunked-beside-cl": lambda c: (
        b"PUT /v1/blobs/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % HK.encode() + hidden_put(c)),
    "space-in-name": lambda c: (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent Length: %d\r\n\r\n" % len(hidden_put(c))
        + hidden_put(c)),
    "bad-token-char": lambda c: (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length@: %d\r\n\r\n" % len(hidden_put(c))
        + hidden_put(c)),
}


@pytest.mark.parametrize("case", sorted(SMUGGLING))
def test_smuggling_400_and_close(hserver, case):
    resp, closed = answer_then_close(hserver, SMUGGLING[case](case))
    assert resp is not None, "closed without an answer"
    assert_raw_error(resp, 400, "bad_request")
    assert closed, "the connection must be closed after the 400"
    time.sleep(0.2)
    assert_error(get(hserver, sha(HIDDEN + case.encode())), 404, "not_found")  # never ran
    assert healthy(hserver)


@pytest.mark.parametrize("te", ["identity", "gzip, chunked", "chunked, gzip", "gzip",
                                "chunked;x=1", "chunked chunked", ""])
def test_transfer_encoding_other_than_chunked_400_at_once(hserver, te):
    resp, closed = answer_then_close(  # an answer within 2 s
        hserver, request_head("POST", "/v1/blobs", [("Transfer-Encoding", te)])
        + b"5\r\nhello\r\n0\r\n\r\n")
    assert resp is not None
    assert_raw_error(resp, 400, "bad_request")
    assert closed
    assert_error(get(hserver, sha(b"hello")), 404, "not_found")


@pytest.mark.parametrize("te", ["chunked", "Chunked", "CHUNKED"])
def test_transfer_encoding_chunked_still_works(hserver, te):
    data = os.urandom(3000)
    body = b"%x\r\n" % len(data) + data + b"\r\n0\r\n\r\n"
    resp, _ = raw_exchange(hserver, request_head("POST", "/v1/blobs",
                                                 [("Transfer-Encoding", te)]), body)
    assert resp.status == 201, resp.body


# ---- 2. query strings that exhaust the connection's memory pool ---------------------------------

@pytest.mark.parametrize("path", ["/v1/blobs/x?" + "&".join(["a"] * 500),
                                  f"/v1/blobs/{HK}?" + "a&" * 600,
                                  "/healthz?" + "&" * 1000],
                         ids=["500-args", "600-args-known-blob", "1000-empty-args"])
def test_many_query_arguments_answered_at_once(hserver, path):
    resp, _ = answer_then_close(hserver, request_head("GET", path))  # within 2 s
    assert resp is not None, "closed without an answer"
    assert_raw_error(resp, 414, "url_too_long")
    assert healthy(hserver)


def test_some_query_arguments_are_fine(hserver):
    r = requests.get(f"{hserver.url}/healthz?" + "&".join(f"a{i}=1" for i in range(20)),
                     timeout=TIMEOUT)
    assert r.status_code == 200


# ---- 3. absolute-form targets --------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["http", "https", "HTTP"])
def test_absolute_form_target(hserver, scheme):
    host = f"127.0.0.1:{hserver.port}"
    resp, _ = raw_exchange(hserver, request_head("GET", f"{scheme}://{host}/v1/blobs/{HK}"))
    assert resp.status == 200 and resp.body == KNOWN
    resp, _ = raw_exchange(hserver, request_head("GET", f"http://{host}/healthz?x=1"))
    assert resp.status == 200
    resp, _ = raw_exchange(hserver, request_head("GET", f"http://user@{host}"))
    assert_raw_error(resp, 404, "no_route")
    data = os.urandom(1000)
    resp, _ = raw_exchange(hserver, request_head("PUT", f"http://{host}/v1/blobs/{sha(data)}",
                                                 [("Content-Length", str(len(data)))]), data)
    assert resp.status == 201, resp.body
    assert get(hserver, sha(data)).content == data


# ---- 4. duplicate Host ---------------------------------------------------------------------------

@pytest.mark.parametrize("second", ["x", "evil.example"])
def test_two_host_headers_400(hserver, second):
    resp, _ = raw_exchange(hserver, request_head("GET", f"/v1/blobs/{HK}", [("Host", second)]))
    assert resp is not None
    assert_raw_error(resp, 400, "bad_request")


# ---- 5. If-Range takes one entity tag ------------------------------------------------------------

def test_if_range_list_is_not_a_match(hserver):
    etag = f'"{HK}"'
    r = get(hserver, HK, headers={"Range": "bytes=0-9", "If-Range": f'{etag}, "b"'})
    assert r.status_code == 200 and r.content == KNOWN
    r = get(hserver, HK, headers={"Range": "bytes=0-9", "If-Range": f'"a", {etag}'})
    assert r.status_code == 200 and r.content == KNOWN
    r = get(hserver, HK, headers={"Range": "bytes=0-9", "If-Range": f"{etag}x"})
    assert r.status_code == 200
    r = get(hserver, HK, headers={"Range": "bytes=0-9", "If-Range": etag})
    assert r.status_code == 206 and r.content == KNOWN[:10]


# ---- 6. HEAD with a Range serves no bytes --------------------------------------------------------

def served_bytes(srv):
    text = requests.get(srv.url + "/metrics", timeout=TIMEOUT).text
    return int(re.search(r"^blobref_served_bytes_total (\d+)$", text, re.M).group(1))


def test_head_range_counts_no_served_bytes(hserver):
    before = served_bytes(hserver)
    for spec in ("bytes=0-99", "bytes=0-9,20-29", "bytes=-5"):
        r = requests.head(f"{hserver.url}/v1/blobs/{HK}", headers={"Range": spec},
                          timeout=TIMEOUT)
        assert r.status_code == 206
    assert served_bytes(hserver) == before
    assert get(hserver, HK, headers={"Range": "bytes=0-99"}).status_code == 206
    assert served_bytes(hserver) == before + 100


# ---- 7. Content-Length: 00 on a body-less request ------------------------------------------------

@pytest.mark.parametrize("method,path", [("GET", f"/v1/blobs/{HK}"), ("GET", "/healthz"),
                                         ("HEAD", f"/v1/blobs/{HK}")])
@pytest.mark.parametrize("cl", ["00", "000", "0"])
def test_zero_content_length_spelled_long(hserver, method, path, cl):
    c = RawConn(hserver)
    c.send(request_head(method, path, [("Content-Length", cl)]))
    resp = c.read_response(head_only=method == "HEAD")
    c.close()
    assert resp.status == 200, (resp.status, resp.body)


# ---- 8. token scopes -----------------------------------------------------------------------------

TOKENS = {"r": "read", "w": "write", "rw": "read, write"}


def token_conf(anonymous):
    text = f"[auth]\nanonymous = {anonymous}\n"
    for name, scopes in TOKENS.items():
        digest = hashlib.sha256(f"secret-{name}".encode()).hexdigest()
        text += f"[token {name}]\nsha256 = {digest}\nscopes = {scopes}\n"
    return text


def bearer(name):
    return {"Authorization": f"Bearer secret-{name}"}


@pytest.mark.parametrize("anonymous", ["none", "read"])
def test_write_only_token(tmp_path, anonymous):
    srv = Server(tmp_path / "data", config_text=token_conf(anonymous)).start()
    try:
        data = os.urandom(2000)
        r = put(srv, data, headers=bearer("w"))
        assert r.status_code == 201 and r.json()["sha256"] == sha(data)
        r = requests.post(f"{srv.url}/v1/blobs", data=data, headers=bearer("w"), timeout=TIMEOUT)
        assert r.status_code == 200 and r.json()["dedup"] is True
        assert_error(put(srv, os.urandom(10), headers=bearer("r")), 403, "forbidden")
        assert_error(put(srv, os.urandom(10)), 401, "unauthorized")
        assert get(srv, sha(data), headers=bearer("r")).content == data
        assert get(srv, sha(data), headers=bearer("rw")).content == data
        head = requests.head(f"{srv.url}/v1/blobs/{sha(data)}", headers=bearer("w"),
                             timeout=TIMEOUT)
        if anonymous == "none":
            # scopes are independent: write does not imply read
            assert_error(get(srv, sha(data), headers=bearer("w")), 403, "forbidden")
            assert head.status_code == 403
            assert_error(get(srv, sha(data)), 401, "unauthorized")
        else:
            # the anonymous scopes are a floor every client has, with or without a token
            assert get(srv, sha(data), headers=bearer("w")).content == data
            assert head.status_code == 200
            assert get(srv, sha(data)).content == data
        assert_error(get(srv, sha(data), headers=bearer("nobody")), 401, "unauthorized")
    finally:
        assert srv.stop() == 0, srv.read_log()


# ---- 9. a full index volume ----------------------------------------------------------------------

def test_index_volume_full_is_507(tmp_path):
    data_dir = tmp_path / "data"
    index = data_dir / "index"
    index.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(index)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        srv = Server(data_dir, config_text="[server]\nthreads = 2\n").start()
        try:
            first = os.urandom(100)
            assert put(srv, first).status_code == 201
            # fill the index volume to the last byte
            fd = os.open(index / "filler", os.O_WRONLY | os.O_CREAT)
            try:
                while os.write(fd, b"\0" * 4096):
                    pass
            except OSError:
                pass
            os.close(fd)
            blobs = [os.urandom(500) for _ in range(40)]
            statuses = []
            for b in blobs:
                r = put(srv, b)
                statuses.append(r.status_code)
                if r.status_code != 201:
                    assert_error(r, 507, "no_space")
            assert 507 in statuses, statuses
            assert srv.alive()
            assert get(srv, sha(first)).content == first
            os.unlink(index / "filler")
            again = blobs[statuses.index(507)]
            r = put(srv, again)
            assert r.status_code == 201, r.text
            assert get(srv, sha(again)).content == again
        finally:
            assert srv.stop() == 0, srv.read_log()
    finally:
        subprocess.run(["umount", str(index)], check=True)


# ---- 10. SIGTERM lets streaming uploads finish ---------------------------------------------------

def test_sigterm_lets_streaming_upload_finish(tmp_path):
    srv = Server(tmp_path / "data").start()
    data = os.urandom(4 * 1024 * 1024)
    h = sha(data)
    c = RawConn(srv, timeout=20)
    try:
        c.send(request_head("PUT", f"/v1/blobs/{h}", [("Content-Length", str(len(data)))]))
        c.send(data[:len(data) // 2])
        time.sleep(0.3)
        # an idle keep-alive connection must not hold the stop
        idle = RawConn(srv)
        idle.send(request_head("GET", "/healthz"))
        assert idle.read_response().status == 200
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        c.send(data[len(data) // 2:])
        resp = c.read_response()
        assert resp.status == 201, (resp.status, resp.body)
        assert resp.header("connection") == "close"
        t0 = time.time()
        assert idle.closed_by_peer(3), "the idle connection was not closed"
        idle.close()
    finally:
        c.close()
    rc = srv.proc.wait(timeout=20)
    assert time.time() - t0 < 3
    log = srv.read_log()
    assert rc == 0, log
    assert "client went away" not in log, log
    srv.proc = None
    srv.log.close()
    srv2 = Server(tmp_path / "data").start()
    try:
        assert get(srv2, h).content == data
    finally:
        assert srv2.stop() == 0


def test_sigterm_with_only_idle_connections_is_quick(tmp_path):
    srv = Server(tmp_path / "data").start()
    conns = []
    for _ in range(5):
        c = RawConn(srv)
        c.send(request_head("GET", "/healthz"))
        assert c.read_response().status == 200
        conns.append(c)
    t0 = time.time()
    assert srv.stop() == 0
    assert time.time() - t0 < 3
    for c in conns:
        c.close()


def test_sigterm_cuts_a_stalled_upload_after_shutdown_timeout(tmp_path):
    srv = Server(tmp_path / "data", config_text="[server]\nshutdown_timeout = 1s\n").start()
    data = os.urandom(100000)
    c = RawConn(srv, timeout=10)
    try:
        c.send(request_head("PUT", f"/v1/blobs/{sha(data)}", [("Content-Length", str(len(data)))])
               + data[:1000])
        time.sleep(0.3)
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(timeout=10)
        assert rc == 0 and 0.9 < time.time() - t0 < 5, (rc, time.time() - t0)
        assert "cutting 1 request(s) still in progress" in srv.read_log()
    finally:
        c.close()
    srv.proc = None
    srv.log.close()
