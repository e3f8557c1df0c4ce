"""Exact per-state counters (issue 25): /metrics reads the counts the index's writer keeps in the
same transactions as the records (uploads, holds, restores), across restarts, and never walks the
index for them (blobref_index_census_walks_total stays 0); fsck finds them consistent."""
import os

import requests

from conftest import Server
from util_http import TIMEOUT, fsck, put, sha
from test_metrics import metrics, samples


def counts(srv):
    s = samples(metrics(srv))
    out = {}
    for (name, labels), v in s.items():
        if name in ("blobref_index_blobs", "blobref_index_blob_bytes", "blobref_store_blobs",
                    "blobref_store_blob_bytes", "blobref_index_census_walks_total",
                    "blobref_index_map_bytes", "blobref_index_map_nearly_full"):
            out[name + labels] = v
    return out


def test_counts_follow_uploads_holds_restores_and_restarts(tmp_path):
    srv = Server(tmp_path / "data").start()
    try:
        blobs = [os.urandom(1000 + i) for i in range(5)]
        for b in blobs:
            assert put(srv, b).status_code == 201
        assert put(srv, blobs[0]).status_code in (200, 201)  # dedup: counted once
        c = counts(srv)
        [store] = [k[len('blobref_store_blobs{store="'):-2] for k in c
                   if k.startswith("blobref_store_blobs{")]
        total = sum(len(b) for b in blobs)
        assert c['blobref_index_blobs{state="live"}'] == 5
        assert c['blobref_index_blob_bytes{state="live"}'] == total
        assert c[f'blobref_store_blobs{{store="{store}"}}'] == 5
        assert c[f'blobref_store_blob_bytes{{store="{store}"}}'] == total
        assert c["blobref_index_map_bytes"] == 1 << 40  # the default: no cliff
        assert c["blobref_index_map_nearly_full"] == 0
        # an admin's hold, then a restore
        r = requests.delete(f"{srv.url}/v1/blobs/{sha(blobs[1])}", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        c = counts(srv)
        assert c['blobref_index_blobs{state="live"}'] == 4
        assert c['blobref_index_blobs{state="held"}'] == 1
        assert c['blobref_index_blob_bytes{state="held"}'] == len(blobs[1])
        assert c[f'blobref_store_blobs{{store="{store}"}}'] == 4
        r = requests.post(f"{srv.url}/v1/blobs/{sha(blobs[1])}/restore", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        c = counts(srv)
        assert c['blobref_index_blobs{state="live"}'] == 5
        assert c['blobref_index_blobs{state="held"}'] == 0
        assert c["blobref_index_census_walks_total"] == 0  # read, never walked
    finally:
        assert srv.stop() == 0, srv.read_log()
    rc, n, problems, out = fsck(tmp_path / "data")
    assert (rc, n, problems) == (0, 5, 0), out
    assert "index counters" not in out
    srv = Server(tmp_path / "data").start()
    try:
        c = counts(srv)
        assert c['blobref_index_blobs{state="live"}'] == 5
        assert c['blobref_index_blob_bytes{state="live"}'] == total
        # counted once, when the index was created; kept since, not recounted at this start
        assert srv.read_log().count("counting blobs by state") <= 1, srv.read_log()
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_default_map_is_sparse(tmp_path):
    """The 1 TiB default map is address space: the index file holds only what is written."""
    srv = Server(tmp_path / "data").start()
    try:
        for _ in range(50):
            assert put(srv, os.urandom(200)).status_code == 201
        assert counts(srv)["blobref_index_map_bytes"] == 1 << 40
    finally:
        assert srv.stop() == 0, srv.read_log()
    st = os.stat(tmp_path / "data" / "index" / "data.mdb")
    assert st.st_size < 16 << 20, st.st_size
    assert st.st_blocks * 512 < 16 << 20, st.st_blocks


# ---- the PostgreSQL index: the same counters, kept in blobref_counts ----------------------------

def pg_node(tmp_path, name, dsn, root):
    return Server(tmp_path / name, f"[store shared]\nkind = fs\nroot = {root}\n"
                                   f"[index]\nkind = postgres\ndsn = {dsn}\n")


def pg_rows(postgres, dsn, sql):
    return postgres.psql(sql, dbname=dsn.split("dbname=")[1])


def live_held(srv):
    c = counts(srv)
    return (c['blobref_index_blobs{state="live"}'], c['blobref_index_blobs{state="held"}'],
            c['blobref_index_blob_bytes{state="live"}'], c['blobref_store_blobs{store="shared"}'],
            c["blobref_index_census_walks_total"])


def test_pg_counters_add_up_across_two_nodes(tmp_path, postgres):
    """Each node adds to rows of its own; /metrics on either sums them, never walking."""
    dsn, root = postgres.database(), tmp_path / "blobs"
    a, b = pg_node(tmp_path, "a", dsn, root).start(), pg_node(tmp_path, "b", dsn, root).start()
    try:
        blobs = [os.urandom(700 + i) for i in range(5)]
        for i, data in enumerate(blobs):
            assert put(a if i < 3 else b, data).status_code == 201
        assert put(a, blobs[4]).status_code in (200, 201)  # B's blob again, from A: counted once
        total = sum(len(x) for x in blobs)
        assert live_held(a) == live_held(b) == (5, 0, total, 5, 0)
        # held on A (a blob B uploaded), restored on B
        r = requests.delete(f"{a.url}/v1/blobs/{sha(blobs[3])}", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert live_held(a) == live_held(b) == (4, 1, total - len(blobs[3]), 4, 0)
        r = requests.post(f"{b.url}/v1/blobs/{sha(blobs[3])}/restore", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert live_held(a) == live_held(b) == (5, 0, total, 5, 0)
        # two writers, two sets of rows: no row both nodes update
        nodes = pg_rows(postgres, dsn, "SELECT count(DISTINCT node) FROM blobref_counts"
                                       " WHERE state >= 0")
        assert nodes == [["2"]], nodes
    finally:
        for s in (a, b):
            assert s.stop() == 0, s.read_log()
    # a restart folds the old rows into the new process's, and recounts nothing
    c = pg_node(tmp_path, "c", dsn, root).start()
    try:
        assert live_held(c) == (5, 0, total, 5, 0)
        assert "counting blobs by state" not in c.read_log()
        assert pg_rows(postgres, dsn, "SELECT count(DISTINCT node) FROM blobref_counts"
                                      " WHERE state >= 0") == [["1"]]
    finally:
        assert c.stop() == 0, c.read_log()


def test_pg_index_from_before_the_counters_is_recounted_once(tmp_path, postgres):
    dsn, root = postgres.database(), tmp_path / "blobs"
    a = pg_node(tmp_path, "a", dsn, root).start()
    try:
        blobs = [os.urandom(300 + i) for i in range(4)]
        for data in blobs:
            assert put(a, data).status_code == 201
        r = requests.delete(f"{a.url}/v1/blobs/{sha(blobs[0])}", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
    finally:
        assert a.stop() == 0, a.read_log()
    # back to the schema before the counters: version 4 made them, so it and every later
    # step are undone (the migration runs them all again)
    COUNTERS_VERSION = 4
    LATER_TABLES = {5: "blobref_filecache", 6: "blobref_direct_plans", 7: "blobref_jobs"}
    [[version]] = pg_rows(postgres, dsn, "SELECT max(version) FROM blobref_schema")
    assert COUNTERS_VERSION <= int(version) <= max(LATER_TABLES), \
        f"schema version {version}: name the tables of the steps after 7 in LATER_TABLES"
    drops = "".join(f" DROP TABLE IF EXISTS {t};" for t in LATER_TABLES.values())
    pg_rows(postgres, dsn, "DROP TABLE blobref_counts;" + drops +
                           f" DELETE FROM blobref_schema WHERE version >= {COUNTERS_VERSION}")
    b = pg_node(tmp_path, "b", dsn, root).start()
    try:
        assert "counting blobs by state" in b.read_log(), b.read_log()
        total = sum(len(x) for x in blobs[1:])
        assert live_held(b) == (3, 1, total, 3, 0)
        assert pg_rows(postgres, dsn, "SELECT max(version) FROM blobref_schema") == [[version]]
    finally:
        assert b.stop() == 0, b.read_log()
    c = pg_node(tmp_path, "c", dsn, root).start()
    try:
        assert "counting blobs by state" not in c.read_log()  # once
        assert live_held(c) == (3, 1, total, 3, 0)
    finally:
        assert c.stop() == 0, c.read_log()


def deleting_walks(srv):
    return samples(metrics(srv))[("blobref_reconcile_deleting_walks_total", "")]


def test_start_with_nothing_deleting_walks_nothing(tmp_path):
    """blobrefd's start used to walk every record for blobs left deleting by a cut-short run
    (18 s at 10M): with 0 deleting counted it does not walk (blobref_reconcile_deleting_walks_total
    0 at /readyz, after a restart too); a cut-short delete is still finished (test_integrity)."""
    srv = Server(tmp_path / "data").start()
    try:
        for i in range(20):
            assert put(srv, os.urandom(300 + i)).status_code == 201
        assert deleting_walks(srv) == 0
    finally:
        assert srv.stop() == 0, srv.read_log()
    srv = Server(tmp_path / "data").start()
    try:
        assert deleting_walks(srv) == 0
        assert counts(srv)['blobref_index_blobs{state="live"}'] == 20
    finally:
        assert srv.stop() == 0, srv.read_log()


def test_pg_start_with_nothing_deleting_walks_nothing(tmp_path, postgres):
    dsn, root = postgres.database(), tmp_path / "blobs"
    a = pg_node(tmp_path, "a", dsn, root).start()
    try:
        for i in range(20):
            assert put(a, os.urandom(300 + i)).status_code == 201
    finally:
        assert a.stop() == 0, a.read_log()
    b = pg_node(tmp_path, "b", dsn, root).start()
    try:
        assert deleting_walks(b) == 0
        assert live_held(b)[0] == 20
    finally:
        assert b.stop() == 0, b.read_log()
