#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Configures and builds weft into build/ (libnccl-net-weft.so in build/lib, the weft tool in build/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default
