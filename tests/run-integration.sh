#!/usr/bin/env bash
# Runs the Python integration and cross-check tests (pytest) against the binaries in BIN_DIR.
set -eu
bin=${1:?usage: run-integration.sh BIN_DIR [pytest args]}; shift
export BLOBREF_BIN_DIR=$(cd "$bin" && pwd)
if [ ! -d tests/js/node_modules/@duckdb/node-api ] || [ ! -d tests/js/node_modules/avsc ]; then
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
# Debian's python3 with Debian's python3-requests / python3-pytest (not a pyenv build on PATH).
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration "$@"
