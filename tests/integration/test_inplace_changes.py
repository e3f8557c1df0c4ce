"""In-place files that change after their import (issue 19). The record keeps the file's device
and inode, compared on each open: another file renamed into place (same bytes even) is not served
(503) until the location is verified again; a touch of the same file still is. A changed file
over 16 MiB (too large to hash on a read) is a 503 with Retry-After while the slow pool hashes it
again in the background: served once its bytes are found to be the blob's, else listed as
suspect and left at 503."""
import os
import random
import time

import requests

from conftest import Server
from reconcile_util import sha
from test_integrity import fsck_clean, import_one
from util_http import wait_until

MiB = 1 << 20


def verified_at_ms(url):
    """The primary location's verified_at (ms) from the blob's meta."""
    import datetime
    meta = requests.get(f"{url}/meta", timeout=30).json()
    v = meta["locations"][0]["verified_at"]
    return datetime.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp() * 1000


def past(ms):
    """Waits until the wall clock is past ms (a file written then has a later mtime)."""
    assert wait_until(lambda: time.time() * 1000 > ms + 2, timeout=5)


def test_a_file_renamed_into_place_is_not_served_until_reverified(tmp_path):
    srv = Server(tmp_path / "data", config_text="[server]\ncache_size = 0\n").start()
    try:
        data = random.Random(19).randbytes(4096)
        h = sha(data)
        root = srv.data_dir / "blobs" / "inplace"
        root.mkdir(parents=True)
        path = root / "a.bin"
        path.write_bytes(data)
        assert import_one(srv, h, len(data), "inplace/a.bin")["result"] == "created"
        url = f"{srv.url}/v1/blobs/{h}"
        g = requests.get(url, timeout=30)
        assert g.status_code == 200 and g.content == data
        # the same file touched: same inode, re-hashed on the read (small), served
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        g = requests.get(url, timeout=30)
        assert g.status_code == 200 and g.content == data, g.text
        # another file with the same bytes renamed over it: another inode, not served
        (root / ".a.bin.new").write_bytes(data)
        os.rename(root / ".a.bin.new", path)
        g = requests.get(url, timeout=30)
        assert g.status_code == 503, (g.status_code, g.text)
        assert g.json()["error"]["code"] == "store_unavailable"
        assert "is another file now (inode)" in srv.read_log()
        # verified again (a move onto itself): the record takes the new inode, served again
        loc = {"store": "local", "key": "inplace/a.bin"}
        r = requests.put(f"{url}/location", json={"expect": loc, "to": loc}, timeout=30)
        assert r.status_code == 200, r.text
        g = requests.get(url, timeout=30)
        assert g.status_code == 200 and g.content == data, g.text
        assert fsck_clean(srv) == 1
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_a_changed_big_file_is_hashed_again_in_the_background(tmp_path):
    srv = Server(tmp_path / "data", config_text="[server]\ncache_size = 0\n").start()
    try:
        data = random.Random(20).randbytes(17 * MiB + 5)
        h = sha(data)
        root = srv.data_dir / "blobs" / "inplace"
        root.mkdir(parents=True)
        path = root / "big.bin"
        path.write_bytes(data)
        assert import_one(srv, h, len(data), "inplace/big.bin")["result"] == "created"
        url = f"{srv.url}/v1/blobs/{h}"
        assert requests.get(url, timeout=60).status_code == 200
        # touched: the same bytes, but too large to hash on the read
        past(verified_at_ms(url))
        os.utime(path)
        g = requests.get(url, timeout=60)
        assert g.status_code == 503, g.status_code
        assert g.json()["error"]["code"] == "store_unavailable"
        assert int(g.headers["Retry-After"]) >= 1
        assert wait_until(lambda: requests.get(url, timeout=60).status_code == 200, timeout=60), \
            srv.read_log()[-3000:]
        g = requests.get(url, timeout=60)
        assert g.status_code == 200 and g.content == data
        assert "hashed again in the background" in srv.read_log()
        # rewritten in place with other bytes of the same size: found wrong, suspect, kept at 503
        past(verified_at_ms(url))
        with open(path, "r+b") as f:
            f.seek(7 * MiB)
            f.write(b"\0not the blob\0")
        suspect = srv.data_dir / "suspect"
        g = requests.get(url, timeout=60)
        assert g.status_code == 503 and "Retry-After" in g.headers
        assert wait_until(lambda: suspect.exists() and "inplace/big.bin" in suspect.read_text(),
                          timeout=60), srv.read_log()[-3000:]
        assert "is not the blob's now" in srv.read_log()
        for _ in range(3):  # not hashed again until the file moves
            assert requests.get(url, timeout=60).status_code == 503
        assert srv.read_log().count("is not the blob's now") == 1
    finally:
        assert srv.stop() == 0, srv.read_log()
