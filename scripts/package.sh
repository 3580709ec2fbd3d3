#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds weft (scripts/build.sh) and packs it as a Debian package: build/weft_<version>_<arch>.deb.
#   - libnccl-net-weft.so, libnccl-tuner-weft.so, libnccl-profiler-weft.so in the multiarch library folder, where the
#     loader's default path finds them (NCCL opens libnccl-net-<NCCL_NET_PLUGIN>.so by name);
#   - weft in /usr/bin, its man page (from `weft --help`), the docs in /usr/share/doc/weft;
#   - Depends read from what the binaries link (dpkg-shlibdeps: libfabric, hwloc, libc, libstdc++); Recommends the
#     rdma-core libraries weft opens at run time (libibverbs1, ibverbs-providers);
#   - the version: the project's (CMakeLists.txt) and the commit: 0.1.0+git<commits>.<hash>[.dirty].
# usage: scripts/package.sh [--no-build]   (--no-build: pack what build/ holds)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = --no-build ] || scripts/build.sh >/dev/null
for t in dpkg-deb dpkg-shlibdeps dpkg-architecture strip gzip; do
  command -v "$t" >/dev/null || { echo "package.sh: $t is missing (apt-get install dpkg-dev binutils)" >&2; exit 3; }
done
[ -x build/bin/weft ] || { echo "package.sh: build/bin/weft is missing: build first" >&2; exit 3; }

base=$(sed -n 's/^project(weft VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
version="$base"
if git rev-parse --git-dir >/dev/null 2>&1; then
  version="$base+git$(git rev-list --count HEAD).$(git rev-parse --short=7 HEAD)"
  git diff --quiet HEAD -- 2>/dev/null || version="$version.dirty"
fi
# The maintainer: DEBFULLNAME and DEBEMAIL as Debian's tools read them, else the commit's author.
maintainer="${DEBFULLNAME:-$(git log -1 --format=%an 2>/dev/null || echo weft developers)}"
maintainer="$maintainer <${DEBEMAIL:-$(git log -1 --format=%ae 2>/dev/null || echo weft@localhost)}>"
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
stage=build/package/root
rm -rf build/package
mkdir -p "$stage/DEBIAN" "$stage/usr/lib/$multiarch" "$stage/usr/bin" "$stage/usr/share/man/man1" \
  "$stage/usr/share/doc/weft/docs" "$stage/usr/share/lintian/overrides"

# The files, from CMake's install rule (its RPATH handling), then moved into the multiarch folder.
cmake --install build --prefix "$PWD/build/package/install" >/dev/null
install -m 0644 build/package/install/lib/libnccl-{net,tuner,profiler}-weft.so "$stage/usr/lib/$multiarch/"
install -m 0755 build/package/install/bin/weft "$stage/usr/bin/weft"
strip --strip-unneeded "$stage/usr/lib/$multiarch/"*.so "$stage/usr/bin/weft"

# The man page: weft --help (its usage text) under the sections man(7) expects.
{
  echo ".TH WEFT 1 \"$(date -u +%Y-%m-%d)\" \"weft $version\" \"User Commands\""
  echo ".SH NAME"
  echo "weft \\- NCCL network, tuner and profiler plugin, and its harness"
  echo ".SH SYNOPSIS"
  echo ".B weft"
  echo "\\fIcommand\\fR [\\fIoptions\\fR]"
  echo ".SH DESCRIPTION"
  echo "NCCL_NET_PLUGIN=weft makes NCCL load libnccl-net-weft.so from the library path; the weft command shows the"
  echo "devices weft finds, runs NCCL-faithful conformance checks and benchmarks against any plugin file, and reports"
  echo "and tunes from the profiler's records. Its usage, as \\fBweft --help\\fR prints it:"
  echo ".PP"
  echo ".nf"
  build/bin/weft --help 2>&1 | sed -e 's/\\/\\e/g' -e 's/^\([.'\'']\)/\\\&\1/'
  echo ".fi"
  echo ".SH SEE ALSO"
  echo "/usr/share/doc/weft/README.md, /usr/share/doc/weft/docs/variables.md (every WEFT_* variable)"
} | gzip -9n > "$stage/usr/share/man/man1/weft.1.gz"

install -m 0644 README.md "$stage/usr/share/doc/weft/"
install -m 0644 docs/*.md "$stage/usr/share/doc/weft/docs/"
{
  echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
  echo "Upstream-Name: weft"
  echo
  echo "Files: *"
  first=$(git log --reverse --format=%ad --date=format:%Y 2>/dev/null | sed -n 1p)
  now=$(date -u +%Y)
  echo "Copyright: ${first:-$now}$([ "${first:-$now}" = "$now" ] || echo "-$now") the weft developers"
  echo "License: Apache-2.0"
  echo " On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0."
} > "$stage/usr/share/doc/weft/copyright"

# The changelog Debian policy asks of every package (native: no Debian revision), this build's commit.
{
  echo "weft ($version) unstable; urgency=medium"
  echo
  echo "  * Built from commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo '(no git)')."
  echo
  echo " -- $maintainer  $(date -u -R)"
} | gzip -9n > "$stage/usr/share/doc/weft/changelog.gz"
# The plugins are opened by name with dlopen (NCCL's libnccl-net-<name>.so), never linked: no SONAME versions.
cat > "$stage/usr/share/lintian/overrides/weft" <<'EOF'
# NCCL opens its plugins by file name (libnccl-net-weft.so and the like) with dlopen; nothing links them.
weft: package-name-doesnt-match-sonames *
weft: shared-library-lacks-version *
EOF
chmod 0644 "$stage/usr/share/lintian/overrides/weft"

# Depends: what the binaries link, as dpkg-shlibdeps reads it (it wants a debian/control to stand in).
mkdir -p build/package/shlibs/debian
printf 'Source: weft\n\nPackage: weft\nArchitecture: any\n' > build/package/shlibs/debian/control
depends=$(cd build/package/shlibs && dpkg-shlibdeps -O --warnings=0 \
  "$OLDPWD/$stage/usr/bin/weft" "$OLDPWD/$stage/usr/lib/$multiarch/"*.so | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "package.sh: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<EOF
Package: weft
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Section: libs
Priority: optional
Depends: $depends
Recommends: libibverbs1, ibverbs-providers
Suggests: libnccl2
Homepage: https://github.com/weft-nccl/weft
Description: NCCL network, tuner and profiler plugin (ibverbs, libfabric, TCP)
 NCCL_NET_PLUGIN=weft makes NCCL move its data through libnccl-net-weft.so, over
 native ibverbs (InfiniBand, RoCE), libfabric (EFA, verbs;ofi_rxm, tcp;ofi_rxm,
 shm) or weft's own TCP sockets. The package also holds the tuner and profiler
 plugins (per-collective timing) and the weft command (devices, conformance
 checks, benchmarks, reports). libibverbs is opened at run time, when present.
EOF
(cd "$stage" && find usr -type f -exec md5sum {} + | sort -k2) > "$stage/DEBIAN/md5sums"
# Shared objects in the library folder: the loader's cache is refreshed after install and removal.
echo "activate-noawait ldconfig" > "$stage/DEBIAN/triggers"
out="build/weft_${version}_${arch}.deb"
rm -f build/weft_*_"$arch".deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$out" >/dev/null
echo "$out"
