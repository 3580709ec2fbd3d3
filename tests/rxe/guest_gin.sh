#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs inside the soft-RoCE guest (tests/rxe/run_guest.sh): the device API's harness (weft conformance --rma)
# against NCCL's own GIN IB proxy (the ncclGinIbProxy table inside the CUDA toolkit's libnccl.so.2, built as a
# plugin file on the host by tests/conformance/nccl_builtin_build.sh), two ranks on the one rxe device. It must pass
# every check that is not weft.*: that is what validates the harness against NCCL. Exit status: failed steps.
. "$(dirname "$0")/guest_lib.sh"
ibv_devices | sed 's/^/  /'
export NCCL_IB_HCA=rxe0 NCCL_IB_GID_INDEX=1
if [ -n "${RXE_NCCL_GIN:-}" ] && [ -f "$RXE_NCCL_GIN" ]; then
  step nccl_gin_ib.v11 600 "$RXE_BIN" conformance --rma --plugin "$RXE_NCCL_GIN" --symbol ncclNetPlugin_v11 \
    --rma-table 11 --ranks 2 --skip weft. --soak 20000 --timeout 500 --dead-bound 60
else
  echo "STEP nccl_gin_ib.v11: skipped (no NCCL GIN IB shim: no unstripped libnccl.so.2 (the CUDA toolkit's) on the host)"
fi
# weft's own, over its TCP sockets on the guest's interface, for comparison in the same guest.
step weft_rma.tcp 300 env WEFT_BACKEND=tcp WEFT_RMA=on "$RXE_BIN" conformance --rma --plugin "$RXE_SO" --ranks 2 \
  --soak 20000 --timeout 240
# weft's own over native verbs on rxe0 (issue 45), both ways of signalling: RDMA fetch-and-add after the write on the
# same QP, and a send the target applies; 3 ranks; GPU windows under the mock driver (rxe pins them through the
# registration window, as nvidia-peermem would; WEFT_GDR=1: no peer-memory module to detect).
V="env WEFT_BACKEND=verbs WEFT_RMA=on WEFT_IB_HCA=rxe0"
for sig in atomic message; do
  step "weft_rma.verbs.$sig" 400 $V WEFT_RMA_SIGNAL=$sig "$RXE_BIN" conformance --rma --plugin "$RXE_SO" --ranks 3 \
    --soak 20000 --timeout 360 --dead-bound 60
done
if [ -n "${RXE_MOCK_CUDA:-}" ]; then
  for sig in atomic message; do
    step "weft_rma.verbs.gpu_mock.$sig" 400 $V WEFT_RMA_SIGNAL=$sig WEFT_GDR=1 LD_LIBRARY_PATH="$RXE_MOCK_CUDA" \
      "$RXE_BIN" conformance --rma --plugin "$RXE_SO" --ranks 2 --mem cuda --soak 20000 --timeout 360 --dead-bound 60
  done
fi
# When a job hangs (docs/hangs.md), over weft's verbs RMA: a rank killed, named by weft report --hangs from the two
# survivors' stall dumps by its rank (verbs' ledger names no addresses). (A rank behind stalls nothing here: the NIC
# completes our puts without the target's process; the link case is the link-down step below, with the report.)
step weft_rma.verbs.hang_dead 300 sh -c "rm -rf $PWD/rma-hangs-dead* && \
  $V WEFT_TELEMETRY_DIR=$PWD/rma-hangs-dead $RXE_BIN conformance --rma --plugin $RXE_SO --ranks 3 --only setup \
  --only faults.dead_rank --only teardown --timeout 240 --dead-bound 60 && \
  { $RXE_BIN report --hangs $PWD/rma-hangs-dead > $PWD/rma-hangs-dead.txt; cat $PWD/rma-hangs-dead.txt; \
  grep -q '^weft report --hangs: a rank died or was lost: rank 2 of 3 (device API), no dump from it' \
  $PWD/rma-hangs-dead.txt; }"
# The bench side by side, alternating (weft bench --rma: put+signal round trip, put bandwidth, signal rate): only when
# asked (bench/rma_guest.sh sets RXE_BENCH to the number of rounds); about 2 minutes a round in emulation.
for round in $(seq 1 "${RXE_BENCH:-0}"); do
  if [ -n "${RXE_NCCL_GIN:-}" ] && [ -f "$RXE_NCCL_GIN" ]; then
    step "bench.nccl_gin_ib.$round" 300 "$RXE_BIN" bench --rma --plugin "$RXE_NCCL_GIN" --symbol ncclNetPlugin_v11 \
      --rma-table 11
  fi
  for sig in atomic message; do
    step "bench.verbs.$sig.$round" 300 $V WEFT_RMA_SIGNAL=$sig "$RXE_BIN" bench --rma --plugin "$RXE_SO"
  done
done
# Faults: the guest's link (rxe0's netdev) goes down under 2 ranks and comes back (faults.link_down): NCCL's IB proxy
# and weft's verbs RMA; requests must fail within the bound. Last: the port comes back, but nothing after relies on it.
LD="--ranks 2 --only setup --only put.sizes --only faults.link_down --only teardown --timeout 300 --dead-bound 120"
if [ -n "${RXE_NCCL_GIN:-}" ] && [ -f "$RXE_NCCL_GIN" ]; then
  # shellcheck disable=SC2086
  step nccl_gin_ib.link_down 400 env CONFORMANCE_LINK_DOWN_OK=1 "$RXE_BIN" conformance --rma --plugin "$RXE_NCCL_GIN" \
    --symbol ncclNetPlugin_v11 --rma-table 11 $LD
fi
# With the dumps: weft report --hangs names the link between the two ranks' processes (each lost the other).
step weft_rma.verbs.link_down 400 sh -c "rm -rf $PWD/rma-hangs-link* && \
  $V CONFORMANCE_LINK_DOWN_OK=1 WEFT_PEER_TIMEOUT=5 WEFT_TELEMETRY_DIR=$PWD/rma-hangs-link \
  $RXE_BIN conformance --rma --plugin $RXE_SO $LD && \
  { $RXE_BIN report --hangs $PWD/rma-hangs-link > $PWD/rma-hangs-link.txt; cat $PWD/rma-hangs-link.txt; \
  grep -q '^weft report --hangs: bytes stopped on the way (the link, or a host on it): rank 0 of 2 (device API)' \
  $PWD/rma-hangs-link.txt; }"
echo "FAILED_STEPS=$fails"
exit $fails
