"""`blobref column` on Parquet files written by DuckDB (the ORC side is test_orc.py): a string
column as JSON strings, a binary column as lowercase hex, nulls as null, file order; refusals."""
import json
import subprocess

from conftest import BIN_DIR
from reconcile_util import IceTable, in_form, sha


def column(path, name):
    return subprocess.run([str(BIN_DIR / "blobref"), "column", str(path), "--name", name],
                          capture_output=True, text=True, timeout=60)


def test_parquet_string_and_binary_columns(tmp_path):
    hs = [sha(f"col-{i}".encode()) for i in range(7)]
    t = IceTable(tmp_path / "t")
    t.write_data({"s.parquet": hs}, extra=(None, 'quote " and \\ and \u00e9'))
    p = column(t.data_path("s.parquet"), "image_sha256")
    assert p.returncode == 0, p.stderr
    want = [in_form(h, "hex", i) for i, h in enumerate(hs)] + [None, 'quote " and \\ and \u00e9']
    assert [json.loads(line) for line in p.stdout.splitlines()] == want

    b = IceTable(tmp_path / "b", form="binary", column="digest")
    b.write_data({"b.parquet": hs})
    p = column(b.data_path("b.parquet"), "digest")
    assert p.returncode == 0, p.stderr
    assert [json.loads(line) for line in p.stdout.splitlines()] == hs + [None]


def test_refusals(tmp_path):
    t = IceTable(tmp_path / "t")
    t.write_data({"s.parquet": [sha(b"x")]})
    p = column(t.data_path("s.parquet"), "nope")
    assert p.returncode == 1 and "no top-level column 'nope'" in p.stderr and p.stdout == ""
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello world")
    p = column(junk, "x")
    assert p.returncode == 1 and "not a Parquet or ORC file" in p.stderr
    p = column(tmp_path / "missing.parquet", "x")
    assert p.returncode == 1 and "missing.parquet" in p.stderr
    p = subprocess.run([str(BIN_DIR / "blobref"), "column", str(junk)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "--name COL is required" in p.stderr


def test_bytes_that_are_not_utf8_become_u_fffd_and_a_warning(tmp_path):
    """A string column may hold any bytes (ORC and Parquet do not check them); the output stays
    one valid JSON value per line: each byte outside well-formed UTF-8 is U+FFFD, one warning."""
    from orc_write import orc_file
    values = [b"plain", "caf\u00e9 \u2603 \U0001F600".encode(), b"bad \xff byte",
              b"\xc0\xaf overlong", b"\xed\xa0\x80 surrogate", b"cut \xe2\x82", None]
    f = tmp_path / "mixed.orc"
    f.write_bytes(orc_file("s", values))
    p = subprocess.run([str(BIN_DIR / "blobref"), "column", str(f), "--name", "s"],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode("utf-8").splitlines()  # strict: the output is UTF-8
    assert [json.loads(line) for line in lines] == [
        "plain", "caf\u00e9 \u2603 \U0001F600", "bad \ufffd byte", "\ufffd\ufffd overlong",
        "\ufffd\ufffd\ufffd surrogate", "cut \ufffd\ufffd", None]
    assert p.stderr.decode() == ("blobref column: 4 values of 's' held bytes that are not "
                                 "UTF-8, printed as U+FFFD\n"), p.stderr
