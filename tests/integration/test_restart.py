"""A graceful restart (SIGTERM, start again on the same data dir) keeps every blob and record."""
import random
import signal
import time

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


def test_sigterm_under_load_exits_0(tmp_path):
    """SIGTERM while requests arrive, an upload streams and a client stalls mid-body: exit 0, and
    every upload acknowledged before the stop is there after the restart."""
    import os
    import socket
    import threading
    import time

    from util_http import RawConn, request_head

    acked = {}
    for cycle in range(8):
        srv = Server(tmp_path / "data").start()
        for h, data in acked.items():  # everything acknowledged so far is still there
            r = get(srv, h)
            assert r.status_code == 200 and r.content == data, (cycle, h)
        stop = threading.Event()
        lock = threading.Lock()

        def hammer():
            while not stop.is_set():
                try:
                    s = socket.create_connection(("127.0.0.1", srv.port), timeout=2)
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    s.recv(1000)
                    s.close()
                except OSError:
                    pass

        def uploader(k):
            n = 0
            while not stop.is_set():
                data = os.urandom(50000 + k * 1000 + n)
                n += 1
                try:
                    r = requests.post(f"{srv.url}/v1/blobs", data=data, timeout=10)
                except Exception:  # noqa: BLE001 - refused or cut by the stop: not acknowledged
                    continue
                if r.status_code in (200, 201):
                    with lock:
                        acked[sha(data)] = data

        stall = RawConn(srv)
        stall.send(request_head("PUT", f"/v1/blobs/{'e' * 64}", [("Content-Length", "100000")])
                   + b"x" * 1000)
        ts = [threading.Thread(target=hammer) for _ in range(6)]
        ts += [threading.Thread(target=uploader, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        time.sleep(0.3 + 0.1 * cycle)
        t0 = time.time()
        rc = srv.stop(signal.SIGTERM)
        took = time.time() - t0
        stop.set()
        for t in ts:
            t.join(30)
        stall.close()
        assert rc == 0, f"cycle {cycle}: exit {rc}\n" + srv.read_log()[-3000:]
        assert took < 25, took
    rc, n, problems, out = fsck(tmp_path / "data", verify=True)
    assert rc == 0 and problems == 0 and n >= len(acked), out


def rebuild_index(data_dir, config=None):
    """Runs blobrefd --rebuild-index; returns (exit code, output)."""
    import os
    import subprocess
    from conftest import BIN_DIR
    args = [str(BIN_DIR / "blobrefd"), "--rebuild-index", "--data", str(data_dir)]
    if config is not None:
        args += ["-c", str(config)]
    env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=1")
    p = subprocess.run(args, capture_output=True, timeout=120, env=env)
    return p.returncode, p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")


def test_rebuild_index_from_the_store(tmp_path):
    """A lost index is rebuilt from the store's content-addressed objects; an object whose bytes
    do not match its key is reported and left out."""
    import os
    import shutil
    import time
    from util_http import object_path
    rng = random.Random(7)
    srv = Server(tmp_path / "data").start()
    blobs = {}
    for _ in range(25):
        data = rng.randbytes(rng.randrange(0, 100000))
        assert put(srv, data, headers={"Content-Type": "image/png"}).status_code == 201
        blobs[sha(data)] = data
    bad = rng.randbytes(5000)
    assert put(srv, bad).status_code == 201
    assert srv.stop() == 0, srv.read_log()

    shutil.rmtree(tmp_path / "data" / "index")
    bad_path = object_path(srv, sha(bad))
    bad_path.write_bytes(b"not the bytes this key names")
    stray = srv.data_dir / "blobs" / "sha256" / "zz"
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("not an object")
    mtime = time.time() - 86400
    some = next(iter(blobs))
    os.utime(object_path(srv, some), (mtime, mtime))

    rc, out = rebuild_index(tmp_path / "data")
    assert rc == 1, out
    assert f"rebuild-index: {len(blobs)} blobs indexed, 0 already there, 2 problems" in out, out
    assert f"{sha(bad)}: SHA-256 mismatch; left out" in out, out
    assert "notes.txt: not a content-addressed key; left out" in out, out
    rc, n, problems, fout = fsck(tmp_path / "data", verify=True)
    assert (rc, n, problems) == (0, len(blobs), 0), fout
    # A second run finds everything indexed (the corrupt object is still reported).
    rc, out = rebuild_index(tmp_path / "data")
    assert f"0 blobs indexed, {len(blobs)} already there, 2 problems" in out, out

    srv2 = Server(tmp_path / "data").start()
    try:
        for h, data in blobs.items():
            r = get(srv2, h)
            assert r.status_code == 200 and r.content == data, h
            assert r.headers["Content-Type"] == "application/octet-stream"
        assert get(srv2, sha(bad)).status_code == 404
        m = requests.get(f"{srv2.url}/v1/blobs/{some}/meta", timeout=TIMEOUT).json()
        assert m["created_at"].startswith(time.strftime("%Y-%m-%dT%H:%M", time.gmtime(mtime)))
        assert m["locations"][0]["key"] == f"sha256/{some[:2]}/{some[2:4]}/{some}"
        # uploading the corrupted blob again repairs it
        assert put(srv2, bad).status_code == 201
        assert get(srv2, sha(bad)).content == bad
    finally:
        assert srv2.stop() == 0, srv2.read_log()


def list_all(srv):
    """Every record through GET /v1/blobs, page by page: {sha256: record}."""
    out, after = {}, ""
    while True:
        r = requests.get(f"{srv.url}/v1/blobs", params={"after": after, "limit": 10000},
                         timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        page = r.json()
        for b in page["blobs"]:
            out[b["sha256"]] = b
        if not page.get("next"):
            return out
        after = page["next"]


def test_rebuild_index_in_batches_survives_a_kill(tmp_path):
    """--rebuild-index inserts in batches (one commit per 1,024 objects, hashed on several
    threads) and says so after each first commit: killed (-9) after one, the index holds whole,
    correct records only (fsck --verify clean); the next run indexes the rest, and every record
    is the object's (its id the SHA-256 computed here, its size, key and mtime)."""
    import hashlib
    import os
    import subprocess
    from conftest import BIN_DIR
    data_dir, root = tmp_path / "data", tmp_path / "data" / "blobs"
    rng = random.Random(25)
    files = {}
    for i in range(2200):
        data = rng.randbytes(rng.randrange(0, 1500)) if i else rng.randbytes(3 << 20)
        h = hashlib.sha256(data).hexdigest()
        p = root / "sha256" / h[:2] / h[2:4] / h
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        mtime = 1_700_000_000 + i * 60
        os.utime(p, (mtime, mtime))
        files[h] = (len(data), mtime)
    wrong = [hashlib.sha256(b"named %d" % i).hexdigest() for i in range(2)]
    for h in wrong:  # bytes that do not hash to their key: left out
        p = root / "sha256" / h[:2] / h[2:4] / h
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"other bytes")
    args = [str(BIN_DIR / "blobrefd"), "--rebuild-index", "--data", str(data_dir)]
    env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=1")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    seen = []
    for line in p.stdout:
        seen.append(line.decode(errors="replace"))
        if "blobs indexed so far" in seen[-1]:
            p.kill()
            break
    rest = p.stdout.read().decode(errors="replace")
    p.wait(timeout=60)
    out = "".join(seen) + rest
    assert "blobs indexed so far" in out and "rebuild-index: 2200 blobs indexed" not in out, out
    assert p.returncode == -9, out
    rc, n, problems, fout = fsck(data_dir, verify=True)
    assert rc == 0 and problems == 0 and 1024 <= n < len(files), fout
    assert n % 1024 == 0, n  # whole batches: one commit each
    rc, out = rebuild_index(data_dir)
    assert rc == 1, out  # the two wrong objects
    assert f"rebuild-index: {len(files) - n} blobs indexed, {n} already there, 2 problems" in out, out
    rc, n2, problems, fout = fsck(data_dir, verify=True)
    assert (rc, n2, problems) == (0, len(files), 0), fout
    srv = Server(data_dir).start()
    try:
        got = list_all(srv)
        assert set(got) == set(files)
        for h, (size, mtime) in files.items():
            b = got[h]
            assert b["size"] == size and b["state"] == "live", b
            assert b["content_type"] == "application/octet-stream", b
            assert [(loc["key"], loc["role"]) for loc in b["locations"]] == \
                [(f"sha256/{h[:2]}/{h[2:4]}/{h}", "primary")], b
            assert b["created_at"].startswith(
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mtime))), b
    finally:
        assert srv.stop() == 0, srv.read_log()
