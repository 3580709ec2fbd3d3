#!/usr/bin/env bash
# Installs the Debian packages weft needs to build and test (a fresh Debian 12 machine has none of them).
# Does nothing when everything is present; needs root (or sudo) otherwise.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libfabric-dev libfabric-bin libhwloc-dev libfmt-dev catch2
      libibverbs-dev rdma-core libbenchmark-dev nlohmann-json3-dev iproute2 binutils python3
      # real verbs on soft-RoCE in a QEMU guest (tests/rxe): the emulator, a kernel with rdma_rxe, the guest's tools
      qemu-system-x86 linux-image-amd64 busybox-static kmod cpio ibverbs-utils ibverbs-providers)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
