#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# nccl-tests through weft on a GPU machine: several ranks on one GPU, each made to look like a node of its own
# (NCCL_HOSTID per rank), so that NCCL moves everything between them through the network plugin. Each test runs
# with NCCL_NET_PLUGIN=weft (NCCL_NET=weft: no silent fallback) and again on NCCL's internal Socket transport;
# the script checks that NCCL loaded weft, that nccl-tests verified the results, and prints busbw per size side
# by side. With --timing the weft runs also leave per-collective records and the tuner's decision log.
#
#   scripts/e2e/nccl-tests.sh --nccl-tests ~/src/nccl-tests [--ranks 2] [--out DIR] [--tests all_reduce,...]
#                             [--min 8] [--max 128M] [--timing] [--tuner-profile FILE] [--no-baseline]
#                             [--cuda /usr/local/cuda] [--nccl-home DIR] [--nccl-lib DIR] [--mpi-home DIR] [--dry-run]
#   With SRC/build/*_perf already built (elsewhere: scripts/e2e/gpu-lease-nccl-tests.sh), neither nvcc nor nccl.h
#   is needed, only libnccl.so.2 (--nccl-lib DIR, else NCCL_HOME/lib).
#   scripts/e2e/nccl-tests.sh --check-only DIR   re-check and compare the logs a run left in DIR
#
# Exit: 0 all good; 1 a check failed; 2 bad arguments; 3 this machine cannot run it (says what is missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
report="python3 $here/nccl_tests_report.py"

src="" ranks=2 out="" tests="all_reduce,all_gather,reduce_scatter,sendrecv,alltoall" min=8 max=128M
timing=0 profile="" baseline=1 cuda=${CUDA_HOME:-/usr/local/cuda} nccl_home=${NCCL_HOME:-} mpi_home=${MPI_HOME:-}
nccl_lib="" dry=0 check_only=""
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --nccl-tests) src=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --tests) tests=${2:?}; shift 2 ;;
    --min) min=${2:?}; shift 2 ;;
    --max) max=${2:?}; shift 2 ;;
    --timing) timing=1; shift ;;
    --tuner-profile) profile=${2:?}; timing=1; shift 2 ;;
    --no-baseline) baseline=0; shift ;;
    --cuda) cuda=${2:?}; shift 2 ;;
    --nccl-home) nccl_home=${2:?}; shift 2 ;;
    --nccl-lib) nccl_lib=${2:?}; shift 2 ;;
    --mpi-home) mpi_home=${2:?}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --check-only) check_only=${2:?}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "nccl-tests.sh: unknown option $1" >&2; usage ;;
  esac
done
case "$ranks" in ''|*[!0-9]*) echo "nccl-tests.sh: --ranks wants a number >= 2" >&2; exit 2 ;; esac
[ "$ranks" -ge 2 ] || { echo "nccl-tests.sh: --ranks wants a number >= 2 (one rank uses no network)" >&2; exit 2; }
for t in ${tests//,/ }; do
  case "$t" in all_reduce|all_gather|reduce_scatter|sendrecv|alltoall|broadcast|reduce) ;;
    *) echo "nccl-tests.sh: unknown test '$t' (all_reduce, all_gather, reduce_scatter, sendrecv, alltoall, broadcast, reduce)" >&2; exit 2 ;;
  esac
done

# Checks and the comparison, on the logs of a run (also usable on recorded logs: --check-only).
check_dir() {
  local dir=$1 failed=0
  for t in ${tests//,/ }; do
    local w="$dir/weft_${t}_perf.log" b="$dir/socket_${t}_perf.log"
    [ -f "$w" ] || continue
    echo "== ${t}_perf"
    if $report check "$w"; then echo "   weft: NCCL loaded weft, results verified"; else failed=1; fi
    if [ -f "$b" ]; then
      if $report check "$b" --baseline; then echo "   socket baseline: verified"; else failed=1; fi
      if [ -n "$check_only" ]; then  # recorded logs are only read, never written beside
        $report compare "$w" "$b" | sed 's/^/   /'
      else
        $report compare "$w" "$b" | tee "$dir/compare_${t}.txt" | sed 's/^/   /'
      fi
    fi
    local dec
    dec=$(grep -c "NET/weft : tuner:" "$w" || true)
    echo "   tuner log lines: $dec"
  done
  if [ -d "$dir/telemetry" ]; then
    local n
    n=$(cat "$dir"/telemetry/*/*.jsonl 2>/dev/null | grep -c '"type":"coll"' || true)
    echo "== timing: $n per-collective records under $dir/telemetry"
    if [ "$n" = 0 ]; then echo "FAIL: --timing gave no records"; failed=1; fi
  fi
  return $failed
}

if [ -n "$check_only" ]; then
  [ -d "$check_only" ] || { echo "nccl-tests.sh: $check_only is not a directory" >&2; exit 2; }
  if check_dir "$check_only"; then exit 0; else exit 1; fi
fi

# ---- what this machine needs ----
missing=()
[ -n "$src" ] || { echo "nccl-tests.sh: --nccl-tests SRC (a checkout of github.com/NVIDIA/nccl-tests) is required" >&2; exit 2; }
[ -f "$src/Makefile" ] && [ -d "$src/src" ] || missing+=("nccl-tests sources at $src (git clone https://github.com/NVIDIA/nccl-tests)")
command -v python3 >/dev/null || missing+=("python3")
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then missing+=("an NVIDIA GPU (nvidia-smi lists none)"); fi
prebuilt=1
for t in ${tests//,/ }; do [ -x "$src/build/${t}_perf" ] || prebuilt=0; done
if [ $prebuilt = 0 ]; then
  [ -x "$cuda/bin/nvcc" ] || missing+=("the CUDA toolkit (nvcc) at $cuda (--cuda DIR)")
  if [ -z "$nccl_home" ]; then
    for d in "$cuda" /usr /usr/local; do
      if [ -f "$d/include/nccl.h" ]; then nccl_home=$d; break; fi
    done
  fi
  [ -n "$nccl_home" ] && [ -f "$nccl_home/include/nccl.h" ] || missing+=("NCCL (nccl.h, libnccl.so) (--nccl-home DIR)")
fi
[ -n "$nccl_lib" ] || nccl_lib="$nccl_home/lib"
[ $prebuilt = 0 ] || [ -e "$nccl_lib/libnccl.so.2" ] || missing+=("libnccl.so.2 at $nccl_lib (--nccl-lib DIR)")
mpirun=$(command -v mpirun || true)
[ -n "$mpi_home" ] && mpirun="$mpi_home/bin/mpirun"
[ -n "$mpirun" ] && [ -x "$mpirun" ] || missing+=("MPI (mpirun; e.g. apt-get install openmpi-bin libopenmpi-dev) (--mpi-home DIR)")
[ -z "$mpi_home" ] && [ -n "$mpirun" ] && mpi_home=$(dirname "$(dirname "$(readlink -f "$mpirun")")")
plugin="$repo/build/lib/libnccl-net-weft.so"
[ -f "$plugin" ] || missing+=("weft's build ($plugin: run scripts/build.sh)")
if [ ${#missing[@]} -gt 0 ] && [ $dry = 0 ]; then
  echo "nccl-tests.sh: this machine cannot run the end-to-end test; missing:" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  exit 3
fi

out=${out:-$repo/build/e2e/nccl-tests-$(date +%Y%m%d-%H%M%S)}
run() { if [ $dry = 1 ]; then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi; }
[ -n "$mpirun" ] || mpirun=mpirun  # (dry run on a machine without MPI)
run mkdir -p "$out"

# ---- build nccl-tests (MPI, so that each rank is its own process) ----
if [ $prebuilt = 0 ]; then
  run make -C "$src" -j"$(nproc)" MPI=1 MPI_HOME="$mpi_home" CUDA_HOME="$cuda" NCCL_HOME="$nccl_home"
fi

common=(-x LD_LIBRARY_PATH="$repo/build/lib:$nccl_lib:${LD_LIBRARY_PATH:-}" -x NCCL_DEBUG=INFO
        -x NCCL_DEBUG_SUBSYS=INIT,NET,TUNING -x NCCL_SOCKET_IFNAME=lo -x NCCL_NET_PLUGIN_REF_COUNT=1)
mpi=("$mpirun" -np "$ranks" --oversubscribe --bind-to none)
# NCCL's log goes to files of its own (NCCL_DEBUG_FILE), since on standard output its lines cut into nccl-tests'
# table rows; afterwards they are appended to the run's log, below the table, where the checks read them.
keep_debug() {
  local f
  for f in "$1".nccl.*; do
    [ -f "$f" ] || continue
    { echo "# NCCL debug output of one rank ($(basename "$f"))"; cat "$f"; } >>"$1_perf.log" && rm -f "$f"
  done
}
for t in ${tests//,/ }; do
  bin="$src/build/${t}_perf"
  args=(-b "$min" -e "$max" -f 2 -g 1 -c 1 -w 5 -n 20)
  # weft's own choice of transport (WEFT_BACKEND=auto) unless the caller's environment names one
  wenv=(-x NCCL_NET_PLUGIN="$plugin" -x NCCL_NET=weft -x WEFT_IFACE=lo)
  [ -n "${WEFT_PROVIDER:-}" ] && wenv+=(-x WEFT_PROVIDER="$WEFT_PROVIDER")
  [ -n "${WEFT_BACKEND:-}" ] && wenv+=(-x WEFT_BACKEND="$WEFT_BACKEND")
  if [ $timing = 1 ]; then
    wenv+=(-x WEFT_TELEMETRY_DIR="$out/telemetry/$t" -x WEFT_TUNER_LOG=1)
    [ -n "$profile" ] && wenv+=(-x WEFT_TUNER_PROFILE="$profile")
  fi
  echo "== ${t}_perf: $ranks ranks through weft"
  wenv+=(-x NCCL_DEBUG_FILE="$out/weft_${t}.nccl.%h.%p")
  if [ $dry = 1 ]; then run "${mpi[@]}" "${common[@]}" "${wenv[@]}" "$here/rank_env.sh" "$bin" "${args[@]}"
  else "${mpi[@]}" "${common[@]}" "${wenv[@]}" "$here/rank_env.sh" "$bin" "${args[@]}" >"$out/weft_${t}_perf.log" 2>&1 \
         || true; keep_debug "$out/weft_${t}"; fi
  if [ $baseline = 1 ]; then
    echo "== ${t}_perf: $ranks ranks on NCCL's Socket transport"
    benv=(-x NCCL_NET=Socket -x NCCL_NET_PLUGIN=none -x NCCL_DEBUG_FILE="$out/socket_${t}.nccl.%h.%p")
    if [ $dry = 1 ]; then run "${mpi[@]}" "${common[@]}" "${benv[@]}" "$here/rank_env.sh" "$bin" "${args[@]}"
    else "${mpi[@]}" "${common[@]}" "${benv[@]}" "$here/rank_env.sh" "$bin" "${args[@]}" >"$out/socket_${t}_perf.log" \
           2>&1 || true; keep_debug "$out/socket_${t}"; fi
  fi
done
[ $dry = 1 ] && exit 0
echo "logs: $out"
if check_dir "$out"; then echo "nccl-tests through weft: all checks passed"; else echo "nccl-tests through weft: FAILED"; exit 1; fi
