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
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc
       -DFMT_HEADER_ONLY)
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
  bin=$out/fuzz_$t
  # shellcheck disable=SC2086
  if [ ! -x "$bin" ] || [ -n "$(find tests/fuzz/fuzz_$t.cc ${srcs[$t]} include src/tuner src/fabric/rails.h -newer "$bin" 2>/dev/null | head -1)" ]; then
    "$cxx" "${flags[@]}" "tests/fuzz/fuzz_$t.cc" ${srcs[$t]} ${libs[$t]:-} -o "$bin" 2>"$scratch/$t.build" || {
      cat "$scratch/$t.build"; echo "fuzz: building $t failed"; exit 1; }
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
