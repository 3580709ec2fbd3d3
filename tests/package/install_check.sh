#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Debian package installed the way a cluster image gets it, into a clean Debian 12 root (debootstrap, minbase,
# cached under build/package-root/base; every run starts from a fresh copy), then checked inside it:
#   - lintian passes the package (errors and warnings fail);
#   - `weft info` lists the devices;
#   - a two-process transfer through the installed plugin, loaded by name as NCCL loads it: NCCL_NET_PLUGIN=weft and
#     no LD_LIBRARY_PATH (the only copy of the library in the root is the package's, in the multiarch folder);
#   - `weft conformance --quick` passes (the plugin again by NCCL_NET_PLUGIN alone);
#   - the man page and docs are there; purging the package leaves none of its files behind.
# Where debootstrap cannot make the root (no way to the mirror), it says why and installs with `dpkg --root` into
# an empty root instead (WEFT_INSTALL_CHECK=prefix forces that way). There the loader's search by name is checked
# the way the loader does it: Debian's loader configuration in the root, `ldconfig -r` builds the root's
# ld.so.cache, and that cache must resolve libnccl-net-weft.so (and the tuner and profiler) to the package's files;
# the transfer and conformance then run on the host with the loader pointed into the root (LD_LIBRARY_PATH), which
# proves the installed files work, and are named so: they do not count as loading by name.
# usage: tests/package/install_check.sh [DEB]   (default: scripts/package.sh --no-build makes it)
# Exit 77 (skipped) without root; 1 on a failed check, naming it. Every step is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (debootstrap, chroot)"; exit 77; fi
deb=${1:-$(scripts/package.sh --no-build)}
[ -f "$deb" ] || { echo "FAIL: no package at '$deb'"; exit 1; }
deb=$(readlink -f "$deb")
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
top=$PWD/build/package-root
base=$top/base run=$top/run
mkdir -p "$top"
mode=${WEFT_INSTALL_CHECK:-root}
if [ "$mode" = root ] && ! command -v debootstrap >/dev/null; then
  timeout 300 apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
    { timeout 300 apt-get update -qq >/dev/null 2>&1 && timeout 300 apt-get install -y -qq debootstrap >/dev/null; } ||
    { echo "install_check: debootstrap cannot be installed here: the dpkg --root way instead"; mode=prefix; }
fi
mirror=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}
if [ "$mode" = root ] && [ ! -f "$base/.weft-complete" ]; then
  rm -rf "$base"
  echo "install_check: debootstrap bookworm (minbase) from $mirror into $base (cached for later runs)"
  if ! timeout 1200 debootstrap --variant=minbase bookworm "$base" "$mirror" > "$top/debootstrap.log" 2>&1; then
    echo "install_check: debootstrap could not make a Debian 12 root (last lines of $top/debootstrap.log):"
    tail -5 "$top/debootstrap.log"
    echo "install_check: the dpkg --root way instead"
    rm -rf "$base"
    mode=prefix
  else
    touch "$base/.weft-complete"
  fi
fi

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
rm -rf "$run"
clean_env=(/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root)
if [ "$mode" = root ]; then
  cp -a "$base" "$run"
  for m in proc sys dev; do
    mount --bind "/$m" "$run/$m"
    mounted+=("$run/$m")
  done
  cp /etc/resolv.conf "$run/etc/resolv.conf" 2>/dev/null || true
  cp "$deb" "$run/tmp/weft.deb"
  # In the root: a clean environment, as on a node (no LD_LIBRARY_PATH, no WEFT_* of the caller's).
  in_root() { timeout "$1" chroot "$run" "${clean_env[@]}" "${@:2}"; }
  install_cmd=(in_root 600 sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends /tmp/weft.deb')
  list_cmd=(in_root 60 dpkg -L weft)
  purge_cmd=(in_root 300 apt-get purge -y -qq weft)
  echo "install_check: $(basename "$deb") into a clean Debian 12 root"
else
  mkdir -p "$run/var/lib/dpkg/info" "$run/var/lib/dpkg/updates"
  touch "$run/var/lib/dpkg/status"
  # On the host, the loader pointed at the root's library folder, and the root's weft first on the PATH.
  in_root() {
    timeout "$1" "${clean_env[@]}" PATH="$run/usr/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      LD_LIBRARY_PATH="$run/usr/lib/$multiarch" "${@:2}"
  }
  install_cmd=(timeout 120 dpkg --root="$run" --force-depends --force-script-chrootless -i "$deb")
  list_cmd=(dpkg --root="$run" -L weft)
  purge_cmd=(timeout 120 dpkg --root="$run" --force-script-chrootless --purge weft)
  echo "install_check: $(basename "$deb") into an empty root with dpkg --root (not a Debian root: see above)"
fi
fails=0
check() {  # check NAME COMMAND...: runs it, says ok or FAIL with its last lines
  local name=$1 out rc=0
  shift
  out=$("$@" 2>&1) || rc=$?
  if [ "$rc" -eq 0 ]; then echo "ok   $name"; else echo "FAIL $name (exit $rc):"; tail -8 <<< "$out"; fails=$((fails + 1)); fi
  printf '%s\n' "$out" > "$top/$name.log"
}

# Debian's own checks of the package (lintian: errors and warnings fail; the plugins' unversioned names are
# overridden in the package, with the reason).
if command -v lintian >/dev/null; then
  check lintian timeout 300 lintian --tag-display-limit 0 --fail-on error,warning "$deb"
fi
check install "${install_cmd[@]}"
"${list_cmd[@]}" > "$top/files.txt" 2>/dev/null || true
check info_lists_devices in_root 60 sh -c 'weft info | grep -A1 "^devices weft offers NCCL" | grep -qE "^ +0: "'
if [ "$mode" = root ]; then
  check only_the_packaged_library in_root 60 sh -c \
    "test \"\$(find / -xdev -name libnccl-net-weft.so | tr '\n' ' ')\" = '/usr/lib/$multiarch/libnccl-net-weft.so '"
fi
if [ "$mode" = prefix ]; then
  # The root's loader configuration as Debian's libc-bin ships it (this host is Debian 12 too), its cache made by
  # ldconfig -r, and each plugin's name resolved through that cache to the package's file in the multiarch folder.
  loads_by_name() {
    mkdir -p "$run/etc/ld.so.conf.d" || return 1
    cp /etc/ld.so.conf "$run/etc/" && cp /etc/ld.so.conf.d/*.conf "$run/etc/ld.so.conf.d/" || return 1
    ldconfig -r "$run" || return 1
    local cache n where
    cache=$(ldconfig -p -C "$run/etc/ld.so.cache") || return 1
    for n in libnccl-net-weft.so libnccl-tuner-weft.so libnccl-profiler-weft.so; do
      where=$(awk -v n="$n" '$1 == n {print $NF; exit}' <<< "$cache")
      echo "$n => ${where:-(not in the ld.so.cache of the root)}"
      [ "$where" = "/usr/lib/$multiarch/$n" ] || return 1
    done
  }
  check loads_by_name loads_by_name
  by=loader_pointed_into_root
else
  by=by_name
fi
check "transfer_$by" in_root 300 env NCCL_NET_PLUGIN=weft WEFT_IFACE=lo \
  weft bench --no-raw --patterns lat,bw --rounds 1 --quick
check "conformance_quick_$by" in_root 900 env NCCL_NET_PLUGIN=weft WEFT_IFACE=lo weft conformance --quick
check man_and_docs test -f "$run/usr/share/man/man1/weft.1.gz" -a -f "$run/usr/share/doc/weft/copyright" \
  -a -f "$run/usr/share/doc/weft/docs/variables.md" -a -f "$run/usr/lib/$multiarch/libnccl-tuner-weft.so"
check purge "${purge_cmd[@]}"
left=()
while read -r f; do
  [ "$f" = /. ] && continue
  # Folders the package shares with the system stay; its own files and its own folders must go.
  if [ -e "$run$f" ] && { [ ! -d "$run$f" ] || [[ $f == /usr/share/doc/weft* ]]; }; then left+=("$f"); fi
done < "$top/files.txt"
if [ "$(wc -l < "$top/files.txt")" -lt 10 ]; then
  echo "FAIL purge_leaves_nothing: dpkg -L weft listed $(wc -l < "$top/files.txt") entries"; fails=$((fails + 1))
elif [ ${#left[@]} -gt 0 ]; then
  echo "FAIL purge_leaves_nothing: ${left[*]}"; fails=$((fails + 1))
else
  echo "ok   purge_leaves_nothing ($(wc -l < "$top/files.txt") entries gone)"
fi
echo "install_check: $fails failed ($mode)"
[ "$fails" -eq 0 ]
