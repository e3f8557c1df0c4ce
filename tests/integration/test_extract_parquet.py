"""blobref extract-parquet against a real blobrefd, checked with DuckDB: every other column equal
row for row, chunks copied byte for byte, every hash readable as the original bytes, the new
column's type, nested columns intact, and no OUT after a failure."""
import hashlib
import json
import os
import pathlib
import subprocess

import pytest
import requests

from conftest import BIN_DIR, Server, free_port, need_testdata
from test_parquet_read import columns, duck
from util_http import TIMEOUT

BLOBREF = str(BIN_DIR / "blobref")
CODECS = ["uncompressed", "snappy", "gzip", "zstd", "lz4_raw", "brotli"]
# ids, a binary column with nulls and repeats, a nested struct with a list, strings, floats
TABLE = """SELECT i::BIGINT AS id,
  CASE WHEN i % 7 = 3 THEN NULL ELSE ('image-' || (i % 700) || repeat('x', i % 300))::BLOB END AS img,
  {'a': i, 'b': [i, i + 1], 'c': 'n' || i} AS nested,
  CASE WHEN i % 5 = 0 THEN NULL ELSE 'cat' || (i % 50) END AS cat,
  (i / 3.0)::DOUBLE AS f,
  md5(i::VARCHAR)::UUID AS u
FROM range(20000) r(i)"""


def extract(srv_url, *args, timeout=300):
    cmd = [BLOBREF, "--server", srv_url, "extract-parquet", *map(str, args)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOBREF_")}
    return subprocess.run(cmd, capture_output=True, env=env, timeout=timeout)


def lit(p):
    return "'" + str(p).replace("'", "''") + "'"


def q1(sql):
    return duck("query", sql)[0]


def describe(path):
    rows = duck("read", path)["columns"]
    return {c["name"]: c["type"] for c in rows}


def ident(name):
    return '"' + name.replace('"', '""') + '"'


def check_same_except(inp, out, col_name, new_name, form):
    """Every other column equal row for row; the new column is the SHA-256 of the old one. One
    DuckDB run answers every count (each node start costs about a second on this machine)."""
    col, new = ident(col_name), ident(new_name)
    a = f"(SELECT * EXCLUDE ({col}) FROM read_parquet({lit(inp)}, file_row_number=true))"
    b = f"(SELECT * EXCLUDE ({new}) FROM read_parquet({lit(out)}, file_row_number=true))"
    want = f"sha256(x.{col})" if form == "hex" else f"unhex(sha256(x.{col}))"
    parts = [
        f"SELECT count(*) FROM read_parquet({lit(inp)})",
        f"SELECT count(*) FROM read_parquet({lit(out)})",
        f"SELECT count(*) FROM {a} x JOIN {b} y USING (file_row_number) "
        "WHERE x IS NOT DISTINCT FROM y",
        f"SELECT count(*) FROM read_parquet({lit(inp)}, file_row_number=true) x "
        f"JOIN read_parquet({lit(out)}, file_row_number=true) y USING (file_row_number) "
        f"WHERE y.{new} IS DISTINCT FROM {want}",
        f"SELECT column_type FROM (DESCRIBE SELECT * FROM read_parquet({lit(out)})) "
        f"WHERE column_name = {lit(new_name)}",
        f"SELECT count(*) FROM read_parquet({lit(out)}) "
        f"WHERE {new} IS NOT NULL AND octet_length({new}) <> 32" if form == "binary" else "SELECT 0",
    ]
    row = q1("SELECT " + " || '|' || ".join(f"coalesce(({q})::VARCHAR, 'NULL')" for q in parts))
    n_in, n_out, same, bad, t, wrong_len = row.split("|")
    assert n_out == n_in, (n_in, n_out)
    assert same == n_in, (n_in, same)
    assert bad == "0", bad
    assert t == ("VARCHAR" if form == "hex" else "BLOB"), t
    assert wrong_len == "0", wrong_len


def check_chunks_copied(inp, out, col, new):
    """Every column chunk but the replaced one has the same bytes in OUT as in IN."""
    sql = ("SELECT row_group_id || '|' || path_in_schema || '|' || "
           "coalesce(least(dictionary_page_offset, data_page_offset), data_page_offset) || '|' || "
           "total_compressed_size FROM parquet_metadata({}) ORDER BY row_group_id, column_id")
    a = [r.split("|") for r in duck("query", sql.format(lit(inp)))]
    b = [r.split("|") for r in duck("query", sql.format(lit(out)))]
    assert len(a) == len(b)
    ib, ob = pathlib.Path(inp).read_bytes(), pathlib.Path(out).read_bytes()
    copied = 0
    for x, y in zip(a, b):
        assert x[0] == y[0]
        if x[1] == col:
            assert y[1] == new
            continue
        assert x[1] == y[1]
        s1, n1, s2, n2 = int(x[2]), int(x[3]), int(y[2]), int(y[3])
        assert n1 == n2 and ib[s1:s1 + n1] == ob[s2:s2 + n2], x
        copied += 1
    return copied


def check_blobs(srv, inp, col):
    """Every distinct value reads back from blobref under its SHA-256."""
    vals = duck("query", f"SELECT DISTINCT hex({col}) FROM read_parquet({lit(inp)}) "
                         f"WHERE {col} IS NOT NULL")
    s = requests.Session()
    for hx in vals:
        data = bytes.fromhex(hx)
        r = s.get(f"{srv.url}/v1/blobs/{hashlib.sha256(data).hexdigest()}", timeout=TIMEOUT)
        assert r.status_code == 200 and r.content == data
    return len(vals)


def make(tmp_path, name, codec="zstd", version="V1", rows=4096, table=TABLE):
    p = tmp_path / name
    duck("sql", f"COPY ({table}) TO {lit(p)} (FORMAT parquet, COMPRESSION {codec}, "
                f"PARQUET_VERSION {version}, ROW_GROUP_SIZE {rows})")
    return p


@pytest.mark.parametrize("codec", CODECS)
def test_duckdb_files_every_codec(server, tmp_path, codec):
    form = "binary" if codec in ("gzip", "lz4_raw", "uncompressed") else "hex"
    version = "V2" if codec in ("snappy", "brotli") else "V1"
    inp = make(tmp_path, f"in_{codec}.parquet", codec, version)
    out = tmp_path / "out.parquet"
    r = extract(server.url, inp, out, "--column", "img", "--as", "img_sha256", "--form", form)
    assert r.returncode == 0, r.stderr.decode()
    summary = r.stderr.decode()
    values = q1(f"SELECT count(img) FROM read_parquet({lit(inp)})")
    distinct = q1(f"SELECT count(DISTINCT img) FROM read_parquet({lit(inp)})")
    assert f"20000 rows, {values} values, {distinct} distinct, {distinct} uploaded" in summary
    check_same_except(inp, out, "img", "img_sha256", form)
    assert check_chunks_copied(inp, out, "img", "img_sha256") > 0
    assert check_blobs(server, inp, "img") == int(distinct)
    assert [x for x in os.listdir(tmp_path) if x.startswith(".")] == []
    # a second run sends nothing: every value is deduplicated
    out2 = tmp_path / "out2.parquet"
    r = extract(server.url, inp, out2, "--column", "img", "--as", "img_sha256", "--form", form)
    assert r.returncode == 0 and " 0 uploaded (0 bytes)" in r.stderr.decode(), r.stderr.decode()
    assert out2.read_bytes() == out.read_bytes()


def test_keeps_name_metadata_and_nested(server, tmp_path):
    inp = tmp_path / "kv.parquet"
    duck("sql", f"COPY ({TABLE}) TO {lit(inp)} (FORMAT parquet, ROW_GROUP_SIZE 3000, "
                "KV_METADATA {owner: 'pipeline-7', note: 'kept'})")
    out = tmp_path / "out.parquet"
    r = extract(server.url, inp, out, "--column", "img")
    assert r.returncode == 0, r.stderr.decode()
    check_same_except(inp, out, "img", "img", "hex")
    kv = duck("query", f"SELECT decode(key) || '=' || decode(value) FROM "
                       f"parquet_kv_metadata({lit(out)}) ORDER BY 1")
    assert "note=kept" in kv and "owner=pipeline-7" in kv
    # the nested column, leaf by leaf, as DuckDB sees it
    assert duck("query", f"SELECT nested::VARCHAR FROM read_parquet({lit(out)}) LIMIT 2") == \
        ["{'a': 0, 'b': [0, 1], 'c': n0}", "{'a': 1, 'b': [1, 2], 'c': n1}"]
    groups = q1(f"SELECT count(DISTINCT row_group_id) FROM parquet_metadata({lit(out)})")
    assert groups == q1(f"SELECT count(DISTINCT row_group_id) FROM parquet_metadata({lit(inp)})")


def test_directory(server, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    make(d, "a.parquet", "snappy")
    make(d, "b.parquet", "zstd", table=TABLE.replace("range(20000)", "range(20000, 25000)"))
    (d / "notes.txt").write_text("not parquet")
    out = tmp_path / "out"
    r = extract(server.url, d, out, "--column", "img", "--as", "h")
    assert r.returncode == 0, r.stderr.decode()
    assert sorted(os.listdir(out)) == ["a.parquet", "b.parquet"]
    assert "2 file(s): 25000 rows" in r.stderr.decode()
    for n in ("a.parquet", "b.parquet"):
        check_same_except(d / n, out / n, "img", "h", "hex")


def test_failure_leaves_no_out_and_names_the_row(tmp_path):
    # the server refuses blobs over 1000 bytes, and only row 12345 holds such a value
    srv = Server(tmp_path / "data", config_text="[server]\nmax_blob_size = 1000\n").start()
    try:
        inp = make(tmp_path, "in.parquet",
                   table=TABLE.replace("repeat('x', i % 300)", "repeat('x', (i = 12345)::INT * 2000)"))
        out = tmp_path / "out.parquet"
        r = extract(srv.url, inp, out, "--column", "img")
        err = r.stderr.decode()
        assert r.returncode == 1 and "row 12345" in err and "too_large" in err, err
        assert not out.exists()
        assert [x for x in os.listdir(tmp_path) if x.startswith(".")] == []
    finally:
        assert srv.stop() == 0
    # no server at all: the first lookup fails, nothing is written
    r = extract(f"http://127.0.0.1:{free_port()}", inp, out, "--column", "img")
    assert r.returncode == 1 and "cannot reach" in r.stderr.decode() and not out.exists()


def test_server_dies_midway(tmp_path):
    srv = Server(tmp_path / "data").start()
    # many row groups of distinct 20 KiB values; the server is killed once uploads are flowing
    table = ("SELECT i AS id, (repeat(md5(i::VARCHAR), 640))::BLOB AS img "
             "FROM range(6000) r(i)")
    inp = make(tmp_path, "in.parquet", rows=200, table=table)
    out = tmp_path / "out.parquet"
    cmd = [BLOBREF, "--server", srv.url, "extract-parquet", str(inp), str(out), "--column", "img",
           "--jobs", "2"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    import time
    deadline = time.time() + 60
    while time.time() < deadline:
        n = len(list((tmp_path / "data" / "blobs").rglob("*"))) if (tmp_path / "data" / "blobs").exists() else 0
        if n > 300:
            break
        time.sleep(0.02)
    srv.stop(sig=9)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, err.decode()
    assert "row " in err.decode()
    assert not out.exists()
    assert [x for x in os.listdir(tmp_path) if x.startswith(".")] == []


def test_bad_arguments(server, tmp_path):
    inp = make(tmp_path, "in.parquet", rows=20000)
    out = tmp_path / "out.parquet"
    cases = [
        (["--column", "nested.a"], "nested"),
        (["--column", "id"], "not BYTE_ARRAY"),
        (["--column", "nope"], "no column named nope"),
        (["--column", "img", "--as", "cat"], "already has a column named cat"),
    ]
    for args, msg in cases:
        r = extract(server.url, inp, out, *args)
        assert r.returncode == 1 and msg in r.stderr.decode(), (args, r.stderr.decode())
        assert not out.exists()
    r = extract(server.url, inp, out, "--column", "img", "--form", "url")
    assert r.returncode == 2
    r = extract(server.url, inp, out)
    assert r.returncode == 2 and b"--column" in r.stderr
    r = extract(server.url, tmp_path / "absent.parquet", out, "--column", "img")
    assert r.returncode == 1
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really PAR1")
    r = extract(server.url, tmp_path / "junk.parquet", out, "--column", "img")
    assert r.returncode == 1 and not out.exists()


def parquet_testing_files():
    base = need_testdata("parquet-testing", "data")
    for p in sorted(base.glob("*.parquet")):
        yield p


def test_parquet_testing_files(server, tmp_path):
    """Files of parquet-testing with a top-level binary column: where both our reader and DuckDB
    read them, OUT equals IN but for the column."""
    done = []
    for p in parquet_testing_files():
        try:
            cols = columns(p)
        except AssertionError:
            continue  # our reader refuses the file (unsupported or malformed): nothing to extract
        names = {c["path"] for c in cols}
        types = None  # DuckDB's column types, asked once per file (a node start each)
        for c in cols:
            if c["type"] != 6 or c["max_rep"] != 0 or "." in c["path"] or c["max_def"] > 1:
                continue
            if types is None:
                try:
                    types = describe(p)
                    duck("query", f"SELECT count(*) FROM read_parquet({lit(p)}) t "
                                  "WHERE t::VARCHAR IS NOT NULL")  # every column decoded
                except AssertionError:
                    break  # DuckDB cannot read it: nothing to compare with
            if types.get(c["path"]) not in ("VARCHAR", "BLOB"):
                continue  # BYTE_ARRAY as DECIMAL, JSON, ...: DuckDB's sha256 takes text or bytes
            new = c["path"] + "_sha256"
            if new in names:
                continue
            out = tmp_path / f"{p.stem}.{c['path']}.parquet"
            r = extract(server.url, p, out, "--column", c["path"], "--as", new)
            if r.returncode != 0:
                # only our reader's refusals are acceptable, never a crash
                assert r.returncode == 1 and b"Sanitizer" not in r.stderr, r.stderr.decode()
                assert not out.exists()
                continue
            check_same_except(p, out, c["path"], new, "hex")
            done.append((p.name, c["path"]))
            break
    assert len(done) >= 5, done
