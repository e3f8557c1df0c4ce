"""Patroni failover (`make test-failover`, not part of `make test`): three etcd members, Patroni
(synchronous_mode) managing two PostgreSQL 15 from conf/patroni/patroni.yml, writers on a
multi-host DSN (target_session_attrs=read-write); the leader is killed -9 with its PostgreSQL
under load, and the window until writes are acknowledged again is measured. With a blobrefd
that knows `[index] kind = postgres`, two nodes behind HAProxy take uploads through it too: their
/readyz is 503 while there is no primary and 200 again within 60 s, they are not restarted, their
clients get 5xx meanwhile (never 4xx), and every acknowledged upload reads back from both."""
import os
import shutil
import threading
import time

import pytest
import requests

from cluster_util import (Cluster, PatroniCluster, PrimaryProxy, UploadLoad,
                          postgres_index_supported, wait_for)
from conftest import BIN_DIR

pytestmark = pytest.mark.skipif(os.environ.get("BLOBREF_FAILOVER") != "1",
                                reason="the Patroni failover runs in its own target: "
                                       "make test-failover")


class SqlWriters:
    """Threads inserting rows through the multi-host DSN, reconnecting after every error: the
    ids whose commit was acknowledged, and when writes failed."""

    def __init__(self, psycopg2, dsn, threads=3, base=0):
        self.pg, self.dsn, self.n, self.base = psycopg2, dsn, threads, base
        self.acked, self.ack_times, self.fail_times = set(), [], []
        self.lock, self.stop_ev = threading.Lock(), threading.Event()
        self.threads = []

    def _run(self, k):
        i, conn = 0, None
        while not self.stop_ev.is_set():
            try:
                if conn is None:
                    conn = self.pg.connect(self.dsn)
                    conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO acked (id) VALUES (%s)", (k * 10**9 + i,))
                with self.lock:
                    self.acked.add(k * 10**9 + i)
                    self.ack_times.append(time.monotonic())
            except self.pg.Error:
                with self.lock:
                    self.fail_times.append(time.monotonic())
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
            i += 1

    def start(self):
        for k in range(self.n):
            t = threading.Thread(target=self._run, args=(self.base + k,), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def count(self):
        with self.lock:
            return len(self.acked)

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(30)

    def window(self, since):
        with self.lock:
            fails = [t for t in self.fail_times if t >= since]
            if not fails:
                return 0.0
            return min(t for t in self.ack_times if t > max(fails)) - since


def readyz(node):
    """The status of node's /readyz (None when it does not answer)."""
    try:
        return requests.get(f"{node.url}/readyz", timeout=5).status_code
    except requests.RequestException:
        return None


def test_patroni_leader_killed_under_load(tmp_path, request):
    if not (shutil.which("patroni") and shutil.which("etcd")):
        pytest.skip("patroni or etcd is not installed (tools/install-deps.sh failover)")
    psycopg2 = pytest.importorskip("psycopg2")
    t_all = time.monotonic()
    pc = PatroniCluster()
    request.addfinalizer(lambda: pc.remove(keep_logs=tmp_path))
    pc.start()
    print(f"\netcd x3 + Patroni x2 ready in {pc.start_seconds:.1f} s")
    conn = psycopg2.connect(pc.dsn())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE acked (id bigint PRIMARY KEY)")
        cur.execute("CREATE DATABASE blobref")
    conn.close()

    cluster = load = None
    if postgres_index_supported(BIN_DIR, tmp_path / "probe"):
        rgw = request.getfixturevalue("rgw")  # radosgw only when there are nodes to run
        bucket = rgw.make_bucket("patroni-failover")
        cluster = Cluster(tmp_path / "nodes", rgw, bucket, 2, dsn=pc.dsn("blobref")).start()
        request.addfinalizer(cluster.stop)
        pids = [n.proc.pid for n in cluster.nodes]
    else:
        print("blobrefd does not know [index] kind = postgres: SQL writers only")
    writers = SqlWriters(psycopg2, pc.dsn()).start()
    # and the same through one address: HAProxy checking Patroni's GET /primary
    proxy = PrimaryProxy(tmp_path / "pgproxy", pc.members).start()
    request.addfinalizer(proxy.stop)
    proxied = SqlWriters(psycopg2, f"host=127.0.0.1 port={proxy.port} dbname=postgres "
                         f"user=postgres password={pc.password} connect_timeout=2",
                         threads=2, base=10).start()
    if cluster:
        load = UploadLoad(cluster.url, threads=3, size=8000).start()
    try:
        wait_for(lambda: writers.count() >= 200, 30, "200 commits before the kill")
        wait_for(lambda: proxied.count() >= 100, 30, "100 commits through HAProxy")
        if load:
            wait_for(lambda: load.acked_count() >= 50, 30, "50 uploads before the kill")
        old = pc.leader()
        assert old is not None
        t_kill = time.monotonic()
        old.kill9()
        if cluster:  # no primary yet: every node says it is not ready
            for n in cluster.nodes:
                wait_for(lambda: readyz(n) == 503, 30, f"{n.url}/readyz 503 without a primary")
        new = wait_for(pc.leader, 90, "Patroni to promote the other member", step=0.1)
        t_promoted = time.monotonic()
        assert new is not old
        if cluster:
            for n in cluster.nodes:
                wait_for(lambda: readyz(n) == 200, 60, f"{n.url}/readyz 200 after the failover")
            t_ready = time.monotonic()
        n0 = writers.count()
        wait_for(lambda: writers.count() >= n0 + 200, 60, "200 commits after the failover")
        p0 = proxied.count()
        wait_for(lambda: proxied.count() >= p0 + 100, 60, "100 commits through HAProxy after")
        if load:
            u0 = load.acked_count()
            wait_for(lambda: load.acked_count() >= u0 + 50, 60, "50 uploads after the failover")
    finally:
        writers.stop()
        proxied.stop()
        if load:
            load.stop()
    sql_window, proxied_window = writers.window(t_kill), proxied.window(t_kill)
    print(f"leader {old.name} killed -9; {new.name} primary after {t_promoted - t_kill:.1f} s; "
          f"SQL commits acknowledged again after {sql_window:.1f} s (multi-host dsn), "
          f"{proxied_window:.1f} s (HAProxy on GET /primary)")
    conn = psycopg2.connect(pc.dsn())
    with conn.cursor() as cur:
        cur.execute("SELECT id FROM acked")
        present = {r[0] for r in cur.fetchall()}
    conn.close()
    missing = (writers.acked | proxied.acked) - present
    assert not missing, f"{len(missing)} acknowledged commits lost: {sorted(missing)[:5]}"
    assert sql_window < 60 and proxied_window < 60
    if load:
        window = load.outage_window(t_kill)
        print(f"every node ready again {t_ready - t_kill:.1f} s after the kill; blobref uploads "
              f"acknowledged again after {window:.1f} s; {len(load.acked)} acknowledged, "
              f"statuses {load.statuses}")
        assert [n.proc.pid for n in cluster.nodes] == pids
        assert window < 60 and t_ready - t_kill < 60
        # meanwhile the clients were answered 5xx (or cut off by HAProxy), never a 4xx
        assert all(k in (200, 201) or not isinstance(k, int) or k >= 500
                   for k in load.statuses), load.statuses
        with requests.Session() as s:
            for n in cluster.nodes:
                for h, data in load.acked.items():
                    r = s.get(f"{n.url}/v1/blobs/{h}", timeout=30)
                    assert r.status_code == 200 and r.content == data, (n.url, h, r.status_code)
    print(f"test-failover took {time.monotonic() - t_all:.1f} s")
