"""Cluster mode (issue 20): blobrefd nodes behind HAProxy (conf/haproxy.cfg) over one radosgw
bucket and one PostgreSQL index with a synchronous standby: reads on every node, quarantine seen
across nodes, the same new blob raced on two nodes, reconcile racing uploads on other nodes, a
node and the database primary killed under upload load. The PostgreSQL tests skip while this
blobrefd does not know `[index] kind = postgres`; the harness test runs on LMDB nodes anyway."""
import hashlib
import os
import re
import signal
import socket
import threading
import time

import pytest
import requests

from cluster_util import (Cluster, Haproxy, PgPair, UploadLoad, postgres_index_supported,
                          wait_for)
from conftest import BIN_DIR, Server
from s3util import assert_clean_bucket, content_key, keys
from util_http import RawConn, assert_error, request_head, sha

TIMEOUT = 30


def bucket_name(node):
    n = re.sub(r"[^a-z0-9]+", "-", node.name.lower()).strip("-")
    return n[:40].strip("-") + "-" + hashlib.sha1(node.nodeid.encode()).hexdigest()[:8]


def db_name(node):
    return "t_" + hashlib.sha1(node.nodeid.encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def pg_supported(tmp_path_factory):
    return postgres_index_supported(BIN_DIR, tmp_path_factory.mktemp("pgprobe"))


def need_postgres(supported):
    if not supported:
        pytest.skip("this blobrefd does not know `[index] kind = postgres` yet (the PostgreSQL "
                    "index backend comes from branch pgindex)")


@pytest.fixture(scope="module")
def pg(pg_supported):
    """One primary + synchronous standby for the module's tests that do not kill it (each test
    gets its own database)."""
    need_postgres(pg_supported)
    pair = PgPair().start()
    yield pair
    pair.remove()


@pytest.fixture
def make_cluster(rgw, tmp_path, request):
    """Factory: make_cluster(n, dsn=None, extra="") -> a started Cluster over a fresh bucket.
    At the end: every node not killed by the test stops cleanly (exit 0), the bucket holds only
    content-addressed objects."""
    made = []
    bucket = rgw.make_bucket(bucket_name(request.node))

    def make(n, dsn=None, extra="", server=""):
        c = Cluster(tmp_path / f"cluster{len(made)}", rgw, bucket, n, dsn=dsn, server=server)
        if extra:
            for node in c.nodes:
                node.config_text += "\n" + extra
        made.append(c)
        return c.start()

    make.bucket = bucket
    yield make
    for c in made:
        alive = [n.alive() for n in c.nodes]
        rcs = c.stop()
        for i, n in enumerate(c.nodes):
            if i in rcs:
                assert alive[i], f"node{i + 1} died during the test:\n{n.read_log()[-3000:]}"
                assert rcs[i] == 0, f"node{i + 1} exited {rcs[i]}:\n{n.read_log()[-3000:]}"
    assert_clean_bucket(rgw.client(), bucket)


def new_blob(tag, i, size=3000):
    return hashlib.sha256(f"{tag}/{i}".encode()).digest() + os.urandom(size)


def put_via(url, data, session=requests):
    return session.put(f"{url}/v1/blobs/{sha(data)}", data=data, timeout=TIMEOUT)


def test_harness_lmdb_nodes_behind_haproxy(make_cluster, rgw):
    """The harness itself, on LMDB nodes (no shared index): HAProxy from conf/haproxy.cfg spreads
    uploads round robin over the three nodes; each blob lands once in the shared bucket and reads
    back from the node that took it; a stopped node is taken out of rotation by the /readyz check
    and uploads go on through the other two."""
    c = make_cluster(3)
    s3 = rgw.client()
    served = {}
    with requests.Session() as s:
        for i in range(12):
            data = new_blob("rr", i)
            r = put_via(c.url, data, s)
            assert r.status_code == 201, (r.status_code, r.text)
            served[sha(data)] = (r.headers["X-Blobref-Node"], data)
    by_node = {}
    for h, (node, _) in served.items():
        by_node.setdefault(node, []).append(h)
    assert sorted(by_node) == ["node1", "node2", "node3"]
    assert all(len(v) == 4 for v in by_node.values()), by_node  # round robin, not random
    in_bucket = keys(s3, make_cluster.bucket)
    for h, (node, data) in served.items():
        assert in_bucket.get(content_key(h)) == len(data)
        n = c.nodes[int(node[4:]) - 1]
        r = requests.get(f"{n.url}/v1/blobs/{h}", timeout=TIMEOUT)
        assert r.status_code == 200 and r.content == data
    # node2 leaves: HAProxy's health check marks it DOWN and the others take every upload
    c.nodes[1].stop()
    c.haproxy.wait_servers(["UP", "DOWN", "UP"], 15)
    with requests.Session() as s:
        for i in range(6):
            r = put_via(c.url, new_blob("after", i), s)
            assert r.status_code == 201 and r.headers["X-Blobref-Node"] in ("node1", "node3")


class HangUpNode:
    """A fake node for HAProxy: answers /readyz 200 (so it stays in rotation) and closes every
    other request's connection after reading it whole, without a byte of answer (a node that
    crashed before answering). Counts the requests it dropped, by method."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.dropped = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            conn.settimeout(5)
            head = b""
            try:
                while b"\r\n\r\n" not in head:
                    b = conn.recv(65536)
                    if not b:
                        return
                    head += b
            except OSError:
                return
            line = head.split(b"\r\n", 1)[0].decode(errors="replace")
            method, path = line.split(" ")[:2]
            m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
            body = len(head) - head.index(b"\r\n\r\n") - 4
            try:  # the whole request is read: the node took it, then died before answering
                while m and body < int(m.group(1)):
                    b = conn.recv(65536)
                    if not b:
                        return
                    body += len(b)
            except OSError:
                return
            if path == "/readyz":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close"
                             b"\r\n\r\nok")
                return
            with self.lock:
                self.dropped[method] = self.dropped.get(method, 0) + 1

    def close(self):
        self.sock.close()


def test_get_retried_on_another_node_but_upload_not(tmp_path):
    """retry-on covers GET and HEAD only: behind the rendered conf/haproxy.cfg, a GET or HEAD that
    lands on a node which hangs up without answering is replayed on the other node (200), an
    upload is not (the client gets 502, nothing is replayed)."""
    real = Server(tmp_path / "real").start()  # its own fs store: no S3 needed here
    fake = HangUpNode()
    hap = Haproxy(tmp_path / "hap", [real, fake]).start()
    try:
        data = new_blob("retry", 0)
        h = sha(data)
        assert put_via(real.url, data).status_code == 201
        with requests.Session() as s:
            gets = [s.get(f"{hap.url}/v1/blobs/{h}", timeout=TIMEOUT) for _ in range(6)]
            heads = [s.head(f"{hap.url}/v1/blobs/{h}", timeout=TIMEOUT) for _ in range(4)]
            puts = {}
            for i in range(6):
                # head and body in one write: HAProxy holds the whole request, so it could
                # replay it; only the configuration keeps it from doing so
                d = new_blob("retry-put", i)
                conn = RawConn(hap, timeout=TIMEOUT)
                try:
                    conn.send(request_head("PUT", f"/v1/blobs/{sha(d)}",
                                           [("Content-Length", str(len(d)))]) + d)
                    puts[sha(d)] = conn.read_response().status
                except (EOFError, OSError):
                    puts[sha(d)] = "hung up"  # HAProxy closed without an answer
                finally:
                    conn.close()
        assert all(r.status_code == 200 and r.content == data for r in gets)
        assert all(r.status_code == 200 for r in heads)
        assert all(r.headers["X-Blobref-Node"] == "node1" for r in gets + heads)
        assert fake.dropped.get("GET", 0) >= 1 and fake.dropped.get("HEAD", 0) >= 1, fake.dropped
        # the PUTs that landed on the fake were dropped there once and failed (502 or a closed
        # connection): not replayed on node1, which never saw them
        failed = [h for h, code in puts.items() if code != 201]
        assert all(puts[h] in (502, "hung up") for h in failed), puts
        assert len(failed) == fake.dropped.get("PUT", 0) >= 1, (puts, fake.dropped)
        for h in failed:
            assert requests.head(f"{real.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 404
    finally:
        hap.stop()
        fake.close()
        assert real.stop() == 0, real.read_log()[-3000:]


class ReadyFlagNode:
    """A fake node for HAProxy that is up (it accepts and answers everything) and whose /readyz
    answers 200 or 503 as `ready` says; counts the other requests it answered."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        fake = self
        self.ready, self.served = True, 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def answer(self, code, body):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/readyz":
                    return self.answer(200 if fake.ready else 503, b"{}")
                fake.served += 1
                self.answer(200, b"fake")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_node_answering_readyz_503_leaves_the_rotation(tmp_path):
    """The health check of conf/haproxy.cfg is GET /readyz's status, not a connect: a node that
    is up but answers /readyz 503 (its index or store unavailable) is marked DOWN and gets no
    request; once it answers 200 again it is back in rotation."""
    real = Server(tmp_path / "real").start()
    fake = ReadyFlagNode()
    hap = Haproxy(tmp_path / "hap", [real, fake]).start()
    try:
        data = new_blob("ready", 0)
        assert put_via(real.url, data).status_code == 201
        fake.ready = False
        hap.wait_servers(["UP", "DOWN"], 15)
        before = fake.served
        with requests.Session() as s:
            for _ in range(10):
                r = s.get(f"{hap.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT)
                assert r.status_code == 200 and r.content == data
                assert r.headers["X-Blobref-Node"] == "node1"
        assert fake.served == before
        fake.ready = True
        hap.wait_servers(["UP", "UP"], 15)
        with requests.Session() as s:
            nodes = {s.get(f"{hap.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT)
                     .headers["X-Blobref-Node"] for _ in range(6)}
        assert nodes == {"node1", "node2"} and fake.served > before
    finally:
        hap.stop()
        fake.close()
        assert real.stop() == 0, real.read_log()[-3000:]


def test_upload_via_haproxy_read_from_every_node(pg, make_cluster, request):
    """Shared index: a blob uploaded through HAProxy reads back from every node, and /meta is the
    same JSON on every node."""
    c = make_cluster(3, dsn=pg.dsn(pg.create_database(db_name(request.node))))
    blobs = [new_blob("every", i, size=1000 + 997 * i) for i in range(9)]
    with requests.Session() as s:
        for b in blobs:
            r = put_via(c.url, b, s)
            assert r.status_code == 201, (r.status_code, r.text)
    for b in blobs:
        metas = []
        for n in c.nodes:
            r = requests.get(f"{n.url}/v1/blobs/{sha(b)}", timeout=TIMEOUT)
            assert r.status_code == 200 and r.content == b, (n.url, r.status_code)
            m = requests.get(f"{n.url}/v1/blobs/{sha(b)}/meta", timeout=TIMEOUT)
            assert m.status_code == 200
            metas.append(m.json())
        assert metas[0] == metas[1] == metas[2], metas


def test_quarantine_on_one_node_410_on_another(pg, make_cluster, request):
    """An admin quarantine acknowledged by node A is answered 410 by node B, even though B has
    just served (and cached) the blob; the delay is measured and must stay under 1 s."""
    c = make_cluster(2, dsn=pg.dsn(pg.create_database(db_name(request.node))))
    a, b = c.nodes
    delays = []
    for i in range(5):
        data = new_blob("q", i, size=2000)
        h = sha(data)
        assert put_via(a.url, data).status_code == 201
        for _ in range(3):  # B serves it, so its caches hold it
            r = requests.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT)
            assert r.status_code == 200 and r.content == data
        r = requests.delete(f"{a.url}/v1/blobs/{h}", params={"reason": "cluster test"},
                            timeout=TIMEOUT)
        acked = time.monotonic()
        assert r.status_code == 200, (r.status_code, r.text)
        wait_for(lambda: requests.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code
                 == 410, 1.0, f"node B's 410 for {h[:12]}", step=0.002)
        delays.append(time.monotonic() - acked)
    print(f"\nquarantine on A -> 410 on B: max {max(delays) * 1000:.1f} ms, "
          f"median {sorted(delays)[2] * 1000:.1f} ms")


def test_same_new_blob_raced_on_two_nodes(pg, make_cluster, rgw, request):
    """Two clients upload the same new blob to two nodes at once, 10 times: both are answered
    200/201 (at least one 201), the index holds one record and the bucket one
    object per blob, no staging left."""
    c = make_cluster(2, dsn=pg.dsn(pg.create_database(db_name(request.node))))
    s3 = rgw.client()
    for i in range(10):
        data = new_blob("race", i, size=200_000)
        h = sha(data)
        gate = threading.Barrier(2)
        out = [None, None]

        def up(k):
            gate.wait()
            out[k] = put_via(c.nodes[k].url, data)

        ts = [threading.Thread(target=up, args=(k,)) for k in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        codes = sorted(r.status_code for r in out)
        # one of them stored it (201); the other deduplicated (200) or, having streamed the same
        # bytes at the same moment, is also answered 201 for the one record
        assert codes in ([200, 201], [201, 201]), [(r.status_code, r.text) for r in out]
        objs = {k: v for k, v in keys(s3, make_cluster.bucket).items() if h in k}
        assert objs == {content_key(h): len(data)}, objs
        metas = [requests.get(f"{n.url}/v1/blobs/{h}/meta", timeout=TIMEOUT).json()
                 for n in c.nodes]
        assert metas[0] == metas[1] and len(metas[0]["locations"]) == 1, metas


def test_reconcile_on_one_node_races_uploads_on_others(pg, make_cluster, tmp_path, request):
    """tests/integration/test_reconcile_race.py across nodes: back-to-back reconcile runs on node
    A (grace 2 s, retention 1 s) while nodes B and C take uploads and dedup hits of blobs no
    table references and a reader checks them on C: a blob acknowledged within grace always
    reads back, referenced blobs are never touched, and a reconcile started on B while A runs
    one is refused with 409 (one run cluster-wide)."""
    import test_reconcile_race as rr
    from reconcile_util import IceTable, blob

    t = IceTable(tmp_path / "t")
    ref_data = {sha(blob("cref", i)): blob("cref", i) for i in range(10)}
    t.write_data({"ref.parquet": list(ref_data)})
    t.append("ref.parquet")
    extra = (f"[reconcile]\ninterval = 0\ngrace = {rr.GRACE:g}s\nretention = {rr.RETENTION:g}s\n"
             "max_fraction = 1\n" + t.conf())
    c = make_cluster(3, dsn=pg.dsn(pg.create_database(db_name(request.node))), extra=extra,
                     server="dedup_touch_interval = 0s\n")
    a, b, cc = c.nodes
    for d in ref_data.values():
        assert put_via(b.url, d).status_code == 201
    data = {sha(blob("cpool", i, size=3000 + i)): blob("cpool", i, size=3000 + i)
            for i in range(60)}
    pool = list(data)
    data.update(ref_data)
    referenced = list(ref_data)
    tr = rr.Tracker(data)
    stop = threading.Event()
    runner = rr.Runner(a, tr, stop)

    def uploader(srv, seed):
        import random
        rng = random.Random(seed)
        s = requests.Session()
        while not stop.is_set():
            rr.do_upload(tr, srv, s, rng.choice(pool), rng.choice(["put", "post"]))
            time.sleep(rng.uniform(0, 0.02))

    threads = [threading.Thread(target=uploader, args=(b, 1), daemon=True),
               threading.Thread(target=uploader, args=(cc, 2), daemon=True),
               threading.Thread(target=rr.checker, args=(cc, tr, pool, referenced, stop),
                                daemon=True)]
    try:
        for th in threads:
            th.start()
        runner.start()
        time.sleep(18)
    finally:
        stop.set()
        for th in threads + [runner]:
            th.join(60)
    print(f"\n{len(runner.reports)} runs on A; quarantined {runner.total('quarantined')}, "
          f"deleted {runner.total('deleted')}; {tr.stats}")
    s = requests.Session()
    for h in referenced:
        for n in c.nodes:
            rr.verify_read(tr, s, n, h, True, "referenced blob at the end")
    for h in pool:
        rr.verify_read_timed(tr, s, cc, h, tr.last(h))
    assert not tr.bad, "\n".join(tr.bad)
    assert len(runner.reports) >= 5 and all(r["state"] == "done" for r in runner.reports)
    assert runner.total("quarantined") > 0 and runner.total("deleted") > 0


def test_second_reconcile_on_another_node_is_409(pg, make_cluster, tmp_path, request):
    """One reconcile run cluster-wide: while node A runs one (mark phase included), POST
    /v1/reconcile on node B is 409."""
    from reconcile_util import IceTable, blob

    t = IceTable(tmp_path / "t")
    hashes = [sha(blob("r409", i)) for i in range(2000)]
    t.write_data({f"d{k}.parquet": hashes[k::20] for k in range(20)})
    for k in range(20):
        t.append(f"d{k}.parquet")
    extra = "[reconcile]\ninterval = 0\ngrace = 1s\nretention = 1h\nmax_fraction = 1\n" + t.conf()
    c = make_cluster(2, dsn=pg.dsn(pg.create_database(db_name(request.node))), extra=extra)
    a, b = c.nodes
    r = requests.post(f"{a.url}/v1/reconcile", timeout=TIMEOUT)
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    second = requests.post(f"{b.url}/v1/reconcile", timeout=TIMEOUT)
    state = requests.get(f"{a.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT).json()["state"]
    if second.status_code == 202:  # let B's run end before the nodes stop
        wait_for(lambda: requests.get(f"{b.url}/v1/reconcile/runs/{second.json()['id']}",
                                      timeout=TIMEOUT).json()["state"] != "running", 60,
                 "B's run to end")
    wait_for(lambda: requests.get(f"{a.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT)
             .json()["state"] != "running", 60, "A's run to end")
    assert state == "running", "A's run ended before B was asked: the test proved nothing"
    assert second.status_code == 409, (second.status_code, second.text)


def readyz(node):
    """The status of node's /readyz (None when it does not answer)."""
    try:
        return requests.get(f"{node.url}/readyz", timeout=5).status_code
    except requests.RequestException:
        return None


def check_all_readable(nodes, acked):
    """Every acknowledged blob reads back byte-identical from every node given."""
    bad = []
    with requests.Session() as s:
        for n in nodes:
            for h, data in acked.items():
                r = s.get(f"{n.url}/v1/blobs/{h}", timeout=TIMEOUT)
                if r.status_code != 200 or r.content != data:
                    bad.append((n.url, h[:12], r.status_code))
    assert not bad, f"{len(bad)} acknowledged blobs unreadable: {bad[:10]}"


@pytest.mark.parametrize("index", ["lmdb", "postgres"])
def test_node_killed_under_upload_load(index, pg_supported, make_cluster, request):
    """kill -9 of one of three nodes while four clients upload through HAProxy: uploads go on
    through the others, and every acknowledged blob is readable after (on a shared PostgreSQL
    index from the survivors; on LMDB nodes from the node that took it, the killed one
    restarted on its own --data)."""
    pair = None
    if index == "postgres":
        need_postgres(pg_supported)
        pair = PgPair().start()
        request.addfinalizer(pair.remove)
        c = make_cluster(3, dsn=pair.dsn(pair.create_database("blobref")))
    else:
        c = make_cluster(3)
    load = UploadLoad(c.url, threads=4, size=20_000).start()
    try:
        wait_for(lambda: load.acked_count() >= 60, 30, "60 uploads before the kill")
        killed = c.nodes[1]
        t_kill = time.monotonic()
        killed.stop(signal.SIGKILL)
        before = load.acked_count()
        c.haproxy.wait_servers(["UP", "DOWN", "UP"], 10)
        wait_for(lambda: load.acked_count() >= before + 60, 30, "60 uploads after the kill")
    finally:
        load.stop()
    print(f"\n{index}: {len(load.acked)} acknowledged, statuses {load.statuses}, "
          f"uploads failing for {load.outage_window(t_kill):.2f} s after the kill")
    survivors = [c.nodes[0], c.nodes[2]]
    if index == "postgres":
        check_all_readable(survivors + [c.haproxy], load.acked)
    else:
        killed.start(timeout=30)  # its LMDB index is its own: back on the same --data
        per_node = {}
        with requests.Session() as s:
            for h in load.acked:
                found = [n for n in c.nodes
                         if s.head(f"{n.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 200]
                per_node[h] = len(found)
        lost = [h for h, k in per_node.items() if k != 1]
        assert not lost, f"{len(lost)} acknowledged blobs not on exactly one node: {lost[:5]}"


def test_primary_killed_and_standby_promoted_under_load(pg_supported, make_cluster):
    """kill -9 of the PostgreSQL primary while clients upload through HAProxy to two nodes whose
    dsn lists both servers (target_session_attrs=read-write), then pg_ctl promote of the
    synchronous standby: meanwhile every node's /readyz is 503 and an upload is 503
    index_unavailable (not recorded), the clients get 5xx, never 4xx; no node is restarted,
    every node is ready again and writes are acknowledged again, every blob acknowledged before,
    during or after is present on both nodes, and the outage window (kill to the first
    acknowledgement after the last failure) is printed and bounded by 60 s."""
    need_postgres(pg_supported)
    pair = PgPair().start()
    try:
        c = make_cluster(2, dsn=pair.dsn(pair.create_database("blobref")))
        pids = [n.proc.pid for n in c.nodes]
        load = UploadLoad(c.url, threads=4, size=8000).start()
        try:
            wait_for(lambda: load.acked_count() >= 50, 30, "50 uploads before the kill")
            pair.kill_primary()
            t_kill = time.monotonic()
            # no primary: every node says so (503), and an upload to a node directly is 503
            # index_unavailable, not acknowledged
            for n in c.nodes:
                wait_for(lambda: readyz(n) == 503, 30, f"{n.url}/readyz 503 without a primary")
            gone = new_blob("no-primary", 0)
            assert_error(put_via(c.nodes[0].url, gone), 503, "index_unavailable")
            promote = pair.promote_standby()
            after = load.acked_count()
            for n in c.nodes:
                wait_for(lambda: readyz(n) == 200, 60, f"{n.url}/readyz 200 after the promotion")
            ready = time.monotonic() - t_kill
            wait_for(lambda: load.acked_count() >= after + 50, 60,
                     "50 acknowledged uploads after the promotion")
        finally:
            load.stop()
        window = load.outage_window(t_kill)
        print(f"\nprimary killed, standby promoted in {promote:.2f} s; every node ready "
              f"{ready:.2f} s and writes acknowledged again {window:.2f} s after the kill; "
              f"{len(load.acked)} acknowledged, statuses {load.statuses}")
        assert [n.proc.pid for n in c.nodes] == pids and all(n.alive() for n in c.nodes)
        assert window < 60 and ready < 60
        # meanwhile the clients were answered 5xx (or cut off by HAProxy), never a 4xx
        assert all(k in (200, 201) or not isinstance(k, int) or k >= 500
                   for k in load.statuses), load.statuses
        assert requests.head(f"{c.nodes[1].url}/v1/blobs/{sha(gone)}",
                             timeout=TIMEOUT).status_code == 404
        check_all_readable(c.nodes, load.acked)
    finally:
        pair.remove()


def test_upload_not_acknowledged_until_the_synchronous_standby_has_it(pg_supported, tmp_path):
    """blobrefd never lowers synchronous_commit: with the synchronous standby stopped, an upload's
    commit waits in the primary for it (a blobrefd session in wait_event SyncRep) and the client
    hears nothing; the upload is answered 201 only once the standby is back, and reads back."""
    need_postgres(pg_supported)
    pair = PgPair().start()
    node = None
    try:
        db = pair.create_database("blobref")
        node = Server(tmp_path / "node", f"[store local]\nkind = fs\nroot = {tmp_path / 'blobs'}\n"
                      f"[index]\nkind = postgres\ndsn = {pair.dsn(db)}\n").start(timeout=30)
        first = new_blob("sync", 0)
        assert put_via(node.url, first).status_code == 201
        pair.standby.stop()
        data, out = new_blob("sync", 1), {}

        def upload():
            try:
                out["r"] = put_via(node.url, data, requests.Session())
            except requests.RequestException as e:
                out["r"] = e

        t = threading.Thread(target=upload, daemon=True)
        t.start()
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND "
                   f"application_name = 'blobrefd' AND datname = '{db}'")
        wait_for(lambda: pair.primary.try_sql(waiting) not in (None, "0"), 20,
                 "blobrefd's commit to wait for the synchronous standby")
        assert "r" not in out, f"answered before the standby had the commit: {out['r']}"
        pair.standby.start()
        t.join(TIMEOUT + 5)
        r = out.get("r")
        assert isinstance(r, requests.Response) and r.status_code == 201, r
        got = requests.get(f"{node.url}/v1/blobs/{sha(data)}", timeout=TIMEOUT)
        assert got.status_code == 200 and got.content == data
    finally:
        if node is not None:
            alive = node.alive()
            rc = node.stop()
            assert alive and rc == 0, node.read_log()[-3000:]
        pair.remove()


def test_harness_standby_is_synchronous_and_keeps_every_acknowledged_commit():
    """The PostgreSQL pair itself (psycopg2, no blobrefd): with the standby down a commit on the
    primary waits for it (SyncRep) and completes once it is back; then under four writers the
    primary is killed -9 and the standby promoted: every commit the primary acknowledged is on
    the promoted server, which takes writes at once."""
    psycopg2 = pytest.importorskip("psycopg2")
    pair = PgPair().start()
    try:
        p, sb = pair.primary, pair.standby
        p.sql("CREATE TABLE acked (id bigint PRIMARY KEY, at timestamptz DEFAULT now())")

        def connect(inst):
            conn = psycopg2.connect(host="127.0.0.1", port=inst.port, user="postgres",
                                    dbname="postgres", connect_timeout=2)
            conn.autocommit = True
            return conn

        sb.stop()
        done = threading.Event()

        def blocked_commit():
            with connect(p) as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO acked (id) VALUES (-1)")
            done.set()

        t = threading.Thread(target=blocked_commit, daemon=True)
        t.start()
        wait_for(lambda: p.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = "
                               "'SyncRep'") == "1", 15, "the commit to wait for the standby")
        assert not done.is_set()
        sb.start()
        wait_for(done.is_set, 30, "the commit once the standby is back")

        acked, lock, stop = [], threading.Lock(), threading.Event()

        def writer(k):
            try:
                conn = connect(p)
                cur = conn.cursor()
                i = 0
                while not stop.is_set():
                    cur.execute("INSERT INTO acked (id) VALUES (%s)", (k * 10**9 + i,))
                    with lock:
                        acked.append(k * 10**9 + i)
                    i += 1
            except psycopg2.Error:
                return  # the primary is gone: this commit was not acknowledged

        ws = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(4)]
        for w in ws:
            w.start()
        wait_for(lambda: len(acked) >= 200, 30, "200 acknowledged commits")
        pair.kill_primary()
        for w in ws:
            w.join(30)
        stop.set()
        took = pair.promote_standby()
        with connect(sb) as conn, conn.cursor() as cur:
            cur.execute("SELECT id FROM acked")
            present = {r[0] for r in cur.fetchall()}
            cur.execute("INSERT INTO acked (id) VALUES (-2)")
        missing = set(acked) - present
        print(f"\n{len(acked)} commits acknowledged before the kill, promotion {took:.2f} s")
        assert not missing, f"{len(missing)} acknowledged commits lost: {sorted(missing)[:5]}"
        assert -1 in present
    finally:
        pair.remove()
