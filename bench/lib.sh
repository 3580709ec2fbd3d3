# SPDX-License-Identifier: Apache-2.0
# What the bench scripts share (sourced, from the repository root): their options, the built files they need, and
# the alternating rounds over configurations whose runs bench/medians.py reads.

# bench_options SCRIPT "NAME ..." ARGS...: each --NAME VALUE in ARGS sets the shell variable NAME (dashes become
# underscores: --weft-env sets weft_env); any other argument is an error (exit 2).
bench_options() {
  local script=$1 names=" $2 " n
  shift 2
  while [ $# -gt 0 ]; do
    n=""
    case "$1" in --?*) n=${1#--} n=${n//-/_} ;; esac
    if [ -z "$n" ] || [[ "$names" != *" $n "* ]]; then
      echo "$script: unknown option $1" >&2
      exit 2
    fi
    [ $# -ge 2 ] || { echo "$script: $1 needs a value" >&2; exit 2; }
    printf -v "$n" '%s' "$2"
    shift 2
  done
}

# bench_paths SCRIPT: sets weft, so (the plugin) and socket (NCCL's Socket transport through the shim); exit 3 with
# what to build when one is missing.
bench_paths() {
  weft=build/bin/weft so=build/lib/libnccl-net-weft.so socket=build/nccl-builtin/libnccl-net-ncclNetSocket.so
  [ -x "$weft" ] && [ -f "$so" ] || { echo "$1: build weft first (scripts/build.sh)" >&2; exit 3; }
  [ -f "$socket" ] || {
    echo "$1: no NCCL Socket shim at $socket (tests/conformance/nccl_builtin_build.sh ncclNetSocket)" >&2
    exit 3
  }
}

# bench_rounds SCRIPT ROUNDS RAW RUN: ROUNDS rounds, each running every entry of the array `configs`
# ("label|plugin|K=V K=V ...") once, in order, as `RUN label plugin round RAW --env K=V ...`; RUN writes its
# `weft bench --json` output to RAW/label.round[.part] (bench/medians.py's layout).
bench_rounds() {
  local script=$1 rounds=$2 raw=$3 run=$4 r c label plugin envs e
  local -a args
  for r in $(seq 1 "$rounds"); do
    for c in "${configs[@]}"; do
      IFS='|' read -r label plugin envs <<<"$c"
      args=()
      for e in $envs; do args+=(--env "$e"); done
      "$run" "$label" "$plugin" "$r" "$raw" "${args[@]}" || echo "$script: $label round $r failed" >&2
    done
    echo "round $r of $rounds done" >&2
  done
}
