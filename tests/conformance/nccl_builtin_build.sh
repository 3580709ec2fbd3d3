#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds NCCL's own transport TABLE (ncclNetSocket or ncclNetIb, inside the CUDA toolkit's libnccl.so.2) as a net
# plugin file, OUT/libnccl-net-TABLE.so, from tests/conformance/nccl_builtin/shim.cc (the table's offset and
# cudaGetDevice's found with nm). Exit 77, saying why, where an unstripped libnccl.so.2, nm or a C++ compiler is
# missing.
# usage: nccl_builtin_build.sh TABLE OUT
set -uo pipefail
table=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
lib=${NCCL_LIB:-/usr/local/cuda/lib64/libnccl.so.2}
cxx=${CXX:-c++}
if [ ! -f "$lib" ]; then echo "skipped: no $lib (the CUDA toolkit's NCCL; set NCCL_LIB)"; exit 77; fi
if ! command -v nm >/dev/null; then echo "skipped: nm is missing (binutils)"; exit 77; fi
if ! command -v "$cxx" >/dev/null; then echo "skipped: no C++ compiler ($cxx)"; exit 77; fi
syms=$(nm "$lib" 2>/dev/null)
off=$(awk -v t="$table" '$3==t && ($2=="d"||$2=="D"){print "0x"$1; exit}' <<<"$syms")
gd=$(awk '$3=="cudaGetDevice" && ($2=="t"||$2=="T"){print "0x"$1; exit}' <<<"$syms")
if [ -z "$off" ]; then echo "skipped: $lib has no data symbol $table (stripped, or another NCCL)"; exit 77; fi
mkdir -p "$out"
so="$out/libnccl-net-$table.so"
if [ "$so" -nt "$here/nccl_builtin/shim.cc" ] && [ "$so" -nt "$lib" ] && [ "$so" -nt "$0" ]; then exit 0; fi
if ! "$cxx" -std=c++17 -O2 -fPIC -shared -o "$so" "$here/nccl_builtin/shim.cc" -I "$root/include" \
    -DWEFT_TABLE_OFFSET="$off" ${gd:+-DWEFT_GETDEVICE_OFFSET="$gd"} -DWEFT_NCCL_LIB="\"$lib\"" -ldl; then
  echo "skipped: the shim did not build against $lib"
  exit 77
fi
