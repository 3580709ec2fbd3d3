#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs inside the soft-RoCE guest booted with two NICs (RXE_NICS=2 tests/rxe/run_guest.sh): rxe0 on eth0 and rxe1 on
# eth1, fused into one two-rail device (WEFT_RAILS=rxe0+rxe1) of libfabric's verbs;ofi_rxm. Both processes run in
# the guest, each rail looping back through its own device. faults.rail_down takes eth1 down (the guest is a machine
# of its own): under WEFT_RAIL_FAILOVER=1 the pending messages move to rail 0 and the connection carries data on it
# alone (docs/failover.md). Re-admission is off (WEFT_RAIL_READMIT=0): over rxm on emulated verbs a rail that failed
# with operations in flight never carries a message again in the same process (the health check is refused,
# FI_EAGAIN, for WEFT_PEER_TIMEOUT after each reset), an open question there. Exit status: failed steps.
. "$(dirname "$0")/guest_lib.sh"
links_up() { ip link set eth0 up; ip link set eth1 up; }  # (a check that failed halfway may have left one down)
STEP_BEFORE=links_up
ibv_devices | sed 's/^/  /'
C="$RXE_BIN conformance --plugin $RXE_SO --timeout 120 --table 11 --only faults.rail_down --dump-dir $PWD/dumps"
E="--env WEFT_BACKEND=fabric --env WEFT_PROVIDER=verbs;ofi_rxm --env FI_UNIVERSE_SIZE=16 --env WEFT_RAILS=rxe0+rxe1
   --env CONFORMANCE_LINK_DOWN_OK=1 --env WEFT_PEER_TIMEOUT=6 --env WEFT_PROBE_INTERVAL=500
   --env WEFT_RAIL_FAILOVER=1 --env WEFT_RAIL_READMIT=0"
# Tagged messages on shared endpoints (rxe reports no RMA write length, so shared endpoints carry sendrecv).
step fabric.verbs_rxm.rail_failover.sendrecv 300 $C $E --env WEFT_PROTOCOL=sendrecv
# RMA writes (4-byte completion data carrying lengths, an endpoint per connection): the receiving end closes the
# failed rail's connection (WEFT_RAIL_FAILOVER_RMA=auto applies on verbs), offers its buffers again, the sender
# writes them again.
step fabric.verbs_rxm.rail_failover.rdma 300 $C $E --env WEFT_PROTOCOL=rdma --env WEFT_FABRIC_SHARED_EP=0
echo "FAILED_STEPS=$fails"
exit $fails
