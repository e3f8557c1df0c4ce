"""Direct uploads (issue 21) against radosgw: POST /v1/uploads hands out presigned PUTs to the
blob's content key, the client PUTs the bytes to the bucket itself, POST /v1/uploads/commit checks
the object (HEAD, and a re-hash where the store checks neither signed header) and records it.
Covers the end-to-end path, the verification branches (radosgw trusted on x-amz-content-sha256; a
local proxy that enforces x-amz-checksum-sha256 trusted on it; direct_uploads = on, multipart
uploads and stores the probe cannot rely on re-hashed), expired URLs, races, commits without
uploads, a kill -9 between upload and commit, bad input and auth."""
import base64
import hashlib
import os
import re
import signal
import time

import pytest
import requests

from checksum_proxy import ChecksumProxy
from conftest import Server
from s3util import content_key, head_size, keys, s3_conf, stop_checked
from util_http import TIMEOUT, assert_error, sha, wait_until

MiB = 1 << 20


def bucket_for(request):
    n = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    return n[:40].strip("-") + "-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]


@pytest.fixture
def direct(rgw, tmp_path, request):
    """Factory: direct(endpoint=None, server="", **store_keys) -> (server, bucket): a blobrefd
    whose upload store is an s3 store over a fresh bucket with direct_uploads = auto."""
    made = []

    def make(endpoint=None, server="", **store_keys):
        b = rgw.make_bucket(bucket_for(request) + (f"-{len(made)}" if made else ""))
        store_keys.setdefault("direct_uploads", "auto")
        text = s3_conf(rgw, b, server=server, **store_keys)
        if endpoint:
            text = text.replace(f"endpoint = {rgw.endpoint}", f"endpoint = {endpoint}")
        srv = Server(tmp_path / f"data{len(made)}", config_text=text).start()
        made.append(srv)
        return srv, b

    yield make
    for srv in made:
        if srv.proc is not None:
            stop_checked(srv)


def negotiate(srv, blobs, headers=None):
    r = requests.post(f"{srv.url}/v1/uploads", json={"blobs": blobs}, headers=headers,
                      timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["blobs"]


def commit(srv, blobs, headers=None):
    r = requests.post(f"{srv.url}/v1/uploads/commit", json={"blobs": blobs}, headers=headers,
                      timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["blobs"]


def item(data, ct=None):
    d = {"sha256": sha(data), "size": len(data)}
    if ct:
        d["content_type"] = ct
    return d


def direct_put(action, data):
    return requests.put(action["url"], data=data, headers=action["headers"], timeout=TIMEOUT)


def metric(srv, name):
    text = requests.get(f"{srv.url}/metrics", timeout=TIMEOUT).text
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1))


def test_direct_single_part_end_to_end(rgw, direct):
    srv, b = direct()
    s3 = rgw.client()
    old = os.urandom(1000)
    assert requests.put(f"{srv.url}/v1/blobs/{sha(old)}", data=old,
                        timeout=TIMEOUT).status_code == 201
    new = os.urandom(300 * 1024)
    big = {"sha256": "ab" * 32, "size": 17 * MiB}  # over part_size (16 MiB): a multipart plan
    acts = negotiate(srv, [item(new, "image/png"), item(old), big])
    assert [a["sha256"] for a in acts] == [sha(new), sha(old), big["sha256"]]  # request order
    assert [a["status"] for a in acts] == ["upload", "present", "part_hashes"]
    a = acts[0]
    assert a["method"] == "PUT" and a["url"].startswith(rgw.endpoint + f"/{b}/")
    assert content_key(sha(new)) in a["url"]
    assert a["headers"] == {
        "x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(new).digest()).decode(),
        "x-amz-content-sha256": sha(new), "If-None-Match": "*",
        "x-amz-meta-blobref-sha256": sha(new)}
    signed = re.search(r"X-Amz-SignedHeaders=([^&]+)", a["url"]).group(1)
    assert signed == ("host%3Bif-none-match%3Bx-amz-checksum-sha256%3Bx-amz-content-sha256"
                      "%3Bx-amz-meta-blobref-sha256")
    assert time.strptime(a["expires_at"][:19], "%Y-%m-%dT%H:%M:%S")
    received = metric(srv, "blobref_received_bytes_total")
    r = direct_put(a, new)
    assert r.status_code == 200, r.text
    assert head_size(s3, b, content_key(sha(new))) == len(new)
    # in the bucket but not committed: not served
    assert requests.get(f"{srv.url}/v1/blobs/{sha(new)}", timeout=TIMEOUT).status_code == 404
    res = commit(srv, [item(new, "image/png"), item(old)])
    assert [x["status"] for x in res] == ["created", "present"]
    r = requests.get(f"{srv.url}/v1/blobs/{sha(new)}", timeout=TIMEOUT)
    assert r.status_code == 200 and r.content == new
    assert r.headers["Content-Type"] == "image/png"
    meta = requests.get(f"{srv.url}/v1/blobs/{sha(new)}/meta", timeout=TIMEOUT).json()
    assert meta["locations"][0]["key"] == content_key(sha(new))
    # the bytes never went through blobrefd; radosgw checked them against x-amz-content-sha256
    assert metric(srv, "blobref_received_bytes_total") == received
    assert metric(srv, "blobref_direct_rehash_bytes_total") == 0
    assert negotiate(srv, [item(new)])[0]["status"] == "present"


def test_radosgw_is_trusted_on_content_sha256(rgw, direct):
    """radosgw 16 takes a presigned PUT whose signed x-amz-checksum-sha256 is wrong but refuses
    one whose x-amz-content-sha256 is not the body's hash, and keeps no object: auto trusts it on
    that header. Wrong bytes to a negotiated URL are refused and never readable; the right bytes
    are committed on a HEAD, not re-hashed."""
    srv, b = direct()
    assert re.search(r"x-amz-checksum-sha256 not enforced, x-amz-content-sha256 enforced; "
                     r"single-part objects are trusted on x-amz-content-sha256 \(a HEAD on "
                     r"commit\), multipart ones re-hashed", srv.read_log())
    assert metric(srv, 'blobref_store_direct_uploads{store="lake"}') == 1
    s3 = rgw.client()
    assert not [k for k in keys(s3, b) if ".direct-probe/" in k]  # the probe left nothing
    data = os.urandom(5000)
    a = negotiate(srv, [item(data)])[0]
    for wrong in (os.urandom(5000), data[:-1] + bytes([data[-1] ^ 1]), data + b"x"):
        r = direct_put(a, wrong)
        assert r.status_code == 400 and "XAmzContentSHA256Mismatch" in r.text, r.text
        assert head_size(s3, b, content_key(sha(data))) is None
        assert commit(srv, [item(data)])[0]["status"] == "missing"
        assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).status_code == 404
    assert direct_put(a, data).status_code == 200
    assert commit(srv, [item(data)])[0]["status"] == "created"
    assert metric(srv, "blobref_direct_rehash_bytes_total") == 0
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).content == data


def assert_rehashed_on_commit(srv, size):
    """The store is in re-hash mode (metric 2): a blob of size bytes PUT to its negotiated URL is
    created by its commit, whose re-hash reads exactly its bytes."""
    assert metric(srv, 'blobref_store_direct_uploads{store="lake"}') == 2
    data = os.urandom(size)
    assert direct_put(negotiate(srv, [item(data)])[0], data).status_code == 200
    assert commit(srv, [item(data)])[0]["status"] == "created"
    assert metric(srv, "blobref_direct_rehash_bytes_total") == len(data)


def test_mode_on_rehashes_on_radosgw(rgw, direct):
    """direct_uploads = on skips the probe and re-hashes every object, though radosgw would be
    trusted under auto (the re-hash branch stays in use where it is chosen)."""
    srv, b = direct(direct_uploads="on")
    assert "direct-upload probe" not in srv.read_log()
    assert_rehashed_on_commit(srv, 7000)


def test_store_enforcing_neither_header_is_rehashed(rgw, direct):
    """A store that answers the probe's PUTs 200 whatever their headers: auto re-hashes."""
    proxy = ChecksumProxy(rgw.endpoint, mode="accept")
    try:
        srv, b = direct(endpoint=proxy.endpoint)
        assert re.search(r"x-amz-checksum-sha256 not enforced, x-amz-content-sha256 not "
                         r"enforced; objects are re-hashed on commit", srv.read_log())
        assert_rehashed_on_commit(srv, 6000)
    finally:
        proxy.close()


def test_refusal_that_kept_the_object_is_not_relied_on(rgw, direct):
    """A store that answers the wrong content SHA-256 with 400 but stores the bytes anyway: the
    probe's HEAD finds the object, so that refusal is not relied on (re-hash), and the probe's
    object is deleted."""
    s3 = rgw.client()

    def store_anyway(path, body):
        bucket, key = path.lstrip("/").split("/", 1)
        s3.put_object(Bucket=bucket, Key=key, Body=body)

    proxy = ChecksumProxy(rgw.endpoint, mode="keep_refused", writer=store_anyway)
    try:
        srv, b = direct(endpoint=proxy.endpoint)
        log = srv.read_log()
        assert re.search(r"x-amz-checksum-sha256 not enforced, x-amz-content-sha256 refused but "
                         r"stored; objects are re-hashed on commit", log), log
        assert re.search(r"direct-upload probe: refused with HTTP 400, yet \S+ holds 27 bytes", log)
        assert not [k for k in keys(s3, b) if ".direct-probe/" in k]
        assert_rehashed_on_commit(srv, 6000)
    finally:
        proxy.close()


@pytest.mark.parametrize("wrong", ["bytes", "size"])
def test_rehash_refuses_an_object_that_is_not_the_blob(rgw, direct, wrong):
    """Wrong bytes under a content key (written with the bucket's credentials, as a backend that
    ignores both headers would take them): the commit re-hashes, answers mismatch, deletes it."""
    srv, b = direct()
    s3 = rgw.client()
    data = os.urandom(4096)
    other = os.urandom(4096) if wrong == "bytes" else data + b"x"
    assert negotiate(srv, [item(data)])[0]["status"] == "upload"
    s3.put_object(Bucket=b, Key=content_key(sha(data)), Body=other)
    res = commit(srv, [item(data)])[0]
    assert res["status"] == "mismatch" and "deleted" in res["message"], res
    assert head_size(s3, b, content_key(sha(data))) is None
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).status_code == 404
    assert "POST /v1/uploads/commit" in srv.read_log()
    # the right bytes afterwards are taken
    a = negotiate(srv, [item(data)])[0]
    assert direct_put(a, data).status_code == 200
    assert commit(srv, [item(data)])[0]["status"] == "created"


def test_enforcing_store_is_trusted_and_checked_by_head(rgw, direct):
    proxy = ChecksumProxy(rgw.endpoint)
    try:
        srv, b = direct(endpoint=proxy.endpoint)
        assert re.search(r"x-amz-checksum-sha256 enforced, x-amz-content-sha256 enforced; "
                         r"single-part objects are trusted on x-amz-checksum-sha256",
                         srv.read_log())
        assert metric(srv, 'blobref_store_direct_uploads{store="lake"}') == 1
        data, wrong = os.urandom(20000), os.urandom(20000)
        a = negotiate(srv, [item(data)])[0]
        refused = proxy.refused
        r = direct_put(a, wrong)
        assert r.status_code == 400 and "BadDigest" in r.text and proxy.refused == refused + 1
        assert commit(srv, [item(data)])[0]["status"] == "missing"
        assert direct_put(a, data).status_code == 200
        assert commit(srv, [item(data)])[0]["status"] == "created"
        assert metric(srv, "blobref_direct_rehash_bytes_total") == 0  # HEAD's checksum sufficed
        assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).content == data
        # an object that did not come through a checksummed PUT has no checksum: re-hashed
        s3 = rgw.client()
        other = os.urandom(100)
        s3.put_object(Bucket=b, Key=content_key(sha(other)), Body=b"y" * 100)
        assert commit(srv, [item(other)])[0]["status"] == "mismatch"
        assert metric(srv, "blobref_direct_rehash_bytes_total") == 100
        assert head_size(s3, b, content_key(sha(other))) is None
    finally:
        proxy.close()


def test_rehash_is_one_streamed_get(rgw, direct):
    """The commit's re-hash of a 3 MiB object on a store that does not check the bytes is one
    GET without a Range and nothing else (it was a HEAD, then a HEAD and a ranged GET per MiB).
    The proxy here keeps no checksum for an object it did not see PUT with one, so blobrefd's
    probe found the store enforcing but the commit still re-hashes: checked with mode on."""
    proxy = ChecksumProxy(rgw.endpoint)
    try:
        srv, b = direct(endpoint=proxy.endpoint, direct_uploads="on")
        data = os.urandom(3 * MiB + 5)
        assert negotiate(srv, [item(data)])[0]["status"] == "upload"
        rgw.client().put_object(Bucket=b, Key=content_key(sha(data)), Body=data)  # no checksum
        path = f"/{b}/{content_key(sha(data))}"
        proxy.log.clear()
        assert commit(srv, [item(data)])[0]["status"] == "created"
        assert [(m, r) for m, p, r in proxy.log if p == path] == [("GET", None)]
        assert metric(srv, "blobref_direct_rehash_bytes_total") == len(data)
        # an object longer than the blob is read no further than the blob's size, then deleted
        small = os.urandom(1000)
        rgw.client().put_object(Bucket=b, Key=content_key(sha(small)), Body=data)
        res = commit(srv, [item(small)])[0]
        assert res["status"] == "mismatch" and "deleted" in res["message"], res
        read = metric(srv, "blobref_direct_rehash_bytes_total") - len(data)
        assert read < 1 * MiB, read  # the first buffers, not the object's 3 MiB
        assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).content == data
    finally:
        proxy.close()


def test_expired_url_is_refused_and_leaves_no_record(rgw, direct):
    srv, b = direct(presign_ttl="1s")
    data = os.urandom(1000)
    a = negotiate(srv, [item(data)])[0]
    deadline = time.strptime(a["expires_at"][:19] + "UTC", "%Y-%m-%dT%H:%M:%S%Z")
    assert wait_until(lambda: time.time() > time.mktime(deadline) - time.timezone + 1, timeout=5)
    r = direct_put(a, data)
    assert r.status_code == 403, r.text
    assert commit(srv, [item(data)])[0]["status"] == "missing"
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}/meta", timeout=TIMEOUT).status_code == 404


def test_same_blob_negotiated_twice_first_commit_wins(rgw, direct):
    srv, b = direct()
    data = os.urandom(2000)
    a1, a2 = negotiate(srv, [item(data)])[0], negotiate(srv, [item(data)])[0]
    assert a1["status"] == a2["status"] == "upload"
    assert direct_put(a1, data).status_code == 200
    # If-None-Match: * keeps the first object: radosgw answers 412 to the second PUT
    assert direct_put(a2, data).status_code == 412
    assert commit(srv, [item(data)])[0]["status"] == "created"
    assert commit(srv, [item(data)])[0]["status"] == "present"
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).content == data


def test_commit_without_upload_is_missing(rgw, direct):
    srv, b = direct()
    data = os.urandom(100)
    res = commit(srv, [item(data)])[0]
    assert res["status"] == "missing" and content_key(sha(data)) in res["message"]
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}/meta", timeout=TIMEOUT).status_code == 404


def test_kill9_between_upload_and_commit_leaves_no_record(rgw, direct):
    srv, b = direct()
    s3 = rgw.client()
    data = os.urandom(3000)
    a = negotiate(srv, [item(data)])[0]
    assert direct_put(a, data).status_code == 200
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(timeout=10)
    srv.proc = None
    srv.log.close()
    srv.start()
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}/meta", timeout=TIMEOUT).status_code == 404
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).status_code == 404
    assert content_key(sha(data)) in keys(s3, b)  # stale bytes, no record
    # a retried commit finds the object, checks it and records it
    assert commit(srv, [item(data)])[0]["status"] == "created"


def test_via_server_when_direct_uploads_are_off(rgw, direct):
    srv, b = direct(direct_uploads="off")
    assert negotiate(srv, [item(b"abc")])[0] == {"sha256": sha(b"abc"), "status": "via_server"}
    assert metric(srv, 'blobref_store_direct_uploads{store="lake"}') == 0


def test_via_server_on_an_fs_store(server):
    data = os.urandom(10)
    assert negotiate(server, [item(data)])[0]["status"] == "via_server"
    assert commit(server, [item(data)])[0]["status"] == "missing"


def test_bad_input_is_refused_and_changes_nothing(server):
    u = f"{server.url}/v1/uploads"
    for path in ("/v1/uploads", "/v1/uploads/commit"):
        u = server.url + path
        assert_error(requests.post(u, data=b"{nope", timeout=TIMEOUT), 400, "bad_json")
        assert_error(requests.post(u, json={"hashes": []}, timeout=TIMEOUT), 400, "bad_json")
        assert_error(requests.post(u, json={"blobs": [{"sha256": "xyz", "size": 1}]},
                                   timeout=TIMEOUT), 400, "bad_hash")
        assert_error(requests.post(u, json={"blobs": [{"sha256": "a" * 64, "size": -1}]},
                                   timeout=TIMEOUT), 400, "bad_json")
        assert_error(requests.post(u, json={"blobs": [{"sha256": "a" * 64, "size": 1 << 50}]},
                                   timeout=TIMEOUT), 413, "too_large")
        assert_error(requests.post(u, json={"blobs": [{"sha256": "a" * 64, "size": 1,
                                                       "content_type": "bad\ntype"}]},
                                   timeout=TIMEOUT), 400, "bad_content_type")
        many = [{"sha256": "a" * 64, "size": 1}] * 10001
        assert_error(requests.post(u, json={"blobs": many}, timeout=TIMEOUT), 413,
                     "too_many_hashes")
    assert requests.get(f"{server.url}/v1/blobs", timeout=TIMEOUT).json()["blobs"] == []
    assert "POST /v1/uploads refused" in server.read_log()


def token_conf(rgw, b):
    text = "[auth]\nanonymous = none\n"
    for name in ("read", "write"):
        digest = hashlib.sha256(f"secret-{name}".encode()).hexdigest()
        text += f"[token {name}]\nsha256 = {digest}\nscopes = {name}\n"
    return text


def test_auth_on_every_route(rgw, direct, tmp_path):
    b = rgw.make_bucket(bucket_for_auth())
    srv = Server(tmp_path / "auth", config_text=s3_conf(rgw, b, direct_uploads="auto") +
                 token_conf(rgw, b)).start()
    try:
        data = os.urandom(50)
        body = {"blobs": [item(data)]}
        for path in ("/v1/uploads", "/v1/uploads/commit"):
            u = srv.url + path
            assert_error(requests.post(u, json=body, timeout=TIMEOUT), 401, "unauthorized")
            assert_error(requests.post(u, json=body, timeout=TIMEOUT,
                                       headers={"Authorization": "Bearer secret-read"}),
                         403, "forbidden")
            r = requests.post(u, json=body, timeout=TIMEOUT,
                              headers={"Authorization": "Bearer secret-write"})
            assert r.status_code == 200, r.text
    finally:
        stop_checked(srv)


def bucket_for_auth():
    return "direct-auth-" + hashlib.sha1(str(os.getpid()).encode()).hexdigest()[:8]


def test_bad_direct_uploads_value_stops_startup(rgw, tmp_path):
    srv = Server(tmp_path / "bad", config_text=s3_conf(rgw, "nobucket", direct_uploads="maybe"))
    with pytest.raises(RuntimeError, match=r"blobref.conf:\d+: \[store lake\] direct_uploads "
                                           r"must be off, auto or on"):
        srv.start()


def python_client():
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "tools" / "python"))
    import blobref
    return blobref


def test_python_put_many_uploads_directly(rgw, direct, tmp_path):
    blobref = python_client()
    srv, b = direct()
    files = []
    for i in range(12):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(os.urandom(1000 + i))
        files.append(p)
    have = files[0].read_bytes()
    assert requests.put(f"{srv.url}/v1/blobs/{sha(have)}", data=have,
                        timeout=TIMEOUT).status_code == 201
    received = metric(srv, "blobref_received_bytes_total")
    c = blobref.Client(srv.url)
    res = c.put_many(files, workers=4, batch_size=5)
    assert res["present"] == 1 and res["uploaded"] == 11 and res["via_server"] == 0
    assert res["bytes"] == sum(p.stat().st_size for p in files[1:])
    assert res["hashes"] == [sha(p.read_bytes()) for p in files]
    assert metric(srv, "blobref_received_bytes_total") == received  # nothing through blobrefd
    for p in files:
        assert c.get(sha(p.read_bytes())) == p.read_bytes()
    again = c.put_many(files, workers=4)
    assert again["present"] == 12 and again["uploaded"] == 0 and again["bytes"] == 0


def test_python_put_many_falls_back_to_the_server(server, tmp_path):
    blobref = python_client()
    p = tmp_path / "a.txt"
    p.write_bytes(b"through the server")
    res = blobref.Client(server.url).put_many([p])
    assert res["via_server"] == 1 and res["uploaded"] == 0 and res["bytes"] == p.stat().st_size
    r = requests.get(f"{server.url}/v1/blobs/{sha(p.read_bytes())}", timeout=TIMEOUT)
    assert r.content == p.read_bytes() and r.headers["Content-Type"].startswith("text/plain")


def cli(srv, *args):
    import subprocess
    from conftest import BIN_DIR
    return subprocess.run([str(BIN_DIR / "blobref"), "--server", srv.url] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=120)


def test_cli_put_direct(rgw, direct, tmp_path):
    srv, b = direct()
    d = tmp_path / "tree"
    (d / "sub").mkdir(parents=True)
    files = [d / "a.bin", d / "sub" / "b.txt", d / "sub" / "c.bin"]
    for i, p in enumerate(files):
        p.write_bytes(os.urandom(2000 + i))
    have = files[0].read_bytes()
    assert requests.put(f"{srv.url}/v1/blobs/{sha(have)}", data=have,
                        timeout=TIMEOUT).status_code == 201
    received = metric(srv, "blobref_received_bytes_total")
    p = cli(srv, "put", "-r", d, "--direct", "--jobs", "2")
    assert p.returncode == 0, p.stderr
    lines = sorted(p.stdout.splitlines())
    assert lines == sorted(f"{sha(f.read_bytes())}  {f}" for f in files)
    assert "3 files: 2 uploaded, 1 already present, 0 failed" in p.stderr
    assert f"{2001 + 2002} sent" in p.stderr
    assert metric(srv, "blobref_received_bytes_total") == received
    r = requests.get(f"{srv.url}/v1/blobs/{sha(files[1].read_bytes())}", timeout=TIMEOUT)
    assert r.content == files[1].read_bytes() and r.headers["Content-Type"].startswith("text/plain")


def test_cli_put_direct_falls_back_to_the_server(server, tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"via blobrefd")
    p = cli(server, "put", "--direct", f)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[0] == sha(b"via blobrefd")
    assert "1 uploaded" in p.stderr
    assert requests.get(f"{server.url}/v1/blobs/{sha(b'via blobrefd')}",
                        timeout=TIMEOUT).content == b"via blobrefd"


def test_multipart_end_to_end_and_part_hash_bound(rgw, direct):
    srv, b = direct(part_size="5MiB", spool_max="16MiB")
    data = os.urandom(11 * MiB)  # three parts at the smallest part size
    ps = 5 * MiB
    a = negotiate(srv, [item(data)])[0]
    assert a["status"] == "part_hashes" and a["part_size"] == ps
    parts = [sha(data[i:i + ps]) for i in range(0, len(data), ps)]
    a = negotiate(srv, [dict(item(data), part_size=ps, part_sha256=parts)])[0]
    assert a["status"] == "multipart" and len(a["parts"]) == 3 and a["upload_id"]
    etags = []
    for p in a["parts"]:
        n = p["part_number"] - 1
        r = requests.put(p["url"], data=data[n * ps:(n + 1) * ps], headers=p["headers"],
                         timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        etags.append(r.headers["ETag"])
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).status_code == 404
    # an upload id the store does not know: radosgw 16 answers CompleteMultipartUpload with a
    # 500 (not S3's 404 NoSuchUpload), so the commit says error (try again), not missing
    res = commit(srv, [dict(item(data), upload_id="2~no-such-upload", parts=etags)])[0]
    assert res["status"] == "error" and "CompleteMultipartUpload" in res["message"], res
    res = commit(srv, [dict(item(data), upload_id=a["upload_id"], parts=etags)])[0]
    assert res["status"] == "created", res
    r = requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT)
    assert r.status_code == 200 and r.content == data
    # trusted on x-amz-content-sha256, yet the whole object was re-hashed (parts prove nothing)
    assert metric(srv, 'blobref_store_direct_uploads{store="lake"}') == 1
    assert metric(srv, "blobref_direct_rehash_bytes_total") == len(data)
    # bounds: more than 20,000 part hashes in one request
    many = [dict(item(data), part_size=ps, part_sha256=["ab" * 32] * 3)] * 6667
    assert_error(requests.post(f"{srv.url}/v1/uploads", json={"blobs": many}, timeout=TIMEOUT),
                 413, "too_many_hashes")


def test_multipart_object_with_the_mark_is_rehashed(rgw, direct):
    """A multipart object (ETag "...-N") under a content key that carries the direct URL's
    x-amz-meta-blobref-sha256 but other bytes: not taken on its mark, re-hashed and refused."""
    srv, b = direct()
    assert metric(srv, 'blobref_store_direct_uploads{store="lake"}') == 1
    s3 = rgw.client()
    data = os.urandom(3000)
    key = content_key(sha(data))
    up = s3.create_multipart_upload(Bucket=b, Key=key, Metadata={"blobref-sha256": sha(data)})
    etag = s3.upload_part(Bucket=b, Key=key, UploadId=up["UploadId"], PartNumber=1,
                          Body=os.urandom(3000))["ETag"]
    s3.complete_multipart_upload(Bucket=b, Key=key, UploadId=up["UploadId"], MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.head_object(Bucket=b, Key=key)["Metadata"] == {"blobref-sha256": sha(data)}
    res = commit(srv, [item(data)])[0]
    assert res["status"] == "mismatch" and "deleted" in res["message"], res
    assert metric(srv, "blobref_direct_rehash_bytes_total") == 3000
    assert requests.get(f"{srv.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT).status_code == 404


def test_python_put_many_multipart(rgw, direct, tmp_path):
    """An 11 MiB file over the store's 5 MiB part size: put_many hashes its parts in the same
    pass, PUTs them to the plan's URLs and commits the ETags; nothing goes through blobrefd."""
    blobref = python_client()
    srv, b = direct(part_size="5MiB", spool_max="16MiB")
    big, small = tmp_path / "big.bin", tmp_path / "small.bin"
    big.write_bytes(os.urandom(11 * MiB))
    small.write_bytes(os.urandom(3000))
    received = metric(srv, "blobref_received_bytes_total")
    c = blobref.Client(srv.url)
    res = c.put_many([big, small], workers=2)
    assert res["uploaded"] == 2 and res["via_server"] == 0 and res["present"] == 0
    assert res["bytes"] == 11 * MiB + 3000
    assert metric(srv, "blobref_received_bytes_total") == received
    r = requests.get(f"{srv.url}/v1/blobs/{sha(big.read_bytes())}", timeout=TIMEOUT)
    assert r.status_code == 200 and r.content == big.read_bytes()
    assert c.put_many([big], workers=2)["present"] == 1


def test_cli_put_direct_multipart(rgw, direct, tmp_path):
    srv, b = direct(part_size="5MiB", spool_max="16MiB")
    d = tmp_path / "tree"
    d.mkdir()
    big, small = d / "big.bin", d / "small.bin"
    big.write_bytes(os.urandom(11 * MiB))
    small.write_bytes(os.urandom(3000))
    received = metric(srv, "blobref_received_bytes_total")
    p = cli(srv, "put", "-r", d, "--direct", "--jobs", "2")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == sorted(f"{sha(f.read_bytes())}  {f}"
                                                   for f in (big, small))
    assert "2 files: 2 uploaded, 0 already present, 0 failed" in p.stderr
    assert f"{11 * MiB + 3000} sent" in p.stderr
    assert metric(srv, "blobref_received_bytes_total") == received
    r = requests.get(f"{srv.url}/v1/blobs/{sha(big.read_bytes())}", timeout=TIMEOUT)
    assert r.status_code == 200 and r.content == big.read_bytes()
    p = cli(srv, "put", "-r", d, "--direct")
    assert p.returncode == 0 and "0 uploaded, 2 already present" in p.stderr, p.stderr


def test_python_put_many_answers_part_hashes(rgw, direct, tmp_path, monkeypatch):
    """A file negotiated without part hashes (here: the client's threshold raised past it) is
    answered part_hashes; put_many hashes it again at the store's part size and uploads it."""
    blobref = python_client()
    monkeypatch.setattr(blobref, "MIN_PART", 64 * MiB)
    srv, b = direct(part_size="5MiB", spool_max="16MiB")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 * MiB))
    res = blobref.Client(srv.url).put_many([big])
    assert res["uploaded"] == 1 and res["via_server"] == 0 and res["bytes"] == 11 * MiB
    r = requests.get(f"{srv.url}/v1/blobs/{sha(big.read_bytes())}", timeout=TIMEOUT)
    assert r.status_code == 200 and r.content == big.read_bytes()
