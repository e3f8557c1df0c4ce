"""Per-run blob lists (issue 22): every run, dry runs too, lists exactly which blobs it
quarantined, restored, deleted, held while referenced and left pending (inside grace, with the time
each becomes eligible), over a real Iceberg table; paged by GET /v1/reconcile/runs/{id}/blobs with
bounded, checked parameters; printed by `blobref reconcile show ID --action A`. With
[reconcile] lists = false a run records its counts only and its lists answer 404
lists_not_recorded."""
import datetime
import json
import re
import subprocess
import time

from reconcile_util import Api, IceTable, blob, cli, sha, start

GRACE = 1.0
MARGIN = 0.3


def parse_ts(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc)


def listed(api, rid, action, limit=None):
    """The whole list, page by page (limit per page), checking that pages chain."""
    out, after = [], None
    while True:
        params = {"action": action}
        if limit:
            params["limit"] = limit
        if after:
            params["after"] = after
        r = api.s.get(f"{api.url}/v1/reconcile/runs/{rid}/blobs", params=params, timeout=30)
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["run"] == rid and page["action"] == action, page
        if limit:
            assert len(page["blobs"]) <= limit
        out += page["blobs"]
        after = page["next"]
        if after is None:
            return out
        assert after == page["blobs"][-1]["sha256"]


def hashes(entries):
    return [e["sha256"] for e in entries]


def test_run_lists_exact_blobs_per_action(tmp_path):
    """A, H referenced; Q, R not, older than grace; P uploaded inside grace; H held by an admin.
    Dry run 1 and run 2 list quarantined = Q+R, pending = P (eligible at its upload + grace),
    held = H. Then R is referenced again and Q passes retention: run 3 lists restored = R,
    deleted = Q, quarantined = P (past grace now)."""
    t = IceTable(tmp_path / "images")
    srv = start(tmp_path, t, grace="1s", retention="1s")
    api = Api(srv)
    try:
        def up(tag, n):
            return [api.put(blob(tag, i)) for i in range(n)]
        A, Q, R, H = up("A", 2), up("Q", 3), up("R", 2), up("H", 1)
        t.write_data({"f1.parquet": A + H, "f2.parquet": R})
        t.append("f1.parquet")
        time.sleep(GRACE + MARGIN)
        P = up("P", 2)
        assert api.delete(H[0], reason="legal").status_code == 200

        rep1 = api.run(dry_run=True)
        for rep in (rep1, api.run()):
            rid = rep["id"]
            assert hashes(listed(api, rid, "quarantined")) == sorted(Q + R), json.dumps(rep)
            assert hashes(listed(api, rid, "quarantined", limit=2)) == sorted(Q + R)
            assert hashes(listed(api, rid, "held")) == H
            assert listed(api, rid, "restored") == [] and listed(api, rid, "deleted") == []
            pending = listed(api, rid, "pending")
            assert hashes(pending) == sorted(P), pending
            for e in pending:
                up_at = parse_ts(api.meta(e["sha256"]).json()["last_upload_at"])
                assert parse_ts(e["eligible_at"]) == up_at + datetime.timedelta(seconds=GRACE)
            assert rep["blobs"]["pending"] == len(P)
            assert rep["lists"] == {"quarantined": 5, "restored": 0, "deleted": 0, "held": 1,
                                    "pending": 2, "bytes": 32 * 6 + 40 * 2}, rep["lists"]
        assert api.code(Q[0]) == 410  # run 2 quarantined for real

        t1 = time.monotonic()
        t.append("f2.parquet")
        time.sleep(max(0, t1 + 1.0 + MARGIN - time.monotonic()))  # Q past retention, P grace
        rep3 = api.run()
        rid = rep3["id"]
        assert hashes(listed(api, rid, "restored")) == sorted(R), json.dumps(rep3)
        assert hashes(listed(api, rid, "deleted")) == sorted(Q)
        assert hashes(listed(api, rid, "quarantined")) == sorted(P)
        assert listed(api, rid, "pending") == [] and hashes(listed(api, rid, "held")) == H
        # the earlier runs keep their own lists
        assert hashes(listed(api, rep1["id"], "quarantined")) == sorted(Q + R)

        r = cli(srv, "reconcile", "show", str(rid), "--action", "deleted")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == sorted(Q)
        r = cli(srv, "--json", "reconcile", "show", str(rep1["id"]), "--action", "pending")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["run"] == rep1["id"] and hashes(doc["blobs"]) == sorted(P)
        assert all("eligible_at" in e for e in doc["blobs"])
        r = cli(srv, "reconcile", "show", str(rid))
        assert r.returncode == 0 and "listed: 2 quarantined, 2 restored, 3 deleted" in r.stdout
        r = cli(srv, "reconcile", "show", str(rid), "--action", "bogus")
        assert r.returncode == 2, (r.returncode, r.stderr)
    finally:
        srv.stop()


def test_refused_dry_run_lists_no_quarantines_but_pending(tmp_path):
    """max_fraction refuses the quarantines: the refused run lists none (as its count says)."""
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s", max_fraction="0.1")
    api = Api(srv)
    try:
        keep = api.put(b"kept")
        t.write_data({"a.parquet": [keep]})
        t.append("a.parquet")
        old = [api.put(blob("old", i)) for i in range(3)]
        time.sleep(GRACE + MARGIN)
        new = api.put(b"new one")
        rep = api.run(dry_run=True)
        assert rep["refused"] and rep["blobs"]["quarantined"] == 0, rep
        assert listed(api, rep["id"], "quarantined") == []
        assert hashes(listed(api, rep["id"], "pending")) == [new]
        rep = api.run(force=True)
        assert hashes(listed(api, rep["id"], "quarantined")) == sorted(old)
    finally:
        srv.stop()


def test_run_blobs_bad_parameters(tmp_path):
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t)
    api = Api(srv)
    try:
        t.write_data({"a.parquet": [sha(b"x")]})
        t.append("a.parquet")
        rid = api.run()["id"]
        url = f"{api.url}/v1/reconcile/runs"
        for params, status, code in [
                ({"action": "bogus"}, 400, "bad_request"),
                ({}, 400, "bad_request"),
                ({"action": "pending", "limit": "0"}, 400, "bad_request"),
                ({"action": "pending", "limit": "1001"}, 400, "bad_request"),
                ({"action": "pending", "limit": "-1"}, 400, "bad_request"),
                ({"action": "pending", "after": "xyz"}, 400, "bad_hash")]:
            r = api.s.get(f"{url}/{rid}/blobs", params=params, timeout=30)
            assert r.status_code == status and r.json()["error"]["code"] == code, (params, r.text)
        r = api.s.get(f"{url}/{rid + 100}/blobs", params={"action": "pending"}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        r = api.s.get(f"{url}/{rid}/blobs", params={"action": "pending", "limit": "1000"},
                      timeout=30)
        assert r.status_code == 200 and r.json()["blobs"] == [] and r.json()["next"] is None
    finally:
        srv.stop()


def list_entries(data_dir):
    """The number of list chunks in the reconcile state (mdb_stat of its "lists" database)."""
    out = subprocess.run(["mdb_stat", "-s", "lists", str(data_dir / "reconcile")],
                         capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Entries: (\d+)", out).group(1))


def test_lists_off_records_counts_only(tmp_path):
    """lists = false: a real run and a dry run quarantine and count as before but write no list
    (no chunk in the state), report "lists": null, and each action's list is 404
    lists_not_recorded (no retry makes it exist), in the API and the CLI. Turned back on, the
    next run lists again and the counts-only runs still answer 404."""
    t = IceTable(tmp_path / "t")
    srv = start(tmp_path, t, grace="1s", lists="false")
    api = Api(srv)
    try:
        keep = api.put(b"kept")
        t.write_data({"a.parquet": [keep]})
        t.append("a.parquet")
        old = sorted(api.put(blob("old", i)) for i in range(3))
        time.sleep(GRACE + MARGIN)
        new = api.put(b"inside grace")
        dry = api.run(dry_run=True)
        rep = api.run()
        for r in (dry, rep):
            assert r["state"] == "done" and r["lists"] is None, r
            assert r["blobs"]["quarantined"] == 3 and r["blobs"]["pending"] == 1, r
        for h in old:
            assert api.code(h) == 410
        assert api.code(new) == 200
        assert list_entries(srv.data_dir) == 0
        for rid in (dry["id"], rep["id"]):
            for action in ("quarantined", "restored", "deleted", "pending", "held"):
                r = api.s.get(f"{api.url}/v1/reconcile/runs/{rid}/blobs",
                              params={"action": action}, timeout=30)
                assert r.status_code == 404, r.text
                assert r.json()["error"]["code"] == "lists_not_recorded", r.text
                assert "lists = false" in r.json()["error"]["message"], r.text
        p = cli(srv, "reconcile", "show", str(rep["id"]), "--action", "quarantined")
        assert p.returncode != 0 and "lists_not_recorded" in p.stderr and not p.stdout, p
        p = cli(srv, "reconcile", "show", str(rep["id"]))
        assert p.returncode == 0 and "recorded counts only" in p.stdout, p

        srv.stop()
        srv.config_text = srv.config_text.replace("lists = false", "lists = true")
        srv.start()
        time.sleep(GRACE + MARGIN)
        on = api.run()
        assert on["lists"]["quarantined"] == 1 and list_entries(srv.data_dir) > 0, on
        assert hashes(listed(api, on["id"], "quarantined")) == [new]
        r = api.s.get(f"{api.url}/v1/reconcile/runs/{rep['id']}/blobs",
                      params={"action": "quarantined"}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "lists_not_recorded"
    finally:
        srv.stop()
