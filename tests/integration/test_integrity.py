"""Issue 19, integrity: a store key belongs to at most one record (invariant 10: in-place
re-imports, moves onto another blob's file, reconcile deleting a rewritten in-place file), deletes
that survive a crash or a failed step (invariants 1, 4: never a restore to "live" without bytes),
and a killed reader (blobrefd --fsck, or any process holding an LMDB read transaction) that never
blocks the writer."""
import ctypes
import ctypes.util
import hashlib
import json
import os
import pathlib
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest
import requests

from conftest import BIN_DIR, Server
from reconcile_util import Api, IceTable, blob_path, recon_conf, sha
from util_http import fsck, wait_until

MARGIN = 0.3


def sleep_past(t):
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)


def import_one(srv, h, size, key, store="local"):
    body = {"blobs": [{"sha256": h, "size": size, "store": store, "key": key}]}
    r = requests.post(f"{srv.url}/v1/import", json=body, timeout=30)
    assert r.status_code == 200, r.text
    [res] = r.json()["results"]
    return res


def conf_path(srv):
    return srv.data_dir / "blobref.conf"


def fsck_clean(srv, verify=True):
    rc, blobs, problems, out = fsck(srv.data_dir, conf_path(srv), verify=verify)
    assert rc == 0 and problems == 0, out
    return blobs


# ---- 1. one record per store key ------------------------------------------------------------

def test_inplace_reimport_of_a_rewritten_file(tmp_path):
    """Import a file in place (A), rewrite it (B, same size), import again: refused, key_in_use
    (it used to create a second record on the same key, and deleting A then unlinked B's bytes).
    Reconcile deletes A: the file no longer holds A's bytes, so it is kept and only A's record
    goes; B can then be imported and is served."""
    t = IceTable(tmp_path / "images")
    srv = Server(tmp_path / "data", config_text=recon_conf(t, grace="1s", retention="1s")).start()
    api = Api(srv)
    try:
        root = srv.data_dir / "blobs"
        f = root / "photos" / "x.bin"
        f.parent.mkdir(parents=True, exist_ok=True)
        a, b = random.Random(1).randbytes(5000), random.Random(2).randbytes(5000)
        f.write_bytes(a)
        A, B = sha(a), sha(b)
        assert import_one(srv, A, len(a), "photos/x.bin")["result"] == "created"
        f.write_bytes(b)  # rewritten in place
        res = import_one(srv, B, len(b), "photos/x.bin")
        assert res["result"] == "key_in_use", res
        assert api.meta(B).status_code == 404
        # the table references B (not indexed): A is unreferenced -> quarantined, then deleted
        t.write_data({"f1.parquet": [B]})
        t.append("f1.parquet")
        t0 = time.monotonic()
        sleep_past(t0 + 1.0 + MARGIN)
        rep = api.run()
        assert rep["blobs"]["quarantined"] == 1, json.dumps(rep)
        sleep_past(time.monotonic() + 1.0 + MARGIN)
        rep = api.run()
        assert rep["blobs"]["deleted"] == 1 and rep["errors"] == [], json.dumps(rep)
        assert api.meta(A).status_code == 404
        assert f.read_bytes() == b, "reconcile deleted a rewritten in-place file"
        assert "no longer holds its bytes" in srv.read_log()
        assert import_one(srv, B, len(b), "photos/x.bin")["result"] == "created"
        g = api.get(B)
        assert g.status_code == 200 and g.content == b
        assert fsck_clean(srv) == 1
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_move_onto_another_blobs_file_is_refused(tmp_path):
    """PUT /v1/blobs/{X}/location with verify=size onto Y's file (same size) used to point X at
    Y's bytes (and a later drain or delete of one took the other's). The copy is hashed whatever
    `verify` says, so it is a 422 verify_failed before the index's 409 key_in_use is reached."""
    srv = Server(tmp_path / "data", config_text="[server]\ncache_size = 0\n").start()
    try:
        x, y = random.Random(3).randbytes(4096), random.Random(4).randbytes(4096)
        X, Y = sha(x), sha(y)
        for data, h in ((x, X), (y, Y)):
            r = requests.put(f"{srv.url}/v1/blobs/{h}", data=data, timeout=30)
            assert r.status_code == 201, r.text
        key = lambda h: f"sha256/{h[:2]}/{h[2:4]}/{h}"  # noqa: E731
        body = {"expect": {"store": "local", "key": key(X)}, "to": {"store": "local", "key": key(Y)},
                "verify": "size"}
        r = requests.put(f"{srv.url}/v1/blobs/{X}/location", json=body, timeout=30)
        assert r.status_code == 422 and r.json()["error"]["code"] == "verify_failed", r.text
        m = requests.get(f"{srv.url}/v1/blobs/{X}/meta", timeout=30).json()
        assert [loc["key"] for loc in m["locations"]] == [key(X)], m
        for data, h in ((x, X), (y, Y)):
            g = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=30)
            assert g.status_code == 200 and g.content == data
        assert fsck_clean(srv) == 2
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_import_onto_another_blobs_default_key_is_refused(tmp_path):
    """POST /v1/import of X at the default (content-addressed) key of another blob Y, which is
    not uploaded yet: the upload of Y would write its bytes there and replace X's. Refused per
    item (key_in_use), nothing indexed; the other items of the call go ahead; Y uploads fine."""
    srv = Server(tmp_path / "data", config_text="[server]\ncache_size = 0\n").start()
    try:
        x, y, z = (random.Random(i).randbytes(3000) for i in (5, 6, 7))
        X, Y, Z = sha(x), sha(y), sha(z)
        key = lambda h: f"sha256/{h[:2]}/{h[2:4]}/{h}"  # noqa: E731
        root = srv.data_dir / "blobs"
        for data, k in ((x, key(Y)), (z, "photos/z.bin")):
            (root / k).parent.mkdir(parents=True, exist_ok=True)
            (root / k).write_bytes(data)
        body = {"blobs": [{"sha256": X, "size": len(x), "store": "local", "key": key(Y)},
                          {"sha256": Z, "size": len(z), "store": "local", "key": "photos/z.bin"}]}
        r = requests.post(f"{srv.url}/v1/import", json=body, timeout=30)
        assert r.status_code == 200, r.text
        res = r.json()["results"]
        assert res[0]["result"] == "key_in_use" and "another blob" in res[0]["message"], res
        assert res[1]["result"] == "created", res
        assert "refused: the default key of another blob" in srv.read_log()
        assert requests.get(f"{srv.url}/v1/blobs/{X}/meta", timeout=30).status_code == 404
        r = requests.put(f"{srv.url}/v1/blobs/{Y}", data=y, timeout=30)
        assert r.status_code == 201, r.text
        for data, h in ((y, Y), (z, Z)):
            g = requests.get(f"{srv.url}/v1/blobs/{h}", timeout=30)
            assert g.status_code == 200 and g.content == data
        # its own default key is a fine place for a blob to be imported at
        w = random.Random(8).randbytes(100)
        (root / key(sha(w))).parent.mkdir(parents=True, exist_ok=True)
        (root / key(sha(w))).write_bytes(w)
        assert import_one(srv, sha(w), len(w), key(sha(w)))["result"] == "created"
        assert fsck_clean(srv) == 3
    finally:
        assert srv.stop() == 0, srv.read_log()


# ---- 2. deletes that survive a failure or a crash -------------------------------------------

def test_delete_cut_short_is_never_restored(tmp_path):
    """A blob with bytes in two stores whose delete fails in the second (a directory where its
    object should be) used to stay quarantined without its first copy, and a restore made it
    "live" with no bytes. Now it is marked deleting first: reads say 410, a restore is refused
    (409 blob_deleting), an upload of the same bytes starts it afresh, and the next run finishes
    the delete of a blob nobody uploaded again."""
    a, b = tmp_path / "a", tmp_path / "b"
    t = IceTable(tmp_path / "images")

    def conf(upload_store):
        return recon_conf(t, grace="1s", retention="1s",
                          server_extra=f"dedup_touch_interval = 0s\nupload_store = {upload_store}\n"
                                       "cache_size = 0\n",
                          extra=f"[store a]\nkind = fs\nroot = {a}\n[store b]\nkind = fs\n"
                                f"root = {b}\n")
    t.write_data({"f0.parquet": [sha(b"something else")]})
    t.append("f0.parquet")
    data = {h: d for d in (random.Random(10 + i).randbytes(3000) for i in range(2))
            for h in [sha(d)]}
    P, Q = list(data)
    srv = Server(tmp_path / "data", config_text=conf("a")).start()
    api = Api(srv)
    try:
        for h in (P, Q):
            api.put(data[h])
        sleep_past(time.monotonic() + 1.0 + MARGIN)
        assert api.run()["blobs"]["quarantined"] == 2
        srv.stop()
        srv.config_text = conf("b")
        srv.start()
        for h in (P, Q):  # quarantined by reconcile: an upload restores it, with a copy in b
            assert api.put(data[h]) == h
            locs = [(loc["store"], loc["role"]) for loc in api.meta(h).json()["locations"]]
            assert locs == [("a", "primary"), ("b", "copy")], locs
        sleep_past(time.monotonic() + 1.0 + MARGIN)
        assert api.run()["blobs"]["quarantined"] == 2
        for h in (P, Q):  # b's objects cannot be deleted: a directory stands in their way
            obj = b / "sha256" / h[:2] / h[2:4] / h
            obj.unlink()
            (obj / "in-the-way").mkdir(parents=True)
        sleep_past(time.monotonic() + 1.0 + MARGIN)
        rep = api.run()
        assert rep["blobs"]["deleted"] == 0 and len(rep["errors"]) == 2, json.dumps(rep)
        for h in (P, Q):
            assert not (a / "sha256" / h[:2] / h[2:4] / h).exists()
            r = api.restore(h)
            assert r.status_code == 409 and r.json()["error"]["code"] == "blob_deleting", r.text
            assert api.code(h) == 410
            assert requests.head(f"{srv.url}/v1/blobs/{h}", timeout=30).status_code == 410
        # automatic restore: a snapshot references P again; nothing is restored without bytes
        t.write_data({"f1.parquet": [P]})
        t.append("f1.parquet")
        rep = api.run()
        assert rep["blobs"]["restored"] == 0, json.dumps(rep)
        assert api.code(P) == 410
        # an upload of Q's bytes starts it afresh (once b has room for them)
        shutil.rmtree(b / "sha256" / Q[:2] / Q[2:4] / Q)
        r = api.s.put(f"{api.url}/v1/blobs/{Q}", data=data[Q], timeout=30)
        assert r.status_code == 201, r.text
        g = api.get(Q)
        assert g.status_code == 200 and g.content == data[Q]
        # once the store lets go, the next run (or a restart) finishes P's delete
        shutil.rmtree(b / "sha256" / P[:2] / P[2:4] / P)
        srv.stop()
        srv.start()  # br_reconciler_open finishes marked deletes
        assert api.meta(P).status_code == 404 and api.code(P) == 404
        assert "finished 1 delete" in srv.read_log()
        # the counters said 1 deleting: one walk found it (none at a start with 0)
        assert api.metrics()["blobref_reconcile_deleting_walks_total"] == 1
        g = api.get(Q)
        assert g.status_code == 200 and g.content == data[Q]
        assert fsck_clean(srv) == 1
    finally:
        srv.stop()


ROUNDS = 3
BLOBS = 300


def test_kill9_during_the_delete_phase(tmp_path):
    """kill -9 while reconcile deletes: after the restart every blob of the run is either gone
    (404) or still whole, an admin restore never brings one back without its bytes, and fsck
    --verify is clean."""
    t = IceTable(tmp_path / "images")
    t.write_data({"f0.parquet": [sha(b"nothing of ours")]})
    t.append("f0.parquet")
    srv = Server(tmp_path / "data", config_text=recon_conf(t, grace="1s", retention="1s")).start()
    api = Api(srv)
    killed_mid = 0
    try:
        for rnd in range(ROUNDS):
            data = {}
            for i in range(BLOBS):
                d = random.Random(f"{rnd}-{i}").randbytes(1024 + i)
                data[api.put(d)] = d
            sleep_past(time.monotonic() + 1.0 + MARGIN)
            assert api.run()["blobs"]["quarantined"] == BLOBS
            sleep_past(time.monotonic() + 1.0 + MARGIN)
            files = [blob_path(srv, h) for h in data]
            r = api.start_run()
            assert r.status_code == 202, r.text
            # kill once the delete phase is under way, before it is over
            left = BLOBS
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                left = sum(p.exists() for p in files)
                if left < BLOBS - 5 * (rnd + 1) or left == 0:
                    break
            srv.proc.kill()
            srv.proc.wait()
            srv.proc = None
            srv.log.close()
            killed_mid += 0 < left < BLOBS
            srv.start()
            for h, d in data.items():
                m = api.meta(h)
                if m.status_code == 404:
                    continue
                r = api.restore(h)
                assert r.status_code == 200, (h, r.status_code, r.text)
                g = api.get(h)
                assert g.status_code == 200 and g.content == d, (h, g.status_code, g.text[:200])
            fsck_clean(srv)
            # the restored ones are live again: quarantine and delete them for the next round
            sleep_past(time.monotonic() + 1.0 + MARGIN)
            api.run()
            sleep_past(time.monotonic() + 1.0 + MARGIN)
            api.run()
            assert all(api.meta(h).status_code == 404 for h in data)
        assert killed_mid >= 1, "no kill landed inside a delete phase"
        fsck_clean(srv)
    finally:
        srv.stop()


# ---- 3. a killed reader never blocks the writer ---------------------------------------------

def hold_read_txn(index_dir):
    """A child process that opens the index with liblmdb, begins a read transaction, prints
    'ready' and waits to be killed (as blobrefd --fsck does while it walks the index)."""
    code = f"""
import ctypes, ctypes.util, sys, time
lib = ctypes.CDLL(ctypes.util.find_library("lmdb"))
env = ctypes.c_void_p(); txn = ctypes.c_void_p()
assert lib.mdb_env_create(ctypes.byref(env)) == 0
lib.mdb_env_set_maxdbs(env, 4)
MDB_NOTLS, MDB_RDONLY = 0x200000, 0x20000
assert lib.mdb_env_open(env, {str(index_dir)!r}.encode(), MDB_NOTLS | MDB_RDONLY, 0o644) == 0
assert lib.mdb_txn_begin(env, None, MDB_RDONLY, ctypes.byref(txn)) == 0
print("ready", flush=True)
time.sleep(3600)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    return p


def fsck_killed_mid_walk(srv):
    """Starts blobrefd --fsck --verify on the server's data dir and SIGKILLs it while it holds
    its read transaction (it has a blob file open: it is inside the index walk)."""
    blobs = str(srv.data_dir / "blobs")
    env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=0")
    p = subprocess.Popen([str(BIN_DIR / "blobrefd"), "--fsck", "--verify", "--data",
                          str(srv.data_dir), "-c", str(conf_path(srv))],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    seen = False
    deadline = time.monotonic() + 60
    while not seen and p.poll() is None and time.monotonic() < deadline:
        try:
            for fd in os.listdir(f"/proc/{p.pid}/fd"):
                try:
                    # a blob file, not the store's own directory handle (the fs store holds
                    # one from its start, before the index walk)
                    path = f"/proc/{p.pid}/fd/{fd}"
                    if (os.readlink(path).startswith(blobs + "/")
                            and stat.S_ISREG(os.stat(path).st_mode)):
                        seen = True
                        break
                except OSError:
                    pass
        except OSError:
            pass
    p.kill()
    p.wait()
    return seen


@pytest.mark.parametrize("reader", ["fsck", "lmdb"])
def test_killed_reader_never_blocks_the_writer(tmp_path, reader):
    """With a small map (2 MiB), a stale reader slot pinned its snapshot and every write failed
    (500, MDB_BAD_TXN) after a few hundred; now 600 uploads after the kill all succeed."""
    srv = Server(tmp_path / "data", config_text="[server]\nindex_map_size = 2MiB\n").start()
    try:
        big = []
        for i in range(40):  # enough for fsck --verify to take a while
            d = random.Random(f"big{i}").randbytes(1 << 20)
            r = requests.put(f"{srv.url}/v1/blobs/{sha(d)}", data=d, timeout=30)
            assert r.status_code == 201, r.text
            big.append(sha(d))
        if reader == "fsck":
            assert fsck_killed_mid_walk(srv), "fsck was not caught inside its index walk"
        else:
            p = hold_read_txn(srv.data_dir / "index")
            p.kill()
            p.wait()
        bad = []
        s = requests.Session()
        for i in range(600):
            d = f"small blob {reader} {i}".encode() * 8
            r = s.put(f"{srv.url}/v1/blobs/{sha(d)}", data=d, timeout=30)
            if r.status_code != 201:
                bad.append((i, r.status_code, r.text[:200]))
        assert not bad, f"{len(bad)} of 600 uploads failed, first: {bad[:3]}"
        assert "reader slot(s) left by dead processes" in srv.read_log()
        assert fsck_clean(srv, verify=False) == 640
    finally:
        assert srv.stop() == 0, srv.read_log()


def stale_readers_metric(srv):
    r = requests.get(f"{srv.url}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    m = re.search(r"^blobref_index_stale_readers_total (\d+)$", r.text, re.M)
    assert m, "no blobref_index_stale_readers_total in /metrics"
    return int(m.group(1))


def test_stale_readers_cleared_are_counted_in_metrics(tmp_path):
    """/metrics counts the reader slots of dead processes that the writer cleared."""
    srv = Server(tmp_path / "data").start()
    try:
        assert stale_readers_metric(srv) == 0
        p = hold_read_txn(srv.data_dir / "index")
        p.kill()
        p.wait()
        s = requests.Session()
        # the writer checks every 64 write transactions (or 2 s): write until it has
        for i in range(1000):
            if stale_readers_metric(srv) >= 1:
                break
            d = f"stale reader metric {i}".encode()
            assert s.put(f"{srv.url}/v1/blobs/{sha(d)}", data=d, timeout=30).status_code == 201
        assert stale_readers_metric(srv) == 1
        assert "cleared 1 reader slot(s) left by dead processes" in srv.read_log()
    finally:
        assert srv.stop() == 0, srv.read_log()
