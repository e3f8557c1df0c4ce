#!/bin/sh
# Import-in-place benchmark (not part of `make test`): `blobref import --in-place` of N files of
# SIZE_KIB KiB (default 10,000 x 256 KiB) against `openssl dgst -sha256` over the same files with
# the same parallelism (P, default the number of cores). Both runs start from a warm page cache
# (the files are read once first), so the comparison is hashing and indexing, not the disk.
# Usage: tests/bench/import-bench.sh   (BIN=bin N=10000 SIZE_KIB=256 P=$(nproc))
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/bin}
N=${N:-10000}
SIZE_KIB=${SIZE_KIB:-256}
P=${P:-$(nproc)}
WORK=$(mktemp -d /tmp/blobref-import-bench.XXXXXX)
SRV_PID=
cleanup() {
  [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

[ -x "$BIN/blobrefd" ] && [ -x "$BIN/blobref" ] || { echo "build first: make all" >&2; exit 1; }
command -v openssl >/dev/null || { echo "openssl is not installed" >&2; exit 1; }

echo "generating $N files of $SIZE_KIB KiB under $WORK/store/images ..." >&2
python3 - "$WORK/store/images" "$N" "$SIZE_KIB" <<'PY'
import os, sys
root, n, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
chunk = os.urandom(kib * 1024)
for i in range(n):
    d = os.path.join(root, f"day={i % 100:02d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"img{i:06d}.jpg"), "wb") as f:
        f.write(i.to_bytes(8, "big") + chunk[8:])  # unique, same size
PY
cat > "$WORK/blobref.conf" <<CONF
[server]
listen = 127.0.0.1:0
data_dir = $WORK/data
upload_store = local
[store local]
kind = fs
root = $WORK/store
CONF
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN/blobrefd" -c "$WORK/blobref.conf" --listen "127.0.0.1:$PORT" >"$WORK/blobrefd.log" 2>&1 &
SRV_PID=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.1; done

# warm the page cache
find "$WORK/store/images" -type f -print0 | xargs -0 cat >/dev/null

t0=$(date +%s.%N)
find "$WORK/store/images" -type f -print0 | xargs -0 -n 100 -P "$P" openssl dgst -sha256 >/dev/null
t1=$(date +%s.%N)
"$BIN/blobref" --server "http://127.0.0.1:$PORT" import "$WORK/store/images" -c "$WORK/blobref.conf" \
  --store local --in-place --threads "$P" >"$WORK/import.out" 2>/dev/null
t2=$(date +%s.%N)
tail -1 "$WORK/import.out"
python3 - "$t0" "$t1" "$t2" "$N" "$SIZE_KIB" "$P" <<'PY'
import sys
t0, t1, t2 = map(float, sys.argv[1:4]); n, kib, p = map(int, sys.argv[4:7])
mb = n * kib * 1024 / 1e6
o, b = t1 - t0, t2 - t1
print(f"| {n} x {kib} KiB, P={p} | openssl dgst -sha256 | {o:.2f} s | {mb / o:.0f} MB/s | {n / o:.0f} files/s |")
print(f"| {n} x {kib} KiB, P={p} | blobref import --in-place | {b:.2f} s | {mb / b:.0f} MB/s | {n / b:.0f} files/s |")
print(f"ratio (blobref import / openssl throughput): {o / b:.2f}x")
PY
