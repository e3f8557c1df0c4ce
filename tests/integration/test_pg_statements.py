"""What a PostgreSQL node asks of the database, counted by pg_stat_statements on a server of this
module's own (issue 20's speed goals): a /metrics scrape runs no count(*) (the entries come from
the counters, blobref_counts), and a new PUT reads its record once, before its body, not again
after it (the index writer decides under the blob's lock)."""
import hashlib
import os
import re

import pytest
import requests

import pgutil
from conftest import Server

TIMEOUT = 30


@pytest.fixture(scope="module")
def pgss():
    if not pgutil.available():
        pytest.skip("PostgreSQL 15 is not installed")
    pg = pgutil.Postgres("-c shared_preload_libraries=pg_stat_statements")
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


def statements(pg, db, like):
    """Calls of this database's statements whose text matches the LIKE pattern."""
    rows = pg.psql("SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s JOIN pg_database d "
                   f"ON d.oid = s.dbid WHERE d.datname = '{db}' AND s.query LIKE '{like}'", db)
    return int(rows[0][0])


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
