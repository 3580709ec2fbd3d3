#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Real ibverbs without an RDMA NIC: boots Debian's kernel under QEMU (TCG emulation; KVM cannot run it on these
# hosts) with soft-RoCE (rdma_rxe) on a virtio NIC, and runs a test script inside the guest, chrooted into this
# host's / (shared read-only over 9p), so host-built binaries and plugin files run unchanged. Two processes on
# the guest's one rxe device talk RoCEv2 through the kernel: correctness, not speed (about 100x below hardware).
#
# Usage: tests/rxe/run_guest.sh SCRIPT OUTDIR [TIMEOUT_S]
#   SCRIPT runs in the guest with cwd OUTDIR (writable, shared with the host); its output lands in
#   OUTDIR/guest-output.txt and its exit code is this script's. Environment variables named RXE_* (and CI) are
#   passed into the guest.
# Exit 77 (skip) when the guest cannot be built here (no root to install packages, no kernel with rdma_rxe).
# Packages (installed when missing and running as root): qemu-system-x86 linux-image-amd64 busybox-static kmod
# cpio rdma-core ibverbs-providers ibverbs-utils.
set -euo pipefail
script=$(realpath "$1")
out=$(realpath -m "$2")
limit=${3:-900}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
# A previous run's outputs go (its step logs, dumps and files), all but the initramfs kept for reuse: a step must
# never read what an earlier run left.
find "$out" -mindepth 1 -maxdepth 1 ! -name 'initramfs*' -exec rm -rf {} +

missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
[ -x /bin/busybox ] || missing+=(busybox-static)
command -v cpio >/dev/null || missing+=(cpio)
command -v depmod >/dev/null || missing+=(kmod)
command -v ibv_devices >/dev/null || missing+=(ibverbs-utils)
ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 || missing+=(ibverbs-providers rdma-core)
ls /boot/vmlinuz-* >/dev/null 2>&1 || missing+=(linux-image-amd64)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "rxe guest: missing ${missing[*]} and cannot install them (not root, or no apt-get): skipped"
    exit 77
  fi
  echo "rxe guest: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }; then
    echo "rxe guest: installing ${missing[*]} failed (no package mirror?): skipped"
    exit 77
  fi
fi
kver=$(ls /lib/modules | sort -V | tail -1)
vmlinuz=/boot/vmlinuz-$kver
if [ ! -f "$vmlinuz" ] || ! find "/lib/modules/$kver" -name 'rdma_rxe.ko*' | grep -q .; then
  echo "rxe guest: no kernel with rdma_rxe under /boot and /lib/modules: skipped"
  exit 77
fi

# ---- initramfs: busybox, the kernel modules rxe and 9p need, and an init that chroots into the host's / ------
work=$out/initramfs
stamp="$kver $(sha1sum "$0" | cut -c1-12)"
if [ ! -f "$work.gz" ] || [ "$(cat "$work.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$work"
  mkdir -p "$work"/{bin,proc,sys,dev,tmp,mnt/out,mnt/host,lib/modules}
  : > "$work/modules.order"
  for m in virtio_pci virtio_net 9pnet_virtio 9p crc32_generic ib_uverbs rdma_ucm rdma_rxe veth sch_netem; do
    modprobe -S "$kver" -D "$m" | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    mkdir -p "$work$(dirname "$ko")"
    cp "$ko" "$work$ko"
    echo "$ko" >> "$work/modules.order"
  done
  cp /bin/busybox "$work/bin/busybox"
  for a in sh mount umount insmod ip sleep cat chroot poweroff sync tr sed mkdir echo cut; do ln -s busybox "$work/bin/$a"; done
  cat > "$work/init" <<'INIT'
#!/bin/sh
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for ko in $(cat /modules.order); do insmod "$ko" 2>/dev/null; done
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p"; }
OUT=$(arg weft_out)
ip link set lo up; ip link set eth0 up; ip addr add 10.0.2.15/24 dev eth0
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /mnt/out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro host /mnt/host
H=/mnt/host
mount --bind /proc $H/proc; mount --bind /sys $H/sys; mount --bind /dev $H/dev
# /tmp becomes a fresh tmpfs; the trees of the host's under /tmp that the test needs (weft_keep, comma-separated) are
# bound back in
KEEP=$(arg weft_keep | tr , ' ')
i=0; for k in $KEEP; do mkdir -p /mnt/keep$i && mount --bind "$H$k" /mnt/keep$i; i=$((i + 1)); done
mount -t tmpfs shm $H/dev/shm; mount -t tmpfs tmp $H/tmp; mount -t tmpfs run $H/run
i=0; for k in $KEEP; do mkdir -p "$H$k" && mount --bind /mnt/keep$i "$H$k"; i=$((i + 1)); done
mkdir -p "$H$OUT" 2>/dev/null; mount --bind /mnt/out "$H$OUT"
chroot $H rdma link add rxe0 type rxe netdev eth0 || echo "WEFT_GUEST_NO_RXE"
# RXE_NICS=2: a second NIC and soft-RoCE device (rxe1 on eth1, 10.0.3.15): two rails, each looping back to itself
if [ "$(arg weft_nics)" = 2 ]; then
  ip link set eth1 up; ip addr add 10.0.3.15/24 dev eth1
  chroot $H rdma link add rxe1 type rxe netdev eth1 || echo "WEFT_GUEST_NO_RXE1"
fi
echo "WEFT_GUEST_BOOTED uptime=$(cut -d' ' -f1 /proc/uptime)"
chroot $H /bin/sh -c "cd '$OUT' && ./guest-entry.sh" > /mnt/out/guest-output.txt 2>&1
echo $? > /mnt/out/exit-code
sync
echo "WEFT_GUEST_DONE rc=$(cat /mnt/out/exit-code) uptime=$(cut -d' ' -f1 /proc/uptime)"
poweroff -f
INIT
  chmod +x "$work/init"
  (cd "$work" && find . | cpio -o -H newc --quiet | gzip -1) > "$work.gz"
  echo "$stamp" > "$work.stamp"
  rm -rf "$work"
fi

# ---- the entry point the guest runs: this host's environment for the test, then the script -------------------
{
  echo '#!/bin/sh'
  echo "export PATH='/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'"
  env | grep -E '^(RXE_[A-Z_]*|CI)=' | sed "s/'/'\\\\''/g; s/=\(.*\)/='\1'/; s/^/export /" || true
  echo "exec '$script'"
} > "$out/guest-entry.sh"
chmod +x "$out/guest-entry.sh"

# The guest's /tmp is its own: a script (and the build next to it) and libfabric 2.x's folder (RXE_FABRIC_LIB, under
# a WEFT_CACHE_DIR there) under the host's /tmp are bound back in.
keep=""
for p in "$script" "${RXE_FABRIC_LIB:-}"; do
  case "$p" in
    /tmp/?*)
      top=/tmp/$(echo "${p#/tmp/}" | cut -d/ -f1)
      case ",$keep," in *",$top,"*) ;; *) keep=${keep:+$keep,}$top ;; esac ;;
  esac
done

nic2=()
nics=""
if [ "${RXE_NICS:-1}" = 2 ]; then
  nic2=(-netdev user,id=n1,net=10.0.3.0/24 -device virtio-net-pci,netdev=n1)
  nics=" weft_nics=2"
fi

start=$(date +%s.%N)
timeout "$limit" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -M q35 -m "${RXE_GUEST_MEM:-4096}" -smp 2 \
  -kernel "$vmlinuz" -initrd "$work.gz" \
  -append "console=ttyS0 rdinit=/init quiet loglevel=3 panic=-1 mitigations=off weft_out=$out${keep:+ weft_keep=$keep}$nics" \
  -nographic -no-reboot -nodefaults -serial stdio -monitor none \
  -netdev user,id=n0 -device virtio-net-pci,netdev=n0 ${nic2[@]+"${nic2[@]}"} \
  -virtfs local,path="$out",mount_tag=out,security_model=none,id=out \
  -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap,id=host \
  < /dev/null > "$out/console.log" 2>&1 || true
end=$(date +%s.%N)
grep -E "WEFT_GUEST_(BOOTED|DONE)" "$out/console.log" || true
echo "rxe guest: QEMU ran $(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}') s"
[ -f "$out/guest-output.txt" ] && cat "$out/guest-output.txt"
if [ ! -f "$out/exit-code" ]; then
  echo "rxe guest: the guest did not finish within ${limit} s (console: $out/console.log)"
  tail -20 "$out/console.log"
  exit 1
fi
exit "$(cat "$out/exit-code")"
