#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One seeded stream of NCCL-like operations (diff.stream: interleaved connections, grouped receives no larger than
# both offer, random sizes and tags in shuffled send order, receives larger than their sends) through weft and
# through NCCL's own Socket transport: the receivers must observe the same sizes and the same bytes up to 64 past
# every message. Skipped (77), saying why, where NCCL's transport cannot be built here.
# usage: diff_nccl_socket.sh WEFT_BIN BUILD_DIR WEFT_SO [weft diff options...]
set -uo pipefail
weft=$1
out=$2
so=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
"$here/nccl_builtin_build.sh" ncclNetSocket "$out" || exit $?
exec "$weft" diff --plugin "$so" --plugin "$out/libnccl-net-ncclNetSocket.so" --table 11 \
  --env 'WEFT_PROVIDER=tcp;ofi_rxm' --env WEFT_IFACE=lo --env NCCL_SOCKET_IFNAME=lo "$@"
