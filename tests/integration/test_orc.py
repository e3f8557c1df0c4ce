"""`blobref column` on ORC files: apache/orc's example files (../shared/testdata/orc) against
their expected rows (every top-level string and binary column), the files with other shapes
(no stripes, old writers, other codecs), and the corrupt ones refused with a clear error."""
import gzip
import json
import subprocess

import pytest

from conftest import BIN_DIR, need_testdata

# (file, column, kind) for every top-level string/binary column that has expected rows
# (from testdata/orc/index.md); kind decides how the expected value is written.
EXPECTED = [
    ("TestOrcFile.columnProjection.orc", "string1", "string"),  # DIRECT_V2, 5 stripes
    ("TestOrcFile.emptyFile.orc", "string1", "string"),  # no stripes
    ("TestOrcFile.emptyFile.orc", "bytes1", "binary"),
    ("TestOrcFile.metaData.orc", "bytes1", "binary"),  # a null
    ("TestOrcFile.metaData.orc", "string1", "string"),  # DICTIONARY_V2, a null
    ("TestOrcFile.test1.orc", "bytes1", "binary"),  # zlib
    ("TestOrcFile.test1.orc", "string1", "string"),
    ("TestOrcFile.testMemoryManagementV11.orc", "string1", "string"),  # DICTIONARY, RLE v1
    ("TestOrcFile.testMemoryManagementV12.orc", "string1", "string"),
    ("TestOrcFile.testPredicatePushdown.orc", "string1", "string"),
    ("TestOrcFile.testStringAndBinaryStatistics.orc", "bytes1", "binary"),  # present streams
    ("TestOrcFile.testStringAndBinaryStatistics.orc", "string1", "string"),
    ("TestOrcFile.testStripeLevelStats.orc", "string1", "string"),  # DICTIONARY_V2, 3 stripes
    ("TestStringDictionary.testRowIndex.orc", "str", "string"),
    ("orc_index_int_string.orc", "_col1", "string"),  # varchar
    ("orc_split_elim.orc", "string1", "string"),
    ("orc_split_elim_cpp.orc", "string1", "string"),
    ("orc_split_elim_new.orc", "string1", "string"),
]


def column(path, name, timeout=120):
    return subprocess.run([str(BIN_DIR / "blobref"), "column", str(path), "--name", name],
                          capture_output=True, text=True, timeout=timeout)


def expected_values(name, col, kind):
    rows = [json.loads(line) for line in gzip.open(need_testdata("orc", "expected", name[:-4] +
                                                                 ".jsn.gz"), "rt") if line.strip()]
    out = []
    for r in rows:
        v = r[col]
        out.append(bytes(v).hex() if kind == "binary" and v is not None else v)
    return out


@pytest.mark.parametrize("name,col,kind", EXPECTED, ids=[f"{n}:{c}" for n, c, _ in EXPECTED])
def test_orc_example_matches_expected_rows(name, col, kind):
    want = expected_values(name, col, kind)
    p = column(need_testdata("orc", name), col)
    assert p.returncode == 0, p.stderr
    got = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(got) == len(want)
    assert got == want


# Files without expected rows: (file, column, rows, first value, last value). Row counts are the
# footers' (index.md); the values are what this reader printed when it was written (a regression
# check; demo-11 against demo-12 below is the independent one).
@pytest.mark.parametrize("name,col,rows,first,last", [
    ("bad_bloom_filter_1.6.0.orc", "name", 5, "Alice", "Mike"),
    ("bad_bloom_filter_1.6.11.orc", "name", 5, "Alice", "Mike"),
    ("TestOrcFile.testSargSkipPickupGroupWithoutIndexJava.orc", "y", 10000, None, "Last-29997"),
    ("demo-12-zlib.orc", "_col5", 1920800, "Good", "Unknown"),  # DICTIONARY_V2, one big stripe
    ("demo-11-zlib.orc", "_col1", 1920800, "M", "F"),  # DICTIONARY (v1), 385 stripes
])
def test_orc_other_examples(name, col, rows, first, last):
    p = column(need_testdata("orc", name), col)
    assert p.returncode == 0, p.stderr
    got = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(got) == rows
    if first is not None:
        assert got[0] == first
    if last is not None:
        assert got[-1] == last


def test_orc_demo_11_and_12_agree():
    """The same table written as ORC 0.11 (DICTIONARY, RLE v1) and 0.12 (DICTIONARY_V2, RLE v2)."""
    for col in ("_col1", "_col2", "_col3", "_col5"):
        a = column(need_testdata("orc", "demo-11-zlib.orc"), col)
        b = column(need_testdata("orc", "demo-12-zlib.orc"), col)
        assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
        assert a.stdout == b.stdout and a.stdout.count("\n") == 1920800


@pytest.mark.parametrize("name,col,message", [
    ("zero.orc", "x", "not a Parquet or ORC file"),
    ("TestVectorOrcFile.testLzo.orc", "x", "LZO compression is not supported"),
    ("TestVectorOrcFile.testLz4.orc", "x", "not a string or binary column"),
    ("version1999.orc", "x", "no top-level column 'x'"),
    ("TestOrcFile.test1.orc", "int1", "not a string or binary column"),
    ("TestOrcFile.test1.orc", "nope", "no top-level column 'nope'"),
])
def test_orc_refusals(name, col, message):
    p = column(need_testdata("orc", name), col)
    assert p.returncode == 1
    assert message in p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize("name,col,message", [
    ("missing_blob_stream_in_string_dict.orc", "string_col", "no DICTIONARY_DATA stream"),
    ("missing_length_stream_in_string_dict.orc", "string_col", "no LENGTH stream"),
    ("missing_length_stream_in_string_dict.orc", "date_string_col", "no LENGTH stream"),
    ("negative_dict_entry_lengths.orc", "date_string_col", "runs past the dictionary data"),
])
def test_orc_corrupt_files_refused(name, col, message):
    p = column(need_testdata("orc", "corrupt", name), col, timeout=30)
    assert p.returncode == 1, p.stdout[-300:]
    assert message in p.stderr
    assert "ERROR: AddressSanitizer" not in p.stderr and "runtime error" not in p.stderr
    assert p.stdout == ""  # the bad stripe is the first: nothing printed before the error
