#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# weft's TCP helper threads (WEFT_TCP_THREADS, docs/tcp.md) on loopback, beside NCCL's Socket transport with AWS's
# defaults (2 threads x 8 sockets): weft at 16 flows with 0, 2, 4 and 8 helpers, each configuration once per round,
# rounds alternating, medians over rounds, ratios to NCCL Socket. For a host with cores to spare (a lent 16-core
# machine): on 2 cores the helpers only compete with the two workers for them.
#
#   bench/tcp_threads.sh [--rounds 5] [--threads 0,2,4,8] [--flows 16] [--out FILE]
#
# Needs the NCCL Socket shim (tests/conformance/nccl_builtin_build.sh ncclNetSocket) for the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5 threads=0,2,4,8 flows=16 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    --flows) flows=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    *) echo "tcp_threads.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
weft=build/bin/weft so=build/lib/libnccl-net-weft.so socket=build/nccl-builtin/libnccl-net-ncclNetSocket.so
[ -x "$weft" ] && [ -f "$so" ] || { echo "tcp_threads.sh: build weft first (scripts/build.sh)" >&2; exit 3; }
[ -f "$socket" ] || { echo "tcp_threads.sh: no NCCL Socket shim at $socket (tests/conformance/nccl_builtin_build.sh)" >&2; exit 3; }
configs=("socket-aws|$socket|NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=8 NCCL_SOCKET_IFNAME=lo")
IFS=, read -r -a ts <<<"$threads"
for t in "${ts[@]}"; do
  configs+=("weft-t$t|$so|WEFT_BACKEND=tcp WEFT_IFACE=lo WEFT_TCP_FLOWS=$flows WEFT_TCP_THREADS=$t")
done
raw=$(mktemp -d /tmp/weft-threads-XXXXXX)
trap 'rm -rf "$raw"' EXIT
for r in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r label plugin envs <<<"$c"
    args=()
    for e in $envs; do args+=(--env "$e"); done
    timeout 600 "$weft" bench --plugin "$plugin" --no-raw --rounds 1 --json --patterns bw,conns,steps \
      --conns-list 1,8 "${args[@]}" >"$raw/$label.$r" 2>/dev/null </dev/null ||
      echo "tcp_threads.sh: $label round $r failed" >&2
  done
  echo "round $r of $rounds done" >&2
done
python3 bench/medians.py "$raw" socket-aws "loopback, Gb/s" | tee ${out:+"$out"}
