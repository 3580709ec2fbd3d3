#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One bounded pass of the GPU checks on a lent machine that has PyTorch and CUDA but cannot build weft (no
# package registry): weft's stripped libraries, the weft command and the shared libraries they need come
# prepared in a folder (default .e2e/: lib/ and bin/, made by `scripts/e2e/gpu-lease.sh --pack` here).
#   scripts/e2e/gpu-lease.sh --pack [DIR]        here: fill DIR from build/ (strip, copy dependencies)
#   scripts/e2e/gpu-lease.sh [DIR] [OUTDIR]      there: environment, the all_reduce sweep (weft over
#                                                libfabric, weft's TCP backend, NCCL Socket), the DDP job
#                                                with timing on both weft backends, weft report; logs in
#                                                OUTDIR/gpu-lease.tar.gz
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ "${1:-}" = "--pack" ]; then
  dir=${2:-$repo/.e2e}
  rm -rf "$dir" && mkdir -p "$dir/lib" "$dir/bin" || exit 1
  for f in "$repo"/build/lib/*.so; do strip -o "$dir/lib/$(basename "$f")" "$f" || exit 1; done
  strip -o "$dir/bin/weft" "$repo/build/bin/weft" || exit 1
  for l in $(ldd "$repo/build/bin/weft" "$repo/build/lib/libnccl-net-weft.so" | awk '/=>/{print $3}' | sort -u); do
    case $(basename "$l") in libc.so*|libm.so*|libstdc++*|libgcc_s*) ;; *) cp -L "$l" "$dir/lib/" ;; esac
  done
  du -sh "$dir"
  exit 0
fi
# DIR/lib/libnccl-profiler-example.so, where present (NCCL's ext-profiler/example built by hand), serves the
# sweep's socket-example0 run. WEFT_LEASE_RUNS: the sweep's --runs. WEFT_LEASE_MPS=1: run the ranks under NVIDIA MPS (without it two processes on one GPU are time-sliced, and
# every collective waits milliseconds for the other rank's kernel to get the GPU); WEFT_LEASE_DDP=0 skips DDP.
dir=$(cd "${1:-$repo/.e2e}" && pwd) || exit 1
out=${2:-${OUT:-$repo/build/e2e}}
work=/tmp/weft-gpu-lease
rm -rf "$work" && mkdir -p "$work" "$out" "$repo/build/lib" "$repo/build/bin"
# a checkout with its own build keeps it; a bare copy of the tree gets the prepared files
[ -e "$repo/build/lib/libnccl-net-weft.so" ] || cp "$dir"/lib/libnccl-*-weft.so "$repo/build/lib/" || exit 1
[ -e "$repo/build/bin/weft" ] || cp "$dir/bin/weft" "$repo/build/bin/" || exit 1
export LD_LIBRARY_PATH="$dir/lib:$repo/build/lib:${LD_LIBRARY_PATH:-}"
rc=0
step() { echo "=== $* ($(date +%T))"; }
{
  step environment
  nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  ldd "$repo/build/lib/libnccl-net-weft.so" | grep "not found" && rc=1
  uname -r; nproc
  step weft info
  timeout 30 "$repo/build/bin/weft" info | grep -v "^ \{4\}" | head -30
  if [ "${WEFT_LEASE_MPS:-0}" = 1 ]; then
    step "MPS"
    export CUDA_MPS_PIPE_DIRECTORY=$work/mps-pipe CUDA_MPS_LOG_DIRECTORY=$work/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && echo "MPS daemon started" || echo "MPS could not start"
  fi
  echo "mpirun: $(command -v mpirun || echo none)"
  [ -e "$dir/lib/libnccl-profiler-example.so" ] && export WEFT_E2E_EXAMPLE_PROFILER="$dir/lib/libnccl-profiler-example.so"
  step all_reduce sweep
  timeout 280 python3 "$here/torch-allreduce-sweep.py" --out "$work/sweep" --max-mb 128 --timeout 90 --runs "${WEFT_LEASE_RUNS:-weft,tcp,socket}" || rc=1
  [ "${WEFT_LEASE_DDP:-1}" = 1 ] && backends="fabric tcp" || backends=""
  for backend in $backends; do
    step "DDP job, timing, WEFT_BACKEND=$backend"
    WEFT_BACKEND=$backend timeout 100 python3 "$here/pytorch-ddp.py" --procs 2 --steps 20 --timing \
      --out "$work/ddp-$backend" || rc=1
    step "weft report ($backend)"
    timeout 60 "$repo/build/bin/weft" report "$work/ddp-$backend/telemetry" 2>&1 | head -60
  done
  [ "${WEFT_LEASE_MPS:-0}" = 1 ] && { echo quit | nvidia-cuda-mps-control; cat "$work"/mps-log/control.log 2>/dev/null | tail -5; }
  step "done rc=$rc"
  echo $rc > "$work/rc"
} 2>&1 | tee "$work/gpu-lease.log"
rc=$(cat "$work/rc" 2>/dev/null || echo 1)
tar -C "$work" -czf "$out/gpu-lease.tar.gz" . 2>/dev/null
exit $rc
