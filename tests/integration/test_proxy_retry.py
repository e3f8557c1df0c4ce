"""Proxied reads try the origin again on a 5xx or a broken connection while none of the failed
transfer's bytes went out (issue 19): a radosgw 500 on a GET used to become a 503
store_unavailable for the client, while the S3 client's own requests were retried. Bounded by the
store's `retries`, with backoff, counted in blobref_proxy_retries_total; a transfer whose bytes
already went out is never retried (the client sees a short body, as before).

The origin is test_verify's CorruptingOrigin (an http store over a folder) with its fault
switches: fail_next (500), reset_next (connection closed unanswered), cut_next (half a body)."""
import pytest
import requests

from conftest import Server
from test_verify import CorruptingOrigin, blobs_of, metric, raw_get
from util_http import TIMEOUT, assert_error, get, put, sha

KiB = 1024
RETRIES = 2


@pytest.fixture
def origin_srv(tmp_path):
    """Yields make(blobs, cache) -> (server, origin): the blobs in http store `origin`
    (serve = proxy, retries = RETRIES) behind a CorruptingOrigin."""
    made = []

    def make(blobs, cache="cache_size = 0\n"):
        site, data_dir = tmp_path / "site", tmp_path / "data"
        first = Server(data_dir, f"[store origin]\nkind = fs\nroot = {site}\n").start()
        for b in blobs:
            assert put(first, b).status_code == 201
        assert first.stop() == 0
        origin = CorruptingOrigin(site)
        conf = (f"[server]\nupload_store = a\n{cache}"
                f"[store a]\nkind = fs\nroot = {tmp_path / 'a'}\n"
                f"[store origin]\nkind = http\nurl = {origin.url}\nserve = proxy\n"
                f"retries = {RETRIES}\n")
        srv = Server(data_dir, conf).start()
        made.append((srv, origin))
        return srv, origin

    yield make
    for srv, origin in made:
        alive = srv.alive()
        rc = srv.stop()
        origin.close()
        assert alive and rc == 0, srv.read_log()


def test_whole_blob_get_is_retried_after_an_origin_500(origin_srv):
    """The origin answers 500 once: the client gets the whole blob (200, every byte), the
    retry is counted and logged."""
    data = blobs_of(11, [300 * KiB])[0]
    h = sha(data)
    srv, origin = origin_srv([data])
    assert metric(srv, "blobref_proxy_retries_total") == 0
    origin.fail_next = 1
    gets = origin.gets
    r = get(srv, h)
    assert r.status_code == 200 and r.content == data, (r.status_code, r.text[:200])
    assert r.headers["ETag"] == f'"{h}"'
    assert origin.gets == gets + 2
    assert metric(srv, "blobref_proxy_retries_total") == 1
    assert "HTTP 500" in srv.read_log() and "attempt 2 follows" in srv.read_log()


@pytest.mark.parametrize("fault", ["reset_next", "fail_next"])
def test_range_and_cached_reads_are_retried(origin_srv, fault):
    """A single range (206), several ranges (multipart) and a small blob fetched whole for the
    cache all survive one failed origin answer (500, or a connection closed unanswered)."""
    big, small = blobs_of(12, [200 * KiB, 6 * KiB])
    srv, origin = origin_srv([big, small], cache="")
    setattr(origin, fault, 1)
    r = get(srv, sha(big), headers={"Range": "bytes=1000-1999"})
    assert r.status_code == 206 and r.content == big[1000:2000], (r.status_code, r.text[:200])
    setattr(origin, fault, 1)
    r = get(srv, sha(big), headers={"Range": "bytes=0-9,150000-150009"})
    assert r.status_code == 206 and big[150000:150010] in r.content, r.status_code
    setattr(origin, fault, 1)
    r = get(srv, sha(small))
    assert r.status_code == 200 and r.content == small, (r.status_code, r.text[:200])
    assert getattr(origin, fault) == 0  # each fault was met
    # libcurl itself reconnects once when a reused connection turns out closed, so a reset on a
    # kept-alive connection may not reach the retry; every 500 does
    retried = metric(srv, "blobref_proxy_retries_total")
    assert retried == 3 if fault == "fail_next" else 1 <= retried <= 3


def test_retries_are_bounded(origin_srv):
    """An origin that keeps answering 500 is asked 1 + retries times, then the client gets a
    503 store_unavailable naming the origin's answer."""
    data = blobs_of(13, [100 * KiB])[0]
    srv, origin = origin_srv([data])
    origin.fail_next = 100
    gets = origin.gets
    err = assert_error(get(srv, sha(data)), 503, "store_unavailable")
    assert "HTTP 500" in err["error"]["message"], err
    assert origin.gets == gets + 1 + RETRIES
    assert metric(srv, "blobref_proxy_retries_total") == RETRIES
    origin.fail_next = 0
    assert get(srv, sha(data)).content == data


def test_not_found_is_not_retried(origin_srv, tmp_path):
    """A 404 is an answer, not a passing fault: asked once."""
    data = blobs_of(14, [100 * KiB])[0]
    h = sha(data)
    srv, origin = origin_srv([data])
    (tmp_path / "site" / f"sha256/{h[:2]}/{h[2:4]}/{h}").unlink()
    gets = origin.gets
    assert_error(get(srv, h), 503, "store_unavailable")
    assert origin.gets == gets + 1
    assert metric(srv, "blobref_proxy_retries_total") == 0


def test_a_transfer_whose_bytes_went_out_is_not_retried(origin_srv):
    """The origin sends half the body, then closes: those bytes went into the transfer's buffer
    (and its hash), so the read is not started over (that could send them twice); the client
    sees a short body, or a 503 when the cut came before its handler resumed (on a loaded
    machine), and nothing is counted."""
    data = blobs_of(15, [300 * KiB])[0]
    h = sha(data)
    srv, origin = origin_srv([data])
    origin.cut_next = 1
    gets = origin.gets
    status, headers, body = raw_get(srv, f"/v1/blobs/{h}")
    if status == 200:
        assert int(headers["content-length"]) == len(data)
        assert len(body) < len(data) and data.startswith(body)
    else:
        assert status == 503 and b"store_unavailable" in body, (status, body[:200])
    assert origin.gets == gets + 1
    assert metric(srv, "blobref_proxy_retries_total") == 0
    assert requests.get(f"{srv.url}/v1/blobs/{h}", timeout=TIMEOUT).content == data
