#!/usr/bin/env bash
# extract-parquet benchmark (not part of make test or make bench: about 5 minutes and 5 GB of
# disk). Generates a Parquet file of N images (random bytes, 40-60 KiB each, ~1 GiB for the
# default 20000) and times, each against a fresh release blobrefd on 127.0.0.1:
#   1. blobref extract-parquet IN OUT --column img   (every value new)
#   2. the same images as files, uploaded with `blobref put` in parallel (xargs -P JOBS)
#   3. extract-parquet again over the same file       (every value deduplicated)
#   4. reading the file (DuckDB: sum of octet_length(img), one thread)
# and prints the throughputs, their ratios and the sizes of OUT and IN.
# Usage: tests/bench/extract-bench.sh [DIR] [IMAGES] [JOBS]
set -eu
cd "$(dirname "$0")/../.."
dir=${1:-/tmp/blobref-extract-bench}; n=${2:-20000}; jobs=${3:-8}
root=$(pwd)
make --no-print-directory all >/dev/null
make --no-print-directory "build/release/tests/test_parquet_dump" >/dev/null
dump=build/release/tests/test_parquet_dump
(cd tests/js && [ -d node_modules/@duckdb/node-api ] || npm ci --no-audit --no-fund --loglevel=error >/dev/null)
mkdir -p "$dir"
in=$dir/images.parquet
if [ ! -s "$in" ] || [ ! -d "$dir/files" ]; then
  echo "generating $n images in $in and $dir/files ..."
  rm -rf "$dir/files"; mkdir -p "$dir/files"
  python3 - "$n" "$dir/files" <<'PY' | "$dump" --write "$in" 1 500 id:i64 name:ba:utf8 img:ba
import random, sys
n, files = int(sys.argv[1]), sys.argv[2]
rng = random.Random(20261201)
out = sys.stdout
for i in range(n):
    data = rng.randbytes(rng.randrange(40 << 10, 60 << 10))
    with open(f"{files}/{i:06d}.jpg", "wb") as f:
        f.write(data)
    name = f"img{i:06d}.jpg".encode()
    out.write("v" + i.to_bytes(8, "little").hex() + "\tv" + name.hex() + "\tv" + data.hex() + "\n")
PY
fi
in_size=$(stat -c %s "$in")
files_size=$(du -sb "$dir/files" | cut -f1)

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # DATA_DIR -> sets url, pid
  rm -rf "$1"; local p; p=$(port)
  bin/blobrefd --listen 127.0.0.1:$p --data "$1" >"$1.log" 2>&1 & pid=$!
  url=http://127.0.0.1:$p
  for _ in $(seq 100); do curl -sf "$url/readyz" >/dev/null && return; sleep 0.1; done
  echo "blobrefd did not start" >&2; exit 1
}
stop() { kill "$pid"; wait "$pid" || true; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }
now() { date +%s.%N; }
sync

start "$dir/data1"
t0=$(now); bin/blobref --server "$url" extract-parquet "$in" "$dir/out.parquet" --column img --jobs "$jobs" 2>"$dir/extract1.txt"; t1=$(now)
extract1=$(secs "$t0" "$t1")
t0=$(now); bin/blobref --server "$url" extract-parquet "$in" "$dir/out2.parquet" --column img --jobs "$jobs" 2>"$dir/extract2.txt"; t1=$(now)
extract2=$(secs "$t0" "$t1")
stop
sync

start "$dir/data2"
t0=$(now)
(cd "$dir/files" && ls | xargs -P "$jobs" -n 1 "$root/bin/blobref" --server "$url" put >/dev/null)
t1=$(now)
puts=$(secs "$t0" "$t1")
stop

t0=$(now)
node -e "
const path=require('path');
const {DuckDBInstance}=require(path.resolve('tests/js/node_modules/@duckdb/node-api'));
(async()=>{const db=await DuckDBInstance.create(':memory:',{threads:'1'});const c=await db.connect();
const r=await c.runAndReadAll(\"SELECT sum(octet_length(img)) FROM read_parquet('$in')\");console.error(String(r.getRows()[0][0]));})();" 2>"$dir/read.txt"
t1=$(now)
readt=$(secs "$t0" "$t1")
out_size=$(stat -c %s "$dir/out.parquet")
mib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 1048576:.1f}')" "$1"; }
rate() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 1048576 / float(sys.argv[2]):.1f}')" "$1" "$2"; }
echo "images: $n, $(mib "$files_size") MiB of image bytes; IN $(mib "$in_size") MiB, OUT $(mib "$out_size") MiB ($out_size bytes, $(python3 -c "print(f'{$out_size / $in_size * 100:.4f}')") % of IN)"
echo "extract-parquet, all new:        ${extract1} s  $(rate "$files_size" "$extract1") MiB/s   ($(tail -1 "$dir/extract1.txt"))"
echo "blobref put, xargs -P $jobs:         ${puts} s  $(rate "$files_size" "$puts") MiB/s"
echo "extract-parquet, all dedup:      ${extract2} s  $(rate "$files_size" "$extract2") MiB/s   ($(tail -1 "$dir/extract2.txt"))"
echo "DuckDB reading the img column:   ${readt} s  $(rate "$files_size" "$readt") MiB/s"
echo "ratios: extract/put = $(python3 -c "print(f'{$puts / $extract1:.2f}')")x, dedup run vs read = $(python3 -c "print(f'{$readt / $extract2:.2f}')")x"
