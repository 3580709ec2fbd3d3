#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An emulated cloud NIC on one interface's egress: every TCP flow capped (AWS: 5 Gb/s a flow outside a cluster
# placement group, 10 inside, on 100-200 Gb/s instances), a cap in all, and flows spread over paths by a hash of
# their ports, so two flows can share a path and one path can be slow.
#
#   cloud_nic.sh shape NETNS DEV [--flow 1gbit] [--total 12gbit] [--buckets 64] [--slow BUCKET]
#   cloud_nic.sh bucket SPORT DPORT [--buckets 64]     which bucket a flow takes (the classifier's hash)
#
# Built from what this kernel has (htb, cls_bpf; no fq, netem or u32): an htb class per bucket under one parent.
# A classic-BPF classifier hashes the TCP ports (multiplied, xor-folded: ports that count up together must not
# collide in pairs) into one of BUCKETS classes, each assured TOTAL/BUCKETS and allowed to borrow up to FLOW (htb lets
# a class send at its assured rate whatever its parent holds, so the assured rates sum to TOTAL); the parent caps
# all at TOTAL. Whatever is not IPv4 TCP (ARP, ...) goes to a class of its own. --slow BUCKET: that bucket's cap is a
# quarter of FLOW (a congested path).
#
# What it does not model: added round-trip time (no netem here), loss, reordering across paths, and the NIC's own
# receive queues; it shapes one direction, so shape both ends for a link.
set -euo pipefail

# The hash, the same in the classifier and here (32-bit arithmetic).
bucket_of() {  # SPORT DPORT BUCKETS
  local h=$(( ($1 * 2654435761) & 0xffffffff )) d=$(( ($2 * 2246822519) & 0xffffffff ))
  h=$(( h ^ d ))
  h=$(( h ^ (h >> 15) ))
  h=$(( (h * 73244475) & 0xffffffff ))
  h=$(( h ^ (h >> 16) ))
  echo $(( h % $3 ))
}

# The classifier in tc's classic-BPF form ("count,code jt jf k,..."): returns class 1:(bucket+1) for IPv4 TCP,
# 1:(buckets+1) otherwise. Offsets count from the Ethernet header (egress).
bytecode() {  # BUCKETS
  local n=$1 other=$(( 0x10000 + $1 + 1 ))
  local -a p=(
    "40 0 0 12"           # ldh [12]             EtherType
    "21 0 22 2048"        # jeq #0x800 else other
    "48 0 0 23"           # ldb [23]             IP protocol
    "21 0 20 6"           # jeq #6 else other
    "177 0 0 14"          # ldxb 4*([14]&0xf)    IP header length
    "72 0 0 14"           # ldh [x+14]           source port
    "36 0 0 2654435761"   # mul
    "2 0 0 0"             # st M[0]
    "72 0 0 16"           # ldh [x+16]           destination port
    "36 0 0 2246822519"   # mul
    "97 0 0 0"            # ldx M[0]
    "172 0 0 0"           # xor x
    "2 0 0 1"             # st M[1]
    "116 0 0 15"          # rsh #15
    "97 0 0 1"            # ldx M[1]
    "172 0 0 0"           # xor x
    "36 0 0 73244475"     # mul
    "2 0 0 1"             # st M[1]
    "116 0 0 16"          # rsh #16
    "97 0 0 1"            # ldx M[1]
    "172 0 0 0"           # xor x
    "148 0 0 $n"          # mod #buckets
    "4 0 0 65537"         # add #0x10001         class 1:(bucket+1)
    "22 0 0 0"            # ret a
    "6 0 0 $other"        # other: ret #1:(buckets+1)
  )
  local IFS=,
  echo "${#p[@]},${p[*]}"
}

# Bits per second of a tc rate ("1gbit", "500mbit", "2000000").
bps() {
  local v=$1
  case "$v" in
    *gbit) echo $(( ${v%gbit} * 1000000000 )) ;;
    *mbit) echo $(( ${v%mbit} * 1000000 )) ;;
    *kbit) echo $(( ${v%kbit} * 1000 )) ;;
    *bit) echo "${v%bit}" ;;
    *[!0-9]*) echo "cloud_nic.sh: a rate like 1gbit, 500mbit, not '$v'" >&2; exit 2 ;;
    *) echo "$v" ;;
  esac
}

shape() {
  local ns=$1 dev=$2
  shift 2
  local flow=1gbit total=12gbit buckets=64 slow=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --flow) flow=$2; shift 2 ;;
      --total) total=$2; shift 2 ;;
      --buckets) buckets=$2; shift 2 ;;
      --slow) slow=$2; shift 2 ;;
      *) echo "cloud_nic.sh shape: unknown option $1" >&2; exit 2 ;;
    esac
  done
  case "$buckets" in ''|*[!0-9]*) echo "cloud_nic.sh: --buckets wants 1 to 4000" >&2; exit 2 ;; esac
  [ "$buckets" -ge 1 ] && [ "$buckets" -le 4000 ] || { echo "cloud_nic.sh: --buckets wants 1 to 4000" >&2; exit 2; }
  if [ -n "$slow" ]; then
    case "$slow" in *[!0-9]*) echo "cloud_nic.sh: --slow wants a bucket number" >&2; exit 2 ;; esac
    [ "$slow" -lt "$buckets" ] || { echo "cloud_nic.sh: --slow $slow: there are $buckets buckets" >&2; exit 2; }
  fi
  local flowBps totalBps share
  flowBps=$(bps "$flow")
  totalBps=$(bps "$total")
  share=$(( totalBps / buckets ))
  [ "$share" -le "$flowBps" ] || share=$flowBps
  local t=(ip netns exec "$ns" tc)
  "${t[@]}" qdisc del dev "$dev" root 2>/dev/null || true
  "${t[@]}" qdisc add dev "$dev" root handle 1: htb default $(( buckets + 1 ))
  "${t[@]}" class add dev "$dev" parent 1: classid 1:ffff htb rate "${totalBps}bit" ceil "${totalBps}bit" \
    burst 256k cburst 256k quantum 60000
  # Commands through one tc batch: 64 buckets are 65 classes.
  local batch
  batch=$(mktemp)
  local i rate ceil
  for ((i = 0; i < buckets; i++)); do
    rate=$share ceil=$flowBps
    if [ "$i" = "$slow" ]; then
      ceil=$(( flowBps / 4 ))
      [ "$rate" -le "$ceil" ] || rate=$ceil
    fi
    echo "class add dev $dev parent 1:ffff classid 1:$(printf %x $((i + 1))) htb rate ${rate}bit ceil ${ceil}bit burst 128k cburst 128k quantum 60000" >>"$batch"
  done
  echo "class add dev $dev parent 1:ffff classid 1:$(printf %x $((buckets + 1))) htb rate 10mbit ceil ${totalBps}bit quantum 60000" >>"$batch"
  "${t[@]}" -batch "$batch" || { rm -f "$batch"; echo "cloud_nic.sh: tc refused the classes" >&2; exit 1; }
  rm -f "$batch"
  "${t[@]}" filter add dev "$dev" parent 1: bpf bytecode "$(bytecode "$buckets")" ||
    { echo "cloud_nic.sh: no cls_bpf here" >&2; exit 3; }
}

case "${1:-}" in
  shape) shift; [ $# -ge 2 ] || { echo "usage: cloud_nic.sh shape NETNS DEV [options]" >&2; exit 2; }; shape "$@" ;;
  bucket)
    shift
    [ $# -ge 2 ] || { echo "usage: cloud_nic.sh bucket SPORT DPORT [--buckets N]" >&2; exit 2; }
    n=64
    [ "${3:-}" = --buckets ] && n=${4:?}
    bucket_of "$1" "$2" "$n" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'; exit 2 ;;
esac
