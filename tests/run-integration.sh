#!/usr/bin/env bash
# Runs the Python integration and cross-check tests (pytest) against the binaries in BIN_DIR:
#   tests/run-integration.sh BIN_DIR                          the whole suite
#   tests/run-integration.sh BIN_DIR tests/integration/F.py   one file (or F.py::test_name)
#   tests/run-integration.sh BIN_DIR -k expr                  the tests matching expr
set -eu
bin=${1:?usage: run-integration.sh BIN_DIR [FILE[::TEST]...] [pytest args]}; shift
export BLOBREF_BIN_DIR=$(cd "$bin" && pwd)
if [ ! -d tests/js/node_modules/@duckdb/node-api ] || [ ! -d tests/js/node_modules/avsc ] ||
  [ ! -d tests/js/node_modules/@seriousme/openapi-schema-validator ]; then
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
# The whole suite unless a test file or node id is named.
target=tests/integration
for a in "$@"; do
  case "$a" in tests/integration/*) target= ;; esac
done
# Debian's python3 with Debian's python3-requests / python3-pytest (not a pyenv build on PATH).
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider $target "$@"
