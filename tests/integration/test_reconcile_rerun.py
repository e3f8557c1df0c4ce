"""Reconcile's unchanged rerun: a run whose inputs are provably those of the last run (every data
file from the cache, the same files and settings, no index write since, no grace or retention end
passed) skips its sweep; each test changes one input between runs and fails if the run skipped."""
import json
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


def test_a_run_that_decided_something_leaves_no_basis(settled):
    t, srv, api, data, R = settled
    U = upload(api, data, "U", 2)
    time.sleep(GRACE + MARGIN)
    rep = api.run()
    assert decided(rep) == (2, 0, 0) and rep["rerun_basis"] is None, json.dumps(rep)
    # re-upload: U live again; the next run must see it (no basis, and the index changed)
    for h in U:
        api.put(data[h])
    rep = api.run()
    assert rep["sweep_skipped"] is None and rep["blobs"]["live"] == len(R) + 2, rep
