"""Per-store blob and byte counts in /metrics (issue 23, the console's stores table): live blobs
with a location in each store, from the index walk; held blobs are not counted, a blob imported
into a second store counts there."""
import os

import requests

from conftest import Server
from util_http import TIMEOUT, post, sha, wait_until


def gauge(srv, name, store):
    text = requests.get(srv.url + "/metrics", timeout=TIMEOUT).text
    line = f'{name}{{store="{store}"}} '
    found = [ln for ln in text.splitlines() if ln.startswith(line)]
    assert len(found) == 1, (name, store, found)
    return int(found[0][len(line):])


def test_live_blobs_and_bytes_per_store(tmp_path):
    base = tmp_path
    conf = (f"[server]\nupload_store = a\n[store a]\nkind = fs\nroot = {base / 'a'}\n"
            f"[store b]\nkind = fs\nroot = {base / 'b'}\n")
    srv = Server(base / "data", config_text=conf).start()
    try:
        blobs = [os.urandom(1000 + i) for i in range(3)]
        for d in blobs:
            assert post(srv, d).status_code == 201
        held = blobs[2]
        r = requests.delete(f"{srv.url}/v1/blobs/{sha(held)}?reason=hold", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        extra = os.urandom(5000)
        (base / "b" / "in").mkdir(parents=True)
        (base / "b" / "in" / "x").write_bytes(extra)
        r = requests.post(f"{srv.url}/v1/import", timeout=TIMEOUT, json={"blobs": [
            {"sha256": sha(extra), "size": len(extra), "store": "b", "key": "in/x"}]})
        assert r.json()["results"][0]["result"] == "created", r.text
        # the walk runs at most every 10 s: wait for one that saw everything above
        assert wait_until(lambda: gauge(srv, "blobref_store_blobs", "b") == 1, timeout=30)
        assert gauge(srv, "blobref_store_blobs", "a") == 2
        assert gauge(srv, "blobref_store_blob_bytes", "a") == len(blobs[0]) + len(blobs[1])
        assert gauge(srv, "blobref_store_blob_bytes", "b") == len(extra)
    finally:
        assert srv.stop() == 0, srv.read_log()
