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
