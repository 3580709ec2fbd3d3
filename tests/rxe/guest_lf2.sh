#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs inside the soft-RoCE guest (tests/rxe/run_guest.sh): libfabric 2.x's verbs;ofi_rxm over rxe0 (RXE_FABRIC_LIB: the
# lib folder of scripts/libfabric2.sh's build, seen through the guest's view of the host), weft as built against
# 1.17 loading it. The same quick set as guest_tests.sh's 1.17 step, in both protocols. Exit: failed steps.
. "$(dirname "$0")/guest_lib.sh"
ibv_devices | sed 's/^/  /'
if [ ! -e "$RXE_FABRIC_LIB/libfabric.so.1" ]; then
  echo "STEP lf2: FAILED: no libfabric at RXE_FABRIC_LIB='$RXE_FABRIC_LIB' inside the guest"
  exit 1
fi
export LD_LIBRARY_PATH="$RXE_FABRIC_LIB"
"$RXE_BIN" info 2>/dev/null | grep -m1 "at run time" | sed 's/^/  /'
# --call-limit: the backstop for a connect/accept that blocks; the guest's CPU is emulated and shares the host's
# two cores with whatever else runs there (a first verbs;ofi_rxm connect took 6.2 s beside a build).
C="$RXE_BIN conformance --plugin $RXE_SO --timeout 60 --conns 64 --table 11 --quick --call-limit 15000 --dump-dir $PWD/dumps"
F="--env WEFT_BACKEND=fabric --env WEFT_PROVIDER=verbs;ofi_rxm --env FI_UNIVERSE_SIZE=16"
# devices.properties: rxe's largest message is below NCCL's 1 GiB chunks (as on 1.17). The oversized-send checks run:
# libfabric 1.17's rxm over verbs crashed the receiver there (guest_tests.sh); whether 2.x does is what this shows.
step lf2.verbs_rxm.v11 600 $C $F --skip devices.properties
step lf2.verbs_rxm.rdma.v11 600 $C $F --env WEFT_PROTOCOL=rdma --skip devices.properties
echo "FAILED_STEPS=$fails"
exit $fails
