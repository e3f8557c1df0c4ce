"""S3 objects carry the blob's type (issue 23): single and multipart PUTs send Content-Type, so S3
itself answers a redirected GET with it (not binary/octet-stream), and presigned redirects sign
response-content-type, which also fixes objects written without one. Checked with boto3."""
import hashlib
import os
import re
import struct
import zlib

import pytest
import requests

from s3util import LazyServer, content_key, multipart_uploads, s3_conf, stop_checked
from util_http import TIMEOUT, get, post, put, sha, wait_until

MiB = 1 << 20


def png(extra=b""):
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(b"\0\xff\0\0")) + chunk(b"IEND", b"") + extra)


@pytest.fixture
def redirect_lake(rgw, tmp_path, request):
    """A blobrefd whose only store is an s3 store over a fresh bucket, serve = redirect, parts of
    5 MiB: (server, bucket, boto3 client)."""
    n = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    bucket = n + "-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]
    rgw.make_bucket(bucket)
    srv = LazyServer(tmp_path / "data", config_text=s3_conf(
        rgw, bucket, serve="redirect", presign_ttl="10m", part_size="5MiB")).start()
    s3 = rgw.client()
    yield srv, bucket, s3
    stop_checked(srv)
    wait_until(lambda: multipart_uploads(s3, bucket) == [], timeout=10)


def redirected(srv, h):
    r = get(srv, h, allow_redirects=False)
    assert r.status_code == 307, r.text
    return r.headers["Location"], requests.get(r.headers["Location"], timeout=TIMEOUT)


@pytest.mark.parametrize("size", [0, 12 * MiB], ids=["single-put", "multipart"])
@pytest.mark.parametrize("how", ["post", "put"])
def test_object_written_with_the_type(redirect_lake, size, how):
    srv, bucket, s3 = redirect_lake
    data = png(os.urandom(size))
    h = sha(data)
    r = post(srv, data) if how == "post" else put(srv, data)  # no type: detected as image/png
    assert r.status_code == 201, r.text
    head = s3.head_object(Bucket=bucket, Key=content_key(h))
    assert head["ContentType"] == "image/png", head
    loc, got = redirected(srv, h)
    assert "response-content-type=image%2Fpng" in loc, loc
    assert got.status_code == 200 and got.content == data
    assert got.headers["Content-Type"] == "image/png"


def test_explicit_type_and_active_bytes(redirect_lake):
    srv, bucket, s3 = redirect_lake
    mine = png(b"mine")
    assert put(srv, mine, headers={"Content-Type": "image/x-mine"}).status_code == 201
    assert s3.head_object(Bucket=bucket, Key=content_key(sha(mine)))["ContentType"] == "image/x-mine"
    _, got = redirected(srv, sha(mine))
    assert got.headers["Content-Type"] == "image/x-mine"
    # HTML bytes without a type: octet-stream in the record and in S3, never text/html
    page = b"<!DOCTYPE html><html><body><script>alert(1)</script></body></html>\n"
    assert post(srv, page).status_code == 201
    head = s3.head_object(Bucket=bucket, Key=content_key(sha(page)))
    assert head["ContentType"] == "application/octet-stream", head
    # text/html said by the client: S3 is told, and the redirect makes it a download
    assert put(srv, page + b"2", headers={"Content-Type": "text/html"}).status_code == 201
    loc, got = redirected(srv, sha(page + b"2"))
    assert "response-content-disposition=attachment&response-content-type=text%2Fhtml" in loc, loc
    assert got.headers["Content-Type"] == "text/html"
    assert got.headers["Content-Disposition"] == "attachment"


def test_presign_fixes_an_object_written_without_type(redirect_lake):
    """An object put there without a type (S3 says binary/octet-stream), imported with one: the
    redirect still answers with the record's type."""
    srv, bucket, s3 = redirect_lake
    data = png(b"old object")
    s3.put_object(Bucket=bucket, Key="old/pic", Body=data)
    assert s3.head_object(Bucket=bucket, Key="old/pic")["ContentType"] == "binary/octet-stream"
    r = requests.post(f"{srv.url}/v1/import", timeout=TIMEOUT, json={"blobs": [
        {"sha256": sha(data), "size": len(data), "store": "lake", "key": "old/pic",
         "content_type": "image/png"}]})
    assert r.status_code == 200 and r.json()["results"][0]["result"] == "created", r.text
    _, got = redirected(srv, sha(data))
    assert got.status_code == 200 and got.content == data
    assert got.headers["Content-Type"] == "image/png"
    s3.delete_object(Bucket=bucket, Key="old/pic")
