#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages weft needs to build and test (a fresh Debian 12 machine has none of them).
# Does nothing when everything is present; needs root (or sudo) otherwise.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libfabric-dev libfabric-bin libhwloc-dev libfmt-dev catch2
      libibverbs-dev rdma-core libbenchmark-dev nlohmann-json3-dev iproute2 binutils python3
      autoconf automake libtool librdmacm-dev xz-utils  # this line: libfabric 2.x (scripts/libfabric2.sh)
      dpkg-dev debootstrap lintian)  # the Debian package and its install check (scripts/package.sh, tests/package)
# Real verbs on soft-RoCE in a QEMU guest (tests/rxe): the emulator, a kernel with rdma_rxe, the guest's tools.
# Best effort: where they cannot be installed, the build and every other test still run and rxe.guest is skipped.
guest=(qemu-system-x86 linux-image-amd64 busybox-static kmod cpio ibverbs-utils ibverbs-providers)
absent() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(absent "${pkgs[@]}")
mapfile -t missingGuest < <(absent "${guest[@]}")
if [ ${#missing[@]} -eq 0 ] && [ ${#missingGuest[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#missingGuest[@]} -gt 0 ]; then
  echo "setup: installing ${missingGuest[*]} (for the soft-RoCE guest test)"
  $sudo apt-get install -y -qq --no-install-recommends "${missingGuest[@]}" >/dev/null ||
    echo "setup: could not install ${missingGuest[*]}: the soft-RoCE guest test (rxe.guest) will be skipped"
fi
