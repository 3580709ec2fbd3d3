// SPDX-License-Identifier: Apache-2.0
// The machine's layout, read once through hwloc: NUMA nodes and their cores, the PCIe tree (host bridges, root
// ports, switches), GPUs and NICs, and how far apart any two PCI devices are. The model is plain data, so every
// decision made from it (rails, NUMA placement, the map `weft info` prints) is a pure function tested on fixtures
// (tests/fixtures/topology/*.xml). hwloc itself is only seen by topology.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::topo {

// How far apart two PCI devices are, nearest first, in nvidia-smi's and NCCL's words.
enum class Path : int {
  kSwitch = 0,      // PIX: below the same PCIe switch (or root port), each on one of its ports
  kPciTree = 1,     // PXB: below the same root port, through more than one switch
  kHostBridge = 2,  // PHB: through the CPU's PCIe host bridge
  kNuma = 3,        // NODE: between host bridges of one NUMA node
  kSystem = 4,      // SYS: across the link between NUMA nodes (sockets)
  kUnknown = 5,     // one of them has no place in the tree
};
const char* pathName(Path p);     // "PIX", "PXB", "PHB", "NODE", "SYS", "?"
const char* pathMeaning(Path p);  // "same PCIe switch", ...

struct NumaNode {
  int os = -1;       // the kernel's node number
  int package = -1;  // the socket it belongs to (-1: unknown)
  std::vector<int> cpus;  // the kernel's cpu numbers local to it
  uint64_t bytes = 0;
};

struct PciDevice {
  std::string busId;  // dddd:bb:dd.f
  unsigned classId = 0, vendorId = 0, deviceId = 0;
  float linkGBps = 0;
  std::string model;  // hwloc's PCIDevice info, where it has one
  // The PCIe units above it, from its host bridge down: a unit is a host bridge, a root port, or a PCIe switch
  // (its upstream port and all its downstream ports), as ids local to this topology.
  std::vector<int> units;
  int numa = -1;     // the NUMA node local to it (-1: it is local to several, or to none)
  int package = -1;  // its socket (-1: unknown)
  std::vector<int> cpus;  // the cpus local to it (hwloc's cpuset of its nearest non-I/O ancestor)
};

struct Gpu {
  int pci = -1;      // index into pci
  std::string name;  // "GPU<n>", n counting GPUs in bus id order (NCCL's and nvidia-smi's order)
};

struct Nic {
  int pci = -1;
  std::string netdev;  // network interface ("" when it has none, as EFA)
  std::string rdma;    // RDMA device ("" when it has none)
  std::string name() const { return rdma.empty() ? netdev : rdma; }
};

class Topology {
 public:
  // From an hwloc XML file (`lstopo --of xml`, or a fixture). A file hwloc cannot read gives an empty topology
  // whose error() says why.
  static Topology fromXml(const std::string& path);
  // This machine, loaded once (thread-safe): from WEFT_TOPOLOGY_XML where set (hwloc's HWLOC_XMLFILE works too),
  // else from the running system. Never fails: on trouble it is empty, error() says why, and weft behaves as it
  // did without a topology (a warning in the log, once).
  static const Topology& host();

  bool empty() const { return pci_.empty() && numa_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& source() const { return source_; }  // "this machine" or the file's path
  // Whether the topology describes the running system, so that memory and threads may be bound by it (a file
  // from another machine only informs decisions and the map).
  bool thisSystem() const { return thisSystem_; }
  int packages() const { return packages_; }
  int cpuCount() const { return cpuCount_; }

  const std::vector<NumaNode>& numa() const { return numa_; }
  const std::vector<PciDevice>& pci() const { return pci_; }
  const std::vector<Gpu>& gpus() const { return gpus_; }
  const std::vector<Nic>& nics() const { return nics_; }
  const NumaNode* numaNode(int os) const;

  // The PCI device of that bus id (any case; "0000:18:00.0" or "18:00.0"); -1 when hwloc does not see it.
  int pciIndex(const std::string& busId) const;
  // The NIC of that network interface or RDMA device name; -1 when hwloc does not see it.
  int nicIndex(const std::string& name) const;
  // The device a NIC is: by its sysfs PCI path's bus id where it has one, else by name. -1 when neither is known.
  int pciOfNic(const std::string& name, const std::string& pciPath) const;

  Path path(int pciA, int pciB) const;
  // The GPUs nearest a PCI device, and the path to them (kUnknown and none when there are no GPUs).
  std::vector<int> nearestGpus(int pci, Path* path) const;

  // The map `weft info` prints: NUMA nodes with their cpus, GPUs and NICs with their NUMA node, and the path
  // from every GPU to every NIC.
  std::string map() const;

  // Made by hand (unit tests of the rules built on it).
  Topology() = default;
  std::vector<NumaNode>& mutableNuma() { return numa_; }
  std::vector<PciDevice>& mutablePci() { return pci_; }
  void finish();  // derives gpus and NICs' order after a hand-made change

  // For the loader.
  std::vector<Nic>& mutableNics() { return nics_; }
  void setSource(std::string source, bool thisSystem, int packages, int cpus);
  void setError(std::string e) { error_ = std::move(e); }

 private:
  std::vector<NumaNode> numa_;
  std::vector<PciDevice> pci_;
  std::vector<Gpu> gpus_;
  std::vector<Nic> nics_;
  std::string source_, error_;
  bool thisSystem_ = false;
  int packages_ = 0, cpuCount_ = 0;
};

// PCI class and vendor of a GPU weft recognises: display or 3D controllers of NVIDIA and AMD.
bool isGpu(unsigned classId, unsigned vendorId);
// The sysfs path NCCL gets as a NIC's pciPath (docs/nccl-semantics.md §properties), "/sys/devices/.../<bus id>":
// the PCI function hwloc finds the network interface or RDMA device `name` on, when the host topology is this
// system's; else (a topology from a file, a NIC hwloc does not see) the device link sysfs has for it, as weft did
// before hwloc. "" for a virtual NIC (loopback, veth, soft-RoCE).
std::string nicPciPath(const std::string& name, bool rdma);
// The NUMA node of a NIC in the host topology (by its PCI path, else its name); -1 when unknown or several.
int numaNodeOfNic(const std::string& name, const std::string& pciPath);
// The PCI vendor id of a NIC: from the host topology, else sysfs's device/vendor of the network interface; 0 for
// a virtual NIC (loopback, veth) or one neither knows.
unsigned nicPciVendor(const std::string& name, const std::string& pciPath);
unsigned nicPciVendor(const Topology& t, const std::string& name, const std::string& pciPath);
// Where a connection's NIC sits against its GPU, for its record (docs/topology.md §records): the NIC's NUMA node
// (`nicNuma` where the backend knows it, else the topology's), the GPU's bus id, and the path between them
// (kUnknown when either is not in the topology).
struct Locality {
  int numa = -1;
  std::string gpu;
  Path path = Path::kUnknown;
};
Locality localityOf(const Topology& t, const std::string& nicName, const std::string& nicPciPath, int nicNuma,
                    const std::string& gpuBusId);
// "0-55,112-167"
std::string cpuList(const std::vector<int>& cpus);
// The bus id a sysfs PCI path ends in ("" when it ends in none).
std::string busIdOfPath(const std::string& sysfsPath);

}  // namespace weft::topo
