"""The Delta log's edges, on tables written here: what fails closed (a missing commit in the
middle, a truncated checkpoint, an unknown reader feature, a broken commit line), and the
checkpoint kinds the shared test data lacks (multi-part, v2 with sidecars)."""
import json
import os
import subprocess
import time

import pytest

from conftest import BIN_DIR
from delta_util import DeltaTable, log_name
from reconcile_util import Api, blob, sha, start


def refs(*args):
    return subprocess.run([str(BIN_DIR / "blobref"), "refs", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def hashes(tag, n):
    return [sha(blob(tag, i)) for i in range(n)]


def table_of(tmp_path, nfiles=4, **kw):
    """A table with one file per commit (v0..v(n-1)), file i holding hashes(f"f{i}", 2)."""
    t = DeltaTable(tmp_path / "t", **kw)
    t.write_data({f"f{i}.parquet": hashes(f"f{i}", 2) for i in range(nfiles)})
    for i in range(nfiles):
        t.commit(add=[f"f{i}.parquet"])
    return t


def all_hashes(t):
    return sorted(h for p in t.live for h in t.hashes[p])


def fails(t, *names):
    """--files and --column both fail with status 1, no output, and a message naming each of
    names."""
    for args in (["--files"], ["--column", "image_sha256"]):
        res = refs(t.root, *args)
        assert res.returncode == 1 and res.stdout == "", (args, res.stdout, res.stderr)
        for n in names:
            assert n in res.stderr, (n, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_missing_middle_commit_fails(tmp_path):
    t = table_of(tmp_path)
    assert refs(t.root, "--column", "image_sha256").stdout.split() == all_hashes(t)
    t.delete_commit(2)
    fails(t, log_name(2), "is missing")


def test_missing_commit_after_a_checkpoint_fails(tmp_path):
    t = table_of(tmp_path)
    t.checkpoint()  # at 3
    t.write_data({"g.parquet": hashes("g", 1), "h.parquet": hashes("h", 1)})
    t.commit(add=["g.parquet"])
    t.commit(add=["h.parquet"])
    for v in (0, 1, 2, 4):
        t.delete_commit(v)
    fails(t, log_name(4))


def test_truncated_checkpoint_fails(tmp_path):
    t = table_of(tmp_path)
    ck = t.checkpoint()
    t.delete_commit(0)
    assert refs(t.root, "--column", "image_sha256").stdout.split() == all_hashes(t)
    data = ck.read_bytes()
    ck.write_bytes(data[: len(data) // 2])
    fails(t, ck.name)


@pytest.mark.parametrize("where", ["commit", "checkpoint"])
def test_unknown_reader_feature_fails(tmp_path, where):
    t = table_of(tmp_path, features=["deletionVectors", "fancyNewThing"])
    if where == "checkpoint":
        t.checkpoint()
        t.delete_commit(0)  # the protocol is only in the checkpoint now
    fails(t, "fancyNewThing", "reader feature")


def test_known_reader_features_are_read(tmp_path):
    t = table_of(tmp_path, features=["deletionVectors", "columnMapping", "v2Checkpoint"])
    t.checkpoint()
    t.delete_commit(0)
    res = refs(t.root, "--column", "image_sha256")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == all_hashes(t)


def test_reader_version_above_3_fails(tmp_path):
    t = table_of(tmp_path, reader=4)
    fails(t, "minReaderVersion 4")


def test_broken_commit_line_fails(tmp_path):
    t = table_of(tmp_path)
    p = t.log / log_name(3)
    p.write_text(p.read_text() + '{"add": {"path": "x.parq\n')
    fails(t, log_name(3), "line 3")


def test_reconcile_fails_closed_and_changes_nothing(tmp_path):
    """A run over a table whose log lost a middle commit fails, names the commit, and
    quarantines nothing (the blobs the lost commit referenced stay live)."""
    t = table_of(tmp_path, nfiles=3)
    srv = start(tmp_path, t.conf(), grace="1s")
    api = Api(srv)
    try:
        t0 = time.monotonic()
        for i in range(3):
            for j in range(2):
                api.put(blob(f"f{i}", j))
        unref = api.put(blob("never", 0))
        t.delete_commit(1)
        time.sleep(max(0, t0 + 1.3 - time.monotonic()))
        rep = api.run(expect_state="failed")
        assert rep["blobs"]["quarantined"] == 0, json.dumps(rep)
        assert any(log_name(1) in e for e in rep["errors"]), rep["errors"]
        assert api.get(unref).status_code == 200
        assert log_name(1) in srv.read_log()
    finally:
        srv.stop()


# --- checkpoints the shared data lacks ---------------------------------------------------------

def test_multipart_checkpoint(tmp_path):
    t = table_of(tmp_path, nfiles=5)
    t.commit(remove=["f1.parquet"])
    parts = t.multipart_checkpoint(3)
    for v in range(t.version + 1):
        t.delete_commit(v)
    res = refs(t.root, "--column", "image_sha256")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == all_hashes(t)
    assert not set(hashes("f1", 2)) & set(res.stdout.split())
    res = refs(t.root, "--files")
    assert res.stdout.splitlines() == sorted(f"5\t{t.root.resolve()}/{p}" for p in t.live)
    # a part missing: the checkpoint is unusable, and nothing else gives version 5
    os.remove(parts[1])
    fails(t, "no usable checkpoint", "version 5 has 2 of its 3 parts")


def test_incomplete_multipart_falls_back_to_an_older_checkpoint(tmp_path):
    t = table_of(tmp_path, nfiles=3)
    t.checkpoint()  # classic at 2
    t.write_data({"g.parquet": hashes("g", 2)})
    t.commit(add=["g.parquet"])
    parts = t.multipart_checkpoint(2)  # at 3, then one part lost
    os.remove(parts[0])
    for v in (0, 1, 2):
        t.delete_commit(v)
    res = refs(t.root, "--files")
    assert res.returncode == 0, res.stderr
    assert {line.split("\t")[0] for line in res.stdout.splitlines()} == {"2", "3"}
    assert refs(t.root, "--column", "image_sha256").stdout.split() == all_hashes(t)


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_v2_checkpoint_with_sidecars(tmp_path, kind):
    t = table_of(tmp_path, nfiles=5, features=["v2Checkpoint"])
    t.commit(remove=["f0.parquet"])
    t.v2_checkpoint("3a0d65cd-4056-49b8-937b-95f9e3ee90e5", kind=kind)
    for v in range(t.version + 1):
        t.delete_commit(v)
    res = refs(t.root, "--column", "image_sha256")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == all_hashes(t) and len(res.stdout.split()) == 8
    # a sidecar lost: fail, naming it
    sc = sorted((t.log / "_sidecars").iterdir())[1]
    os.remove(sc)
    fails(t, sc.name)


def test_stale_last_checkpoint_and_side_files_are_ignored(tmp_path):
    """The log is listed, never trusted through `_last_checkpoint` (here naming a checkpoint that
    does not exist); `.crc` and temporary files are not commits."""
    t = table_of(tmp_path)
    t.checkpoint()
    t.delete_commit(0)
    want = refs(t.root, "--files").stdout
    (t.log / "_last_checkpoint").write_text('{"version": 99, "size": 3}\n')
    (t.log / "00000000000000000003.crc").write_text("{}\n")
    (t.log / ".00000000000000000003.json.crc").write_text("x")
    (t.log / "00000000000000000004.json.tmp").write_text("not json\n")
    res = refs(t.root, "--files")
    assert res.returncode == 0, res.stderr
    assert res.stdout == want and want.count("\n") == 4
