#!/usr/bin/env bash
# Starts a throwaway single-node Ceph (1 monitor, 1 in-memory "memstore" OSD) and radosgw, a real
# S3 server, on 127.0.0.1 for the tests and benchmarks. Every byte of state lives under DIR (no
# /etc/ceph, no /var/lib/ceph); works as root or as a user. Packages: tools/install-deps.sh test.
#
# usage: tests/s3/start-rgw.sh DIR [PORT]     start everything (DIR is wiped first)
#        tests/s3/start-rgw.sh --rgw-only DIR  (re)start only radosgw of the cluster in DIR
#        tests/s3/stop-rgw.sh DIR              stop everything
#
# S3 listens on 127.0.0.1:PORT, the monitor on PORT+1 (msgr v2) and PORT+2 (v1). With no PORT the
# first free triple from 17480 up is taken; an explicit PORT that is busy is an error. Concurrent
# starts (pytest-xdist workers, other checkouts) hold a lock, RGW_PORT_LOCK
# (/tmp/blobref-start-rgw.lock), from choosing the ports until radosgw answers: a triple seen free
# is not taken by another start before its daemons bind it.
# Env: RGW_ACCESS_KEY/RGW_SECRET_KEY (TESTAK/TESTSK) for user "tester", RGW_ACCESS_KEY2/
# RGW_SECRET_KEY2 (TESTAK2/TESTSK2) for "tester2", who owns nothing of tester's; clients sign
# for region us-east-1; RGW_START_TIMEOUT seconds (90) before giving up; RGW_MEMSTORE_BYTES
# (4 GiB) the in-memory OSD's size (memory is used only as objects are written; a 2 GiB blob test
# needs more than 2 GiB, and a full OSD blocks writes).
# Prints the endpoint (http://127.0.0.1:PORT) on stdout, progress on stderr. Writes DIR/endpoint,
# DIR/pids ("mon PID", "osd PID", "rgw PID" lines), DIR/ceph.conf, logs in DIR/log. On failure it
# prints the logs' tails, stops what it started and exits non-zero.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rgw_only=0
if [ "${1:-}" = --rgw-only ]; then rgw_only=1; shift; fi
D=${1:?usage: start-rgw.sh [--rgw-only] DIR [PORT]}
AK=${RGW_ACCESS_KEY:-TESTAK}; SK=${RGW_SECRET_KEY:-TESTSK}
AK2=${RGW_ACCESS_KEY2:-TESTAK2}; SK2=${RGW_SECRET_KEY2:-TESTSK2}
timeout_s=${RGW_START_TIMEOUT:-90}
t0=$(date +%s.%N); deadline=$(( $(date +%s) + timeout_s ))
for t in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool curl python3; do
  command -v "$t" >/dev/null || { echo "start-rgw: $t not found (run tools/install-deps.sh test)" >&2; exit 2; }
done

say() { echo "start-rgw: $*" >&2; }
# fd 9 holds the lock until this script exits; every daemon is started with 9>&- so none keeps it
exec 9>>"${RGW_PORT_LOCK:-/tmp/blobref-start-rgw.lock}"
flock -w "$timeout_s" 9 || { say "another start-rgw.sh held the port lock for ${timeout_s}s"; exit 1; }
deadline=$(( $(date +%s) + timeout_s ))  # the time waited for the lock does not count
left() { local l=$(( deadline - $(date +%s) )); [ "$l" -gt 0 ] && echo "$l" || echo 1; }
fail() {
  say "FAILED: $*"
  for f in "$D"/log/*; do
    [ -s "$f" ] || continue
    echo "---- tail $f" >&2; tail -n 25 "$f" >&2
  done
  if [ "$rgw_only" = 1 ]; then stop_rgw; else "$here/stop-rgw.sh" "$D" >&2 || true; fi
  exit 1
}
# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND until it succeeds or the deadline passes.
wait_for() {
  local what=$1; shift
  while ! "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "$what not ready within ${timeout_s}s"
    sleep 0.2
  done
}
pid_of() { [ -f "$D/pids" ] && awk -v n="$1" '$1 == n {print $2}' "$D/pids" | tail -n 1; }
# alive PID: PID is one of this cluster's daemons and still running. Not kill -0: the daemons are
# not our children, so a dead one stays a zombie until init reaps it, and kill -0 succeeds on it.
alive() { [ -n "$1" ] && grep -qF -- "$D/ceph.conf" "/proc/$1/cmdline" 2>/dev/null; }
# running PID: PID exists and is no zombie (for a child just forked, whose cmdline is still ours)
running() { [ -n "$1" ] && [ -r "/proc/$1/stat" ] && ! awk '{sub(/.*\) /, ""); exit $1 == "Z" ? 0 : 1}' "/proc/$1/stat" 2>/dev/null; }
stop_rgw() {
  local p; p=$(pid_of rgw)
  if alive "$p"; then
    kill "$p" 2>/dev/null || true
    # radosgw finishes a SIGTERM within 5 s (a periodic thread must wake up first)
    for _ in $(seq 1 100); do alive "$p" || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  fi
  [ -f "$D/pids" ] && sed -i '/^rgw /d' "$D/pids"
  return 0
}
# signed_get PORT: ListBuckets as tester. curl 7.88's --aws-sigv4 sends no x-amz-content-sha256,
# which radosgw then refuses (SignatureDoesNotMatch): give it the empty body's hash.
signed_get() {
  curl -sf -o /dev/null --max-time 2 --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AK:$SK" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
    "http://127.0.0.1:$1/"
}
start_rgw() {
  local port; port=$(cat "$D/port")
  radosgw -c "$C" -n client.rgw.a -f </dev/null 9>&- >>"$D/log/rgw.out" 2>&1 &
  local pid=$!
  echo "rgw $pid" >>"$D/pids"
  # ready = answers a signed request as tester (so the user and its key are loaded too)
  while :; do
    running "$pid" || fail "radosgw exited"
    [ -s "$D/users.done" ] && signed_get "$port" && break
    [ ! -s "$D/users.done" ] && curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/" && break
    [ "$(date +%s)" -lt "$deadline" ] || fail "radosgw not answering on 127.0.0.1:$port within ${timeout_s}s"
    sleep 0.2
  done
}

if [ "$rgw_only" = 1 ]; then
  D=$(cd "$D" && pwd); C=$D/ceph.conf; export CEPH_CONF=$C
  [ -f "$C" ] && [ -f "$D/port" ] || { say "$D holds no cluster started by start-rgw.sh"; exit 2; }
  alive "$(pid_of osd)" && alive "$(pid_of mon)" || { say "mon/osd of $D are not running"; exit 1; }
  stop_rgw
  start_rgw
  say "radosgw restarted in $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s"
  cat "$D/endpoint"
  exit 0
fi

# Clean DIR, but only if it is empty or one of ours (never wipe an arbitrary directory).
if [ -e "$D" ]; then
  [ -d "$D" ] || { say "$D is not a directory"; exit 2; }
  if [ -n "$(ls -A "$D")" ] && [ ! -f "$D/.start-rgw" ]; then
    say "$D is not empty and was not made by start-rgw.sh; refusing to wipe it"; exit 2
  fi
  [ -f "$D/.start-rgw" ] && "$here/stop-rgw.sh" "$D" >&2
fi
# ports: PORT (S3), PORT+1, PORT+2 (monitor) must all be free on 127.0.0.1
ports_free() {
  python3 - "$1" <<'PY'
import socket, sys
p = int(sys.argv[1])
for q in (p, p + 1, p + 2):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemons do: TIME_WAIT is fine
    try:
        s.bind(("127.0.0.1", q))
    except OSError:
        sys.exit(1)
    finally:
        s.close()
PY
}
if [ -n "${2:-}" ]; then
  PORT=$2
  ports_free "$PORT" || { say "port $PORT, $((PORT + 1)) or $((PORT + 2)) on 127.0.0.1 is busy"; exit 1; }
else
  PORT=17480
  until ports_free "$PORT"; do
    PORT=$((PORT + 3)); [ "$PORT" -lt 17780 ] || { say "no free port triple in 17480-17779"; exit 1; }
  done
fi

mkdir -p "$D"; D=$(cd "$D" && pwd)
find "$D" -mindepth 1 -delete
touch "$D/.start-rgw"
mkdir -p "$D"/{run,log,mon,osd,rgw}
# Unix socket paths are limited to 107 bytes
[ ${#D} -le 60 ] || say "warning: $D is long; admin sockets under it may not bind"
echo "$PORT" >"$D/port"
C=$D/ceph.conf; export CEPH_CONF=$C
FSID=$(python3 -c 'import uuid; print(uuid.uuid4())')
MONV2=$((PORT + 1)); MONV1=$((PORT + 2))
cat >"$C" <<CONF
[global]
fsid = $FSID
mon_host = [v2:127.0.0.1:$MONV2,v1:127.0.0.1:$MONV1]
public_addr = 127.0.0.1
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
# without these two, radosgw loops on "get_initial_auth_request returned -13" and exits
ms_mon_client_mode = crc secure
ms_client_mode = crc secure
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_max_pg_per_osd = 1000
# the monitor batches map changes for 1 s by default; radosgw creates 6 pools one after another
paxos_propose_interval = 0.05
paxos_min_wait = 0.01
osd_crush_chooseleaf_type = 0
osd_objectstore = memstore
memstore_device_bytes = ${RGW_MEMSTORE_BYTES:-4294967296}
osd_max_object_name_len = 256
osd_max_object_namespace_len = 64
run_dir = $D/run
crash_dir = $D/crash
exporter_sock_dir = $D/run
log_file = $D/log/\$name.log
pid_file = $D/run/\$name.pid
mon_data = $D/mon/\$cluster-\$id
osd_data = $D/osd/\$cluster-\$id
keyring = $D/keyring
[mon]
admin_socket = $D/run/\$name.asok
[osd]
admin_socket = $D/run/\$name.asok
[client.rgw.a]
admin_socket = $D/run/\$name.asok
rgw_frontends = beast endpoint=127.0.0.1:$PORT
rgw_dns_name = 127.0.0.1
rgw_data = $D/rgw
CONF

monmaptool --create --addv a "[v2:127.0.0.1:$MONV2,v1:127.0.0.1:$MONV1]" --fsid "$FSID" \
  "$D/monmap" >"$D/log/mkfs.out" 2>&1 || fail "monmaptool"
ceph-mon -c "$C" --mkfs -i a --monmap "$D/monmap" >>"$D/log/mkfs.out" 2>&1 || fail "ceph-mon --mkfs"
ceph-mon -c "$C" -i a -f </dev/null 9>&- >"$D/log/mon.out" 2>&1 &
echo "mon $!" >"$D/pids"
wait_for "ceph-mon" timeout 5 ceph -c "$C" --connect-timeout 4 mon stat
say "mon up after $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s"

OSD_UUID=$(python3 -c 'import uuid; print(uuid.uuid4())')
ID=$(timeout "$(left)" ceph -c "$C" osd new "$OSD_UUID" 2>>"$D/log/mkfs.out") || fail "ceph osd new"
mkdir -p "$D/osd/ceph-$ID"
timeout "$(left)" ceph-osd -c "$C" -i "$ID" --mkfs --osd-uuid "$OSD_UUID" >>"$D/log/mkfs.out" 2>&1 \
  || fail "ceph-osd --mkfs"
ceph-osd -c "$C" -i "$ID" -f </dev/null 9>&- >"$D/log/osd.out" 2>&1 &
echo "osd $!" >>"$D/pids"
osd_up() { ceph -c "$C" --connect-timeout 4 osd stat 2>/dev/null | grep -q " 1 up"; }
wait_for "ceph-osd" osd_up
say "osd up after $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s"

start_rgw
say "radosgw answering after $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s"
mkuser() {
  timeout "$(left)" radosgw-admin -c "$C" user create --uid="$1" --display-name="$1" \
    --access-key="$2" --secret="$3" >"$D/user-$1.json" 2>>"$D/log/radosgw-admin.out" || fail "user create $1"
}
mkuser tester "$AK" "$SK"
mkuser tester2 "$AK2" "$SK2"
echo ok >"$D/users.done"
wait_for "user tester" signed_get "$PORT"
echo "http://127.0.0.1:$PORT" >"$D/endpoint"
say "ready in $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s: http://127.0.0.1:$PORT ($AK / $SK, $AK2 / $SK2)"
cat "$D/endpoint"
