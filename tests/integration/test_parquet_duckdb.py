"""Files written by DuckDB (every codec, page v1/v2, dictionary or plain) read by ours, and files
written by ours read by DuckDB."""
import json
import random

import pytest

from test_parquet_read import columns, compare_with_duckdb, duck, dump_all, run

CODECS = ["uncompressed", "snappy", "gzip", "zstd", "lz4_raw", "brotli"]
TABLE = """SELECT i::BIGINT AS id,
  CASE WHEN i % 7 = 3 THEN NULL ELSE sha256(i::VARCHAR) END AS h,
  CASE WHEN i % 5 = 0 THEN NULL ELSE (i % 1000)::INTEGER END AS small,
  md5(i::VARCHAR)::UUID AS u,
  ('cat' || (i % 50))::VARCHAR AS cat,
  CASE WHEN i % 11 = 0 THEN NULL ELSE unhex(md5((i * 3)::VARCHAR)) END AS b
FROM range(30000) r(i)"""


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("version", ["V1", "V2"])
@pytest.mark.parametrize("dictionary", [True, False])
def test_duckdb_written_files(tmp_path, codec, version, dictionary):
    path = tmp_path / f"t_{codec}_{version}.parquet"
    opts = f"FORMAT parquet, COMPRESSION {codec}, PARQUET_VERSION {version}, ROW_GROUP_SIZE 4096"
    if not dictionary:
        opts += ", DICTIONARY_SIZE_LIMIT 0"
    duck("sql", f"COPY ({TABLE}) TO '{path}' ({opts})")
    meta = duck("query", f"SELECT count(DISTINCT row_group_id) FROM parquet_metadata('{path}')")
    assert int(meta[0]) >= 3, "want several row groups"
    assert compare_with_duckdb(path) == 6
    # the hash column, independently of DuckDB's reader: sha256 of the row number as text
    import hashlib
    got = dump_all(path)["h"]
    assert got[0] == 0
    want = [None if i % 7 == 3 else hashlib.sha256(str(i).encode()).hexdigest().encode()
            for i in range(30000)]
    assert got[1] == want


SPECS = ["s:ba:opt:utf8", "h:flba:32", "n:i64:opt", "k:i32", "raw:ba"]


def random_rows(rng, n):
    rows = []
    for i in range(n):
        s = None if rng.random() < 0.2 else "".join(rng.choice("abcxyz-") for _ in range(rng.randrange(0, 40)))
        h = rng.randbytes(32)
        v = None if rng.random() < 0.3 else rng.randrange(-2**63, 2**63)
        k = rng.randrange(-2**31, 2**31)
        raw = rng.randbytes(rng.randrange(0, 300))
        rows.append((s, h, v, k, raw))
    return rows


def cell(x, kind):
    if x is None:
        return "N"
    if kind == "s":
        return "v" + x.encode().hex()
    if kind == "i64":
        return "v" + x.to_bytes(8, "little", signed=True).hex()
    if kind == "i32":
        return "v" + x.to_bytes(4, "little", signed=True).hex()
    return "v" + x.hex()


@pytest.mark.parametrize("codec", [0, 1, 2, 4, 6, 7])
def test_our_writer_read_by_duckdb(tmp_path, codec):
    rng = random.Random(codec)
    rows = random_rows(rng, 7000)
    text = "".join("\t".join([cell(r[0], "s"), cell(r[1], "b"), cell(r[2], "i64"),
                              cell(r[3], "i32"), cell(r[4], "b")]) + "\n" for r in rows)
    path = tmp_path / f"ours_{codec}.parquet"
    r = run("--write", path, codec, 1000, *SPECS, stdin=text.encode())
    assert r.returncode == 0, r.stderr.decode()
    got = {c["name"]: c for c in duck("read", path)["columns"]}
    assert got["s"]["type"] == "VARCHAR" and got["n"]["type"] == "BIGINT"
    assert got["s"]["values"] == [None if x[0] is None else x[0].encode().hex().upper() for x in rows]
    assert got["h"]["values"] == [x[1].hex().upper() for x in rows]
    assert got["n"]["values"] == [None if x[2] is None else str(x[2]) for x in rows]
    assert got["k"]["values"] == [str(x[3]) for x in rows]
    assert got["raw"]["values"] == [x[4].hex().upper() for x in rows]
    groups = duck("query", f"SELECT count(DISTINCT row_group_id) FROM parquet_metadata('{path}')")
    assert int(groups[0]) == 7
    # and our own reader agrees with DuckDB on the file we wrote
    assert compare_with_duckdb(path) == 5


def test_writer_rejects_bad_rows(tmp_path):
    path = tmp_path / "bad.parquet"
    r = run("--write", path, 0, 100, "h:flba:32", stdin=b"vabcd\n")
    assert r.returncode == 2 and b"wants 32 bytes" in r.stderr
    r = run("--write", path, 0, 100, "k:i32", stdin=b"N\n")
    assert r.returncode == 2 and b"null in required column" in r.stderr
