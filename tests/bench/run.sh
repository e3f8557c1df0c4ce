#!/usr/bin/env bash
# Side-by-side benchmark of blobrefd, nginx and docker-registry on 127.0.0.1 (make bench).
#
# usage: tests/bench/run.sh [BIN_DIR]        BIN_DIR holds blobrefd (default: bin)
# env:   ROUNDS=3 (5 for a steadier median)  DURATION=10 (seconds per measurement)
#        QUICK=1          smoke check: 1 round, 3 s, fewer uploads
#        WRK_THREADS=2 WRK_CONNS=64          read load (wrk; HEAD: upload_load, wrk 4.1 cannot HEAD)
#        UPLOAD_CONNS=16 UPLOAD_MAX=2000     new 1 MiB uploads: concurrency, cap per measurement
#        DEDUP_CONNS=64                      dedup uploads (Expect: 100-continue) concurrency
#        SMALL_CONNS=64 SMALL_MAX=40000      new 4 KiB uploads (group commit vs one per upload)
#        SERVERS="blobref nginx registry mhd" leave one out to benchmark the others (mhd: the
#                                            libmicrohttpd ceiling, tests/bench/mhd_ceiling.c)
#        SCENARIOS="head get4k get1m range redirect new dedup"   a subset for a quicker run
#        OUT=build/bench/results.md (also raw.log beside it; failed-logs/ after a failure)
#        KEEP=1 (keep the work directory)
#
# Every server runs on 127.0.0.1 with a fair operator's settings, from a temporary directory, and
# is stopped at the end, also on failure or ^C. Each kind of answer is checked first (status and
# bytes); servers take turns in a different order each round; the table shows medians.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BENCH=$ROOT/tests/bench
BIN=${1:-${BIN:-bin}}
case "$BIN" in /*) ;; *) BIN=$ROOT/$BIN ;; esac
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
UPLOAD_MAX=${UPLOAD_MAX:-2000}
SMALL_MAX=${SMALL_MAX:-40000}
if [ "${QUICK:-0}" = 1 ]; then
  ROUNDS=1
  DURATION=3
  UPLOAD_MAX=500
  SMALL_MAX=5000
fi
WRK_THREADS=${WRK_THREADS:-2}
WRK_CONNS=${WRK_CONNS:-64}
UPLOAD_CONNS=${UPLOAD_CONNS:-16}
DEDUP_CONNS=${DEDUP_CONNS:-64}
SMALL_CONNS=${SMALL_CONNS:-64}
SERVERS=${SERVERS:-blobref nginx registry mhd}
SCENARIOS=${SCENARIOS:-head get4k get1m range redirect new dedup}
OUT=${OUT:-$ROOT/build/bench/results.md}
N_SMALL=1000  # 4 KiB blobs
N_LARGE=32    # 1 MiB blobs
MIB=1048576

for n in ROUNDS DURATION UPLOAD_MAX WRK_THREADS WRK_CONNS UPLOAD_CONNS DEDUP_CONNS; do
  v=${!n}
  if ! [[ "$v" =~ ^[0-9]+$ ]] || [ "$v" -lt 1 ] || [ "$v" -gt 100000 ]; then
    echo "run.sh: bad $n=$v" >&2
    exit 2
  fi
done
if [ "$DURATION" -gt 600 ] || [ "$ROUNDS" -gt 20 ]; then
  echo "run.sh: DURATION <= 600, ROUNDS <= 20" >&2
  exit 2
fi
has() { [[ " $SERVERS " == *" $1 "* ]]; }
wants() { [[ " $SCENARIOS " == *" $1 "* ]]; }
for t in wrk nginx cc curl sha256sum $(has registry && echo docker-registry); do
  command -v "$t" >/dev/null || { echo "run.sh: $t not found (make bench installs it)" >&2; exit 2; }
done
if has blobref && [ ! -x "$BIN/blobrefd" ]; then
  echo "run.sh: $BIN/blobrefd not found (run make, or pass BIN_DIR, or SERVERS='nginx registry')" >&2
  exit 2
fi

# ---- work directory, processes, cleanup ----
T=$(mktemp -d "${TMPDIR:-/tmp}/blobref-bench.XXXXXX")
chmod 755 "$T" # nginx workers run as an unprivileged user
declare -A PIDS=()
log() { printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "FAILED: $*"
  exit 1
}

stop_server() {
  local name=$1 pid=${PIDS[$1]:-}
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  unset "PIDS[$name]"
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for name in "${!PIDS[@]}"; do stop_server "$name"; done
  if [ $rc -ne 0 ]; then # keep the servers' logs for a look at what went wrong
    mkdir -p "$(dirname "$OUT")/failed-logs"
    cp "$T"/*.log "$T"/nginx/error.log "$(dirname "$OUT")/failed-logs/" 2>/dev/null || true
    log "failed (exit $rc); logs in $(dirname "$OUT")/failed-logs"
  fi
  if [ "${KEEP:-0}" = 1 ]; then
    log "work directory kept: $T"
  else
    rm -rf "$T"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A TCP port in 20000..29999 (below the ephemeral range) that nothing listens on.
declare -A TAKEN=()
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 10000))
    [ -z "${TAKEN[$p]:-}" ] || continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      TAKEN[$p]=1
      echo "$p"
      return 0
    fi
  done
  die "no free port"
}

# wait_ready NAME URL: waits up to 20 s for URL to answer 200 while NAME's process lives.
wait_ready() {
  local name=$1 url=$2 pid=${PIDS[$1]}
  for _ in $(seq 200); do
    kill -0 "$pid" 2>/dev/null || { tail -20 "$T/$name.log" >&2; die "$name exited"; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$url" || true)" = 200 ] && return 0
    sleep 0.1
  done
  tail -20 "$T/$name.log" >&2
  die "$name not ready at $url"
}

# start_blobref NAME PORT [extra [server] lines] [extra [store local] lines]
start_blobref() {
  local name=$1 port=$2 server_extra=${3:-} store_extra=${4:-} dir=$T/$1
  rm -rf "$dir"
  mkdir -p "$dir"
  cat >"$dir/blobref.conf" <<EOF
[server]
listen = 127.0.0.1:$port
data_dir = $dir
$server_extra

[store local]
kind = fs
root = $dir/blobs
$store_extra
EOF
  "$BIN/blobrefd" -c "$dir/blobref.conf" >"$T/$name.log" 2>&1 &
  PIDS[$name]=$!
  wait_ready "$name" "http://127.0.0.1:$port/readyz"
}

# start_registry NAME PORT: CNCF distribution 2.8 on the filesystem driver, log level error.
start_registry() {
  local name=$1 port=$2 dir=$T/$1
  rm -rf "$dir"
  mkdir -p "$dir/storage"
  cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/storage
  cache:
    blobdescriptor: inmemory
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
  secret: blobref-bench-$port
EOF
  docker-registry serve "$dir/config.yml" >"$T/$name.log" 2>&1 &
  PIDS[$name]=$!
  wait_ready "$name" "http://127.0.0.1:$port/v2/"
}

start_nginx() {
  local port=$1 dir=$T/nginx
  mkdir -p "$dir/tmp" "$T/up"
  chmod 777 "$dir/tmp" "$T/up"
  cat >"$dir/nginx.conf" <<EOF
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_timeout 65;
  keepalive_requests 1000000;
  open_file_cache max=10000 inactive=60s;
  open_file_cache_valid 60s;
  open_file_cache_errors on;
  client_body_temp_path $dir/tmp;
  proxy_temp_path $dir/tmp;
  fastcgi_temp_path $dir/tmp;
  uwsgi_temp_path $dir/tmp;
  scgi_temp_path $dir/tmp;
  default_type application/octet-stream;
  server {
    listen 127.0.0.1:$port;
    root $T/files;
    # the headers blobref sends beside nginx's own ETag, Accept-Ranges and Content-Type (a
    # constant Repr-Digest of the same length: nginx cannot hash; X-Request-Id likewise)
    location /sha256/ {
      add_header Cache-Control "public, max-age=31536000, immutable";
      add_header Repr-Digest "sha-256=:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:";
      add_header X-Request-Id "0000000000000000";
    }
    location = /healthz { return 200 '{"status":"ok"}'; }
    location ~ "^/r/([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{60})\$" {
      add_header Cache-Control "private, max-age=3600";
      add_header X-Request-Id "0000000000000000";
      return 302 http://127.0.0.1:$port/sha256/\$1/\$2/\$1\$2\$3;
    }
    location /up/ {
      root $T;
      dav_methods PUT;
      create_full_put_path on;
      client_max_body_size 64m;
    }
  }
}
EOF
  nginx -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;' >"$T/nginx.log" 2>&1 &
  PIDS[nginx]=$!
  local h
  h=$(head -1 "$T/small.hex")
  wait_ready nginx "http://127.0.0.1:$port/sha256/${h:0:2}/${h:2:2}/$h"
}

# ---- load generators ----
log "building upload_load"
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -o "$T/upload_load" \
  "$BENCH/upload_load.c" -lcrypto -lpthread
UL=$T/upload_load
if has mhd; then
  cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -o "$T/mhd_ceiling" "$BENCH/mhd_ceiling.c" \
    $(pkg-config --cflags --libs libmicrohttpd libcrypto)
fi

fmt_rps() { [ -n "$1" ] && printf '%.0f' "$1" || echo "n/a"; }

# kv "LINE" KEY: the value of KEY=... in LINE.
kv() { sed -n "s/.*[ ]$2=\([^ ]*\).*/\1/p" <<<" $1"; }

# ---- data: the same blobs for every server ----
NONCE=$(date +%s)-$$
TREE_REV=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')
log "generating $N_SMALL x 4 KiB and $N_LARGE x 1 MiB blobs"
"$UL" -m gen -s 4096 -n $N_SMALL -S "small-$NONCE" -o "$T/files" >"$T/small.list"
"$UL" -m gen -s $MIB -n $N_LARGE -S "large-$NONCE" -o "$T/files" >"$T/large.list"
chmod -R a+rX "$T/files"
cut -c1-64 "$T/small.list" >"$T/small.hex"
cut -c1-64 "$T/large.list" >"$T/large.hex"
# Spot-check the generator against coreutils.
read -r h p < <(tail -1 "$T/large.list")
[ "$(sha256sum "$p" | cut -c1-64)" = "$h" ] || die "upload_load gen: wrong hash for $p"

P_BLOBREF=$(free_port)
P_REDIRECT=$(free_port)
P_BLOBREF_UP=$(free_port)
P_NGINX=$(free_port)
P_REGISTRY=$(free_port)
P_REGISTRY_UP=$(free_port)
P_MHD=$(free_port)
P_MHD_UP=$(free_port)
U_BLOBREF=http://127.0.0.1:$P_BLOBREF
U_REDIRECT=http://127.0.0.1:$P_REDIRECT
U_NGINX=http://127.0.0.1:$P_NGINX
U_REGISTRY=http://127.0.0.1:$P_REGISTRY
U_MHD=http://127.0.0.1:$P_MHD

# preload NAME MODE URL LIST EXPECTED_STATUS
preload() {
  local out
  out=$("$UL" -m "$2" -u "$3" -f "$4" -c 8 -d 300) || true
  [ "$(kv "$out" status)" = "$5:$(wc -l <"$4")" ] || die "preloading $1 ($4): $out"
}

has nginx && start_nginx "$P_NGINX"
if has registry; then
  log "starting docker-registry and pushing the blobs"
  start_registry registry "$P_REGISTRY"
  preload registry registry "$U_REGISTRY/v2/bench/blobs" "$T/small.list" 201
  preload registry registry "$U_REGISTRY/v2/bench/blobs" "$T/large.list" 201
fi
if has blobref; then
  log "starting blobrefd (proxy and redirect) and uploading the blobs"
  start_blobref blobref "$P_BLOBREF"
  preload blobref put "$U_BLOBREF/v1/blobs" "$T/small.list" 201
  preload blobref put "$U_BLOBREF/v1/blobs" "$T/large.list" 201
  start_blobref redirect "$P_REDIRECT" "" "serve = redirect
public_url = $U_NGINX"
  preload redirect put "$U_REDIRECT/v1/blobs" "$T/small.list" 201
fi

if has mhd; then
  log "starting the libmicrohttpd ceiling (trivial handler, blobs from memory)"
  "$T/mhd_ceiling" "$P_MHD" "$T/files" "$U_NGINX" >"$T/mhd.log" 2>&1 &
  PIDS[mhd]=$!
  wait_ready mhd "$U_MHD/v1/blobs/$(head -1 "$T/small.hex")"
fi

# ---- request lists (METHOD PATH [RANGE]) ----
path_of() { # SERVER HEX
  case $1 in
  blobref | mhd) echo "/v1/blobs/$2" ;;
  nginx) echo "/sha256/${2:0:2}/${2:2:2}/$2" ;;
  registry) echo "/v2/bench/blobs/sha256:$2" ;;
  esac
}
for s in blobref nginx registry mhd; do
  case $s in
  blobref | mhd) pre=/v1/blobs/ ;;
  registry) pre=/v2/bench/blobs/sha256: ;;
  nginx) pre=/sha256/ ;;
  esac
  awk -v pre="$pre" -v s="$s" '{ p = (s == "nginx") ? pre substr($1,1,2) "/" substr($1,3,2) "/" $1 : pre $1
         print "HEAD " p > "'"$T/head.$s"'"; print "GET " p > "'"$T/get4k.$s"'" }' "$T/small.hex"
  awk -v pre="$pre" -v s="$s" -v mib=$MIB 'BEGIN { srand(42) }
       { p = (s == "nginx") ? pre substr($1,1,2) "/" substr($1,3,2) "/" $1 : pre $1
         print "GET " p > "'"$T/get1m.$s"'"
         for (i = 0; i < 16; i++) { a = int(rand() * (mib - 65536) / 4096) * 4096
           print "GET " p " bytes=" a "-" (a + 65535) > "'"$T/range.$s"'" } }' "$T/large.hex"
done
awk '{ print "GET /v1/blobs/" $1 }' "$T/small.hex" >"$T/redirect.blobref"
awk '{ print "GET /r/" $1 }' "$T/small.hex" >"$T/redirect.nginx"
cp "$T/redirect.nginx" "$T/redirect.mhd"

url_of() { # SERVER SCENARIO
  case $1 in
  blobref) [ "$2" = redirect ] && echo "$U_REDIRECT" || echo "$U_BLOBREF" ;;
  nginx) echo "$U_NGINX" ;;
  registry) echo "$U_REGISTRY" ;;
  mhd) echo "$U_MHD" ;;
  esac
}

# check_read SERVER SCENARIO: one request of each kind answered right, with the right bytes.
check_read() {
  local s=$1 sc=$2 base line method path range hex file got code
  base=$(url_of "$s" "$sc")
  line=$(sed -n 7p "$T/$sc.$s")
  read -r method path range <<<"$line"
  hex=$(grep -o '[0-9a-f]\{64\}' <<<"$path")
  file=$T/files/sha256/${hex:0:2}/${hex:2:2}/$hex
  case $sc in
  head)
    got=$(curl -s -I "$base$path" | tr -d '\r' |
      awk 'NR == 1 { c = $2 } tolower($1) == "content-length:" { l = $2 } END { print c, l }')
    [ "$got" = "200 4096" ] || die "$s HEAD $path: got '$got', want '200 4096'"
    ;;
  get4k | get1m)
    code=$(curl -s -o "$T/check.out" -w '%{http_code}' "$base$path")
    [ "$code" = 200 ] && cmp -s "$T/check.out" "$file" || die "$s GET $path: status $code or wrong bytes"
    ;;
  range)
    code=$(curl -s -o "$T/check.out" -w '%{http_code}' -H "Range: $range" "$base$path")
    local a=${range#bytes=}
    a=${a%-*}
    dd if="$file" of="$T/check.want" bs=4096 skip=$((a / 4096)) count=16 status=none
    [ "$code" = 206 ] && cmp -s "$T/check.out" "$T/check.want" ||
      die "$s Range $range $path: status $code or wrong bytes"
    ;;
  redirect)
    got=$(curl -s -o /dev/null -w '%{http_code} %{redirect_url}' "$base$path")
    [[ "$got" == 30[27]" http"* ]] || die "$s redirect $path: got '$got'"
    code=$(curl -s -o "$T/check.out" -w '%{http_code}' "${got#* }")
    [ "$code" = 200 ] && cmp -s "$T/check.out" "$file" ||
      die "$s redirect target ${got#* }: status $code or wrong bytes"
    ;;
  esac
}

# ---- measurements ----
mkdir -p "$T/res"
NOTES=()
RAW=$T/raw.log
note() { NOTES+=("$*"); }

# save SCENARIO SERVER RPS P99_MS [EXTRA]
save() { echo "$3 $4 ${5:--}" >>"$T/res/$1.$2"; }

run_read() { # SERVER SCENARIO
  local s=$1 sc=$2 base out rps p99 errs bad
  base=$(url_of "$s" "$sc")
  if [ "$sc" = head ]; then
    # wrk 4.1 waits for a body after a HEAD response (wg/wrk#198): upload_load's reqs mode.
    out=$(timeout $((DURATION + 60)) "$UL" -m reqs -u "$base" -f "$T/$sc.$s" -t "$WRK_THREADS" \
      -c "$WRK_CONNS" -d "$DURATION") || true
    rps=$(kv "$out" rps)
    p99=$(kv "$out" p99_ms)
    errs=$(kv "$out" errors)
    bad=$(kv "$out" status | tr , '\n' | grep -cv '^200:' || true)
  else
    out=$(BENCH_REQS=$T/$sc.$s timeout $((DURATION + 60)) wrk -t"$WRK_THREADS" -c"$WRK_CONNS" \
      -d"${DURATION}s" --timeout 10s -s "$BENCH/rotate.lua" "$base" | sed -n 's/^WRK //p') || true
    rps=$(kv "$out" rps)
    p99=$(kv "$out" p99_ms)
    errs=$(kv "$out" errors)
    bad=$(kv "$out" non2xx3xx)
  fi
  echo "$sc $s round=$ROUND $out" >>"$RAW"
  [ -n "$rps" ] || die "$sc on $s: no result ($out)"
  [ "${errs:-0}" = 0 ] && [ "${bad:-0}" = 0 ] || note "$sc on $s, round $ROUND: $out"
  save "$sc" "$s" "$rps" "$p99"
  log "$sc $s: $rps req/s, p99 $p99 ms"
}

# upload_steps N: blobref's step timings (blobref_upload_step_seconds_total) over the N uploads
# of the instance that just took them, in ms an upload, into the raw log and the steps file.
upload_steps() {
  local n=$1 line
  [ -n "$n" ] && [ "$n" -gt 0 ] || return 0
  line=$(curl -sf "http://127.0.0.1:$P_BLOBREF_UP/metrics" | awk -v n="$n" '
    /^blobref_upload_step_seconds_total\{/ { match($0, /step="[a-z_]+"/); st = substr($0, RSTART + 6, RLENGTH - 7)
      printf "%s=%.2f ", st, $2 * 1000 / n }') || true
  echo "steps blobref round=$ROUND uploads=$n ms_per_upload: $line" >>"$RAW"
  echo "round $ROUND ($n uploads): $line" >>"$T/steps"
  log "upload steps, ms an upload: $line"
}

# run_upload SCENARIO SERVER: new 1 MiB uploads (never seen before) or dedup uploads.
run_upload() {
  local sc=$1 s=$2 out want seed="$NONCE-r$ROUND-$1-$2" inst=""
  local common=(-d "$DURATION")
  case "$sc.$s" in
  new.blobref | new.blobref_b1 | small.blobref | small.blobref_b1)
    # A fresh instance per measurement (its own data directory, removed afterwards).
    if [ "$s" = blobref_b1 ]; then
      inst=blobref_up_b1
      start_blobref "$inst" "$P_BLOBREF_UP" "index_batch_max = 1"
    else
      inst=blobref_up
      start_blobref "$inst" "$P_BLOBREF_UP"
    fi
    # small: 4 KiB blobs from many clients, where the index commit (not the bytes) is the cost,
    # which is what group commit is for
    local size=$MIB n=$UPLOAD_MAX conns=$UPLOAD_CONNS
    [ "$sc" = small ] && size=4096 n=$SMALL_MAX conns=$SMALL_CONNS
    out=$(timeout $((DURATION + 60)) "$UL" -m put -u "http://127.0.0.1:$P_BLOBREF_UP/v1/blobs" -s $size \
      -n "$n" -S "$seed" -c "$conns" "${common[@]}") || true
    want='^201:'
    ;;
  new.mhd)
    # the libmicrohttpd ceiling's durable upload (hash, write, then fsync + rename + directory
    # fsync on a thread of its own), a fresh directory per measurement
    inst=mhd_up
    rm -rf "${T:?}/mhd_up"
    "$T/mhd_ceiling" "$P_MHD_UP" "$T/files" "$U_NGINX" "$T/mhd_up" >"$T/mhd_up.log" 2>&1 &
    PIDS[mhd_up]=$!
    wait_ready mhd_up "http://127.0.0.1:$P_MHD_UP/v1/blobs/$(head -1 "$T/small.hex")"
    out=$(timeout $((DURATION + 60)) "$UL" -m put -u "http://127.0.0.1:$P_MHD_UP/v1/blobs" -s $MIB \
      -n "$UPLOAD_MAX" -S "$seed" -c "$UPLOAD_CONNS" "${common[@]}") || true
    want='^201:'
    ;;
  new.disk)
    out=$(timeout $((DURATION + 60)) "$UL" -m disk -o "$T/disk" -s $MIB -n "$UPLOAD_MAX" -S "$seed" \
      -c "$UPLOAD_CONNS" "${common[@]}") || true
    rm -rf "${T:?}/disk"
    want='' # no HTTP statuses: only errors= counts
    ;;
  new.nginx)
    out=$(timeout $((DURATION + 60)) "$UL" -m put -u "$U_NGINX/up" -s $MIB -n "$UPLOAD_MAX" -S "$seed" \
      -c "$UPLOAD_CONNS" "${common[@]}") || true
    want='^201:'
    ;;
  new.registry)
    inst=registry_up
    start_registry "$inst" "$P_REGISTRY_UP"
    out=$(timeout $((DURATION + 60)) "$UL" -m registry -u "http://127.0.0.1:$P_REGISTRY_UP/v2/bench/blobs" \
      -s $MIB -n "$UPLOAD_MAX" -S "$seed" -c "$UPLOAD_CONNS" "${common[@]}") || true
    want='^201:'
    ;;
  dedup.blobref)
    out=$(timeout $((DURATION + 60)) "$UL" -m put -e -r -u "$U_BLOBREF/v1/blobs" -f "$T/large.list" \
      -c "$DEDUP_CONNS" "${common[@]}") || true
    want='^200:'
    ;;
  dedup.registry)
    out=$(timeout $((DURATION + 60)) "$UL" -m mount -r -u "$U_REGISTRY/v2/dedup/blobs" -F bench \
      -f "$T/large.list" -c "$DEDUP_CONNS" "${common[@]}") || true
    want='^201:'
    ;;
  esac
  echo "$sc $s round=$ROUND $out" >>"$RAW"
  [ "$sc" = new ] && [ "$inst" = blobref_up ] && upload_steps "$(kv "$out" ok)"
  if [ -n "$inst" ]; then
    stop_server "$inst"
    rm -rf "${T:?}/$inst"
  fi
  rm -rf "${T:?}/up" && mkdir -m 777 "$T/up"
  # No sync: blobref and the registry fsync, and nginx's files are gone before write-back.
  local rps p99 bad
  rps=$(kv "$out" rps)
  p99=$(kv "$out" p99_ms)
  [ -n "$rps" ] || die "$sc upload on $s: no result ($out)"
  bad=0 # the disk ceiling has no statuses (want empty): only its errors= count
  [ -z "$want" ] || bad=$(kv "$out" status | tr , '\n' | grep -cv "$want" || true)
  [ "$(kv "$out" errors)" = 0 ] && [ "$bad" = 0 ] || note "$sc upload on $s, round $ROUND: $out"
  if [ "$sc.$s" = dedup.blobref ] && [ "$(kv "$out" early)" != "$(kv "$out" ok)" ]; then
    note "dedup on blobref, round $ROUND: only $(kv "$out" early) of $(kv "$out" ok) answered before the body"
  fi
  save "$sc" "$s" "$rps" "$p99" "$(kv "$out" mbps)"
  log "$sc upload $s: $rps/s, p99 $p99 ms, $(kv "$out" mbps) MB/s"
}

ORDER=()
for s in blobref nginx registry mhd; do has "$s" && ORDER+=("$s"); done
[ ${#ORDER[@]} -gt 0 ] || die "SERVERS names none of blobref nginx registry mhd"
READS=()
for sc in head get4k get1m range redirect; do wants "$sc" && READS+=("$sc"); done

log "checking every server's answers"
for sc in "${READS[@]}"; do
  for s in "${ORDER[@]}"; do
    [ "$sc.$s" = redirect.registry ] || check_read "$s" "$sc"
  done
done
log "warming the page cache"
cat "$T"/files/sha256/*/*/* >/dev/null
for d in blobref registry; do [ -d "$T/$d" ] && find "$T/$d" -type f -exec cat {} + >/dev/null; done


START=$(date +%s)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
  # Servers take turns: round r starts with the r-th server.
  k=$(((ROUND - 1) % ${#ORDER[@]}))
  turn=("${ORDER[@]:k}" "${ORDER[@]:0:k}")
  log "round $ROUND/$ROUNDS: order ${turn[*]}"
  for sc in "${READS[@]}"; do
    for s in "${turn[@]}"; do
      [ "$sc.$s" = redirect.registry ] || run_read "$s" "$sc"
    done
  done
  # the disk ceiling (no HTTP: write + fsync + rename + directory fsync, as many writers as
  # upload connections) in every round, just before the uploads it bounds
  wants new && run_upload new disk
  for s in "${turn[@]}"; do
    wants new || continue
    run_upload new "$s"
    if [ "$s" = blobref ]; then
      run_upload new blobref_b1
      run_upload small blobref
      run_upload small blobref_b1
    fi
  done
  for s in "${turn[@]}"; do
    wants dedup && [ "$s" != nginx ] && [ "$s" != mhd ] || continue
    run_upload dedup "$s"
  done
done

# Diagnostic: how fast each server takes a new connection per request (what a dedup upload with
# Expect: 100-continue costs blobref, which answers it early and closes the connection).
CONN_NOTE=""
if has blobref && has nginx; then
  for s in blobref nginx; do
    echo "GET /healthz" >"$T/conn.$s"
    out=$(BENCH_REQS=$T/conn.$s timeout $((DURATION + 60)) wrk -t"$WRK_THREADS" -c"$WRK_CONNS" \
      -d"${DURATION}s" --timeout 10s -H 'Connection: close' -s "$BENCH/rotate.lua" "$(url_of $s conn)" |
      sed -n 's/^WRK //p') || true
    echo "conn $s $out" >>"$RAW"
    CONN_NOTE+="$s $(fmt_rps "$(kv "$out" rps)")/s (p99 $(kv "$out" p99_ms) ms), "
    log "connection per request, $s: $out"
  done
fi
ELAPSED=$(($(date +%s) - START))

# ---- table ----
median() {
  sort -g | awk '{ a[NR] = $1 }
    END { if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
med() { # SCENARIO SERVER COLUMN: median over the rounds (1 = req/s, 2 = p99 ms, 3 = MB/s)
  [ -f "$T/res/$1.$2" ] || return 0
  awk -v c="$3" '{ print $c }' "$T/res/$1.$2" | median
}
# rmed SCENARIO_A SERVER_A SCENARIO_B SERVER_B: median over the rounds of A's req/s / B's req/s.
# Each round measures the servers back to back, so that load drifting over minutes cancels out.
rmed() {
  [ -f "$T/res/$1.$2" ] && [ -f "$T/res/$3.$4" ] || return 0
  paste -d' ' "$T/res/$1.$2" "$T/res/$3.$4" |
    awk '$4 > 0 { printf "%.4f\n", $1 / $4 }' |
    median
}
fmt_ms() { [ -n "$1" ] && printf '%.2f ms' "$1" || echo "n/a"; }
fmt_x() { [ -n "$1" ] && printf '%.2fx' "$1" || echo "n/a"; }

declare -A LABEL=(
  [head]="HEAD 4 KiB blob"
  [get4k]="GET 4 KiB blob"
  [get1m]="GET 1 MiB blob"
  [range]="GET Range 64 KiB of a 1 MiB blob"
  [redirect]="Redirect lookup (blobref 307 / nginx \`return 302\`)"
  [new]="New 1 MiB upload (blobref group commit / nginx dav PUT / registry POST+PUT / ceiling: hash, write, fsync, rename)"
  [b1]="New 1 MiB upload, blobref \`index_batch_max = 1\`"
  [dedup]="Dedup 1 MiB upload, \`Expect: 100-continue\` (registry: cross-repo mount)"
  [small]="New 4 KiB upload, blobref group commit"
  [s1]="New 4 KiB upload, blobref \`index_batch_max = 1\`"
)
TABLE=$T/table.md
{
  echo "| scenario | blobref req/s | p99 | nginx req/s | p99 | registry req/s | p99 |" \
    "libmicrohttpd ceiling req/s | p99 | blobref/nginx | blobref/registry | blobref/ceiling |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for sc in head get4k get1m range redirect new b1 small s1 dedup; do
    if [ "$sc" = small ] || [ "$sc" = s1 ]; then
      local_s=blobref
      [ "$sc" = s1 ] && local_s=blobref_b1
      echo "| ${LABEL[$sc]} | $(fmt_rps "$(med small "$local_s" 1)") |" \
        "$(fmt_ms "$(med small "$local_s" 2)") | — | — | — | — | — | — | n/a | n/a | n/a |"
      continue
    fi
    if [ "$sc" = b1 ]; then
      echo "| ${LABEL[b1]} | $(fmt_rps "$(med new blobref_b1 1)") |" \
        "$(fmt_ms "$(med new blobref_b1 2)") | — | — | — | — | — | — |" \
        "$(fmt_x "$(rmed new blobref_b1 new nginx)") | $(fmt_x "$(rmed new blobref_b1 new registry)") | n/a |"
      continue
    fi
    row="| ${LABEL[$sc]} |"
    for s in blobref nginx registry mhd; do
      row+=" $(fmt_rps "$(med "$sc" "$s" 1)") | $(fmt_ms "$(med "$sc" "$s" 2)") |"
    done
    echo "$row $(fmt_x "$(rmed "$sc" blobref "$sc" nginx)") |" \
      "$(fmt_x "$(rmed "$sc" blobref "$sc" registry)") | $(fmt_x "$(rmed "$sc" blobref "$sc" mhd)") |"
  done
} >"$TABLE"

# ---- targets (reported, not asserted) ----
target() { # LABEL VALUE LIMIT: met when VALUE >= LIMIT
  local v=$2
  [ -z "$v" ] || v=$(awk -v v="$v" 'BEGIN { printf (v >= 100 ? "%.0f" : "%.2f"), v }')
  set -- "$1" "$v" "$3"
  if [ -z "$2" ]; then
    echo "- $1: not measured"
  elif awk -v v="$2" -v l="$3" 'BEGIN { exit !(v >= l) }'; then
    echo "- $1: met ($2)"
  else
    echo "- $1: **missed** ($2)"
  fi
}
TARGETS=$T/targets.md
DISK_MBPS=$(med new disk 3)
{
  target "HEAD >= 1.3x nginx" "$(rmed head blobref head nginx)" 1.3
  target "GET 4 KiB >= 1.2x nginx" "$(rmed get4k blobref get4k nginx)" 1.2
  target "Redirect >= 1.0x nginx" "$(rmed redirect blobref redirect nginx)" 1.0
  for sc in head get4k redirect; do # p99 no worse than nginx's: nginx p99 / blobref p99 >= 1
    p99x=""
    [ -z "$(med "$sc" blobref 2)" ] || [ -z "$(med "$sc" nginx 2)" ] ||
      p99x=$(awk -v a="$(med "$sc" nginx 2)" -v b="$(med "$sc" blobref 2)" \
        'BEGIN { if (b > 0) printf "%.2f", a / b }')
    target "${LABEL[$sc]%% (*} p99 no worse than nginx (nginx p99 / blobref p99 >= 1)" "$p99x" 1
  done
  target "Range 64 KiB >= 0.7x nginx" "$(rmed range blobref range nginx)" 0.7
  target "GET 1 MiB >= 0.9x nginx" "$(rmed get1m blobref get1m nginx)" 0.9
  for sc in head get4k get1m range new dedup; do
    wants "$sc" || continue
    target "${LABEL[$sc]%% (*} >= 10x registry" "$(rmed "$sc" blobref "$sc" registry)" 10
  done
  # per round: each against the disk ceiling measured just before it
  target "New 1 MiB uploads >= 0.85 of the disk ceiling (blobref / disk, per round)" \
    "$(rmed new blobref new disk)" 0.85
  target "New 1 MiB uploads against the libmicrohttpd durable-upload ceiling (>= 0.85)" \
    "$(rmed new blobref new mhd)" 0.85
  target "Dedup uploads >= 10,000/s" "$(med dedup blobref 1)" 10000
  target "Group commit vs index_batch_max = 1 (new uploads, >= 1x)" \
    "$(rmed new blobref new blobref_b1)" 1
  target "Group commit vs index_batch_max = 1 (new 4 KiB uploads, >= 1x)" \
    "$(rmed small blobref small blobref_b1)" 1
} >"$TARGETS"

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
versions="blobrefd from $BIN (built $(date -u -r "$BIN/blobrefd" +%FT%TZ 2>/dev/null || echo '?');"
versions+=" work tree at $TREE_REV when the run started)"
versions+=", $(nginx -v 2>&1 | sed 's/^nginx version: //')"
has registry && versions+=", docker-registry $(docker-registry --version 2>/dev/null | awk '{ print $NF }')"
versions+=", $( (wrk -v 2>&1 || true) | awk 'NR == 1 { print "wrk", $2 }')" # wrk -v exits 1
mkdir -p "$(dirname "$OUT")"
{
  echo "# blobref side-by-side benchmark"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ); rounds: $ROUNDS; ${DURATION} s per measurement;" \
    "measuring took ${ELAPSED} s"
  echo "- machine: $(nproc) CPUs, $cpu, kernel $(uname -r); load average at start" \
    "${LOAD_START}, at end $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- versions: $versions"
  echo "- load: wrk -t$WRK_THREADS -c$WRK_CONNS (HEAD: upload_load's reqs mode with the same" \
    "threads and connections, as wrk 4.1 cannot HEAD); new uploads: $UPLOAD_CONNS connections," \
    "at most $UPLOAD_MAX distinct 1 MiB blobs per measurement; dedup: $DEDUP_CONNS connections"
  echo "- req/s and p99: medians over the rounds; ratios: median of the per-round ratios (servers" \
    "take turns back to back within a round, in a different order each round)"
  echo
  cat "$TABLE"
  echo
  echo "Disk ceiling (no HTTP; 1 MiB files written, fsynced, renamed, directory fsynced;" \
    "$UPLOAD_CONNS writers; once a round, before its uploads): median $(fmt_rps "$(med new disk 1)")" \
    "files/s, $DISK_MBPS MB/s. The libmicrohttpd ceiling's new uploads (hash and write as the body" \
    "arrives, then fsync, rename and directory fsync on a thread of their own): median" \
    "$(med new mhd 3) MB/s, the disk ceiling's $(fmt_x "$(rmed new mhd new disk)")."
  [ ! -s "$T/steps" ] || { echo; echo "blobref's new 1 MiB uploads, step timings" \
    "(blobref_upload_step_seconds_total over the measurement's uploads, ms an upload; receive: first" \
    "body byte to last; store_commit: fsync, rename, directory fsync):"; echo;
    sed 's/^/- /' "$T/steps"; }
  [ -z "$CONN_NOTE" ] || echo "New TCP connection per request (GET /healthz," \
    "\`Connection: close\`, wrk, measured once after the rounds): ${CONN_NOTE%, }."
  echo "New uploads, median MB/s: blobref $(med new blobref 3), blobref index_batch_max=1" \
    "$(med new blobref_b1 3), nginx $(med new nginx 3), registry $(med new registry 3)."
  echo
  echo "Targets (reported, not asserted):"
  echo
  cat "$TARGETS"
  echo
  echo "Notes:"
  echo
  echo "- Same blobs everywhere: $N_SMALL x 4 KiB and $N_LARGE x 1 MiB; requests rotate over all" \
    "of them (Range: 16 offsets per blob). Every answer kind was checked first (status, bytes)."
  echo "- nginx: worker_processes 2, sendfile, keepalive, open_file_cache, access_log off; uploads" \
    "with the dav module (\`dav_methods PUT\`), which does not fsync and is not" \
    "content-addressed; it has no dedup upload (n/a)."
  echo "- registry: docker-registry (CNCF distribution) filesystem driver, in-memory blob" \
    "descriptor cache, log level error; a new upload is POST + PUT (2 round trips, timed as one" \
    "upload); its nearest dedup equivalent is the cross-repository mount" \
    "(\`POST /v2/dedup/blobs/uploads/?mount=...&from=bench\`, 201); it has no redirect mode (n/a)."
  echo "- blobref dedup uploads send \`Expect: 100-continue\`; the server answers 200 before any" \
    "body byte and closes the connection, so each upload is a new TCP connection."
  echo "- Every server runs on the same cores as the load generator; other work on the machine" \
    "adds noise (compare ratios from one run, not absolute numbers)."
  for n in "${NOTES[@]}"; do echo "- problem: $n"; done
} >"$OUT"
cp "$RAW" "$(dirname "$OUT")/raw.log"
cat "$OUT"
log "written to $OUT (raw numbers: $(dirname "$OUT")/raw.log)"
