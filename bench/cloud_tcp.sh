#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# TCP transports on an emulated cloud NIC (tests/netns/cloud_nic.sh: a cap per flow, a cap in all, flows hashed
# over paths), between two network namespaces: weft's TCP backend beside NCCL's Socket transport with its AWS
# defaults (2 threads x 8 sockets a connection) and its GCP defaults (4 x 1), each configuration once per round, the
# rounds alternating, medians over rounds, and ratios to NCCL Socket with AWS's defaults.
#
#   bench/cloud_tcp.sh [--rounds 5] [--nic "--flow 1gbit --total 12gbit --buckets 64"] [--slow K]
#                      [--patterns conns,steps] [--sizes 1048576,4194304] [--weft-env "K=V ..."] [--out FILE]
#
# --slow K: bucket K at a quarter of the flow cap (a congested path). --weft-env: settings for weft's runs (a
# second weft configuration, "weft+env", beside the default one). Needs root (namespaces), htb and cls_bpf; the NCCL
# Socket shim (tests/conformance/nccl_builtin_build.sh ncclNetSocket) for the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5 nic="--flow 1gbit --total 12gbit --buckets 64" slow="" patterns=conns,steps sizes=1048576,4194304
weftEnv="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --nic) nic=${2?}; shift 2 ;;
    --slow) slow=${2:?}; shift 2 ;;
    --patterns) patterns=${2:?}; shift 2 ;;
    --sizes) sizes=${2:?}; shift 2 ;;
    --weft-env) weftEnv=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    *) echo "cloud_tcp.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
weft=build/bin/weft so=build/lib/libnccl-net-weft.so socket=build/nccl-builtin/libnccl-net-ncclNetSocket.so
[ -x "$weft" ] && [ -f "$so" ] || { echo "cloud_tcp.sh: build weft first (scripts/build.sh)" >&2; exit 3; }
[ -f "$socket" ] || { echo "cloud_tcp.sh: no NCCL Socket shim at $socket (tests/conformance/nccl_builtin_build.sh)" >&2; exit 3; }
[ -n "$slow" ] && nic="$nic --slow $slow"
# label | plugin | --env settings
configs=(
  "socket-aws|$socket|NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=8"
  "socket-gcp|$socket|NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=1"
  "weft-tcp|$so|WEFT_BACKEND=tcp"
)
[ -n "$weftEnv" ] && configs+=("weft+env|$so|WEFT_BACKEND=tcp $weftEnv")
raw=$(mktemp -d /tmp/weft-cloud-XXXXXX)
trap 'rm -rf "$raw"' EXIT
for r in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r label plugin envs <<<"$c"
    args=()
    for e in $envs; do args+=(--env "$e"); done
    IFS=, read -r -a sz <<<"$sizes"
    pats=$patterns
    for s in "${sz[@]}"; do
      # The steps pattern has its own sizes: with the first message size only.
      [ -n "$pats" ] || continue
      timeout 600 tests/conformance/netns_conformance.sh --cloud-nic "$nic" --bench "$weft" "$plugin" --no-raw \
        --rounds 1 --patterns "$pats" --conns-list 1,8 --conns-size "$s" "${args[@]}" \
        >"$raw/$label.$s.$r" 2>&1 </dev/null || echo "cloud_tcp.sh: $label ($s B) round $r failed" >&2
      pats=$(echo ",$pats," | sed -e 's/,steps,/,/' -e 's/^,//' -e 's/,$//')
    done
  done
  echo "round $r of $rounds done" >&2
done
python3 - "$raw" "$rounds" "$nic" <<'PY' | tee ${out:+"$out"}
import glob, os, re, statistics, sys
raw, rounds, nic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data, order = {}, []
for path in sorted(glob.glob(os.path.join(raw, "*"))):
    label, size, _ = os.path.basename(path).rsplit(".", 2)
    if label not in order:
        order.append(label)
    section = None
    for line in open(path, errors="replace"):
        if line.startswith("parallel connections"): section = "conns"
        elif line.startswith("NCCL step pattern"): section = "steps"
        m = re.match(r"\s+(\d+)\s+([\d.]+)\s*$", line)
        if section and m:
            key = f"{section} {m.group(1)} conn{'s' if m.group(1) != '1' else ''}"
            key += f", {int(size) >> 20} MiB" if section == "conns" else ""
            data.setdefault(label, {}).setdefault(key, []).append(float(m.group(2)))
base = "socket-aws"
metrics = sorted({m for l in data.values() for m in l})
print(f"emulated cloud NIC ({nic}), Gb/s received, {rounds} alternating rounds, medians (ratio to {base})")
print(f"{'metric':22}" + "".join(f"{l:>18}" for l in order))
for m in metrics:
    row = f"{m:22}"
    for l in order:
        v = data.get(l, {}).get(m)
        if not v:
            row += f"{'-':>18}"
            continue
        med = statistics.median(v)
        b = data.get(base, {}).get(m)
        row += f"{med:>10.2f} ({med / statistics.median(b):4.2f})" if b else f"{med:>18.2f}"
    print(row)
PY
