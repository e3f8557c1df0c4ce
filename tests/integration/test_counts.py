"""Exact per-state counters (issue 25): /metrics reads the counts the index's writer keeps in the
same transactions as the records (uploads, holds, restores), across restarts, and never walks the
index for them (blobref_index_census_walks_total stays 0); fsck finds them consistent."""
import os

import requests

from conftest import Server
from util_http import TIMEOUT, fsck, put, sha
from test_metrics import metrics, samples


def counts(srv):
    s = samples(metrics(srv))
    out = {}
    for (name, labels), v in s.items():
        if name in ("blobref_index_blobs", "blobref_index_blob_bytes", "blobref_store_blobs",
                    "blobref_store_blob_bytes", "blobref_index_census_walks_total",
                    "blobref_index_map_bytes", "blobref_index_map_nearly_full"):
            out[name + labels] = v
    return out


def test_counts_follow_uploads_holds_restores_and_restarts(tmp_path):
    srv = Server(tmp_path / "data").start()
    try:
        blobs = [os.urandom(1000 + i) for i in range(5)]
        for b in blobs:
            assert put(srv, b).status_code == 201
        assert put(srv, blobs[0]).status_code in (200, 201)  # dedup: counted once
        c = counts(srv)
        [store] = [k[len('blobref_store_blobs{store="'):-2] for k in c
                   if k.startswith("blobref_store_blobs{")]
        total = sum(len(b) for b in blobs)
        assert c['blobref_index_blobs{state="live"}'] == 5
        assert c['blobref_index_blob_bytes{state="live"}'] == total
        assert c[f'blobref_store_blobs{{store="{store}"}}'] == 5
        assert c[f'blobref_store_blob_bytes{{store="{store}"}}'] == total
        assert c["blobref_index_map_bytes"] == 1 << 40  # the default: no cliff
        assert c["blobref_index_map_nearly_full"] == 0
        # an admin's hold, then a restore
        r = requests.delete(f"{srv.url}/v1/blobs/{sha(blobs[1])}", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        c = counts(srv)
        assert c['blobref_index_blobs{state="live"}'] == 4
        assert c['blobref_index_blobs{state="held"}'] == 1
        assert c['blobref_index_blob_bytes{state="held"}'] == len(blobs[1])
        assert c[f'blobref_store_blobs{{store="{store}"}}'] == 4
        r = requests.post(f"{srv.url}/v1/blobs/{sha(blobs[1])}/restore", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        c = counts(srv)
        assert c['blobref_index_blobs{state="live"}'] == 5
        assert c['blobref_index_blobs{state="held"}'] == 0
        assert c["blobref_index_census_walks_total"] == 0  # read, never walked
    finally:
        assert srv.stop() == 0, srv.read_log()
    rc, n, problems, out = fsck(tmp_path / "data")
    assert (rc, n, problems) == (0, 5, 0), out
    assert "index counters" not in out
    srv = Server(tmp_path / "data").start()
    try:
        c = counts(srv)
        assert c['blobref_index_blobs{state="live"}'] == 5
        assert c['blobref_index_blob_bytes{state="live"}'] == total
        # counted once, when the index was created; kept since, not recounted at this start
        assert srv.read_log().count("counting blobs by state") <= 1, srv.read_log()
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_default_map_is_sparse(tmp_path):
    """The 1 TiB default map is address space: the index file holds only what is written."""
    srv = Server(tmp_path / "data").start()
    try:
        for _ in range(50):
            assert put(srv, os.urandom(200)).status_code == 201
        assert counts(srv)["blobref_index_map_bytes"] == 1 << 40
    finally:
        assert srv.stop() == 0, srv.read_log()
    st = os.stat(tmp_path / "data" / "index" / "data.mdb")
    assert st.st_size < 16 << 20, st.st_size
    assert st.st_blocks * 512 < 16 << 20, st.st_blocks
