"""Cross-checks of blobref's Parquet reader against parquet-testing expectations and DuckDB."""
import csv
import json
import os
import pathlib
import subprocess

import pytest

from conftest import BIN_DIR, JS_DIR, ROOT, TESTDATA, need_testdata

HERE = pathlib.Path(__file__).resolve().parent
DUCK = HERE / "parquet_duck.mjs"
# Files upstream documents as malformed or as a resource bomb: an error is the right answer.
MUST_FAIL_SOMEWHERE = {"nation.dict-malformed.parquet", "large_string_map.brotli.parquet"}
INTS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
        "UBIGINT"}


def dump_bin():
    env = os.environ.get("PARQUET_DUMP")
    cands = [pathlib.Path(env)] if env else []
    cands += [BIN_DIR.parent / "tests" / "test_parquet_dump",
              ROOT / "build" / "san" / "tests" / "test_parquet_dump",
              ROOT / "build" / "release" / "tests" / "test_parquet_dump"]
    for c in cands:
        if c.exists():
            return c
    pytest.skip("test_parquet_dump is not built")


def run(*args, stdin=None):
    return subprocess.run([str(dump_bin()), *map(str, args)], input=stdin, capture_output=True,
                          timeout=300)


def columns(path):
    r = run("--list", path)
    assert r.returncode == 0, r.stderr.decode()
    cols = []
    for line in r.stdout.decode().splitlines():
        f = line.split("\t")
        if f[0] == "col":
            cols.append({"path": f[1], "type": int(f[2]), "len": int(f[3]), "max_def": int(f[4]),
                         "max_rep": int(f[5])})
    return cols


def dump(path, col):
    """(returncode, values, stderr): values are bytes or None, in row order."""
    r = run("--dump", path, col)
    err = r.stderr.decode(errors="replace")
    assert r.returncode in (0, 2), f"crash ({r.returncode}) on {path} {col}:\n{err}"
    assert "Sanitizer" not in err, err
    vals = []
    for line in r.stdout.decode().splitlines():
        vals.append(None if line == "N" else bytes.fromhex(line[1:]))
    return r.returncode, vals, err


def dump_all(path):
    """{column path: (rc, values, message)} for every leaf, from one process."""
    r = run("--dumpall", path)
    err = r.stderr.decode(errors="replace")
    assert r.returncode in (0, 2), f"crash ({r.returncode}) on {path}:\n{err}"
    assert "Sanitizer" not in err, err
    out, cur, vals = {}, None, []
    for line in r.stdout.decode(errors="replace").splitlines():
        if line.startswith("C\t"):
            cur, vals = line[2:], []
        elif line.startswith("R\t"):
            f = line.split("\t", 2)
            out[cur] = (int(f[1]), vals, f[2])
        else:
            vals.append(None if line == "N" else bytes.fromhex(line[1:]))
    return out


def duck(mode, arg):
    r = subprocess.run(["node", str(DUCK), mode, str(arg)], capture_output=True, timeout=300,
                       cwd=JS_DIR)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def as_duck(b, ptype, dtype):
    """Our bytes rendered the way parquet_duck.mjs renders DuckDB's value."""
    if b is None:
        return None
    if dtype in INTS:
        return str(int.from_bytes(b, "little", signed=not dtype.startswith("U")))
    return b.hex().upper() if dtype in ("VARCHAR", "BLOB") else b.hex()


def compare_with_duckdb(path, dumped=None):
    """Every flat BYTE_ARRAY / FLBA / INT column must equal what DuckDB reads. Returns count."""
    ours = {c["path"]: c for c in columns(path)}
    dumped = dumped if dumped is not None else dump_all(path)
    checked = 0
    for dc in duck("read", path)["columns"]:
        c = ours.get(dc["name"])
        if c is None or c["max_rep"] or dc["values"] is None or c["type"] not in (1, 2, 6, 7):
            continue
        if c["type"] == 7 and dc["type"] not in ("BLOB", "UUID"):
            continue
        if c["type"] in (1, 2) and dc["type"] not in INTS:
            continue
        rc, vals, err = dumped[c["path"]]
        assert rc == 0, f"{path} {c['path']}: {err}"
        got = [as_duck(v, c["type"], dc["type"]) for v in vals]
        assert got == dc["values"], f"{path} {c['path']} differs from DuckDB"
        checked += 1
    return checked


def _parquet_testing_files():
    base = TESTDATA / "parquet-testing"
    if not base.exists():
        return []
    return sorted(base.glob("data/*.parquet")) + sorted(base.glob("duckdb_compression_matrix/*.parquet"))


@pytest.mark.parametrize("path", _parquet_testing_files(), ids=lambda p: p.name)
def test_testing_file_matches_duckdb(path):
    need_testdata("parquet-testing")
    dumped = dump_all(path)
    assert len(dumped) == len(columns(path))
    failures = [(p, d[2]) for p, d in dumped.items() if d[0]]
    if path.name in MUST_FAIL_SOMEWHERE:
        assert failures, f"{path.name} should be rejected"
        return
    assert not failures, failures
    compare_with_duckdb(path, dumped)


def test_expect_csvs():
    base = need_testdata("parquet-testing", "data")
    checked = 0
    for exp in sorted(base.glob("*_expect.csv")):
        pq = base / exp.name.replace("_expect.csv", ".parquet")
        with open(exp, newline="") as fh:
            rows = list(csv.reader(fh))
        header = [h.strip() for h in rows[0]]
        ours = {c["path"].strip().rstrip(":"): c for c in columns(pq)}
        for i, name in enumerate(header):
            c = ours[name]
            rc, vals, err = dump(pq, c["path"])
            assert rc == 0, err
            want = [r[i] for r in rows[1:]]
            got = []
            for v in vals:
                if v is None:
                    got.append("")
                elif c["type"] in (1, 2):
                    got.append(str(int.from_bytes(v, "little", signed=True)))
                else:
                    got.append(v.decode())
            assert got == want, f"{exp.name} column {name}"
            checked += 1
    assert checked >= 40


def matrix_expected():
    p = need_testdata("parquet-testing", "duckdb_compression_matrix",
                      "test_parquet_reader_compression.test")
    rows = []
    for line in p.read_text().splitlines():
        f = line.split("\t")
        if len(f) == 4 and f[0].isdigit():
            rows.append(f)
        if len(rows) == 30:
            break
    return rows


def test_compression_matrix_values():
    base = need_testdata("parquet-testing", "duckdb_compression_matrix")
    rows = matrix_expected()
    want_lists = []
    for r in rows:
        if r[3] in ("NULL", "[]"):
            want_lists.append(None)
        else:
            want_lists += [None if x == "NULL" else int(x) for x in r[3][1:-1].split(", ")]
    files = sorted(base.glob("*.parquet"))
    assert len(files) == 12
    for f in files:
        cols = columns(f)
        assert len(cols) == 5, cols
        got = {}
        for c in cols:
            rc, vals, err = dump(f, c["path"])
            assert rc == 0, f"{f.name} {c['path']}: {err}"
            got[c["path"]] = vals
        first, second, sstr, _sint, lst = [c["path"] for c in cols]
        ints = lambda vs: [None if v is None else int.from_bytes(v, "little", signed=True) for v in vs]
        assert ints(got[first]) == [int(r[0]) for r in rows], f.name
        assert ints(got[second]) == [int(r[1]) for r in rows], f.name
        want_s = []
        for r in rows:
            if r[2] == "NULL" or "'string': NULL" in r[2]:
                want_s.append(None)
            else:
                want_s.append(r[2].split("'string': ")[1].split(",")[0].encode())
        assert got[sstr] == want_s, f.name
        assert ints(got[lst]) == want_lists, f.name


def test_bad_data_fails_cleanly():
    base = need_testdata("parquet-testing", "bad_data")
    for f in sorted(base.glob("*.parquet")):
        r = run("--list", f)
        assert r.returncode in (0, 2), f"crash listing {f.name}: {r.stderr.decode()}"
        if r.returncode == 2:
            assert r.stderr.decode().startswith("ERROR: parquet:"), r.stderr
            continue
        errors = 0
        for path, (rc, vals, err) in dump_all(f).items():
            if rc:
                assert err.startswith("parquet:"), err
                errors += 1
        if f.name == "ARROW-GH-43605.parquet":
            # bit width 0 for dictionary indices is decodable (every index is 0); DuckDB reads
            # the same values, so agreement is the check here
            assert compare_with_duckdb(f) >= 1
        else:
            assert errors, f"{f.name}: no column was rejected"


def test_iceberg_many_row_groups():
    p = need_testdata("iceberg")
    files = sorted(p.rglob("*.parquet"))
    if not files:
        pytest.skip("no iceberg parquet files")
    checked = 0
    for f in files[:4]:
        checked += compare_with_duckdb(f)
    assert checked > 0
