"""Reconcile state shared across a cluster (issue 20): two blobrefd nodes over one PostgreSQL
index and one shared fs store. The per-data-file hash cache lives in the database
(blobref_filecache), so a run or a why-alive on node B after a run on node A reads no data file,
and a run on B after A was killed mid-run completes from what A cached, and is correct; the run
A executes is shown on B (phase, progress) and a POST to B is 409 for its whole duration."""
import errno
import os
import signal
import time

import requests

import hashlib
import threading

import pytest

from cluster_util import wait_for
from conftest import Server
from util_http import sha

TIMEOUT = 30
FILES = 4


class Nodes:
    def __init__(self, nodes, dsn):
        self.nodes, self.dsn = nodes, dsn
        self.url = nodes[0].url


@pytest.fixture
def shared_cluster(postgres, tmp_path):
    """Factory: shared_cluster(n, extra="", server="") -> n started nodes over one fresh
    PostgreSQL database and one fs store; `extra` is a format string (str.format, no fields).
    At the end every node the test did not kill stops cleanly."""
    made = []
    dsn = postgres.database()

    def make(n, extra="", server=""):
        for i in range(n):
            conf = (f"[server]\nupload_store = lake\n{server}\n"
                    f"[store lake]\nkind = fs\nroot = {tmp_path / 'lake'}\n"
                    f"[index]\nkind = postgres\ndsn = {dsn}\n" + extra.format())
            made.append(Server(tmp_path / f"node{i + 1}", conf))
        for srv in made:
            srv.start(timeout=30)
        return Nodes(made, dsn)

    yield make
    for i, srv in enumerate(made):
        if srv.proc is None:
            continue  # killed by the test
        alive = srv.alive()
        rc = srv.stop()
        assert alive and rc == 0, f"node{i + 1}: exit {rc}:\n{srv.read_log()[-3000:]}"


def new_blob(tag, i, size=2000):
    return hashlib.sha256(f"{tag}/{i}".encode()).digest() + os.urandom(size)


def run_to_end(node):
    r = requests.post(f"{node.url}/v1/reconcile", timeout=TIMEOUT)
    assert r.status_code == 202, (r.status_code, r.text)
    rid = r.json()["id"]
    wait_for(lambda: requests.get(f"{node.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT)
             .json()["state"] != "running", 60, f"run {rid} to end")
    return rid


def table_counts(rep):
    [t] = rep["tables"]
    return t["data_files"], t["data_files_read"], t["data_files_cached"]


def recon_extra(t):
    return ("[reconcile]\ninterval = 0\ngrace = 1s\nretention = 1h\nmax_fraction = 1\n" +
            t.conf().replace("{", "{{").replace("}", "}}"))


def referenced_table(tmp_path, tag):
    """An Iceberg table of FILES data files, 5 referenced blobs each; returns (table, blobs)."""
    from reconcile_util import IceTable, blob
    t = IceTable(tmp_path / "t")
    refs = [blob(tag, i) for i in range(5 * FILES)]
    t.write_data({f"d{k}.parquet": [sha(d) for d in refs[k::FILES]] for k in range(FILES)})
    for k in range(FILES):
        t.append(f"d{k}.parquet")
    return t, refs


def upload_all(url, blobs):
    with requests.Session() as s:
        for d in blobs:
            r = s.put(f"{url}/v1/blobs/{sha(d)}", data=d, timeout=TIMEOUT)
            assert r.status_code == 201, (r.status_code, r.text)


def report(node, rid):
    r = requests.get(f"{node.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def cache_rows(postgres, c):
    db = c.dsn.rsplit("dbname=", 1)[1].split()[0]
    [[rows, ids]] = postgres.psql("SELECT count(*), count(DISTINCT id) FROM blobref_filecache",
                                  dbname=db)
    return int(rows), int(ids)


def test_run_and_why_alive_on_b_read_nothing_after_a_run_on_a(shared_cluster, postgres,  # noqa
                                                             tmp_path):
    """A's first run reads every data file; why-alive on B and then a run on B read none (on a
    node-local cache both read them all again). One cache row per data file."""
    t, refs = referenced_table(tmp_path, "fc-ref")
    c = shared_cluster(2, extra=recon_extra(t), server="dedup_touch_interval = 0s\n")
    a, b = c.nodes
    unref = [new_blob("fc-unref", i) for i in range(6)]
    upload_all(c.url, refs + unref)
    rid = run_to_end(a)
    rep_a = report(a, rid)
    assert rep_a["state"] == "done", rep_a
    assert table_counts(rep_a) == (FILES, FILES, 0), rep_a["tables"]

    why = requests.get(f"{b.url}/v1/blobs/{sha(refs[0])}/refs", timeout=60)
    assert why.status_code == 200, why.text
    [entry] = why.json()["tables"]
    assert entry["data_files_read"] == 0 and entry["data_files_cached"] == FILES, entry
    assert [f["path"].rsplit("/", 1)[-1] for f in entry["data_files"]] == ["d0.parquet"], entry

    rid_b = run_to_end(b)
    rep_b = report(b, rid_b)
    assert rep_b["state"] == "done", rep_b
    assert table_counts(rep_b) == (FILES, 0, FILES), rep_b["tables"]
    assert rep_b["references"] == rep_a["references"] == len(refs), (rep_a, rep_b)
    assert cache_rows(postgres, c) == (FILES, FILES)


def test_cache_pruned_when_a_file_leaves_every_retained_snapshot(shared_cluster, postgres,  # noqa
                                                                 tmp_path):
    """A data file removed by an overwrite and no longer in any retained snapshot (expired) loses
    its cache row at the next run, whichever node runs it."""
    t, refs = referenced_table(tmp_path, "fp-ref")
    c = shared_cluster(2, extra=recon_extra(t))
    a, b = c.nodes
    upload_all(c.url, refs)
    run_to_end(a)
    assert cache_rows(postgres, c) == (FILES, FILES)
    t.overwrite(remove=["d0.parquet"])
    t.expire(1)
    rep = report(b, run_to_end(b))
    assert rep["state"] == "done", rep
    assert table_counts(rep) == (FILES - 1, 0, FILES - 1), rep["tables"]
    assert cache_rows(postgres, c) == (FILES - 1, FILES - 1)


def at_pause(fifo, timeout=60):
    """Waits until a run reached the pause between mark and sweep (it opened the FIFO for
    reading); returns the writer's fd (closing it lets the run go on)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            assert e.errno == errno.ENXIO and time.monotonic() < deadline, e
            time.sleep(0.02)


def test_node_killed_mid_run_other_node_completes_from_its_cache(shared_cluster, tmp_path,  # noqa
                                                                 monkeypatch):
    """kill -9 of node A while its run waits between mark and sweep (it holds the cluster-wide
    lease and has cached every file): node B's run is accepted, reads no data file, quarantines
    exactly the unreferenced blobs and leaves the referenced ones readable."""
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    monkeypatch.setenv("BLOBREF_TEST_RECONCILE_PAUSE", str(fifo))
    t, refs = referenced_table(tmp_path, "fk-ref")
    c = shared_cluster(2, extra=recon_extra(t), server="dedup_touch_interval = 0s\n")
    a, b = c.nodes
    unref = [new_blob("fk-unref", i) for i in range(6)]
    upload_all(c.url, refs + unref)
    time.sleep(1.2)  # the grace (1 s) of the unreferenced uploads passes
    r = requests.post(f"{a.url}/v1/reconcile", timeout=TIMEOUT)
    assert r.status_code == 202, r.text
    fd = at_pause(fifo)
    assert requests.post(f"{b.url}/v1/reconcile", timeout=TIMEOUT).status_code == 409
    a.stop(signal.SIGKILL)
    os.close(fd)

    def post_b():
        r = requests.post(f"{b.url}/v1/reconcile", timeout=TIMEOUT)
        assert r.status_code in (202, 409), (r.status_code, r.text)
        return r.json()["id"] if r.status_code == 202 else None

    rid = wait_for(post_b, 30, "B to take the lease A held")
    os.close(at_pause(fifo))  # B's own run passes the pause at once
    wait_for(lambda: requests.get(f"{b.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT)
             .json()["state"] != "running", 60, f"run {rid} to end")
    rep = report(b, rid)
    assert rep["state"] == "done", rep
    assert table_counts(rep) == (FILES, 0, FILES), rep["tables"]
    page = requests.get(f"{b.url}/v1/reconcile/runs/{rid}/blobs",
                        params={"action": "quarantined", "limit": 1000}, timeout=TIMEOUT).json()
    assert {x["sha256"] for x in page["blobs"]} == {sha(d) for d in unref}, page
    with requests.Session() as s:
        for d in refs:
            r = s.get(f"{b.url}/v1/blobs/{sha(d)}", timeout=TIMEOUT)
            assert r.status_code == 200 and r.content == d, (sha(d), r.status_code)
        for d in unref:
            assert s.get(f"{b.url}/v1/blobs/{sha(d)}", timeout=TIMEOUT).status_code == 410


def test_run_on_a_shown_on_b_with_phase_and_409_for_its_whole_run(shared_cluster, tmp_path,  # noqa
                                                                  monkeypatch):
    """While node A runs reconcile, node B lists that run (state running, its phase and progress)
    and answers it by id, and every POST /v1/reconcile to B from A's 202 to the end of A's run is
    409 naming A's run, the whole mark phase included (A waits on a FIFO after its mark)."""
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    monkeypatch.setenv("BLOBREF_TEST_RECONCILE_PAUSE", str(fifo))
    t, refs = referenced_table(tmp_path, "fv-ref")
    c = shared_cluster(2, extra=recon_extra(t))
    a, b = c.nodes
    upload_all(c.url, refs)
    r = requests.post(f"{a.url}/v1/reconcile", timeout=TIMEOUT)
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    answers, after, stop = [], [], threading.Event()

    def poll_b():
        """POSTs to B until told to stop or B accepts one, which is right only once A's run
        has ended (its report is stored before its lease is given back)."""
        with requests.Session() as s:
            while not stop.is_set():
                p = s.post(f"{b.url}/v1/reconcile", timeout=TIMEOUT)
                if p.status_code == 202:
                    after.append((p.json()["id"], report(b, rid)["state"]))
                    return
                answers.append((p.status_code, p.json().get("id")))

    poller = threading.Thread(target=poll_b)
    poller.start()
    fd = None
    try:
        fd = at_pause(fifo)
        run = requests.get(f"{b.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT)
        assert run.status_code == 200, run.text
        run = run.json()
        assert run["state"] == "running" and run["id"] == rid and run["phase"] == "mark", run
        assert run["progress"]["data_files"] == FILES, run
        assert run["progress"]["data_files_read"] == FILES, run
        listed = requests.get(f"{b.url}/v1/reconcile/runs", timeout=TIMEOUT).json()["runs"]
        assert listed and listed[0]["id"] == rid and listed[0]["state"] == "running", listed
        at_mark = len(answers)
        os.close(fd)
        fd = None
        wait_for(lambda: requests.get(f"{b.url}/v1/reconcile/runs/{rid}", timeout=TIMEOUT)
                 .json()["state"] != "running", 60, f"run {rid} to end")
    finally:
        if fd is not None:
            os.close(fd)  # the run goes on: the nodes can stop
        stop.set()
        poller.join()
    if after:  # B's own run, accepted once A's had ended: let it pass the pause and end
        [(rid_b, state_then)] = after
        assert state_then == "done", after
        os.close(at_pause(fifo))
        wait_for(lambda: requests.get(f"{b.url}/v1/reconcile/runs/{rid_b}", timeout=TIMEOUT)
                 .json()["state"] != "running", 60, f"run {rid_b} to end")
    assert at_mark > 0 and len(answers) > at_mark, answers
    assert all(a == (409, rid) for a in answers), [a for a in answers if a != (409, rid)][:5]
    assert report(b, rid)["state"] == "done"
    listed = requests.get(f"{b.url}/v1/reconcile/runs", timeout=TIMEOUT).json()["runs"]
    assert all(x["state"] == "done" for x in listed) and rid in [x["id"] for x in listed], listed


def test_final_delete_on_a_seen_by_b_within_the_bound(shared_cluster, tmp_path):
    """The last of issue 20's cache cases, a purge: B has served an unreferenced blob, then (once
    A's reconcile quarantined it) cached its quarantined record; A's run deletes it for good and
    B answers 404, not its cached 410, within the bound (1 s) of that run's end."""
    t, refs = referenced_table(tmp_path, "purge")
    extra = ("[reconcile]\ninterval = 0\ngrace = 1s\nretention = 1s\nmax_fraction = 1\n" +
             t.conf().replace("{", "{{").replace("}", "}}"))
    c = shared_cluster(2, extra, server="dedup_touch_interval = 0s")  # grace alone counts
    a, b = c.nodes
    upload_all(a.url, refs)
    lone = new_blob("purge-lone", 0)
    upload_all(a.url, [lone])
    h = sha(lone)
    with requests.Session() as s:
        got = s.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT)
        assert got.status_code == 200 and got.content == lone  # B caches it live

        def run_until(what):
            rep = report(a, run_to_end(a))
            assert rep["state"] == "done", rep
            return rep["blobs"][what] >= 1

        wait_for(lambda: run_until("quarantined"), 60, "a run to quarantine the lone blob",
                 step=0.2)
        wait_for(lambda: s.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 410,
                 1.0, "B's 410", step=0.005)
        assert s.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 410  # cached
        wait_for(lambda: run_until("deleted"), 60, "a run to delete it", step=0.2)
        t0 = time.monotonic()
        wait_for(lambda: s.get(f"{b.url}/v1/blobs/{h}", timeout=TIMEOUT).status_code == 404,
                 1.0, "B's 404 after the delete", step=0.005)
        print(f"\ndeleted by A's run: B answered 404 {(time.monotonic() - t0) * 1000:.1f} ms "
              "after the run's end")
        for d in refs:  # the referenced blobs are untouched
            assert s.head(f"{b.url}/v1/blobs/{sha(d)}", timeout=TIMEOUT).status_code == 200
