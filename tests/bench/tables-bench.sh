#!/usr/bin/env bash
# Table readers benchmark (make bench-tables; issue 24): not part of make test, nothing asserted.
#  1. String-column decode, ORC against Parquet: `blobref column F.orc --name COL` against
#     `blobref column F.parquet --name COL`, where F.parquet holds the same values, written by
#     DuckDB from what `blobref column` prints for the ORC file. On the largest apache/orc example
#     files with a top-level string column (../shared/testdata/orc, as tests/integration/test_orc.py
#     uses them) and on a generated ORC file of ROWS 64-hex-char strings (the test suite's ORC
#     writer, tests/integration/orc_write.py: DIRECT_V2, zlib, 100k-row stripes). The ORC files are
#     zlib, so the Parquet twins are gzip (the same deflate): readers compared, not codecs.
#  2. Delta listing: a table of one Parquet checkpoint (DuckDB, nested add struct) and COMMITS
#     JSON commits after it (each adds a data file, every third also removes the oldest one; the
#     commits before the checkpoint are cleaned up), `blobref refs TABLE --files` against a small
#     Python replay of the same log (json lines) that prints the same lines.
# Whole-process wall times, median of ROUNDS rounds (each round runs A then B); ratios are A/B.
#
# usage: tests/bench/tables-bench.sh [BIN_DIR]   BIN_DIR: default bin (make all builds it)
# env:   ROWS=1000000 COMMITS=1000 ROUNDS=5 ORC_DIR=../shared/testdata/orc
#        OUT=build/bench/tables.md   KEEP=1 keeps the work directory
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(cd "${1:-$ROOT/bin}" && pwd)
ROWS=${ROWS:-1000000}
COMMITS=${COMMITS:-1000}
ROUNDS=${ROUNDS:-5}
ORC_DIR=${ORC_DIR:-$ROOT/../shared/testdata/orc}
[ -d "$ORC_DIR" ] || ORC_DIR=/work/shared/testdata/orc
OUT=${OUT:-$ROOT/build/bench/tables.md}

log() { printf '[bench-tables %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "FAILED: $*"
  exit 1
}
for t in node python3; do
  command -v "$t" >/dev/null || die "$t not found (make bench-tables installs it)"
done
[ -x "$BIN/blobref" ] || die "$BIN/blobref not found (make all builds it)"
if [ ! -d "$ROOT/tests/js/node_modules/@duckdb/node-api" ]; then
  log "npm ci in tests/js"
  (cd "$ROOT/tests/js" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/blobref-tables-bench.XXXXXX")
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then log "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
mkdir -p "$(dirname "$OUT")"

export BLOBREF="$BIN/blobref" BENCH_ROOT="$ROOT" BENCH_T="$T" ORC_DIR ROWS COMMITS ROUNDS OUT
python3 - <<'PY'
import hashlib, json, os, pathlib, statistics, subprocess, sys, time

ROOT = pathlib.Path(os.environ["BENCH_ROOT"])
T = pathlib.Path(os.environ["BENCH_T"])
BLOBREF = os.environ["BLOBREF"]
ORC_DIR = pathlib.Path(os.environ["ORC_DIR"])
ROWS, COMMITS, ROUNDS = (int(os.environ[k]) for k in ("ROWS", "COMMITS", "ROUNDS"))
DUCK = ROOT / "tests/integration/parquet_duck.mjs"
sys.path.insert(0, str(ROOT / "tests/integration"))
import orc_write  # noqa: E402


def log(msg):
    print(f"[bench-tables {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def lit(s):
    return "'" + str(s).replace("'", "''") + "'"


def duck(sql):
    r = subprocess.run(["node", str(DUCK), "sql", sql], capture_output=True, cwd=ROOT / "tests/js")
    if r.returncode != 0:
        sys.exit("duckdb: " + r.stderr.decode())


def wall(cmd):
    with open(os.devnull, "wb") as null:
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=null, stderr=subprocess.PIPE)
        t = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{cmd}: exit {r.returncode}: {r.stderr.decode()}")
    return t


def pair(a, b):
    """Median wall seconds of a and b over ROUNDS rounds (one warm-up), median of the ratios a/b."""
    wall(a), wall(b)
    ta, tb = [], []
    for _ in range(ROUNDS):
        ta.append(wall(a))
        tb.append(wall(b))
    return statistics.median(ta), statistics.median(tb), statistics.median(x / y for x, y in zip(ta, tb))


lines = []


def out(s=""):
    print(s, flush=True)
    lines.append(s)


# --- 1. string-column decode, ORC against Parquet ---------------------------------------------
cases = [  # the largest example files with a top-level string column (tests/integration/test_orc.py)
    ("demo-12-zlib.orc", "_col5"),  # DICTIONARY_V2, zlib, one stripe
    ("demo-11-zlib.orc", "_col1"),  # DICTIONARY (RLE v1), zlib, 385 stripes
    ("TestOrcFile.columnProjection.orc", "string1"),  # DIRECT_V2, 5 stripes
]
gen = T / f"hex{ROWS}.orc"
log(f"writing {gen.name}: {ROWS} 64-hex-char strings (tests/integration/orc_write.py)")
vals = [hashlib.sha256(i.to_bytes(8, "little")).hexdigest() for i in range(ROWS)]
gen.write_bytes(orc_write.orc_file("h", vals, codec=orc_write.ZLIB, stripe_rows=100000))
del vals
cases.append((str(gen), "h"))

out("## String-column decode: `blobref column F --name COL > /dev/null`, ORC against Parquet")
out()
out(f"Wall seconds, median of {ROUNDS} rounds; MB = 10^6 bytes of string values. Every ORC file "
    "is zlib; its Parquet twin, written by DuckDB from the ORC file's values, is gzip (the same "
    "deflate), so that the readers are compared, not the codecs.")
out()
out("| file | column | values | MB | ORC s | Parquet s | ORC Mvalues/s | ORC MB/s "
    "| Parquet Mvalues/s | Parquet MB/s | ORC/Parquet |")
out("|---|---|---|---|---|---|---|---|---|---|---|")
for name, col in cases:
    orc = ORC_DIR / name if "/" not in name else pathlib.Path(name)
    if not orc.exists():
        log(f"skipping {orc}: not found")
        continue
    base = T / orc.stem
    js = base.with_suffix(".jsonl")
    with open(js, "wb") as f:
        subprocess.run([BLOBREF, "column", str(orc), "--name", col], stdout=f, check=True)
    n, nbytes = 0, 0
    with open(js, "rb") as f, open(base.with_suffix(".rows.jsonl"), "w") as g:
        for line in f:
            v = json.loads(line)
            n += 1
            if v is not None:
                nbytes += len(v.encode())
            g.write(json.dumps({"v": v}) + "\n")
    pq = base.with_suffix(".parquet")
    duck(f"COPY (SELECT v AS {json.dumps(col)} FROM read_json({lit(base.with_suffix('.rows.jsonl'))}, "
         f"format='newline_delimited', columns={{'v': 'VARCHAR'}})) TO {lit(pq)} "
         "(FORMAT PARQUET, COMPRESSION gzip)")
    # the twin holds the same values in the same order
    with open(base.with_suffix(".pq.jsonl"), "wb") as f:
        subprocess.run([BLOBREF, "column", str(pq), "--name", col], stdout=f, check=True)
    if js.read_bytes() != base.with_suffix(".pq.jsonl").read_bytes():
        sys.exit(f"{pq}: values differ from {orc}")
    to, tp, ratio = pair([BLOBREF, "column", str(orc), "--name", col],
                         [BLOBREF, "column", str(pq), "--name", col])
    out(f"| {orc.name} | {col} | {n} | {nbytes / 1e6:.1f} | {to:.3f} | {tp:.3f} | {n / to / 1e6:.2f} "
        f"| {nbytes / to / 1e6:.1f} | {n / tp / 1e6:.2f} | {nbytes / tp / 1e6:.1f} | {ratio:.2f} |")
    for p in (js, base.with_suffix(".rows.jsonl"), base.with_suffix(".pq.jsonl")):
        p.unlink()

# --- 2. Delta listing at scale -----------------------------------------------------------------
# Versions 0 .. CK+COMMITS-1 are written, a checkpoint at CK = COMMITS/10, and the commits before
# CK are deleted (log cleanup): the retained log is the checkpoint and COMMITS JSON commits.
tab = T / "delta"
dlog = tab / "_delta_log"
dlog.mkdir(parents=True)
CK = max(COMMITS // 10, 1)
log(f"writing a Delta table: a checkpoint at version {CK}, {COMMITS} JSON commits after it")
live = {}
ADD_T = ("STRUCT(path VARCHAR, partitionValues MAP(VARCHAR, VARCHAR), size BIGINT, "
         "modificationTime BIGINT, dataChange BOOLEAN, stats VARCHAR)")
REMOVE_T = "STRUCT(path VARCHAR, deletionTimestamp BIGINT, dataChange BOOLEAN)"
PROTOCOL_T = ("STRUCT(minReaderVersion INTEGER, minWriterVersion INTEGER, "
              "readerFeatures VARCHAR[], writerFeatures VARCHAR[])")
for v in range(CK + COMMITS):
    acts = [{"commitInfo": {"timestamp": 1700000000000 + v, "operation": "WRITE"}}]
    if v == 0:
        acts.append({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}})
        acts.append({"metaData": {"id": "bench", "format": {"provider": "parquet"},
                                  "schemaString": json.dumps({"type": "struct", "fields": [
                                      {"name": "h", "type": "string", "nullable": True,
                                       "metadata": {}}]}),
                                  "partitionColumns": [], "configuration": {}}})
    if v % 3 == 2:  # removes the oldest live file
        old = min(live, key=live.get)
        del live[old]
        acts.append({"remove": {"path": old, "deletionTimestamp": 1700000000000 + v,
                                "dataChange": True}})
    p = f"part-{v:05d}-{hashlib.md5(str(v).encode()).hexdigest()}-c000.snappy.parquet"
    live[p] = v
    acts.append({"add": {"path": p, "partitionValues": {}, "size": 100000 + v,
                         "modificationTime": 1700000000000 + v, "dataChange": True,
                         "stats": json.dumps({"numRecords": 1000})}})
    if v >= CK:
        (dlog / f"{v:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in acts))
    if v == CK:
        rows = [f"SELECT {{'minReaderVersion': 1, 'minWriterVersion': 2, 'readerFeatures': NULL, "
                f"'writerFeatures': NULL}}::{PROTOCOL_T} AS protocol, NULL::{ADD_T} AS add, "
                f"NULL::{REMOVE_T} AS remove"]
        rows += [f"SELECT NULL::{PROTOCOL_T} AS protocol, {{'path': {lit(q)}, 'partitionValues': "
                 f"MAP {{}}, 'size': {100000 + w}, 'modificationTime': 1, 'dataChange': false, "
                 f"'stats': NULL}}::{ADD_T} AS add, NULL::{REMOVE_T} AS remove"
                 for q, w in sorted(live.items())]
        duck(f"COPY ({' UNION ALL '.join(rows)}) TO "
             f"{lit(dlog / f'{v:020d}.checkpoint.parquet')} (FORMAT PARQUET)")
        # the peer's copy of the checkpoint's adds (it reads JSON only), outside the log
        (T / "checkpoint-adds.jsonl").write_text(
            "".join(json.dumps({"add": {"path": q}}) + "\n" for q in sorted(live)))

# The peer: the same replay in Python (json lines), the same output byte for byte: every retained
# version's live files as VERSION<TAB>PATH, sorted (the checkpoint's adds from checkpoint-adds.jsonl).
replay = T / "replay.py"
replay.write_text('''import json, os, sys
root, adds = sys.argv[1], sys.argv[2]
log = os.path.join(root, "_delta_log")
ck = min(int(n[:20]) for n in os.listdir(log) if n.endswith(".checkpoint.parquet"))
names = sorted(n for n in os.listdir(log)
               if n.endswith(".json") and n[:20].isdigit() and int(n[:20]) > ck)
live = {}
with open(adds) as f:
    for line in f:
        live[json.loads(line)["add"]["path"]] = 1
out = []
def emit(v):
    out.extend(f"{v}\\t{root}/{p}\\n" for p in live)
emit(ck)
for n in names:
    with open(os.path.join(log, n)) as f:
        for line in f:
            a = json.loads(line)
            if "add" in a:
                live[a["add"]["path"]] = 1
            elif "remove" in a:
                live.pop(a["remove"]["path"], None)
    emit(int(n[:20]))
out.sort()  # blobref sorts its lines (bytewise) too
sys.stdout.write("".join(out))
''')
peer = [sys.executable, str(replay), str(tab), str(T / "checkpoint-adds.jsonl")]
got = subprocess.run([BLOBREF, "refs", str(tab), "--files"], capture_output=True, check=True)
want = subprocess.run(peer, capture_output=True, check=True)
if got.stdout != want.stdout:
    sys.exit("refs --files and the Python replay differ")
nlines = len(got.stdout.splitlines())
tb, tpy, ratio = pair([BLOBREF, "refs", str(tab), "--files"], peer)
out()
out(f"## Delta listing: `blobref refs TABLE --files > /dev/null`, a Parquet checkpoint and "
    f"{COMMITS} JSON commits")
out()
out("| commits | live files (latest) | lines (version, file) | blobref s | Python replay s "
    "| blobref/Python |")
out("|---|---|---|---|---|---|")
out(f"| {COMMITS} | {len(live)} | {nlines} | {tb:.3f} | {tpy:.3f} | {ratio:.2f} |")
pathlib.Path(os.environ["OUT"]).write_text("\n".join(lines) + "\n")
log(f"wrote {os.environ['OUT']}")
PY
