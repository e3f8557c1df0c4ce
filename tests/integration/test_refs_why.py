"""Why alive (issue 22): GET /v1/blobs/{hash}/refs names the tables, retained snapshots and data
files that reference a blob (read from the tables now), and for an unreferenced one why it is not
quarantined yet: in grace until T, leased, held by an admin; `blobref why HASH`."""
import datetime
import json

from delta_util import DeltaTable
from reconcile_util import Api, IceTable, blob, cli, start


def parse_ts(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc)


def iso_ms(ms):
    d = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def refs(api, h):
    r = api.s.get(f"{api.url}/v1/blobs/{h}/refs", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_refs_names_the_old_snapshot_and_file_and_grace_for_the_unreferenced(tmp_path):
    t = IceTable(tmp_path / "images")
    srv = start(tmp_path, t, grace="1h")
    api = Api(srv)
    try:
        old = api.put(blob("old", 0))
        new = api.put(blob("new", 0))
        loose = api.put(blob("loose", 0))
        held = api.put(blob("held", 0))
        t.write_data({"f1.parquet": [old, held], "f2.parquet": [new]})
        s1 = t.append("f1.parquet")
        s2 = t.overwrite(remove=["f1.parquet"], add=["f2.parquet"])
        assert old not in {h for f in t.current() for h in t.files[f]["hashes"]}
        assert old in t.referenced()  # only through the old, still retained snapshot

        r = refs(api, old)
        assert r["referenced"] is True and r["why"] == "referenced" and r["state"] == "live", r
        [tab] = r["tables"]
        assert tab["name"] == "images"
        [f] = tab["data_files"]
        assert f["path"].endswith("/data/f1.parquet") and f["snapshots"] == [s1], r
        # the snapshot's own time (timestamp-ms), the files read now: no run cached them yet
        assert tab["format"] == "iceberg" and tab["snapshots"] == [
            {"id": s1, "timestamp": iso_ms(1700000000000 + s1)}], tab
        assert tab["data_files_read"] == 2 and tab["data_files_cached"] == 0, tab
        r = refs(api, new)
        [f] = r["tables"][0]["data_files"]
        assert f["path"].endswith("/data/f2.parquet") and s2 in f["snapshots"], r

        r = refs(api, loose)
        assert r["referenced"] is False and r["tables"][0]["data_files"] == [], r
        up = parse_ts(api.meta(loose).json()["last_upload_at"])
        assert parse_ts(r["grace_until"]) == up + datetime.timedelta(hours=1)
        assert r["why"] == f"unreferenced, in grace until {r['grace_until']}", r

        lease = api.s.post(f"{api.url}/v1/leases", json={"ttl": "2h", "name": "job-7"},
                           timeout=30).json()
        assert api.s.post(f"{api.url}/v1/lookup", params={"lease": lease["id"]},
                          json={"hashes": [loose]}, timeout=30).status_code == 200
        r = refs(api, loose)
        assert r["lease"]["id"] == lease["id"] and r["lease"]["name"] == "job-7", r
        assert r["why"].startswith(f"unreferenced, leased by {lease['id']} (job-7) until"), r

        assert api.delete(held, reason="legal hold 42").status_code == 200
        r = refs(api, held)
        assert r["state"] == "held" and r["why"] == "held by an admin: legal hold 42", r

        res = cli(srv, "why", loose)
        assert res.returncode == 0, res.stderr
        assert "leased by" in res.stdout and "job-7" in res.stdout
        res = cli(srv, "why", old)
        assert res.returncode == 0 and "f1.parquet" in res.stdout and f"{s1}" in res.stdout
        res = cli(srv, "--json", "why", old)
        assert json.loads(res.stdout)["tables"][0]["data_files"][0]["snapshots"] == [s1]
        r = api.s.get(f"{api.url}/v1/blobs/nothex/refs", timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_hash"
    finally:
        srv.stop()


def test_refs_on_delta_names_versions_commit_times_and_reads_the_cache(tmp_path):
    """A Delta table: v0 adds f1(old), v1 removes f1 and adds f2(new), v2 adds f3 (nothing of
    ours). old is referenced only by the retained version 0, with its commitInfo time. Before any
    run every data file is read; after one run the same answer comes from the run's cache."""
    t = DeltaTable(tmp_path / "images")
    srv = start(tmp_path, t.conf(), grace="1h")
    api = Api(srv)
    try:
        old, new, other = (api.put(blob(tag, 0)) for tag in ("old", "new", "other"))
        loose = api.put(blob("loose", 0))
        t.write_data({"f1.parquet": [old], "f2.parquet": [new], "f3.parquet": [other]})
        v0 = t.commit(add=["f1.parquet"])
        v1 = t.commit(remove=["f1.parquet"], add=["f2.parquet"])
        t.commit(add=["f3.parquet"])

        def check(r, read, cached):
            assert r["referenced"] is True and r["why"] == "referenced", r
            [tab] = r["tables"]
            assert tab["name"] == "images" and tab["format"] == "delta", tab
            [f] = tab["data_files"]
            assert f["path"].endswith("/f1.parquet") and f["snapshots"] == [v0], tab
            assert tab["snapshots"] == [{"id": v0, "timestamp": iso_ms(1700000000000 + v0)}]
            assert (tab["data_files_read"], tab["data_files_cached"]) == (read, cached), tab

        check(refs(api, old), 3, 0)
        r = refs(api, new)
        [f] = r["tables"][0]["data_files"]
        assert f["snapshots"] == [v1, v1 + 1], r
        assert [s["id"] for s in r["tables"][0]["snapshots"]] == [v1, v1 + 1], r
        r = refs(api, loose)
        assert r["referenced"] is False and r["tables"][0]["data_files"] == [], r
        assert r["tables"][0]["snapshots"] == [] and r["why"].startswith("unreferenced, in grace")

        rep = api.run()
        assert rep["errors"] == [] and rep["blobs"]["quarantined"] == 0, rep
        check(refs(api, old), 0, 3)
        res = cli(srv, "why", old)
        assert res.returncode == 0 and "f1.parquet" in res.stdout, res.stdout
    finally:
        srv.stop()
