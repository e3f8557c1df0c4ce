#!/usr/bin/env bash
# Installs the Debian packages blobref needs to build, test and benchmark; silent when all are present.
# usage: tools/install-deps.sh [build|test|bench|failover]   (bench and failover include test)
set -euo pipefail
level=${1:-build}
build_pkgs=(gcc make pkg-config libmicrohttpd-dev liblmdb-dev libssl-dev libcurl4-openssl-dev
  libjansson-dev libinih-dev libavro-dev zlib1g-dev libsnappy-dev libzstd-dev liblz4-dev libbrotli-dev
  libgnutls28-dev    # HTTPS certificates handed to libmicrohttpd's GnuTLS per handshake
  libpq-dev          # [index] kind = postgres: the cluster index over libpq
  libmagic-dev       # content types detected from a blob's first bytes
  nodejs npm)        # npm ci in ui/: uPlot, compiled into blobrefd for the console (/ui/)
test_pkgs=(clang libclang-rt-14-dev curl lmdb-utils strace python3-requests python3-pytest
  prometheus systemd                          # promtool check metrics; systemd-analyze verify
  radosgw ceph-mon ceph-osd python3-boto3     # a real S3 for the tests: tests/s3/start-rgw.sh
  varnish                                     # a real CDN in front of blobrefd: conf/varnish/blobref.vcl
  python3-pil python3-nbclient python3-nbformat python3-ipykernel   # the Python client and its notebook
  chromium python3-websocket   # the console in a real headless browser: tests/integration/test_ui.py
  man-db groff-base                   # man --warnings on conf/man/*
  postgresql-15 haproxy python3-psycopg2      # cluster mode: tests/cluster/ (primary, standby, HAProxy)
  python3-fsspec python3-pytest-xdist)        # blobref:// for fsspec; the suite on both cores
failover_pkgs=(patroni etcd-server etcd-client)   # make test-failover: Patroni over three etcd members
bench_pkgs=(nginx-light wrk docker-registry)
want=("${build_pkgs[@]}")
case "$level" in
  build) ;;
  test) want+=("${test_pkgs[@]}") ;;
  bench) want+=("${test_pkgs[@]}" "${bench_pkgs[@]}") ;;
  failover) want+=("${test_pkgs[@]}" "${failover_pkgs[@]}") ;;
  *) echo "usage: $0 [build|test|bench|failover]" >&2; exit 2 ;;
esac
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
# node/npm may come from outside Debian (e.g. nvm); accept any working ones.
if command -v node >/dev/null && command -v npm >/dev/null; then
  m2=(); for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || m2+=("$p"); done
  missing=("${m2[@]}")
  [ ${#missing[@]} -eq 0 ] && exit 0
fi
sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
