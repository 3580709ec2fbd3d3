#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Conformance (or a benchmark) between two network namespaces joined by veth pairs: the receiving worker in one
# namespace, the sending worker in the other, traffic only over the veths (10.211.N.1 <-> 10.211.N.2, addresses
# that exist only inside these namespaces). Creates and removes everything itself. Exit 77 (skipped) without
# root or ip.
#
# usage: netns_conformance.sh [--rails explicit|fuse] [--netem "SPEC"] [--bench] WEFT_BINARY PLUGIN_SO [args...]
#   --rails explicit: two veth pairs, fused into one device with WEFT_RAILS on each side;
#   --rails fuse:     two veth pairs (or --pairs N), as many devices each side, fused by the harness through
#                     makeVDevice (v9+; more than 4 only on v12, NCCL 2.30+).
#   With --rails, every rail must carry at least half its fair share of the bytes (a fifth with two rails; read
#   from the interfaces' own counters), except with --link-down.
#   --netem SPEC: tc netem on every veth, both directions (e.g. "delay 1ms loss 0.5% reorder 25% 50%"); the
#   conformance checks verify every byte, so data must arrive intact whatever the link does.
#   --bench runs `weft bench` instead of `weft conformance`.
#   --link-down lets the checks take the veths down and up (faults.link_down; only ever inside these namespaces).
#   --pairs N (2 to 8, with --rails): N veth pairs, so N rails (default 2); more than 4 needs --table 12.
#   --rate RATE: every veth sends at most RATE (tc tbf, e.g. 1gbit), so bandwidth follows the links, not the CPU.
#   --cloud-nic "OPTS": every veth, both ends, is an emulated cloud NIC (tests/netns/cloud_nic.sh shape OPTS, e.g.
#                       "--flow 1gbit --total 12gbit --buckets 64 --slow 3"; "" for its defaults).
set -u
rails="" cmd=conformance netem="" linkdown=0 pairs=2 rate="" cloud="" cloudSet=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cloud-nic) cloud=$2; cloudSet=1; shift 2 ;;
    --rails) rails=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --bench) cmd=bench; shift ;;
    --netem) netem=$2; shift 2 ;;
    --link-down) linkdown=1; shift ;;
    *) break ;;
  esac
done
weft=$1
plugin=$2
shift 2
tag="weft$$"
# shellcheck source=tests/conformance/netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"
netns_pair "$tag"
case "$pairs" in 2|3|4|5|6|7|8) ;; *) echo "--pairs takes 2 to 8, not '$pairs'"; exit 2 ;; esac
npairs=1
[ -n "$rails" ] && npairs=$pairs
for i in $(seq 0 $((npairs - 1))); do
  ia="v${tag}a$i" ib="v${tag}b$i"
  netns_veth "$ia" "$ib" "10.211.$i.1" "10.211.$i.2"
  if [ -n "$netem" ]; then
    # shellcheck disable=SC2086
    ip netns exec "$a" tc qdisc add dev "$ia" root netem $netem &&
      ip netns exec "$b" tc qdisc add dev "$ib" root netem $netem || { echo "SKIP: tc netem unavailable"; exit 77; }
  fi
  if [ $cloudSet = 1 ]; then
    for end in "$a $ia" "$b $ib"; do
      read -r ns dev <<< "$end"
      # shellcheck disable=SC2086
      out=$("$(dirname "$0")/../netns/cloud_nic.sh" shape "$ns" "$dev" $cloud 2>&1) || {
        case "$out" in *"no cls_bpf"*) echo "SKIP: $out"; exit 77 ;; esac
        echo "cloud_nic.sh: $out"; exit 2; }
    done
  fi
  if [ -n "$rate" ]; then
    for end in "$a $ia" "$b $ib"; do
      read -r ns dev <<< "$end"
      ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 50ms ||
        { echo "SKIP: tc tbf unavailable"; exit 77; }
    done
  fi
done

extra=()
[ $linkdown = 1 ] && extra+=(--env CONFORMANCE_LINK_DOWN_OK=1)
case "$rails" in
  "") ;;
  explicit)
    ra="v${tag}a0" rb="v${tag}b0"
    for i in $(seq 1 $((npairs - 1))); do ra="$ra+v${tag}a$i" rb="$rb+v${tag}b$i"; done
    extra+=(--recv-env "WEFT_RAILS=$ra" --send-env "WEFT_RAILS=$rb") ;;
  fuse)
    fuse=$(seq -s, 0 $((npairs - 1)))
    extra+=(--env WEFT_RAILS=off --fuse "$fuse") ;;
  *) echo "unknown --rails mode '$rails'"; exit 2 ;;
esac

# Bytes received by interface $2 in namespace $1.
rxbytes() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/rx_bytes"; }
declare -a before
for i in $(seq 0 $((npairs - 1))); do before[$i]=$(rxbytes "$a" "v${tag}a$i"); done

"$weft" "$cmd" --plugin "$plugin" \
  --env 'WEFT_PROVIDER=tcp;ofi_rxm' \
  --recv-netns "$a" --recv-env "WEFT_IFACE=v${tag}a" --recv-env "NCCL_SOCKET_IFNAME=v${tag}a" \
  --send-netns "$b" --send-env "WEFT_IFACE=v${tag}b" --send-env "NCCL_SOCKET_IFNAME=v${tag}b" "${extra[@]}" "$@"
rc=$?
if [ -n "$netem" ]; then  # what the impaired link did to the traffic (sent, dropped, duplicated, reordered)
  for ns in "$a" "$b"; do
    for dev in $(ip -n "$ns" -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^v$tag"); do
      echo "netem $dev: $(ip netns exec "$ns" tc -s qdisc show dev "$dev" | tr -s ' \n' ' ')"
    done
  done
fi
[ -z "$rails" ] && exit $rc

total=0
declare -a got
for i in $(seq 0 $((npairs - 1))); do
  got[$i]=$(( $(rxbytes "$a" "v${tag}a$i") - before[i] ))
  total=$((total + got[i]))
done
for i in $(seq 0 $((npairs - 1))); do
  echo "rail $i (v${tag}a$i): ${got[$i]} bytes received of $total"
  # (Not judged where the checks took links down: a rail that was down carried less, as it should.)
  share=$((2 * npairs))
  [ $share -lt 5 ] && share=5
  if [ $linkdown = 0 ] && { [ "$total" -le 0 ] || [ $((got[i] * share)) -lt "$total" ]; }; then
    echo "FAIL: rail $i carried less than 1/$share of the traffic"
    rc=1
  fi
done
exit $rc
