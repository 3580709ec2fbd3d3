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
. bench/lib.sh
rounds=5 threads=0,2,4,8 flows=16 out=""
bench_options tcp_threads.sh "rounds threads flows out" "$@"
bench_paths tcp_threads.sh
configs=("socket-aws|$socket|NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=8 NCCL_SOCKET_IFNAME=lo")
IFS=, read -r -a ts <<<"$threads"
for t in "${ts[@]}"; do
  configs+=("weft-t$t|$so|WEFT_BACKEND=tcp WEFT_IFACE=lo WEFT_TCP_FLOWS=$flows WEFT_TCP_THREADS=$t")
done
# One run: label plugin round raw --env K=V ...
run() {
  local label=$1 plugin=$2 r=$3 raw=$4
  shift 4
  timeout 600 "$weft" bench --plugin "$plugin" --no-raw --rounds 1 --json --patterns bw,conns,steps \
    --conns-list 1,8 "$@" >"$raw/$label.$r" 2>/dev/null </dev/null
}
raw=$(mktemp -d /tmp/weft-threads-XXXXXX)
trap 'rm -rf "$raw"' EXIT
bench_rounds tcp_threads.sh "$rounds" "$raw" run
python3 bench/medians.py "$raw" socket-aws "loopback, Gb/s" | tee ${out:+"$out"}
