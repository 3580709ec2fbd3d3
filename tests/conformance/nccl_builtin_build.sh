#!/usr/bin/env bash
# Builds NCCL's own transport TABLE (ncclNetSocket or ncclNetIb, inside the CUDA toolkit's libnccl.so.2) as a net
# plugin file with ../shared/tools/nccl-builtin-net, into OUT/libnccl-net-TABLE.so.
# Exit 77, saying why, where the shim's source, an unstripped libnccl.so.2 or nm is missing.
# usage: nccl_builtin_build.sh TABLE OUT
set -uo pipefail
table=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
src=${NCCL_BUILTIN_SRC:-$here/../../../shared/tools/nccl-builtin-net}
lib=${NCCL_LIB:-/usr/local/cuda/lib64/libnccl.so.2}
if [ ! -f "$src/shim.c" ]; then echo "skipped: the shim's source is not at $src (set NCCL_BUILTIN_SRC)"; exit 77; fi
if [ ! -f "$lib" ]; then echo "skipped: no $lib (the CUDA toolkit's NCCL; set NCCL_LIB)"; exit 77; fi
if ! command -v nm >/dev/null; then echo "skipped: nm is missing (binutils)"; exit 77; fi
if ! make -s -C "$src" BUILD="$out" TABLE="$table" NCCL_LIB="$lib"; then
  echo "skipped: the shim did not build against $lib (a stripped libnccl.so.2 has no $table symbol)"
  exit 77
fi
