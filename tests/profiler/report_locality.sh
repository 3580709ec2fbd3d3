#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# weft report's locality section on a job whose rank 2 is late in backward (tests/fixtures/report-tags) and whose
# connection records say where each process's NIC sits: rank 2's NIC on the other socket from its GPU (SYS), rank
# 1's through the host bridge (PHB), ranks 0 and 3 on their GPU's switch. The report flags both, and names the
# cross-socket NIC as the likely cause of rank 2's straggling; records without locality (older weft) flag nothing.
# Usage: report_locality.sh WEFT_BIN FIXTURE_DIR
set -u
weft=$1 fixture=$2
dir=$(mktemp -d /tmp/weft-locality-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; cat "$dir/out" 2>/dev/null; exit 1; }
cp "$fixture"/*.jsonl "$dir/"
paths=(PIX PHB SYS PIX) numas=(0 0 1 1) gpus=(0000:15:00.0 0000:19:00.0 0000:35:00.0 0000:39:00.0)
for r in 0 1 2 3; do
  f=$dir/weft-host-rank$r.jsonl
  pid=$(head -1 "$f" | sed 's/.*"pid":\([0-9]*\).*/\1/')
  for c in 1 2; do
    printf '{"v":1,"type":"conn","host":"vm","pid":%s,"conn":%s,"dir":"send","peer":"10.0.0.%s","device":"mlx5_%s","msgs":10,"bytes":1000,"lat_p50_us":5.0,"lat_p99_us":9.0,"numa":%s,"gpu":"%s","gpu_path":"%s","time_ns":1}\n' \
      "$pid" "$c" "$c" "$r" "${numas[$r]}" "${gpus[$r]}" "${paths[$r]}" >>"$f"
  done
done
"$weft" report "$dir" >"$dir/out" 2>&1 || fail "weft report exited $?"
grep -q "^== locality" "$dir/out" || fail "no locality section"
grep -Eq "CROSS-SOCKET vm:[0-9]+: its NIC mlx5_2 is on the other socket from its GPU 0000:35:00.0 \(SYS\)" "$dir/out" ||
  fail "rank 2's cross-socket NIC not flagged"
grep -Eq "FAR-NIC vm:[0-9]+: its NIC mlx5_1 is far from its GPU 0000:19:00.0 \(PHB" "$dir/out" || fail "rank 1 not flagged"
grep -Eq "(CROSS-SOCKET|FAR-NIC) vm:[0-9]+: its NIC mlx5_[03]" "$dir/out" && fail "a rank on its GPU's switch flagged"
grep -Eq "STRAGGLER tag backward: comm [^ ]+ rank 2 .*likely cause: its NIC mlx5_2 is on the other socket" "$dir/out" ||
  fail "the straggler does not name its cross-socket NIC as the likely cause"
echo "ok: locality flagged, and named as the straggler's likely cause"
# Records from before weft recorded locality: no section, no cause.
cp "$fixture"/*.jsonl "$dir/"
for r in 0 1 2 3; do
  f=$dir/weft-host-rank$r.jsonl
  pid=$(head -1 "$f" | sed 's/.*"pid":\([0-9]*\).*/\1/')
  printf '{"v":1,"type":"conn","host":"vm","pid":%s,"conn":1,"dir":"send","peer":"p","device":"eth0","msgs":1,"bytes":1,"lat_p50_us":1.0,"lat_p99_us":1.0,"time_ns":1}\n' "$pid" >>"$f"
done
"$weft" report "$dir" >"$dir/out" 2>&1 || fail "weft report exited $? on records without locality"
grep -q "== locality\|likely cause" "$dir/out" && fail "records without locality gave a locality finding"
echo "ok: records without locality flag nothing"
