#!/usr/bin/env bash
# Runs every unit-test binary in DIR and prints one closing "N passed, N failed" line.
set -u
dir=${1:?usage: run-unit.sh DIR}
pass=0; fail=0; bad=0
for t in "$dir"/test_*; do
  [ -x "$t" ] || continue
  out=$("$t" 2>&1); rc=$?
  printf '%s\n' "$out" | tail -n 20
  line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n1)
  p=$(printf '%s' "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/'); f=$(printf '%s' "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
  pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
  if [ $rc -ne 0 ]; then bad=$((bad + 1)); echo "unit: $(basename "$t") exited $rc" >&2; fi
done
echo "unit: $pass passed, $fail failed"
[ $fail -eq 0 ] && [ $bad -eq 0 ]
