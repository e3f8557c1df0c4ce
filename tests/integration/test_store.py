"""The fs store at startup: leftovers of uploads that never committed are removed, temp files of
another live process sharing the root are kept, and committed blobs are untouched."""
import hashlib
import os

import requests

from conftest import Server


def test_leftover_temp_files_removed_at_startup(tmp_path):
    srv = Server(tmp_path / "data").start()
    data = os.urandom(1000)
    h = hashlib.sha256(data).hexdigest()
    assert requests.put(f"{srv.url}/v1/blobs/{h}", data=data, timeout=10).status_code == 201
    assert srv.stop() == 0
    tmp = srv.data_dir / "blobs" / "tmp"
    dead = tmp / "up-999999999-00000000deadbeef"  # no such pid
    alive = tmp / f"up-{os.getpid()}-0000000000000001"  # this test process: alive
    stray = tmp / "garbage"
    for p in (dead, alive, stray):
        p.write_bytes(b"partial upload")
    srv.start()
    try:
        assert not dead.exists() and not stray.exists()
        assert alive.exists(), "a live process's temp file was removed"
        assert "removed 2 leftover temp file(s)" in srv.read_log()
        r = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=10)
        assert r.status_code == 200 and r.content == data
    finally:
        assert srv.stop() == 0
