"""blobref import: a tree with duplicates, symlinks, unreadable files, special files, names that
are not valid keys and a file that changes while it is read; each gets a clear line and nothing
is indexed for it. In place and copied; a rerun changes nothing; an in-place blob whose file
changes later is never served as that hash."""
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time

import pytest
import requests

from conftest import BIN_DIR, Server


def run_import(srv, conf, source, *extra, user=None):
    args = [str(BIN_DIR / "blobref"), "--server", srv.url, "import", str(source), "-c", str(conf),
            *extra]
    if user:
        args = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + args
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture
def world(tmp_path):
    """A store root readable by everyone (so that the import may run as nobody, for whom a
    mode-000 file is unreadable even when the tests run as root)."""
    base = pathlib_mkdtemp()
    yield base
    shutil.rmtree(base, ignore_errors=True)


def pathlib_mkdtemp():
    import pathlib
    d = pathlib.Path(tempfile.mkdtemp(prefix="blobref-import-"))
    os.chmod(d, 0o755)
    return d


def conf_text(base):
    return f"""[server]
upload_store = b
[store a]
kind = fs
root = {base / 'a'}
[store b]
kind = fs
root = {base / 'b'}
"""


def write(p, data, mode=0o644):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.chmod(p, mode)


def test_import_in_place_report_and_rerun(world):
    base = world
    src = base / "a" / "images" / "year=2025" / "month=12"
    files = {}
    for day in range(1, 4):
        for i in range(8):
            data = os.urandom(1000 + i * 3000) + bytes([day, i])
            p = src / f"day={day:02d}" / f"img{i}.jpg"
            write(p, data)
            files[p] = data
    large = src / "day=01" / "large.jpg"  # above cache_max_blob: read from the file each time
    write(large, os.urandom(300_000))
    files[large] = large.read_bytes()
    dup = src / "day=01" / "copy-of-img0.jpg"
    write(dup, files[src / "day=01" / "img0.jpg"])
    os.symlink(src / "day=01" / "img1.jpg", src / "day=01" / "link.jpg")
    write(src / "day=02" / "secret.jpg", b"no access", mode=0o000)
    write(src / "day=02" / "back\\slash.jpg", b"bad name")
    write(src / "day=02" / "new\nline.jpg", b"bad name 2")
    os.mkfifo(src / "day=03" / "pipe")
    big = src / "day=03" / "growing.bin"
    write(big, os.urandom(32 << 20))
    for d in [base / "a"] + [p for p in (base / "a").rglob("*") if p.is_dir()]:
        os.chmod(d, 0o755)
    stop = threading.Event()

    def grow():
        with open(big, "ab") as f:
            while not stop.is_set():
                f.write(b"x" * 4096)
                f.flush()
                time.sleep(0.001)

    srv = Server(base / "data", conf_text(base)).start()
    os.chmod(base / "data", 0o755)
    conf = base / "data" / "blobref.conf"
    os.chmod(conf, 0o644)
    user = "65534" if os.geteuid() == 0 and shutil.which("setpriv") else None
    t = threading.Thread(target=grow)
    t.start()
    try:
        r = run_import(srv, conf, base / "a" / "images", "--store", "a", "--in-place",
                       "--threads", "4", user=user)
        stop.set()
        t.join()
        out = r.stdout
        assert r.returncode == 1, out + r.stderr  # the unreadable file is an error
        assert f"skipped: {src}/day=01/link.jpg: symbolic link" in out, out
        assert f"error: {src}/day=02/secret.jpg: Permission denied" in out, out
        assert f"skipped: {src}/day=02/back\\slash.jpg: the name is not a valid object key" in out
        assert "new\nline.jpg: the name is not a valid object key" in out, out
        assert f"skipped: {src}/day=03/pipe: not a regular file" in out, out
        assert f"skipped: {big}: changed while it was read" in out, out
        assert "duplicate: " in out and "img0.jpg: already indexed at a:images/" in out, out
        assert "imported 26 files" in out and "25 new" in out and "1 duplicates" in out, out
        assert "5 skipped, 1 errors" in out, out
        for p, data in files.items():
            h = hashlib.sha256(data).hexdigest()
            g = requests.get(f"{srv.url}/v1/blobs/{h}")
            assert g.status_code == 200 and g.content == data
            meta = requests.get(f"{srv.url}/v1/blobs/{h}/meta").json()
            key = str(p.relative_to(base / "a"))
            assert meta["locations"][0]["store"] == "a"
            # of two files with the same bytes, whichever was hashed first is the record
            assert meta["locations"][0]["key"] in (key, str(dup.relative_to(base / "a")))
            assert meta["content_type"] == "image/jpeg"
        # nothing was indexed for the skipped ones
        for data in (b"no access", b"bad name", b"bad name 2"):
            h = hashlib.sha256(data).hexdigest()
            assert requests.get(f"{srv.url}/v1/blobs/{h}/meta").status_code == 404
        # a rerun: everything is there already, nothing changes
        big.unlink()
        r = run_import(srv, conf, base / "a" / "images", "--store", "a", user=user)
        assert "0 new, 25 already imported, 1 duplicates" in r.stdout, r.stdout
        # a file changed on disk after the import: never served as that hash
        p0 = large
        h0 = hashlib.sha256(files[p0]).hexdigest()
        with open(p0, "ab") as f:
            f.write(b"!")
        g = requests.get(f"{srv.url}/v1/blobs/{h0}")
        assert g.status_code == 503, g.status_code
        p1 = src / "day=03" / "img0.jpg"  # small: re-hashed by the read cache
        h1 = hashlib.sha256(files[p1]).hexdigest()
        changed = bytearray(files[p1])
        changed[0] ^= 0xFF
        p1.write_bytes(bytes(changed))
        g = requests.get(f"{srv.url}/v1/blobs/{h1}")
        # either the verified bytes cached before the change, or an error: never the new bytes
        assert g.content != bytes(changed)
        assert g.status_code >= 500 or g.content == files[p1], g.status_code
    finally:
        stop.set()
        t.join()
        assert srv.stop() == 0, srv.read_log()


def test_import_copy_and_bad_args(world):
    base = world
    src = base / "incoming"
    blobs = {}
    for i in range(30):
        data = os.urandom(500 + i) + bytes([i])
        write(src / f"f{i:02d}.bin", data)
        blobs[hashlib.sha256(data).hexdigest()] = data
    srv = Server(base / "data", conf_text(base)).start()
    conf = base / "data" / "blobref.conf"
    try:
        r = run_import(srv, conf, src, "--store", "b", "--copy", "--batch", "7")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "30 new" in r.stdout, r.stdout
        for h, data in blobs.items():
            assert (base / "b" / "sha256" / h[:2] / h[2:4] / h).read_bytes() == data
            g = requests.get(f"{srv.url}/v1/blobs/{h}")
            assert g.status_code == 200 and g.content == data
        # in place needs SOURCE under the store's root
        r = run_import(srv, conf, src, "--store", "a", "--in-place")
        assert r.returncode == 1 and "not under store a's root" in r.stderr, r.stderr
        r = run_import(srv, conf, src, "--store", "nosuch")
        assert r.returncode == 1 and "no [store nosuch]" in r.stderr, r.stderr
        # the endpoint itself refuses what it cannot check
        body = {"blobs": [{"sha256": "0" * 64, "size": 5, "store": "a", "key": "nope"},
                          {"sha256": "zz", "size": 5, "store": "a", "key": "x"},
                          {"sha256": "1" * 64, "size": 5, "store": "a", "key": "../x"}]}
        j = requests.post(f"{srv.url}/v1/import", json=body).json()
        assert [x["result"] for x in j["results"]] == ["error"] * 3, j
        assert "no such object" in j["results"][0]["message"]
        assert requests.post(f"{srv.url}/v1/import", data=b"[").status_code == 400
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_import_s3_prefix_in_place(tmp_path, rgw):
    bucket = rgw.make_bucket("import-in-place")
    s3 = rgw.client()
    blobs = {}
    for day in (1, 2):
        for i in range(6):
            data = os.urandom(2000 + i * 100) + bytes([day, i])
            key = f"images/year=2025/month=12/day={day:02d}/img{i}.jpg"
            s3.put_object(Bucket=bucket, Key=key, Body=data)
            blobs[key] = data
    s3.put_object(Bucket=bucket, Key="images/back\\slash.jpg", Body=b"bad")
    s3.put_object(Bucket=bucket, Key="other/outside.jpg", Body=b"not under the prefix")
    conf_text = f"""[server]
upload_store = local
[store local]
kind = fs
root = {tmp_path / 'local'}
[store lake]
kind = s3
endpoint = {rgw.endpoint}
region = {rgw.region}
bucket = {bucket}
path_style = true
access_key = {rgw.access_key}
secret_key = {rgw.secret_key}
serve = proxy
"""
    srv = Server(tmp_path / "data", conf_text).start()
    conf = srv.data_dir / "blobref.conf"
    try:
        r = run_import(srv, conf, "images/", "--store", "lake", "--in-place", "--threads", "3")
        assert "skipped: lake:images/back\\slash.jpg: the name is not a valid object key" in r.stdout
        assert "imported 12 files" in r.stdout and "12 new" in r.stdout, r.stdout + r.stderr
        assert r.returncode == 0, r.stdout + r.stderr
        for key, data in blobs.items():
            h = hashlib.sha256(data).hexdigest()
            meta = requests.get(f"{srv.url}/v1/blobs/{h}/meta").json()
            assert meta["locations"][0] == {**meta["locations"][0], "store": "lake", "key": key}
            g = requests.get(f"{srv.url}/v1/blobs/{h}")
            assert g.status_code == 200 and g.content == data
        h = hashlib.sha256(b"not under the prefix").hexdigest()
        assert requests.get(f"{srv.url}/v1/blobs/{h}/meta").status_code == 404
        r = run_import(srv, conf, "images/", "--store", "lake")
        assert "0 new, 12 already imported" in r.stdout, r.stdout
    finally:
        assert srv.stop() == 0, srv.read_log()
