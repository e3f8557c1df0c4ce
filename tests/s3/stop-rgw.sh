#!/usr/bin/env bash
# Stops what tests/s3/start-rgw.sh started in DIR and waits until it is gone. Idempotent: nothing
# running is not an error. SIGKILL, at once: the cluster is throwaway (objects live in the OSD's
# memory) and radosgw alone takes up to 5 s to honour a SIGTERM. Only pids listed in DIR/pids
# whose command line names DIR/ceph.conf are signalled. DIR is kept (logs); start-rgw.sh wipes it
# on the next start.
# usage: tests/s3/stop-rgw.sh DIR
set -uo pipefail
D=${1:?usage: stop-rgw.sh DIR}
[ -d "$D" ] || exit 0
D=$(cd "$D" && pwd)
[ -f "$D/pids" ] || exit 0
# ours PID: one of this cluster's daemons, still running (a dead one, not our child, can linger as
# a zombie until init reaps it; its cmdline is empty)
ours() { [ -n "$1" ] && grep -qF -- "$D/ceph.conf" "/proc/$1/cmdline" 2>/dev/null; }
pids=()
for pid in $(awk '$1 == "rgw" || $1 == "osd" || $1 == "mon" {print $2}' "$D/pids"); do
  ours "$pid" && kill -9 "$pid" 2>/dev/null && pids+=("$pid")
done
for pid in "${pids[@]}"; do
  for _ in $(seq 1 100); do ours "$pid" || break; sleep 0.05; done
  ours "$pid" && { echo "stop-rgw: $pid survived SIGKILL for 5 s" >&2; exit 1; }
done
: >"$D/pids"
exit 0
