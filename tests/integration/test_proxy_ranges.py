"""Multi-range reads of a proxied blob cost few upstream requests: near ranges share one, more
than 8 reads become one read through the gaps, and many unordered ranges get the whole blob
(200); the parts sent are exactly the ranges asked for, in their order."""
import random
import time

import pytest
from requests.structures import CaseInsensitiveDict

from s3util import stop_checked
from test_http_store import http_site
from util_http import get, parse_ranges, sha

KiB = 1024
BIG = random.Random(7).randbytes(2 * 1024 * KiB + 11)
H = sha(BIG)


@pytest.fixture
def origin_site(tmp_path):
    srv, origin = http_site(tmp_path, [BIG])
    yield srv, origin
    stop_checked(srv)
    origin.close()


def ranged_get(srv, origin, spans):
    """GETs BIG with Range: spans; returns (response, the Range headers the origin saw)."""
    with origin.lock:
        origin.requests.clear()
    spec = ",".join(f"{a}-{z}" for a, z in spans)
    r = get(srv, H, headers={"Range": "bytes=" + spec})
    with origin.lock:
        upstream = [rq[2] for rq in origin.requests if rq[0] == "GET" and H in rq[1]]
    return r, upstream


def assert_parts(r, spans):
    parts = parse_ranges(r.status_code, r.headers, r.content)
    assert [(p[0], p[1]) for p in parts] == list(spans)
    for first, last, total, data, _ in parts:
        assert total == len(BIG) and data == BIG[first:last + 1], (first, last)


def test_64_spread_ranges_are_one_upstream_read(origin_site):
    srv, origin = origin_site
    spans = [(i * 32 * KiB + 5, i * 32 * KiB + 5 + 99) for i in range(64)]
    r, upstream = ranged_get(srv, origin, spans)
    assert r.status_code == 206, r.text[:200]
    assert_parts(r, spans)
    assert upstream == [f"bytes={spans[0][0]}-{spans[-1][1]}"], upstream


def test_near_ranges_share_a_read(origin_site):
    srv, origin = origin_site
    # three clusters: adjacent, 1 KiB apart and 8191 bytes apart inside; 100 KiB between them
    clusters = [[(0, 99), (100, 199), (1224, 1300)],
                [(200 * KiB, 200 * KiB + 9), (200 * KiB + 10 + 8191, 200 * KiB + 9000)],
                [(900 * KiB, 900 * KiB)]]
    spans = [s for c in clusters for s in c]
    r, upstream = ranged_get(srv, origin, spans)
    assert r.status_code == 206
    assert_parts(r, spans)
    assert upstream == [f"bytes={c[0][0]}-{c[-1][1]}" for c in clusters], upstream


def test_few_unordered_ranges_keep_their_order(origin_site):
    srv, origin = origin_site
    spans = [(1000 * KiB, 1000 * KiB + 50), (10, 20), (500, 700), (600, 800)]
    r, upstream = ranged_get(srv, origin, spans)
    assert r.status_code == 206
    assert_parts(r, spans)
    # the far one alone; 10-20 and 500-700 share a read; 600-800 overlaps it: a read of its own
    assert upstream == ["bytes=1024000-1024050", "bytes=10-700", "bytes=600-800"], upstream


def test_many_unordered_ranges_get_the_whole_blob(origin_site):
    srv, origin = origin_site
    spans = [(i * 32 * KiB, i * 32 * KiB + 99) for i in range(64)][::-1]
    r, upstream = ranged_get(srv, origin, spans)
    assert r.status_code == 200 and r.content == BIG
    assert "Content-Range" not in r.headers
    assert len(upstream) == 1, upstream


def test_span_read_survives_a_slow_client(origin_site):
    """The ring fills while the span streams: the transfer pauses and resumes, bytes intact."""
    import socket

    srv, origin = origin_site
    spans = [(i * 32 * KiB, i * 32 * KiB + 16 * KiB - 1) for i in range(64)]
    head = (f"GET /v1/blobs/{H} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            "Range: bytes=" + ",".join(f"{a}-{z}" for a, z in spans) + "\r\n\r\n").encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(head)
    raw = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        raw += chunk
        time.sleep(0.002)  # a slow reader: the server's 256 KiB ring fills and the origin pauses
    s.close()
    head_bytes, _, body = raw.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    assert lines[0].split()[1] == "206", lines[0]
    headers = CaseInsensitiveDict(l.split(": ", 1) for l in lines[1:])
    assert_parts(type("R", (), {"status_code": 206, "headers": headers, "content": body}), spans)
