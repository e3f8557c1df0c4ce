"""Delta Lake tables end to end: `blobref refs --column` and reconcile on a table written here
(DuckDB data files, JSON commits, a Parquet checkpoint): what the retained versions reference
is never quarantined, everything else is."""
import json
import subprocess
import time

from conftest import BIN_DIR
from delta_util import DeltaTable
from reconcile_util import Api, blob, sha, start

GRACE = 1.0
MARGIN = 0.3


def upload(api, data, tag, n):
    out = []
    for i in range(n):
        b = blob(tag, i)
        data[h := api.put(b)] = b
        out.append(h)
    return out


def refs(*args):
    return subprocess.run([str(BIN_DIR / "blobref"), "refs", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def build(tmp_path, api, data):
    """v0 add f1(A); v1 add f2(B) (under a percent-encoded folder); v2 remove f1, add f3(C)
    (an absolute file:// URI), checkpoint at 2; v3 add f4(D) with the change-data file c3(E).
    Commits 0 and 1 are then gone: versions 2 and 3 are retained, A is not referenced."""
    t = DeltaTable(tmp_path / "images")
    A, B, C, D, E = (upload(api, data, tag, 3) for tag in "ABCDE")
    f3 = f"file://{t.root}/f3.parquet"
    t.write_data({"f1.parquet": A, "part=a%20b/f2.parquet": B, f3: C, "f4.parquet": D,
                  "_change_data/c3.parquet": E})
    t.commit(add=["f1.parquet"])
    t.commit(add=["part=a%20b/f2.parquet"])
    t.commit(remove=["f1.parquet"], add=[f3])
    t.checkpoint()
    t.commit(add=["f4.parquet"], cdc=["_change_data/c3.parquet"])
    t.delete_commit(0)
    t.delete_commit(1)
    return t, A, B, C, D, E


def test_refs_column_and_reconcile(tmp_path):
    data = {}
    table_dir = tmp_path / "images"
    conf = (f"[table images]\nlocation = {table_dir}\ncolumn = image_sha256\nform = hex\n"
            f"format = delta\n")
    srv = start(tmp_path, conf)
    api = Api(srv)
    try:
        U = upload(api, data, "U", 2)  # never in the table
        t, A, B, C, D, E = build(tmp_path, api, data)
        t0 = time.monotonic()  # after the last upload, however long they took under load

        res = refs(t.root, "--column", "image_sha256")
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == sorted(B + C + D + E)
        res = refs(t.root, "--files")
        assert res.returncode == 0, res.stderr
        assert {line.split("\t")[0] for line in res.stdout.splitlines()} == {"2", "3"}

        time.sleep(max(0, t0 + GRACE + MARGIN - time.monotonic()))
        rep = api.run()
        assert rep["errors"] == [], json.dumps(rep)
        assert rep["blobs"]["quarantined"] == len(A + U), json.dumps(rep)
        assert rep["references"] == len(B + C + D + E)
        [tr] = rep["tables"]
        assert tr["snapshots"] == 2 and tr["data_files"] == 4 and tr["data_files_read"] == 4, tr
        for h in B + C + D + E:
            assert api.get(h).status_code == 200, h
        for h in A + U:
            assert api.get(h).status_code == 410, h

        # A second run reads nothing again (the per-data-file cache) and changes nothing.
        rep2 = api.run()
        assert rep2["blobs"]["quarantined"] == 0 and rep2["errors"] == []
        assert rep2["tables"][0]["data_files_cached"] == 4, rep2["tables"]
    finally:
        srv.stop()


def test_format_is_detected_without_the_key(tmp_path):
    """No `format` key: `_delta_log/` makes the location a Delta table, for reconcile and for
    `refs -c`."""
    data = {}
    table_dir = tmp_path / "images"
    conf = f"[table images]\nlocation = {table_dir}\ncolumn = image_sha256\n"
    srv = start(tmp_path, conf)
    api = Api(srv)
    try:
        t, A, B, C, D, E = build(tmp_path, api, data)
        t0 = time.monotonic()  # after the last upload
        res = refs("-c", srv.data_dir / "blobref.conf", "images")
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == sorted(B + C + D + E)
        time.sleep(max(0, t0 + GRACE + MARGIN - time.monotonic()))
        rep = api.run()
        assert rep["errors"] == [], json.dumps(rep)
        assert rep["blobs"]["quarantined"] == len(A), json.dumps(rep)
        assert api.get(A[0]).status_code == 410 and api.get(E[0]).status_code == 200
    finally:
        srv.stop()


def test_invalid_value_warns_and_goes_on(tmp_path):
    t = DeltaTable(tmp_path / "t")
    h = sha(b"x")
    t.write_data({"f.parquet": [h]}, extra=("not-a-hash", None))
    t.commit(add=["f.parquet"])
    res = refs(t.root, "--column", "image_sha256")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [h]
    assert "1 of 2 values" in res.stderr and "not-a-hash" in res.stderr
    res = refs(t.root, "--column", "image_sha256", "--strict")
    assert res.returncode == 1 and "not-a-hash" in res.stderr


def test_delta_table_in_s3(rgw, tmp_path):
    """The table's log and files in a bucket, read through the [table]'s s3 store; no `format`
    key: the listing of `_delta_log/` makes it a Delta table. The checkpoint is read by ranged
    GETs and relative (percent-encoded) paths resolve under s3://BUCKET/PREFIX; a commit missing
    from the bucket fails the run."""
    from s3util import s3_store_conf
    s3 = rgw.client()
    wh = rgw.make_bucket("delta-warehouse")
    bb = rgw.make_bucket("delta-blobs")
    t = DeltaTable(tmp_path / "dt")
    table = (f"[table images]\nlocation = s3://{wh}/dt\ncolumn = image_sha256\nform = hex\n"
             f"store = lake\n")
    srv = start(tmp_path, s3_store_conf(rgw, bb, name="lake"), table, grace="1s")
    api = Api(srv)
    try:
        data = {}
        A, B, C, U = (upload(api, data, tag, 2) for tag in "ABCU")
        t0 = time.monotonic()  # after the last upload
        t.write_data({"a.parquet": A, "part=x%20y/b.parquet": B, "c.parquet": C})
        t.commit(add=["a.parquet"])
        t.commit(add=["part=x%20y/b.parquet"], remove=["a.parquet"])
        t.checkpoint()
        t.commit(add=["c.parquet"])
        t.delete_commit(0)
        for p in t.root.rglob("*"):
            if p.is_file():
                s3.upload_file(str(p), wh, "dt/" + str(p.relative_to(t.root)))
        conf = srv.data_dir / "blobref.conf"
        res = refs("-c", conf, "images", "--files")
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines() == [
            f"1\ts3://{wh}/dt/part=x y/b.parquet",
            f"2\ts3://{wh}/dt/c.parquet", f"2\ts3://{wh}/dt/part=x y/b.parquet"]
        res = refs("-c", conf, "images")
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == sorted(B + C)

        time.sleep(max(0, t0 + GRACE + MARGIN - time.monotonic()))
        rep = api.run()
        assert rep["errors"] == [], json.dumps(rep)
        assert rep["blobs"]["quarantined"] == len(A + U), json.dumps(rep)
        for h in B + C:
            assert api.get(h).status_code == 200
        for h in A + U:
            assert api.get(h).status_code == 410

        s3.delete_object(Bucket=wh, Key="dt/_delta_log/" + "%020d.json" % 2)
        t.commit(add=[])  # version 3 in the bucket: version 2 is now a gap
        s3.upload_file(str(t.log / ("%020d.json" % 3)), wh, "dt/_delta_log/" + "%020d.json" % 3)
        rep = api.run(expect_state="failed")
        assert any("%020d.json" % 2 in e for e in rep["errors"]), rep["errors"]
        assert rep["blobs"]["quarantined"] == 0 and rep["blobs"]["restored"] == 0
    finally:
        srv.stop()
