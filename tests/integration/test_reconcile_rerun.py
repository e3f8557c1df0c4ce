"""Reconcile's unchanged rerun: a run whose inputs are provably those of the last run (every data
file from the cache, the same files and settings, no index write since but the last run's own
changes, no grace or retention end passed) skips its sweep; each test changes one input between
runs and fails if the run skipped, or checks that a skipped run's counts are a full sweep's."""
import errno
import json
import os
import time

import pytest

from reconcile_util import Api, IceTable, blob, start

GRACE = 2.0
MARGIN = 0.5


def upload(api, data, tag, n):
    out = []
    for i in range(n):
        b = blob(tag, i)
        h = api.put(b)
        data[h] = b
        out.append(h)
    return out


def decided(rep):
    b = rep["blobs"]
    return b["quarantined"], b["restored"], b["deleted"]


@pytest.fixture
def settled(tmp_path):
    """A server whose table references every blob R, after a run that left a basis; stopped after
    the test."""
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace=f"{GRACE:g}s")
    api = Api(srv)
    data = {}
    R = upload(api, data, "R", 4)
    t.write_data({"f1.parquet": R[:2], "f2.parquet": R[2:]})
    t.append("f1.parquet")
    t.append("f2.parquet")
    rep = api.run()
    assert decided(rep) == (0, 0, 0) and rep["rerun_basis"], json.dumps(rep)
    assert rep["sweep_skipped"] is None
    yield t, srv, api, data, R
    srv.stop()


def test_unchanged_rerun_skips_the_sweep_with_the_same_counts(settled):
    t, srv, api, data, R = settled
    first = api.runs()[0]
    rep = api.run()
    assert rep["sweep_skipped"] and "unchanged since run" in rep["sweep_skipped"], rep
    for k in ("live", "marked", "held_referenced", "pending"):
        assert rep["blobs"][k] == first["blobs"][k], (k, rep["blobs"], first["blobs"])
    assert rep["references"] == first["references"] == len(R)
    for k in ("inputs", "index_seq", "until_ms"):  # carried on: still nothing changed
        assert rep["rerun_basis"][k] == first["rerun_basis"][k], (rep, first)
    # a full run reads every file: never skipped
    rep = api.run(full=True)
    assert rep["sweep_skipped"] is None


def test_upload_between_runs_sweeps(settled):
    t, srv, api, data, R = settled
    upload(api, data, "U", 2)
    time.sleep(GRACE + MARGIN)  # U past grace: only the index change says to sweep
    rep = api.run()
    assert rep["sweep_skipped"] is None and decided(rep) == (2, 0, 0), json.dumps(rep)


def test_grace_ending_between_runs_sweeps(settled):
    t, srv, api, data, R = settled
    U = upload(api, data, "U", 1)
    rep = api.run()  # U inside grace: pending, the basis ends when its grace does
    assert rep["blobs"]["pending"] == 1 and decided(rep) == (0, 0, 0), json.dumps(rep)
    until = rep["rerun_basis"]["until_ms"]
    rep = api.run()
    if rep["sweep_skipped"] is None:  # a loaded box: the grace may have ended already
        assert decided(rep) == (1, 0, 0), json.dumps(rep)
        return
    while time.time() * 1000 <= until + 1:
        time.sleep(0.05)
    rep = api.run()
    assert rep["sweep_skipped"] is None and decided(rep) == (1, 0, 0), json.dumps(rep)
    assert api.code(U[0]) == 410


def test_expired_snapshot_sweeps(settled):
    t, srv, api, data, R = settled
    time.sleep(GRACE + MARGIN)
    t.overwrite(remove=["f1.parquet"])
    t.expire(keep=1)  # f1's blobs referenced by nothing; the index is unchanged
    rep = api.run()
    assert rep["sweep_skipped"] is None and decided(rep) == (2, 0, 0), json.dumps(rep)


def test_admin_hold_and_restore_between_runs_sweep(settled):
    t, srv, api, data, R = settled
    assert api.delete(R[0], reason="hold").status_code == 200
    rep = api.run()
    assert rep["sweep_skipped"] is None and rep["blobs"]["held_referenced"] == 1, rep
    assert rep["held_referenced_blobs"] == [R[0]]
    rep = api.run()  # unchanged: skipped, the held blob still listed
    assert rep["sweep_skipped"] and rep["held_referenced_blobs"] == [R[0]], rep
    assert api.restore(R[0]).status_code == 200
    rep = api.run()
    assert rep["sweep_skipped"] is None and rep["blobs"]["held_referenced"] == 0, rep


COUNTS = ("live", "marked", "held_referenced", "pending")


def same_counts(rep, full):
    """rep's counts are those a full sweep (full, run just after with nothing changed) found."""
    for k in COUNTS:
        assert rep["blobs"][k] == full["blobs"][k], (k, rep["blobs"], full["blobs"])
    for k in ("references", "references_missing"):
        assert rep[k] == full[k], (k, rep, full)


def test_a_run_that_quarantined_leaves_a_basis_the_next_run_skips_on(settled):
    t, srv, api, data, R = settled
    U = upload(api, data, "U", 2)
    time.sleep(GRACE + MARGIN)
    rep = api.run()
    assert decided(rep) == (2, 0, 0) and rep["rerun_basis"], json.dumps(rep)
    basis = rep["rerun_basis"]
    assert basis["live"] == len(R) and basis["marked"] == len(R), basis  # after the changes
    assert rep["blobs"]["live"] == len(R) + 2  # as the sweep found them
    rep = api.run()
    assert rep["sweep_skipped"] and decided(rep) == (0, 0, 0), json.dumps(rep)
    assert rep["blobs"]["live"] == len(R), rep
    full = api.run(full=True)
    assert full["sweep_skipped"] is None and decided(full) == (0, 0, 0), json.dumps(full)
    same_counts(rep, full)
    # re-upload: U live again; the next run must see it (the index changed)
    for h in U:
        api.put(data[h])
    rep = api.run()
    assert rep["sweep_skipped"] is None and rep["blobs"]["live"] == len(R) + 2, rep


def test_a_run_that_restored_leaves_a_basis_with_the_restored_counted(settled):
    t, srv, api, data, R = settled
    U = upload(api, data, "U", 2)
    time.sleep(GRACE + MARGIN)
    assert decided(api.run()) == (2, 0, 0)
    t.write_data({"f3.parquet": U})
    t.append("f3.parquet")  # U referenced again: the next run restores them
    rep = api.run()
    assert decided(rep) == (0, 2, 0) and rep["rerun_basis"], json.dumps(rep)
    assert rep["rerun_basis"]["live"] == len(R) + 2, rep["rerun_basis"]
    rep = api.run()
    assert rep["sweep_skipped"] and rep["blobs"]["live"] == len(R) + 2, json.dumps(rep)
    assert rep["blobs"]["marked"] == len(R) + 2 and rep["references"] == len(R) + 2, rep
    same_counts(rep, api.run(full=True))
    assert all(api.code(h) == 200 for h in U)


def test_retention_of_what_a_run_quarantined_ends_its_basis(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s", retention="2s")
    try:
        api = Api(srv)
        data = {}
        R = upload(api, data, "R", 2)
        U = upload(api, data, "U", 1)
        t.write_data({"f1.parquet": R})
        t.append("f1.parquet")
        time.sleep(1 + MARGIN)
        rep = api.run()
        assert decided(rep) == (1, 0, 0) and rep["rerun_basis"], json.dumps(rep)
        until = rep["rerun_basis"]["until_ms"]
        assert until <= rep["rerun_basis"]["started_ms"] + 2000, rep["rerun_basis"]
        while time.time() * 1000 <= until + 1:
            time.sleep(0.05)
        rep = api.run()  # past U's retention: swept, U deleted for good
        assert rep["sweep_skipped"] is None and decided(rep) == (0, 0, 1), json.dumps(rep)
        assert api.code(U[0]) == 404
        assert rep["rerun_basis"], json.dumps(rep)  # every delete done, nothing else written
        rep = api.run()
        assert rep["sweep_skipped"], json.dumps(rep)
        same_counts(rep, api.run(full=True))
    finally:
        srv.stop()


def at_pause(fifo, timeout=60):
    """Waits until a run reached the FIFO's pause (it opened it for reading); returns the
    writer's fd, whose close lets the run go on."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            assert e.errno == errno.ENXIO and time.monotonic() < deadline, e
            time.sleep(0.02)


@pytest.fixture
def paused(tmp_path, monkeypatch):
    """A server whose runs each wait between sweep and apply (BLOBREF_TEST_RECONCILE_PAUSE_APPLY)
    and a run(during) that does `during` there; its table references R, two more blobs U are
    past grace and unreferenced, after a first run that quarantined nothing."""
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    monkeypatch.setenv("BLOBREF_TEST_RECONCILE_PAUSE_APPLY", str(fifo))
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace=f"{GRACE:g}s")
    api = Api(srv)

    def run(during=None, **kw):
        r = api.start_run(**kw)
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        fd = at_pause(fifo)
        try:
            if during:
                during()
        finally:
            os.close(fd)
        rep = api.wait(rid)
        assert rep["state"] == "done", json.dumps(rep)
        return rep

    data = {}
    R = upload(api, data, "R", 2)
    t.write_data({"f1.parquet": R})
    t.append("f1.parquet")
    U = upload(api, data, "U", 2)
    time.sleep(GRACE + MARGIN)
    yield api, run, R, U
    srv.stop()


def test_a_write_between_sweep_and_apply_leaves_no_basis(paused):
    api, run, R, U = paused

    def hold():
        r = api.delete(R[0], reason="hold")
        assert r.status_code == 200, r.text

    rep = run(during=hold)  # the sweep saw R[0] live; the hold commits after it
    assert decided(rep) == (2, 0, 0) and rep["blobs"]["held_referenced"] == 0, json.dumps(rep)
    assert rep["rerun_basis"] is None, json.dumps(rep)
    rep = run()
    assert rep["sweep_skipped"] is None and rep["blobs"]["held_referenced"] == 1, json.dumps(rep)


def test_a_decision_a_lease_stopped_leaves_no_basis(paused):
    api, run, R, U = paused
    r = api.s.post(f"{api.url}/v1/leases", json={"ttl": "1h", "name": "late"}, timeout=30)
    assert r.status_code == 201, r.text
    lease = r.json()["id"]

    def attach():
        r = api.s.post(f"{api.url}/v1/lookup", params={"lease": lease},
                       json={"hashes": [U[0]]}, timeout=30)
        assert r.status_code == 200 and [f["sha256"] for f in r.json()["found"]] == [U[0]], r.text

    rep = run(during=attach)  # decided before the lease; the lease wins at apply
    assert decided(rep) == (1, 0, 0) and rep["rerun_basis"] is None, json.dumps(rep)
    assert api.code(U[0]) == 200 and api.code(U[1]) == 410
    rep = run()
    assert rep["sweep_skipped"] is None and rep["blobs"]["pending"] == 1, json.dumps(rep)
