#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One bounded pass on a lent GPU machine that cannot build anything (no package registry): nccl-tests through
# weft beside NCCL's Socket transport, then a real tuner sweep with a held-out check. Everything it runs comes
# prepared in DIR (default .e2e/):
#   DIR/lib, DIR/bin           weft and its libraries (scripts/e2e/gpu-lease.sh --pack DIR)
#   DIR/nccl-tests/build/*_perf  nccl-tests built here with MPI=1 (Open MPI's libmpi.so.40), one sm_90 target,
#                              the CUDA runtime linked statically; NCCL (libnccl.so.2) is the machine's (the one
#                              PyTorch's wheel carries) and mpirun is the machine's.
#   scripts/e2e/gpu-lease-nccl-tests.sh --pack NCCL_TESTS_SRC [DIR]   here: weft (gpu-lease.sh --pack) and nccl-tests
#                              (needs libopenmpi-dev, the CUDA toolkit and NCCL's headers at /usr/local/cuda)
#   scripts/e2e/gpu-lease-nccl-tests.sh [DIR] [OUTDIR]    there: logs in OUTDIR/gpu-nccl.tar.gz, summary in OUTDIR/summary.txt
# Steps, each under its own time limit, the later ones skipped when the budget (LEASE_BUDGET_S, default 480)
# would be overrun:
#   1. nccl-tests, weft then Socket, all_reduce and sendrecv (per-collective timing on), 8 B - 128 MiB;
#      then both once more in the same order, timing off (two alternating pairs);
#   2. weft tune sweep: all_reduce at every other octave (64 KiB ... 256 MiB), six algorithm/protocol candidates
#      forced through weft's tuner, each run three times;
#   3. held out: all_reduce at the octaves the sweep skipped (128 KiB ... 128 MiB), with NCCL's own pick and with
#      the sweep's profile, alternating three times; the medians side by side.
# NVIDIA MPS runs the two ranks' kernels at once (without it they take turns on the one GPU).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ "${1:-}" = "--pack" ]; then
  src=${2:?usage: gpu-lease-nccl-tests.sh --pack NCCL_TESTS_SRC [DIR]}; dir=${3:-$repo/.e2e}
  "$here/gpu-lease.sh" --pack "$dir" || exit 1
  mpi_home=$(dirname "$(dirname "$(readlink -f "$(command -v mpicc)")")")/lib/x86_64-linux-gnu/openmpi
  [ -f "$mpi_home/include/mpi.h" ] || mpi_home=$(dirname "$(dirname "$(readlink -f "$(command -v mpicc)")")")
  make -C "$src" -j"$(nproc)" src.build MPI=1 MPI_HOME="$mpi_home" CUDA_HOME=/usr/local/cuda NCCL_HOME=/usr/local/cuda \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" CUDARTLIB=cudart_static >"$dir/nccl-tests-build.log" 2>&1 \
    || { tail -20 "$dir/nccl-tests-build.log"; exit 1; }
  mkdir -p "$dir/nccl-tests/build" "$dir/nccl-tests/src" && touch "$dir/nccl-tests/Makefile"
  for t in all_reduce sendrecv all_gather reduce_scatter alltoall; do
    strip -o "$dir/nccl-tests/build/${t}_perf" "$src/build/${t}_perf" || exit 1
  done
  du -sh "$dir"
  exit 0
fi
dir=$(cd "${1:-$repo/.e2e}" && pwd) || exit 1
out=${2:-${OUT:-$repo/build/e2e}}
budget=${LEASE_BUDGET_S:-480}
work=/tmp/weft-gpu-nccl
rm -rf "$work" && mkdir -p "$work" "$out" "$repo/build/lib" "$repo/build/bin"
[ -e "$repo/build/lib/libnccl-net-weft.so" ] || cp "$dir"/lib/libnccl-*-weft.so "$repo/build/lib/" || exit 1
[ -e "$repo/build/bin/weft" ] || cp "$dir/bin/weft" "$repo/build/bin/" || exit 1
export LD_LIBRARY_PATH="$dir/lib:$repo/build/lib:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
nt="$dir/nccl-tests"
weft="$repo/build/bin/weft"
plugin="$repo/build/lib/libnccl-net-weft.so"
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
step() { echo "=== $* ($(date +%T), $(( $(date +%s) - start )) s in)"; }
fits() {  # fits SECONDS NAME: enough budget left for a step that may take SECONDS
  if [ "$(left)" -lt "$1" ]; then echo "SKIPPED $2: $(left) s of the budget left, it may take $1"; return 1; fi
}
rc=0
{
  step environment
  nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader
  uname -r; nproc
  mpirun --version 2>&1 | head -1
  nccl_lib=$(python3 - <<'EOF'
import glob, os, site
for d in site.getsitepackages():
    for f in glob.glob(os.path.join(d, "nvidia", "**", "libnccl.so.2"), recursive=True):
        print(os.path.dirname(f)); raise SystemExit
EOF
)
  echo "libnccl.so.2 from: ${nccl_lib:-none found}"
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
  missing=$(LD_LIBRARY_PATH="$nccl_lib:$LD_LIBRARY_PATH" ldd "$nt/build/all_reduce_perf" "$plugin" | grep "not found")
  if [ -n "$missing" ] || [ -z "$nccl_lib" ]; then
    echo "FAIL: cannot run nccl-tests here: ${missing:-no libnccl.so.2}"; rc=1
  else
    export CUDA_MPS_PIPE_DIRECTORY=$work/mps-pipe CUDA_MPS_LOG_DIRECTORY=$work/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && echo "MPS daemon started" || echo "MPS could not start"
    nt_args=(--nccl-tests "$nt" --nccl-lib "$nccl_lib" --ranks 2)
    if fits 60 "nccl-tests round 1"; then
      step "nccl-tests round 1: all_reduce, sendrecv; weft (timing on) then Socket"
      timeout 150 "$here/nccl-tests.sh" "${nt_args[@]}" --tests all_reduce,sendrecv --timing --out "$work/round1" || rc=1
    fi
    if fits 60 "nccl-tests round 2"; then
      step "nccl-tests round 2: all_reduce, sendrecv; weft then Socket"
      timeout 90 "$here/nccl-tests.sh" "${nt_args[@]}" --tests all_reduce,sendrecv --out "$work/round2" || rc=1
    fi
    # the sweep's and the held-out runs' command: weft's net, tuner and profiler (one library), weft's TCP backend
    export NCCL_NET_PLUGIN="$plugin" NCCL_NET=weft NCCL_SOCKET_IFNAME=lo WEFT_IFACE=lo NCCL_DEBUG=WARN
    export LD_LIBRARY_PATH="$repo/build/lib:$nccl_lib:$LD_LIBRARY_PATH"
    mpi="mpirun -np 2 --oversubscribe --bind-to none $here/rank_env.sh"
    if fits 150 "tuner sweep"; then
      step "weft tune sweep: all_reduce, 64K..256M every other octave, 6 candidates x 3 runs"
      timeout 200 "$weft" tune sweep --command "$mpi $nt/build/all_reduce_perf -b 64K -e 256M -f 4 -g 1 -c 0 -w 3 -n 10" \
        --out "$work/profile.json" --repeat 3 \
        --candidates TREE/LL,TREE/LL128,TREE/SIMPLE,RING/LL,RING/LL128,RING/SIMPLE || rc=1
      [ -f "$work/profile.json" ] && timeout 30 "$weft" tune show --profile "$work/profile.json" --ranks 2 --nodes 2 2>&1 | grep -E "^(collective|AllReduce)"
    fi
    if [ -f "$work/profile.json" ] && fits 60 "held-out check"; then
      step "held out: all_reduce 128K..128M (the octaves the sweep skipped), NCCL's pick against the profile, x3"
      for i in 1 2 3; do
        for arm in default profile; do
          [ "$(left)" -gt 15 ] || break 2
          p=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING WEFT_TUNER_LOG=1 NCCL_DEBUG_FILE="$work/heldout-$arm-$i.nccl.%h.%p")
          [ $arm = profile ] && p+=(WEFT_TUNER_PROFILE="$work/profile.json")
          env "${p[@]}" timeout 40 $mpi "$nt/build/all_reduce_perf" -b 128K -e 128M -f 4 -g 1 -c 1 -w 3 -n 10 \
            >"$work/heldout-$arm-$i.log" 2>&1 || { echo "held-out run $arm $i failed"; rc=1; }
        done
      done
      python3 - "$work" <<'EOF'
import glob, statistics, sys
w = sys.argv[1]
def rows(path):
    got, col = {}, None
    for line in open(path, errors="replace"):
        t = line.split()
        if t[:3] == ["#", "size", "count"]:
            col = t.index("time") - 1
        elif col is not None and t and t[0].isdigit() and len(t) > col + 2:
            try:
                got[int(t[0])] = (float(t[col]), t[col + 3] if len(t) > col + 3 else "?")  # time, #wrong
            except ValueError:
                pass  # not a table row
    return got
runs = {a: [rows(f) for f in sorted(glob.glob(f"{w}/heldout-{a}-*.log"))] for a in ("default", "profile")}
sizes = sorted(set().union(*[r.keys() for rs in runs.values() for r in rs])) if runs["default"] else []
print("held out: all_reduce out-of-place time (us), median of runs; ratio = NCCL's pick / the profile's (>1: tuned faster)")
print(f"{'bytes':>10} {'default':>10} {'profile':>10} {'ratio':>7}  runs")
for s in sizes:
    d = [r[s][0] for r in runs["default"] if s in r]; p = [r[s][0] for r in runs["profile"] if s in r]
    wrong = [r[s][1] for rs in runs.values() for r in rs if s in r and r[s][1] not in ("0", "N/A")]
    if d and p:
        print(f"{s:>10} {statistics.median(d):>10.1f} {statistics.median(p):>10.1f} "
              f"{statistics.median(d) / statistics.median(p):>7.3f}  {len(d)}/{len(p)}{'  WRONG RESULTS' if wrong else ''}")
EOF
      for arm in default profile; do echo "-- $arm:"; cat "$work"/heldout-$arm-1.nccl.* | grep "NET/weft : tuner" | head -16; done
    fi
    echo quit | nvidia-cuda-mps-control 2>/dev/null
  fi
  step "done rc=$rc"
  echo $rc > "$work/rc"
} 2>&1 | tee "$work/lease.log"
rc=$(cat "$work/rc" 2>/dev/null || echo 1)
grep -v "^ \{4\}" "$work/lease.log" > "$out/summary.txt" 2>/dev/null
tar -C "$work" -czf "$out/gpu-nccl.tar.gz" . 2>/dev/null
exit $rc
