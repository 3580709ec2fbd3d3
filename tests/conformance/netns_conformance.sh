#!/usr/bin/env bash
# Conformance between two network namespaces joined by a veth pair: the receiving worker in one namespace,
# the sending worker in the other, traffic only over the veth (10.211.0.1 <-> 10.211.0.2, addresses that exist
# only inside these namespaces). Creates and removes everything itself. Exit 77 (skipped) without root or ip.
# usage: netns_conformance.sh WEFT_BINARY PLUGIN_SO [extra conformance args...]
set -u
weft=$1
plugin=$2
shift 2
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "SKIP: needs root and iproute2 to create network namespaces"
  exit 77
fi
tag="weft$$"
a="${tag}a" b="${tag}b"
cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
}
trap cleanup EXIT
if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b"; then
  echo "SKIP: cannot create network namespaces here"
  exit 77
fi
ip link add "v${tag}a" type veth peer name "v${tag}b" || { echo "SKIP: no veth support"; exit 77; }
ip link set "v${tag}a" netns "$a"
ip link set "v${tag}b" netns "$b"
ip -n "$a" addr add 10.211.0.1/24 dev "v${tag}a"
ip -n "$b" addr add 10.211.0.2/24 dev "v${tag}b"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
done
ip -n "$a" link set "v${tag}a" up
ip -n "$b" link set "v${tag}b" up

"$weft" conformance --plugin "$plugin" \
  --env 'WEFT_PROVIDER=tcp;ofi_rxm' \
  --recv-netns "$a" --recv-env "WEFT_IFACE=v${tag}a" \
  --send-netns "$b" --send-env "WEFT_IFACE=v${tag}b" "$@"
