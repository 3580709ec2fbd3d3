#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Profiles end to end: weft tune sweep drives an NCCL stand-in (weft tune nccl-sim, which calls the real tuner
# plugin file as enqueue.cc does, in the tuner's own force and record modes, and prints nccl-tests output) once per
# candidate; the profile is scored in the same simulated world, reloaded by the plugin, shown as a table and a
# heatmap; the sweep resumes; nccl-tests' older table layout parses; timing records merge into a profile.
# usage: sweep_e2e.sh WEFT TUNER_SO FIXTURES_DIR
set -euo pipefail
weft=$1 tuner=$2 fixtures=$3
dir=$(mktemp -d /tmp/weft-sweep-e2e-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cmd="$weft tune nccl-sim --tuner $tuner --coll AllReduce --seed 3"

"$weft" tune sweep --coll AllReduce --command "$cmd" --out "$dir/p.json" --repeat 7 --channels 0,8 2>"$dir/sweep.err"
grep -q '"nranks": 16' "$dir/p.json" || fail "the signature did not come from the tuner's record"
grep -q '"masks"' "$dir/p.json" || fail "no availability masks recorded"
grep -q '"done"' "$dir/p.json" || fail "no resume state"
# NCCL's constants as the tuner's v7 init received them (nccl-sim passes the model's, as NCCL 2.32 passes its own)
grep -q '"compcaps": 5' "$dir/p.json" || fail "the recorded profile has no five-capability constants"
"$weft" tune show --profile "$dir/p.json" --ranks 16 --nodes 2 --cc rubin >"$dir/rubin.txt"
grep -q measured "$dir/rubin.txt" || fail "tune show --cc rubin: no decision table"
if "$weft" tune show --profile "$dir/p.json" --ranks 16 --nodes 2 --cc pascal 2>"$dir/cc.err"; then
  fail "--cc pascal accepted"
fi
grep -q "want volta, ampere, hopper, blackwell, rubin" "$dir/cc.err" || fail "--cc pascal: no clear error"
# NCCL's cost table at every swept size, as the tuner saw it (the policy interpolates measured/model ratios)
python3 - "$dir/p.json" <<'PY' || fail "the profile has no model from the tuner's record"
import json, sys
p = json.load(open(sys.argv[1]))
model = {(m["bytes"], m["algo"], m["proto"]) for m in p.get("model", [])}
meas = {(m["bytes"], m["algo"], m["proto"]) for m in p["measurements"]}
missing = meas - model
assert model and not missing, f"{len(model)} model points; measured without one: {sorted(missing)[:5]}"
PY
out=$("$weft" tune eval --profile "$dir/p.json" --seed 3)
echo "$out"
speed=$(echo "$out" | sed -n 's/.*geomean speedup \([0-9.]*\)x.*/\1/p')
minsp=$(echo "$out" | sed -n 's/.*min \([0-9.]*\)x.*/\1/p')
awk -v s="$speed" -v m="$minsp" 'BEGIN { exit !(s >= 1.05 && m >= 0.99) }' || fail "speedup $speed (min $minsp)"

# resume: every candidate is done already
"$weft" tune sweep --coll AllReduce --command "$cmd" --out "$dir/p.json" --repeat 7 --channels 0,8 2>"$dir/resume.err"
[ "$(grep -c 'done before' "$dir/resume.err")" = 12 ] || fail "resume did not skip the 12 done candidates"

# the plugin loads the profile and changes NCCL's picks where it measured better
WEFT_TUNER_PROFILE="$dir/p.json" WEFT_TUNER_RECORD="$dir/r.json" $cmd >"$dir/tuned.txt"
"$weft" tune show --profile "$dir/p.json" --ranks 16 --nodes 2 --plot "$dir/heat.svg" >"$dir/show.txt"
grep -q measured "$dir/show.txt" || fail "no measured decision in the table"
grep -q '<svg' "$dir/heat.svg" || fail "no heatmap"
"$weft" tune show --profile "$dir/p.json" --ranks 32 --nodes 4 | grep -q "pass NCCL's choices through" ||
  fail "a profile for another topology was used"
# a real sweep (H200, 2 ranks, 2026-11-27) whose NCCL offered no LL128 (mask 0x2d): shown by the entries it offered
"$weft" tune show --profile "$fixtures/../tuner/h200-allreduce-2ranks.json" --ranks 2 --nodes 2 >"$dir/h200.txt"
if grep -q "signature-mismatch" "$dir/h200.txt"; then fail "tune show: a profile judged by entries NCCL never offered"; fi
grep -Eq "^AllReduce +256K .*RING/SIMPLE +measured$" "$dir/h200.txt" || fail "tune show: the measured RING/SIMPLE at 256K"
if grep "^AllReduce" "$dir/h200.txt" | grep -q "LL128"; then fail "tune show: LL128, which NCCL did not offer"; fi

# nccl-tests' older layout (no root column), no tuner in the loop: --ranks/--nodes give the signature
"$weft" tune sweep --coll AllReduce --command "cat $fixtures/all_reduce_oldlayout.txt" --out "$dir/old.json" \
  --candidates RING/SIMPLE --repeat 1 --ranks 16 --nodes 2 2>/dev/null
grep -q '"time_us": 101.5' "$dir/old.json" || fail "old layout: the out-of-place time was not read"
[ "$(grep -c '"bytes"' "$dir/old.json")" = 4 ] || fail "old layout: not 4 sizes"

# a command that fails, or prints no table: a clear error, exit 1
if "$weft" tune sweep --coll AllReduce --command "false" --out "$dir/x.json" --repeat 1 --ranks 2 --nodes 1 2>"$dir/x.err"; then
  fail "a failing command was accepted"
fi
grep -q "command failed" "$dir/x.err" || fail "no clear error for a failing command"

# timing records -> profile
"$weft" replay --out "$dir/job" --ranks 4 --steps 8 >/dev/null
"$weft" profile merge "$dir/job" --out "$dir/m.json" | grep -q "for 4 ranks on 2 nodes" || fail "merge"
grep -q '"coll": "AllGather"' "$dir/m.json" || fail "merge: AllGather missing"
grep -q '"bytes": 131072' "$dir/m.json" || fail "merge: AllGather bytes not as the tuner sees them (x nranks)"
echo "sweep end to end: ok"
