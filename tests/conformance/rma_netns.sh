#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The device API's conformance across a link that goes down: two network namespaces joined by one veth pair
# (10.212.0.1 <-> 10.212.0.2, addresses that exist only inside them), `weft conformance --rma --netns A,B` putting
# even ranks in one and odd ranks in the other, so that every rank's next rank is across the link; the check
# faults.link_down takes it down and up. Creates and removes everything itself. Exit 77 (skipped) without root or ip.
#
# usage: rma_netns.sh WEFT_BINARY PLUGIN_SO [weft conformance --rma args...]
#   The transport comes from the environment (WEFT_BACKEND, WEFT_RMA, WEFT_PROVIDER); WEFT_IFACE is set here to the
#   veths, WEFT_PEER_TIMEOUT to 3 s unless set.
set -u
weft=$1
plugin=$2
shift 2
tag="wr$$"
# shellcheck source=tests/conformance/netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"
netns_pair "$tag"
netns_veth "v${tag}a" "v${tag}b" 10.212.0.1 10.212.0.2
export CONFORMANCE_LINK_DOWN_OK=1 WEFT_IFACE="v${tag}"
export WEFT_PEER_TIMEOUT="${WEFT_PEER_TIMEOUT:-3}"
"$weft" conformance --rma --plugin "$plugin" --netns "$a,$b" "$@"
