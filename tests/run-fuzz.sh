#!/usr/bin/env bash
# Runs each libFuzzer binary in DIR for SECONDS on its seed corpus (tests/fuzz/corpus/NAME).
set -eu
dir=${1:?usage: run-fuzz.sh DIR SECONDS}; secs=${2:-30}
for f in "$dir"/fuzz_*; do
  [ -x "$f" ] || continue
  n=$(basename "$f"); seeds=tests/fuzz/corpus/$n; work=$dir/../corpus-$n
  mkdir -p "$work"
  [ -d "$seeds" ] && cp -n "$seeds"/* "$work"/ 2>/dev/null || true
  echo "fuzz: $n for ${secs}s"
  "$f" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=0 \
    -artifact_prefix="$dir/../" "$work" \
    >"$dir/../$n.log" 2>&1 || { tail -n 40 "$dir/../$n.log"; echo "fuzz: $n FAILED"; exit 1; }
done
