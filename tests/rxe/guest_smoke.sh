#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Quick look inside the guest: the rxe device, then one conformance run over verbs (for debugging the runner).
ibv_devices
ibv_devinfo -d rxe0 | head -20
for i in 0 1; do echo "gid $i: $(cat /sys/class/infiniband/rxe0/ports/1/gids/$i) $(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i 2>/dev/null)"; done
ulimit -l
timeout 300 "$RXE_BIN" conformance --plugin "$RXE_SO" --quick --timeout 60 --env WEFT_BACKEND=verbs ${RXE_ARGS:-}
