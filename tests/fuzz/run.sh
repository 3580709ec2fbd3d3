#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds weft's libFuzzer targets with clang (ASan + UBSan) into build-fuzz/ and runs each for a bounded time from
# its corpus in tests/fuzz/corpus/<target>/ (a scratch copy: the repository's corpus changes only with --update).
#   tests/fuzz/run.sh [--seconds N (per target, default 15)] [--update] [target ...]
# Prints executions per target; exits 77 (skipped) when clang with libFuzzer is not installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=15 update=0 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --update) update=1; shift ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(handle profile csv decide rails params)
cxx=${CXX_FUZZ:-clang++}
if ! command -v "$cxx" >/dev/null; then echo "fuzz: $cxx not installed: skipped"; exit 77; fi
out=build-fuzz
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc)
link=(-fsanitize=fuzzer,address,undefined)
# What each target links besides its own tests/fuzz/fuzz_<target>.cc. Every source compiles once into
# build-fuzz/obj (again only when it or a header it includes changed: the compiler's dependency files say which),
# two at a time, and fmt's compiled part (src/common/fmt_compiled.cc) goes into every target.
declare -A srcs=(
  [handle]="src/transport/handle.cc src/common/log.cc"
  [profile]="src/tuner/profile.cc src/tuner/policy.cc"
  [csv]="src/tuner/profile.cc src/tuner/policy.cc"
  [decide]="src/tuner/profile.cc src/tuner/policy.cc"
  [rails]="src/fabric/rails.cc src/transport/backend.cc src/common/sysfs.cc src/common/topology.cc src/common/params.cc src/common/log.cc"
  [params]="src/common/params.cc src/common/log.cc"
)
declare -A libs=([rails]="-lhwloc")
scratch=$(mktemp -d /tmp/weft-fuzz-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
  [ -n "${srcs[$t]:-}" ] || { echo "fuzz: unknown target $t"; exit 2; }
done
obj_of() { echo "$out/obj/${1%.cc}.o"; }
# stale SRC: its object is missing, or older than any file its dependency file lists.
stale() {
  local o d
  o=$(obj_of "$1"); d=${o%.o}.d
  [ -f "$o" ] && [ -f "$d" ] || return 0
  # shellcheck disable=SC2046
  [ -n "$(find $(sed -e 's/^[^:]*://' -e 's/\\$//' "$d") -newer "$o" 2>/dev/null | head -1)" ]
}
compile() {
  local o
  o=$(obj_of "$1")
  mkdir -p "$(dirname "$o")"
  "$cxx" "${flags[@]}" -MMD -MF "${o%.o}.d" -c "$1" -o "$o" 2>"$scratch/$(basename "$o").build" || {
    cat "$scratch/$(basename "$o").build"; echo "fuzz: compiling $1 failed"; return 1; }
}
all=$(for t in "${targets[@]}"; do echo "tests/fuzz/fuzz_$t.cc" ${srcs[$t]}; done | tr ' ' '\n' | sort -u)
pids=() failed=0
for s in $all src/common/fmt_compiled.cc; do
  stale "$s" || continue
  compile "$s" & pids+=($!)
  if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}" || failed=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ $failed = 0 ] || { echo "fuzz: building failed"; exit 1; }
for t in "${targets[@]}"; do
  bin=$out/fuzz_$t
  objs=()
  for s in "tests/fuzz/fuzz_$t.cc" ${srcs[$t]} src/common/fmt_compiled.cc; do objs+=("$(obj_of "$s")"); done
  # shellcheck disable=SC2086
  if [ ! -x "$bin" ] || [ -n "$(find "${objs[@]}" -newer "$bin" | head -1)" ]; then
    "$cxx" "${link[@]}" "${objs[@]}" ${libs[$t]:-} -o "$bin" 2>"$scratch/$t.build" || {
      cat "$scratch/$t.build"; echo "fuzz: linking $t failed"; exit 1; }
  fi
  mkdir -p "$scratch/$t"
  cp tests/fuzz/corpus/$t/* "$scratch/$t/" 2>/dev/null || true
  "$bin" -artifact_prefix="$out/" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$scratch/$t" \
    >"$scratch/$t.log" 2>&1 || { tail -40 "$scratch/$t.log"; echo "fuzz: $t FAILED (crash input above)"; exit 1; }
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$t.log")
  corpus=$(ls "$scratch/$t" | wc -l)
  echo "fuzz: $t: $execs executions in ${seconds}s, corpus $corpus inputs, no crash"
  if [ $update = 1 ]; then
    mkdir -p "tests/fuzz/corpus/$t"
    "$bin" -merge=1 "tests/fuzz/corpus/$t" "$scratch/$t" >/dev/null 2>&1
  fi
done
