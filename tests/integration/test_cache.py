"""The small-blob cache: reads served from memory are byte-identical, ranges work from it, and
bytes that no longer match their hash on disk are never served (503, logged)."""
import hashlib
import os

import requests

from conftest import Server


def put(srv, data):
    h = hashlib.sha256(data).hexdigest()
    r = requests.put(f"{srv.url}/v1/blobs/{h}", data=data, timeout=10)
    assert r.status_code == 201, r.text
    return h


def blob_path(srv, h):
    return srv.data_dir / "blobs" / "sha256" / h[:2] / h[2:4] / h


def test_cached_reads_and_ranges(server):
    data = os.urandom(5000)
    h = put(server, data)
    for _ in range(3):  # miss, then hits
        r = requests.get(f"{server.url}/v1/blobs/{h}", timeout=10)
        assert r.status_code == 200 and r.content == data
        assert r.headers["ETag"] == f'"{h}"'
    r = requests.get(f"{server.url}/v1/blobs/{h}", headers={"Range": "bytes=100-199"}, timeout=10)
    assert r.status_code == 206 and r.content == data[100:200]
    assert r.headers["Content-Range"] == "bytes 100-199/5000"
    r = requests.get(f"{server.url}/v1/blobs/{h}", headers={"Range": "bytes=-10"}, timeout=10)
    assert r.status_code == 206 and r.content == data[-10:]
    empty = b""
    he = hashlib.sha256(empty).hexdigest()
    assert requests.put(f"{server.url}/v1/blobs/{he}", data=empty, timeout=10).status_code in (200, 201)
    r = requests.get(f"{server.url}/v1/blobs/{he}", timeout=10)
    assert r.status_code == 200 and r.content == b"" and r.headers["Content-Length"] == "0"


def test_corrupted_bytes_are_never_served(tmp_path):
    srv = Server(tmp_path / "data").start()
    try:
        data = os.urandom(3000)
        h = put(srv, data)
        path = blob_path(srv, h)
        corrupt = bytearray(data)
        corrupt[10] ^= 0xFF
        path.write_bytes(bytes(corrupt))  # behind the server's back, before any read
        r = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=10)
        assert r.status_code == 503, (r.status_code, r.content[:100])
        assert r.json()["error"]["code"] == "store_unavailable"
        assert "do not match their hash" in srv.read_log()
        path.write_bytes(data)  # repaired: served again
        r = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=10)
        assert r.status_code == 200 and r.content == data
    finally:
        assert srv.stop() == 0


def test_cache_off_still_serves(tmp_path):
    srv = Server(tmp_path / "data", config_text="[server]\ncache_size = 0\n").start()
    try:
        data = os.urandom(2000)
        h = put(srv, data)
        r = requests.get(f"{srv.url}/v1/blobs/{h}", headers={"Range": "bytes=5-9"}, timeout=10)
        assert r.status_code == 206 and r.content == data[5:10]
        assert requests.get(f"{srv.url}/v1/blobs/{h}", timeout=10).content == data
    finally:
        assert srv.stop() == 0
