#!/usr/bin/env bash
# Migrate benchmark (not part of `make test`): `blobref migrate` of N blobs of SIZE_KIB KiB from an
# fs store to an S3 store (a throwaway radosgw, tests/s3/start-rgw.sh) against `curl --aws-sigv4`
# uploading the same files to the same radosgw with the same parallelism P. migrate also verifies
# each copy on the server (VERIFY, default size: a HEAD; sha256 reads every copy back) and
# switches it in the index; curl only uploads.
# Usage: tests/bench/migrate-bench.sh   (BIN=bin N=1000 SIZE_KIB=256 P=4 VERIFY=size)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/bin}
N=${N:-1000}
SIZE_KIB=${SIZE_KIB:-256}
P=${P:-4}
VERIFY=${VERIFY:-size}
T=$(mktemp -d /tmp/blobref-migrate-bench.XXXXXX)
SRV_PID=
cleanup() {
  [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null
  "$ROOT/tests/s3/stop-rgw.sh" "$T/rgw" >/dev/null 2>&1 || true
  rm -rf "$T"
}
trap cleanup EXIT INT TERM
[ -x "$BIN/blobrefd" ] && [ -x "$BIN/blobref" ] || { echo "build first: make all" >&2; exit 1; }

echo "starting radosgw" >&2
RGW=$("$ROOT/tests/s3/start-rgw.sh" "$T/rgw")
/usr/bin/python3 - "$RGW" <<'PY'
import sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="TESTAK", aws_secret_access_key="TESTSK",
                  config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
for b in ("bench", "direct"):
    s3.create_bucket(Bucket=b)
PY
cat >"$T/blobref.conf" <<CONF
[server]
data_dir = $T/data
upload_store = local
drain_grace = 1h
[store local]
kind = fs
root = $T/local
[store lake]
kind = s3
endpoint = $RGW
region = us-east-1
bucket = bench
path_style = true
access_key = TESTAK
secret_key = TESTSK
CONF
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN/blobrefd" -c "$T/blobref.conf" --listen "127.0.0.1:$PORT" >"$T/blobrefd.log" 2>&1 &
SRV_PID=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.1; done

echo "generating and uploading $N blobs of $SIZE_KIB KiB to the fs store" >&2
python3 - "$T/files" "$N" "$SIZE_KIB" <<'PY' >"$T/list"
import hashlib, os, sys
root, n, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(root, exist_ok=True)
chunk = os.urandom(kib * 1024)
for i in range(n):
    data = i.to_bytes(8, "big") + chunk[8:]
    h = hashlib.sha256(data).hexdigest()
    with open(os.path.join(root, h), "wb") as f:
        f.write(data)
    print(h, os.path.join(root, h))
PY
awk -v u="http://127.0.0.1:$PORT/v1/blobs/" '{ print $2 " " u $1 }' "$T/list" |
  xargs -P "$P" -n 2 sh -c 'curl -sf -o /dev/null -T "$0" "$1"'

t0=$(date +%s.%N)
awk -v u="$RGW/direct/" '{ print $2 " " u $1 " " $1 }' "$T/list" |
  xargs -P "$P" -n 3 sh -c 'curl -sf -o /dev/null --aws-sigv4 aws:amz:us-east-1:s3 \
    --user TESTAK:TESTSK -H "x-amz-content-sha256: $2" -T "$0" "$1"'
t1=$(date +%s.%N)
"$BIN/blobref" --server "http://127.0.0.1:$PORT" migrate -c "$T/blobref.conf" --from local \
  --to lake --concurrency "$P" --verify "$VERIFY" 2>/dev/null | tee "$T/migrate.out"
t2=$(date +%s.%N)
python3 - "$t0" "$t1" "$t2" "$N" "$SIZE_KIB" "$P" "$VERIFY" <<'PY'
import sys
t0, t1, t2 = map(float, sys.argv[1:4]); n, kib, p = map(int, sys.argv[4:7]); v = sys.argv[7]
mb = n * kib * 1024 / 1e6
c, m = t1 - t0, t2 - t1
print(f"| {n} x {kib} KiB, P={p} | curl --aws-sigv4 PUT to radosgw | {c:.2f} s | {mb / c:.1f} MB/s | {n / c:.0f} blobs/s |")
print(f"| {n} x {kib} KiB, P={p} | blobref migrate fs -> s3 (verify {v}) | {m:.2f} s | {mb / m:.1f} MB/s | {n / m:.0f} blobs/s |")
print(f"ratio (migrate / curl throughput): {c / m:.2f}x")
PY
