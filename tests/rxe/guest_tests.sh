#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs inside the soft-RoCE guest (tests/rxe/run_guest.sh): weft's conformance harness over real ibverbs on rxe0,
# two processes on the one device. Exit status: the number of failed steps.
. "$(dirname "$0")/guest_lib.sh"
ibv_devices | sed 's/^/  /'
# comms.scale holds 64 connections here (default 256 with --quick, 1,024 without): native verbs keeps an RC QP per
# connection, as NCCL's IB transport does, and QP creation in emulation is slow.
# The workers run in a folder of the guest's writable output (the default, build/dumps, is the host's, read-only here).
C="$RXE_BIN conformance --plugin $RXE_SO --timeout 60 --conns 64 --dump-dir $PWD/dumps"
V="--env WEFT_BACKEND=verbs"
# Every table version NCCL may load, over native verbs (the newest and the oldest in every run, v9 with GPU buffers
# below; the table shims are the backends' common code, run on every version over loopback).
for t in 12 11 10 9 8 7; do
  lg=""
  case $t in 11|10|9|8) lg=--long ;; esac
  step $lg "verbs.v$t" 300 $C --table $t --quick $V
done
# The full suite (1 GiB message, full soak and cycles) on the newest table, and striping over 4 QPs.
# The 1 GiB message takes 20-30 s in emulation on a quiet host and went past 60 s with the host's two cores busy:
# its liveness bound is 240 s here (each stream must still finish, or the check fails).
step --long verbs.full.v12 900 $RXE_BIN conformance --plugin $RXE_SO --timeout 240 --conns 64 --table 12 --dump-dir $PWD/dumps $V
step verbs.qps4.v11 300 $C --table 11 --quick $V --env WEFT_IB_QPS_PER_CONN=4 --env WEFT_STRIPE_MIN=65536
# GPU memory without a GPU: the mock CUDA driver (tools/mock_cuda) hands out device buffers the CPU cannot touch
# (a CPU access faults and the harness names the code that made it); rxe pins them through the registration
# window, as nvidia-peermem would, and moves them in the kernel. The data, grouped-receive, soak and flush checks
# run over them (WEFT_GDR=1: no peer-memory module to detect), then a flush on a comm whose peer was killed.
if [ -n "${RXE_MOCK_CUDA:-}" ]; then
  G="--mem cuda $V --env WEFT_GDR=1"
  step verbs.gpu_mock.v12 300 env LD_LIBRARY_PATH="$RXE_MOCK_CUDA" $C --table 12 --quick $G
  step verbs.gpu_mock.v9 300 env LD_LIBRARY_PATH="$RXE_MOCK_CUDA" $C --table 9 --quick $G \
    --env WEFT_IB_QPS_PER_CONN=2 --env WEFT_STRIPE_MIN=65536
  step verbs.gpu_mock.flush_peer_killed 120 env LD_LIBRARY_PATH="$RXE_MOCK_CUDA" $C --only faults.flush_peer_killed $G
fi
# Dead peers and unreachable listeners over verbs.
step verbs.sender_killed 120 $C --only faults.sender_killed $V
step verbs.receiver_killed 120 $C --only faults.receiver_killed $V
step verbs.unreachable_peer 120 $C --only weft.unreachable_peer $V --env WEFT_CONNECT_TIMEOUT=3
# Stall lines (docs/hangs.md): a send and a receive posted late each warn once, naming the case.
step verbs.stall_lines 120 $C --only weft.stall_lines $V --env WEFT_STALL_S=1 --env WEFT_PROM_FILE=stall.prom \
  --env WEFT_PROM_INTERVAL=1
# When a job hangs (docs/hangs.md), over verbs: the rank behind (a receiver stuck, then SIGTERM), a cycle (each
# rank sends before it receives) and a dead rank (the receiver SIGKILLs itself), each named by weft report --hangs
# over the stall dumps (verbs ends name their out-of-band set-up sockets, so the two ends pair exactly).
step verbs.hang_behind 120 $C --only weft.hang_report $V --env WEFT_STALL_S=1 --env WEFT_TELEMETRY_DIR=$PWD/hangs-behind
step verbs.hang_cycle 120 $C --only weft.hang_cycle $V --env WEFT_STALL_S=1 --env WEFT_TELEMETRY_DIR=$PWD/hangs-cycle
step verbs.hang_dead 120 sh -c "$C --only faults.receiver_killed $V --timeout 40 --env WEFT_PEER_TIMEOUT=3 \
  --env WEFT_PROBE_INTERVAL=500 --env WEFT_TELEMETRY_DIR=$PWD/hangs-dead && $RXE_BIN report --hangs $PWD/hangs-dead \
  | tee /dev/stderr | grep -q '^weft report --hangs: a rank died or was lost: a process at '"
# QP errors mid-stream: the peer's QPs moved to the error state, then destroyed (weft_verbs_fault_tests).
[ -n "${RXE_FAULT_BIN:-}" ] && step verbs.qp_error 180 "$RXE_FAULT_BIN"
# The guest's kernel has what this project's CI kernel lacks: tc netem. libfabric tcp;ofi_rxm between two network
# namespaces over a veth pair with delay, loss, reordering and duplication on both ends: every byte must arrive.
NETNS=$(dirname "$0")/../conformance/netns_conformance.sh
step fabric.tcp.netem.v11 600 "$NETNS" --netem "delay 1ms loss 0.5% reorder 25% 50% duplicate 0.5%" \
  "$RXE_BIN" "$RXE_SO" --table 11 --quick --conns 64 --call-limit 15000 --env WEFT_BACKEND=fabric
# libfabric over the same device: verbs;ofi_rxm on shared endpoints (the default: one endpoint per context and
# device), every check but one. Its MSG CQ is sized by FI_UNIVERSE_SIZE (rxe allows 32767 entries). Emulated verbs
# make endpoint creation slow (up to ~0.6 s), hence the longer call limit; devices.properties is skipped because
# rxe's largest message is below NCCL's 1 GiB chunks. data.send_larger_than_recv (and its weft.* twin) is skipped: libfabric 1.17's rxm
# over verbs crashes the receiver (SIGSEGV inside fi_cq_read, 3 runs in 3) when a 64 KiB message, which rxm sends
# by rendezvous, meets a 1 KiB receive; NCCL never sends more than the receive holds, and the same check passes on
# tcp;ofi_rxm. (With an endpoint per connection, rxm over rxe also crashed in
# fi_close of endpoints, at a different check from run to run; shared endpoints close one per context.)
step fabric.verbs_rxm.v11 300 $C --table 11 --quick --call-limit 15000 --env WEFT_BACKEND=fabric \
  --env "WEFT_PROVIDER=verbs;ofi_rxm" --env FI_UNIVERSE_SIZE=16 --skip devices.properties \
  --skip data.send_larger_than_recv --skip weft.send_larger_than_recv
# NCCL's own IB transport (the ncclNetIb table inside the CUDA toolkit's libnccl.so.2, built as a plugin file on
# the host by tests/conformance/nccl_builtin_build.sh) on the same device, through the same harness: it must pass
# every check that is not weft.* (those skip themselves for another plugin).
if [ "${RXE_PART:-all}" = long ]; then
  :
elif [ -n "${RXE_NCCL_IB:-}" ] && [ -f "$RXE_NCCL_IB" ]; then
  export NCCL_IB_HCA=rxe0
  step nccl_ib.v11 300 "$RXE_BIN" conformance --plugin "$RXE_NCCL_IB" --timeout 60 --conns 64 --table 11 --quick \
    --call-limit 15000
else
  echo "STEP nccl_ib.v11: skipped (no NCCL IB shim: no unstripped libnccl.so.2 (the CUDA toolkit's) on the host)"
fi
# Last (the port comes back, but nothing after relies on it): the guest's link goes down mid-stream under native
# verbs (faults.link_down): the port's down event fails both comms within milliseconds, each marked as lost over the
# link, and weft report --hangs over both processes' dumps names the link between them (docs/hangs.md).
step verbs.hang_link 240 sh -c "rm -rf $PWD/hangs-link* && \
  CONFORMANCE_LINK_DOWN_OK=1 $C --only faults.link_down $V --timeout 60 --env WEFT_PEER_TIMEOUT=3 \
  --env WEFT_STALL_S=1 --env WEFT_TELEMETRY_DIR=$PWD/hangs-link && \
  { $RXE_BIN report --hangs $PWD/hangs-link > $PWD/hangs-link.txt; cat $PWD/hangs-link.txt; \
  grep -q '^weft report --hangs: bytes stopped on the way' $PWD/hangs-link.txt; }"
echo "FAILED_STEPS=$fails"
exit $fails
