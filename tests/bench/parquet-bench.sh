#!/usr/bin/env bash
# Parquet read benchmark: blobref's reader (one thread) vs DuckDB (SET threads=1) decoding the
# 64-hex-char hash column of ~1 GB of Parquet (10M rows, snappy and zstd). Not part of make test.
# Usage: tests/bench/parquet-bench.sh [DIR] [ROWS]   (env BUILD_ROOT, default build-bench)
set -eu
cd "$(dirname "$0")/../.."
dir=${1:-/tmp/blobref-parquet-bench}; rows=${2:-10000000}
root=${BUILD_ROOT:-build-bench}
mkdir -p "$dir"
make --no-print-directory BUILD_ROOT="$root" MODE=release "$root/release/tests/test_parquet_dump" >/dev/null
dump=$root/release/tests/test_parquet_dump
bench=tests/bench/parquet_bench.mjs
if [ ! -s "$dir/bench_zstd.parquet" ]; then
  echo "generating $rows rows in $dir ..."
  node "$bench" gen "$dir" "$rows"
fi
median() { sort -n | sed -n 2p; }
for codec in snappy zstd; do
  f=$dir/bench_$codec.parquet
  ours=(); duck=()
  for run in 1 2 3; do
    t0=$(date +%s.%N); "$dump" --sum "$f" h >"$dir/ours.out"; t1=$(date +%s.%N)
    ours+=("$(echo "$t1 - $t0" | bc)")
    duck+=("$(node "$bench" time "$f" 2>"$dir/duck.out")")
  done
  o=$(printf '%s\n' "${ours[@]}" | median); d=$(printf '%s\n' "${duck[@]}" | median)
  /usr/bin/time -v "$dump" --sum "$f" h 2>"$dir/time.out" >/dev/null
  rss=$(grep 'Maximum resident' "$dir/time.out" | awk '{print $NF}')
  size=$(stat -c %s "$f")
  echo "$codec: file $((size / 1048576)) MiB; ours $(cat "$dir/ours.out")"
  echo "$codec: $(cat "$dir/duck.out")"
  echo "$codec: ours median ${o}s, duckdb median ${d}s, speed ratio ours/duckdb = $(echo "scale=2; $d / $o" | bc)x, our max RSS ${rss} KiB"
done
