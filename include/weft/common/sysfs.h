// SPDX-License-Identifier: Apache-2.0
// Host facts read from sysfs, shared by the backends: one line of an attribute, a resolved path, and the link
// state of the NIC an endpoint uses. Every reader takes the sysfs root so tests can give a tree of their own.
#pragma once

#include <sys/socket.h>

#include <string>

namespace weft::sysfs {

// The first line of a sysfs attribute, without its trailing newline and spaces; "" when unreadable.
std::string readLine(const std::string& path);
// The canonical path (symlinks resolved); "" when it does not exist.
std::string realPath(const std::string& path);

// A PCI bus id as sysfs names devices: dddd:bb:dd.f.
bool isPciBusId(const std::string& component);
// NCCL wants a path whose last component is the PCI bus id (docs/nccl-semantics.md §properties): `path` itself
// or its nearest such ancestor (a virtio or usb NIC's device is a child of its PCI function); "" when none.
std::string pciAncestor(std::string path);
// The PCI path of a network interface's device; "" for virtual interfaces (loopback, veth, bridges).
std::string netdevPciPath(const std::string& ifname, const std::string& root = "/sys");
// A network interface's link speed in Mb/s; 10000 (NCCL's own default) where the kernel does not know it
// (loopback, most virtual interfaces).
int netdevSpeedMbps(const std::string& ifname, const std::string& root = "/sys");

// Where the up/down state of the NIC behind a libfabric domain (or a network interface) is read.
struct LinkSource {
  enum class Kind { kNone, kNetdev, kRdmaPort };
  Kind kind = Kind::kNone;
  std::string path;      // operstate, or ports/N/state
  std::string describe;  // for logs: "netdev eth0", "rdmap16s27 port 1", "none: ..."
};
// A network interface of that name: its operstate. Otherwise an RDMA device of that name or with the provider's
// suffix removed (EFA domains are "<device>-rdm" / "-dgrm"): the state of the port the endpoint uses, which is
// the device's only port, or the one whose GID table holds `src` (an IPv4 or IPv6 source address, as
// verbs;ofi_rxm's are), or else port 1 (said in `describe`). kNone when sysfs knows neither.
LinkSource linkSourceFor(const std::string& name, const sockaddr* src, const std::string& root = "/sys");
// Up: operstate "up" or "unknown" (loopback and some virtual interfaces report that), port state ACTIVE. A source
// that cannot be read counts as up (sysfs gone is not a link down).
bool linkUp(const LinkSource& s);

}  // namespace weft::sysfs
