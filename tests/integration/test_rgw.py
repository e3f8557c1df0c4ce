"""Smoke tests of the `rgw` fixture (a real radosgw) with boto3: what the S3 store tests rely on."""
import http.client
import os
import time
import urllib.parse

import pytest
import requests

botocore_exceptions = pytest.importorskip("botocore.exceptions")
ClientError = botocore_exceptions.ClientError

TIMEOUT = 10


def error_code(excinfo):
    return excinfo.value.response["Error"]["Code"]


def test_bucket_put_get(rgw):
    s3 = rgw.client()
    b = rgw.make_bucket("smoke-put-get")
    assert b in [x["Name"] for x in s3.list_buckets()["Buckets"]]
    data = os.urandom(300_000)
    s3.put_object(Bucket=b, Key="k/1", Body=data, ContentType="image/jpeg")
    got = s3.get_object(Bucket=b, Key="k/1")
    assert got["Body"].read() == data
    assert got["ContentType"] == "image/jpeg"
    assert s3.get_object(Bucket=b, Key="k/1", Range="bytes=10-19")["Body"].read() == data[10:20]
    # make_bucket again gives the same bucket, emptied
    assert rgw.make_bucket(b) == b
    assert s3.list_objects_v2(Bucket=b)["KeyCount"] == 0


def test_presigned_get_and_expiry(rgw):
    s3 = rgw.client()
    b = rgw.make_bucket("smoke-presign")
    s3.put_object(Bucket=b, Key="x", Body=b"hello")
    # a URL living 2 s: read within them (on a loaded box the first GET can come later: then
    # sign again, rather than take a 403 after the expiry for a failure)
    for _ in range(5):
        t0 = time.monotonic()
        url = s3.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "x"},
                                        ExpiresIn=2)
        r = requests.get(url, timeout=TIMEOUT)
        if r.status_code == 200 or time.monotonic() - t0 < 1.5:
            break
    assert r.status_code == 200 and r.content == b"hello", r.text
    # a tampered expiry breaks the signature
    bad = url.replace("X-Amz-Expires=2", "X-Amz-Expires=3600")
    assert bad != url
    assert requests.get(bad, timeout=TIMEOUT).status_code == 403
    # refused once its 2 s are over (awaited, not slept: S3 counts whole seconds)
    deadline = time.monotonic() + 30
    while (r := requests.get(url, timeout=TIMEOUT)).status_code == 200:
        assert time.monotonic() < deadline, "a 2 s URL still answered 200 after 30 s"
        time.sleep(0.1)
    assert r.status_code == 403, r.text
    assert time.monotonic() - t0 >= 1.0, "refused before its expiry"
    # unsigned requests to a private bucket are refused too
    assert requests.get(f"{rgw.endpoint}/{b}/x", timeout=TIMEOUT).status_code == 403


def test_wrong_secret_refused(rgw):
    s3 = rgw.client(secret_key="not-the-secret")
    with pytest.raises(ClientError) as e:
        s3.list_buckets()
    assert error_code(e) == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as e:
        rgw.client(access_key="NOSUCHKEY").list_buckets()
    assert error_code(e) == "InvalidAccessKeyId"


def test_user2_cannot_read_user1_bucket(rgw):
    s3 = rgw.client()
    b = rgw.make_bucket("smoke-private")
    s3.put_object(Bucket=b, Key="secret", Body=b"mine")
    other = rgw.client(rgw.access_key2, rgw.secret_key2)
    assert other.list_buckets()["Buckets"] == []
    with pytest.raises(ClientError) as e:
        other.get_object(Bucket=b, Key="secret")
    assert error_code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        other.put_object(Bucket=b, Key="intruder", Body=b"x")
    assert error_code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        other.list_objects_v2(Bucket=b)
    assert error_code(e) == "AccessDenied"


def test_kill_and_restart_keeps_stored_objects(rgw):
    """radosgw is stateless: objects live in the OSD (memory), which a radosgw kill leaves alone.
    So acknowledged objects survive kill -9 + restart; an upload cut short leaves no object."""
    s3 = rgw.client()
    b = rgw.make_bucket("smoke-restart")
    s3.put_object(Bucket=b, Key="before", Body=b"kept")
    url = s3.generate_presigned_url("put_object", Params={"Bucket": b, "Key": "cut"}, ExpiresIn=600)
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=TIMEOUT)
    conn.putrequest("PUT", f"{u.path}?{u.query}", skip_accept_encoding=True)
    conn.putheader("Content-Length", str(4 << 20))
    conn.endheaders()
    conn.send(b"x" * (1 << 20))  # a quarter of the body, then radosgw dies
    pid = rgw.pid()
    assert pid is not None
    rgw.kill()
    assert rgw.pid() is None
    with pytest.raises(OSError):
        for _ in range(3):
            conn.send(b"x" * (1 << 20))
        conn.getresponse()
    conn.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(rgw.endpoint, timeout=TIMEOUT)
    took = rgw.restart()
    assert took < 30
    assert rgw.pid() not in (None, pid)
    s3 = rgw.client()
    assert s3.get_object(Bucket=b, Key="before")["Body"].read() == b"kept"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=b, Key="cut")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    s3.put_object(Bucket=b, Key="after", Body=b"new")
    assert s3.get_object(Bucket=b, Key="after")["Body"].read() == b"new"
    # restart() of a running radosgw replaces it
    rgw.restart()
    assert s3.get_object(Bucket=b, Key="after")["Body"].read() == b"new"
