"""Why alive (issue 22): GET /v1/blobs/{hash}/refs names the tables, retained snapshots and data
files that reference a blob (read from the tables now), and for an unreferenced one why it is not
quarantined yet: in grace until T, leased, held by an admin; `blobref why HASH`."""
import datetime
import json

from reconcile_util import Api, IceTable, blob, cli, start


def parse_ts(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc)


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
