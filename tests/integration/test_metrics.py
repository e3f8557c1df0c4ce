"""/metrics (issue 9): the whole output passes Prometheus's own parser and linter
(`promtool check metrics`), latency histograms by route, the time uploads spend per step, cache
hits and misses, store errors by store, and connections open."""
import os
import re
import shutil
import socket
import subprocess

import pytest
import requests

from conftest import Server
from util_http import TIMEOUT, get, lookup, object_path, post, put, sha

SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$')


def metrics(srv):
    r = requests.get(srv.url + "/metrics", timeout=TIMEOUT)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return r.text


def samples(text):
    """{(name, labels text): value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"not a sample line: {line!r}"
        out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def value(text, name, labels=""):
    return samples(text)[(name, labels)]


@pytest.fixture
def msrv(tmp_path):
    srv = Server(tmp_path / "data", config_text="[server]\ncache_max_blob = 64KiB\n").start()
    yield srv
    alive = srv.alive()
    assert srv.stop() == 0 and alive, srv.read_log()


def exercise(srv):
    """One of each kind of request: created, dedup, cache miss then hit, lookup, 404, 405."""
    small = os.urandom(1000)
    assert put(srv, small).status_code == 201
    assert post(srv, small).status_code == 200
    assert get(srv, sha(small)).status_code == 200
    assert get(srv, sha(small)).status_code == 200
    assert lookup(srv, [sha(small), "0" * 64]).status_code == 200
    assert get(srv, "1" * 64).status_code == 404
    assert requests.delete(srv.url + "/healthz", timeout=TIMEOUT).status_code == 405
    return small


def test_promtool_finds_nothing_to_say(msrv):
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus; tools/install-deps.sh)")
    exercise(msrv)
    text = metrics(msrv)
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", (r.stdout, r.stderr, text)


def test_latency_histogram_by_route(msrv):
    data = os.urandom(100)
    assert put(msrv, data).status_code == 201
    for _ in range(7):
        assert get(msrv, sha(data)).status_code == 200
    s = samples(metrics(msrv))
    route = 'route="/v1/blobs/{hash}",method="GET"'
    count = s[("blobref_http_request_duration_seconds_count", "{" + route + "}")]
    assert count == 7
    buckets = sorted((float(l.split('le="')[1].rstrip('"}').replace("+Inf", "inf")), v)
                     for (n, l), v in s.items()
                     if n == "blobref_http_request_duration_seconds_bucket" and route in l)
    assert len(buckets) == 15 and buckets[-1] == (float("inf"), 7)
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), buckets  # cumulative
    assert 0 < s[("blobref_http_request_duration_seconds_sum", "{" + route + "}")] < 7 * 5
    put_count = s[("blobref_http_request_duration_seconds_count",
                   '{route="/v1/blobs/{hash}",method="PUT"}')]
    assert put_count == 1


def test_upload_steps_accumulate(msrv):
    before = samples(metrics(msrv))
    data = os.urandom(4 << 20)
    assert put(msrv, data).status_code == 201
    after = samples(metrics(msrv))
    for step in ("receive", "hash", "store_write", "store_commit", "index_commit"):
        key = ("blobref_upload_step_seconds_total", f'{{step="{step}"}}')
        assert after[key] > before[key], step
    # hashing 4 MiB takes a few ms at most; the steps are in seconds, not nanoseconds
    assert after[("blobref_upload_step_seconds_total", '{step="hash"}')] < 5


def test_cache_hits_and_misses(msrv):
    data = os.urandom(2000)
    assert put(msrv, data).status_code == 201
    t0 = metrics(msrv)
    assert get(msrv, sha(data)).content == data
    assert get(msrv, sha(data)).content == data
    assert get(msrv, sha(data)).content == data
    t1 = metrics(msrv)
    hit = 'blobref_cache_requests_total', '{result="hit"}'
    miss = 'blobref_cache_requests_total', '{result="miss"}'
    assert samples(t1)[miss] - samples(t0)[miss] == 1
    assert samples(t1)[hit] - samples(t0)[hit] == 2
    big = os.urandom(100 << 10)  # over cache_max_blob: not a cache lookup at all
    assert put(msrv, big).status_code == 201
    assert get(msrv, sha(big)).content == big
    t2 = metrics(msrv)
    assert samples(t2)[miss] == samples(t1)[miss] and samples(t2)[hit] == samples(t1)[hit]


def test_store_errors_by_store(msrv):
    big = os.urandom(100 << 10)
    assert put(msrv, big).status_code == 201
    key = ("blobref_store_errors_total", '{store="local",op="read"}')
    assert samples(metrics(msrv))[key] == 0
    object_path(msrv, sha(big)).unlink()
    assert get(msrv, sha(big)).status_code == 503
    s = samples(metrics(msrv))
    assert s[key] == 1
    assert s[("blobref_store_errors_total", '{store="local",op="write"}')] == 0


def test_connections_open(msrv):
    idle = [socket.create_connection(("127.0.0.1", msrv.port)) for _ in range(5)]
    try:
        # the connections are accepted asynchronously: wait for them to show up
        for _ in range(100):
            n = value(metrics(msrv), "blobref_connections_open")
            if n >= 6:
                break
        assert n >= 6, n  # the five plus the one asking
    finally:
        for s in idle:
            s.close()
