"""Locks on a shared PostgreSQL index (issue 20): a blob lock the database will not give (here
lock_timeout while another session holds it) is 503 index_unavailable and changes nothing, never
an upload or state change that goes on unserialised; and two nodes' group commits over the same
rows lock them in digest order, so that they never deadlock."""
import hashlib
import os
import random
import subprocess
import threading
import time

import requests

from conftest import Server
from pgutil import PG_BIN, wait_until
from util_http import assert_error

TIMEOUT = 30
LOCK_CLASS = 0x62726c6b  # BR_INDEX_LOCK_CLASS


def sha(data):
    return hashlib.sha256(data).hexdigest()


def node(tmp_path, name, dsn):
    conf = (f"[store shared]\nkind = fs\nroot = {tmp_path / 'blobs'}\n"
            f"[index]\nkind = postgres\ndsn = {dsn}\n")
    return Server(tmp_path / name, conf)


def rows(postgres, dsn, sql):
    return postgres.psql(sql, dbname=dsn.split("dbname=")[1].split()[0])


class LockHolder:
    """A psql session holding the advisory lock of blob h (as another node's delete would)."""

    def __init__(self, postgres, dsn, h):
        self.key = int.from_bytes(bytes.fromhex(h)[:4], "big", signed=True)
        self.proc = subprocess.Popen([str(PG_BIN / "psql"), "-X", "-q", "-d", dsn],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.proc.stdin.write(f"SELECT pg_advisory_lock({LOCK_CLASS}, {self.key});\n")
        self.proc.stdin.flush()
        held = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                f"classid = {LOCK_CLASS} AND objid = {self.key & 0xffffffff} AND objsubid = 2")
        assert wait_until(lambda: rows(postgres, dsn, held) == [["1"]])

    def release(self):
        self.proc.stdin.write(f"SELECT pg_advisory_unlock({LOCK_CLASS}, {self.key});\n")
        self.proc.stdin.close()
        self.proc.wait(10)


def test_blob_lock_refused_by_the_database_is_503_and_changes_nothing(tmp_path, postgres):
    base = postgres.database()
    dsn = base + " options='-c lock_timeout=300'"
    srv = node(tmp_path, "a", dsn).start()
    try:
        data, held = os.urandom(1000), os.urandom(800)
        h = sha(data)
        assert requests.put(f"{srv.url}/v1/blobs/{sha(held)}", data=held,
                            timeout=TIMEOUT).status_code == 201
        holder = LockHolder(postgres, base, h)
        try:
            r = requests.put(f"{srv.url}/v1/blobs/{h}", data=data, timeout=TIMEOUT)
            assert_error(r, 503, "index_unavailable")
            assert rows(postgres, base, "SELECT count(*) FROM blobref_blobs WHERE digest = "
                                        f"'\\x{h}'::bytea") == [["0"]]
        finally:
            holder.release()
        holder = LockHolder(postgres, base, sha(held))
        try:
            assert_error(requests.delete(f"{srv.url}/v1/blobs/{sha(held)}", timeout=TIMEOUT),
                         503, "index_unavailable")
            assert_error(requests.post(f"{srv.url}/v1/blobs/{sha(held)}/restore",
                                       timeout=TIMEOUT), 503, "index_unavailable")
        finally:
            holder.release()
        assert "cannot take its lock in the database" in srv.read_log()
        # nothing changed: the held blob is live; the refused upload goes through now
        assert requests.get(f"{srv.url}/v1/blobs/{sha(held)}", timeout=TIMEOUT).content == held
        assert requests.put(f"{srv.url}/v1/blobs/{h}", data=data,
                            timeout=TIMEOUT).status_code == 201
        assert requests.get(f"{srv.url}/v1/blobs/{h}", timeout=TIMEOUT).content == data
    finally:
        alive, rc = srv.alive(), srv.stop()
        assert alive and rc == 0, srv.read_log()


def deadlocks_logged(postgres):
    try:
        return (postgres.dir / "log").read_text(errors="replace").count("deadlock detected")
    except OSError:
        return 0


def test_two_nodes_batches_over_the_same_rows_never_deadlock(tmp_path, postgres):
    """Both nodes import the same 300 indexed blobs again and again, in opposite orders: each
    import is one batch that locks every row it looks at (FOR UPDATE). Sorted by digest, two
    nodes' batches lock shared rows in one order: PostgreSQL detects no deadlock
    (deadlock_timeout is 10 ms here, so that one would show at once)."""
    dsn = postgres.database()
    db = dsn.split("dbname=")[1]
    postgres.psql(f'ALTER DATABASE "{db}" SET deadlock_timeout = \'10ms\'')
    a, b = node(tmp_path, "a", dsn).start(), node(tmp_path, "b", dsn).start()
    try:
        items = []
        s = requests.Session()
        for i in range(300):
            data = os.urandom(100 + i)
            h = sha(data)
            assert s.put(f"{a.url}/v1/blobs/{h}", data=data, timeout=TIMEOUT).status_code == 201
            items.append({"sha256": h, "size": len(data), "store": "shared",
                          "key": f"sha256/{h[:2]}/{h[2:4]}/{h}"})
        logged = deadlocks_logged(postgres)
        results, lock = {}, threading.Lock()

        def imports(srv, order):
            for _ in range(8):
                r = requests.post(f"{srv.url}/v1/import", json={"blobs": order}, timeout=60)
                with lock:
                    results[r.status_code] = results.get(r.status_code, 0) + 1
                    if r.status_code == 200:
                        for x in r.json()["results"]:
                            results[x["result"]] = results.get(x["result"], 0) + 1

        ts = [threading.Thread(target=imports, args=(srv, order))
              for srv, order in [(a, items), (b, items[::-1]), (a, items[::-1]), (b, items)]]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        found = deadlocks_logged(postgres) - logged
        print(f"\nimports {results}, {found} deadlocks")
        assert results.get(200) == 32 and results.get("exists") == 32 * 300, results
        assert found == 0
    finally:
        for srv in (a, b):
            alive, rc = srv.alive(), srv.stop()
            assert alive and rc == 0, srv.read_log()
