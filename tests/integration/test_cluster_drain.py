"""The drain of old copies across a cluster (issue 20): two blobrefd nodes over one PostgreSQL
index and two shared fs stores. A drain pass runs only under the cluster-wide drain lease (an
advisory lock): while someone else holds it no node drains, and once it is free every draining
copy is deleted once and its location dropped, by the node that is left when the other was
killed with its copies still draining."""
import hashlib
import os
import signal
import subprocess
import time

import requests

from conftest import Server
from pgutil import PG_BIN
from cluster_util import wait_for

TIMEOUT = 30
LEASE_CLASS, LEASE_DRAIN = 0x62726c73, 2  # BR_INDEX_LEASE_CLASS, BR_INDEX_LEASE_DRAIN
N = 12


def sha(data):
    return hashlib.sha256(data).hexdigest()


def key_of(h):
    return f"sha256/{h[:2]}/{h[2:4]}/{h}"


def node(tmp_path, name, dsn, grace):
    conf = (f"[server]\nupload_store = a\ndrain_grace = {grace}\ncache_size = 0\n"
            f"[store a]\nkind = fs\nroot = {tmp_path / 'a'}\n"
            f"[store b]\nkind = fs\nroot = {tmp_path / 'b'}\n"
            f"[index]\nkind = postgres\ndsn = {dsn}\n")
    return Server(tmp_path / name, conf)


def move_all(srv, tmp_path, blobs):
    """Moves every blob from a to b (its copy placed in b first): a's copies drain."""
    with requests.Session() as s:
        for d in blobs:
            h, k = sha(d), key_of(sha(d))
            p = tmp_path / "b" / k
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(d)
            body = {"expect": {"store": "a", "key": k}, "to": {"store": "b", "key": k},
                    "verify": "sha256"}
            r = s.put(f"{srv.url}/v1/blobs/{h}/location", json=body, timeout=TIMEOUT)
            assert r.status_code == 200, r.text


def draining_left(srv, blobs):
    with requests.Session() as s:
        return sum(any(loc["role"] == "draining" for loc in
                       s.get(f"{srv.url}/v1/blobs/{sha(d)}/meta", timeout=TIMEOUT)
                       .json()["locations"]) for d in blobs)


class LeaseHolder:
    """A psql session of the test's own that holds the drain lease until release()."""

    def __init__(self, postgres, dsn):
        self.postgres, self.db = postgres, dsn.split("dbname=")[1]
        self.proc = subprocess.Popen([str(PG_BIN / "psql"), "-X", "-q", "-d", dsn],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True)
        self.proc.stdin.write(f"SELECT pg_advisory_lock({LEASE_CLASS}, {LEASE_DRAIN});\n")
        self.proc.stdin.flush()
        wait_for(lambda: self.holders() == 1, 30, "the test's session to hold the drain lease")

    def holders(self):
        [[n]] = self.postgres.psql(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            f" AND classid = {LEASE_CLASS} AND objid = {LEASE_DRAIN} AND objsubid = 2",
            dbname=self.db)
        return int(n)

    def release(self):
        self.proc.stdin.close()  # psql ends: its session and lock with it
        self.proc.wait(timeout=30)


def test_drain_waits_for_the_lease_and_a_killed_nodes_copies_are_drained_by_the_other(
        tmp_path, postgres):
    dsn = postgres.database()
    a, b = node(tmp_path, "na", dsn, "1s"), node(tmp_path, "nb", dsn, "1s")
    a.start()
    b.start()
    holder = None
    try:
        blobs = [os.urandom(2000 + i) for i in range(N)]
        with requests.Session() as s:
            for d in blobs:
                assert s.put(f"{a.url}/v1/blobs/{sha(d)}", data=d,
                             timeout=TIMEOUT).status_code == 201
        holder = LeaseHolder(postgres, dsn)
        move_all(a, tmp_path, blobs)
        assert draining_left(b, blobs) == N
        # past drain_grace (1 s) and several passes (every 250 ms) of both nodes: the lease is
        # taken, so no node drains anything
        time.sleep(2.5)
        assert draining_left(b, blobs) == N
        assert all((tmp_path / "a" / key_of(sha(d))).exists() for d in blobs)
        a.stop(signal.SIGKILL)  # its copies still draining
        holder.release()
        holder = None
        wait_for(lambda: draining_left(b, blobs) == 0, 60, "node B to drain every old copy")
        assert not any((tmp_path / "a" / key_of(sha(d))).exists() for d in blobs)
        with requests.Session() as s:
            for d in blobs:
                r = s.get(f"{b.url}/v1/blobs/{sha(d)}", timeout=TIMEOUT)
                assert r.status_code == 200 and r.content == d
        log = b.read_log()
        for d in blobs:
            assert log.count(f"blob {sha(d)}: draining copy a:{key_of(sha(d))} deleted") == 1, log
    finally:
        if holder is not None:
            holder.release()
        alive = b.alive()
        rc = b.stop()
        a.stop()
        assert alive and rc == 0, b.read_log()
