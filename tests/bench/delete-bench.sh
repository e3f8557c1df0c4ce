#!/usr/bin/env bash
# Delete benchmark (make bench-deletes): reconcile's final deletes of N quarantined blobs on a real
# S3 (Ceph radosgw, tests/s3/start-rgw.sh), one by one (a DELETE and an index transaction per blob,
# as before) against batched (1,000 keys a DeleteObjects, one index transaction per batch), each
# on blobs of its own in a bucket of its own. See tests/bench/delete_bench.c for the steps.
#
# usage: tests/bench/delete-bench.sh [LIB]   LIB: libblobref.a (default build/release/libblobref.a)
# env:   BLOBS=100000  SEED_THREADS=32  QUICK=1 (BLOBS=5000)  MODES="single batch store1k store"
#        (store1k, store: br_store_delete_many alone, 1,000 keys a call against all in one call)
#        OUT=build/bench/deletes.md (raw lines in deletes.jsonl beside it)  KEEP=1
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIB=${1:-$ROOT/build/release/libblobref.a}
[ "${QUICK:-0}" = 1 ] && BLOBS=${BLOBS:-5000}
BLOBS=${BLOBS:-100000}
SEED_THREADS=${SEED_THREADS:-32}
MODES=${MODES:-single batch store1k store}
OUT=${OUT:-$ROOT/build/bench/deletes.md}
# make bench-deletes passes the Makefile's flags; run directly, ask make for the same ones (its
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
log() { printf '[bench-deletes %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
for t in cc radosgw /usr/bin/python3 pkg-config; do
  command -v "$t" >/dev/null || die "$t not found (tools/install-deps.sh test installs it)"
done
[ -f "$LIB" ] || die "$LIB not found (make all builds it)"

T=$(mktemp -d /tmp/blobref-delb.XXXXXX) # short: radosgw's admin sockets live below it
chmod 755 "$T"
cleanup() {
  local rc=$?
  "$ROOT/tests/s3/stop-rgw.sh" "$T/rgw" >/dev/null 2>&1 || true
  if [ "${KEEP:-0}" = 1 ]; then log "kept $T"; else rm -rf "$T"; fi
  exit $rc
}
trap cleanup EXIT

log "building delete_bench"
# shellcheck disable=SC2086
cc -O2 -g -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Wall -Wextra -Werror -Wshadow \
  -Wno-unused-parameter -I"$ROOT/include" $CFLAGS -o "$T/delete_bench" \
  "$ROOT/tests/bench/delete_bench.c" "$LIB" $LDLIBS
log "starting radosgw"
RGW=$("$ROOT/tests/s3/start-rgw.sh" "$T/rgw")
/usr/bin/python3 - "$RGW" $MODES <<'PY'
import sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="TESTAK", aws_secret_access_key="TESTSK",
                  config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
for m in sys.argv[2:]:
    s3.create_bucket(Bucket=f"del-{m}")
PY
LINES=$T/deletes.jsonl
: >"$LINES"
for m in $MODES; do
  mkdir -p "$T/$m"
  cat >"$T/$m/blobref.conf" <<CONF
[server]
data_dir = $T/$m
[store lake]
kind = s3
endpoint = $RGW
bucket = del-$m
path_style = true
access_key = TESTAK
secret_key = TESTSK
CONF
  log "$m: seeding $BLOBS blobs ($SEED_THREADS writers), then finishing their deletes (timed)"
  RGW_PIDS=$(awk '{ print $2 }' "$T/rgw/pids") "$T/delete_bench" "$T/$m/blobref.conf" "$m" "$BLOBS" "$SEED_THREADS" 2>"$T/$m.log" | tee -a "$LINES" >&2 \
    || { tail -20 "$T/$m.log" >&2; die "delete_bench $m failed"; }
done
mkdir -p "$(dirname "$OUT")"
cp "$LINES" "${OUT%.md}.jsonl"
python3 - "$LINES" "$OUT" <<'PY'
import json, sys, os, datetime
rows = {r["mode"]: r for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip())}
load = open("/proc/loadavg").read().split()[:3]
out = [f"Delete benchmark, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, "
       f"load average {' '.join(load)} at the end", "",
       "| mode | blobs | wall | per blob | blobs/s | index commits | radosgw+Ceph CPU per blob | bench CPU per blob |",
       "|---|---:|---:|---:|---:|---:|---:|---:|"]
for m in ("single", "batch", "store1k", "store"):
    r = rows.get(m)
    if r:
        out.append(f"| {m} | {r['blobs']} | {r['seconds']:.2f} s | {r['ms_per_blob']:.3f} ms "
                   f"| {r['blobs_per_s']:.0f} | {r['index_commits']} | {r['rgw_cpu_ms_per_blob']:.3f} ms "
                f"| {r['own_cpu_ms_per_blob']:.3f} ms |")
if "single" in rows and "batch" in rows:
    out += ["", f"batch is {rows['single']['seconds'] / rows['batch']['seconds']:.1f}x faster "
            "than one by one (goal: 10x)"]
if "store1k" in rows and "store" in rows:
    out += ["", f"br_store_delete_many with all keys in one call (up to 4 DeleteObjects in flight) is "
            f"{rows['store1k']['seconds'] / rows['store']['seconds']:.1f}x faster than 1,000 keys a "
            "call (one in flight)"]
if "single" in rows and "store" in rows:
    out += ["", f"the store layer alone, 4 in flight, is {rows['single']['seconds'] / rows['store']['seconds']:.1f}x "
            "faster than reconcile one by one"]
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
