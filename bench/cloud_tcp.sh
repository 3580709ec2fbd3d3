#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# TCP transports on an emulated cloud NIC (tests/netns/cloud_nic.sh: a cap per flow, a cap in all, flows hashed
# over paths), between two network namespaces: weft's TCP backend beside NCCL's Socket transport with its AWS
# defaults (2 threads x 8 sockets a connection) and its GCP defaults (4 x 1), each configuration once per round, the
# rounds alternating, medians over rounds, and ratios to NCCL Socket with AWS's defaults.
#
#   bench/cloud_tcp.sh [--rounds 5] [--nic "--flow 1gbit --total 12gbit --buckets 64"] [--slow K]
#                      [--patterns conns,steps] [--sizes 1048576,4194304] [--weft-env "K=V ..."] [--out FILE]
#                      [--base PLUGIN]
#
# --slow K: bucket K at a quarter of the flow cap (a congested path). --weft-env: settings for weft's runs (a
# second weft configuration, "weft+env", beside the default one). --base PLUGIN: another build's plugin file (an
# earlier commit) as "weft-base", for a before/after A/B in the same rounds. Needs root (namespaces), htb and
# cls_bpf; the NCCL Socket shim (tests/conformance/nccl_builtin_build.sh ncclNetSocket) for the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
rounds=5 nic="--flow 1gbit --total 12gbit --buckets 64" slow="" patterns=conns,steps sizes=1048576,4194304
weft_env="" out="" base=""
bench_options cloud_tcp.sh "rounds nic slow patterns sizes weft_env out base" "$@"
bench_paths cloud_tcp.sh
[ -n "$slow" ] && nic="$nic --slow $slow"
# label | plugin | --env settings
configs=(
  "socket-aws|$socket|NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=8"
  "socket-gcp|$socket|NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=1"
  "weft-tcp|$so|WEFT_BACKEND=tcp"
)
[ -n "$weft_env" ] && configs+=("weft+env|$so|WEFT_BACKEND=tcp $weft_env")
[ -n "$base" ] && configs+=("weft-base|$base|WEFT_BACKEND=tcp")
# One configuration's runs of a round, a part per message size: label plugin round raw --env K=V ...
run() {
  local label=$1 plugin=$2 r=$3 raw=$4 s pats=$patterns rc=0
  shift 4
  IFS=, read -r -a sz <<<"$sizes"
  for s in "${sz[@]}"; do
    # The steps pattern has its own sizes: with the first message size only.
    [ -n "$pats" ] || continue
    timeout 600 tests/conformance/netns_conformance.sh --cloud-nic "$nic" --bench "$weft" "$plugin" --no-raw \
      --rounds 1 --json --patterns "$pats" --conns-list 1,8 --conns-size "$s" "$@" \
      >"$raw/$label.$r.$s" 2>/dev/null </dev/null || { echo "cloud_tcp.sh: $label ($s B) failed" >&2; rc=1; }
    pats=$(echo ",$pats," | sed -e 's/,steps,/,/' -e 's/^,//' -e 's/,$//')
  done
  return $rc
}
raw=$(mktemp -d /tmp/weft-cloud-XXXXXX)
trap 'rm -rf "$raw"' EXIT
bench_rounds cloud_tcp.sh "$rounds" "$raw" run
python3 bench/medians.py "$raw" socket-aws "emulated cloud NIC ($nic), Gb/s received" | tee ${out:+"$out"}
