#!/usr/bin/env bash
# Runs each libFuzzer binary in DIR for SECONDS on its seed corpus (tests/fuzz/corpus/NAME),
# FUZZ_JOBS (2) targets at a time; every target runs its full SECONDS. Exits 1 if any target
# found a crash (its log's tail is printed), after the others running with it have finished.
# usage: tests/run-fuzz.sh DIR SECONDS
set -eu
dir=${1:?usage: run-fuzz.sh DIR SECONDS}; secs=${2:-30}; jobs=${FUZZ_JOBS:-2}
# one_target BINARY: runs it on its corpus; its output goes to DIR/../NAME.log
one_target() {
  local f=$1 n work
  n=$(basename "$f"); work=$dir/../corpus-$n
  mkdir -p "$work"
  [ -d "tests/fuzz/corpus/$n" ] && cp -n "tests/fuzz/corpus/$n"/* "$work"/ 2>/dev/null || true
  echo "fuzz: $n for ${secs}s"
  "$f" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=0 \
    -artifact_prefix="$dir/../" "$work" >"$dir/../$n.log" 2>&1 \
    || { tail -n 40 "$dir/../$n.log"; echo "fuzz: $n FAILED"; return 1; }
}
failed=0; running=0
for f in "$dir"/fuzz_*; do
  [ -x "$f" ] || continue
  if [ "$running" -ge "$jobs" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  [ "$failed" = 0 ] || break
  one_target "$f" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
[ "$failed" = 0 ] || { echo "fuzz: a target failed (see above)"; exit 1; }
echo "fuzz: every target ran ${secs}s, $jobs at a time, no crash"
