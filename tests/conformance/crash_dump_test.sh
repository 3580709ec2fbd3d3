#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A worker that crashes says where (its stack, lines "crash\t...", naming the plugin file the crash is in), leaves its
# dump under the build tree, named in the report, and none where the run started.
# usage: crash_dump_test.sh WEFT_BINARY CRASH_PLUGIN_SO DUMP_DIR
set -u
weft=$1 plugin=$2 dumps=$3
start=$(mktemp -d /tmp/weft-crash-start-XXXXXX)
trap 'rm -rf "$start"' EXIT
rm -rf "$dumps"
ulimit -c unlimited 2>/dev/null || true
out=$(cd "$start" && "$weft" conformance --plugin "$plugin" --table 11 --only connect.self_one_thread --timeout 10 \
        --dump-dir "$dumps" 2>&1)
echo "$out" | tail -n 5
fail() { echo "FAIL: $*"; exit 1; }
echo "$out" | grep -q "killed by signal 11" || fail "the report does not say the worker died of SIGSEGV"
T=$'\t'  # the crash lines' separator
echo "$out" | grep -qE "^crash${T}(recv|send) worker \(pid [0-9]+\): SIGSEGV" || fail "no worker said it crashed (crash\t...)"
echo "$out" | grep -qF "crash${T}  $plugin(" || fail "the crashed worker's stack does not name $plugin"
echo "$out" | grep -E "^crash${T}" | head -n 4
[ -z "$(ls -A "$start")" ] || fail "the worker left files where the run started: $(ls -A "$start")"
[ -d "$dumps/recv" ] && [ -d "$dumps/send" ] || fail "no worker directories under $dumps"
pattern=$(cat /proc/sys/kernel/core_pattern)
if [ "$(ulimit -c)" != 0 ] && [ "${pattern#|}" = "$pattern" ] && [ "${pattern#*/}" = "$pattern" ]; then
  # The kernel writes dumps into the crashing process's directory: the report must name it and the dump be there.
  echo "$out" | grep -q "core dump, if written, in $dumps/" || fail "the report does not name the dump's directory"
  n=$(find "$dumps" -type f -name "${pattern%%%*}*" | wc -l)
  [ "$n" -ge 1 ] || fail "no core dump under $dumps (kernel.core_pattern $pattern)"
  echo "dumps under $dumps: $n"
else
  echo "kernel.core_pattern '$pattern', ulimit -c $(ulimit -c): dumps go elsewhere; checked the directories only"
fi
rm -rf "$dumps"  # a dump is tens of MiB
echo "PASS"
