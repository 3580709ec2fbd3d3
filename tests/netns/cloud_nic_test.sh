#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The emulated cloud NIC (tests/netns/cloud_nic.sh) classifies as it says: TCP flows from fixed source ports, each
# sending a known number of bytes through the shaped veth, land in the bucket the script's own hash names (the
# classes' byte counters show each flow's bytes in its class and nowhere else); ports that count up together spread
# over distinct buckets; --slow caps its bucket at a quarter. Judged by counters, not by a clock. Exit 77 without
# root, namespaces, htb or cls_bpf.
set -u
here=$(cd "$(dirname "$0")" && pwd)
nic=$here/cloud_nic.sh
# shellcheck source=tests/conformance/netns_lib.sh
. "$here/../conformance/netns_lib.sh"
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
tag="wcn$$"
netns_pair "$tag"
ia="v${tag}a" ib="v${tag}b"
netns_veth "$ia" "$ib" 10.212.0.1 10.212.0.2
buckets=64 slow=5
out=$("$nic" shape "$b" "$ib" --flow 2gbit --total 8gbit --buckets $buckets --slow $slow 2>&1)
rc=$?
if [ $rc != 0 ]; then
  case "$out" in *"no cls_bpf"*|*"Unknown qdisc"*|*"refused the classes"*) echo "SKIP: $out"; exit 77 ;; esac
  echo "FAIL: cloud_nic.sh shape: $out"; exit 1
fi
fail=0
# --slow: its class is capped at a quarter of the flow's cap; the others at the cap.
ceilOf() { ip netns exec "$b" tc class show dev "$ib" classid "1:$(printf %x "$1")" | grep -o 'ceil [0-9]*[GMK]*bit'; }
[ "$(ceilOf $((slow + 1)))" = "ceil 500Mbit" ] || { echo "FAIL: slow bucket $slow: $(ceilOf $((slow + 1))), not ceil 500Mbit"; fail=1; }
[ "$(ceilOf 1)" = "ceil 2Gbit" ] || { echo "FAIL: bucket 0: $(ceilOf 1), not ceil 2Gbit"; fail=1; }

# 16 flows from source ports 40000..40015 to 5201, 1 MiB times (index+1) each, from $b to $a.
flows=16 dport=5201
ip netns exec "$a" timeout 60 python3 - "$dport" "$flows" <<'PY' &
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.212.0.1", int(sys.argv[1]))); s.listen(64)
for _ in range(int(sys.argv[2])):
    c, _ = s.accept()
    while c.recv(1 << 20): pass
    c.close()
PY
server=$!
sleep 1
ip netns exec "$b" timeout 60 python3 - "$dport" "$flows" <<'PY' || { echo "FAIL: the flows could not be sent"; fail=1; }
import socket, sys, time
for i in range(int(sys.argv[2])):
    for attempt in range(50):
        try:
            c = socket.socket(); c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            c.bind(("10.212.0.2", 40000 + i)); c.connect(("10.212.0.1", int(sys.argv[1]))); break
        except ConnectionRefusedError:
            c.close(); time.sleep(0.1)
    c.sendall(b"x" * ((i + 1) << 20)); c.close()
PY
wait $server || { echo "FAIL: the receiver did not take every flow"; fail=1; }
# Bytes per class (header included: a flow's class carries at least its payload).
declare -A sent
while read -r cls bytes; do sent[$cls]=$bytes; done < <(ip netns exec "$b" tc -s class show dev "$ib" |
  awk '/^class htb/ {c=$3} /Sent/ {print c, $2}')
declare -A expect
used=""
for ((i = 0; i < flows; i++)); do
  k=$("$nic" bucket $((40000 + i)) $dport --buckets $buckets)
  cls="1:$(printf %x $((k + 1)))"
  expect[$cls]=$(( ${expect[$cls]:-0} + ((i + 1) << 20) ))
  case " $used " in *" $k "*) ;; *) used="$used $k" ;; esac
done
for cls in "${!expect[@]}"; do
  got=${sent[$cls]:-0}
  want=${expect[$cls]}
  # Payload plus headers and ACK-less overhead: at least the payload, at most 10% over.
  if [ "$got" -lt "$want" ] || [ "$got" -gt $(( want + want / 10 + 65536 )) ]; then
    echo "FAIL: class $cls carried $got bytes, its flows sent $want"; fail=1
  fi
done
# No other bucket carried bulk data.
for cls in "${!sent[@]}"; do
  case "$cls" in 1:ffff|"1:$(printf %x $((buckets + 1)))") continue ;; esac
  if [ -z "${expect[$cls]:-}" ] && [ "${sent[$cls]}" -gt 65536 ]; then
    echo "FAIL: class $cls carried ${sent[$cls]} bytes, no flow was hashed there"; fail=1
  fi
done
nused=$(echo "$used" | wc -w)
# 16 consecutive source ports over 64 buckets: a hash that collides in pairs would use 8 or fewer.
[ "$nused" -ge 10 ] || { echo "FAIL: 16 consecutive ports took only $nused buckets"; fail=1; }
[ $fail = 0 ] && echo "PASS: 16 flows in the buckets the hash names ($nused distinct), slow bucket capped"
exit $fail
