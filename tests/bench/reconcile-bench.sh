#!/usr/bin/env bash
# Reconcile benchmark (make bench-reconcile): 1M indexed blobs, an Iceberg table of 100 snapshots
# and 1,000 Parquet data files (1M references), then reconcile runs against them.
#
# usage: tests/bench/reconcile-bench.sh [LIB]    LIB: libblobref.a (default build/release/libblobref.a)
# env:   SNAPSHOTS=100 FILES_PER_SNAPSHOT=10 HASHES_PER_FILE=1000   the table (and so the index:
#          90 % of each file's values are blobs of its own, the index has 1/9 more unreferenced)
#        FILL_THREADS=1024  uploaders filling the index through the group-committing writer
#        FILL=bulk          fill through the writer's batch API instead (br_index_apply_locations,
#                           an import's path; 4 threads, 16,384 records a commit): minutes, not an
#                           hour, at 10M blobs
#        SIZE=N [FILES=N/1000] [SNAPSHOTS=100]   the table and index by their totals: N indexed
#                           blobs, FILES data files over SNAPSHOTS snapshots (FILES_PER_SNAPSHOT
#                           and HASHES_PER_FILE follow; N/FILES must be a multiple of 10). With
#                           SIZE, FILL defaults to bulk, LISTS_ROUNDS and SPILL to 0
#        SIZES="1000000 10000000"   one run per size (each SIZE=n, FILES=n/1000, cleaned up before
#                           the next), then a table of the steps' peak RSS and time against the
#                           first size's (issue 25: memory flat as the index grows)
#        SPILL=1            also a full dry run with a 256k-digest sort buffer (spills runs)
#        QUICK=1            smoke run: SNAPSHOTS=10
#        OUT=build/bench/reconcile.md (raw step lines in reconcile.jsonl beside it)
#        KEEP=1             keep the work directory (index, table, reconcile state)
#        LISTS_ROUNDS=5     rounds of the full run with [reconcile] lists on and off, interleaved
#                           from the same filled index (0: none)
#
# Steps, each in its own process (so that peak RSS is the step's own):
#   gen      our Parquet writer (hex hashes, snappy) writes the data files; avsc writes the manifests
#            and manifest lists (tests/integration/iceberg_write.mjs); v100.metadata.json holds
#            100 snapshots, each listing every manifest so far; v101 appends one more snapshot
#   fill     the index, through br_index_record_upload from FILL_THREADS threads (group commit)
#   full     reconcile --full: reads every data file; quarantines the 10 % nothing references
#   rerun    no table change: every data file comes from the cache, no Parquet read
#   rerun2   the same again, after a rerun that decided nothing (its sweep may be skipped)
#   append   v101: reads only the 10 new files; restores the quarantined blobs they reference
#   rerun_append, rerun_append2   v101 again, twice
#   full_spill (SPILL=1) --full --dry-run with a quarter of the references in memory
#   lists_ab LISTS_ROUNDS x (full with lists on, full with lists off), each from a copy of the
#            index as fill left it: wall, CPU, list and report bytes, the state file's size
# Runs are real (not dry): the first one quarantines, so the rerun measures the steady state of a
# server whose index is settled. Grace is 72h (the blobs were uploaded 30 days ago), retention
# 100 years: nothing is deleted, so no blob bytes are needed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIB=${1:-$ROOT/build/release/libblobref.a}
OUT=${OUT:-$ROOT/build/bench/reconcile.md}

# SIZES: this script once per size, then the sizes side by side
if [ -n "${SIZES:-}" ]; then
  outs=()
  for n in $SIZES; do
    printf '[bench-reconcile %s] size %s (load %s)\n' "$(date +%T)" "$n" "$(cut -d' ' -f1-3 /proc/loadavg)" >&2
    SIZES='' SIZE=$n FILES=$((n / 1000)) OUT=${OUT%.md}-$n.md "${BASH_SOURCE[0]}" "$LIB" || exit 1
    outs+=("${OUT%.md}-$n.jsonl")
  done
  python3 - "$OUT" "${outs[@]}" <<'EOF'
import json, sys
runs = []
for path in sys.argv[2:]:
    steps = [json.loads(l) for l in open(path) if l.strip()]
    runs.append({s["step"]: s for s in steps if s["step"] != "size"})
base = runs[0]
out = ["Reconcile by index size (each size its own run, one after the other; load = the 1-minute "
       "load average before the step)", "",
       "| blobs | data files | step | wall | CPU user+sys | waiting for a CPU | load | peak RSS | peak anon "
       "| peak file-backed | anon vs first size | wall vs first size |",
       "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for r in runs:
    for name in ("full", "rerun", "append", "full_spill"):
        s, b = r.get(name), base.get(name)
        if not s or not b:
            continue
        t = s["report"]["tables"][0] if s["report"]["tables"] else {}
        files = t.get("data_files_read", 0) + t.get("data_files_cached", 0)
        out.append(f"| {r['fill']['blobs']:,} | {files:,} | {name} | {s['seconds']:.2f} s "
                   f"| {s['cpu_user_s']:.2f}+{s['cpu_sys_s']:.2f} s | {s['runq_wait_s']:.2f} s "
                   f"| {s.get('load1', 0):.1f} | {s['max_rss_kib'] / 1024:.0f} MiB "
                   f"| {s['peak_anon_kib'] / 1024:.0f} MiB | {s['peak_file_kib'] / 1024:.0f} MiB "
                   f"| {s['peak_anon_kib'] / max(b['peak_anon_kib'], 1):.2f}x "
                   f"| {s['seconds'] / max(b['seconds'], 1e-9):.2f}x |")
text = "\n".join(out) + "\n"
open(sys.argv[1], "w").write(text)
print(text)
EOF
  exit 0
fi
if [ -n "${SIZE:-}" ]; then
  export SNAPSHOTS=${SNAPSHOTS:-100} FILL=${FILL:-bulk} LISTS_ROUNDS=${LISTS_ROUNDS:-0} SPILL=${SPILL:-0}
  FILES=${FILES:-$((SIZE / 1000))}
  if [ "$FILES" -lt "$SNAPSHOTS" ] || [ $((FILES % SNAPSHOTS)) != 0 ] || [ $((SIZE % FILES)) != 0 ] \
    || [ $((SIZE / FILES % 10)) != 0 ]; then
    echo "SIZE=$SIZE FILES=$FILES SNAPSHOTS=$SNAPSHOTS: want FILES a multiple of SNAPSHOTS and SIZE/FILES a multiple of 10" >&2
    exit 2
  fi
  export FILES_PER_SNAPSHOT=$((FILES / SNAPSHOTS)) HASHES_PER_FILE=$((SIZE / FILES))
fi
if [ "${QUICK:-0}" = 1 ]; then export SNAPSHOTS=${SNAPSHOTS:-10}; fi
# make bench-reconcile passes the Makefile's flags; run directly, ask make for the same ones (its
# PKGS list is the one place the libraries are named: a copy here once lacked gnutls, pq, magic)
if [ -z "${BENCH_LDLIBS:-}" ]; then
  FLAGS=$(MAKEFLAGS= make -s --no-print-directory -C "$ROOT" print-bench-flags) || {
    echo "make print-bench-flags failed" >&2
    exit 1
  }
  BENCH_CFLAGS=$(sed -n 's/^BENCH_CFLAGS=//p' <<<"$FLAGS")
  BENCH_LDLIBS=$(sed -n 's/^BENCH_LDLIBS=//p' <<<"$FLAGS")
fi
LDLIBS=$BENCH_LDLIBS
CFLAGS=${BENCH_CFLAGS:-}

log() { printf '[bench-reconcile %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "FAILED: $*"
  exit 1
}
for t in cc node python3 pkg-config; do
  command -v "$t" >/dev/null || die "$t not found (make bench-reconcile installs it)"
done
[ -f "$LIB" ] || die "$LIB not found (make all builds it)"
if [ ! -d "$ROOT/tests/js/node_modules/avsc" ] || [ ! -d "$ROOT/tests/js/node_modules/@duckdb/node-api" ]; then
  log "npm ci in tests/js"
  (cd "$ROOT/tests/js" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/blobref-reconcile-bench.XXXXXX")
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then log "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

log "building reconcile_bench"
# shellcheck disable=SC2086
cc -O2 -g -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Wall -Wextra -Werror -Wshadow \
  -Wno-unused-parameter -I"$ROOT/include" $CFLAGS -o "$T/reconcile_bench" \
  "$ROOT/tests/bench/reconcile_bench.c" "$LIB" $LDLIBS
RB=$T/reconcile_bench
STEPS=$T/steps.jsonl
: >"$STEPS"

log "writing the table's data files and metadata.json (our Parquet writer)"
"$RB" gen "$T" >>"$STEPS"
log "writing manifests and manifest lists (avsc)"
t0=$(date +%s%N)
NODE_PATH="$ROOT/tests/js/node_modules" node "$ROOT/tests/integration/iceberg_write.mjs" "$T/job.json" \
  || die "iceberg_write.mjs failed"
echo "{\"step\":\"avro\",\"seconds\":$((($(date +%s%N) - t0) / 1000000))e-3}" >>"$STEPS"
du -sb "$T/table/data" "$T/table/metadata" | awk '{printf "{\"step\":\"size\",\"what\":\"%s\",\"bytes\":%s}\n", $2, $1}' \
  | sed "s#$T/table/##" >>"$STEPS"

STEP_NAMES="full rerun rerun2 append rerun_append rerun_append2"
[ "${SPILL:-1}" = 1 ] && STEP_NAMES="$STEP_NAMES full_spill"
ROUNDS=${LISTS_ROUNDS:-5}
log "filling the index, then reconcile: $STEP_NAMES"
"$RB" run "$T" fill | tee -a "$STEPS" | cut -c1-200 >&2 || die "reconcile_bench fill failed"
[ "$ROUNDS" -gt 0 ] && cp -a --sparse=always "$T/data" "$T/data.filled"
# each step in a process of its own, the 1-minute load average before it on its line
for step in $STEP_NAMES; do
  load=$(cut -d' ' -f1 /proc/loadavg)
  log "$step (load $load)"
  "$RB" run "$T" "$step" | sed "s/^{\"step\":\"$step\"/&,\"load1\":$load/" \
    | tee -a "$STEPS" | cut -c1-200 >&2 || die "reconcile_bench $step failed"
done

# lists on against off: the same full run from the same filled index, interleaved (the order
# swapped every round) so that both see the same load on a shared machine
for ((r = 1; r <= ROUNDS; r++)); do
  order="1 0"
  [ $((r % 2)) = 0 ] && order="0 1"
  for l in $order; do
    rm -rf "$T/data"
    cp -a --sparse=always "$T/data.filled" "$T/data"
    load=$(cut -d' ' -f1 /proc/loadavg)
    log "lists round $r/$ROUNDS, lists=$l (load $load)"
    LISTS=$l "$RB" run "$T" full \
      | sed "s/^{\"step\":\"full\"/{\"step\":\"lists_ab\",\"round\":$r,\"load1\":$load/" \
      | tee -a "$STEPS" | cut -c1-200 >&2 || die "reconcile_bench lists round failed"
  done
done

mkdir -p "$(dirname "$OUT")"
cp "$STEPS" "${OUT%.md}.jsonl"
python3 - "$STEPS" "$OUT" <<'EOF'
import json, sys, platform, os, datetime
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {s["step"]: s for s in steps if s["step"] != "size"}
sizes = {s["what"]: s["bytes"] for s in steps if s["step"] == "size"}
gen, fill = by["gen"], by["fill"]
mib = lambda kib: f"{kib / 1024:.0f} MiB"
out = []
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
out.append(f"Reconcile benchmark, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores ({cpu}), "
           f"kernel {platform.release()}")
out.append("")
out.append(f"- table: {gen['data_files']} data files ({sizes.get('data', 0) / 1048576:.0f} MiB), "
           f"{gen['values']} values, metadata {sizes.get('metadata', 0) / 1048576:.1f} MiB "
           f"(Parquet written in {gen['seconds']:.1f} s, Avro in {by['avro']['seconds']:.1f} s)")
out.append(f"- index: {fill['blobs']} blobs ({fill['index_mib']:.0f} MiB), filled in {fill['seconds']:.1f} s "
           f"by {fill['threads']} threads ({fill.get('mode', 'upload')}) in {fill['commits']} group commits "
           f"({fill['blobs'] / max(fill['seconds'], 1e-9):.0f} records/s)")
out.append("")
out.append("| run | load | wall | mark | sweep | apply | CPU user+sys | waiting for a CPU | data files read / cached "
           "| references | spill runs | quarantined | restored | peak RSS | peak anon | peak file-backed |")
out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
goals = {"full": 60, "rerun": 5} if fill["blobs"] >= 1000000 else {}  # issues 7 and 25
for name in ("full", "rerun", "append", "full_spill"):
    s = by.get(name)
    if not s:
        continue
    r = s["report"]
    t = r["tables"][0] if r["tables"] else {}
    p = r["phases"]
    b = r["blobs"]
    wall = f"{s['seconds']:.2f} s"
    if name in goals:
        wall += " ✓" if s["seconds"] < goals[name] else f" ✗ (goal {goals[name]} s)"
    out.append(f"| {name} | {s.get('load1', 0):.1f} | {wall} | {p['mark_ms'] / 1000:.2f} s | {p['sweep_ms'] / 1000:.2f} s "
               f"| {p['delete_ms'] / 1000:.2f} s | {s['cpu_user_s']:.2f}+{s['cpu_sys_s']:.2f} s | {s['runq_wait_s']:.2f} s "
               f"| {t.get('data_files_read', 0)} / {t.get('data_files_cached', 0)} "
               f"| {r['references']} | {r['spill_runs']} | {b['quarantined']} | {b['restored']} "
               f"| {mib(s['max_rss_kib'])} | {mib(s['peak_anon_kib'])} | {mib(s['peak_file_kib'])} |")
    if r.get("errors"):
        out.append(f"|  | errors: {'; '.join(r['errors'])} |")
out.append("")
out.append("Goals (issue 7 at 1M blobs, issue 25 at 10M): full run under 60 s, rerun with no change under 5 s. mark = walking "
           "metadata and manifests, reading (or taking from the cache) each data file's hashes into "
           "the external sort; sweep = the sorted references merged against the index; apply = the "
           "changes through the index writer. CPU is the step process's; waiting for a CPU is the run "
           "queue delay of the thread that runs reconcile (other load on the machine); the rest of the "
           "wall time is waiting on the disk (fsync). Peak RSS is the step process's ru_maxrss; "
           "file-backed pages are mostly LMDB's map (the index read end to end).")
ab = [s for s in steps if s["step"] == "lists_ab"]
if ab:
    import statistics
    med = statistics.median
    rounds = sorted({s["round"] for s in ab})
    pick = lambda r, on: next(s for s in ab if s["round"] == r and s["lists_on"] == on)
    out.append("")
    out.append(f"Lists on against off (`[reconcile] lists`): the full run from the same filled index, "
               f"{len(rounds)} rounds, on and off interleaved (order swapped each round)")
    out.append("")
    out.append("| round | load (1 min) on / off | wall on / off | on/off | wall less CPU wait on / off | on/off "
               "| apply on / off | CPU on / off | on/off | listed | list bytes | report bytes on / off "
               "| state file on / off |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios, own_ratios, cpu_ratios = [], [], []
    own = lambda s: s["seconds"] - s["runq_wait_s"]
    for r in rounds:
        on, off = pick(r, 1), pick(r, 0)
        lo = on["report"]["lists"] or {}
        listed = sum(v for k, v in lo.items() if k != "bytes")
        ratios.append(on["seconds"] / off["seconds"])
        own_ratios.append(own(on) / own(off))
        con, coff = on["cpu_user_s"] + on["cpu_sys_s"], off["cpu_user_s"] + off["cpu_sys_s"]
        cpu_ratios.append(con / max(coff, 1e-9))
        out.append(f"| {r} | {on['load1']:.1f} / {off['load1']:.1f} | {on['seconds']:.2f} / {off['seconds']:.2f} s "
                   f"| {ratios[-1]:.3f} | {own(on):.2f} / {own(off):.2f} s | {own_ratios[-1]:.3f} "
                   f"| {on['report']['phases']['delete_ms'] / 1000:.2f} / {off['report']['phases']['delete_ms'] / 1000:.2f} s "
                   f"| {con:.2f} / {coff:.2f} s | {cpu_ratios[-1]:.3f} | {listed} | {lo.get('bytes', 0)} "
                   f"| {on['report_bytes']} / {off['report_bytes']} "
                   f"| {on['state_file_bytes'] / 1048576:.1f} / {off['state_file_bytes'] / 1048576:.1f} MiB |")
    on1 = pick(rounds[0], 1)
    lo = on1["report"]["lists"] or {}
    listed = sum(v for k, v in lo.items() if k != "bytes")
    extra = med([pick(r, 1)["state_file_bytes"] - pick(r, 0)["state_file_bytes"] for r in rounds])
    out.append("")
    out.append(f"Median wall on/off {med(ratios):.3f} (goal at most 1.10: "
               f"{'met' if med(ratios) <= 1.10 else 'NOT met'}); median of wall less CPU wait on/off "
               f"{med(own_ratios):.3f}; median CPU on/off {med(cpu_ratios):.3f}; "
               f"median walls {med([pick(r, 1)['seconds'] for r in rounds]):.2f} s on, "
               f"{med([pick(r, 0)['seconds'] for r in rounds]):.2f} s off. "
               f"Lists of {listed} blobs: {lo.get('bytes', 0)} bytes of values "
               f"({lo.get('bytes', 0) / max(listed, 1):.1f} bytes per listed blob), the state file "
               f"{extra / 1048576:.1f} MiB larger than with lists off ({extra / max(listed, 1):.1f} bytes "
               f"per listed blob on disk, LMDB pages included).")
text = "\n".join(out) + "\n"
open(sys.argv[2], "w").write(text)
print(text)
EOF
log "written $OUT"
