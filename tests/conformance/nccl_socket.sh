#!/usr/bin/env bash
# NCCL's own Socket transport (the ncclNetSocket table inside the CUDA toolkit's libnccl.so.2, exported as a plugin
# file by ../shared/tools/nccl-builtin-net) driven by the harness over loopback. NCCL's transport is right by
# definition: every check that is not weft.* must pass, and a failure is a harness bug (or, where NCCL's transport
# really breaks NCCL's own rules, a check that must say so with the NCCL source line).
# Skipped (77), saying why, where the shim's source, an unstripped libnccl.so.2 or nm is missing.
# usage: nccl_socket.sh WEFT_BIN BUILD_DIR [harness options...]
set -uo pipefail
weft=$1
out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
src=${NCCL_BUILTIN_SRC:-$here/../../../shared/tools/nccl-builtin-net}
lib=${NCCL_LIB:-/usr/local/cuda/lib64/libnccl.so.2}
if [ ! -f "$src/shim.c" ]; then echo "skipped: the shim's source is not at $src (set NCCL_BUILTIN_SRC)"; exit 77; fi
if [ ! -f "$lib" ]; then echo "skipped: no $lib (the CUDA toolkit's NCCL; set NCCL_LIB)"; exit 77; fi
if ! command -v nm >/dev/null; then echo "skipped: nm is missing (binutils)"; exit 77; fi
if ! make -s -C "$src" BUILD="$out" TABLE=ncclNetSocket NCCL_LIB="$lib"; then
  echo "skipped: the shim did not build against $lib (a stripped libnccl.so.2 has no ncclNetSocket symbol)"
  exit 77
fi
NCCL_SOCKET_IFNAME=lo exec "$weft" conformance --plugin "$out/libnccl-net-ncclNetSocket.so" --table 11 "$@"
