# SPDX-License-Identifier: Apache-2.0
# Sourced by the scripts that run checks between two network namespaces (netns_conformance.sh, rma_netns.sh).
# netns_pair TAG: namespaces "${TAG}a" and "${TAG}b" in $a and $b, removed when the script exits; exits 77 (skipped)
# without root, iproute2 or namespaces.
netns_pair() {
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
    echo "SKIP: needs root and iproute2 to create network namespaces"
    exit 77
  fi
  a="${1}a" b="${1}b"
  trap 'ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null' EXIT
  if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b"; then
    echo "SKIP: cannot create network namespaces here"
    exit 77
  fi
}

# netns_veth IA IB ADDR_A ADDR_B: a veth pair between $a and $b (IA in $a with ADDR_A, IB in $b with ADDR_B, both
# /24), both ends and each namespace's loopback up; exits 77 (skipped) without veth support.
netns_veth() {
  ip link add "$1" type veth peer name "$2" || { echo "SKIP: no veth support"; exit 77; }
  ip link set "$1" netns "$a"
  ip link set "$2" netns "$b"
  ip -n "$a" addr add "$3/24" dev "$1"
  ip -n "$b" addr add "$4/24" dev "$2"
  ip -n "$a" link set "$1" up
  ip -n "$b" link set "$2" up
  ip -n "$a" link set lo up
  ip -n "$b" link set lo up
}
