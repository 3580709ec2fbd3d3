#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `weft info` shows the machine's layout on every topology fixture, through WEFT_TOPOLOGY_XML and through hwloc's own
# HWLOC_XMLFILE, and on this machine; a file hwloc cannot read is a warning and no map, never a failure of info.
# Usage: tests/topology/info_map.sh WEFT_BIN FIXTURE_DIR
set -u
weft=$1 dir=$2
out=$(mktemp -d /tmp/weft-topo-XXXXXX)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for f in "$dir"/*.xml; do
  name=$(basename "$f")
  for var in WEFT_TOPOLOGY_XML HWLOC_XMLFILE; do
    env "$var=$f" "$weft" info --topology >"$out/map" 2>&1 || { cat "$out/map"; fail "$name via $var: exit $?"; }
    grep -q "GPU to NIC" "$out/map" || { cat "$out/map"; fail "$name via $var: no GPU-to-NIC matrix"; }
    grep -Eq "^  GPU0 +0000:[0-9a-f:.]+ NUMA 0 package 0" "$out/map" || { cat "$out/map"; fail "$name: GPU0 not on NUMA 0"; }
    grep -q "NUMA node 1 (package 1)" "$out/map" || { cat "$out/map"; fail "$name: second socket missing"; }
  done
  # The whole `weft info` carries the map too.
  WEFT_TOPOLOGY_XML=$f "$weft" info >"$out/info" 2>&1
  grep -q "^topology from $f" "$out/info" || { cat "$out/info"; fail "$name: weft info has no map"; }
  echo "ok: $name ($(head -1 "$out/map" | sed 's/.*: //'))"
done
grep -q "PIX   PXB  NODE  NODE   SYS" <(WEFT_TOPOLOGY_XML=$dir/dgx-h100.xml "$weft" info --topology) ||
  fail "dgx-h100: GPU0's row is not PIX PXB NODE NODE SYS"
"$weft" info --topology >"$out/here" 2>&1 || { cat "$out/here"; fail "this machine: exit $?"; }
grep -q "^topology from this machine: " "$out/here" || { cat "$out/here"; fail "this machine: no map"; }
echo "ok: this machine ($(head -1 "$out/here" | sed 's/.*: //'))"
# A container that hides /sys (hwloc's HWLOC_FSROOT pointed at an empty tree): a layout without PCI, no failure.
mkdir -p "$out/nosys"
HWLOC_FSROOT=$out/nosys "$weft" info --topology >"$out/nosys.map" 2>&1 || { cat "$out/nosys.map"; fail "no /sys: exit $?"; }
grep -q "0 GPUs, 0 NICs" "$out/nosys.map" || { cat "$out/nosys.map"; fail "no /sys: want an empty PCI tree"; }
HWLOC_FSROOT=$out/nosys WEFT_BACKEND=tcp WEFT_IFACE=lo "$weft" info >"$out/nosys.info" 2>&1 ||
  { cat "$out/nosys.info"; fail "no /sys: weft info exit $?"; }
grep -q "^  0: lo " "$out/nosys.info" || { cat "$out/nosys.info"; fail "no /sys: the device is gone"; }
echo "ok: without /sys, no PCI locality and the devices as before"
echo '<topology version="2.0"><object type=' >"$out/bad.xml"
WEFT_TOPOLOGY_XML=$out/bad.xml "$weft" info --topology >"$out/bad" 2>&1
rc=$?
[ $rc = 1 ] || { cat "$out/bad"; fail "unreadable file: exit $rc, want 1"; }
grep -q "topology: none (hwloc cannot" "$out/bad" || { cat "$out/bad"; fail "unreadable file: no reason given"; }
WEFT_TOPOLOGY_XML=$out/bad.xml "$weft" info >"$out/badinfo" 2>&1
grep -q "weft goes on without the machine's layout" "$out/badinfo" || { cat "$out/badinfo"; fail "no warning"; }
echo "ok: an unreadable file is a warning and no map"
