#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One rail of a two-rail device goes down (faults.rail_down, two network namespaces joined by two veth pairs fused
# with WEFT_RAILS): a flap shorter than WEFT_PEER_TIMEOUT is survived and counted, a rail that stays down fails
# the comm within the timeout, each counted. Then the per-rail health must be in the connection records and the
# Prometheus file: a comm whose rail went down and came back, and one whose rail was down when it closed.
# usage: rail_down_test.sh [--tcp] WEFT_BINARY PLUGIN_SO [netns_conformance.sh args...]
#   With --env WEFT_RAIL_FAILOVER=1 among the arguments the rail that stays down fails over instead (faults.rail_down
#   then requires the requests to complete and the connection to go on): the comm closes healthy, after the rail
#   came back, so no record shows a rail down at close; the rail still counts down twice and back up twice. Unless
#   WEFT_RAIL_READMIT=0 is among them too, the connection that failed over takes the rail back once it is up, loses
#   it again, and takes it back again: each end counts the rail down 3 times, back 3 times, failed over 3 times (the
#   flap's connection once) and re-admitted twice, and the sender's record shows messages sent on the rail since.
#   With --env CONFORMANCE_RAIL_VICTIM=first the rail taken down is rail 0, the control rail, instead of rail 1.
#   --pairs N: N rails (veth pairs, 2 to 4), the last taken down; under failover with the rdma protocol, each rail
#   left must then carry an even share of the striped writes while the rail is down (read from the sender's
#   interface counters: no rail left carries less than 4/5 of what another does).
#   --tcp: weft's native TCP backend, the two interfaces fused through makeVDevice (--rails fuse). It does not watch
#   links: a flap is TCP's to retransmit, unseen; the rail that stays down fails with TCP_USER_TIMEOUT (probe_lost)
#   or, once the neighbour entry is gone, "no route to host" (link_down).
set -u
here=$(cd "$(dirname "$0")" && pwd)
tcp=0 pairs=2
while :; do
  case "${1:-}" in
    --tcp) tcp=1; shift ;;
    --pairs) pairs=$2; shift 2 ;;
    *) break ;;
  esac
done
weft=$1 plugin=$2
shift 2
dir=$(mktemp -d /tmp/weft-rail-down-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$dir"' EXIT
failover=0
case " $* " in *" WEFT_RAIL_FAILOVER=1 "*) failover=1 ;; esac
readmits=0
[ $failover = 1 ] && readmits=2
case " $* " in *" WEFT_RAIL_READMIT=0 "*) readmits=0 ;; esac
# The rail taken down: rail 1, or rail 0 (the control rail) with CONFORMANCE_RAIL_VICTIM=first among the arguments.
v=$((pairs - 1)) o=0
case " $* " in *" CONFORMANCE_RAIL_VICTIM=first "*) v=0 o=1 ;; esac
rdma=0
case " $* " in *" WEFT_PROTOCOL=rdma "*) rdma=1 ;; esac
downs=$((2 + readmits / 2))  # rail 1 down, per end: the flap, the down phase, and the second down after re-admission
mode=(--rails explicit --pairs "$pairs")
[ $tcp = 1 ] && mode=(--rails fuse)
"$here/netns_conformance.sh" "${mode[@]}" --link-down "$weft" "$plugin" --table 11 --only faults.rail_down \
  --timeout 30 --env WEFT_PEER_TIMEOUT=6 --env WEFT_PROBE_INTERVAL=500 --env WEFT_TELEMETRY_DIR="$dir" \
  --recv-env WEFT_PROM_FILE="$dir/recv.prom" --send-env WEFT_PROM_FILE="$dir/send.prom" --env WEFT_PROM_INTERVAL=1 \
  "$@" 2>&1 | tee "$dir/out.txt"
rc=${PIPESTATUS[0]}
[ $rc = 0 ] || exit $rc
fail() { echo "FAIL: $*"; exit 1; }
if [ $failover = 1 ] && [ $rdma = 1 ] && [ "$pairs" -gt 2 ]; then
  # The failed rail's share spread over the rails left: "during, one rail down: bytes sent per rail: IF=N ...".
  line=$(grep -m1 'bytes sent per rail:' "$dir/out.txt") || fail "no per-rail byte counts for the phase with a rail down"
  lo=-1 hi=0
  for kv in ${line#*per rail: }; do
    case "$kv" in *[ab]$v=*) continue ;; esac  # the rail that is down
    n=${kv#*=}
    [ "$lo" -lt 0 ] || [ "$n" -lt "$lo" ] && lo=$n
    [ "$n" -gt "$hi" ] && hi=$n
  done
  [ "$lo" -gt 0 ] && [ $((lo * 5)) -ge $((hi * 4)) ] ||
    fail "with rail $v down the rails left did not share the striped writes evenly: $line"
  echo "spread: the rails left carried $lo to $hi bytes each while rail $v was down"
fi
records=$(cat "$dir"/*.jsonl 2>/dev/null | grep '"type":"conn"')
[ -n "$records" ] || fail "no connection records in $dir"
if [ $tcp = 1 ]; then
  echo "$records" | grep -Eq '"up":false,"downs":1,"recoveries":0,"last_down":"(probe_lost|link_down)"' ||
    fail "no connection record shows the rail that failed (probe_lost: TCP_USER_TIMEOUT; link_down: no route)"
  n=$(echo "$records" | grep -c '"rails":\[{"rail":0,.*{"rail":1,')
  [ "$n" -ge 4 ] || fail "$n connection records list two rails, wanted every one (4 or more)"
  grep -Eq '^weft_rail_down_total\{device="v[a-z0-9]*0"\} 0$' "$dir/recv.prom" ||
    fail "recv: rail 0 counted down, or no rail line: $(grep weft_rail "$dir/recv.prom" 2>&1)"
  echo "rail health (tcp): $(echo "$records" | wc -l) connection records"
  exit 0
fi
# The flap: a rail down once and back up.
echo "$records" | grep -q '"up":true,"downs":1,"recoveries":1,"last_down":"link_down"' ||
  fail "no connection record shows a rail that went down and came back"
# The rail that stayed down: the comm closed with it down (failed over: the comm lived on, and saw it come back).
if [ $failover = 0 ]; then
  echo "$records" | grep -q '"up":false,"downs":1,"recoveries":0,"last_down":"link_down"' ||
    fail "no connection record shows a rail down at close"
fi
# Every multi-rail record names both rails.
n=$(echo "$records" | grep -c '"rails":\[{"rail":0,.*{"rail":1,')
[ "$n" -ge 4 ] || fail "$n connection records list two rails, wanted every one (4 or more)"
# weft report sums them per NIC: the rail taken down (rail 1 here) down on both ends (2 per end), back once, closed
# down once, never the other
# (failed over: back twice, none closed down, failed over by both comms with messages moved).
"$weft" report "$dir" > "$dir/report.txt" 2>&1 || fail "weft report: $(cat "$dir/report.txt")"
if [ $failover = 0 ]; then
  grep -Eq " v[a-z0-9]*a$v +[0-9]+ +[0-9.]+ [kMG]?B +2 +1 +1 +0 +0 +0  link_down \(2\)" "$dir/report.txt" ||
    fail "weft report's rails section: $(cat "$dir/report.txt")"
else
  for end in a b; do
    want=" v[a-z0-9]*${end}$v +[0-9]+ +[0-9.]+ [kMG]?B +$downs +$downs +0 +$downs +[1-9][0-9]* +$readmits"
    want+="  link_down \(2\)"
    grep -Eq "$want" "$dir/report.txt" ||
      fail "weft report's rails section (failover: down and back $downs times, none closed down," \
        "$readmits taken back):" \
        "$(cat "$dir/report.txt")"
  done
fi
grep -Eq " v[a-z0-9]*a$o +[0-9]+ +[0-9.]+ [kMG]?B +0 +0 +0 +0 +0 +0  -" "$dir/report.txt" ||
  fail "weft report's rails section, rail $o: $(cat "$dir/report.txt")"
# The Prometheus file each process left (written last at exit, every connection closed). The receiver waits for
# data in both phases, so it sees both: rail 1 down twice and back once; the sender only where its sends stalled
# (an RMA write the provider completes once buffered does not). Rail 0 is never down on either.
prom=$dir/recv.prom
[ $failover = 1 ] || downs=2
grep -Eq "^weft_rail_down_total\{device=\"v[a-z0-9]*$v\"\} $downs\$" "$prom" 2>/dev/null ||
  fail "recv: the Prometheus file has no weft_rail_down_total of $downs for rail $v: $(grep weft_rail "$prom" 2>&1)"
grep -Eq "^weft_rail_recoveries_total\{device=\"v[a-z0-9]*$v\"\} [1-9]" "$prom" ||
  fail "recv: no recovery of rail $v counted: $(grep weft_rail "$prom" 2>&1)"
for side in recv send; do
  grep -Eq "^weft_rail_down_total\{device=\"v[a-z0-9]*$o\"\} 0\$" "$dir/$side.prom" ||
    fail "$side: rail $o counted down, or no rail line: $(grep weft_rail "$dir/$side.prom" 2>&1)"
done
if [ $failover = 1 ]; then
  # Failed over: the records name the rail the connections moved off, and how many messages they moved; the
  # Prometheus files count it per NIC on both ends, never for rail 0.
  echo "$records" | grep -Eq "\"rail\":$v,[^}]*\"failovers\":[1-9],\"moved\":[1-9]" ||
    fail "no connection record shows rail $v failed over with messages moved"
  for side in recv send; do
    grep -Eq "^weft_rail_failovers_total\{device=\"v[a-z0-9]*$v\"\} [1-9]" "$dir/$side.prom" ||
      fail "$side: no failover of rail $v in the Prometheus file: $(grep weft_rail "$dir/$side.prom" 2>&1)"
    grep -Eq "^weft_rail_failovers_total\{device=\"v[a-z0-9]*$o\"\} 0\$" "$dir/$side.prom" ||
      fail "$side: rail $o counted failed over: $(grep weft_rail "$dir/$side.prom" 2>&1)"
    grep -Eq "^weft_rail_readmits_total\{device=\"v[a-z0-9]*$v\"\} $readmits\$" "$dir/$side.prom" ||
      fail "$side: rail $v not taken back $readmits time(s) in the Prometheus file: $(grep weft_rail "$dir/$side.prom")"
  done
  # Taken back: the send comm's later messages used the rail again.
  if [ $readmits != 0 ]; then
    echo "$records" | grep '"dir":"send"' | grep -Eq "\"rail\":$v,[^}]*\"readmits\":2,\"msgs_since_readmit\":[1-9]" ||
      fail "no send connection record shows rail $v taken back and carrying messages since"
  fi
fi
echo "rail health: $(echo "$records" | wc -l) connection records; Prometheus:"
grep -H '^weft_rail_' "$dir/recv.prom" "$dir/send.prom"
