"""`blobref refs` on Delta Lake tables: --files on every real table of ../shared/testdata/delta
against a replay written here (JSON commits in Python, Parquet checkpoints read by DuckDB), and
against the counts its index.md records."""
import datetime
import json
import os
import re
import shutil
import subprocess
import urllib.parse

import pytest

from conftest import BIN_DIR, JS_DIR, TESTDATA

HERE = os.path.dirname(os.path.abspath(__file__))
DUCK = os.path.join(HERE, "parquet_duck.mjs")
DELTA = TESTDATA / "delta"
COMMIT = re.compile(r"^(\d+)\.json$")
CLASSIC = re.compile(r"^(\d+)\.checkpoint\.parquet$")


def duck_query(sql):
    r = subprocess.run(["node", DUCK, "query", sql], capture_output=True, timeout=300, cwd=JS_DIR)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def lit(s):
    return "'" + str(s).replace("'", "''") + "'"


def index_counts():
    """{table: distinct referenced paths} from index.md."""
    out = {}
    path = DELTA / "index.md"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and re.match(r"^\d+ \(", cells[5]):
            out[cells[0]] = int(cells[5].split()[0])
    return out


INDEX = index_counts()


def local(table, recorded):
    """The local path of a recorded (percent-encoded) path, decoded once."""
    p = urllib.parse.unquote(recorded)
    if p.startswith("file://"):
        return p[len("file://"):]
    return os.path.join(os.path.realpath(table), p)


def checkpoint_adds(ckpt_files):
    paths = []
    for f in ckpt_files:
        paths += duck_query(f"SELECT add.path FROM read_parquet({lit(f)}) WHERE add IS NOT NULL")
    return paths


def expected_files(table):
    """The replay of the issue's rule: versions from commit 0 (or the oldest classic checkpoint)
    to the latest; per version its live files and its commit's cdc files."""
    log = os.path.join(table, "_delta_log")
    names = os.listdir(log)
    commits = {int(m.group(1)): n for n in names if (m := COMMIT.match(n))}
    ckpts = {int(m.group(1)): n for n in names if (m := CLASSIC.match(n))}
    latest = max(list(commits) + list(ckpts))
    first = 0 if 0 in commits else min(ckpts)
    live, lines = set(), set()
    for v in range(first, latest + 1):
        assert v in commits or v in ckpts
        from_ckpt = (v == first and first > 0) or v not in commits
        if from_ckpt:
            live = {local(table, p) for p in checkpoint_adds([os.path.join(log, ckpts[v])])}
        cdc = set()
        if v in commits:
            adds, removes = set(), set()
            with open(os.path.join(log, commits[v])) as f:
                for line in f:
                    if not line.strip():
                        continue
                    action = json.loads(line)
                    if "add" in action:
                        adds.add(local(table, action["add"]["path"]))
                    if "remove" in action:
                        removes.add(local(table, action["remove"]["path"]))
                    if "cdc" in action:
                        cdc.add(local(table, action["cdc"]["path"]))
            if not from_ckpt:
                live = (live - removes) | adds
        lines |= {f"{v}\t{p}" for p in live | cdc}
    return sorted(lines)


def run_refs(*args, timeout=120):
    return subprocess.run([str(BIN_DIR / "blobref"), "refs", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


TABLES = sorted(p.name for p in DELTA.iterdir() if (p / "_delta_log").is_dir()) \
    if DELTA.is_dir() else []


@pytest.mark.parametrize("name", TABLES or ["<no testdata>"])
def test_testdata_table_files(name):
    if not TABLES:
        pytest.skip("../shared/testdata/delta is absent")
    table = DELTA / name
    res = run_refs(table, "--files")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines == sorted(set(lines)), "output must be sorted and unique"
    assert lines == expected_files(str(table))
    if name in INDEX:
        assert len({line.split("\t")[1] for line in lines}) == INDEX[name]


CHECKPOINTED = ["simple_table_with_checkpoint", "delta-0.2.0", "delta-1.2.1-only-struct-stats",
                "delta-checkpoint-stats-optional", "issue_1374"]


@pytest.mark.parametrize("name", CHECKPOINTED)
def test_checkpoint_is_the_oldest_retained_version(tmp_path, name):
    """Without commit 0 the oldest checkpoint is where the retained versions start: its adds are
    read from the Parquet checkpoint (nested add.path); older commits left in the log are not
    versions (commits 1.. before a checkpoint at N retain N and later only)."""
    src = DELTA / name
    if not src.is_dir():
        pytest.skip("testdata absent")
    table = tmp_path / name
    shutil.copytree(src, table)
    os.remove(table / "_delta_log" / "00000000000000000000.json")
    res = run_refs(table, "--files")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    expected = expected_files(str(table))
    ckpt = min(int(m.group(1)) for n in os.listdir(table / "_delta_log")
               if (m := CLASSIC.match(n)))
    assert min(int(line.split("\t")[0]) for line in lines) == ckpt
    assert lines == expected
    assert lines, "a checkpointed table references its live files"


def test_special_partition_path_is_decoded_once():
    """`x=A%252FA/...` in the log is the folder `x=A%2FA` on disk."""
    table = DELTA / "delta-0.8.0-special-partition"
    if not table.is_dir():
        pytest.skip("testdata absent")
    res = run_refs(table, "--files")
    assert res.returncode == 0, res.stderr
    paths = [line.split("\t")[1] for line in res.stdout.splitlines()]
    assert paths and all(os.path.exists(p) for p in paths), paths
    assert any("%2F" in p for p in paths)


def test_files_never_opens_data_files():
    """The `checkpoints` table keeps only its log: --files still lists its 12 files."""
    table = DELTA / "checkpoints"
    if not table.is_dir():
        pytest.skip("testdata absent")
    res = run_refs(table, "--files")
    assert res.returncode == 0, res.stderr
    paths = {line.split("\t")[1] for line in res.stdout.splitlines()}
    assert len(paths) == 12 and not any(os.path.exists(p) for p in paths)


def test_column_mapping_reads_the_physical_column():
    """Column mapping `name`: `--column "Super Name"` reads the file column the schema names
    `col-3877fd94-...` (its values are names, not hashes: each is counted and warned about)."""
    table = DELTA / "table_with_column_mapping"
    if not table.is_dir():
        pytest.skip("testdata absent")
    res = run_refs(table, "--column", "Super Name", "--form", "url")
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    m = re.search(r"warning: (\d+) of (\d+) values in column 'Super Name' are not hashes", res.stderr)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) > 0, res.stderr
    res = run_refs(table, "--column", "no such column")
    assert res.returncode == 1 and "no column 'no such column'" in res.stderr, res.stderr


def iso_ms(ms):
    d = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def expected_versions(table):
    """Each retained version and its commit time: commitInfo's inCommitTimestamp, else its
    timestamp; '-' for a version with no commit file or no commitInfo time."""
    log = os.path.join(table, "_delta_log")
    names = os.listdir(log)
    commits = {int(m.group(1)): n for n in names if (m := COMMIT.match(n))}
    ckpts = {int(m.group(1)) for n in names if (m := CLASSIC.match(n))}
    latest = max(list(commits) + list(ckpts))
    first = 0 if 0 in commits else min(ckpts)
    out = []
    for v in range(first, latest + 1):
        ts = "-"
        if v in commits:
            with open(os.path.join(log, commits[v])) as f:
                for line in f:
                    ci = json.loads(line).get("commitInfo") if line.strip() else None
                    if isinstance(ci, dict):
                        t = ci.get("inCommitTimestamp", ci.get("timestamp"))
                        if isinstance(t, int):
                            ts = iso_ms(t)
        out.append(f"{v}\t{ts}")
    return out


@pytest.mark.parametrize("name", TABLES or ["<no testdata>"])
def test_testdata_table_versions(name):
    """`refs --versions`: every retained version of each real table with its commit time, the
    in-commit timestamp first (cdc_ict_table's differ from its commitInfo.timestamp)."""
    if not TABLES:
        pytest.skip("../shared/testdata/delta is absent")
    table = DELTA / name
    res = run_refs(table, "--versions")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == expected_versions(str(table))
    if name == "cdc_ict_table":
        assert "1\t2023-05-12T06:50:06.883Z" in res.stdout.splitlines()
