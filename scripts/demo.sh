#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: build weft, then move data between two processes through libnccl-net-weft.so's C table, the
# way NCCL's proxy threads do, over libfabric and over weft's own TCP sockets on loopback, and say what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
weft=build/bin/weft
so=build/lib/libnccl-net-weft.so
provider=${WEFT_PROVIDER:-tcp;ofi_rxm}
iface=${WEFT_IFACE:-lo}

echo "== weft on this machine (WEFT_PROVIDER='$provider' WEFT_IFACE='$iface')"
WEFT_PROVIDER="$provider" WEFT_IFACE="$iface" "$weft" info | sed -n '/^providers/,/^variables/p' | sed '$d'

echo "== a two-process transfer through the plugin (NCCL_DEBUG=INFO shows the plugin's own log lines)"
NCCL_DEBUG=INFO "$weft" bench --plugin "$so" --quick --rounds 1 --patterns lat --no-raw \
  --env "WEFT_PROVIDER=$provider" --env "WEFT_IFACE=$iface" 2>&1 |
  grep -E "NET/weft : (NET/weft device|device 0|connected|accepted)" | sed 's/^\[plugin INFO\] [^ ]* /  /' | sort -u
echo "   (beside raw libfabric on the same provider; ratios are weft / raw)"
"$weft" bench --plugin "$so" --quick --rounds 3 --env "WEFT_PROVIDER=$provider" --env "WEFT_IFACE=$iface"

echo
echo "== the same through shared memory (shm provider)"
"$weft" bench --quick --rounds 1 --patterns lat,bw --no-raw --plugin "$so" --env WEFT_PROVIDER=shm | tail -n +2

echo
echo "== weft's own TCP sockets (WEFT_BACKEND=tcp; the default on a host without an RDMA NIC), beside NCCL's own"
echo "   Socket transport where it can be built from the CUDA toolkit's libnccl.so.2 (tests/conformance)"
echo "-- weft, WEFT_BACKEND=tcp"
"$weft" bench --quick --rounds 1 --patterns lat,bw --no-raw --plugin "$so" --env WEFT_BACKEND=tcp \
  --env "WEFT_IFACE=$iface" | tail -n +2
if tests/conformance/nccl_builtin_build.sh ncclNetSocket build/nccl-builtin >/dev/null 2>&1; then
  echo "-- NCCL's Socket transport (one round each: run weft bench --rounds N for medians; docs/tcp.md has them)"
  NCCL_SOCKET_IFNAME=$iface "$weft" bench --quick --rounds 1 --patterns lat,bw --no-raw --table 11 \
    --plugin build/nccl-builtin/libnccl-net-ncclNetSocket.so | tail -n +2
fi
"$weft" conformance --plugin "$so" --table 11 --quick --env WEFT_BACKEND=tcp --env "WEFT_IFACE=$iface" \
  2>/dev/null | grep -E '^\[FAIL\]|^conformance:'

echo
echo "== conformance of the plugin file, as NCCL would drive it (table v11, what NCCL 2.28 picks)"
"$weft" conformance --plugin "$so" --table 11 --quick --env "WEFT_PROVIDER=$provider" --env "WEFT_IFACE=$iface" \
  2>/dev/null | grep -E '^\[FAIL\]|^conformance:' 

echo
echo "== timing: weft's own connections (WEFT_TELEMETRY_DIR) during a two-process transfer"
tel=$(mktemp -d /tmp/weft-demo-XXXXXX)
trap 'rm -rf "$tel"' EXIT
"$weft" conformance --plugin "$so" --table 11 --only data.sizes --env "WEFT_PROVIDER=$provider" \
  --env "WEFT_IFACE=$iface" --env "WEFT_TELEMETRY_DIR=$tel/conn" >/dev/null 2>&1
cat "$tel"/conn/*.jsonl | sed 's/^/  /'

echo
echo "== timing: a 4-rank job replayed through weft's profiler tables as NCCL calls them (rank 3 made late),"
echo "   then weft report over the records of every rank"
"$weft" replay --out "$tel/job" --ranks 4 --steps 20 --straggler 3 --delay-us 2000
mkdir -p build/demo
rm -rf build/demo/job && cp -r "$tel/job" build/demo/job
"$weft" report build/demo/job --plot build/demo/plots | sed 's/^/  /'

echo
echo "== tuner: a sweep of a simulated NCCL (weft tune nccl-sim calls the real tuner file as NCCL would and prints"
echo "   nccl-tests output), the profile it makes, and what the tuner then decides beside NCCL's default"
tuner=build/lib/libnccl-tuner-weft.so
"$weft" tune sweep --coll AllReduce --command "$weft tune nccl-sim --tuner $tuner --coll AllReduce --seed 3" \
  --out build/demo/profile.json --repeat 7 2>/dev/null
"$weft" tune eval --profile build/demo/profile.json --seed 3
"$weft" tune show --profile build/demo/profile.json --ranks 16 --nodes 2 --plot build/demo/tuner.svg |
  grep -E "^(decisions|collective|AllReduce)" | sed 's/^/  /'
