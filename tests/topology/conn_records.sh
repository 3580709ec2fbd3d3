#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Connection records say where a connection ran, end to end through the plugin: two harness workers over weft's TCP
# backend on loopback, the machine's layout from the far-NIC fixture with its NIC renamed "lo" (so the loopback
# interface stands for it: NUMA node 1), and the mock CUDA driver's context current in the workers, its GPU that
# fixture's GPU0 (socket 0). Every connection record carries "numa":1, the GPU and "SYS", and weft report flags the
# process as crossing sockets.
# Usage: tests/topology/conn_records.sh WEFT_BIN PLUGIN_SO MOCK_CUDA_DIR FIXTURE_DIR
set -u
weft=$1 so=$2 mock=$3 fixtures=$4
dir=$(mktemp -d /tmp/weft-toporec-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
sed 's/name="ens2f0np0"/name="lo"/' "$fixtures/roce-far-nic.xml" >"$dir/far.xml"
grep -q 'name="lo"' "$dir/far.xml" || fail "fixture has no ens2f0np0 to rename"
LD_LIBRARY_PATH=$mock MOCK_CUDA_PCI_BUS_ID=0000:01:00.0 timeout 300 "$weft" conformance --plugin "$so" --quick \
  --only data.sizes --cuda-context --env WEFT_BACKEND=tcp --env WEFT_IFACE=lo --env "WEFT_TOPOLOGY_XML=$dir/far.xml" \
  --env WEFT_TIMING=1 --env "WEFT_TELEMETRY_DIR=$dir/records" >"$dir/run" 2>&1 || { cat "$dir/run"; fail "conformance"; }
conns=$(cat "$dir"/records/*.jsonl 2>/dev/null | grep -c '"type":"conn"')
[ "$conns" -ge 2 ] || { cat "$dir/run"; fail "want connection records, found $conns"; }
located=$(cat "$dir"/records/*.jsonl | grep '"type":"conn"' | grep -c '"numa":1,"gpu":"0000:01:00.0","gpu_path":"SYS"')
[ "$located" = "$conns" ] || { grep -h '"type":"conn"' "$dir"/records/*.jsonl | head -3; fail "$located of $conns located"; }
echo "ok: $conns connection records, each with its NIC's NUMA node 1, GPU 0000:01:00.0 and SYS"
"$weft" report "$dir/records" >"$dir/report" 2>&1 || { cat "$dir/report"; fail "weft report exited $?"; }
grep -Eq "CROSS-SOCKET [^ ]+: its NIC lo is on the other socket from its GPU 0000:01:00.0 \(SYS\)" "$dir/report" ||
  { cat "$dir/report"; fail "weft report does not flag the cross-socket NIC"; }
echo "ok: weft report flags it"
