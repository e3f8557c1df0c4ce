"""Reconcile's deletes on S3 go through DeleteObjects, 1,000 keys a request, and stay crash-safe:
a key the store reports failed keeps its blob marked deleting (410, bytes kept), retried by the
next run. Short (a few seconds): the 100k-blob timing is `make bench-deletes`."""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from reconcile_util import Api, IceTable, sha, start
from s3util import Forwarder, content_key, head_size, s3_store_conf

GRACE = 1.0
MARGIN = 0.3
N = 1003  # two DeleteObjects: 1,000 keys and 3


def test_deletes_go_in_batches_and_failed_keys_stay_deleting(rgw, tmp_path):
    s3 = rgw.client()
    bb = rgw.make_bucket("delete-batch")
    delete_call, one_delete = f"POST /{bb}/?delete=".encode(), f"DELETE /{bb}/".encode()
    fwd = Forwarder(int(rgw.endpoint.rsplit(":", 1)[1]), count=(delete_call, one_delete))
    t = IceTable(tmp_path / "t")
    t.write_data({"f0.parquet": [sha(b"none of ours")]})
    t.append("f0.parquet")
    srv = start(tmp_path, s3_store_conf(rgw, bb, endpoint=f"http://127.0.0.1:{fwd.port}"), t,
                grace="1s", retention="1s")
    api = Api(srv)

    def put(data):
        r = requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data, timeout=30)
        assert r.status_code == 201, r.text
        return sha(data)

    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            blobs = list(pool.map(put, [b"blob %d" % i for i in range(N)]))
        print(f"uploads {time.monotonic() - t0:.1f} s")
        time.sleep(GRACE + MARGIN)
        assert api.run()["blobs"]["quarantined"] == N
        # the store refuses to delete two of the objects (a bucket policy)
        denied = blobs[7], blobs[1001]
        policy = {"Version": "2012-10-17", "Statement": [{
            "Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject",
            "Resource": [f"arn:aws:s3:::{bb}/{content_key(h)}" for h in denied]}]}
        s3.put_bucket_policy(Bucket=bb, Policy=json.dumps(policy))
        time.sleep(GRACE + MARGIN)
        t0 = time.monotonic()
        rep = api.run()
        print(f"delete run {time.monotonic() - t0:.1f} s")
        assert rep["blobs"]["deleted"] == N - 2, json.dumps(rep)
        assert rep["bytes_reclaimed"] > 0
        assert fwd.hits == {delete_call: 2, one_delete: 0}, fwd.hits
        errs = [e for e in rep["errors"] if "AccessDenied" in e]
        assert len(errs) == 2 and all(any(h in e for e in errs) for h in denied), rep["errors"]
        for h in denied:  # marked deleting: never served, never restored, bytes still there
            assert api.meta(h).json()["state"] == "deleting"
            assert api.code(h) == 410
            assert head_size(s3, bb, content_key(h)) is not None
        for h in (blobs[0], blobs[999], blobs[1000], blobs[1002]):
            assert api.meta(h).status_code == 404 and api.code(h) == 404
            assert head_size(s3, bb, content_key(h)) is None
        # the store lets go: the next run finishes the two
        s3.delete_bucket_policy(Bucket=bb)
        rep = api.run()
        assert rep["blobs"]["deleted"] == 2 and not rep["errors"], json.dumps(rep)
        for h in denied:
            assert api.meta(h).status_code == 404
            assert head_size(s3, bb, content_key(h)) is None
        assert fwd.hits[one_delete] == 0 and fwd.hits[delete_call] == 3, fwd.hits
    finally:
        srv.stop()
        fwd.close()
