"""`blobref refs --files` on the real-engine Iceberg tables in ../shared/testdata/iceberg: per
snapshot, the live data files must match what FACTS.md records (summary counts and row totals,
and together every data file of the table), and incomplete tables must fail closed."""
import json
import re
import subprocess

import pytest

from conftest import BIN_DIR, TESTDATA


def parse_facts():
    path = TESTDATA / "iceberg" / "FACTS.md"
    if not path.exists():
        return {}
    tables, cur = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("### "):
            cur = {"files": {}, "snapshots": [], "schema": []}
            tables[line[4:].strip()] = cur
        elif cur is None:
            continue
        elif line.startswith("- ") and ": " in line:
            name, rest = line[2:].split(": ", 1)
            cur["files"][name] = rest
            if name.endswith(".metadata.json") and "snapshots=" in rest:
                cur["snapshots"] = []  # the latest metadata file's snapshot lines follow
        elif line.startswith("  - snapshot "):
            m = re.match(r"  - snapshot (-?\d+) seq=\S+: (\{.*\}); manifest-list=(.*)$", line)
            assert m, line
            cur["snapshots"].append((int(m.group(1)), json.loads(m.group(2)), m.group(3)))
        elif line.startswith("  - current schema: "):
            cols = re.split(r", (?=[A-Za-z_][A-Za-z0-9_]*:)", line.split(": ", 1)[1])
            cur["schema"] = [c.split(":")[0] for c in cols]
    return {k: v for k, v in tables.items() if v["snapshots"]}


FACTS = parse_facts()


def parquet_info(facts):
    """{relative path: (rows, is_data)}: a data file holds every column of the current schema;
    delete files hold file_path/pos or only the equality columns."""
    out = {}
    for name, rest in facts["files"].items():
        m = re.match(r"parquet rows=(\d+) .*columns=\[([^\]]*)\]", rest)
        if not m:
            continue
        cols = {c.split(":")[0].split(".")[0] for c in m.group(2).split(", ")}
        out[name] = (int(m.group(1)), set(facts["schema"]) <= cols)
    return out


def run_files(folder, rewrite_from):
    args = [str(BIN_DIR / "blobref"), "refs", str(folder), "--files",
            "--rewrite", f"{rewrite_from}={folder}/"]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("table", sorted(FACTS) or ["<no FACTS.md>"])
def test_testdata_table_files(table):
    if table not in FACTS:
        pytest.skip("../shared/testdata/iceberg/FACTS.md is absent")
    facts = FACTS[table]
    folder = TESTDATA / "iceberg" / table
    first_list = facts["snapshots"][0][2]
    first_list = first_list.split("'")[1] if first_list.startswith("manifests=") else first_list
    rewrite_from = first_list[: first_list.rindex("metadata/")]  # the writer's table prefix
    res = run_files(folder, rewrite_from)

    listed = set(facts["files"])
    missing = [ml for _, _, ml in facts["snapshots"]
               if ml.endswith(".avro") and "metadata/" + ml.rsplit("/", 1)[1] not in listed]
    if missing:
        # The copy lacks a manifest list the metadata names: the walk must fail, naming it.
        assert res.returncode == 1, res.stdout
        assert res.stdout == ""
        assert missing[0].rsplit("/", 1)[1] in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
        return
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines == sorted(set(lines)), "output must be sorted and unique"
    per_snap = {}
    for line in lines:
        sid, path = line.split("\t")
        assert path.startswith(f"{folder}/"), path
        per_snap.setdefault(int(sid), set()).add(path[len(str(folder)) + 1:])
    info = parquet_info(facts)
    data_files = {p for p, (_, is_data) in info.items() if is_data}

    count = 0
    for sid, summary, _ in facts["snapshots"]:
        files = per_snap.get(sid, set())
        assert files <= data_files, f"snapshot {sid}: not data files: {files - data_files}"
        if "added-data-files" in summary or "deleted-data-files" in summary:
            count += int(summary.get("added-data-files", 0)) - int(summary.get("deleted-data-files", 0))
            assert len(files) == count, f"snapshot {sid}: {len(files)} files, summary says {count}"
        if "total-records" in summary:
            rows = sum(info[f][0] for f in files)
            assert rows == int(summary["total-records"]), f"snapshot {sid}: {rows} rows"
    assert set(per_snap) == {sid for sid, _, _ in facts["snapshots"]}
    assert set().union(*per_snap.values()) == data_files


def test_testdata_without_rewrite_fails_closed():
    """The BigQuery table records paths that are not under its location: without a rewrite the
    manifest list cannot be found, and that is an error, not an empty answer."""
    if "ddb_bigquery_table" not in FACTS:
        pytest.skip("testdata absent")
    folder = TESTDATA / "iceberg" / "ddb_bigquery_table"
    res = subprocess.run([str(BIN_DIR / "blobref"), "refs", str(folder), "--files"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stdout == ""
    assert "manifest-list-00000-of-00001.avro" in res.stderr
