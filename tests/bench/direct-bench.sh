#!/usr/bin/env bash
# Direct uploads benchmark (issue 21; `make bench-direct`, not in CI): BLOBS (2000) new 1 MiB
# blobs per variant with WORKERS (8) workers in ROUNDS (4) alternating rounds: Python put_many with
# presigned PUTs (radosgw under auto, HEAD only; under on, re-hashed; an enforcing proxy, HEAD
# only) vs through blobrefd vs `curl
# --aws-sigv4 -T` straight to radosgw, and blobrefd CPU per GiB (tests/bench/direct_bench.py).
#   usage: tests/bench/direct-bench.sh [BIN_DIR]   env: BLOBS=2000 WORKERS=8 ROUNDS=4 BIN_BEFORE=DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${1:-bin}
case "$BIN" in /*) ;; *) BIN=$ROOT/$BIN ;; esac
for t in curl radosgw /usr/bin/python3; do
  command -v "$t" >/dev/null || { echo "direct-bench: $t not found" >&2; exit 2; }
done
[ -x "$BIN/blobrefd" ] || { echo "direct-bench: $BIN/blobrefd not found" >&2; exit 2; }
exec /usr/bin/python3 "$ROOT/tests/bench/direct_bench.py" "$BIN"
