#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The transports weft can take on a host without RDMA, on one bench: weft bench's ping-pong latency, one-connection
# streaming and NCCL's bidirectional step pattern (--quick sizes), over loopback, each configuration once per
# round, the rounds alternating, medians over rounds and ratios to NCCL's own Socket transport run the same way.
#
#   bench/transports.sh [--rounds 5] [--lf2 build/libfabric-2] [--out FILE] [--numa] [--busy N] [--tcp-only]
#                       [--base PLUGIN]
#
# --tcp-only: NCCL Socket and weft's TCP backend only. --base PLUGIN: another build's plugin file (an earlier commit)
# as "weft-tcp-base" beside this one's, for a before/after A/B in the same rounds.
#
# --busy N: every run beside N busy-loop processes (weft bench --busy): a host whose cores are all taken.
#
# --numa: the A/B of NUMA placement and thread binding instead (docs/topology.md): weft's TCP backend (with
# WEFT_TIMING=1, so the record writer thread runs, bound or not) and tcp;ofi_rxm, each with WEFT_NUMA=off and =on;
# the ratio of an "+numa" configuration is to the same configuration without it. Over the first interface with a
# PCI device and an IPv4 address (a NIC hwloc places on a NUMA node; the kernel still loops the traffic back):
# on lo, a virtual interface, nothing would be placed.
#
# Configurations: weft over libfabric 1.17 (tcp;ofi_rxm, shm), over libfabric 2.x (tcp;ofi_rxm, 2.x's own tcp
# endpoint, shm), weft's TCP backend, NCCL Socket (the shim under build/nccl-builtin). A configuration whose
# library is missing is left out and said so.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5 lf2=build/libfabric-2 out="" numa=0 busy=0 tcponly=0 base=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --lf2) lf2=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --numa) numa=1; shift ;;
    --busy) busy=${2:?}; shift 2 ;;
    --tcp-only) tcponly=1; shift ;;
    --base) base=${2:?}; shift 2 ;;
    *) echo "transports.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
weft=build/bin/weft so=build/lib/libnccl-net-weft.so socket=build/nccl-builtin/libnccl-net-ncclNetSocket.so
[ -x "$weft" ] && [ -f "$so" ] || { echo "transports.sh: build weft first (scripts/build.sh)" >&2; exit 3; }
lf2lib=""
[ -e "$lf2/lib/libfabric.so.1" ] && lf2lib=$(readlink -f "$lf2/lib")
# label | LD_LIBRARY_PATH | plugin | --env settings
configs=(
  "socket||$socket|NCCL_SOCKET_IFNAME=lo"
  "weft-tcp||$so|WEFT_BACKEND=tcp WEFT_IFACE=lo"
  "rxm-1.17||$so|WEFT_PROVIDER=tcp;ofi_rxm WEFT_IFACE=lo"
  "shm-1.17||$so|WEFT_PROVIDER=shm"
)
if [ $numa = 1 ]; then
  nic=""
  for d in /sys/class/net/*; do
    if [ -e "$d/device" ] && ip -4 -o addr show "${d##*/}" 2>/dev/null | grep -q inet; then nic=${d##*/}; break; fi
  done
  [ -n "$nic" ] || { echo "transports.sh --numa: no interface with a PCI device and an IPv4 address" >&2; exit 3; }
  echo "transports.sh --numa: over $nic" >&2
  configs=(
    "weft-tcp||$so|WEFT_BACKEND=tcp WEFT_IFACE=$nic WEFT_TIMING=1 WEFT_NUMA=off"
    "weft-tcp+numa||$so|WEFT_BACKEND=tcp WEFT_IFACE=$nic WEFT_TIMING=1 WEFT_NUMA=on"
    "rxm-1.17||$so|WEFT_PROVIDER=tcp;ofi_rxm WEFT_IFACE=$nic WEFT_NUMA=off"
    "rxm-1.17+numa||$so|WEFT_PROVIDER=tcp;ofi_rxm WEFT_IFACE=$nic WEFT_NUMA=on"
  )
elif [ -n "$lf2lib" ]; then
  configs+=("rxm-2.x|$lf2lib|$so|WEFT_PROVIDER=tcp;ofi_rxm WEFT_IFACE=lo"
            "tcp-2.x|$lf2lib|$so|WEFT_PROVIDER=tcp WEFT_IFACE=lo"
            "shm-2.x|$lf2lib|$so|WEFT_PROVIDER=shm")
else
  echo "transports.sh: no libfabric 2.x at $lf2 (scripts/libfabric2.sh): its configurations are left out" >&2
fi
if [ $tcponly = 1 ]; then
  configs=("${configs[0]}" "${configs[1]}")
fi
[ -n "$base" ] && configs+=("weft-tcp-base||$base|WEFT_BACKEND=tcp WEFT_IFACE=lo")
[ -f "$socket" ] || echo "transports.sh: no NCCL Socket shim at $socket: ratios are to the first configuration" >&2
raw=$(mktemp -d /tmp/weft-transports-XXXXXX)
trap 'rm -rf "$raw"' EXIT
for r in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r label lp plugin envs <<<"$c"
    [ -f "$plugin" ] || continue
    args=()
    for e in $envs; do args+=(--env "$e"); done
    LD_LIBRARY_PATH="$lp" timeout 300 "$weft" bench --plugin "$plugin" --quick --rounds 1 --patterns lat,bw,steps \
      --no-raw --json --busy "$busy" "${args[@]}" >"$raw/$label.$r" 2>&1 </dev/null || echo "transports.sh: $label round $r failed" >&2
  done
  echo "round $r of $rounds done" >&2
done
baselabel=socket
[ -f "$socket" ] && [ $numa = 0 ] || baselabel=$(IFS='|' read -r l _ <<<"${configs[0]}"; echo "$l")
pair=()
[ $numa = 1 ] && pair=(--pair +numa)
python3 bench/medians.py "$raw" "$baselabel" "weft bench --quick, loopback; latency in us, bandwidth in Gb/s" \
  "${pair[@]}" | tee ${out:+"$out"}
