#!/usr/bin/env bash
# Runs the Python integration and cross-check tests (pytest) against the binaries in BIN_DIR:
#   tests/run-integration.sh BIN_DIR                          the whole suite
#   tests/run-integration.sh BIN_DIR tests/integration/F.py   one file (or F.py::test_name)
#   tests/run-integration.sh BIN_DIR -k expr                  the tests matching expr
# The whole suite runs on BLOBREF_TEST_JOBS pytest-xdist workers (2; 1 = serially), whole files per
# worker (--dist loadfile: a module's fixtures start once). Named files run serially unless -n is
# given: tests/run-integration.sh BIN_DIR tests/integration/F.py -n 2 --dist load
set -eu
bin=${1:?usage: run-integration.sh BIN_DIR [FILE[::TEST]...] [pytest args]}; shift
export BLOBREF_BIN_DIR=$(cd "$bin" && pwd)
if [ ! -d tests/js/node_modules/@duckdb/node-api ] || [ ! -d tests/js/node_modules/avsc ] ||
  [ ! -d tests/js/node_modules/@seriousme/openapi-schema-validator ]; then
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
# The whole suite unless a test file or node id is named.
target=tests/integration
parallel=1
for a in "$@"; do
  case "$a" in
    tests/integration/*) target= ;;
    -n|-n*|--numprocesses*|no:xdist) parallel=0 ;;
  esac
done
jobs=${BLOBREF_TEST_JOBS:-2}
xdist=()
if [ -n "$target" ] && [ "$parallel" = 1 ] && [ "$jobs" -gt 1 ]; then
  xdist=(-n "$jobs" --dist loadfile)
fi
# Debian's python3 with Debian's python3-requests / python3-pytest (not a pyenv build on PATH).
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "${xdist[@]}" $target "$@"
