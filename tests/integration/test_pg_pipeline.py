"""The PostgreSQL writer's pipeline: a batch of uploads reads its rows in one round trip and sends
its writes and commit in another, and a statement that fails in the middle of a pipelined batch
fails that upload alone, leaves nothing of it in the database, and the writer goes on."""
import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import Server

TIMEOUT = 60
UPLOADS = 48
CLIENTS = 24


def sha(data):
    return hashlib.sha256(data).hexdigest()


def metric(srv, name):
    text = requests.get(f"{srv.url}/metrics", timeout=TIMEOUT).text
    m = re.search(r"^" + re.escape(name) + r" (\d+)$", text, re.M)
    assert m, f"no {name} in /metrics"
    return int(m.group(1))


@pytest.fixture
def pg_node(tmp_path, postgres):
    dsn = postgres.database()
    conf = (f"[store local]\nkind = fs\nroot = {tmp_path / 'blobs'}\n"
            f"[index]\nkind = postgres\ndsn = {dsn}\n")
    s = Server(tmp_path / "node", conf).start(timeout=60)
    yield s, dsn.split("dbname=")[1]
    alive = s.alive()
    rc = s.stop()
    assert alive and rc == 0, s.read_log()


def put_all(srv, blobs):
    def one(data):
        return requests.put(f"{srv.url}/v1/blobs/{sha(data)}", data=data, timeout=TIMEOUT)
    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, blobs))


def test_a_batch_costs_the_writer_two_round_trips_whatever_its_size(pg_node):
    srv, _ = pg_node
    c0 = metric(srv, "blobref_index_commits_total")
    t0 = metric(srv, "blobref_index_writer_round_trips_total")
    blobs = [os.urandom(1000) for _ in range(UPLOADS)]
    assert [r.status_code for r in put_all(srv, blobs)] == [201] * UPLOADS
    commits = metric(srv, "blobref_index_commits_total") - c0
    trips = metric(srv, "blobref_index_writer_round_trips_total") - t0
    # one statement a round trip would be 5 per new upload (two record reads, the owner's read
    # and insert, the record's insert) and 4 per batch (begin, counters, notify, commit)
    assert 1 <= commits <= UPLOADS
    assert trips <= 2 * commits, (trips, commits)


def test_a_statement_failing_mid_batch_fails_its_upload_alone(pg_node, postgres):
    srv, db = pg_node
    bad = os.urandom(1000)
    # every insert of this one record fails in the database (not a conflict: no retry helps)
    postgres.psql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        f" IF NEW.digest = '\\x{sha(bad)}'::bytea THEN RAISE EXCEPTION 'refused by the test';"
        " END IF; RETURN NEW; END $$;"
        " CREATE TRIGGER refuse BEFORE INSERT ON blobref_blobs FOR EACH ROW"
        " EXECUTE FUNCTION refuse()", db)
    good = [os.urandom(1000) for _ in range(UPLOADS - 1)]
    blobs = good[:UPLOADS // 2] + [bad] + good[UPLOADS // 2:]
    c0 = metric(srv, "blobref_index_commits_total")
    res = put_all(srv, blobs)
    by = {sha(d): r for d, r in zip(blobs, res)}
    assert by[sha(bad)].status_code >= 500, by[sha(bad)].text
    assert by[sha(bad)].json()["error"]["code"], by[sha(bad)].text
    assert [by[sha(d)].status_code for d in good] == [201] * len(good)
    assert metric(srv, "blobref_index_commits_total") > c0
    # nothing of the refused upload is in the database: no record, no place
    count = f"SELECT count(*) FROM %s WHERE %s = '\\x{sha(bad)}'::bytea"
    assert postgres.psql(count % ("blobref_blobs", "digest"), db) == [["0"]]
    assert postgres.psql(count % ("blobref_owners", "owner"), db) == [["0"]]
    assert postgres.psql("SELECT count(*) FROM blobref_blobs", db) == [[str(len(good))]]
    assert requests.get(f"{srv.url}/v1/blobs/{sha(bad)}", timeout=TIMEOUT).status_code == 404
    for d in good:
        got = requests.get(f"{srv.url}/v1/blobs/{sha(d)}", timeout=TIMEOUT)
        assert got.status_code == 200 and got.content == d
    # the writer's connection is usable again: once allowed, the same upload is recorded
    postgres.psql("DROP TRIGGER refuse ON blobref_blobs", db)
    r = requests.put(f"{srv.url}/v1/blobs/{sha(bad)}", data=bad, timeout=TIMEOUT)
    assert r.status_code == 201, r.text
    assert postgres.psql(count % ("blobref_blobs", "digest"), db) == [["1"]]
    # the counters count every recorded upload once (store '': all stores; state 0: live)
    counts = postgres.psql("SELECT sum(blobs) FROM blobref_counts WHERE state = 0 AND store = ''",
                           db)
    assert counts == [[str(UPLOADS)]], counts
