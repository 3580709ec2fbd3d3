#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The device API over soft-RoCE in the QEMU guest, side by side and alternating: NCCL 2.28.9's own GIN IB proxy
# (ncclGinIbProxy, from the CUDA toolkit's libnccl.so.2) and weft's verbs transport with both ways of signalling
# (RDMA fetch-and-add, a send the target applies); ROUNDS rounds (default 3) of weft bench --rma each, then medians
# and ratios to NCCL's. Emulation runs about 100x below hardware: the ratios are what to read.
#   bench/rma_guest.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
[[ -x build/bin/weft ]] || { echo "bench/rma_guest.sh: build first (scripts/build.sh)" >&2; exit 3; }
tests/conformance/nccl_builtin_build.sh ncclGinIbProxy build/nccl-builtin >/dev/null
out=build/rxe-gin-bench
RXE_BIN=$PWD/build/bin/weft RXE_SO=$PWD/build/lib/libnccl-net-weft.so RXE_BENCH=$rounds \
  RXE_NCCL_GIN=$PWD/build/nccl-builtin/libnccl-net-ncclGinIbProxy.so \
  timeout $((600 + rounds * 300)) tests/rxe/run_guest.sh tests/rxe/guest_gin.sh "$out" $((500 + rounds * 300)) >/dev/null || true
python3 - "$out" <<'PY'
import glob, os, re, statistics, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(out, 'step-bench.*.log'))):
    who = os.path.basename(f)[len('step-bench.'):].rsplit('.', 2)[0]
    for line in open(f):
        if line.startswith('rma '):
            runs.setdefault(who, []).append(dict(kv.split('=') for kv in line.split()[4:]))
if 'nccl_gin_ib' not in runs:
    sys.exit("no NCCL GIN IB figures (see " + out + "/guest-output.txt)")
keys = [('put_signal_halfrtt_us', 'put+signal 8 B half round trip, us'), ('put_bw_gbps', 'put bandwidth 1 MiB, Gb/s'),
        ('signal_rate_Mps_per_rank', 'signals a second a rank, M/s')]
ref = {k: statistics.median(float(r[k]) for r in runs['nccl_gin_ib']) for k, _ in keys}
for who, rs in runs.items():
    cells = []
    for k, name in keys:
        v = statistics.median(float(r[k]) for r in rs)
        cells.append(f"{name}: {v:.3g} (x{v / ref[k]:.2f})")
    print(f"{who:14s} {len(rs)} rounds  " + "  ".join(cells))
PY
