"""tools/python/blobref_fsspec.py with Debian's python3-fsspec against the real blobrefd:
fsspec.open("blobref://<hash>") reading ranges (bytes on the wire counted), PIL through fsspec,
ls/info over the listing, pipe/put then cat, server and token from the environment or storage
options, and a corrupted body refused by cat."""
import hashlib
import io
import os
import random
import sys

import pytest

from conftest import ROOT, Server

fsspec = pytest.importorskip("fsspec", reason="python3-fsspec is not installed")
sys.path.insert(0, str(ROOT / "tools" / "python"))
import blobref  # noqa: E402
import blobref_fsspec  # noqa: E402,F401  (registers blobref://)


def sha(b):
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def env_server(server, monkeypatch):
    monkeypatch.setenv("BLOBREF_SERVER", server.url)
    monkeypatch.delenv("BLOBREF_TOKEN", raising=False)
    return server


def blob_path(srv, h):
    return srv.data_dir / "blobs" / "sha256" / h[:2] / h[2:4] / h


def test_open_seek_read_ranges(env_server):
    data = os.urandom(3_000_000)
    h = blobref.Client().put(data)
    with fsspec.open(f"blobref://{h}", block_size=8192) as f:
        assert f.size == len(data)
        assert f.read(100) == data[:100]
        f.seek(2_500_000)
        assert f.read(5000) == data[2_500_000:2_505_000]
        f.seek(-10, os.SEEK_END)
        assert f.read() == data[-10:]
        assert f.tell() == len(data)
        # ranges only: the first block at open, one readahead block per far seek
        assert f.bytes_fetched < 40_000, f.bytes_fetched
        assert not f.verified       # a part is not verified
    with fsspec.open(f"blobref://sha256:{h.upper()}") as f:   # the other spelling
        assert f.read() == data
        assert f.verified            # read whole in order: hashed and checked


def test_pil_image_through_fsspec(env_server):
    from PIL import Image
    im = Image.frombytes("RGB", (1600, 1200), random.Random(5).randbytes(1600 * 1200 * 3))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90)
    jpeg = buf.getvalue()
    assert len(jpeg) > 1_000_000
    h = blobref.Client().put(jpeg, content_type="image/jpeg")
    with fsspec.open(f"blobref://{h}", block_size=4096) as f:
        img = Image.open(f)
        assert img.size == (1600, 1200) and img.format == "JPEG"
        assert f.bytes_fetched <= 3 * 4096, f.bytes_fetched     # the header, not the file
        img.load()                                              # the pixels: now it all
        assert f.bytes_fetched >= len(jpeg)
    assert img.getpixel((7, 9)) == Image.open(io.BytesIO(jpeg)).getpixel((7, 9))


def test_ls_and_info_over_the_listing(env_server):
    c = blobref.Client()
    blobs = {c.put(os.urandom(100 + i), content_type="text/x-test"): 100 + i for i in range(5)}
    fs = fsspec.filesystem("blobref")
    listing = fs.ls("blobref://")
    assert {e["name"]: e["size"] for e in listing} == blobs
    assert all(e["type"] == "file" for e in listing)
    assert sorted(fs.ls("", detail=False)) == sorted(blobs)
    h = next(iter(blobs))
    info = fs.info(f"blobref://{h}")
    assert info["name"] == h and info["size"] == blobs[h] and info["type"] == "file"
    assert info["content_type"] == "text/x-test" and info["state"] == "live"
    assert fs.info("blobref://")["type"] == "directory"
    assert fs.exists(h) and fs.size(h) == blobs[h]
    missing = "ab" * 32
    assert not fs.exists(missing)
    with pytest.raises(FileNotFoundError):
        fs.info(missing)
    with pytest.raises(FileNotFoundError):
        fsspec.open(f"blobref://{missing}").open()
    with pytest.raises(FileNotFoundError):
        fs.info("not-a-hash")


def test_pipe_put_then_cat(env_server, tmp_path):
    fs = fsspec.filesystem("blobref")
    data = os.urandom(50_000)
    h = sha(data)
    fs.pipe(f"blobref://{h}", data)
    assert fs.cat(f"blobref://{h}") == data
    assert fs.cat_file(h, start=100, end=200) == data[100:200]
    assert fs.cat_file(h, start=-5) == data[-5:]
    other = os.urandom(1000)
    with pytest.raises(ValueError, match="SHA-256"):
        fs.pipe(f"blobref://{h}", other)              # a path that is not the bytes' hash
    assert not fs.exists(sha(other))                   # ...refused before anything was sent
    assert fs.pipe_file("blobref://", other) == sha(other)   # the root: hashed here
    assert fs.cat(sha(other)) == other
    local = tmp_path / "photo.bin"
    local.write_bytes(os.urandom(20_000))
    fs.put(str(local), "blobref://")
    assert fs.last_put == sha(local.read_bytes())
    fs.get(f"blobref://{fs.last_put}", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == local.read_bytes()
    written = os.urandom(3000)
    with fsspec.open(f"blobref://{sha(written)}", "wb") as f:
        f.write(written[:1000])
        f.write(written[1000:])
    assert fs.cat(sha(written)) == written


def test_server_and_token_from_env_or_storage_options(tmp_path, monkeypatch):
    digest = hashlib.sha256(b"secret-rw").hexdigest()
    srv = Server(tmp_path / "data", config_text=f"[auth]\nanonymous = none\n[token rw]\n"
                 f"sha256 = {digest}\nscopes = read,write\n").start()
    try:
        monkeypatch.setenv("BLOBREF_SERVER", srv.url)
        monkeypatch.delenv("BLOBREF_TOKEN", raising=False)
        data = os.urandom(4000)
        h = sha(data)
        with pytest.raises(blobref.BlobrefError) as e:
            fsspec.filesystem("blobref", skip_instance_cache=True).pipe(h, data)
        assert e.value.status == 401
        monkeypatch.setenv("BLOBREF_TOKEN", "secret-rw")
        fsspec.filesystem("blobref", skip_instance_cache=True).pipe(h, data)
        monkeypatch.setenv("BLOBREF_SERVER", "http://127.0.0.1:9")   # storage options win
        monkeypatch.delenv("BLOBREF_TOKEN")
        with fsspec.open(f"blobref://{h}", server=srv.url, token="secret-rw") as f:
            assert f.read() == data
        with pytest.raises(blobref.BlobrefError) as e:
            fsspec.open(f"blobref://{h}", server=srv.url).open()
        assert e.value.status == 401
    finally:
        assert srv.stop() == 0


def test_corrupted_body_refused_by_cat(env_server):
    c = blobref.Client()
    big = os.urandom(300_000)   # above cache_max_blob: served from the file as it is on disk
    h = c.put(big)
    bad = bytearray(big)
    bad[250_000] ^= 0xFF
    blob_path(env_server, h).write_bytes(bytes(bad))
    fs = fsspec.filesystem("blobref")
    with pytest.raises(blobref.DigestMismatch):
        fs.cat(f"blobref://{h}")
    with fsspec.open(f"blobref://{h}", block_size=65536) as f:
        assert f.read(1000) == big[:1000]     # a part is not verified...
        with pytest.raises(blobref.DigestMismatch):
            f.read()                          # ...reading it all in order is


def test_corrupted_body_from_an_http_origin_refused_by_cat(tmp_path):
    """A test origin (tests/integration/test_http_store.py's web server) behind an http store
    serves a blob whose bytes were changed on it: blobrefd proxies them, fsspec refuses them."""
    from s3util import stop_checked
    from test_http_store import http_site, key_of
    big = random.Random(7).randbytes(700 * 1024 + 3)   # above cache_max_blob: streamed through
    srv, origin = http_site(tmp_path, [big])
    try:
        h = sha(big)
        bad = bytearray(big)
        bad[600_000] ^= 0x01
        (tmp_path / "site" / key_of(h)).write_bytes(bytes(bad))
        fs = fsspec.filesystem("blobref", server=srv.url)
        with pytest.raises(blobref.DigestMismatch):
            fs.cat(f"blobref://{h}")
        assert fs.cat_file(h, start=0, end=100) == big[:100]   # a range is not verifiable
        assert any(m == "GET" for m, _, _ in origin.requests), origin.requests
    finally:
        stop_checked(srv)
        origin.close()
