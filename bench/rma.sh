#!/usr/bin/env bash
# The device API's RMA beside the net table's own isend/irecv on the same transport, in one run: ROUNDS alternating
# rounds (default 5), medians and their ratios. Loopback unless WEFT_IFACE says otherwise.
#   bench/rma.sh [--ranks N] [--rounds R] [--provider P]
# Without --provider: weft's TCP sockets (WEFT_BACKEND=tcp); with it: libfabric's provider P for both tables
# (WEFT_BACKEND=fabric WEFT_RMA=fabric WEFT_PROVIDER=P; e.g. 'tcp;ofi_rxm', shm).
# RMA: put+signal half round trip (8 B), put bandwidth (1 MiB puts, 32 in flight, rank 0 to rank 1 alone; with 3+
# ranks also every rank to the next at once), signal rate (size-0 signals, 128 in flight, every rank to the next). Net: 8 B half round trip, 1 MiB streaming bandwidth (NCCL_STEPS in flight).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=2 rounds=5 provider=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --provider) provider=$2; shift 2 ;;
    *) echo "bench/rma.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
weft=build/bin/weft plugin=build/lib/libnccl-net-weft.so
[[ -x $weft && -f $plugin ]] || { echo "bench/rma.sh: build first (scripts/build.sh)" >&2; exit 3; }
if [[ -z $provider ]]; then
  export WEFT_BACKEND=tcp WEFT_RMA=on WEFT_IFACE=${WEFT_IFACE:-lo}
else
  export WEFT_BACKEND=fabric WEFT_RMA=fabric WEFT_PROVIDER=$provider
  [[ $provider == shm ]] || export WEFT_IFACE=${WEFT_IFACE:-lo}
fi
netenv=(--env WEFT_BACKEND="$WEFT_BACKEND")
[[ -n ${WEFT_IFACE:-} ]] && netenv+=(--env WEFT_IFACE="$WEFT_IFACE")
[[ -n $provider ]] && netenv+=(--env WEFT_PROVIDER="$provider")
out=$(mktemp -d)
for ((i = 0; i < rounds; i++)); do
  timeout 300 "$weft" bench --rma --plugin "$plugin" --ranks "$ranks" 2>/dev/null | grep '^rma ' >> "$out/rma" || true
  timeout 300 "$weft" bench --plugin "$plugin" --patterns lat,bw --lat-sizes 8 --no-raw --json --rounds 1 \
    "${netenv[@]}" 2>/dev/null | grep '^{' >> "$out/net" || true
done
python3 - "$out" "$ranks" <<'PY'
import json, re, statistics, sys
out, ranks = sys.argv[1], sys.argv[2]
rma = [dict(kv.split('=') for kv in line.split()[4:]) for line in open(out + '/rma')]
net = [json.loads(line) for line in open(out + '/net')]
def netv(d, pattern, size, key):
    for r in d['results']:
        if r['pattern'] == pattern and r['bytes'] == size:
            return r['plugin'][key]
lat = [float(r['put_signal_halfrtt_us']) for r in rma]
bw = [float(r['put_bw_gbps']) for r in rma]
ring = [float(r['ring_bw_gbps_total']) for r in rma]
rate = [float(r['signal_rate_Mps_per_rank']) for r in rma]
nlat = [netv(d, 'lat', 8, 'median_us') for d in net]
nbw = [netv(d, 'bw', 1048576, 'gbps') for d in net]
# A round whose net run left a figure out (a failed or cut pattern) drops out of both sides' medians.
keep = [i for i in range(min(len(rma), len(net))) if nlat[i] is not None and nbw[i] is not None]
lat, bw, ring, rate = ([v[i] for i in keep] for v in (lat, bw, ring, rate))
nlat, nbw = [nlat[i] for i in keep], [nbw[i] for i in keep]
m = statistics.median
import os
print(f"{len(rma)} rounds, {ranks} ranks, WEFT_BACKEND={os.environ.get('WEFT_BACKEND')} "
      f"WEFT_PROVIDER={os.environ.get('WEFT_PROVIDER', '')} WEFT_IFACE={os.environ.get('WEFT_IFACE', '')}")
print(f"put+signal half round trip, 8 B: {m(lat):.2f} us   net isend/irecv 8 B: {m(nlat):.2f} us   "
      f"ratio {m([a / b for a, b in zip(lat, nlat)]):.2f}")
print(f"put bandwidth, 1 MiB, 0 -> 1:    {m(bw):.2f} Gb/s net 1 MiB stream: {m(nbw):.2f} Gb/s   "
      f"ratio {m([a / b for a, b in zip(bw, nbw)]):.2f}")
print(f"signal rate per rank:            {m(rate):.2f} M/s")
if int(ranks) > 2:
    print(f"ring bandwidth, all ranks:       {m(ring):.2f} Gb/s")
PY
rm -rf "$out"
