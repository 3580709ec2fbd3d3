#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# NCCL's own Socket transport (the ncclNetSocket table inside the CUDA toolkit's libnccl.so.2, exported as a plugin
# file by tests/conformance/nccl_builtin_build.sh) driven by the harness over loopback. NCCL's transport is right by
# definition: every check that is not weft.* must pass, and a failure is a harness bug (or, where NCCL's transport
# really breaks NCCL's own rules, a check that must say so with the NCCL source line).
# Skipped (77), saying why, where an unstripped libnccl.so.2, nm or a C++ compiler is missing.
# usage: nccl_socket.sh WEFT_BIN BUILD_DIR [harness options...]
set -uo pipefail
weft=$1
out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
"$here/nccl_builtin_build.sh" ncclNetSocket "$out" || exit $?
NCCL_SOCKET_IFNAME=lo exec "$weft" conformance --plugin "$out/libnccl-net-ncclNetSocket.so" --table 11 "$@"
