#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds libfabric 2.x, what EFA users and newer distributions run, from Debian's source package into a prefix,
# beside Debian 12's own 1.17: tests/CMakeLists.txt runs the libfabric entries on it too (ctest label
# libfabric2), and -DWEFT_LIBFABRIC_PREFIX=PREFIX builds weft against it.
#
#   scripts/libfabric2.sh [--version 2.1.0] [--suite trixie] [--link build/libfabric-2] [--check]
#
# The upstream tarball comes from Debian's archive (the suite's Sources index, read through a private apt list;
# its SHA256 is checked), is built with the providers weft uses (tcp, rxm, shm, sockets, udp, rxd; verbs and efa
# against rdma-core), and installed in a cache folder named by version and configuration
# (${WEFT_CACHE_DIR:-~/.cache/weft}/libfabric-VERSION-HASH); build/libfabric-2 links to it. A second run finds it
# and does nothing. --check: exit 0 when the cached build is there, 1 when not, building nothing.
# Prints the prefix last. Exit: 0 built or cached; 1 failed (the log named); 3 cannot here (what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
version=2.1.0 suite=trixie link="$repo/build/libfabric-2" check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --version) version=${2:?}; shift 2 ;;
    --suite) suite=${2:?}; shift 2 ;;
    --link) link=${2:?}; shift 2 ;;
    --check) check=1; shift ;;
    *) echo "libfabric2.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
case "$version" in 2.*) ;; *) echo "libfabric2.sh: --version wants a 2.x version, not $version" >&2; exit 2 ;; esac
# Providers: what weft selects (WEFT_PROVIDER) and the suite runs, plus efa and verbs for the discovery checks.
# CUDA memory (FI_HMEM_CUDA) needs nvml.h as well as the toolkit: on when both are found (dlopen at run time).
flags=(--disable-static --enable-tcp=yes --enable-rxm=yes --enable-shm=yes --enable-sockets=yes --enable-udp=yes
       --enable-rxd=yes --enable-verbs=auto --enable-efa=auto --enable-psm2=no --enable-psm3=no --enable-usnic=no
       --enable-opx=no --enable-cxi=no --enable-ucx=no --enable-lpp=no --enable-mrail=no --enable-lnx=no
       --enable-perf=no --enable-trace=no --enable-profile=no --enable-hook_debug=no --enable-hook_hmem=no
       --enable-dmabuf_peer_mem=no)
# The toolkit here has no nvml.h: it comes from Debian's libnvidia-ml-dev (non-free), downloaded, not installed.
cache=${WEFT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/weft}
cuda=${CUDA_HOME:-/usr/local/cuda}
nvml_inc=""
fetch_nvml() {  # nvml.h into $cache/nvml/include, from bookworm's non-free libnvidia-ml-dev
  local w="$cache/nvml" deb
  [ -f "$w/include/nvml.h" ] && return 0
  mkdir -p "$w/lists/partial" && echo "deb http://deb.debian.org/debian bookworm non-free" >"$w/sources.list"
  local o=(-o Dir::Etc::SourceList="$w/sources.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$w/lists"
           -o APT::Get::List-Cleanup=0 -o Debug::NoLocking=1)
  timeout 300 apt-get "${o[@]}" update >"$w/log" 2>&1 && (cd "$w" && timeout 300 apt-get "${o[@]}" download libnvidia-ml-dev) \
    >>"$w/log" 2>&1 || return 1
  deb=$(ls "$w"/libnvidia-ml-dev_*.deb | head -1) && rm -rf "$w/x" && dpkg-deb -x "$deb" "$w/x" &&
    mkdir -p "$w/include" && cp "$w/x/usr/include/nvml.h" "$w/include/" && rm -rf "$w/x" "$deb"
}
if [ -f "$cuda/include/cuda_runtime.h" ] && [ "${WEFT_LIBFABRIC2_CUDA:-1}" = 1 ]; then
  if [ -f "$cuda/include/nvml.h" ]; then nvml_inc="$cuda/include"
  elif [ $check = 0 ] && fetch_nvml; then nvml_inc="$cache/nvml/include"
  elif [ -f "$cache/nvml/include/nvml.h" ]; then nvml_inc="$cache/nvml/include"
  else echo "libfabric2.sh: no nvml.h (libnvidia-ml-dev): libfabric without CUDA memory" >&2
  fi
fi
[ -n "$nvml_inc" ] && flags+=(--with-cuda="$cuda" --enable-cuda-dlopen)
hash=$(printf '%s\n' "$version" "${flags[@]}" | sha256sum | cut -c1-12)
prefix="$cache/libfabric-$version-$hash"
done_mark="$prefix/.weft-built"
if [ -f "$done_mark" ] && [ -e "$prefix/lib/libfabric.so.1" ]; then
  [ $check = 1 ] && { echo "$prefix"; exit 0; }
  mkdir -p "$(dirname "$link")" && ln -sfn "$prefix" "$link"
  echo "libfabric2.sh: libfabric $version already built ($(cat "$done_mark"))" >&2
  echo "$prefix"
  exit 0
fi
[ $check = 1 ] && exit 1

missing=()
for tool in autoconf automake libtoolize make cc apt-get sha256sum xz; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "libfabric2.sh: cannot build libfabric $version here; missing: ${missing[*]} (scripts/setup.sh installs them)" >&2
  exit 3
fi
work="$cache/libfabric-$version-src"
mkdir -p "$work/lists/partial" "$cache"
log="$work/build.log"
: >"$log"
# Debian's Sources index for the suite, in a private apt state (the system's sources are not touched).
echo "deb-src http://deb.debian.org/debian $suite main" >"$work/sources.list"
apt=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$work/lists"
     -o APT::Get::List-Cleanup=0 -o Debug::NoLocking=1)
tarball="$work/libfabric_$version.orig.tar.xz"
if [ ! -f "$tarball" ]; then
  echo "libfabric2.sh: fetching libfabric $version from Debian's $suite sources" >&2
  timeout 300 apt-get "${apt[@]}" update >>"$log" 2>&1 || { echo "libfabric2.sh: apt-get update failed (log: $log)" >&2; exit 1; }
  line=$(timeout 60 apt-get "${apt[@]}" source --print-uris "libfabric" 2>>"$log" | grep "libfabric_$version.orig.tar.xz" || true)
  if [ -z "$line" ]; then
    echo "libfabric2.sh: Debian's $suite has no libfabric $version source (log: $log)" >&2
    exit 1
  fi
  url=$(echo "$line" | awk '{print $1}' | tr -d "'")
  sum=$(echo "$line" | awk '{print $4}')
  case "$sum" in SHA256:*) ;; *) echo "libfabric2.sh: no SHA256 for $url" >&2; exit 1 ;; esac
  timeout 300 /usr/lib/apt/apt-helper download-file "$url" "$tarball.part" "$sum" >>"$log" 2>&1 ||
    { echo "libfabric2.sh: download of $url failed (log: $log)" >&2; rm -f "$tarball.part"; exit 1; }
  mv "$tarball.part" "$tarball"
fi
src="$work/libfabric-$version"
rm -rf "$src" "$prefix"
tar -xJf "$tarball" -C "$work"
start=$(date +%s)
echo "libfabric2.sh: building libfabric $version into $prefix (log: $log)" >&2
(
  cd "$src"
  [ -x configure ] || timeout 300 ./autogen.sh
  CPPFLAGS="${nvml_inc:+-I$nvml_inc}" timeout 300 ./configure --prefix="$prefix" "${flags[@]}"
  timeout 1200 make -j"$(nproc)"
  make install
) >>"$log" 2>&1 || { echo "libfabric2.sh: the build failed; last lines of $log:" >&2; tail -15 "$log" >&2; exit 1; }
providers=$(grep "Built-in providers" "$log" | tail -1 | sed 's/.*providers:[[:space:]]*//')
cudaon=no; grep -q -- "--with-cuda" <<<"${flags[*]}" && cudaon=yes
echo "version $version, providers: $providers, CUDA memory: $cudaon, built $(date -u +%F) in $(( $(date +%s) - start )) s" \
  >"$done_mark"
rm -rf "$src"
mkdir -p "$(dirname "$link")" && ln -sfn "$prefix" "$link"
echo "libfabric2.sh: $(cat "$done_mark")" >&2
echo "$prefix"
