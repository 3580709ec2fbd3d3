#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# WEFT_TELEMETRY_DIR is created with its parents (a job's output tree rarely exists before the first rank writes): a
# transfer through the plugin with the directory three levels below a fresh one must pass and leave connection
# records there.
# usage: tests/profiler/telemetry_dir_nested.sh WEFT_BIN PLUGIN_SO
set -u
weft=$1 plugin=$2
top=$(mktemp -d /tmp/weft-telemetry-XXXXXX)
trap 'rm -rf "$top"' EXIT
d=$top/job/run/weft
"$weft" conformance --plugin "$plugin" --only data.sizes --env WEFT_BACKEND=tcp --env WEFT_IFACE=lo \
  --env "WEFT_TELEMETRY_DIR=$d" || { echo "FAIL: the transfer failed (above)"; exit 1; }
n=$(cat "$d"/*.jsonl 2>/dev/null | grep -c '"type":"conn"')
echo "$n connection records in $d"
[ "$n" -ge 2 ] || { echo "FAIL: fewer than 2 connection records (one a side)"; exit 1; }
