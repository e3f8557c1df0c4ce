"""The PostgreSQL index ([index] kind = postgres): nodes sharing one database see each other's
writes, the schema is created once, a dedup race ends with one row, and a database outage answers
503 index_unavailable without acknowledging anything, then serves again without a restart."""
import hashlib
import os
import threading

import pytest
import requests

from conftest import Server
from pgutil import wait_until
from util_http import assert_error, fsck

TIMEOUT = 30


def sha(data):
    return hashlib.sha256(data).hexdigest()


def node(tmp_path, name, dsn, shared_root):
    """A blobrefd on dsn whose fs store (shared by every node here) is shared_root."""
    conf = (f"[store shared]\nkind = fs\nroot = {shared_root}\n"
            f"[index]\nkind = postgres\ndsn = {dsn}\n")
    return Server(tmp_path / name, conf)


@pytest.fixture
def two_nodes(tmp_path, postgres):
    dsn = postgres.database()
    root = tmp_path / "blobs"
    a, b = node(tmp_path, "a", dsn, root), node(tmp_path, "b", dsn, root)
    # started together: the schema is created under an advisory lock, once
    ta = threading.Thread(target=a.start)
    ta.start()
    b.start()
    ta.join()
    assert a.alive() and b.alive(), a.read_log() + b.read_log()
    yield a, b, dsn
    for s in (a, b):
        alive = s.alive()
        rc = s.stop()
        assert alive and rc == 0, s.read_log()


def rows(postgres, dsn, sql):
    return postgres.psql(sql, dbname=dsn.split("dbname=")[1])


def test_schema_is_created_once_by_nodes_starting_together(two_nodes, postgres):
    a, b, dsn = two_nodes
    # one row per migration step, each step run once (none twice by the two nodes)
    versions = [int(v) for (v,) in rows(postgres, dsn, "SELECT version FROM blobref_schema")]
    assert sorted(versions) == list(range(1, len(versions) + 1)), versions
    parts = rows(postgres, dsn, "SELECT count(*) FROM pg_inherits WHERE inhparent = "
                                "'blobref_blobs'::regclass")
    assert parts == [["16"]]


def test_upload_on_one_node_is_served_by_the_other(two_nodes, postgres):
    a, b, dsn = two_nodes
    data = os.urandom(3000)
    h = sha(data)
    assert requests.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 404
    r = requests.put(f"{a.url}/v1/blobs/{h}", data=data, timeout=TIMEOUT)
    assert r.status_code == 201, r.text
    got = requests.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT)
    assert got.status_code == 200 and got.content == data
    assert requests.head(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 200
    found = requests.post(f"{b.url}/v1/lookup", json={"hashes": [h]}, timeout=TIMEOUT)
    assert found.status_code == 200 and [x["sha256"] for x in found.json()["found"]] == [h]
    assert rows(postgres, dsn, "SELECT encode(digest, 'hex') FROM blobref_blobs") == [[h]]
    # the same answers from both nodes
    ma = requests.get(f"{a.url}/v1/blobs/{h}/meta", timeout=TIMEOUT)
    mb = requests.get(f"{b.url}/v1/blobs/{h}/meta", timeout=TIMEOUT)
    assert ma.status_code == 200 and ma.json() == mb.json()


def test_admin_quarantine_on_one_node_is_410_on_the_other(two_nodes):
    a, b, _ = two_nodes
    data = os.urandom(500)
    h = sha(data)
    assert requests.put(f"{a.url}/v1/blobs/{h}", data=data, timeout=TIMEOUT).status_code == 201
    assert requests.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 200  # B read it
    assert requests.delete(f"{a.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 200
    assert_error(requests.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT), 410, "quarantined")
    # and restored on B: served by A again
    assert requests.post(f"{b.url}/v1/blobs/{h}/restore", timeout=TIMEOUT).status_code == 200
    got = requests.get(f"{a.url}/v1/blobs/{h}", timeout=TIMEOUT)
    assert got.status_code == 200 and got.content == data


def test_same_new_blob_to_both_nodes_at_once_gives_one_row(two_nodes, postgres):
    a, b, dsn = two_nodes
    for _ in range(5):
        data = os.urandom(20000)
        h = sha(data)
        codes = {}
        barrier = threading.Barrier(2)

        def put(srv):
            barrier.wait()
            codes[srv.url] = requests.put(f"{srv.url}/v1/blobs/{h}", data=data,
                                          timeout=TIMEOUT).status_code

        ts = [threading.Thread(target=put, args=(s,)) for s in (a, b)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(codes.values()) in ([200, 201], [201, 201]), codes
        assert rows(postgres, dsn, f"SELECT count(*) FROM blobref_blobs WHERE digest = "
                                   f"'\\x{h}'::bytea") == [["1"]]
        for s in (a, b):
            got = requests.get(f"{s.url}/v1/blobs/{h}", timeout=TIMEOUT)
            assert got.status_code == 200 and got.content == data


def test_database_down_is_503_and_nothing_acknowledged_then_serves_again(two_nodes, postgres):
    a, b, dsn = two_nodes
    old = os.urandom(100)
    assert requests.put(f"{a.url}/v1/blobs/{sha(old)}", data=old, timeout=TIMEOUT).status_code \
        == 201
    postgres.stop()
    try:
        fresh = os.urandom(100)
        r = requests.put(f"{a.url}/v1/blobs/{sha(fresh)}", data=fresh, timeout=TIMEOUT)
        assert_error(r, 503, "index_unavailable")
        assert_error(requests.get(f"{b.url}/v1/blobs/{sha(old)}", timeout=TIMEOUT), 503,
                     "index_unavailable")
        assert_error(requests.get(f"{a.url}/readyz", timeout=TIMEOUT), 503, "not_ready")
    finally:
        postgres.start()
    assert wait_until(lambda: requests.get(f"{a.url}/readyz", timeout=TIMEOUT).status_code == 200)
    # the refused upload was not recorded; the old one is there; writes work again
    assert requests.get(f"{b.url}/v1/blobs/{sha(fresh)}", timeout=TIMEOUT).status_code == 404
    got = requests.get(f"{b.url}/v1/blobs/{sha(old)}", timeout=TIMEOUT)
    assert got.status_code == 200 and got.content == old
    r = wait_until(lambda: requests.put(f"{a.url}/v1/blobs/{sha(fresh)}", data=fresh,
                                        timeout=TIMEOUT).status_code == 201, timeout=10)
    assert r
    assert requests.get(f"{b.url}/v1/blobs/{sha(fresh)}", timeout=TIMEOUT).content == fresh


def test_bad_index_config_is_refused(tmp_path):
    for conf, why in (("[index]\nkind = sqlite\n", "is not lmdb or postgres"),
                      ("[index]\nkind = postgres\n", "dsn goes with kind = postgres"),
                      ("[index]\ndsn = host=x\n", "dsn goes with kind = postgres")):
        srv = Server(tmp_path / "bad", conf)
        with pytest.raises(RuntimeError, match=why):
            srv.start()


def test_upload_commit_waits_for_the_blob_lock_another_node_holds(two_nodes, postgres):
    """The per-blob lock (upload commit vs. final delete) is a database lock: while another
    session (a node's final delete) holds it, an upload of that blob cannot commit."""
    import subprocess
    from pgutil import PG_BIN
    a, _, dsn = two_nodes
    data = os.urandom(1000)
    h = sha(data)
    key = int.from_bytes(bytes.fromhex(h)[:4], "big", signed=True)
    lock_class = 0x62726c6b
    holder = subprocess.Popen([str(PG_BIN / "psql"), "-X", "-q", "-d", dsn], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, text=True)
    held = (f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = {lock_class}"
            f" AND objid = {key & 0xffffffff} AND objsubid = 2 AND granted = ")
    try:
        holder.stdin.write(f"SELECT pg_advisory_lock({lock_class}, {key});\n")
        holder.stdin.flush()
        assert wait_until(lambda: rows(postgres, dsn, held + "true") == [["1"]])
        result = {}
        t = threading.Thread(target=lambda: result.update(
            r=requests.put(f"{a.url}/v1/blobs/{h}", data=data, timeout=TIMEOUT)))
        t.start()
        # the upload's commit is waiting for the lock, not done
        assert wait_until(lambda: rows(postgres, dsn, held + "false") == [["1"]])
        assert "r" not in result
        assert rows(postgres, dsn, f"SELECT count(*) FROM blobref_blobs WHERE digest = "
                                   f"'\\x{h}'::bytea") == [["0"]]
        holder.stdin.write(f"SELECT pg_advisory_unlock({lock_class}, {key});\n")
        holder.stdin.flush()
        t.join(TIMEOUT)
        assert result["r"].status_code == 201, result["r"].text
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert requests.get(f"{a.url}/v1/blobs/{h}", timeout=TIMEOUT).content == data


def test_reconcile_runs_once_cluster_wide(two_nodes, postgres):
    """While another node holds the reconcile lease (an advisory lock held for the whole run),
    POST /v1/reconcile on any node is 409; once it is given back, a run starts."""
    import subprocess
    from pgutil import PG_BIN
    a, b, dsn = two_nodes
    lease = "1651666035, 1"
    holder = subprocess.Popen([str(PG_BIN / "psql"), "-X", "-q", "-d", dsn], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, text=True)
    held = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1651666035"
            " AND objid = 1 AND objsubid = 2 AND granted")
    try:
        holder.stdin.write(f"SELECT pg_advisory_lock({lease});\n")
        holder.stdin.flush()
        assert wait_until(lambda: rows(postgres, dsn, held) == [["1"]])
        for s in (a, b):
            assert_error(requests.post(f"{s.url}/v1/reconcile", timeout=TIMEOUT), 409,
                         "reconcile_running")
        holder.stdin.write(f"SELECT pg_advisory_unlock({lease});\n")
        holder.stdin.flush()
        assert wait_until(lambda: rows(postgres, dsn, held) == [["0"]])
    finally:
        holder.stdin.close()
        holder.wait(10)
    r = requests.post(f"{b.url}/v1/reconcile", timeout=TIMEOUT)
    assert r.status_code == 202, r.text


def test_fsck_recounts_the_counters_from_the_rows_and_repairs_them(two_nodes, postgres,
                                                                   tmp_path):
    """`blobrefd --fsck` on a PostgreSQL index (nodes running) recounts the per-state counters
    from the rows in one transaction and compares them with blobref_counts: a wrong row is
    reported (exit 1) and replaced; the next fsck finds them right (exit 0)."""
    a, b, dsn = two_nodes
    blobs = [os.urandom(500 + i) for i in range(5)]
    for i, d in enumerate(blobs):
        assert requests.put(f"{(a, b)[i % 2].url}/v1/blobs/{sha(d)}", data=d,
                            timeout=TIMEOUT).status_code == 201
    r = requests.delete(f"{b.url}/v1/blobs/{sha(blobs[0])}", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    live = sum(len(d) for d in blobs[1:])

    def sums(state):
        [[n, size]] = rows(postgres, dsn, "SELECT coalesce(sum(blobs), 0), coalesce(sum(bytes), 0)"
                                          f" FROM blobref_counts WHERE state = {state}"
                                          " AND store = ''")
        return int(n), int(size)

    assert sums(0) == (4, live)
    # a node's row gone wrong: 7 live blobs too many
    rows(postgres, dsn, "INSERT INTO blobref_counts VALUES (4242, '', 0, 7, 700)")
    conf = a.data_dir / "blobref.conf"
    rc, n, problems, out = fsck(tmp_path / "fsck1", config=conf)
    assert (rc, n, problems) == (1, 5, 1), out
    assert "index counters: live blobs: stored 11 (%d bytes), counted 4 (%d bytes)" % (
        live + 700, live) in out, out
    assert "repaired" in out, out
    assert sums(0) == (4, live)
    assert sums(2) == (1, len(blobs[0]))  # the admin's hold: state held
    rc, n, problems, out = fsck(tmp_path / "fsck2", config=conf)
    assert (rc, n, problems) == (0, 5, 0), out
    assert "index counters" not in out, out
    # the nodes go on counting on top of the repaired rows
    d = os.urandom(900)
    assert requests.put(f"{a.url}/v1/blobs/{sha(d)}", data=d, timeout=TIMEOUT).status_code == 201
    assert sums(0) == (5, live + 900)


def test_libpq_environment_applies_to_the_dsn(tmp_path, postgres, monkeypatch):
    """[index] dsn is completed from the standard libpq environment: a dsn that names neither
    port nor database reaches the server and database of PGPORT and PGDATABASE."""
    name = f"env_{os.getpid()}"
    postgres.database(name)
    monkeypatch.setenv("PGPORT", str(postgres.port))
    monkeypatch.setenv("PGDATABASE", name)
    srv = node(tmp_path, "env", "host=127.0.0.1 user=postgres", tmp_path / "blobs").start()
    try:
        data = os.urandom(500)
        assert requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data,
                            timeout=TIMEOUT).status_code == 201
        assert postgres.psql("SELECT count(*) FROM blobref_blobs WHERE digest = "
                             f"'\\x{sha(data)}'::bytea", dbname=name) == [["1"]]
    finally:
        alive, rc = srv.alive(), srv.stop()
    assert alive and rc == 0, srv.read_log()


def test_list_in_hash_order_page_by_page_is_the_same_on_every_node(two_nodes):
    """The ordered scan from a key on the partitioned table: blobs uploaded through both nodes
    are listed by GET /v1/blobs in hash order, page by page (`after`), with none missing or
    repeated, and the same pages on both nodes (the scan crosses the hash-prefix partitions)."""
    a, b, _ = two_nodes
    want = set()
    with requests.Session() as s:
        for i in range(40):
            d = os.urandom(64) + bytes([i])
            assert s.put(f"{(a, b)[i % 2].url}/v1/blobs/{sha(d)}", data=d,
                         timeout=TIMEOUT).status_code == 201
            want.add(sha(d))

    def pages(srv):
        out, after = [], ""
        with requests.Session() as s:
            while True:
                j = s.get(f"{srv.url}/v1/blobs", params={"after": after, "limit": 7},
                          timeout=TIMEOUT).json()
                out.append([x["sha256"] for x in j["blobs"]])
                if j["next"] is None:
                    return out
                after = j["next"]

    pa, pb = pages(a), pages(b)
    listed = [h for p in pa for h in p]
    assert listed == sorted(want), (len(listed), len(want))
    assert len({h[0] for h in listed}) > 8  # the pages cross many of the 16 partitions
    assert pa == pb
