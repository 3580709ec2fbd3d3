// SPDX-License-Identifier: Apache-2.0
// Rails: one NCCL device spanning several NICs. Which NICs form a device is decided here, from WEFT_RAILS or
// from PCI locality; pure functions over names and sysfs paths, so the rules are unit-tested without hardware.
#pragma once

#include "weft/common/sysfs.h"
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

// The PCI bus ids from the root port down to the device: "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
// gives {"0000:00:01.0", "0000:01:00.0"}.
std::vector<std::string> pciChain(const std::string& sysfsPath);

// Devices made of `nics` (indices into nics; every NIC exactly once, in discovery order of each group's first
// NIC). kAuto fuses NICs of equal speed that sit below the same PCI root port as a GPU (the layout of
// multi-NIC GPU servers, where NCCL would otherwise see each NIC alone), at most kMaxRails per device.
// Problems with an explicit spec (unknown or repeated names, too many NICs) are appended to `warnings` and
// the offending group is left unfused.
std::vector<std::vector<int>> groupRails(const std::vector<NicInfo>& nics, const std::vector<std::string>& gpuPaths,
                                         const RailSpec& spec, std::vector<std::string>* warnings);

using sysfs::isPciBusId;  // weft/common/sysfs.h

// sysfs paths of the GPUs in this machine (PCI display/3D controllers of NVIDIA or AMD).
std::vector<std::string> findGpuPciPaths();

}  // namespace weft::fabric
