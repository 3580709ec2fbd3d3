// SPDX-License-Identifier: Apache-2.0
// Rails: one NCCL device spanning several NICs. Which NICs form a device is decided here, from WEFT_RAILS or
// from the machine's layout; pure functions over names and a topology, so the rules are unit-tested on fixtures.
#pragma once

#include "weft/common/topology.h"
#include "weft/transport/net.h"

#include <map>
#include <string>
#include <vector>

namespace weft::fabric {

// NICs per device: arrays hold 8 (NCCL's v12 vDevices); how many a device may have depends on the table NCCL uses
// (weft::maxDevsPerNic(): 4 before v12).
constexpr int kMaxRails = kMaxDevsPerNic;

struct RailSpec {
  enum class Mode { kAuto, kOff, kExplicit } mode = Mode::kAuto;
  std::vector<std::vector<std::string>> groups;  // kExplicit: NIC names per device
};

// WEFT_RAILS: "auto" (or empty), "off", or groups such as "eth0+eth1,eth2+eth3" (each group one device, NICs
// joined by '+'; NICs not named stay devices of their own). False and `error` for malformed text.
bool parseRailSpec(const std::string& text, RailSpec* out, std::string* error);

// WEFT_NIC_RAILS: "NIC:rail[:plane],..." (exact NIC names; rail and plane 0-32767). False and `error` for
// malformed text or a NIC named twice.
struct NicRail {
  int rail = -1, plane = -1;
};
bool parseNicRails(const std::string& text, std::map<std::string, NicRail>* out, std::string* error);

struct NicInfo {
  std::string name;
  std::string pciPath;  // sysfs path ending in the PCI bus id (empty: virtual NIC)
  int speedMbps = 0;
};

// Devices made of `nics` (indices into nics; every NIC exactly once, in discovery order of each group's first
// NIC). kAuto reads the machine's layout (hwloc, weft/common/topology.h): NICs of equal speed whose nearest GPUs
// are the same, below the same PCIe switch or root port as them (PIX or PXB), are divided among those GPUs, each
// GPU's share one device when it is two or more (at most maxDevsPerNic(); the rest stay alone). A DGX-class
// server, one NIC a GPU, keeps its NICs apart; a p5-class one, four EFA NICs a GPU, gets one device of four per
// GPU. NICs the topology does not place, or with no GPU under their root port, stay alone; a NIC with a PCI path
// that hwloc does not see is said in `warnings`. Problems with an explicit spec (unknown or repeated names, too
// many NICs) are appended to `warnings` and the offending group is left unfused.
std::vector<std::vector<int>> groupRails(const std::vector<NicInfo>& nics, const topo::Topology& topology,
                                         const RailSpec& spec, std::vector<std::string>* warnings);

}  // namespace weft::fabric
