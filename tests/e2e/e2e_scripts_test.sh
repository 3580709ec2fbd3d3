#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The end-to-end scripts where no GPU is: argument handling, the "what is missing" answer, the commands they would
# run, and every check they make, on recorded nccl-tests logs (tests/fixtures/nccl-tests/e2e-*) and loss files.
# usage: e2e_scripts_test.sh REPO
set -euo pipefail
repo=$1
e2e=$repo/scripts/e2e
fx=$repo/tests/fixtures/nccl-tests
dir=$(mktemp -d /tmp/weft-e2e-scripts-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect_rc() { local want=$1; shift; set +e; "$@" >"$dir/out" 2>&1; local rc=$?; set -e
  [ "$rc" = "$want" ] || { cat "$dir/out"; fail "exit $rc, wanted $want: $*"; }; }

# nccl-tests output: verification, weft loaded, comparison
report="python3 $e2e/nccl_tests_report.py"
expect_rc 0 $report check "$fx/e2e-good/weft_all_reduce_perf.log"
expect_rc 0 $report check "$fx/e2e-good/socket_all_reduce_perf.log" --baseline
expect_rc 1 $report check "$fx/e2e-good/socket_all_reduce_perf.log"          # no weft in it
grep -q "did not load weft" "$dir/out" || fail "no reason for a run without weft"
expect_rc 1 $report check "$fx/e2e-good/weft_all_reduce_perf.log" --baseline  # weft where it must not be
expect_rc 1 $report check "$fx/e2e-bad/weft_all_reduce_perf.log"
grep -q "wrong results at sizes \[32768\]" "$dir/out" || fail "a wrong result was not named"
expect_rc 0 $report compare "$fx/e2e-good/weft_all_reduce_perf.log" "$fx/e2e-good/socket_all_reduce_perf.log"
grep -q "geomean ratio (sizes >= 64 KiB): 1.146" "$dir/out" || { cat "$dir/out"; fail "comparison"; }
expect_rc 0 $report busbw "$fx/all_reduce_oldlayout.txt"
[ "$(wc -l <"$dir/out")" = 4 ] || fail "old layout rows"
expect_rc 2 $report
expect_rc 1 $report check /dev/null

# torch-allreduce-sweep.py and gpu-lease.sh: arguments, what is missing
sweep="python3 $e2e/torch-allreduce-sweep.py"
expect_rc 2 $sweep --procs 1
expect_rc 2 $sweep --runs tcp,nope
grep -q "unknown run" "$dir/out" || fail "sweep: no reason for an unknown run"
if ! command -v torchrun >/dev/null; then
  expect_rc 3 $sweep --runs tcp,socket
  grep -q "torchrun is not on PATH" "$dir/out" || fail "sweep: what is missing"
fi
bash -n "$e2e/gpu-lease.sh" || fail "gpu-lease.sh does not parse"

# nccl-tests.sh: checks on recorded logs, arguments, what is missing, the commands it would run
expect_rc 0 "$e2e/nccl-tests.sh" --check-only "$fx/e2e-good"
grep -q "weft: NCCL loaded weft, results verified" "$dir/out" || fail "check-only good"
grep -q "tuner log lines: 1" "$dir/out" || fail "tuner log lines not counted"
expect_rc 1 "$e2e/nccl-tests.sh" --check-only "$fx/e2e-bad"
# a real run (H200, 2026-11-27), recorded: both tests verified, weft's TCP backend 1.17x and 1.14x of Socket
expect_rc 0 "$e2e/nccl-tests.sh" --check-only "$fx/e2e-h200" --tests all_reduce,sendrecv
[ "$(grep -c "weft: NCCL loaded weft, results verified" "$dir/out")" = 2 ] || fail "check-only h200"
grep -q "geomean ratio (sizes >= 64 KiB): 1.171" "$dir/out" || fail "h200 all_reduce comparison"
grep -q "geomean ratio (sizes >= 64 KiB): 1.137" "$dir/out" || fail "h200 sendrecv comparison"
expect_rc 2 "$e2e/nccl-tests.sh"
expect_rc 2 "$e2e/nccl-tests.sh" --bogus
expect_rc 2 "$e2e/nccl-tests.sh" --nccl-tests /nonexistent --ranks 1
expect_rc 2 "$e2e/nccl-tests.sh" --nccl-tests /nonexistent --tests all_reduce,nope
if ! command -v nvidia-smi >/dev/null; then
  expect_rc 3 "$e2e/nccl-tests.sh" --nccl-tests /nonexistent
  grep -q "an NVIDIA GPU" "$dir/out" || fail "the missing GPU was not named"
  grep -q "nccl-tests sources at /nonexistent" "$dir/out" || fail "the missing sources were not named"
fi
expect_rc 0 "$e2e/nccl-tests.sh" --nccl-tests "$dir/src" --ranks 3 --tests all_reduce,sendrecv --timing --dry-run --out "$dir/o"
grep -q "make -C $dir/src .*MPI=1" "$dir/out" || fail "dry run: no nccl-tests build"
grep -q -- "-np 3" "$dir/out" || fail "dry run: ranks"
grep -q "NCCL_NET_PLUGIN=$repo/build/lib/libnccl-net-weft.so" "$dir/out" || fail "dry run: plugin"
grep -q "NCCL_NET=weft" "$dir/out" || fail "dry run: NCCL_NET=weft"
grep -q "NCCL_NET=Socket" "$dir/out" || fail "dry run: baseline"
grep -q "WEFT_TELEMETRY_DIR=$dir/o/telemetry/all_reduce" "$dir/out" || fail "dry run: timing"
grep -q "rank_env.sh $dir/src/build/sendrecv_perf -b 8 -e 128M" "$dir/out" || fail "dry run: sendrecv_perf"
grep -q "NCCL_DEBUG_FILE=$dir/o/weft_all_reduce.nccl.%h.%p" "$dir/out" || fail "dry run: NCCL's log to its own files"
if grep -q "WEFT_PROVIDER" "$dir/out"; then fail "dry run: a provider named where the caller named none"; fi
WEFT_BACKEND=tcp expect_rc 0 "$e2e/nccl-tests.sh" --nccl-tests "$dir/src" --tests all_reduce --dry-run --out "$dir/o"
grep -q "WEFT_BACKEND=tcp" "$dir/out" || fail "dry run: the caller's WEFT_BACKEND not passed on"
# prebuilt nccl-tests (built elsewhere, gpu-lease-nccl-tests.sh): no build, libnccl.so.2 from --nccl-lib
mkdir -p "$dir/pre/build" "$dir/pre/src" "$dir/lib" && touch "$dir/pre/Makefile" "$dir/lib/libnccl.so.2"
printf '#!/bin/sh\n' >"$dir/pre/build/all_reduce_perf" && chmod +x "$dir/pre/build/all_reduce_perf"
expect_rc 0 "$e2e/nccl-tests.sh" --nccl-tests "$dir/pre" --nccl-lib "$dir/lib" --tests all_reduce --dry-run --out "$dir/o"
if grep -q "make -C" "$dir/out"; then fail "dry run: prebuilt nccl-tests rebuilt"; fi
grep -q "LD_LIBRARY_PATH=$repo/build/lib:$dir/lib" "$dir/out" || fail "dry run: --nccl-lib not on the ranks' path"
bash -n "$e2e/gpu-lease-nccl-tests.sh" || fail "gpu-lease-nccl-tests.sh does not parse"

# rank_env.sh: one node per rank
RANK=3 "$e2e/rank_env.sh" env >"$dir/env"
grep -qx "NCCL_HOSTID=weft-e2e-node-3" "$dir/env" || fail "NCCL_HOSTID from RANK"
OMPI_COMM_WORLD_RANK=1 "$e2e/rank_env.sh" env | grep -qx "NCCL_HOSTID=weft-e2e-node-1" || fail "from Open MPI"
expect_rc 2 env -u RANK "$e2e/rank_env.sh" true
# as root where unshare works, each rank has its node's host name (nccl-tests counts ranks per node by it)
WEFT_E2E_OWN_HOSTNAME=0 RANK=2 "$e2e/rank_env.sh" hostname | grep -qx "$(hostname)" || fail "own host name when off"
if [ "$(id -u)" = 0 ] && unshare --uts true 2>/dev/null; then
  RANK=2 "$e2e/rank_env.sh" hostname | grep -qx "weft-e2e-node-2" || fail "no host name of its own"
  [ "$(RANK=2 "$e2e/rank_env.sh" sh -c 'echo "$#:$1:$2"' x "a b" c)" = "2:a b:c" ] || fail "arguments through unshare"
fi

# pytorch-ddp.py: arguments, what is missing, loss comparison
expect_rc 0 python3 "$e2e/pytorch-ddp.py" --help
expect_rc 2 python3 "$e2e/pytorch-ddp.py" --steps 0
if ! python3 -c "import torch" 2>/dev/null; then
  expect_rc 3 python3 "$e2e/pytorch-ddp.py"
  grep -q "PyTorch" "$dir/out" || fail "the missing PyTorch was not named"
fi
echo '[1.0, 0.5, 0.25]' >"$dir/a.json"
echo '[1.0, 0.50000001, 0.25]' >"$dir/b.json"
echo '[1.0, 0.6, 0.25]' >"$dir/c.json"
echo '[1.0, 0.5]' >"$dir/d.json"
expect_rc 0 python3 "$e2e/pytorch-ddp.py" --compare "$dir/a.json" "$dir/b.json"
expect_rc 1 python3 "$e2e/pytorch-ddp.py" --compare "$dir/a.json" "$dir/c.json"
grep -q "step 1: loss 0.5 with weft, 0.6 without" "$dir/out" || fail "the differing step was not named"
expect_rc 1 python3 "$e2e/pytorch-ddp.py" --compare "$dir/a.json" "$dir/d.json"
echo "e2e scripts: ok"
