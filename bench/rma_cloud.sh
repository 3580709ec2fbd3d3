#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The device API over weft's TCP sockets on an emulated cloud NIC (tests/netns/cloud_nic.sh on the loopback of a
# namespace of its own: a cap per flow, a cap in all, flows hashed over paths), at several WEFT_TCP_RMA_FLOWS
# settings, each once per round, the rounds alternating; medians over rounds and ratios to the first setting.
#
#   bench/rma_cloud.sh [--rounds 5] [--flows 1,4,16] [--ranks 2] [--nic "--flow 1gbit --total 12gbit --buckets 64"]
#                      [--slow K]
#
# Figures (weft bench --rma): put+signal half round trip (8 B), put bandwidth (1 MiB puts, 32 in flight, rank 0 to
# rank 1), signal rate. Needs root (namespaces), htb and cls_bpf.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5 flows=1,4,16 ranks=2 nic="--flow 1gbit --total 12gbit --buckets 64" slow=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --flows) flows=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --nic) nic=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    *) echo "bench/rma_cloud.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
weft=$PWD/build/bin/weft plugin=$PWD/build/lib/libnccl-net-weft.so
[[ -x $weft && -f $plugin ]] || { echo "bench/rma_cloud.sh: build first (scripts/build.sh)" >&2; exit 3; }
[[ -n $slow ]] && nic="$nic --slow $slow"
ns=weft-rmacloud-$$
out=$(mktemp -d /tmp/weft-rmacloud-XXXXXX)
trap 'ip netns del "$ns" 2>/dev/null || true; rm -rf "$out"' EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
# shellcheck disable=SC2086
tests/netns/cloud_nic.sh shape "$ns" lo $nic
IFS=, read -r -a settings <<<"$flows"
for ((i = 0; i < rounds; i++)); do
  for f in "${settings[@]}"; do
    ip netns exec "$ns" env WEFT_BACKEND=tcp WEFT_RMA=on WEFT_IFACE=lo WEFT_TCP_RMA_FLOWS="$f" \
      timeout 300 "$weft" bench --rma --plugin "$plugin" --ranks "$ranks" 2>/dev/null | grep '^rma ' |
      sed "s/^/$f /" >>"$out/rma" || echo "bench/rma_cloud.sh: WEFT_TCP_RMA_FLOWS=$f failed in round $i" >&2
  done
done
python3 - "$out/rma" "$flows" "$nic" <<'PY'
import statistics, sys
path, flows, nic = sys.argv[1], sys.argv[2].split(','), sys.argv[3]
rows = {}
for line in open(path):
    f, rest = line.split(' ', 1)
    kv = dict(x.split('=') for x in rest.split()[4:])
    rows.setdefault(f, []).append(kv)
m = statistics.median
print(f"emulated cloud NIC ({nic}), weft's TCP RMA, medians of {min(len(v) for v in rows.values())} rounds")
print(f"{'WEFT_TCP_RMA_FLOWS':>18} {'put Gb/s':>9} {'ratio':>6} {'8 B half rtt us':>16} {'ratio':>6} "
      f"{'signals M/s':>12} {'ratio':>6}")
base = None
for f in flows:
    r = rows.get(f, [])
    if not r:
        print(f"{f:>18} (no result)")
        continue
    bw = m(float(x['put_bw_gbps']) for x in r)
    lat = m(float(x['put_signal_halfrtt_us']) for x in r)
    rate = m(float(x['signal_rate_Mps_per_rank']) for x in r)
    if base is None:
        base = (bw, lat, rate)
    print(f"{f:>18} {bw:9.2f} {bw / base[0]:6.2f} {lat:16.2f} {lat / base[1]:6.2f} {rate:12.3f} {rate / base[2]:6.2f}")
PY
