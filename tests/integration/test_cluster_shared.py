"""Work that must run once across a cluster (issue 20): two blobrefd nodes behind HAProxy over one
PostgreSQL index and one radosgw bucket share the CDN purge queue (rows claimed FOR UPDATE SKIP
LOCKED, so each purge is sent once; a claim of a node killed mid-send passes after
`[index] purge_claim_timeout` and the other node sends it) and the reconcile reports (the same
runs on every node, run ids unique across nodes)."""
import hashlib
import http.server
import os
import threading
import time

import pytest
import requests

from cluster_util import Cluster, postgres_index_supported, wait_for
from conftest import BIN_DIR
from test_cluster import bucket_name
from util_http import sha

TIMEOUT = 30


@pytest.fixture(scope="module")
def pg_supported(tmp_path_factory):
    return postgres_index_supported(BIN_DIR, tmp_path_factory.mktemp("pgprobe"))


class Cdn:
    """A CDN stand-in that records (node, path, time) of every PURGE; the URL path names the node
    that sent it (/nI/...). With hold set, the first purge is not answered until `release` is set
    (its sender can be killed while it waits)."""

    def __init__(self, delay=0.0, hold=False):
        self.seen = []
        self.lock = threading.Lock()
        self.first = threading.Event()
        self.release = threading.Event()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_PURGE(self):
                _, node, rest = self.path.split("/", 2)
                with outer.lock:
                    outer.seen.append((node, "/" + rest, time.monotonic()))
                    held = hold and not outer.first.is_set()
                    outer.first.set()
                if held:
                    outer.release.wait(120)
                elif delay:
                    time.sleep(delay)
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # its sender was killed meanwhile

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def paths(self):
        with self.lock:
            return [p for _, p, _ in self.seen]

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def shared_cluster(pg_supported, postgres, rgw, tmp_path, request):
    """Factory: shared_cluster(n, index_extra="", extra="", server="") -> a started Cluster of n
    nodes over one fresh PostgreSQL database; `extra` is a format string given the node's number
    (1..n). At the end every node the test did not kill stops cleanly."""
    if not pg_supported:
        pytest.skip("this blobrefd has no PostgreSQL index")
    made = []
    bucket = rgw.make_bucket(bucket_name(request.node))

    def make(n, index_extra="", extra="", server=""):
        c = Cluster(tmp_path / f"cluster{len(made)}", rgw, bucket, n, dsn=postgres.database(),
                    server=server)
        for i, node in enumerate(c.nodes):
            node.config_text += index_extra + "\n" + extra.format(node=i + 1)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        alive = [n.proc is None or n.alive() for n in c.nodes]
        rcs = c.stop()
        for i, n in enumerate(c.nodes):
            if i in rcs:
                assert alive[i], f"node{i + 1} died during the test:\n{n.read_log()[-3000:]}"
                assert rcs[i] == 0, f"node{i + 1} exited {rcs[i]}:\n{n.read_log()[-3000:]}"


def cdn_section(cdn):
    return f"[cdn edge]\npurge_url = {cdn.url}/n{{node}}/v1/blobs/{{{{hash}}}}\n"


def new_blob(tag, i, size=2000):
    return hashlib.sha256(f"{tag}/{i}".encode()).digest() + os.urandom(size)


def pending(node):
    r = requests.get(f"{node.url}/metrics", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    for line in r.text.splitlines():
        if line.startswith("blobref_cdn_purges_pending "):
            return int(line.split()[1])
    raise AssertionError("no blobref_cdn_purges_pending in /metrics")


def quarantine(node, h):
    r = requests.delete(f"{node.url}/v1/blobs/{h}", params={"reason": "cluster purge test"},
                        timeout=TIMEOUT)
    assert r.status_code == 200, (r.status_code, r.text)


def test_purges_sent_once_with_two_nodes(shared_cluster):
    """60 quarantines, alternately on either node: every purge reaches the CDN exactly once
    (without claims, both nodes' senders saw each pending purge until one settled it: a slow CDN
    got most of them twice), and both nodes send some."""
    cdn = Cdn(delay=0.02)
    try:
        c = shared_cluster(2, extra=cdn_section(cdn))
        hashes = []
        with requests.Session() as s:
            for i in range(60):
                data = new_blob("once", i)
                assert s.put(f"{c.url}/v1/blobs/{sha(data)}", data=data,
                             timeout=TIMEOUT).status_code == 201
                hashes.append(sha(data))
        for i, h in enumerate(hashes):
            quarantine(c.nodes[i % 2], h)
        want = {f"/v1/blobs/{h}" for h in hashes}
        wait_for(lambda: want <= set(cdn.paths()), 60, "every purge at the CDN")
        wait_for(lambda: pending(c.nodes[0]) == 0, 30, "no purge pending")
        # a duplicate would come from a sender that read the purge before the other settled it:
        # give a second sender the time of two more polls to show one
        time.sleep(2.5)
        paths = cdn.paths()
        dups = {p: paths.count(p) for p in set(paths) if paths.count(p) > 1}
        assert not dups, f"{len(dups)} purges sent more than once, e.g. {list(dups.items())[:3]}"
        assert set(paths) == want
        nodes = {n for n, _, _ in cdn.seen}
        print(f"\n60 purges, each sent once; senders: "
              f"{ {n: sum(1 for m, _, _ in cdn.seen if m == n) for n in sorted(nodes)} }")
    finally:
        cdn.close()


def test_killed_claimer_purge_sent_by_other_node_after_timeout(shared_cluster):
    """The node that claimed a purge is killed (kill -9) while the CDN holds its request: the other
    node does not send that purge while the claim lives (purge_claim_timeout = 3s), then sends it
    once the claim has passed, and nothing stays pending."""
    claim_s = 3.0
    cdn = Cdn(hold=True)
    try:
        c = shared_cluster(2, index_extra=f"purge_claim_timeout = {int(claim_s)}s\n",
                           extra=cdn_section(cdn))
        data = new_blob("killed", 0)
        h = sha(data)
        assert requests.put(f"{c.url}/v1/blobs/{h}", data=data, timeout=TIMEOUT).status_code == 201
        quarantine(c.nodes[0], h)
        assert cdn.first.wait(30), "no purge reached the CDN"
        claimer, claimed_at = cdn.seen[0][0], cdn.seen[0][2]
        victim = c.nodes[int(claimer[1:]) - 1]
        other = c.nodes[1 - (int(claimer[1:]) - 1)]
        victim.proc.kill()
        victim.proc.wait()
        victim.proc = None
        victim.log.close()
        cdn.release.set()
        resent = wait_for(lambda: [s for s in cdn.seen[1:]], claim_s + 15,
                          "the other node's purge")
        node, path, at = resent[0]
        assert node != claimer and path == f"/v1/blobs/{h}", cdn.seen
        waited = at - claimed_at
        # the claim is taken a moment before the request reaches the CDN
        assert waited >= claim_s - 0.5, f"sent again {waited:.2f} s after the claim (< {claim_s})"
        wait_for(lambda: pending(other) == 0, 15, "no purge pending")
        assert len(cdn.seen) == 2, cdn.seen
        print(f"\nkilled claimer's purge sent by {node} {waited:.2f} s after its claim "
              f"(timeout {claim_s} s)")
    finally:
        cdn.close()


def run_to_end(node):
    r = requests.post(f"{node.url}/v1/reconcile", timeout=TIMEOUT)
    assert r.status_code == 202, (r.status_code, r.text)
    rid = r.json()["id"]
    wait_for(lambda: requests.get(f"{node.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT)
             .json()["state"] != "running", 60, f"run {rid} to end")
    return rid


def test_reconcile_runs_same_on_every_node(shared_cluster, tmp_path):
    """Four runs started alternately on node A and node B (each to its end): both nodes list the
    same four runs with four distinct ids, answer the same report for each, and the same blob
    list of each action (without shared state each node numbered its own runs from 1 and knew
    only them)."""
    from reconcile_util import IceTable, blob

    t = IceTable(tmp_path / "t")
    refs = [blob("sref", i) for i in range(5)]
    t.write_data({"ref.parquet": [sha(d) for d in refs]})
    t.append("ref.parquet")
    c = shared_cluster(2, extra="[reconcile]\ninterval = 0\ngrace = 1s\nretention = 1h\n"
                       "max_fraction = 1\n" + t.conf().replace("{", "{{").replace("}", "}}"),
                       server="dedup_touch_interval = 0s\n")
    a, b = c.nodes
    unref = [new_blob("sunref", i) for i in range(30)]
    with requests.Session() as s:
        for d in refs + unref:
            assert s.put(f"{c.url}/v1/blobs/{sha(d)}", data=d, timeout=TIMEOUT).status_code == 201
    time.sleep(1.2)  # the grace (1 s) of the unreferenced uploads passes
    ids = [run_to_end(n) for n in (a, b, a, b)]
    assert len(set(ids)) == 4, f"run ids given twice: {ids}"
    listed = [requests.get(f"{n.url}/v1/reconcile/runs", timeout=TIMEOUT).json()["runs"]
              for n in (a, b)]
    assert listed[0] == listed[1], listed
    assert sorted(r["id"] for r in listed[0]) == sorted(ids), (ids, listed[0])
    total = 0
    for rid in ids:
        reports = [requests.get(f"{n.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT) for n in (a, b)]
        assert reports[0].status_code == reports[1].status_code == 200
        assert reports[0].json() == reports[1].json()
        for action in ("quarantined", "deleted"):
            pages = [requests.get(f"{n.url}/v1/reconcile/runs/{rid}/blobs",
                                  params={"action": action}, timeout=TIMEOUT) for n in (a, b)]
            assert pages[0].status_code == pages[1].status_code == 200, pages[0].text
            assert pages[0].json() == pages[1].json()
            total += len(pages[0].json().get("blobs", []))
    first = requests.get(f"{b.url}/v1/reconcile/runs/{ids[0]}/blobs",
                         params={"action": "quarantined"}, timeout=TIMEOUT).json()
    assert {x["sha256"] for x in first["blobs"]} == \
        {sha(d) for d in unref}, first
    print(f"\nruns {ids}: the same on both nodes ({total} listed blobs compared)")
