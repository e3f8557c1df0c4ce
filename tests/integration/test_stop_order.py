"""The core's stop order: SIGTERM while reconcile is sweeping, with a [cdn] configured. The
reconcile thread is joined before the CDN purge queue closes, so every blob the sweep quarantined
has its purge either sent before the stop or still queued on disk and sent after the restart:
none is dropped (a dropped purge leaves a quarantined blob cached at the edge for a year)."""
import hashlib
import time

import requests

from cdn_util import PurgeRecorder
from conftest import Server
from reconcile_util import IceTable, blob, recon_conf, sha

N = 3000  # unreferenced blobs: one durable purge-queue transaction each keeps the sweep busy


def put_files(root, blobs):
    """Writes blobs into an fs store's root under their content-addressed keys; returns the
    POST /v1/import items."""
    items = []
    for data in blobs:
        h = hashlib.sha256(data).hexdigest()
        key = f"sha256/{h[:2]}/{h[2:4]}/{h}"
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        items.append({"sha256": h, "size": len(data), "store": "local", "key": key})
    return items


def quarantined(url):
    """Every quarantined blob's hash, by the paged listing."""
    out, after = set(), ""
    while True:
        r = requests.get(f"{url}/v1/blobs", params={"state": "quarantined", "after": after,
                                                   "limit": 1000}, timeout=30)
        assert r.status_code == 200, r.text
        j = r.json()
        out |= {b["sha256"] for b in j["blobs"]}
        if not j["next"]:
            return out
        after = j["next"]


def test_stop_while_sweeping_loses_no_purge(tmp_path):
    cdn = PurgeRecorder()
    t = IceTable(tmp_path / "images")
    kept = blob("kept", 0)
    t.write_data({"f1.parquet": [sha(kept)]})
    t.append("f1.parquet")
    data_dir = tmp_path / "data"
    conf = recon_conf(t, grace="1s", retention="1h",
                      extra=f"\n[cdn edge]\npurge_url = {cdn.url}/v1/blobs/{{hash}}\n")
    srv = Server(data_dir, config_text=conf).start()
    try:
        assert requests.put(f"{srv.url}/v1/blobs/{sha(kept)}", data=kept,
                            timeout=30).status_code == 201
        items = put_files(data_dir / "blobs", [blob("gone", i, 64) for i in range(N)])
        for at in range(0, N, 1000):
            r = requests.post(f"{srv.url}/v1/import", json={"blobs": items[at:at + 1000]},
                              timeout=120)
            assert r.status_code == 200, r.text
            assert {x["result"] for x in r.json()["results"]} == {"created"}
        time.sleep(1.3)  # the grace period (1 s) must pass: that is what is being waited for
        r = requests.post(f"{srv.url}/v1/reconcile", timeout=30)
        assert r.status_code == 202, r.text
        # the sweep is under way once the first purge arrives at the edge: stop then
        deadline = time.monotonic() + 60
        while not cdn.seen and time.monotonic() < deadline:
            time.sleep(0.005)
        assert cdn.seen, "no purge arrived while reconcile was sweeping"
        assert srv.stop() == 0, srv.read_log()
        log = srv.read_log()
        # the stop began while the run was sweeping (else the test proves nothing)
        stopping, done = log.find(": stopping"), log.find("reconcile: run 1 done")
        assert 0 <= stopping < done, log[-3000:]

        srv.start()
        gone = quarantined(srv.url)
        # the run completed before the stop (the thread is joined, not cut)
        assert gone == {i["sha256"] for i in items}, (len(gone), N)
        want = {f"/v1/blobs/{h}" for h in gone}
        deadline = time.monotonic() + 120
        while not want <= set(cdn.seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        missing = want - set(cdn.seen)
        assert not missing, f"{len(missing)} of {len(want)} purges were lost"
        assert srv.stop() == 0, srv.read_log()
    finally:
        if srv.alive():
            srv.stop()
        cdn.close()
