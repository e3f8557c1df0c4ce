"""What a PostgreSQL node asks of the database, counted by pg_stat_statements on a server of this
module's own (issue 20's speed goals): a /metrics scrape runs no count(*) (the entries come from
the counters, blobref_counts), a new PUT reads its record once, before its body, not again
after it (the index writer decides under the blob's lock), the index writer plans its statements
once per connection, and so do the readers their record reads (also after a reconnect) while
their ad hoc queries keep custom plans, and a blob's lock released without waiting is free once
the upload is answered, its connection serving the next reads."""
import hashlib
import os
import re
import time

import pytest
import requests

import pgutil
from conftest import Server

TIMEOUT = 30


@pytest.fixture(scope="module")
def pgss():
    if not pgutil.available():
        pytest.skip("PostgreSQL 15 is not installed")
    pg = pgutil.Postgres("-c shared_preload_libraries=pg_stat_statements "
                         "-c pg_stat_statements.track_planning=on")
    yield pg
    pg.destroy()


@pytest.fixture
def node(tmp_path, pgss):
    dsn = pgss.database()
    db = dsn.split("dbname=")[1]
    pgss.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", db)
    srv = Server(tmp_path / "n", f"[server]\n[store a]\nkind = fs\nroot = {tmp_path / 'a'}\n"
                 f"[index]\nkind = postgres\ndsn = {dsn}\n").start()
    srv.db = db
    yield srv
    assert srv.stop() == 0, srv.read_log()


def statements(pg, db, like, column="calls"):
    """Calls (or plans) of this database's statements whose text matches the LIKE pattern."""
    rows = pg.psql(f"SELECT coalesce(sum(s.{column}), 0) FROM pg_stat_statements s JOIN "
                   f"pg_database d ON d.oid = s.dbid WHERE d.datname = '{db}' AND s.query "
                   f"LIKE '{like}'", db)
    return int(rows[0][0])


def seen(pg, db):
    """This database's statements with their calls, for a failure's message."""
    rows = pg.psql("SELECT s.calls, left(s.query, 120) FROM pg_stat_statements s JOIN pg_database d "
                   f"ON d.oid = s.dbid WHERE d.datname = '{db}' ORDER BY s.calls DESC", db)
    return "\n".join(" ".join(r) for r in rows)  # a string: pytest shortens a list's repr


def reset(pg, db):
    pg.psql("SELECT pg_stat_statements_reset()", db)


def put(srv, data):
    r = requests.put(f"{srv.url}/v1/blobs/{hashlib.sha256(data).hexdigest()}", data=data,
                     timeout=TIMEOUT)
    assert r.status_code in (200, 201), r.text
    return r.status_code


def test_metrics_scrapes_count_nothing(node, pgss):
    for i in range(3):
        put(node, b"counted %d" % i)
    reset(pgss, node.db)
    for _ in range(5):
        text = requests.get(f"{node.url}/metrics", timeout=TIMEOUT).text
        assert re.search(r"^blobref_index_entries 3$", text, re.M), text
    assert statements(pgss, node.db, "%count(%") == 0
    assert statements(pgss, node.db, "%blobref_counts%") >= 5  # the counters were read instead


def test_new_put_reads_its_record_once(node, pgss):
    reset(pgss, node.db)
    bodies = [os.urandom(4096) for _ in range(5)]
    assert [put(node, b) for b in bodies] == [201] * 5
    # the unlocked point read (the writer's own read is FOR UPDATE)
    assert statements(pgss, node.db, "SELECT record FROM blobref_blobs WHERE digest = $1") == 5
    assert [put(node, b) for b in bodies] == [200] * 5  # dedup hits: the same one read each


def test_writer_plans_its_statements_once_per_connection(node, pgss):
    # custom plans (PostgreSQL's choice for them over 16 partitions) would plan every call
    reset(pgss, node.db)
    bodies = [os.urandom(4096) for _ in range(12)]
    assert [put(node, b) for b in bodies] == [201] * 12
    for sql in ("SELECT record FROM blobref_blobs WHERE digest = $1 FOR UPDATE",
                "INSERT INTO blobref_blobs (digest, record) VALUES ($1, $2)",
                "INSERT INTO blobref_owners (store, key, owner) VALUES%"):
        assert statements(pgss, node.db, sql) == 12, sql
        assert statements(pgss, node.db, sql, "plans") <= 1, sql
    # the counters' upsert, once a batch (two rows: store a's and the all-stores one)
    counts = "INSERT INTO blobref_counts %"
    assert statements(pgss, node.db, counts) >= 2
    assert statements(pgss, node.db, counts, "plans") <= 1


def test_blob_lock_is_free_once_the_upload_is_answered(node, pgss):
    """The release is sent, not waited for: another session has the lock right after the
    answer, and the connection that sent it serves the next reads (its answer read first)."""
    lock_class = 0x62726C6B
    bodies = [os.urandom(3000) for _ in range(40)]
    for b in bodies:
        assert put(node, b) == 201
        h = hashlib.sha256(b).digest()
        key = int.from_bytes(h[:4], "big", signed=True)
        # a session of its own takes the blob's lock (without waiting: a held lock says f),
        # at once or as soon as the node's session has run the release it was sent
        try_sql = (f"SELECT pg_try_advisory_lock({lock_class}, {key}) AND "
                   f"pg_advisory_unlock({lock_class}, {key})")
        deadline = time.monotonic() + 10
        while pgss.psql(try_sql, node.db) != [["t"]]:
            assert time.monotonic() < deadline, "the blob's lock was never released"
    held = pgss.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                     f"classid = {lock_class}", node.db)
    assert held == [["0"]]
    for b in bodies:  # reads on the pooled connections that released the locks
        r = requests.get(f"{node.url}/v1/blobs/{hashlib.sha256(b).hexdigest()}", timeout=TIMEOUT)
        assert r.status_code == 200 and r.content == b


GET_SQL = "SELECT record FROM blobref_blobs WHERE digest = $1"
# pg_stat_statements keeps the text it first saw: "q.i - $2" when the entry was made as a new
# connection prepared the statement (constants normalised), "q.i - 1" when made at execution
# (a reset had removed the prepared entry); the pattern matches both
GET_MANY_SQL = "SELECT (q.i - %)::int4, b.record FROM unnest($1::bytea[])%"


def reader_connections(pg, db):
    """The node's sessions on the database (the writer's among them): an upper bound on how many
    reader connections planned anything."""
    return int(pg.psql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND application_name = 'blobrefd'", db)[0][0])


def reads_planned_once_per_connection(node, pg, n):
    reset(pg, node.db)
    bodies = [os.urandom(2048) for _ in range(n)]
    assert [put(node, b) for b in bodies] == [201] * n  # each reads its record first (br_get)
    hashes = [hashlib.sha256(b).hexdigest() for b in bodies] + ["0" * 64]
    for _ in range(n):
        r = requests.post(f"{node.url}/v1/lookup", json={"hashes": hashes}, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
    conns = reader_connections(pg, node.db)
    assert conns < n
    assert statements(pg, node.db, GET_SQL) == n, seen(pg, node.db)
    assert statements(pg, node.db, GET_MANY_SQL) == n, seen(pg, node.db)
    # the default mode would plan each call anew (custom plans, over 16 partitions)
    assert statements(pg, node.db, GET_SQL, "plans") <= conns
    assert statements(pg, node.db, GET_MANY_SQL, "plans") <= conns


def test_readers_plan_the_record_reads_once_per_connection(node, pgss):
    reads_planned_once_per_connection(node, pgss, 16)


def test_reconnected_readers_prepare_and_plan_them_once_again(node, pgss):
    """After a database restart every connection is new: the reads are prepared on it again (a
    read on a connection without them would fail) and planned once there too."""
    put(node, b"before the restart")
    pgss.stop()
    pgss.start()
    data = b"after the restart"
    assert pgutil.wait_until(lambda: requests.put(
        f"{node.url}/v1/blobs/{hashlib.sha256(data).hexdigest()}", data=data,
        timeout=TIMEOUT).status_code == 201)
    reads_planned_once_per_connection(node, pgss, 16)


def test_ad_hoc_queries_keep_the_default_plan_mode(tmp_path, pgss):
    """A query with parameters other than the hot reads (the job list's) is planned for its values
    (a custom plan, the default mode's choice) on connections that ran the hot reads in
    force_generic_plan just before: auto_explain logs its plans with the value folded in, where a
    generic plan would filter on $1."""
    dsn = pgss.database()
    db = dsn.split("dbname=")[1]
    pgss.psql(f'ALTER DATABASE "{db}" SET session_preload_libraries = auto_explain', db)
    pgss.psql(f'ALTER DATABASE "{db}" SET auto_explain.log_min_duration = 0', db)
    srv = Server(tmp_path / "n", f"[server]\n[store a]\nkind = fs\nroot = {tmp_path / 'a'}\n"
                 f"[index]\nkind = postgres\ndsn = {dsn}\n").start()
    try:
        for _ in range(8):
            put(srv, os.urandom(1000))  # br_get, generic
            r = requests.get(f"{srv.url}/v1/jobs", timeout=TIMEOUT)  # ad hoc, $1 = 0
            assert r.status_code == 200, r.text
    finally:
        assert srv.stop() == 0, srv.read_log()
    log = (pgss.dir / "log").read_text(errors="replace")
    plans = [p.split("\n") for p in log.split("plan:") if "FROM blobref_jobs j, now" in p]
    plans = [[ln for ln in p[2:] if ln.startswith(("\t", " "))] for p in plans]  # the plan lines
    assert len(plans) >= 8
    assert all(p and not any("$1" in ln for ln in p) for p in plans), plans[-1]
    # and the hot reads did run generic plans on these sessions (pruned at run time)
    gets = [p for p in log.split("plan:") if "FROM blobref_blobs WHERE digest = $1\n" in p]
    assert gets and all("Subplans Removed" in p.split("LOG:")[0] for p in gets), gets[-1]
