"""Slow store calls run outside the blob lock stripes (issue 19): while S3's DeleteObjects,
CompleteMultipartUpload or the copy from a staging key is held up, uploads of the same hash and of
an unrelated hash sharing its stripe are still acknowledged, and an upload racing a delete of the
same hash always ends with the blob present and readable (`--fsck --verify` clean)."""
import hashlib
import random
import threading
import time

import pytest
import requests

from reconcile_util import Api, IceTable, sha, start
from s3util import Forwarder, content_key, head_size, s3_store_conf
from test_integrity import fsck_clean
from util_http import wait_until

GRACE = 1.0
MARGIN = 0.3
MiB = 1 << 20


def stripe(h):
    """The blob's lock stripe (server/core/server.c: the hash's first 12 bits, as stored)."""
    d = bytes.fromhex(h)
    return (d[0] | d[1] << 8) % 4096


def sharing(h, tag):
    """Bytes of another blob whose hash falls in h's stripe."""
    want = stripe(h)
    for i in range(1 << 20):
        data = b"%s %d" % (tag, i)
        if stripe(hashlib.sha256(data).hexdigest()) == want:
            return data
    raise AssertionError("no blob found in the stripe")


def put(srv, data, timeout=20):
    return requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data, timeout=timeout)


def in_thread(fn, *args):
    out = {}

    def run():
        try:
            out["r"] = fn(*args)
        except Exception as e:  # reported by the asserting thread
            out["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def lake_server(rgw, tmp_path, name, **store_keys):
    bb = rgw.make_bucket(name)
    fwd = Forwarder(int(rgw.endpoint.rsplit(":", 1)[1]))
    t = IceTable(tmp_path / "t")
    t.write_data({"f0.parquet": [sha(b"none of ours")]})
    t.append("f0.parquet")
    srv = start(tmp_path, s3_store_conf(rgw, bb, endpoint=f"http://127.0.0.1:{fwd.port}",
                                        **store_keys), t, grace="1s", retention="1s")
    return srv, bb, fwd


def test_uploads_go_on_while_delete_objects_is_stalled(rgw, tmp_path):
    """Reconcile deletes 3 blobs with one DeleteObjects, held at the forwarder: an upload of one of
    them (V) and of an unrelated blob in V's stripe are both acknowledged meanwhile. Once the
    delete goes through, V is live and readable (its bytes under a key the delete did not name),
    the other two are gone, and fsck --verify is clean."""
    srv, bb, fwd = lake_server(rgw, tmp_path, "stall-delete")
    api = Api(srv)
    s3 = rgw.client()
    try:
        doomed = [b"doomed blob %d" % i for i in range(3)]
        for d in doomed:
            assert put(srv, d).status_code == 201
        v = doomed[0]
        neighbour = sharing(sha(v), b"neighbour")
        time.sleep(GRACE + MARGIN)
        assert api.run()["blobs"]["quarantined"] == 3
        time.sleep(GRACE + MARGIN)
        fwd.stall(lambda d: d.startswith(f"POST /{bb}/?delete".encode()))
        r = api.start_run()
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        assert wait_until(lambda: fwd.stalled >= 1, timeout=30), "no DeleteObjects seen"
        # both answered while the DeleteObjects is still held (on main they waited for it)
        r = put(srv, neighbour)
        assert r.status_code == 201, r.text
        r = put(srv, v)
        assert r.status_code == 201, r.text
        assert fwd.stalled == 1 and not fwd.go.is_set()
        fwd.release()
        rep = api.wait(rid)
        assert rep["state"] == "done" and rep["blobs"]["deleted"] == 2, rep
        for d in (v, neighbour):
            g = api.get(sha(d))
            assert g.status_code == 200 and g.content == d, (g.status_code, g.text)
        meta = api.meta(sha(v)).json()
        assert meta["state"] == "live"
        [loc] = meta["locations"]
        assert loc["key"] != content_key(sha(v))  # the delete took the content key's bytes
        assert head_size(s3, bb, content_key(sha(v))) is None
        for d in doomed[1:]:
            assert api.code(sha(d)) == 404
            assert head_size(s3, bb, content_key(sha(d))) is None
        assert fsck_clean(srv) == 2
    finally:
        fwd.release()
        srv.stop()
        fwd.close()


@pytest.mark.parametrize("held", ["complete", "copy"])
def test_upload_in_a_stripe_goes_on_while_a_big_commit_is_stalled(rgw, tmp_path, held):
    """A 6 MiB upload over 5 MiB parts: its CompleteMultipartUpload (a PUT: the content key is
    known) or its copy from the staging key (a POST: it is not) is held at the forwarder; an
    upload of an unrelated blob in its stripe is acknowledged meanwhile, then both are readable."""
    srv, bb, fwd = lake_server(rgw, tmp_path, f"stall-{held}", part_size="5MiB")
    api = Api(srv)
    try:
        big = random.Random(7).randbytes(6 * MiB + 123)
        neighbour = sharing(sha(big), b"neighbour")
        if held == "complete":
            fwd.stall(lambda d: d.startswith(b"POST ") and b"uploadId=" in d.split(b"\r\n", 1)[0])
            t, out = in_thread(put, srv, big, 120)
        else:
            fwd.stall(lambda d: d.startswith(b"PUT ") and b"\r\nx-amz-copy-source:" in d.lower())
            t, out = in_thread(lambda: requests.post(f"{srv.url}/v1/blobs", data=big, timeout=120))
        assert wait_until(lambda: fwd.stalled >= 1, timeout=60), "the held call was not seen"
        r = put(srv, neighbour)
        assert r.status_code == 201, r.text
        assert t.is_alive() and not fwd.go.is_set()  # the big one is still held
        fwd.release()
        t.join(120)
        assert "e" not in out, out
        assert out["r"].status_code == 201, out["r"].text
        for d in (big, neighbour):
            g = api.get(sha(d))
            assert g.status_code == 200 and g.content == d, g.status_code
        assert fsck_clean(srv) == 2
    finally:
        fwd.release()
        srv.stop()
        fwd.close()


ROUNDS = 3


def test_upload_racing_a_delete_of_the_same_hash(tmp_path):
    """Bounded rounds on the fs store: a quarantined blob is deleted by reconcile while the same
    bytes are uploaded again. Whatever the order, an acknowledged upload leaves the blob live and
    readable; fsck --verify is clean at the end."""
    t = IceTable(tmp_path / "t")
    t.write_data({"f0.parquet": [sha(b"none of ours")]})
    t.append("f0.parquet")
    srv = start(tmp_path, t, grace="1s", retention="1s")
    api = Api(srv)
    data = [b"raced blob %d" % i for i in range(20)]
    outcomes = []  # how many each run deleted before the upload came back (printed: the spread)
    try:
        for d in data:
            assert put(srv, d).status_code == 201
        for rnd in range(ROUNDS):
            time.sleep(GRACE + MARGIN)
            rep = api.run()
            assert rep["blobs"]["quarantined"] == len(data), rep
            time.sleep(GRACE + MARGIN)
            r = api.start_run()
            assert r.status_code == 202, r.text
            rid = r.json()["id"]
            time.sleep(random.Random(rnd).random() * 0.05)  # spreads the race over the run
            for d in data:  # 200 when it restored the quarantined blob, 201 when it wrote anew
                assert put(srv, d).status_code in (200, 201)
            rep = api.wait(rid)
            assert rep["state"] == "done", rep
            outcomes.append(rep["blobs"]["deleted"])
            for d in data:
                g = api.get(sha(d))
                assert g.status_code == 200 and g.content == d, (rnd, g.status_code, g.text)
        print("deleted per round:", outcomes)
        assert fsck_clean(srv) == len(data)
    finally:
        srv.stop()
