#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Shared endpoints off and on, side by side: `weft bench` (conns pattern at 1, 16 and 64 connections, 1 MiB
# messages) with WEFT_FABRIC_SHARED_EP=0 and =1, alternating ROUNDS times, each run with its raw libfabric
# reference (raw links are whole endpoints each, so the reference stops at 16 connections). Then comms.scale at
# CONNS connections with the variable on (connect time, RSS, fds and endpoints open per worker).
# Usage: bench/shared_endpoints.sh [build dir (build)] ; env ROUNDS (2), CONNS (1024), PROTOCOL (sendrecv).
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${ROUNDS:-2}
CONNS=${CONNS:-1024}
PROTOCOL=${PROTOCOL:-sendrecv}
WEFT="$BUILD/bin/weft"
SO="$BUILD/lib/libnccl-net-weft.so"
ENV=(--env 'WEFT_PROVIDER=tcp;ofi_rxm' --env WEFT_IFACE=lo --env "WEFT_PROTOCOL=$PROTOCOL")
for round in $(seq 1 "$ROUNDS"); do
  for shared in 0 1; do
    echo "== round $round, WEFT_FABRIC_SHARED_EP=$shared"
    timeout 900 "$WEFT" bench --plugin "$SO" --patterns conns --conns-list 1,16,64 --rounds 3 \
      --raw 'tcp;ofi_rxm' --raw-iface lo --raw-modes raw-tagged "${ENV[@]}" --env "WEFT_FABRIC_SHARED_EP=$shared" |
      grep -E '^ +[0-9]+ '
  done
done
echo "== comms.scale, $CONNS connections, WEFT_FABRIC_SHARED_EP=1"
timeout 900 "$WEFT" conformance --plugin "$SO" --only comms.scale --conns "$CONNS" --max-endpoints 1 "${ENV[@]}" \
  --env WEFT_FABRIC_SHARED_EP=1 | grep -E 'connections|PASS|FAIL'
