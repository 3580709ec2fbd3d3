#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# weft report end to end: jobs recorded through weft's profiler by `weft replay` (one process per rank, as NCCL
# would drive it), with and without a planted straggler, and a record directory with damaged lines.
# usage: report_e2e.sh WEFT
set -euo pipefail
weft=$1
dir=$(mktemp -d /tmp/weft-report-e2e-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. straggler at rank 1 of 4: found, and no other rank is blamed
"$weft" replay --out "$dir/a" --ranks 4 --steps 10 --straggler 1 --delay-us 3000 >/dev/null
out=$("$weft" report "$dir/a" --plot "$dir/a/plots")
echo "$out" | grep -q "STRAGGLER comm 0x000000005eed0000 rank 1 " || fail "straggler rank 1 not found: $out"
echo "$out" | grep -E "STRAGGLER .* rank [023] " && fail "a punctual rank was blamed"
grep -q "<svg" "$dir/a/plots/busbw_vs_size.svg" || fail "no busbw plot"
grep -q "<circle" "$dir/a/plots/timeline.svg" || fail "no timeline points"

# 2. no straggler: none reported
"$weft" replay --out "$dir/b" --ranks 3 --steps 10 >/dev/null
out=$("$weft" report "$dir/b")
echo "$out" | grep -q "no straggler" || fail "a straggler was reported in a punctual job: $out"
echo "$out" | grep -q "40 collectives joined" || fail "join by communicator and sequence number: $out"

# 3. damaged files: bad lines are named and skipped, the rest is still read
cp -r "$dir/b" "$dir/c"
f=$(ls "$dir"/c/*.jsonl | head -1)
printf '{"v":1,"type":"coll","comm":"x"\nnot json at all\n{"v":99,"type":"coll"}\n' >> "$f"
out=$("$weft" report "$dir/c" 2>"$dir/c.err")
grep -q "not a JSON object" "$dir/c.err" || fail "a malformed line was not reported"
grep -q "schema version 99" "$dir/c.err" || fail "an unknown schema version was not reported"
echo "$out" | grep -q "no straggler" || fail "the good records were not read after the bad ones"

# 4. user tags (profiler v7): rank 0 late only in the pipeline part of each step. The tags section names it there
#    and only there (from the kernels' sync phases); the job-wide section does not (a fifth of its collectives).
"$weft" replay --out "$dir/t" --ranks 3 --steps 10 --tags --straggler 0 --straggler-tag 3 --delay-us 3000 >/dev/null
out=$("$weft" report "$dir/t")
echo "$out" | grep -q "from the kernels' sync phases" || fail "phases not used for stragglers: $out"
echo "$out" | grep -q "STRAGGLER tag pipeline: comm 0x000000005eed0000 rank 0 " || fail "pipeline straggler not found: $out"
echo "$out" | grep -E "STRAGGLER tag (forward|backward)|STRAGGLER tag pipeline: .* rank [12] |STRAGGLER comm" \
  && fail "a tag or rank that was on time was blamed"
echo "$out" | grep -Eq "^  pipeline .* rank 0 of 0x000000005eed0000 \(3000.0us\)" || fail "pipeline row: $out"
echo "$out" | grep -Eq "^  forward +60 " || fail "forward row (2 collectives x 10 steps x 3 ranks): $out"
# untagged records (an older NCCL) beside tagged ones: shown as untagged; no tags at all: no section
echo "$out" | grep -q "untagged" && fail "an untagged row without untagged records"
"$weft" report "$dir/b" | grep -q "user tags" && fail "a tags section for a job without tags"
# a malformed phases field is named and skipped
f=$(ls "$dir"/t/*.jsonl | head -1)
sed -n '3p' "$f" | sed 's/"phases_ns":\[[0-9,]*\]/"phases_ns":[1,2]/' >> "$f"
"$weft" report "$dir/t" 2>"$dir/t.err" >/dev/null
grep -q "phases_ns is not an array of 3" "$dir/t.err" || fail "a malformed phases_ns was not reported"

# 5. nothing to read: a clear error, exit 1
mkdir "$dir/empty"
if "$weft" report "$dir/empty" 2>"$dir/e.err"; then fail "an empty directory reported success"; fi
grep -q "no collective, p2p or connection records" "$dir/e.err" || fail "no clear error for an empty directory"
echo "report end to end: ok"
