"""Reconcile (issue 7) against real Iceberg tables written here (DuckDB Parquet, avsc manifests):
exactly the right blobs are quarantined, restored and purged (PRODUCT.md invariants 3-6); runs
fail closed; hex, binary and url forms and several tables; max_fraction; dry runs; admin holds
and restores; one run at a time; the incremental data-file cache; reports across restarts;
manifest counts. Timings use grace/retention of about a second; every test stays a few seconds."""
import hashlib
import json
import os
import re
import time

import pytest
import requests

from conftest import BIN_DIR, Server
from reconcile_util import Api, IceTable, blob, blob_path, cli, recon_conf, sha, start

GRACE = 1.0      # seconds, as configured ("1s")
MARGIN = 0.3     # slack added to every wait past grace or retention


def upload(api, data, tag, n, size=None):
    """Uploads n new blobs; returns their hashes (and records the bytes in data)."""
    out = []
    for i in range(n):
        b = blob(tag, i, size)
        h = api.put(b)
        data[h] = b
        out.append(h)
    return out


def wait_until(t):
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)


def check(api, data, live=(), quarantined=(), gone=(), reason=None):
    """live: GET 200 with the exact bytes; quarantined: 410 `quarantined` (reason in the
    message); gone: 404 (and the meta too)."""
    bad = []
    for h in live:
        r = api.get(h)
        if r.status_code != 200 or r.content != data[h]:
            bad.append(f"{h[:12]} expected live, got {r.status_code} {r.text[:120]!r}")
    for h in quarantined:
        r = api.get(h)
        if r.status_code != 410 or r.json()["error"]["code"] != "quarantined" or \
                (reason and reason not in r.json()["error"]["message"]):
            bad.append(f"{h[:12]} expected quarantined, got {r.status_code} {r.text[:120]!r}")
        hd = requests.head(f"{api.url}/v1/blobs/{h}", timeout=30,
                           headers=api.s.headers)
        if hd.status_code != 410:
            bad.append(f"{h[:12]} HEAD expected 410, got {hd.status_code}")
    for h in gone:
        r = api.get(h)
        m = api.meta(h)
        if r.status_code != 404 or m.status_code != 404:
            bad.append(f"{h[:12]} expected gone, got GET {r.status_code} meta {m.status_code}")
    assert not bad, "\n".join(bad)


def counts(rep):
    b = rep["blobs"]
    return (b["quarantined"], b["restored"], b["deleted"])


REPORT_KEYS = {"id", "state", "dry_run", "force", "full", "started_at", "finished_at", "tables",
               "references", "blobs", "bytes_reclaimed", "refused", "phases", "errors",
               "held_referenced_blobs"}
TABLE_KEYS = {"name", "snapshots", "manifests", "data_files", "data_files_read",
              "data_files_cached", "values"}
BLOB_KEYS = {"live", "marked", "quarantined", "restored", "deleted", "held_referenced"}


def check_shape(rep):
    missing = REPORT_KEYS - set(rep)
    assert not missing, f"report lacks {missing}: {rep}"
    assert BLOB_KEYS <= set(rep["blobs"]), rep["blobs"]
    for t in rep["tables"]:
        assert TABLE_KEYS <= set(t), t
        assert t["data_files_read"] + t["data_files_cached"] == t["data_files"], t
    assert {"mark_ms", "sweep_ms", "delete_ms"} <= set(rep["phases"]), rep["phases"]
    assert all(isinstance(v, (int, float)) and v >= 0 for v in rep["phases"].values())
    assert isinstance(rep["errors"], list)
    assert rep["refused"] is None or isinstance(rep["refused"], str)


def quarantine_meta(api, h):
    m = api.meta(h)
    assert m.status_code == 200, m.text
    return m.json()


# ---- 1. exactly the right blobs: quarantined, restored, purged -------------------------------

def test_quarantine_restore_purge_lifecycle(tmp_path):
    """Snapshots: S1 append f1(A) fx(X); S2 append f2(B); S3 overwrite fx -> f4(E); S4 a row
    delete on f1 (delete files are ignored: A stays referenced). C is uploaded but referenced
    only later (S5); D never. Run 1 quarantines exactly C and D (F, uploaded inside grace, is
    left alone); then S5 appends f3(C) and S1, S2 expire (X unreferenced); run 2 restores C,
    quarantines X and deletes D (past retention); run 3 deletes what is left of X."""
    t = IceTable(tmp_path / "images")
    srv = start(tmp_path, t, grace="1s", retention="1s")
    api = Api(srv)
    try:
        data = {}
        A = upload(api, data, "A", 4)
        B = upload(api, data, "B", 3)
        X = upload(api, data, "X", 3)
        E = upload(api, data, "E", 2)
        C = upload(api, data, "C", 3)
        D = upload(api, data, "D", 4)
        t0 = time.monotonic()  # after the last upload, however long they took under load
        N = sha(b"referenced but never uploaded")
        t.write_data({"f1.parquet": A + [N], "f2.parquet": B, "fx.parquet": X, "f4.parquet": E,
                      "f3.parquet": C})
        t.append("f1.parquet", "fx.parquet")
        t.append("f2.parquet")
        t.overwrite(remove=["fx.parquet"], add=["f4.parquet"])
        t.delete_rows("f1.parquet")
        assert t.referenced() == set(A + B + X + E + [N])
        wait_until(t0 + GRACE + MARGIN)
        F = upload(api, data, "F", 2)  # inside grace: never quarantined by this run

        rep1 = api.run()
        check_shape(rep1)
        assert counts(rep1) == (len(C + D), 0, 0), json.dumps(rep1)
        assert rep1["blobs"]["live"] == len(data)
        assert rep1["references"] == len(t.referenced())
        assert rep1["blobs"]["marked"] == len(A + B + X + E)
        assert rep1["bytes_reclaimed"] == 0 and rep1["errors"] == [] and rep1["refused"] is None
        assert rep1["dry_run"] is False and rep1["force"] is False and rep1["full"] is False
        [tr] = rep1["tables"]
        assert tr["name"] == "images" and tr["snapshots"] == 4
        assert tr["data_files"] == 4 and tr["data_files_read"] == 4, tr
        check(api, data, live=A + B + X + E + F, quarantined=C + D, reason="unreferenced")
        q = quarantine_meta(api, C[0])
        assert q["state"] == "quarantined" and q["quarantine"]["by"] == "reconcile"
        assert "unreferenced" in q["quarantine"]["reason"] and q["quarantine"]["at"]
        assert quarantine_meta(api, A[0])["state"] == "live"
        t1 = time.monotonic()

        t.append("f3.parquet")
        t.expire(keep=3)  # S3, S4, S5 stay: fx (X) is in none of them
        assert t.referenced() == set(A + B + E + C + [N])
        wait_until(t1 + 1.0 + MARGIN)  # D is past retention
        assert api.put(data[F[0]]) == F[0]  # dedup hits: a fresh grace for F
        assert api.put(data[F[1]]) == F[1]
        rep2 = api.run()
        assert counts(rep2) == (len(X), len(C), len(D)), json.dumps(rep2)
        assert rep2["bytes_reclaimed"] == sum(len(data[h]) for h in D)
        assert rep2["tables"][0]["snapshots"] == 3
        check(api, data, live=A + B + E + C + F, quarantined=X, gone=D)
        for h in D:
            assert not blob_path(srv, h).exists(), "deleted blob's file is still in the store"
        for h in C:
            assert quarantine_meta(api, h)["state"] == "live"
            assert "quarantine" not in quarantine_meta(api, h)
        t2 = time.monotonic()

        # A re-upload of a blob quarantined by reconcile makes it live again (PUT and POST).
        r = api.s.put(f"{api.url}/v1/blobs/{X[0]}", data=data[X[0]], timeout=30)
        assert r.status_code in (200, 201), r.text
        r = api.post(data[X[1]])
        assert r.status_code in (200, 201) and r.json()["sha256"] == X[1], r.text
        check(api, data, live=X[:2], quarantined=X[2:])

        wait_until(t2 + 1.0 + MARGIN)
        G = upload(api, data, "G", 2)  # inside grace again
        rep3 = api.run()
        # X[2] past retention -> deleted; X[0], X[1], F: unreferenced and their last upload is
        # older than grace now -> quarantined; G inside grace.
        assert counts(rep3) == (len(X[:2] + F), 0, 1), json.dumps(rep3)
        check(api, data, live=A + B + E + C + G, quarantined=X[:2] + F, gone=X[2:])
        assert rep3["tables"][0]["data_files_read"] == 0  # nothing new since run 2

        ids = [r["id"] for r in api.runs()]
        assert ids == sorted(ids, reverse=True) and ids[:3] == [rep3["id"], rep2["id"], rep1["id"]]
        m = api.metrics()
        assert m.get('blobref_reconcile_runs_total{result="done"}') == 3, m
        assert m.get('blobref_reconcile_runs_total{result="failed"}', 0) == 0
        assert m.get("blobref_reconcile_last_quarantined") == len(X[:2] + F)
        assert m.get("blobref_reconcile_last_deleted") == 1
        assert m.get("blobref_reconcile_last_restored") == 0
        assert m.get("blobref_reconcile_last_marked") == rep3["blobs"]["marked"]
        assert "blobref_reconcile_last_duration_seconds" in m
    finally:
        srv.stop()


def test_dedup_hit_within_grace_protects_with_a_longer_touch_interval(tmp_path):
    """Invariant 6 when grace (1 s) is shorter than dedup_touch_interval (2 s): a dedup hit that
    did not refresh last_upload_at (refreshed less than the interval ago) must still protect the
    blob for grace. Run A, 1.5 s after the uploads and right after dedup hits on `hit`, may
    quarantine nothing; run B, 3.3 s after, quarantines `ctl` (no hit since) but not `hit`, hit
    again just before (that hit refreshes: the last one is 2 s old)."""
    t = IceTable(tmp_path / "t")
    t.write_data({"a.parquet": [sha(b"something else")]})
    t.append("a.parquet")
    srv = start(tmp_path, t, grace="1s", server_extra="dedup_touch_interval = 2s\n")
    api = Api(srv)
    try:
        data = {}
        ctl = upload(api, data, "ctl", 3)
        t0 = time.monotonic()  # after ctl's uploads, however long they took: ctl is >= 3.3 s old at B
        hit = upload(api, data, "hit", 2)
        wait_until(t0 + 1.5)
        for h in hit:
            assert api.put(data[h]) == h
        rep = api.run()
        assert counts(rep) == (0, 0, 0), json.dumps(rep)
        check(api, data, live=ctl + hit)
        wait_until(t0 + 3.3)
        for h in hit:
            assert api.put(data[h]) == h
        rep = api.run()
        assert counts(rep) == (len(ctl), 0, 0), json.dumps(rep)
        check(api, data, live=hit, quarantined=ctl)
    finally:
        srv.stop()


# ---- 2. fail closed ------------------------------------------------------------------------

def test_fail_closed(tmp_path):
    """With any table file missing or damaged the run fails, names the file and changes nothing:
    an unreferenced old blob stays live, a quarantined blob past retention is not deleted, a
    quarantined blob referenced again is not restored. Once repaired, the run does all three."""
    t = IceTable(tmp_path / "events")
    other = IceTable(tmp_path / "other")  # a second, healthy table
    srv = start(tmp_path, t, other, grace="1s", retention="1s")
    api = Api(srv)
    try:
        data = {}
        R1 = upload(api, data, "R1", 3)
        R2 = upload(api, data, "R2", 3)
        Q = upload(api, data, "Q", 2)   # quarantined, then referenced again (S3)
        P = upload(api, data, "P", 2)   # quarantined, never referenced: deleted once repaired
        O = upload(api, data, "O", 2)
        t0 = time.monotonic()
        t.write_data({"f1.parquet": R1, "f2.parquet": R2, "f3.parquet": Q})
        t.append("f1.parquet")
        t.append("f2.parquet")
        other.write_data({"o.parquet": O})
        other.append("o.parquet")
        wait_until(t0 + GRACE + MARGIN)
        rep = api.run()
        assert counts(rep) == (len(Q + P), 0, 0), json.dumps(rep)
        U = upload(api, data, "U", 2)   # live, unreferenced: quarantined once repaired
        t.append("f3.parquet")          # uncached: the damaged-data-file cases read it
        t1 = time.monotonic()
        wait_until(t1 + max(GRACE, 1.0) + MARGIN)
        md = t.root / "metadata"
        snap2_list = md / "snap-2-events.avro"
        m_f2 = md / t.snapshots[1]["manifests"][-1]
        newest = md / f"v{t.meta_version}.metadata.json"

        def move(p):
            def damage():
                p.rename(p.with_name(p.name + ".away"))
                return lambda: p.with_name(p.name + ".away").rename(p)
            return damage

        def truncate(p, keep):
            def damage():
                raw = p.read_bytes()
                p.write_bytes(raw[:keep(len(raw))])
                return lambda: p.write_bytes(raw)
            return damage

        def garbage(p):
            def damage():
                raw = p.read_bytes()
                p.write_bytes(b"PAR1" + os.urandom(len(raw) - 8) + b"PAR1")
                return lambda: p.write_bytes(raw)
            return damage

        def unreadable(p):  # (root reads any file: a directory in its place cannot be read)
            def damage():
                p.rename(p.with_name(p.name + ".away"))
                p.mkdir()
                (p / "x").write_bytes(b"not a file")

                def undo():
                    (p / "x").unlink()
                    p.rmdir()
                    p.with_name(p.name + ".away").rename(p)
                return undo
            return damage

        def all_metadata_away():
            moved = []
            for p in md.glob("*.metadata.json"):
                p.rename(p.with_name(p.name + ".away"))
                moved.append(p)
            hint = md / "version-hint.text"
            hint.rename(md / "hint.away")

            def undo():
                for p in moved:
                    p.with_name(p.name + ".away").rename(p)
                (md / "hint.away").rename(hint)
            return undo

        def hint_to_missing():
            hint = md / "version-hint.text"
            raw = hint.read_text()
            newest.rename(newest.with_name(newest.name + ".away"))

            def undo():
                newest.with_name(newest.name + ".away").rename(newest)
                hint.write_text(raw)
            return undo

        cases = [
            ("missing data file", move(t.data_path("f3.parquet")), "f3.parquet"),
            ("truncated Parquet", truncate(t.data_path("f3.parquet"), lambda n: n - 30), "f3.parquet"),
            ("Parquet cut in the middle", truncate(t.data_path("f3.parquet"), lambda n: n // 2),
             "f3.parquet"),
            ("garbage Parquet", garbage(t.data_path("f3.parquet")), "f3.parquet"),
            ("unreadable data file", unreadable(t.data_path("f3.parquet")), "f3.parquet"),
            ("missing manifest", move(m_f2), m_f2.name),
            ("unreadable manifest", unreadable(m_f2), m_f2.name),
            ("truncated manifest", truncate(m_f2, lambda n: n - 5), m_f2.name),
            ("manifest cut to its header", truncate(m_f2, lambda n: n // 3), m_f2.name),
            ("missing manifest list (retained snapshot)", move(snap2_list), snap2_list.name),
            ("truncated metadata.json", truncate(newest, lambda n: n // 2), newest.name),
            ("no metadata at all", all_metadata_away, "events"),
            ("version-hint names a missing metadata file", hint_to_missing, "metadata"),
            ("table folder gone", move(t.root), "events"),
        ]
        failures = []
        done_before = api.metrics().get('blobref_reconcile_runs_total{result="done"}', 0)
        for name, damage, needle in cases:
            undo = damage()
            try:
                rep = api.run(expect_state=None)
                problems = []
                if rep["state"] != "failed":
                    problems.append(f"state {rep['state']}")
                if counts(rep) != (0, 0, 0):
                    problems.append(f"counts {counts(rep)}")
                if not rep["errors"] or not any(needle in e for e in rep["errors"]):
                    problems.append(f"errors do not name {needle}: {rep['errors']}")
                try:
                    check(api, data, live=R1 + R2 + O + U, quarantined=Q + P)
                except AssertionError as e:
                    problems.append(f"blobs changed: {e}")
                if problems:
                    failures.append(f"{name}: " + "; ".join(problems))
            finally:
                undo()
        assert not failures, "\n".join(failures)
        m = api.metrics()
        assert m.get('blobref_reconcile_runs_total{result="failed"}') == len(cases)
        assert m.get('blobref_reconcile_runs_total{result="done"}') == done_before
        # Repaired: the same run now does everything at once.
        rep = api.run()
        assert counts(rep) == (len(U), len(Q), len(P)), json.dumps(rep)
        check(api, data, live=R1 + R2 + O + Q, quarantined=U, gone=P)
    finally:
        srv.stop()


def test_fail_closed_full_rereads_cached_files(tmp_path):
    """full=1 reads every data file again: a cached data file that is now damaged fails the run."""
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)
    try:
        data = {}
        R = upload(api, data, "R", 3)
        t.write_data({"f1.parquet": R})
        t.append("f1.parquet")
        rep = api.run()
        assert rep["tables"][0]["data_files_read"] == 1
        U = upload(api, data, "U", 2)
        time.sleep(GRACE + MARGIN)
        p = t.data_path("f1.parquet")
        raw = p.read_bytes()
        p.write_bytes(raw[:-20])
        rep = api.run(expect_state="failed", full=True)
        assert counts(rep) == (0, 0, 0) and any("f1.parquet" in e for e in rep["errors"]), rep
        check(api, data, live=R + U)
        p.write_bytes(raw)
        rep = api.run(full=True)
        assert counts(rep) == (len(U), 0, 0)
        assert rep["full"] is True and rep["tables"][0]["data_files_read"] == 1
    finally:
        srv.stop()


# ---- 3. forms and several tables -----------------------------------------------------------

def test_forms_and_tables_sharing_blobs(tmp_path):
    """A hex, a binary and a url table; S is referenced by the hex and the binary table, O only by
    the binary one. When the binary table drops the file holding S and O, O is quarantined, S is
    not (the hex table still references it)."""
    th = IceTable(tmp_path / "hex_t", form="hex")
    tb = IceTable(tmp_path / "bin_t", form="binary", column="digest")
    tu = IceTable(tmp_path / "url_t", form="url", column="image_url", version=1)
    srv = start(tmp_path, th, tb, tu, grace="1s")
    api = Api(srv)
    try:
        data = {}
        A = upload(api, data, "A", 4)
        B = upload(api, data, "B", 4)
        C = upload(api, data, "C", 4)
        S = upload(api, data, "S", 2)
        O = upload(api, data, "O", 2)
        U = upload(api, data, "U", 3)
        t0 = time.monotonic()  # after the last upload
        th.write_data({"h1.parquet": A, "h2.parquet": S})
        th.append("h1.parquet")
        th.append("h2.parquet")
        tb.write_data({"b1.parquet": B, "b2.parquet": S + O})
        tb.append("b1.parquet", "b2.parquet")
        tu.write_data({"u1.parquet": C[:2], "u2.parquet": C[2:]})
        tu.append("u1.parquet")
        tu.append("u2.parquet")
        wait_until(t0 + GRACE + MARGIN)
        rep = api.run()
        assert counts(rep) == (len(U), 0, 0), json.dumps(rep)
        assert sorted(x["name"] for x in rep["tables"]) == ["bin_t", "hex_t", "url_t"]
        assert rep["references"] == len(set(A + B + C + S + O))
        assert rep["blobs"]["marked"] == len(set(A + B + C + S + O))
        check(api, data, live=A + B + C + S + O, quarantined=U)

        tb.overwrite(remove=["b2.parquet"])
        tb.expire(keep=1)
        rep = api.run()
        assert counts(rep) == (len(O), 0, 0), json.dumps(rep)
        check(api, data, live=A + B + C + S, quarantined=U + O)
    finally:
        srv.stop()


# ---- 4. max_fraction -----------------------------------------------------------------------

def test_max_fraction_refuses_unless_forced(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s", max_fraction="0.5")
    api = Api(srv)
    try:
        data = {}
        R = upload(api, data, "R", 4)
        U = upload(api, data, "U", 6)
        t.write_data({"f.parquet": R})
        t.append("f.parquet")
        time.sleep(GRACE + MARGIN)
        rep = api.run()
        assert counts(rep) == (0, 0, 0), json.dumps(rep)
        assert isinstance(rep["refused"], str) and "6" in rep["refused"] and "10" in rep["refused"], \
            rep["refused"]
        check(api, data, live=R + U)
        rep = api.run(dry_run=True, force=True)
        assert counts(rep) == (6, 0, 0) and rep["refused"] is None and rep["force"] is True
        check(api, data, live=R + U)
        rep = api.run(force=True)
        assert counts(rep) == (6, 0, 0) and rep["refused"] is None, json.dumps(rep)
        check(api, data, live=R, quarantined=U)
        # Exactly at the fraction is not over it: 4 of 8 live blobs with max_fraction 0.5.
        V = upload(api, data, "V", 4)
        time.sleep(GRACE + MARGIN)
        rep = api.run()
        assert rep["blobs"]["live"] == 8
        assert counts(rep) == (4, 0, 0) and rep["refused"] is None, json.dumps(rep)
        check(api, data, live=R, quarantined=U + V)
    finally:
        srv.stop()


# ---- 5. dry run ----------------------------------------------------------------------------

def test_dry_run_changes_nothing_and_predicts_the_real_run(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s", retention="1s")
    api = Api(srv)
    try:
        data = {}
        R = upload(api, data, "R", 3)
        Q = upload(api, data, "Q", 2)  # quarantined, then referenced again: restored
        D = upload(api, data, "D", 2)  # quarantined, past retention: deleted
        H = upload(api, data, "H", 1)  # held by an admin while referenced
        t0 = time.monotonic()
        t.write_data({"f1.parquet": R + H, "f2.parquet": Q})
        t.append("f1.parquet")
        wait_until(t0 + GRACE + MARGIN)
        rep0 = api.run()
        assert counts(rep0) == (len(Q + D), 0, 0), json.dumps(rep0)
        U = upload(api, data, "U", 3)  # quarantined by the next (real) run
        assert api.delete(H[0], reason="legal hold").status_code == 200
        t.append("f2.parquet")
        t1 = time.monotonic()
        wait_until(t1 + max(GRACE, 1.0) + MARGIN)
        before = {h: api.meta(h).json() for h in data}

        p = cli(srv, "reconcile", "--dry-run", "--wait")
        assert p.returncode == 0, p.stderr
        rid = int(re.search(r"\d+", p.stdout).group())
        dry = api.report(rid)
        assert dry["dry_run"] is True and dry["state"] == "done"
        assert counts(dry) == (len(U), len(Q), len(D)), json.dumps(dry)
        assert dry["bytes_reclaimed"] == sum(len(data[h]) for h in D)
        assert dry["blobs"]["held_referenced"] == 1 and dry["held_referenced_blobs"] == H
        after = {h: api.meta(h).json() for h in data}
        assert after == before, "a dry run changed records"
        check(api, data, live=R + U, quarantined=Q + D + H)
        for h in D:
            assert blob_path(srv, h).exists()

        real = api.run()
        for k in ("quarantined", "restored", "deleted", "held_referenced", "live", "marked"):
            assert real["blobs"][k] == dry["blobs"][k], (k, real["blobs"], dry["blobs"])
        assert real["bytes_reclaimed"] == dry["bytes_reclaimed"]
        assert real["references"] == dry["references"]
        assert real["held_referenced_blobs"] == dry["held_referenced_blobs"]
        check(api, data, live=R + Q, quarantined=U + H, gone=D)
    finally:
        srv.stop()


# ---- 6. admin holds, auth, one run at a time -----------------------------------------------

def test_admin_delete_and_restore(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s", retention="1s")
    api = Api(srv)
    try:
        data = {}
        R = upload(api, data, "R", 3)
        L = upload(api, data, "L", 2)  # held while unreferenced: deleted after retention
        t.write_data({"f.parquet": R})
        t.append("f.parquet")
        r = api.delete(R[0], reason="legal hold 42")
        assert r.status_code == 200, r.text
        m = r.json()
        assert m["sha256"] == R[0] and m["state"] == "quarantined"
        assert m["quarantine"]["by"] == "admin" and m["quarantine"]["reason"] == "legal hold 42"
        assert m == api.meta(R[0]).json()
        check(api, data, live=R[1:] + L, quarantined=[R[0]], reason="legal hold 42")
        assert api.delete(L[0]).status_code == 200
        assert api.delete(L[1], reason="x").status_code == 200
        # Unknown blobs: 404; a bad hash: 400.
        unknown = sha(b"never uploaded")
        assert api.delete(unknown).status_code == 404
        assert api.restore(unknown).status_code == 404
        assert api.delete("nothex").status_code == 400
        # A re-upload of a held blob is refused (410) and leaves it held.
        r = api.s.put(f"{api.url}/v1/blobs/{R[0]}", data=data[R[0]], timeout=30)
        assert r.status_code == 410 and r.json()["error"]["code"] == "quarantined", r.text
        r = api.post(data[R[0]])
        assert r.status_code == 410 and "by an admin" in r.json()["error"]["message"], r.text
        check(api, data, quarantined=[R[0]])
        assert api.meta(R[0]).json()["quarantine"]["by"] == "admin"
        t0 = time.monotonic()

        wait_until(t0 + 1.0 + MARGIN)
        rep = api.run()
        # R[0]: referenced but held -> stays held, listed; L: held, unreferenced, past retention
        assert rep["blobs"]["held_referenced"] == 1 and rep["held_referenced_blobs"] == [R[0]]
        assert counts(rep) == (0, 0, len(L)), json.dumps(rep)
        check(api, data, live=R[1:], quarantined=[R[0]], gone=L)

        r = api.restore(R[0])
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "live" and "quarantine" not in r.json()
        check(api, data, live=R)
        # Restoring gives a fresh grace: an old, unreferenced, held-then-restored blob survives
        # the run right after.
        V = upload(api, data, "V", 1)
        assert api.delete(V[0]).status_code == 200
        time.sleep(GRACE + MARGIN)
        assert api.restore(V[0]).status_code == 200
        rep = api.run()
        assert counts(rep) == (0, 0, 0), json.dumps(rep)
        check(api, data, live=R + V)
        # The CLI restore.
        assert api.delete(V[0]).status_code == 200
        p = cli(srv, "restore", V[0])
        assert p.returncode == 0, p.stderr
        check(api, data, live=V)
    finally:
        srv.stop()


def test_admin_scope_required(tmp_path):
    admin, rw = "br_admin_token_for_tests", "br_rw_token_for_tests"
    tokens = "".join(f"[token {n}]\nsha256 = {hashlib.sha256(v.encode()).hexdigest()}\n"
                     f"scopes = {s}\n" for n, v, s in [("ops", admin, "admin"),
                                                     ("pipeline", rw, "read, write")])
    t = IceTable(tmp_path / "t")
    t.write_data({"f.parquet": [sha(b"x")]})
    t.append("f.parquet")
    srv = start(tmp_path, t, extra="[auth]\nanonymous = read\n" + tokens)
    try:
        a, w, anon = Api(srv, admin), Api(srv, rw), Api(srv)
        h = w.put(b"pipeline blob")
        for who, code in ((w, 403), (anon, 401)):
            r = who.start_run()
            assert r.status_code == code, r.text
            assert r.json()["error"]["code"] == ("forbidden" if code == 403 else "unauthorized")
            assert who.delete(h).status_code == code
            assert who.restore(h).status_code == code
        assert w.get(h).status_code == 200
        assert a.delete(h).status_code == 200
        assert w.get(h).status_code == 410
        assert a.restore(h).status_code == 200
        rep = a.run()
        assert rep["state"] == "done"
        p = cli(srv, "reconcile", "--wait")
        assert p.returncode != 0
        p = cli(srv, "reconcile", "--wait", token=rw)
        assert p.returncode != 0 and p.stderr.strip()
        p = cli(srv, "reconcile", "--wait", token=admin)
        assert p.returncode == 0, p.stderr
    finally:
        srv.stop()


class Fifo:
    """A named pipe standing in for a data file: a run that opens it blocks until release()."""

    def __init__(self, path):
        self.path = path
        os.mkfifo(path)

    def release(self, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
                return True
            except OSError:  # ENXIO: nobody has it open for reading (yet)
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.02)


def test_one_run_at_a_time(tmp_path):
    """A run held in its mark phase (a data file that is a FIFO nobody writes): a second POST is
    409 reconcile_running with the running run's id; the blocked run then fails closed."""
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)
    fifo = None
    try:
        data = {}
        R = upload(api, data, "R", 2)
        U = upload(api, data, "U", 2)
        t.write_data({"f.parquet": R, "slow.parquet": []})
        t.append("f.parquet")
        t.append("slow.parquet")
        t.data_path("slow.parquet").unlink()
        fifo = Fifo(t.data_path("slow.parquet"))
        time.sleep(GRACE + MARGIN)
        r = api.start_run()
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        time.sleep(0.2)
        for params in ({}, {"dry_run": True}, {"full": True}):
            r2 = api.start_run(**params)
            assert r2.status_code == 409, r2.text
            body = r2.json()
            assert body["error"]["code"] == "reconcile_running", body
            assert body["error"]["message"] == f"run {rid} is running", body
            assert body["id"] == rid, body
        assert api.report(rid)["state"] == "running"
        assert api.runs()[0]["id"] == rid and api.runs()[0]["state"] == "running"
        p = cli(srv, "reconcile")
        assert p.returncode != 0 and str(rid) in p.stderr, (p.stdout, p.stderr)
        check(api, data, live=R + U)  # serving goes on
        assert fifo.release()
        rep = api.wait(rid)
        assert rep["state"] == "failed" and counts(rep) == (0, 0, 0), json.dumps(rep)
        assert any("slow.parquet" in e for e in rep["errors"]), rep["errors"]
        check(api, data, live=R + U)
        os.unlink(t.data_path("slow.parquet"))
        t.write_data({"slow.parquet": []})
        p = cli(srv, "reconcile", "--wait")
        assert p.returncode == 0, p.stderr
        check(api, data, live=R, quarantined=U)
    finally:
        if fifo:
            fifo.release(timeout=0.5)
        srv.stop()


def test_cli_reconcile_wait_failed_exit_1(tmp_path):
    t = IceTable(tmp_path / "t")
    t.write_data({"f.parquet": [sha(b"x")]})
    t.append("f.parquet")
    t.data_path("f.parquet").unlink()
    srv = start(tmp_path, t)
    try:
        p = cli(srv, "reconcile", "--wait")
        assert p.returncode == 1, (p.stdout, p.stderr)
        assert "f.parquet" in p.stdout + p.stderr
        p = cli(srv, "reconcile")  # without --wait: prints the id, exit 0
        assert p.returncode == 0 and re.search(r"\d+", p.stdout), (p.stdout, p.stderr)
    finally:
        srv.stop()


# ---- 7. incremental --------------------------------------------------------------------------

def test_incremental_cache(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)
    try:
        data = {}
        H = {i: upload(api, data, f"f{i}", 3) for i in range(1, 6)}
        t.write_data({f"f{i}.parquet": H[i] for i in range(1, 6)})
        t.append("f1.parquet", "f2.parquet")
        t.append("f3.parquet")

        def table(rep):
            [x] = rep["tables"]
            return x["data_files"], x["data_files_read"], x["data_files_cached"]

        rep = api.run()
        assert table(rep) == (3, 3, 0)
        rep = api.run()
        assert table(rep) == (3, 0, 3), rep["tables"]
        assert rep["references"] == 9
        t.append("f4.parquet", "f5.parquet")
        rep = api.run()
        assert table(rep) == (5, 2, 3), rep["tables"]
        rep = api.run(full=True)
        assert table(rep) == (5, 5, 0) and rep["full"] is True, rep["tables"]
        rep = api.run()
        assert table(rep) == (5, 0, 5)
        H[6] = upload(api, data, "f6", 3)
        time.sleep(GRACE + MARGIN)
        # f6's blobs are unreferenced.
        rep = api.run()
        assert counts(rep) == (3, 0, 0)
        check(api, data, quarantined=H[6])
        # Overwrite f1 away and expire the snapshots that still list it: f1's blobs are referenced
        # by nothing now although the cache knows f1.
        t.overwrite(remove=["f1.parquet"])
        rep = api.run()
        assert counts(rep) == (0, 0, 0) and table(rep) == (5, 0, 5)
        t.expire(keep=1)
        rep = api.run()
        assert table(rep) == (4, 0, 4)
        assert counts(rep) == (3, 0, 0), json.dumps(rep)
        check(api, data, live=H[2] + H[3] + H[4] + H[5], quarantined=H[1] + H[6])
        # A data file removed, then written again at the same path with other content and added
        # back (the manifest records another size and row count): the cache must not answer for
        # it with the old content.
        t.overwrite(remove=["f5.parquet"])
        t.rewrite_data("f5.parquet", H[5] + H[6][:1])
        t.append("f5.parquet")
        t.expire(keep=1)
        rep = api.run()
        assert table(rep)[1] == 1, rep["tables"]
        assert counts(rep) == (0, 1, 0), json.dumps(rep)
        check(api, data, live=H[6][:1], quarantined=H[1] + H[6][1:])
    finally:
        srv.stop()


def test_cache_is_per_column(tmp_path):
    """Two [table] sections over one Iceberg table, one per hash column (images and thumbnails):
    the same data files, read for different columns. What the cache holds for a file under one
    column must not stand for the other; nor may a changed column or form reuse the old cache."""
    t = IceTable(tmp_path / "items")
    data = {}
    srv = start(tmp_path, t, t.conf(name="thumbs", column="thumb_sha256", form="url"),
                grace="1s")
    api = Api(srv)
    try:
        I = upload(api, data, "img", 4)
        T = upload(api, data, "thumb", 4)
        t.write_data({"a.parquet": I[:2], "b.parquet": I[2:]},
                     columns={"thumb_sha256": ("url", {"a.parquet": T[:2], "b.parquet": T[2:]})})
        t.append("a.parquet", "b.parquet")
        time.sleep(GRACE + MARGIN)
        rep = api.run()
        assert rep["references"] == len(I + T), json.dumps(rep)
        assert counts(rep) == (0, 0, 0), json.dumps(rep)
        assert [x["data_files_read"] for x in rep["tables"]] == [2, 2], rep["tables"]
        rep = api.run()
        assert counts(rep) == (0, 0, 0) and rep["references"] == len(I + T), json.dumps(rep)
        check(api, data, live=I + T)
    finally:
        srv.stop()
    # The same data dir (and cache), the table now configured on the thumbnail column only.
    srv = Server(tmp_path / "data", config_text=recon_conf(
        t.conf(column="thumb_sha256", form="url"), grace="1s")).start()
    api = Api(srv)
    try:
        rep = api.run(dry_run=True)
        assert rep["references"] == len(T) and counts(rep) == (len(I), 0, 0), json.dumps(rep)
    finally:
        srv.stop()


# ---- 8. reports survive a restart; the timer -----------------------------------------------

def test_reports_survive_restart(tmp_path):
    t = IceTable(tmp_path / "t")
    t.write_data({"f.parquet": [sha(b"a"), sha(b"b")]})
    t.append("f.parquet")
    conf = recon_conf(t, grace="1s")
    srv = Server(tmp_path / "data", config_text=conf).start()
    api = Api(srv)
    try:
        api.put(b"a")
        api.run()
        api.run(dry_run=True)
        t.data_path("f.parquet").rename(t.data_path("gone"))
        api.run(expect_state=None, full=True)
        t.data_path("gone").rename(t.data_path("f.parquet"))
        runs = api.runs()
        assert [r["state"] for r in runs[:3]] == ["failed", "done", "done"]
    finally:
        assert srv.stop() == 0
    srv = Server(tmp_path / "data", config_text=conf).start()
    api = Api(srv)
    try:
        again = api.runs()
        assert again == runs
        for r in runs:
            assert api.report(r["id"]) == r
        assert api.s.get(f"{api.url}/v1/reconcile/runs/{runs[0]['id'] + 100}",
                         timeout=30).status_code == 404
        rep = api.run()
        assert rep["id"] > runs[0]["id"]
        # The data-file cache survives too: nothing changed, nothing is read.
        assert rep["tables"][0]["data_files_read"] == 0, rep["tables"]
    finally:
        srv.stop()


def test_periodic_runs(tmp_path):
    t = IceTable(tmp_path / "t")
    t.write_data({"f.parquet": [sha(b"a")]})
    t.append("f.parquet")
    srv = start(tmp_path, t, interval="1s")
    api = Api(srv)
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and len(api.runs()) < 2:
            time.sleep(0.1)
        runs = api.runs()
        assert len(runs) >= 2, runs
        assert all(r["state"] in ("done", "running") for r in runs)
    finally:
        srv.stop()


def test_bad_run_ids(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t)
    api = Api(srv)
    try:
        assert api.runs() == []
        for rid in ("1", "0", "abc", "-1", "99999999999999999999999", "1/x"):
            r = api.s.get(f"{api.url}/v1/reconcile/runs/{rid}", timeout=30)
            assert r.status_code in (400, 404), (rid, r.status_code)
            assert r.json()["error"]["code"] in ("not_found", "bad_request", "no_route")
        r = api.s.get(f"{api.url}/v1/reconcile", timeout=30)
        assert r.status_code in (404, 405), r.status_code
    finally:
        srv.stop()


def test_bad_reconcile_parameters_change_nothing(tmp_path):
    """Invariant 8: a misspelt or unparsable option must not turn a dry run into a real one."""
    t = IceTable(tmp_path / "t")
    t.write_data({"f.parquet": [sha(b"x")]})
    t.append("f.parquet")
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)
    try:
        data = {}
        U = upload(api, data, "U", 2)
        time.sleep(GRACE + MARGIN)
        for q in ("dry_run=yes", "dry_run=on", "dryrun=1", "dry-run=1", "force=2", "full=maybe",
                  "dry_run=1&bogus=1"):
            r = api.s.post(f"{api.url}/v1/reconcile?{q}", timeout=30)
            assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", (q, r.text)
        assert api.runs() == []
        check(api, data, live=U)
        for q, dry in (("dry_run=true", True), ("dry_run", True), ("dry_run=1&force=0", True)):
            r = api.s.post(f"{api.url}/v1/reconcile?{q}", timeout=30)
            assert r.status_code == 202, (q, r.text)
            rep = api.wait(r.json()["id"])
            assert rep["dry_run"] is dry and rep["force"] is False, (q, rep)
        check(api, data, live=U)
        r = api.s.post(f"{api.url}/v1/reconcile?dry_run=0&full=false", timeout=30)
        rep = api.wait(r.json()["id"])
        assert rep["dry_run"] is False and rep["full"] is False and counts(rep) == (2, 0, 0)
    finally:
        srv.stop()


def test_no_tables_configured_purges_nothing(tmp_path):
    """With no [table] at all nothing is known to be referenced: a run must not take that as
    "nothing is referenced" (the embedded default config has no tables; its blobs must not be
    quarantined a grace period after upload). Either the run is refused or it quarantines
    nothing."""
    srv = start(tmp_path, grace="1s")
    api = Api(srv)
    try:
        data = {}
        U = upload(api, data, "U", 3)
        time.sleep(GRACE + MARGIN)
        r = api.start_run()
        if r.status_code == 202:
            rep = api.wait(r.json()["id"])
            assert counts(rep) == (0, 0, 0), json.dumps(rep)
        else:
            assert 400 <= r.status_code < 500, r.text
        check(api, data, live=U)
    finally:
        srv.stop()


# ---- S3: table files and blobs in buckets ------------------------------------------------------

def test_reconcile_on_s3(rgw, tmp_path):
    """The table's files in one bucket (read through the s3 store's credentials), the blobs in
    another (the upload store): reconcile quarantines, then deletes the object from the bucket;
    a data file missing from the bucket fails the run and changes nothing."""
    from s3util import content_key, head_size, s3_store_conf
    s3 = rgw.client()
    wh = rgw.make_bucket("recon-warehouse")
    bb = rgw.make_bucket("recon-blobs")
    t = IceTable(tmp_path / "s3t")

    def sync():
        for p in t.root.rglob("*"):
            if p.is_file():
                s3.upload_file(str(p), wh, "s3t/" + str(p.relative_to(t.root)))

    table = (f"[table s3t]\nlocation = s3://{wh}/s3t\ncolumn = {t.column}\nform = hex\n"
             f"rewrite = {t.prefix}/ => s3://{wh}/s3t/\nstore = lake\n")
    srv = start(tmp_path, s3_store_conf(rgw, bb, name="lake"), table, grace="1s",
                retention="1s")
    api = Api(srv)
    try:
        data = {}
        R = upload(api, data, "R", 3, size=2000)
        U = upload(api, data, "U", 2, size=3000)
        assert all(head_size(s3, bb, content_key(h)) == len(data[h]) for h in R + U)
        t.write_data({"r.parquet": R})
        t.append("r.parquet")
        sync()
        time.sleep(GRACE + MARGIN)
        rep = api.run()
        assert counts(rep) == (len(U), 0, 0), json.dumps(rep)
        assert rep["tables"][0]["data_files_read"] == 1
        check(api, data, live=R, quarantined=U)
        assert all(head_size(s3, bb, content_key(h)) == len(data[h]) for h in U)
        t1 = time.monotonic()
        # A new snapshot whose data file is not in the bucket: fail closed.
        V = upload(api, data, "V", 1)
        t.write_data({"v.parquet": V})
        t.append("v.parquet")
        sync()
        s3.delete_object(Bucket=wh, Key="s3t/data/v.parquet")
        wait_until(t1 + 1.0 + MARGIN)
        rep = api.run(expect_state="failed")
        assert counts(rep) == (0, 0, 0)
        assert any(f"s3://{wh}/s3t/data/v.parquet" in e for e in rep["errors"]), rep["errors"]
        check(api, data, live=R + V, quarantined=U)
        sync()
        rep = api.run()
        assert counts(rep) == (0, 0, len(U)), json.dumps(rep)
        assert rep["bytes_reclaimed"] == sum(len(data[h]) for h in U)
        check(api, data, live=R + V, gone=U)
        assert [head_size(s3, bb, content_key(h)) for h in U] == [None] * len(U)
        assert all(head_size(s3, bb, content_key(h)) == len(data[h]) for h in R + V)
    finally:
        srv.stop()


# ---- 10. manifest counts ---------------------------------------------------------------------

def refs(conf_path, name, *args):
    return __import__("subprocess").run([str(BIN_DIR / "blobref"), "refs", "-c", str(conf_path),
                                         name] + list(args), capture_output=True, text=True,
                                        timeout=60)


@pytest.mark.parametrize("version", [1, 2])
def test_manifest_counts(tmp_path, version):
    """A manifest with MORE entries than its manifest list counts is read completely with a
    warning; FEWER entries than counted is an error (a manifest may have been cut off)."""
    t = IceTable(tmp_path / "t", version=version)
    hs = {i: [sha(f"c{i}-{j}".encode()) for j in range(3)] for i in range(4)}
    t.write_data({f"f{i}.parquet": hs[i] for i in range(4)})
    m = t._new_manifest([(1, f"f{i}.parquet") for i in range(3)])
    t.count_override[m] = (1, 0, 0)   # 3 entries, the list says 1
    t._commit([m], [m])
    conf = tmp_path / "t.conf"
    conf.write_text(t.conf())
    p = refs(conf, "t")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split()) == sorted(hs[0] + hs[1] + hs[2])
    assert "warning" in p.stderr and m in p.stderr, p.stderr
    p = refs(conf, "t", "--files")
    assert p.returncode == 0 and len(p.stdout.split("\n")) - 1 == 3, p.stdout

    # reconcile reads every entry too
    srv = start(tmp_path, t, grace="1s")
    api = Api(srv)
    try:
        data = {}
        for i in range(3):
            data[api.put(f"c{i}-0".encode())] = f"c{i}-0".encode()
        time.sleep(GRACE + MARGIN)
        rep = api.run()
        assert counts(rep) == (0, 0, 0) and rep["references"] == 9, json.dumps(rep)
    finally:
        srv.stop()

    # FEWER entries than the list says (2 + 1 existing + 1 deleted = 4 > 3): an error
    t.count_override[m] = (2, 1, 1)
    t._commit([m], [])
    t.expire(keep=1)  # (a manifest is read once: the first list naming it gives its count)
    p = refs(conf, "t")
    assert p.returncode == 1 and p.stdout == "" and "manifest list says 4" in p.stderr, p.stderr
    # Counts split across added/existing/deleted that add up: fine
    m2 = t._new_manifest([(1, "f3.parquet"), (0, "f0.parquet"), (2, "f1.parquet")])
    t._commit([m2], [m2])
    t.expire(keep=1)
    p = refs(conf, "t")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert sorted(p.stdout.split()) == sorted(hs[3] + hs[0])
