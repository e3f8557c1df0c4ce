"""The access log (issue 9): one JSON line per request with exactly the documented fields, the
token's name but never the token, X-Request-Id on every response (taken from the client only
behind a trusted proxy), and reopening on SIGHUP for logrotate."""
import hashlib
import json
import os
import re
import signal
import socket

import pytest
import requests

from conftest import BIN_DIR, Server
from util_http import TIMEOUT, RFC3339_RE, RawConn, get, lookup, post, put, request_head, sha, \
    wait_until

FIELDS = {"time", "request_id", "remote", "token", "method", "path", "status", "bytes_in",
          "bytes_out", "duration_us", "outcome"}
SECRET = "s3cr3t-token-value-for-the-log-test"


def conf(log, extra=""):
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    return (f"[server]\naccess_log = {log}\n{extra}\n[auth]\nanonymous = read\n"
            f"[token pipeline]\nsha256 = {digest}\nscopes = read, write\n")


def lines(path, n=None):
    """The log's lines as dicts, waiting (briefly) for n of them: the line is written when the
    request completes, which can be just after the client has its answer."""
    def read():
        try:
            text = path.read_text()
        except FileNotFoundError:
            return []
        assert text == "" or text.endswith("\n")
        return [json.loads(l) for l in text.splitlines()]
    if n is not None:
        wait_until(lambda: len(read()) >= n, timeout=5)
    return read()


def line_for(log, rid):
    """The line of request rid, once written (on completion: maybe just after the answer)."""
    wait_until(lambda: any(l["request_id"] == rid for l in lines(log)), timeout=5)
    found = [l for l in lines(log) if l["request_id"] == rid]
    assert len(found) == 1, (rid, lines(log))
    return found[0]


def settled(srv, log):
    """The number of lines once every earlier request (the fixture's readiness probes) is in."""
    rid = requests.get(srv.url + "/healthz", timeout=TIMEOUT).headers["X-Request-Id"]
    wait_until(lambda: any(l["request_id"] == rid for l in lines(log)), timeout=5)
    return len(lines(log))


@pytest.fixture
def logged(tmp_path):
    log = tmp_path / "access.log"
    srv = Server(tmp_path / "data", config_text=conf(log)).start()
    yield srv, log
    alive = srv.alive()
    assert srv.stop() == 0 and alive, srv.read_log()


def test_one_json_line_per_request_with_exact_fields(logged):
    srv, log = logged
    base = settled(srv, log)
    auth = {"Authorization": f"Bearer {SECRET}"}
    data = os.urandom(3000)
    r1 = put(srv, data, headers=auth)
    r2 = post(srv, data, headers=auth)
    r3 = get(srv, sha(data))
    r4 = get(srv, sha(data))
    r5 = lookup(srv, [sha(data)])
    r6 = put(srv, b"x")  # anonymous may only read: 401
    # each request's own line (a readiness probe of the fixture may complete after `settled`)
    got = [line_for(log, r.headers["X-Request-Id"]) for r in (r1, r2, r3, r4, r5, r6)]
    assert len(lines(log)) >= base + 6
    assert [l["status"] for l in got] == [201, 200, 200, 200, 200, 401]
    for l, r in zip(got, [r1, r2, r3, r4, r5, r6]):
        assert set(l) == FIELDS, l
        assert RFC3339_RE.match(l["time"])
        assert l["request_id"] == r.headers["X-Request-Id"]
        assert re.fullmatch(r"[0-9a-f]{16}", l["request_id"])
        assert l["remote"] == "127.0.0.1"
        assert isinstance(l["duration_us"], int) and 0 <= l["duration_us"] < 10_000_000
        assert l["bytes_out"] == len(r.content)
    assert [l["method"] for l in got] == ["PUT", "POST", "GET", "GET", "POST", "PUT"]
    assert [l["path"] for l in got[:3]] == [f"/v1/blobs/{sha(data)}", "/v1/blobs",
                                            f"/v1/blobs/{sha(data)}"]
    assert [l["outcome"] for l in got] == ["created", "dedup", "cache_miss", "cache_hit", "", ""]
    assert [l["token"] for l in got] == ["pipeline", "pipeline", None, None, None, None]
    assert got[0]["bytes_in"] == 3000 and got[1]["bytes_in"] == 3000 and got[2]["bytes_in"] == 0
    assert got[4]["bytes_in"] == len(json.dumps({"hashes": [sha(data)]}))
    assert len({l["request_id"] for l in got}) == 6
    assert SECRET not in log.read_text()
    assert SECRET not in srv.read_log()


def test_every_response_has_a_request_id(logged):
    srv, _ = logged
    for r in [requests.get(srv.url + "/healthz", timeout=TIMEOUT),
              requests.get(srv.url + "/nowhere", timeout=TIMEOUT),
              requests.head(srv.url + "/v1/blobs/" + "0" * 64, timeout=TIMEOUT),
              requests.get(srv.url + "/v1/blobs/nothex", timeout=TIMEOUT)]:
        assert re.fullmatch(r"[0-9a-f]{16}", r.headers.get("X-Request-Id", "")), r.headers


def test_client_request_id_ignored_unless_trusted_proxy(logged):
    srv, log = logged
    r = requests.get(srv.url + "/healthz", headers={"X-Request-Id": "from-the-client"},
                     timeout=TIMEOUT)
    assert r.headers["X-Request-Id"] != "from-the-client"
    assert line_for(log, r.headers["X-Request-Id"])["path"] == "/healthz"


@pytest.mark.parametrize("proxies,given,taken", [
    ("127.0.0.1", "edge-1234.abc:7_x", True),
    ("10.0.0.0/8, 127.0.0.0/8", "abc", True),
    ("10.0.0.0/8", "abc", False),           # the peer is not a trusted proxy
    ("127.0.0.1", "a b", False),            # a character outside [A-Za-z0-9._:-]
    ("127.0.0.1", "x" * 65, False),         # longer than 64
    ("127.0.0.1", "", False),
])
def test_request_id_from_trusted_proxy(tmp_path, proxies, given, taken):
    log = tmp_path / "access.log"
    srv = Server(tmp_path / "data", config_text=conf(log, f"trusted_proxies = {proxies}")).start()
    try:
        c = RawConn(srv)
        c.send(request_head("GET", "/healthz", [("X-Request-Id", given)]))
        resp = c.read_response()
        c.close()
        rid = resp.header("X-Request-Id")
        assert (rid == given) == taken, rid
        assert line_for(log, rid)["path"] == "/healthz"
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_bad_trusted_proxies_stop_startup(tmp_path):
    srv = Server(tmp_path / "data", config_text=conf("off", "trusted_proxies = 10.0.0.0/33"))
    with pytest.raises(RuntimeError, match=r"trusted_proxies: '10.0.0.0/33' is not an IP"):
        srv.start(timeout=10)


def test_logrotate_rename_then_sighup(logged):
    srv, log = logged
    n_before = settled(srv, log)
    rotated = log.with_name("access.log.1")
    log.rename(rotated)
    srv.proc.send_signal(signal.SIGHUP)
    wait_until(log.exists, timeout=5)
    r = requests.get(srv.url + "/readyz?after=rotate", timeout=TIMEOUT)
    assert r.status_code == 200
    new = lines(log, 1)
    assert [l["request_id"] for l in new] == [r.headers["X-Request-Id"]]
    assert len(lines(rotated)) == n_before  # nothing more went to the renamed file
    assert srv.alive()


def test_access_log_to_stderr(tmp_path):
    srv = Server(tmp_path / "data", config_text=conf("stderr")).start()
    try:
        r = requests.get(srv.url + "/healthz", timeout=TIMEOUT)
        rid = r.headers["X-Request-Id"]
        wait_until(lambda: rid in srv.read_log(), timeout=5)
        line = [l for l in srv.read_log().splitlines() if rid in l][0]
        assert set(json.loads(line)) == FIELDS
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_access_log_off_by_default(tmp_path):
    srv = Server(tmp_path / "data").start()
    try:
        r = requests.get(srv.url + "/healthz", timeout=TIMEOUT)
        assert r.headers["X-Request-Id"]
        assert '"request_id"' not in srv.read_log()
    finally:
        assert srv.stop() == 0, srv.read_log()
