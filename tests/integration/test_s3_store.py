"""The s3 store against a real S3 server (Ceph radosgw, the `rgw` fixture): where uploads land,
dedup, digest mismatches, multipart uploads, redirects, proxied reads with ranges, readiness and
outages, radosgw killed mid-upload, peak memory of a huge upload, and `blobref refs` on a table
whose files live in a bucket. Every test checks the bucket with boto3, not only blobrefd's word."""
import calendar
import hashlib
import json
import os
import random
import re
import subprocess
import threading
import time
import urllib.parse

import pytest
import requests

from conftest import BIN_DIR, ROOT
from s3util import (Forwarder, LazyServer, assert_clean_bucket, content_key, get_bytes,
                    head_size, keys, multipart_uploads, s3_conf, stop_checked)
from util_http import (TIMEOUT, RawConn, assert_error, get, parse_ranges, post, put,
                       raw_exchange, repr_digest, request_head, sha, wait_until)

MiB = 1 << 20
PART = 5 * MiB


def rnd(n, seed):
    return random.Random(seed).randbytes(n)


def bucket_name(node):
    """A bucket per test, from its name (S3 rules: 3-63 lowercase letters, digits, '-')."""
    n = re.sub(r"[^a-z0-9]+", "-", node.name.lower()).strip("-")
    return (n[:40].strip("-") + "-" + hashlib.sha1(node.nodeid.encode()).hexdigest()[:8])


@pytest.fixture(scope="module", autouse=True)
def buckets_made_early(request):
    """Creates every bucket this module's tests use before any of them runs. After radosgw was
    killed (SIGKILL) and restarted, the first bucket creation or deletion waits about 28 s (a
    lock of the dead instance has to expire); creating them all up front keeps the tests that
    follow a kill fast (make_bucket of an existing bucket only empties it)."""
    items = [i for i in request.session.items if i.module is request.module]
    if not any("rgw" in getattr(i, "fixturenames", ()) for i in items):
        return
    rgw = request.getfixturevalue("rgw")
    for name in sorted({bucket_name(i) for i in items} | {"reads", "warehouse"}):
        rgw.make_bucket(name)


@pytest.fixture
def lake(rgw, tmp_path, request):
    """Factory: lake(**store_keys) -> (server, bucket) with a fresh bucket and a blobrefd whose
    upload store is an s3 store over it (serve = proxy unless said otherwise). At the end: the
    server stopped cleanly, and the bucket holds no staging object and no multipart upload."""
    made = []
    s3 = rgw.client()

    def make(server="", unready=False, bucket=None, create_bucket=True, **store_keys):
        b = bucket or bucket_name(request.node) + (f"-{len(made)}" if made else "")
        if create_bucket:
            rgw.make_bucket(b)
        srv = LazyServer(tmp_path / f"data{len(made)}", config_text=s3_conf(rgw, b, server=server,
                                                                            **store_keys))
        made.append((srv, b, store_keys.get("prefix") or "", create_bucket))
        srv.start_unready() if unready else srv.start()
        return srv, b

    yield make
    for srv, b, prefix, checked in made:
        if srv.proc is not None:
            stop_checked(srv)
        if checked and rgw.pid() is not None:
            # aborts of multipart uploads run on part workers after the answer: allow a moment
            wait_until(lambda: multipart_uploads(s3, b) == [], timeout=10)
            assert_clean_bucket(s3, b, prefix)


def upload_json(h, n, dedup):
    return {"sha256": h, "size": n, "dedup": dedup, "url": f"/v1/blobs/{h}"}


def gen(data, step=64 * 1024):
    def g():
        for i in range(0, len(data), step):
            yield data[i:i + step]
    return g()


# ---------------------------------------------------------------------------------------------
# Where uploads land


@pytest.mark.parametrize("prefix", ["", "p/"])
def test_put_lands_at_content_key(rgw, lake, prefix):
    srv, b = lake(prefix=prefix or None)
    s3 = rgw.client()
    data = rnd(70000, 1)
    h = sha(data)
    r = put(srv, data, headers={"Content-Type": "image/png"})
    assert r.status_code == 201, r.text
    assert r.json() == upload_json(h, 70000, False)
    k = content_key(h, prefix)
    assert keys(s3, b) == {k: 70000}
    assert head_size(s3, b, k) == 70000
    assert get_bytes(s3, b, k) == data
    meta = requests.get(f"{srv.url}/v1/blobs/{h}/meta", timeout=TIMEOUT).json()
    assert [(l["store"], l["key"], l["role"]) for l in meta["locations"]] == [("lake", k, "primary")]
    assert meta["size"] == 70000 and meta["content_type"] == "image/png"
    r = get(srv, h)
    assert r.status_code == 200 and r.content == data
    assert r.headers["Content-Type"] == "image/png"


@pytest.mark.parametrize("prefix", ["", "p/"])
def test_post_chunked_lands_at_content_key(rgw, lake, prefix):
    """POST (chunked, hash unknown): one part goes up as one PUT; above part_size the upload goes
    to a staging key, is copied to the content key and the staging object is deleted."""
    srv, b = lake(prefix=prefix or None, part_size="5MiB")
    s3 = rgw.client()
    small, big = rnd(300001, 2), rnd(12 * MiB + 12345, 3)
    r = post(srv, gen(small, 7000))
    assert r.status_code == 201, r.text
    assert r.json() == upload_json(sha(small), len(small), False)
    r = post(srv, gen(big))
    assert r.status_code == 201, r.text
    assert r.json() == upload_json(sha(big), len(big), False)
    want = {content_key(sha(small), prefix): len(small), content_key(sha(big), prefix): len(big)}
    assert keys(s3, b) == want  # no .staging/ object left
    assert multipart_uploads(s3, b) == []
    assert get_bytes(s3, b, content_key(sha(small), prefix)) == small
    assert get_bytes(s3, b, content_key(sha(big), prefix)) == big


# ---------------------------------------------------------------------------------------------
# Dedup


def test_dedup_put_post_and_expect_100(rgw, lake):
    srv, b = lake()
    s3 = rgw.client()
    data = rnd(200000, 4)
    h = sha(data)
    assert put(srv, data).status_code == 201
    k = content_key(h)
    before = s3.head_object(Bucket=b, Key=k)
    time.sleep(1.1)  # S3's Last-Modified has 1 s resolution
    r = put(srv, data)
    assert r.status_code == 200, r.text
    assert r.json() == upload_json(h, 200000, True)
    r = post(srv, gen(data))
    assert r.status_code == 200, r.text
    assert r.json() == upload_json(h, 200000, True)
    # Expect: 100-continue on a known blob: 200 before one body byte, as on the fs store.
    c = RawConn(srv)
    c.send(request_head("PUT", f"/v1/blobs/{h}", [("Content-Length", str(200000)),
                                                  ("Expect", "100-continue")]))
    head_bytes = c.sent
    raw = c.read_response()
    assert raw.status == 200, (raw.status, raw.body)
    assert json.loads(raw.body) == upload_json(h, 200000, True)
    assert c.sent == head_bytes
    assert c.closed_by_peer(5)
    c.close()
    # Nothing was written to S3 again.
    after = s3.head_object(Bucket=b, Key=k)
    assert after["LastModified"] == before["LastModified"] and after["ETag"] == before["ETag"]
    assert keys(s3, b) == {k: 200000}


def test_expect_100_unknown_blob_uploads(rgw, lake):
    srv, b = lake()
    data = rnd(150000, 5)
    h = sha(data)
    c = RawConn(srv)
    c.send(request_head("PUT", f"/v1/blobs/{h}", [("Content-Length", str(len(data))),
                                                  ("Expect", "100-continue")]))
    assert c.read_until(b"\r\n\r\n").startswith(b"HTTP/1.1 100 Continue\r\n")
    c.send(data)
    raw = c.read_response()
    assert raw.status == 201, raw.body
    c.close()
    assert get_bytes(rgw.client(), b, content_key(h)) == data


# ---------------------------------------------------------------------------------------------
# Digest mismatch


@pytest.mark.parametrize("size", [50000, 12 * MiB + 777], ids=["small", "multipart"])
def test_digest_mismatch_keeps_nothing(rgw, lake, size):
    srv, b = lake(part_size="5MiB")
    s3 = rgw.client()
    data = rnd(size, 6)
    claimed = sha(b"other bytes")
    r = put(srv, gen(data) if size > PART else data, hexd=claimed)
    assert_error(r, 400, "digest_mismatch")
    assert sha(data) in r.json()["error"]["message"]
    assert head_size(s3, b, content_key(claimed)) is None
    assert head_size(s3, b, content_key(sha(data))) is None
    # the multipart upload (parts under the claimed key) is aborted right after the answer
    assert wait_until(lambda: multipart_uploads(s3, b) == [], timeout=10), multipart_uploads(s3, b)
    assert keys(s3, b) == {}
    assert_error(get(srv, claimed), 404, "not_found")
    assert_error(get(srv, sha(data)), 404, "not_found")
    assert list((srv.data_dir / "spool" / "lake").iterdir()) == []
    # the right hash afterwards still works
    assert put(srv, gen(data), hexd=sha(data)).status_code == 201
    assert head_size(s3, b, content_key(sha(data))) == size


# ---------------------------------------------------------------------------------------------
# Multipart


def test_multipart_put_and_post_roundtrip(rgw, lake):
    srv, b = lake(part_size="5MiB")
    s3 = rgw.client()
    a, c = rnd(12 * MiB + 3, 7), rnd(3 * PART, 8)  # exactly three parts: the last one full
    r = put(srv, gen(a), hexd=sha(a))
    assert r.status_code == 201, r.text
    r = post(srv, gen(c, 100000))
    assert r.status_code == 201, r.text
    assert r.json() == upload_json(sha(c), len(c), False)
    for data in (a, c):
        k = content_key(sha(data))
        assert head_size(s3, b, k) == len(data)
        assert get_bytes(s3, b, k) == data
        r = get(srv, sha(data))
        assert r.status_code == 200 and r.content == data
    # the PUT went up as a three-part multipart upload straight under its key
    assert s3.head_object(Bucket=b, Key=content_key(sha(a)))["ETag"].endswith('-3"')
    assert keys(s3, b) == {content_key(sha(a)): len(a), content_key(sha(c)): len(c)}
    assert list((srv.data_dir / "spool" / "lake").iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Redirect mode


def max_age(cc):
    m = re.fullmatch(r"private, max-age=(\d+)", cc)
    assert m, cc
    return int(m.group(1))


def test_redirect_presigned(rgw, lake):
    srv, b = lake(serve="redirect", presign_ttl="10m")
    data = rnd(100000, 9)
    h = sha(data)
    assert put(srv, data).status_code == 201
    r = get(srv, h, allow_redirects=False)
    assert r.status_code == 307, r.text
    loc = r.headers["Location"]
    assert loc.startswith(f"{rgw.endpoint}/{b}/{content_key(h)}?"), loc
    assert "X-Amz-Expires=600" in loc and "X-Amz-Signature=" in loc
    n = max_age(r.headers["Cache-Control"])
    assert 0 < n <= 60  # cache_max_age (60 s) is below half the presign lifetime (300 s)
    got = requests.get(loc, timeout=TIMEOUT)
    assert got.status_code == 200 and got.content == data
    # requests follows it by itself too
    assert get(srv, h).content == data


def test_redirect_short_ttl_expires(rgw, lake):
    srv, b = lake(serve="redirect", presign_ttl="2s")
    data = rnd(5000, 10)
    h = sha(data)
    assert put(srv, data).status_code == 201
    r = get(srv, h, allow_redirects=False)
    assert r.status_code == 307
    assert max_age(r.headers["Cache-Control"]) <= 1  # at most half of presign_ttl
    loc = r.headers["Location"]
    # read within its 2 s; a 403 answered after the expiry (a loaded box) proves nothing either
    # way: ask for a redirect again (the cached URL is replaced once half of it has passed)
    for _ in range(5):
        signed, expires = amz_window(loc)
        got = requests.get(loc, timeout=TIMEOUT)
        if got.status_code == 200 or time.time() < expires:
            break
        r = get(srv, h, allow_redirects=False)
        assert r.status_code == 307, r.text
        loc = r.headers["Location"]
    assert got.status_code == 200 and got.content == data, got.status_code
    # refused once the 2 s are over: awaited rather than slept
    deadline = time.monotonic() + 30
    while (got := requests.get(loc, timeout=TIMEOUT)).status_code == 200:
        assert time.monotonic() < deadline, "a 2 s URL still answered 200 after 30 s"
        time.sleep(0.1)
    assert got.status_code == 403 and time.time() >= expires - 1, (got.status_code, expires)


def amz_window(loc):
    """(X-Amz-Date, X-Amz-Date + X-Amz-Expires) of a presigned URL, in seconds since the epoch."""
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(loc).query)
    signed = calendar.timegm(time.strptime(q["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ"))
    return signed, signed + int(q["X-Amz-Expires"][0])


def timed_redirect(srv, h):
    """(Location, max-age, time just before asking) of a redirect to blob h."""
    before = time.time()
    r = get(srv, h, allow_redirects=False)
    assert r.status_code == 307, r.text
    return r.headers["Location"], max_age(r.headers["Cache-Control"]), before


def test_redirect_presigned_reused_within_half_ttl(rgw, lake):
    """Presigned URLs are cached: a second redirect within half of presign_ttl gives the same
    Location, and its max-age stays within half of what is left of that URL."""
    srv, b = lake(serve="redirect", presign_ttl="4s")
    data = rnd(7000, 14)
    h = sha(data)
    assert put(srv, data).status_code == 201
    loc1, age1, t1 = timed_redirect(srv, h)
    loc2, age2, t2 = timed_redirect(srv, h)
    signed, expires = amz_window(loc1)
    assert t2 <= signed + 2, "the machine is too slow for a 4 s window"
    assert loc2 == loc1
    assert "X-Amz-Expires=4&" in loc1
    for age, t in ((age1, t1), (age2, t2)):
        assert age <= (expires - t) / 2, (age, expires - t)
    assert requests.get(loc2, timeout=TIMEOUT).content == data
    # another blob gets its own URL
    other = rnd(7000, 15)
    assert put(srv, other).status_code == 201
    loc3, _, _ = timed_redirect(srv, sha(other))
    assert loc3 != loc1 and f"/{content_key(sha(other))}?" in loc3


def test_redirect_presigned_refreshed_after_half_ttl(rgw, lake):
    """Once less than half of presign_ttl is left of the cached URL, a fresh one is signed; the
    old one still works until it expires, then S3 refuses it."""
    srv, b = lake(serve="redirect", presign_ttl="4s")
    data = rnd(6000, 16)
    h = sha(data)
    assert put(srv, data).status_code == 201
    loc1, _, _ = timed_redirect(srv, h)
    signed1, expires1 = amz_window(loc1)
    time.sleep(max(0.0, signed1 + 2.2 - time.time()))  # under half of the 4 s is left
    loc2, age2, t2 = timed_redirect(srv, h)
    signed2, expires2 = amz_window(loc2)
    assert loc2 != loc1 and signed2 > signed1, (loc1, loc2)
    assert age2 <= (expires2 - t2) / 2
    assert requests.get(loc2, timeout=TIMEOUT).content == data
    loc3, _, _ = timed_redirect(srv, h)
    assert loc3 == loc2  # and the fresh one is what is cached now
    if time.time() < expires1 - 0.5:
        assert requests.get(loc1, timeout=TIMEOUT).content == data
    time.sleep(max(0.0, expires1 + 1.2 - time.time()))
    assert requests.get(loc1, timeout=TIMEOUT).status_code == 403


def test_redirect_cdn_url(rgw, lake):
    srv, b = lake(serve="redirect", cdn_url="http://cdn.example/base")
    data = rnd(3000, 11)
    h = sha(data)
    assert put(srv, data).status_code == 201
    r = get(srv, h, allow_redirects=False)
    assert r.status_code == 307
    assert r.headers["Location"] == f"http://cdn.example/base/{content_key(h)}"
    assert 0 < max_age(r.headers["Cache-Control"]) <= 60


def test_redirect_active_types_are_downloads(rgw, lake):
    """A presigned redirect of an active type (HTML, SVG) signs
    response-content-disposition=attachment, so S3 itself answers with Content-Disposition;
    a raster image stays inline. The URL cache keeps the two kinds apart."""
    srv, b = lake(serve="redirect", presign_ttl="10m")
    html = b"<html><script>document.title='ran'</script></html>" + rnd(100, 30)
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>1</script></svg>' + rnd(10, 31)
    png = b"\x89PNG\r\n\x1a\n" + rnd(2000, 32)
    for data, ctype in ((html, "text/html"), (svg, "image/svg+xml"), (png, "image/png")):
        assert put(srv, data, headers={"Content-Type": ctype}).status_code == 201
    for data, attachment in ((html, True), (svg, True), (png, False), (html, True)):
        r = get(srv, sha(data), allow_redirects=False)
        assert r.status_code == 307, r.text
        loc = r.headers["Location"]
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(loc).query)
        assert q.get("response-content-disposition") == (["attachment"] if attachment else None), loc
        got = requests.get(loc, timeout=TIMEOUT)
        assert got.status_code == 200 and got.content == data, got.text[:300]
        if attachment:
            assert got.headers.get("Content-Disposition") == "attachment", got.headers
        else:
            assert "Content-Disposition" not in got.headers, got.headers
    # the same object read inline by boto3 has no disposition: it came from the URL alone
    head = rgw.client().head_object(Bucket=b, Key=content_key(sha(html)))
    assert "ContentDisposition" not in head, head


def test_redirect_cdn_url_proxies_active_types(rgw, lake):
    """cdn_url cannot carry a signed response-content-disposition: an active type is proxied
    with blobrefd's own headers; a passive one still goes to the CDN."""
    srv, b = lake(serve="redirect", cdn_url="http://cdn.example/base")
    html, png = b"<html><script>1</script></html>", b"\x89PNG\r\n\x1a\n" + rnd(500, 33)
    assert put(srv, html, headers={"Content-Type": "text/html"}).status_code == 201
    assert put(srv, png, headers={"Content-Type": "image/png"}).status_code == 201
    assert get(srv, sha(png), allow_redirects=False).status_code == 307
    r = get(srv, sha(html), allow_redirects=False)
    assert r.status_code == 200 and r.content == html, (r.status_code, r.headers)
    assert r.headers["Content-Disposition"] == "attachment"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Content-Security-Policy"] == "default-src 'none'; sandbox"


def test_proxied_reads_are_confined(rgw, lake):
    """serve = proxy: the bytes come through blobrefd, with its headers, cached or streamed."""
    srv, b = lake()
    for data in (b"<svg xmlns='http://www.w3.org/2000/svg'/>" + rnd(100, 34),
                 b"<html>" + rnd(200 * 1024, 35)):
        assert put(srv, data, headers={"Content-Type": "image/svg+xml"}).status_code == 201
        for headers in ({}, {"Range": "bytes=0-3"}, {"Range": "bytes=0-1,4-5"}):
            r = get(srv, sha(data), headers=headers)
            assert r.status_code in (200, 206), r.text
            assert r.headers["Content-Disposition"] == "attachment", (headers, r.headers)
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            assert r.headers["Content-Security-Policy"] == "default-src 'none'; sandbox"


# ---------------------------------------------------------------------------------------------
# Proxied reads


SMALL = rnd(10000, 12)       # below cache_max_blob: fetched whole, verified, cached
BIG = rnd(3 * MiB + 5, 13)   # streamed


@pytest.fixture(scope="module")
def reader(rgw, tmp_path_factory):
    """One proxy-mode server over bucket `reads` holding SMALL (twice: one copy is never read
    whole before the range tests) and BIG."""
    b = rgw.make_bucket("reads")
    srv = LazyServer(tmp_path_factory.mktemp("reads") / "data",
                     config_text=s3_conf(rgw, b, part_size="5MiB")).start()
    for data in (SMALL, BIG):
        assert put(srv, data, headers={"Content-Type": "image/jpeg"}).status_code == 201
    yield srv
    stop_checked(srv)


def check_blob_headers(r, data):
    assert r.headers["ETag"] == f'"{sha(data)}"'
    assert r.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert r.headers["Accept-Ranges"] == "bytes"
    assert r.headers["Repr-Digest"] == repr_digest(data)


def ranged(srv, h, spec, **headers):
    return get(srv, h, headers=dict(headers, Range="bytes=" + spec))


@pytest.mark.parametrize("which", ["small", "big"])
def test_proxy_reads(reader, which):
    data = SMALL if which == "small" else BIG
    n = len(data)
    h = sha(data)
    # the first read is a range: for the small blob this is the fetch-whole-and-cache path
    for spec, first, last in [("0-99", 0, 99), (f"{n // 2}-{n // 2 + 999}", n // 2, n // 2 + 999),
                              ("-500", n - 500, n - 1), (f"{n - 1234}-", n - 1234, n - 1),
                              (f"{n - 10}-{n + 100}", n - 10, n - 1)]:
        r = ranged(reader, h, spec)
        assert r.status_code == 206, (spec, r.status_code, r.text[:200])
        assert r.headers["Content-Range"] == f"bytes {first}-{last}/{n}", spec
        assert r.headers["Content-Length"] == str(last - first + 1)
        assert r.headers["Content-Type"] == "image/jpeg"
        check_blob_headers(r, data)
        assert r.content == data[first:last + 1], spec
    r = get(reader, h)
    assert r.status_code == 200 and r.content == data
    assert r.headers["Content-Length"] == str(n)
    check_blob_headers(r, data)
    r = requests.head(f"{reader.url}/v1/blobs/{h}", timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["Content-Length"] == str(n) and r.content == b""
    # multiple ranges: multipart/byteranges, each part compared
    spec = f"0-9,1000-1999,{n - 4096}-{n - 4000},-7"
    r = ranged(reader, h, spec)
    parts = parse_ranges(r.status_code, r.headers, r.content)
    want = [(0, 9), (1000, 1999), (n - 4096, n - 4000), (n - 7, n - 1)]
    assert [(p[0], p[1], p[2]) for p in parts] == [(a, z, n) for a, z in want]
    for (a, z), p in zip(want, parts):
        assert p[3] == data[a:z + 1]
        assert p[4]["content-type"] == "image/jpeg"
    assert int(r.headers["Content-Length"]) == len(r.content)
    # If-Range
    r = ranged(reader, h, "10-19", **{"If-Range": f'"{h}"'})
    assert r.status_code == 206 and r.content == data[10:20]
    r = ranged(reader, h, "10-19", **{"If-Range": '"' + "0" * 64 + '"'})
    assert r.status_code == 200 and r.content == data
    # If-None-Match
    r = get(reader, h, headers={"If-None-Match": f'"{h}"'})
    assert r.status_code == 304 and r.content == b""
    assert r.headers["ETag"] == f'"{h}"'
    # unsatisfiable
    r = ranged(reader, h, f"{n}-")
    assert_error(r, 416, "range_not_satisfiable")
    assert r.headers["Content-Range"] == f"bytes */{n}"


def test_proxy_reads_concurrent(reader):
    """Many proxied reads at once (the curl multi loop), each byte-exact."""
    errors = []

    def one(i):
        try:
            a = (i * 7919) % (len(BIG) - 70000)
            r = ranged(reader, sha(BIG), f"{a}-{a + 65535}")
            assert r.status_code == 206 and r.content == BIG[a:a + 65536]
            if i % 8 == 0:
                assert get(reader, sha(BIG)).content == BIG
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert errors == []


def test_small_blob_whole_get_first(reader):
    """A small blob whose first read is a whole GET (collect, verify, cache), then from cache."""
    data = rnd(64 * 1024, 14)  # exactly cache_max_blob
    assert put(reader, data).status_code == 201
    for _ in range(2):
        r = get(reader, sha(data))
        assert r.status_code == 200 and r.content == data
        check_blob_headers(r, data)
    r = ranged(reader, sha(data), "65530-")
    assert r.status_code == 206 and r.content == data[65530:]


# ---------------------------------------------------------------------------------------------
# Readiness and failures


def ready_error(srv):
    r = requests.get(srv.url + "/readyz", timeout=TIMEOUT)
    return None if r.status_code == 200 else (r.status_code, r.json()["error"])


def test_wrong_secret_not_ready(rgw, lake):
    srv, b = lake(unready=True, secret_key="not-the-secret")
    got = wait_until(lambda: (lambda e: e if e and "credentials" in e[1]["message"] else None)(
        ready_error(srv)), timeout=10)
    assert got, ready_error(srv)
    status, err = got
    assert status == 503 and err["code"] == "not_ready"
    assert "store lake" in err["message"] and b in err["message"], err
    # it stays unready; an upload is refused by S3 with 403: 502 store_error naming the store
    time.sleep(1.5)
    assert ready_error(srv)[0] == 503
    r = put(srv, b"some bytes")
    body = assert_error(r, 502, "store_error")
    assert "store lake" in body["error"]["message"] and "403" in body["error"]["message"], body


def test_missing_bucket_not_ready(rgw, lake):
    srv, b = lake(unready=True, bucket="no-such-bucket-here", create_bucket=False)
    got = wait_until(lambda: (lambda e: e if e and "does not exist" in e[1]["message"] else None)(
        ready_error(srv)), timeout=10)
    assert got, ready_error(srv)
    status, err = got
    assert status == 503 and err["code"] == "not_ready"
    assert "no-such-bucket-here" in err["message"] and "store lake" in err["message"], err


def test_bucket_gone_upload_is_502(rgw, lake):
    """S3 refusing an upload with a 4xx (here NoSuchBucket) is a 502 store_error."""
    srv, b = lake(part_size="5MiB")
    s3 = rgw.client()
    s3.delete_bucket(Bucket=b)
    try:
        r = put(srv, rnd(1000, 17))
        body = assert_error(r, 502, "store_error")
        assert "store lake" in body["error"]["message"] and "404" in body["error"]["message"]
        r = raw_upload(srv, rnd(6 * MiB, 18))
        body = assert_error(r, 502, "store_error")
        assert "store lake" in body["error"]["message"]
    finally:
        rgw.make_bucket(b)



def raw_upload(srv, data, hexd=None, chunk=64 * 1024, timeout=15):
    """PUT /v1/blobs/HEX (hexd given) or a chunked POST over a raw socket that tolerates an early
    answer (the server may refuse before the body ends and close). Returns a requests-like
    response (status_code, json(), headers) or None when the connection closed unanswered."""
    if hexd:
        head = request_head("PUT", f"/v1/blobs/{hexd}", [("Content-Length", str(len(data)))])

        def body():
            for i in range(0, len(data), chunk):
                yield data[i:i + chunk]
    else:
        head = request_head("POST", "/v1/blobs", [("Transfer-Encoding", "chunked")])

        def body():
            for i in range(0, len(data), chunk):
                piece = data[i:i + chunk]
                yield b"%x\r\n" % len(piece) + piece + b"\r\n"
            yield b"0\r\n\r\n"
    raw, _sent = raw_exchange(srv, head, body, timeout=timeout)
    return None if raw is None else RawAsResponse(raw)


class RawAsResponse:
    def __init__(self, raw):
        self.raw = raw
        self.status_code = raw.status
        self.content = raw.body
        self.text = raw.body.decode(errors="replace")
        self.headers = requests.structures.CaseInsensitiveDict(raw.headers)

    def json(self):
        return json.loads(self.raw.body)


def timed(fn):
    t0 = time.monotonic()
    r = fn()
    return r, time.monotonic() - t0


def test_rgw_killed_then_restarted(rgw, lake):
    srv, b = lake(part_size="5MiB")
    big = rnd(2 * MiB, 15)  # never cached: every read goes to S3
    assert put(srv, big).status_code == 201
    assert get(srv, sha(big)).content == big
    try:
        rgw.kill()
        timings = []
        for i in range(3):
            d = rnd(30000, 100 + i)
            r, dt = timed(lambda: raw_upload(srv, d, hexd=sha(d)))
            timings.append(("put", dt))
            assert_error(r, 503, "store_unavailable")
            assert "store lake" in r.json()["error"]["message"]
            if i == 0:  # the circuit breaker is open: /readyz says so at once, not at the next check
                got = ready_error(srv)
                assert got and got[0] == 503 and "store lake" in got[1]["message"], got
            r, dt = timed(lambda: raw_upload(srv, rnd(6 * MiB, 110 + i)))
            timings.append(("post multipart", dt))
            assert_error(r, 503, "store_unavailable")
            r, dt = timed(lambda: get(srv, sha(big)))
            timings.append(("get", dt))
            assert_error(r, 503, "store_unavailable")
            assert "lake" in r.json()["error"]["message"]
            r, dt = timed(lambda: ranged(srv, sha(big), "0-99"))
            timings.append(("range", dt))
            assert_error(r, 503, "store_unavailable")
            time.sleep(1.1)  # across the circuit breaker's 2 s window
        print("timings while radosgw is down:", [(w, round(t, 3)) for w, t in timings])
        assert max(t for _, t in timings) < 5, timings
        got = wait_until(lambda: ready_error(srv), timeout=8)
        assert got and got[0] == 503 and got[1]["code"] == "not_ready", got
        assert "store lake" in got[1]["message"], got
        # HEAD of the whole needs no store: still answered from the index
        r = requests.head(f"{srv.url}/v1/blobs/{sha(big)}", timeout=TIMEOUT)
        assert r.status_code == 200 and r.headers["Content-Length"] == str(len(big))
    finally:
        rgw.restart()
    t0 = time.monotonic()
    assert wait_until(lambda: ready_error(srv) is None, timeout=10, step=0.1), ready_error(srv)
    print(f"ready again {time.monotonic() - t0:.2f} s after radosgw restarted")
    assert get(srv, sha(big)).content == big
    data = rnd(30000, 120)
    assert put(srv, data).status_code == 201
    assert get(srv, sha(data)).content == data
    assert list((srv.data_dir / "spool" / "lake").iterdir()) == []


@pytest.mark.parametrize("size", [20000, 300000], ids=["cached-path", "streamed"])
def test_object_gone_behind_our_back(rgw, lake, size):
    srv, b = lake()
    s3 = rgw.client()
    data = rnd(size, 16)
    h = sha(data)
    assert put(srv, data).status_code == 201
    s3.delete_object(Bucket=b, Key=content_key(h))
    r = get(srv, h)
    # The presigned GET gets S3's 404: blobrefd answers 503 store_unavailable (the index has the
    # blob, the store does not: the store is at fault, not the client), naming store and status.
    body = assert_error(r, 503, "store_unavailable")
    assert "store lake" in body["error"]["message"] and "404" in body["error"]["message"], body
    r = ranged(srv, h, "0-9")
    assert_error(r, 503, "store_unavailable")
    # and the log says the index and the store disagree
    assert "answers 404" in srv.read_log()


# ---------------------------------------------------------------------------------------------
# radosgw killed in the middle of an upload


@pytest.mark.parametrize("method", ["PUT", "POST"])
def test_rgw_killed_mid_upload(rgw, lake, method):
    """A 30 MB upload sent slowly; radosgw dies when half of it was sent; the rest is sent. The
    client gets no 2xx; afterwards nothing is under the content key, the blob is not indexed,
    and the spool holds nothing."""
    srv, b = lake(part_size="5MiB")
    s3 = rgw.client()
    data = rnd(30 * 1000 * 1000, 19)
    h = sha(data)
    step = 512 * 1024
    if method == "PUT":
        head = request_head("PUT", f"/v1/blobs/{h}", [("Content-Length", str(len(data)))])
    else:
        head = request_head("POST", "/v1/blobs", [("Transfer-Encoding", "chunked")])
    conn = RawConn(srv, timeout=30)
    conn.send(head)
    state = {"sent": 0, "error": None, "killed_at": None}
    killed = threading.Event()

    def sender():
        try:
            for i in range(0, len(data), step):
                piece = data[i:i + step]
                if method == "POST":
                    piece = b"%x\r\n" % len(piece) + piece + b"\r\n"
                conn.sock.sendall(piece)
                state["sent"] += len(data[i:i + step])
                if state["sent"] >= len(data) // 2 and not killed.is_set():
                    time.sleep(1.0)  # let the parts of the first half reach S3
                    rgw.kill()
                    state["killed_at"] = state["sent"]
                    killed.set()
                time.sleep(0.03)
            if method == "POST":
                conn.sock.sendall(b"0\r\n\r\n")
        except OSError as e:  # the server may answer early and close
            state["error"] = repr(e)

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    try:
        try:
            raw = conn.read_response()
        except (EOFError, ConnectionResetError):
            raw = None
        t.join(60)
        assert killed.is_set(), state
        assert raw is None or not 200 <= raw.status < 300, (raw.status, raw.body)
        if raw is not None:
            assert_raw_error_any(raw, {503: "store_unavailable", 502: "store_error"})
        print(f"{method}: answer {raw.status if raw else 'none (closed)'}"
              f"{' ' + raw.body.decode() if raw else ''}; sent {state['sent']} bytes, radosgw "
              f"killed after {state['killed_at']}; sender: {state['error']}")
    finally:
        conn.close()
        rgw.restart()
    assert wait_until(lambda: ready_error(srv) is None, timeout=10, step=0.1), ready_error(srv)
    assert head_size(s3, b, content_key(h)) is None
    assert_error(get(srv, h), 404, "not_found")
    assert wait_until(lambda: list((srv.data_dir / "spool" / "lake").iterdir()) == [], timeout=5), \
        list((srv.data_dir / "spool" / "lake").iterdir())
    # an abort that failed while S3 was down is retried by the health check (every 1-5 s)
    wait_until(lambda: multipart_uploads(s3, b) == [], timeout=12, step=0.2)
    left = multipart_uploads(s3, b)
    print(f"{method}: multipart uploads left after the restart: {left}")
    for k, uid in left:
        assert k == content_key(h) or k.startswith(".staging/up-"), k
        s3.abort_multipart_upload(Bucket=b, Key=k, UploadId=uid)  # for the fixture's check
    assert keys(s3, b) == {}
    # /readyz says 200 only once the circuit breaker (2 s from the last connect failure) has
    # closed too: uploads work at once.
    t0 = time.monotonic()
    assert wait_until(lambda: put(srv, data[:100000]).status_code == 201, timeout=2, step=0.2)
    print(f"{method}: uploads work again {time.monotonic() - t0:.2f} s after /readyz said 200")
    assert not left, left


def assert_raw_error_any(raw, allowed):
    body = json.loads(raw.body)
    assert raw.status in allowed and body["error"]["code"] == allowed[raw.status], \
        (raw.status, body)
    assert "store lake" in body["error"]["message"], body


# ---------------------------------------------------------------------------------------------
# blobref refs -c FILE NAME on a table whose files live in a bucket


def upload_tree(s3, bucket, root, prefix):
    n = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            s3.upload_file(p, bucket, prefix + os.path.relpath(p, root))
            n += 1
    return n


def refs_conf(rgw, tmp_path, location, name="t", secret_key=None):
    conf = tmp_path / f"refs-{name}.conf"
    conf.write_text(s3_conf(rgw, "blobs-unused", secret_key=secret_key) +
                    f"\n[table {name}]\nlocation = {location}\ncolumn = image_sha256\n"
                    f"store = lake\n")
    return conf


def run_refs(conf, name="t", *args):
    return subprocess.run([str(BIN_DIR / "blobref"), "refs", "-c", str(conf), name, *args],
                          capture_output=True, text=True, timeout=120)


def test_refs_table_in_bucket(rgw, tmp_path):
    from test_iceberg_refs import build_history
    s3 = rgw.client()
    rgw.make_bucket("warehouse")
    t = build_history(tmp_path, 2, "hex")  # its files say s3://warehouse/db/t/...
    t.hint("5\n")
    assert upload_tree(s3, "warehouse", t.root, "db/t/") > 10
    v5 = t.expect("f2.parquet", "f3.parquet", "f4.parquet", "f5.parquet")
    # the table folder (through metadata/version-hint.text)
    res = run_refs(refs_conf(rgw, tmp_path, "s3://warehouse/db/t"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == v5
    assert res.stderr == ""
    # a metadata.json path: v4 still retains the first snapshots
    res = run_refs(refs_conf(rgw, tmp_path, "s3://warehouse/db/t/metadata/v4.metadata.json"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == t.expect(*[f"f{i}.parquet" for i in range(1, 6)])
    res = run_refs(refs_conf(rgw, tmp_path, "s3://warehouse/db/t"), "t", "--count")
    assert res.returncode == 0 and res.stdout.strip() == str(len(v5)), res
    # --files prints the s3:// paths
    res = run_refs(refs_conf(rgw, tmp_path, "s3://warehouse/db/t"), "t", "--files")
    assert res.returncode == 0, res.stderr
    assert sorted({l.split("\t")[1] for l in res.stdout.splitlines()}) == \
        [f"s3://warehouse/db/t/data/f{i}.parquet" for i in range(2, 6)]
    # failures are errors naming what failed, never a partial list
    s3.delete_object(Bucket="warehouse", Key="db/t/data/f3.parquet")
    res = run_refs(refs_conf(rgw, tmp_path, "s3://warehouse/db/t"))
    assert res.returncode == 1 and res.stdout == "", res
    assert "s3://warehouse/db/t/data/f3.parquet" in res.stderr, res.stderr
    res = run_refs(refs_conf(rgw, tmp_path, "s3://warehouse/db/t", secret_key="wrong"))
    assert res.returncode == 1 and res.stdout == "" and "403" in res.stderr, res
    res = run_refs(refs_conf(rgw, tmp_path, "s3://warehouse/db/nope"))
    assert res.returncode == 1 and res.stdout == "" and "version-hint" in res.stderr, res


def test_refs_s3_folder_follows_newer_versions_than_the_hint(rgw, tmp_path):
    """A version hint lags behind when a writer crashed between writing vN.metadata.json and the
    hint; readers (Hadoop tables, and blobref on a local folder) then follow vN+1, vN+2... that
    exist. Stopping at the hint would miss the newest snapshots' references."""
    from test_iceberg_refs import build_history, refs
    s3 = rgw.client()
    rgw.make_bucket("warehouse")
    t = build_history(tmp_path, 2, "hex")
    t.hint("3\n")
    upload_tree(s3, "warehouse", t.root, "db/t/")
    v5 = t.expect("f2.parquet", "f3.parquet", "f4.parquet", "f5.parquet")
    local = refs(t.root, "--column", "image_sha256")
    assert local.returncode == 0 and local.stdout.split() == v5, local
    res = run_refs(refs_conf(rgw, tmp_path, "s3://warehouse/db/t"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == v5


# ---------------------------------------------------------------------------------------------
# Peak memory of a huge upload (release binary: the sanitizer build's shadow memory is no measure).
# 2 GiB with BLOBREF_SLOW=1 (16 s alone here, but up to 100 s late in the whole suite), else
# 512 MiB; BLOBREF_HUGE_BYTES sets another size. 2 GiB needs radosgw's memstore above 2 GiB
# (start-rgw.sh: 4 GiB).


def proc_status_kib(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


SLOW = os.environ.get("BLOBREF_SLOW") == "1"
HUGE = int(os.environ.get("BLOBREF_HUGE_BYTES", str(2 << 30 if SLOW else 512 << 20)))


def test_huge_put_peak_rss(rgw, lake, monkeypatch):
    """A 2 GiB (or 512 MiB) PUT (part_size 16 MiB: 128 parts) streamed to the release blobrefd: its peak RSS
    (VmHWM) stays under 64 MiB; the object in S3 has every byte (size, parts, sampled ranges)."""
    release = ROOT / "bin" / "blobrefd"
    if not release.exists():
        pytest.skip("bin/blobrefd is not built (make all)")
    import conftest
    monkeypatch.setattr(conftest, "BIN_DIR", ROOT / "bin")
    import s3util
    monkeypatch.setattr(s3util, "BIN_DIR", ROOT / "bin")
    srv, b = lake()
    s3 = rgw.client()
    block = rnd(1 << 20, 20)

    def mib(i):  # MiB number i of the blob: the random block, stamped with i
        return i.to_bytes(8, "little") + block[8:]
    nblocks = HUGE >> 20
    hasher = hashlib.sha256()
    for i in range(nblocks):
        hasher.update(mib(i))
    h = hasher.hexdigest()
    pid = srv.proc.pid
    before = proc_status_kib(pid, "VmHWM")
    conn = RawConn(srv, timeout=600)
    t0 = time.monotonic()
    conn.send(request_head("PUT", f"/v1/blobs/{h}", [("Content-Length", str(nblocks << 20))]))
    rss_max = [0]
    stop = threading.Event()

    def sampler():
        while not stop.wait(0.2):
            rss_max[0] = max(rss_max[0], proc_status_kib(pid, "VmRSS"))
    ts = threading.Thread(target=sampler, daemon=True)
    ts.start()
    for i in range(nblocks):
        conn.sock.sendall(mib(i))
    raw = conn.read_response()
    took = time.monotonic() - t0
    stop.set()
    ts.join()
    conn.close()
    after = proc_status_kib(pid, "VmHWM")
    print(f"{HUGE / 2**30:.2f} GiB PUT in {took:.1f} s: blobrefd VmHWM {before / 1024:.1f} MiB "
          f"before, {after / 1024:.1f} MiB after (VmRSS sampled max {rss_max[0] / 1024:.1f} MiB)")
    assert raw.status == 201, raw.body
    assert json.loads(raw.body) == upload_json(h, nblocks << 20, False)
    assert after < 64 * 1024, f"peak RSS {after / 1024:.1f} MiB"
    k = content_key(h)
    head = s3.head_object(Bucket=b, Key=k)
    assert head["ContentLength"] == nblocks << 20
    assert head["ETag"].endswith(f'-{(nblocks + 15) // 16}"'), head["ETag"]
    for i in (0, 1, nblocks // 2, nblocks - 1):
        got = s3.get_object(Bucket=b, Key=k, Range=f"bytes={i << 20}-{(i << 20) + 4095}")
        assert got["Body"].read() == mib(i)[:4096]
        r = ranged(srv, h, f"{(i << 20) + 100}-{(i << 20) + 199}")
        assert r.status_code == 206 and r.content == mib(i)[100:200]
    assert list((srv.data_dir / "spool" / "lake").iterdir()) == []
    s3.delete_object(Bucket=b, Key=k)


class FrozenRgw:
    """radosgw stopped with SIGSTOP for the with-block: the kernel still accepts connections on its
    port, nothing ever answers (an overloaded or hung S3)."""

    def __init__(self, rgw):
        self.pid = rgw.pid()

    def __enter__(self):
        import signal
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        import signal
        os.kill(self.pid, signal.SIGCONT)


def test_rgw_frozen_not_ready(rgw, lake):
    """/readyz turns 503 within seconds when S3 stops answering (the health probe has its own
    short timeout: twice connect_timeout), and 200 again once it answers. Worst case: the 5 s
    between probes of a healthy store plus one probe."""
    srv, b = lake(connect_timeout="1s")
    with FrozenRgw(rgw):
        t0 = time.monotonic()
        got = wait_until(lambda: ready_error(srv), timeout=15, step=0.2)
        took = time.monotonic() - t0
    print(f"frozen radosgw: /readyz 503 after {took:.2f} s: {got}")
    assert got and got[0] == 503 and got[1]["code"] == "not_ready", got
    assert "store lake" in got[1]["message"], got
    assert took < 10, took
    assert wait_until(lambda: ready_error(srv) is None, timeout=10, step=0.1), ready_error(srv)


def test_rgw_frozen_requests_fail_fast(rgw, lake):
    """An S3 that accepts connections but never answers fails requests after stall_timeout."""
    srv, b = lake(part_size="5MiB", stall_timeout="2s")
    big = rnd(2 * MiB, 21)
    assert put(srv, big).status_code == 201
    small = rnd(30000, 22)
    obs = {}
    with FrozenRgw(rgw):
        for what, fn in [("put", lambda: requests.put(f"{srv.url}/v1/blobs/{sha(small)}",
                                                      data=small, timeout=6)),
                         ("get", lambda: requests.get(f"{srv.url}/v1/blobs/{sha(big)}",
                                                      timeout=6))]:
            t0 = time.monotonic()
            try:
                r = fn()
                obs[what] = (r.status_code, round(time.monotonic() - t0, 2), r.text[:150])
            except requests.RequestException as e:
                obs[what] = (type(e).__name__, round(time.monotonic() - t0, 2))
    print("frozen radosgw:", obs)
    assert wait_until(lambda: ready_error(srv) is None, timeout=10, step=0.1), ready_error(srv)
    assert obs["put"][0] == 503 and obs["put"][1] < 5, obs
    assert obs["get"][0] == 503 and obs["get"][1] < 5, obs


def test_refs_reads_only_the_hash_column(rgw, tmp_path):
    """blobref refs reads Parquet files on S3 with ranged GETs: a file whose other column is
    bulky is not downloaded whole."""
    from test_iceberg_refs import PREFIX, Table, sha as hsha
    s3 = rgw.client()
    rgw.make_bucket("warehouse")
    t = Table(tmp_path / "bulky", version=2)
    hashes = [hsha(i, "bulky") for i in range(40)]
    t.data("a.parquet", hashes, codec="uncompressed")
    t.job["parquet"][0]["payload_bytes"] = 64 * 1024
    ma = t.manifest("ma.avro", [(1, "a.parquet")])
    ml = t.manifest_list("l.avro", [ma])
    t.write()
    t.metadata(1, [(1, ml)])
    t.hint("1\n")
    size = (t.root / "data" / "a.parquet").stat().st_size
    assert size > 40 * 64 * 1024
    upload_tree(s3, "warehouse", t.root, "db/t/")
    assert PREFIX == "s3://warehouse/db/t"
    fwd = Forwarder(int(rgw.endpoint.rsplit(":", 1)[1]))
    try:
        conf = tmp_path / "refs.conf"
        conf.write_text(s3_conf(rgw, "blobs-unused", endpoint=f"http://127.0.0.1:{fwd.port}") +
                        "\n[table t]\nlocation = s3://warehouse/db/t\ncolumn = image_sha256\n"
                        "store = lake\n")
        res = run_refs(conf)
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == sorted(hashes)
        time.sleep(0.2)
        down = fwd.down
    finally:
        fwd.close()
    print(f"refs: {down} bytes from S3 for a table whose data file is {size} bytes")
    assert down < size / 4, (down, size)
