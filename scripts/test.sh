#!/usr/bin/env bash
# Everything CI runs: install what is missing, build, and run every test (unit, ABI layout, conformance of the
# plugin over tcp;ofi_rxm, shm, sockets and between two network namespaces, for every table version).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --preset default "$@"
