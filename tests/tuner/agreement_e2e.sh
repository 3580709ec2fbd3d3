#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# No silent split between ranks (issue 16), end to end through the plugin files:
# - the combined library (libnccl-net-weft.so, driven by the harness in two processes): ranks given the same
#   profile connect; given another profile, a damaged one or none, accept fails with ncclInvalidUsage and a
#   warning naming both digests (and so does connect, unless the harness stopped it first);
# - the standalone tuner (libnccl-tuner-weft.so, called by the simulated NCCL): every process logs its decision
#   state at INFO, and `weft tune check` over the logs finds one state, or names the processes that differ.
# usage: agreement_e2e.sh WEFT NET_SO TUNER_SO [harness --env options for the pair; default: tcp;ofi_rxm on lo]
set -euo pipefail
weft=$1 net=$2 tuner=$3
shift 3
transport=("$@")
[ ${#transport[@]} -eq 0 ] && transport=(--env 'WEFT_PROVIDER=tcp;ofi_rxm' --env WEFT_IFACE=lo)
dir=$(mktemp -d /tmp/weft-agreement-e2e-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cat >"$dir/a.json" <<'JSON'
{"format": "weft-tuner-profile", "version": 1,
 "signature": {"nranks": 16, "nnodes": 2},
 "measurements": [
  {"coll": "AllReduce", "bytes": 1048576, "algo": "RING", "proto": "SIMPLE", "channels": 0, "time_us": 41.7,
   "samples": 10, "spread": 0.012}
 ]}
JSON
sed 's/41.7/52.5/' "$dir/a.json" >"$dir/b.json"
head -c 100 "$dir/a.json" >"$dir/damaged.json"

pair() {  # pair RECV_PROFILE SEND_PROFILE: the harness's two-process connect through the combined library
  timeout 120 "$weft" conformance --plugin "$net" --only connect.two_process --timeout 30 --verbose \
    "${transport[@]}" \
    --recv-env "WEFT_TUNER_PROFILE=$1" --send-env "WEFT_TUNER_PROFILE=$2" >"$dir/pair.out" 2>&1
}
pair "$dir/a.json" "$dir/a.json" || { cat "$dir/pair.out"; fail "ranks with the same profile did not connect"; }
echo "same profile: connected"
for other in b.json damaged.json missing.json; do
  if pair "$dir/a.json" "$dir/$other"; then fail "a rank with $other connected to one with a.json"; fi
  grep -q "\[recv\] accept returned ncclInvalidUsage" "$dir/pair.out" || { cat "$dir/pair.out"; fail "$other: accept"; }
  # The connector fails too (ncclInvalidUsage, naming both digests) unless the harness stopped it first, once the
  # listener's side had failed; the backend's two-process unit test checks that end.
  grep -Eq "\[send\] (connect returned ncclInvalidUsage|the peer process gave up)" "$dir/pair.out" ||
    { cat "$dir/pair.out"; fail "$other: connect"; }
  grep -q 'would decide differently' "$dir/pair.out" || { cat "$dir/pair.out"; fail "$other: no warning"; }
  echo "$other against a.json: refused"
done

sim() {  # sim PROFILE LOG: one "rank" of the simulated NCCL with the standalone tuner
  NCCL_DEBUG=INFO WEFT_TUNER_PROFILE=$1 "$weft" tune nccl-sim --tuner "$tuner" --coll AllReduce >/dev/null 2>"$2"
}
sim "$dir/a.json" "$dir/r0.log"
sim "$dir/a.json" "$dir/r1.log"
sim "$dir/b.json" "$dir/r2.log"
sim "$dir/damaged.json" "$dir/r3.log"
grep -q "NCCL INFO .*tuner decision state [0-9a-f]\{16\}: profile" "$dir/r0.log" || { cat "$dir/r0.log"; fail "no state line"; }
"$weft" tune check "$dir/r0.log" "$dir/r1.log" --expect 2 | tee "$dir/check.out"
grep -q "2 processes, one tuner decision state" "$dir/check.out" || fail "agreement not reported"
if "$weft" tune check "$dir/r0.log" "$dir/r1.log" "$dir/r2.log" "$dir/r3.log" >"$dir/check.out"; then
  fail "tune check passed logs with different states"
fi
cat "$dir/check.out"
grep -q "4 processes, 3 different tuner decision states" "$dir/check.out" || fail "the split was not reported"
grep -q "does not load" "$dir/check.out" || fail "the damaged profile was not named"
if "$weft" tune check "$dir/r0.log" --expect 2 >"$dir/check.out"; then fail "a missing rank was not noticed"; fi
grep -q "1 processes logged their state, 2 expected" "$dir/check.out" || fail "missing rank message"
set +e
"$weft" tune check /dev/null >/dev/null 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "no state lines: exit $rc, not 2"
echo "PASS"
