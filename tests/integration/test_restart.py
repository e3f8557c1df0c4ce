"""A graceful restart (SIGTERM, start again on the same data dir) keeps every blob and record."""
import random
import signal

import pytest
import requests

from conftest import Server
from util_http import TIMEOUT, fsck, get, non_object_files, post, put, sha


@pytest.mark.parametrize("conf", [None, "[server]\nindex_batch_max = 1\n"])
def test_restart_keeps_everything(tmp_path, conf):
    rng = random.Random(42)
    srv = Server(tmp_path / "data", config_text=conf).start()
    blobs = {}
    for i in range(40):
        data = rng.randbytes(rng.randrange(0, 200000))
        ctype = rng.choice(["image/jpeg", "application/pdf", None])
        headers = {"Content-Type": ctype} if ctype else {}
        r = put(srv, data, headers=headers) if i % 2 else post(srv, data, headers=headers)
        assert r.status_code == 201, r.text
        blobs[sha(data)] = (data, ctype or "application/octet-stream")
    metas = {}
    for h in blobs:
        m = requests.get(f"{srv.url}/v1/blobs/{h}/meta", timeout=TIMEOUT)
        assert m.status_code == 200
        metas[h] = m.json()
    assert srv.stop(signal.SIGTERM) == 0, srv.read_log()

    rc, n, problems, out = fsck(srv.data_dir, config=(srv.data_dir / "blobref.conf")
                                if conf else None, verify=True)
    assert (rc, n, problems) == (0, len(blobs), 0), out
    assert non_object_files(srv.data_dir / "blobs") == []

    srv2 = Server(tmp_path / "data", config_text=conf).start()
    try:
        for h, (data, ctype) in blobs.items():
            r = get(srv2, h)
            assert r.status_code == 200 and r.content == data, h
            assert r.headers["Content-Type"] == ctype
            m = requests.get(f"{srv2.url}/v1/blobs/{h}/meta", timeout=TIMEOUT).json()
            assert m == metas[h]
        r = requests.post(f"{srv2.url}/v1/lookup", json={"hashes": list(blobs)}, timeout=TIMEOUT)
        assert [f["sha256"] for f in r.json()["found"]] == list(blobs)
        # Dedup still knows them; new uploads still work.
        some = next(iter(blobs.values()))[0]
        assert put(srv2, some).status_code == 200
        assert post(srv2, b"after restart").status_code == 201
        assert srv2.alive()
    finally:
        assert srv2.stop(signal.SIGINT) == 0, srv2.read_log()
