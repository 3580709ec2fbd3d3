#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Proves the suite's pass rules: plants a failure under chosen ctest entries and checks that ctest reports each one
# red (failed), never passed. The plants (tests/support/plant/, preloaded into what the entries run):
#   crash     a conformance worker, or a forked RMA rank, dies of SIGSEGV a few seconds in;
#   corrupt   one byte of every 50th large read in the harness's processes is flipped (corrupted data or headers);
#   provider  libfabric offers no provider (FI_PROVIDER names none that exists): the backend cannot start (with
#             CI=true, as in CI, where a skip of what setup.sh installs fails).
# usage: scripts/plant_failures.sh [PLANT...] [-- ENTRY_REGEX]   (default: every plant over a set of entries that
#        covers each kind of pass rule: loopback and namespace conformance, libfabric 2.x, the device API, a
#        unit test of the libfabric backend)
# Run after scripts/build.sh. Exit 0 when every planted entry went red; 1 when one passed.
set -uo pipefail
cd "$(dirname "$0")/.."
plants=() regex=""
while [ $# -gt 0 ]; do
  case "$1" in
    --) regex=$2; shift 2 ;;
    crash|corrupt|provider) plants+=("$1"); shift ;;
    *) echo "plant_failures: unknown argument '$1'"; exit 2 ;;
  esac
done
[ ${#plants[@]} -gt 0 ] || plants=(crash corrupt provider)
# The harness's entries of each kind (crash, corrupt), and the libfabric ones (provider: weft's sockets need none).
harness='^(conformance\.fabric-tcp\.v9|conformance\.tcp\.v12|conformance\.netns\.fabric-tcp\.v7|conformance\.fabric-tcp\.v12\.lf2|rma\.conformance\.ncclRmaPlugin_v17|rma\.fabric\.tcp-rxm\.ncclGinPlugin_v11|faults\.tcp\.sender_killed|conformance\.fabric-tcp\.flush)$'
fabric='^(conformance\.fabric-tcp\.v9|conformance\.netns\.fabric-tcp\.v7|conformance\.fabric-tcp\.v12\.lf2|rma\.fabric\.tcp-rxm\.ncclGinPlugin_v11|conformance\.fabric-tcp\.flush|libfabric RMA: a stranger.*)$'
out=build/plant
mkdir -p "$out"
cc -shared -fPIC -O1 -o "$out/crash.so" tests/support/plant/crash.c -lpthread || exit 2
cc -shared -fPIC -O1 -o "$out/corrupt.so" tests/support/plant/corrupt.c -ldl || exit 2
caught=0 missed=0
for plant in "${plants[@]}"; do
  case $plant in
    crash) env=(LD_PRELOAD="$PWD/$out/crash.so" PLANT_RMA=1) sel=${regex:-$harness} ;;
    corrupt) env=(LD_PRELOAD="$PWD/$out/corrupt.so") sel=${regex:-$harness} ;;
    provider) env=(FI_PROVIDER=weft-planted-none CI=true) sel=${regex:-$fabric} ;;  # CI=true: a skip there fails
  esac
  echo "=== plant: $plant (${env[*]})"
  log=$out/$plant.log
  env "${env[@]}" timeout 1800 ctest --test-dir build -R "$sel" -j 2 --timeout 600 > "$log" 2>&1
  while read -r line; do
    name=$(sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //; s/ \.\.\..*$//; s/ +\*\*\*.*$//; s/ +Passed.*$//' <<< "$line")
    case "$line" in
      *Passed*) echo "  MISSED  $name: passed with the plant"; missed=$((missed + 1)) ;;
      *Skipped*|*"Not Run"*) echo "  MISSED  $name: skipped, not red"; missed=$((missed + 1)) ;;
      *) echo "  red     $name: $(sed -E 's/.*\*\*\*//' <<< "$line" | tr -s ' ')"; caught=$((caught + 1)) ;;
    esac
  done < <(grep -E "^ *[0-9]+/[0-9]+ Test +#" "$log")
done
echo "plant_failures: $caught red, $missed passed with a plant in them (logs in $out/)"
[ "$missed" -eq 0 ]
