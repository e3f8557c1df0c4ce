#!/usr/bin/env bash
# S3 side of `make bench`: blobrefd on a real S3 (Ceph radosgw, tests/s3/start-rgw.sh) against the
# same work done without it, on 127.0.0.1, servers taking turns round by round:
#   - redirects: blobref 307 to a presigned S3 URL vs nginx `return 302` with the same headers
#     and a Location of the same length, and the libmicrohttpd trivial-handler ceiling
#     (tests/bench/mhd_ceiling.c) as a third column;
#   - proxied reads (4 KiB, 1 MiB, 16 MiB, Range 64 KiB): blobref proxy mode vs wrk reading the same
#     objects straight from radosgw with presigned URLs;
#   - new 1 MiB uploads: `curl -T` to blobref vs `curl --aws-sigv4 -T` to radosgw, same files,
#     same parallelism (both pay the same curl process per file).
#
# usage: tests/bench/s3-bench.sh [BIN_DIR]   env: ROUNDS=3 DURATION=10 QUICK=1 WRK_CONNS=64
#        UPLOAD_CONNS=16 UPLOAD_FILES=200 OUT=build/bench/s3-results.md KEEP=1
#        SCENARIOS="redirect get4k get1m get16m range upload"   a subset for a quicker run
#        PROXY_CONNS=16   wrk's connections for the proxied 1 MiB and 16 MiB reads (both sides)
#        PERF_OUT=FILE    `perf record -g` the proxying blobrefd through the timed rounds into FILE
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BENCH=$ROOT/tests/bench
BIN=${1:-${BIN:-bin}}
case "$BIN" in /*) ;; *) BIN=$ROOT/$BIN ;; esac
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
UPLOAD_FILES=${UPLOAD_FILES:-200}
if [ "${QUICK:-0}" = 1 ]; then
  ROUNDS=1 DURATION=3 UPLOAD_FILES=48
fi
WRK_THREADS=${WRK_THREADS:-2}
WRK_CONNS=${WRK_CONNS:-64}
UPLOAD_CONNS=${UPLOAD_CONNS:-16}
OUT=${OUT:-$ROOT/build/bench/s3-results.md}
SCENARIOS=${SCENARIOS:-redirect get4k get1m get16m range upload}
PROXY_CONNS=${PROXY_CONNS:-16}
wants() { [[ " $SCENARIOS " == *" $1 "* ]]; }
for t in wrk nginx curl radosgw /usr/bin/python3; do
  command -v "$t" >/dev/null || { echo "s3-bench: $t not found (make bench installs it)" >&2; exit 2; }
done
[ -x "$BIN/blobrefd" ] || { echo "s3-bench: $BIN/blobrefd not found" >&2; exit 2; }

T=$(mktemp -d /tmp/blobref-s3b.XXXXXX) # short: radosgw's admin sockets live below it
chmod 755 "$T"
declare -A PIDS=()
log() { printf '[s3-bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  "$ROOT/tests/s3/stop-rgw.sh" "$T/rgw" >/dev/null 2>&1 || true
  if [ $rc -ne 0 ]; then
    mkdir -p "$(dirname "$OUT")/failed-logs"
    cp "$T"/*.log "$(dirname "$OUT")/failed-logs/" 2>/dev/null || true
  fi
  [ "${KEEP:-0}" = 1 ] && log "kept $T" || rm -rf "$T"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 10000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  die "no free port"
}
wait_ready() { # NAME URL
  for _ in $(seq 200); do
    kill -0 "${PIDS[$1]}" 2>/dev/null || { tail -20 "$T/$1.log" >&2; die "$1 exited"; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$2" || true)" = 200 ] && return 0
    sleep 0.1
  done
  tail -20 "$T/$1.log" >&2
  die "$1 not ready at $2"
}

log "starting radosgw"
RGW=$("$ROOT/tests/s3/start-rgw.sh" "$T/rgw")
AK=TESTAK SK=TESTSK
/usr/bin/python3 - "$RGW" <<'EOF'
import sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="TESTAK", aws_secret_access_key="TESTSK",
                  config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
for b in ("bench", "direct"):
    s3.create_bucket(Bucket=b)
EOF

cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -o "$T/upload_load" "$BENCH/upload_load.c" \
  -lcrypto -lpthread
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -o "$T/mhd_ceiling" "$BENCH/mhd_ceiling.c" \
  $(pkg-config --cflags --libs libmicrohttpd libcrypto)
UL=$T/upload_load
"$UL" -m gen -s 4096 -n 500 -S "s3s-$$" -o "$T/files" >"$T/small.list"
"$UL" -m gen -s 1048576 -n 16 -S "s3l-$$" -o "$T/files" >"$T/large.list"
"$UL" -m gen -s 16777216 -n 4 -S "s3h-$$" -o "$T/files" >"$T/huge.list"
if wants upload; then
  "$UL" -m gen -s 1048576 -n $((UPLOAD_FILES * ROUNDS * 2)) -S "s3u-$$" -o "$T/up" >"$T/up.list"
fi

start_blobref() { # NAME PORT SERVE
  mkdir -p "$T/$1"
  cat >"$T/$1/blobref.conf" <<EOF
[server]
listen = 127.0.0.1:$2
data_dir = $T/$1
upload_store = lake
[store lake]
kind = s3
endpoint = $RGW
bucket = bench
access_key = $AK
secret_key = $SK
serve = $3
EOF
  "$BIN/blobrefd" -c "$T/$1/blobref.conf" >"$T/$1.log" 2>&1 &
  PIDS[$1]=$!
  wait_ready "$1" "http://127.0.0.1:$2/readyz"
}
P_PROXY=$(free_port) P_REDIR=$(free_port) P_NGINX=$(free_port) P_MHD=$(free_port)
start_blobref proxy "$P_PROXY" proxy
start_blobref redir "$P_REDIR" redirect
log "uploading the read set through blobrefd (and the same objects to bucket 'direct')"
"$UL" -m put -u "http://127.0.0.1:$P_PROXY/v1/blobs" -f "$T/small.list" -c 8 -d 300 >/dev/null
"$UL" -m put -u "http://127.0.0.1:$P_PROXY/v1/blobs" -f "$T/large.list" -c 8 -d 300 >/dev/null
"$UL" -m put -u "http://127.0.0.1:$P_PROXY/v1/blobs" -f "$T/huge.list" -c 4 -d 300 >/dev/null
"$UL" -m put -u "http://127.0.0.1:$P_REDIR/v1/blobs" -f "$T/small.list" -c 8 -d 300 >/dev/null
# the proxied reads' peer: the same objects straight from radosgw (skipped for a redirect-only run)
wants get4k || wants get1m || wants get16m || wants range ||
  touch "$T/get4k.direct" "$T/get1m.direct" "$T/get16m.direct" "$T/range.direct"
wants get4k || wants get1m || wants get16m || wants range && /usr/bin/python3 - "$RGW" "$T" <<'EOF'
import sys, boto3
from botocore.config import Config
rgw, t = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=rgw, region_name="us-east-1", aws_access_key_id="TESTAK",
                  aws_secret_access_key="TESTSK",
                  config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
import random
random.seed(42)
out = {"get4k": [], "get1m": [], "get16m": [], "range": []}
for name, kind in (("small", "get4k"), ("large", "get1m"), ("huge", "get16m")):
    for line in open(f"{t}/{name}.list"):
        h, path = line.split()
        key = f"sha256/{h[:2]}/{h[2:4]}/{h}"
        s3.upload_file(path, "direct", key)
        url = s3.generate_presigned_url("get_object", Params={"Bucket": "direct", "Key": key},
                                        ExpiresIn=86400)
        p = url[len(rgw):]
        out[kind].append(f"GET {p}")
        if kind == "get1m":
            for _ in range(16):
                a = random.randrange(0, (1048576 - 65536) // 4096) * 4096
                out["range"].append(f"GET {p} bytes={a}-{a + 65535}")
for k, v in out.items():
    open(f"{t}/{k}.direct", "w").write("\n".join(v) + "\n")
EOF
awk '{ print "GET /v1/blobs/" $1 }' "$T/small.list" >"$T/get4k.blobref"
awk '{ print "GET /v1/blobs/" $1 }' "$T/large.list" >"$T/get1m.blobref"
awk '{ print "GET /v1/blobs/" $1 }' "$T/huge.list" >"$T/get16m.blobref"
awk 'BEGIN { srand(42) } { for (i = 0; i < 16; i++) { a = int(rand() * (1048576 - 65536) / 4096) * 4096
       print "GET /v1/blobs/" $1 " bytes=" a "-" (a + 65535) } }' "$T/large.list" >"$T/range.blobref"
cp "$T/get4k.blobref" "$T/redirect.blobref"
awk '{ print "GET /r/" $1 }' "$T/small.list" >"$T/redirect.nginx"

# a presigned Location from blobref, so that nginx answers with one of the same length
h=$(head -1 "$T/small.list" | cut -c1-64)
loc=$(curl -s -o /dev/null -w '%{redirect_url}' "http://127.0.0.1:$P_REDIR/v1/blobs/$h")
[ -n "$loc" ] || die "no redirect from blobref"
cc_redir=$(curl -s -o /dev/null -D - "http://127.0.0.1:$P_REDIR/v1/blobs/$h" |
  sed -n 's/^[Cc]ache-[Cc]ontrol: *\(.*\)\r$/\1/p')
loc_query=${loc#*\?}

mkdir -p "$T/nginx/tmp"
cat >"$T/nginx/nginx.conf" <<EOF
worker_processes 2;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $T/nginx/tmp;
  proxy_temp_path $T/nginx/tmp;
  fastcgi_temp_path $T/nginx/tmp;
  uwsgi_temp_path $T/nginx/tmp;
  scgi_temp_path $T/nginx/tmp;
  server {
    listen 127.0.0.1:$P_NGINX;
    location = /healthz { return 200 'ok'; }
    location ~ "^/r/([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{60})\$" {
      add_header Cache-Control "$cc_redir";
      add_header X-Request-Id "0000000000000000";
      return 302 "$RGW/bench/sha256/\$1/\$2/\$1\$2\$3?$loc_query";
    }
  }
}
EOF
nginx -e "$T/nginx/error.log" -p "$T/nginx" -c "$T/nginx/nginx.conf" -g 'daemon off;' >"$T/nginx.log" 2>&1 &
PIDS[nginx]=$!
wait_ready nginx "http://127.0.0.1:$P_NGINX/healthz"

if wants redirect; then
  "$T/mhd_ceiling" "$P_MHD" "$T/files" "$RGW/bench" >"$T/mhd.log" 2>&1 &
  PIDS[mhd]=$!
  for _ in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_MHD/r/$h")" = 307 ] && break
    sleep 0.1
  done
fi

# sanity: blobref's redirect target and proxied bytes are right, nginx's Location is as long
nloc=$(curl -s -o /dev/null -w '%{redirect_url}' "http://127.0.0.1:$P_NGINX/r/$h")
[ ${#nloc} = ${#loc} ] || die "nginx Location ($nloc) is not as long as blobref's ($loc)"
[ "$(curl -s "$loc" | sha256sum | cut -c1-64)" = "$h" ] || die "presigned redirect $loc does not read back"
[ "$(curl -s "http://127.0.0.1:$P_PROXY/v1/blobs/$h" | sha256sum | cut -c1-64)" = "$h" ] ||
  die "proxied read is wrong"

RES=$T/res
mkdir -p "$RES"
# CPU seconds (user + system) the processes PIDS... have used so far
cpu_s() { local t=0 p; for p in "$@"; do
    t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0))); done
  awk -v t="$t" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", t / hz }'; }
RGW_PIDS=$(awk '{ print $2 }' "$T/rgw/pids")  # radosgw and its Ceph daemons
wrk_run() { # SCENARIO WHO BASE LIST
  local out conns=$WRK_CONNS c0 r0 c1 r1
  case $1 in get1m | get16m) conns=$PROXY_CONNS ;; esac
  # shellcheck disable=SC2086
  c0=$(cpu_s "${PIDS[proxy]}" "${PIDS[redir]}") r0=$(cpu_s $RGW_PIDS)
  out=$(BENCH_REQS=$4 timeout $((DURATION + 60)) wrk -t"$WRK_THREADS" -c"$conns" \
    -d"${DURATION}s" --timeout 10s -s "$BENCH/rotate.lua" "$3" | sed -n 's/^WRK //p') || true
  # shellcheck disable=SC2086
  c1=$(cpu_s "${PIDS[proxy]}" "${PIDS[redir]}") r1=$(cpu_s $RGW_PIDS)
  local rps p99 bad
  rps=$(sed -n 's/.* rps=\([^ ]*\).*/\1/p' <<<"$out")
  p99=$(sed -n 's/.* p99_ms=\([^ ]*\).*/\1/p' <<<"$out")
  bad=$(sed -n 's/.* non2xx3xx=\([^ ]*\).*/\1/p' <<<"$out")
  [ -n "$rps" ] || die "$1 $2: no result"
  [ "${bad:-0}" = 0 ] || log "warning: $1 $2: $bad non-2xx/3xx answers"
  echo "$rps $p99" >>"$RES/$1.$2"
  # CPU per request: blobrefd's and radosgw's (with its Ceph daemons), from /proc
  awk -v b="$(awk -v a="$c0" -v z="$c1" 'BEGIN { print z - a }')" \
    -v g="$(awk -v a="$r0" -v z="$r1" 'BEGIN { print z - a }')" -v n="$rps" -v d="$DURATION" \
    'BEGIN { printf "%.3f %.3f\n", b * 1000 / (n * d), g * 1000 / (n * d) }' >>"$RES/$1.$2.cpu"
  log "$1 $2: $rps req/s, p99 $p99 ms, CPU ms/request: blobrefd $(tail -1 "$RES/$1.$2.cpu" | cut -d' ' -f1), radosgw $(tail -1 "$RES/$1.$2.cpu" | cut -d' ' -f2), load $(cut -d' ' -f1 /proc/loadavg)"
}
upload_run() { # WHO ROUND
  local list=$T/up.$1.$2 start end n
  if [ "$1" = blobref ]; then
    sed -n "$(( ($2 * 2) * UPLOAD_FILES + 1 )),$(( ($2 * 2 + 1) * UPLOAD_FILES ))p" "$T/up.list" >"$list"
  else
    sed -n "$(( ($2 * 2 + 1) * UPLOAD_FILES + 1 )),$(( ($2 * 2 + 2) * UPLOAD_FILES ))p" "$T/up.list" >"$list"
  fi
  start=$(date +%s.%N)
  if [ "$1" = blobref ]; then
    awk -v u="http://127.0.0.1:$P_PROXY/v1/blobs/" '{ print $2 " " u $1 }' "$list" |
      xargs -P "$UPLOAD_CONNS" -n 2 sh -c 'curl -sf -o /dev/null -T "$0" "$1"' || die "blobref upload failed"
  else
    # the payload's real SHA-256 (the file's name), so radosgw verifies the bytes as it does for
    # blobref's uploads; curl 7.88 signs an uploaded file wrongly without it
    awk -v u="$RGW/direct/up/" '{ print $2 " " u $1 " " $1 }' "$list" |
      xargs -P "$UPLOAD_CONNS" -n 3 sh -c 'curl -sf -o /dev/null --aws-sigv4 aws:amz:us-east-1:s3 \
        --user TESTAK:TESTSK -H "x-amz-content-sha256: $2" -T "$0" "$1"' ||
      die "radosgw upload failed"
  fi
  end=$(date +%s.%N)
  n=$(wc -l <"$list")
  awk -v n="$n" -v s="$start" -v e="$end" 'BEGIN { printf "%.1f -\n", n / (e - s) }' >>"$RES/upload.$1"
  log "upload $1: $(tail -1 "$RES/upload.$1" | cut -d' ' -f1) blobs/s"
}

if [ -n "${PERF_OUT:-}" ]; then
  perf record -g -F 499 -p "${PIDS[proxy]}" -o "$PERF_OUT" >"$T/perf.log" 2>&1 &
  PIDS[perf]=$!
fi
for ROUND in $(seq 0 $((ROUNDS - 1))); do
  log "round $((ROUND + 1))/$ROUNDS"
  order=(a b c)
  [ $((ROUND % 2)) = 1 ] && order=(c b a)
  for who in "${order[@]}"; do
    if [ "$who" = a ]; then
      if wants redirect; then
        wrk_run redirect blobref "http://127.0.0.1:$P_REDIR" "$T/redirect.blobref"
      fi
      for sc in get4k get1m get16m range; do
        if wants $sc; then wrk_run "$sc" blobref "http://127.0.0.1:$P_PROXY" "$T/$sc.blobref"; fi
      done
      if wants upload; then upload_run blobref "$ROUND"; fi
    elif [ "$who" = b ]; then
      if wants redirect; then wrk_run redirect nginx "http://127.0.0.1:$P_NGINX" "$T/redirect.nginx"; fi
      for sc in get4k get1m get16m range; do
        if wants $sc; then wrk_run "$sc" direct "$RGW" "$T/$sc.direct"; fi
      done
      if wants upload; then upload_run direct "$ROUND"; fi
    else
      if wants redirect; then wrk_run redirect mhd "http://127.0.0.1:$P_MHD" "$T/redirect.nginx"; fi
    fi
  done
done

# time to first byte, unloaded: one curl at a time, TTFB_N requests a side, the sides taking
# turns request by request (the machine's other load moves both alike), median
TTFB_N=${TTFB_N:-30}
for sc in get1m get16m; do
  wants $sc || continue
  : >"$RES/ttfb.$sc.blobref"
  : >"$RES/ttfb.$sc.direct"
  for i in $(seq "$TTFB_N"); do
    for who in blobref direct; do
      if [ "$who" = blobref ]; then base=http://127.0.0.1:$P_PROXY; else base=$RGW; fi
      path=$(sed -n "$(( (i - 1) % $(wc -l <"$T/$sc.$who") + 1 ))p" "$T/$sc.$who" | cut -d' ' -f2)
      curl -s -o /dev/null -w '%{time_starttransfer}\n' "$base$path" >>"$RES/ttfb.$sc.$who"
    done
  done
done
if [ -n "${PIDS[perf]:-}" ]; then
  kill -INT "${PIDS[perf]}" && wait "${PIDS[perf]}" 2>/dev/null || true
  unset 'PIDS[perf]'
  log "perf profile of the proxying blobrefd: $PERF_OUT"
fi
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v c="$3" '{ print $c }' "$RES/$1.$2" | median; }
ratio() { paste -d' ' "$RES/$1.$2" "$RES/$1.$3" | awk '{ print $1 / $3 }' | median; }
mkdir -p "$(dirname "$OUT")"
{
  echo "S3 benchmark $(date -u +%FT%TZ), $ROUNDS round(s) of ${DURATION}s, wrk -t$WRK_THREADS -c$WRK_CONNS, uploads: $UPLOAD_FILES x 1 MiB, $UPLOAD_CONNS in parallel"
  echo
  echo "| scenario | blobref req/s | p99 ms | peer | peer req/s | p99 ms | blobref/peer |"
  echo "|---|---:|---:|---|---:|---:|---:|"
  if wants redirect; then
    printf '| S3 redirect (307 presigned) | %.0f | %s | nginx `return 302` | %.0f | %s | %.2fx |\n' \
      "$(col redirect blobref 1)" "$(col redirect blobref 2)" "$(col redirect nginx 1)" \
      "$(col redirect nginx 2)" "$(ratio redirect blobref nginx)"
    printf '| S3 redirect (307 presigned) | %.0f | %s | libmicrohttpd ceiling (307) | %.0f | %s | %.2fx |\n' \
      "$(col redirect blobref 1)" "$(col redirect blobref 2)" "$(col redirect mhd 1)" \
      "$(col redirect mhd 2)" "$(ratio redirect blobref mhd)"
  fi
  for sc in get4k get1m get16m range; do
    wants $sc || continue
    case $sc in get4k) name="proxied GET 4 KiB" ;; get1m) name="proxied GET 1 MiB (-c$PROXY_CONNS)" ;;
      get16m) name="proxied GET 16 MiB (-c$PROXY_CONNS)" ;; range) name="proxied Range 64 KiB of 1 MiB" ;; esac
    printf '| %s | %.0f | %s | radosgw direct (presigned) | %.0f | %s | %.2fx |\n' "$name" \
      "$(col "$sc" blobref 1)" "$(col "$sc" blobref 2)" "$(col "$sc" direct 1)" "$(col "$sc" direct 2)" \
      "$(ratio "$sc" blobref direct)"
  done
  echo
  echo "| scenario | side | CPU ms/request, blobrefd | CPU ms/request, radosgw + Ceph |"
  echo "|---|---|---:|---:|"
  for sc in get1m get16m; do
    wants $sc || continue
    for who in blobref direct; do
      printf '| %s | %s | %s | %s |\n' "$sc" "$who" "$(awk '{ print $1 }' "$RES/$sc.$who.cpu" | median)" \
        "$(awk '{ print $2 }' "$RES/$sc.$who.cpu" | median)"
    done
  done
  echo
  echo "| time to first byte (curl, one at a time, median of $TTFB_N) | blobref ms | radosgw direct ms | difference ms |"
  echo "|---|---:|---:|---:|"
  for sc in get1m get16m; do
    wants $sc || continue
    b=$(awk '{ print $1 * 1000 }' "$RES/ttfb.$sc.blobref" | median)
    d=$(awk '{ print $1 * 1000 }' "$RES/ttfb.$sc.direct" | median)
    printf '| %s | %.2f | %.2f | %+.2f |\n' "$sc" "$b" "$d" "$(awk -v b="$b" -v d="$d" 'BEGIN { print b - d }')"
  done
  echo
  if wants upload; then
    printf '| new 1 MiB uploads (blobs/s) | %.1f | - | curl --aws-sigv4 to radosgw | %.1f | - | %.2fx |\n' \
      "$(col upload blobref 1)" "$(col upload direct 1)" "$(ratio upload blobref direct)"
  fi
} >"$OUT"
cat "$OUT"
