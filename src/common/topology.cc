// SPDX-License-Identifier: Apache-2.0
#include "weft/common/topology.h"

#include <hwloc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/common/sysfs.h"

namespace weft::topo {

const char* pathName(Path p) {
  switch (p) {
    case Path::kSwitch: return "PIX";
    case Path::kPciTree: return "PXB";
    case Path::kHostBridge: return "PHB";
    case Path::kNuma: return "NODE";
    case Path::kSystem: return "SYS";
    case Path::kUnknown: break;
  }
  return "?";
}

const char* pathMeaning(Path p) {
  switch (p) {
    case Path::kSwitch: return "same PCIe switch";
    case Path::kPciTree: return "same root port, several switches";
    case Path::kHostBridge: return "same host bridge";
    case Path::kNuma: return "same NUMA node, other host bridge";
    case Path::kSystem: return "across sockets";
    case Path::kUnknown: break;
  }
  return "unknown";
}

bool isGpu(unsigned classId, unsigned vendorId) {
  const bool display = (classId >> 8) == 0x03 && ((classId & 0xff) == 0x00 || (classId & 0xff) == 0x02);
  return display && (vendorId == 0x10de || vendorId == 0x1002);
}

std::string cpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out.empty() ? "-" : out;
}

std::string busIdOfPath(const std::string& sysfsPath) {
  const size_t slash = sysfsPath.rfind('/');
  std::string last = slash == std::string::npos ? sysfsPath : sysfsPath.substr(slash + 1);
  return sysfs::isPciBusId(last) ? last : std::string();
}

std::string nicPciPath(const std::string& name, bool rdma) {
  const Topology& t = Topology::host();
  if (t.thisSystem()) {
    const int n = t.nicIndex(name);
    if (n >= 0) {
      std::string p = sysfs::realPath("/sys/bus/pci/devices/" + t.pci()[t.nics()[n].pci].busId);
      if (!p.empty()) return p;
    }
  }
  return rdma ? sysfs::pciAncestor(sysfs::realPath("/sys/class/infiniband/" + name + "/device"))
              : sysfs::netdevPciPath(name);
}

int numaNodeOfNic(const std::string& name, const std::string& pciPath) {
  const Topology& t = Topology::host();
  const int pci = t.pciOfNic(name, pciPath);
  return pci < 0 ? -1 : t.pci()[pci].numa;
}

unsigned nicPciVendor(const std::string& name, const std::string& pciPath) {
  return nicPciVendor(Topology::host(), name, pciPath);
}

unsigned nicPciVendor(const Topology& t, const std::string& name, const std::string& pciPath) {
  const int pci = t.pciOfNic(name, pciPath);
  if (pci >= 0 && t.pci()[pci].vendorId != 0) return t.pci()[pci].vendorId;
  if (pciPath.empty()) return 0;
  const std::string v = sysfs::readLine(pciPath + "/vendor");
  return v.empty() ? 0 : static_cast<unsigned>(std::strtoul(v.c_str(), nullptr, 16));
}

Locality localityOf(const Topology& t, const std::string& nicName, const std::string& nicPciPath, int nicNuma,
                    const std::string& gpuBusId) {
  Locality out;
  const int nic = t.pciOfNic(nicName, nicPciPath);
  out.numa = nicNuma >= 0 ? nicNuma : nic >= 0 ? t.pci()[nic].numa : -1;
  out.gpu = gpuBusId;
  if (!gpuBusId.empty()) out.path = t.path(nic, t.pciIndex(gpuBusId));
  return out;
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<int> bits(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (set == nullptr) return out;
  for (int i = hwloc_bitmap_first(set); i != -1; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const noexcept { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

int packageOf(hwloc_topology_t t, hwloc_obj_t o) {
  if (o == nullptr) return -1;
  if (o->type == HWLOC_OBJ_PACKAGE) return static_cast<int>(o->os_index);
  hwloc_obj_t p = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, o);
  if (p != nullptr) return static_cast<int>(p->os_index);
  // Above the packages (a device local to the whole machine): known only when there is one.
  if (hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE) == 1) {
    return static_cast<int>(hwloc_get_obj_by_type(t, HWLOC_OBJ_PACKAGE, 0)->os_index);
  }
  return -1;
}

// A PCIe bridge's part in the tree: host bridge, root port, a switch's upstream port or one of its downstream ports.
enum class Role { kHost, kRoot, kUp, kDown };

class Extractor {
 public:
  explicit Extractor(hwloc_topology_t t) : t_(t) {}

  void run(Topology* out) {
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(t_, HWLOC_OBJ_NUMANODE, o)) != nullptr;) {
      NumaNode n;
      n.os = static_cast<int>(o->os_index);
      n.package = packageOf(t_, o->parent);
      n.cpus = bits(o->cpuset);
      n.bytes = o->attr != nullptr ? o->attr->numanode.local_memory : 0;
      out->mutableNuma().push_back(std::move(n));
    }
    std::map<hwloc_obj_t, int> pciIndex;
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_pcidev(t_, o)) != nullptr;) {
      PciDevice d;
      const auto& a = o->attr->pcidev;
      d.busId = fmt::format("{:04x}:{:02x}:{:02x}.{:x}", a.domain, a.bus, a.dev, a.func);
      d.classId = a.class_id;
      d.vendorId = a.vendor_id;
      d.deviceId = a.device_id;
      d.linkGBps = a.linkspeed;
      if (const char* m = hwloc_obj_get_info_by_name(o, "PCIDevice")) d.model = m;
      d.units = unitsAbove(o);
      hwloc_obj_t anchor = hwloc_get_non_io_ancestor_obj(t_, o);
      if (anchor != nullptr) {
        if (anchor->nodeset != nullptr && hwloc_bitmap_weight(anchor->nodeset) == 1) {
          d.numa = hwloc_bitmap_first(anchor->nodeset);
        }
        d.package = packageOf(t_, anchor);
        d.cpus = bits(anchor->cpuset);
      }
      pciIndex[o] = static_cast<int>(out->mutablePci().size());
      out->mutablePci().push_back(std::move(d));
    }
    // NICs: the network interfaces and RDMA devices hwloc finds on PCI devices, one NIC per PCI function (a
    // function with two interfaces, as a dual-port mlx4, gives two).
    std::map<int, std::vector<int>> nicsOfPci;
    auto& nics = out->mutableNics();
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(t_, o)) != nullptr;) {
      const auto type = o->attr->osdev.type;
      if (type != HWLOC_OBJ_OSDEV_NETWORK && type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
      if (o->parent == nullptr || o->parent->type != HWLOC_OBJ_PCI_DEVICE || o->name == nullptr) continue;
      const int pci = pciIndex.at(o->parent);
      const bool rdma = type == HWLOC_OBJ_OSDEV_OPENFABRICS;
      Nic* into = nullptr;
      for (int k : nicsOfPci[pci]) {
        Nic& n = nics[k];
        if ((rdma ? n.rdma : n.netdev).empty()) {
          into = &n;
          break;
        }
      }
      if (into == nullptr) {
        nicsOfPci[pci].push_back(static_cast<int>(nics.size()));
        nics.push_back(Nic{pci, "", ""});
        into = &nics.back();
      }
      (rdma ? into->rdma : into->netdev) = o->name;
    }
  }

 private:
  Role role(hwloc_obj_t b) {
    if (auto it = roles_.find(b); it != roles_.end()) return it->second;
    Role r;
    if (b->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
      r = Role::kHost;
    } else if (b->parent == nullptr || b->parent->type != HWLOC_OBJ_BRIDGE) {
      r = Role::kRoot;  // a PCI bridge without a host bridge above it: the top of its tree
    } else {
      const Role up = role(b->parent);
      r = up == Role::kHost ? Role::kRoot : up == Role::kUp ? Role::kDown : Role::kUp;
    }
    roles_[b] = r;
    return r;
  }

  int unit(hwloc_obj_t b) {
    if (auto it = units_.find(b); it != units_.end()) return it->second;
    const int u = role(b) == Role::kDown ? unit(b->parent) : nextUnit_++;
    units_[b] = u;
    return u;
  }

  std::vector<int> unitsAbove(hwloc_obj_t o) {
    std::vector<hwloc_obj_t> chain;
    for (hwloc_obj_t p = o->parent; p != nullptr && p->type == HWLOC_OBJ_BRIDGE; p = p->parent) chain.push_back(p);
    std::vector<int> out;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const int u = unit(*it);
      if (out.empty() || out.back() != u) out.push_back(u);
    }
    return out;
  }

  hwloc_topology_t t_;
  std::map<hwloc_obj_t, Role> roles_;
  std::map<hwloc_obj_t, int> units_;
  int nextUnit_ = 0;
};

// Loads with hwloc: from `xml` when given, else the running system. hwloc's plugins that would open a GPU's
// driver (cuda, nvml, opencl, rsmi, levelzero) or a display (gl) are left out: weft runs inside NCCL's process,
// and PCI tells it all it needs about GPUs.
Topology load(const std::string& xml) {
  Topology out;
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    out.setError(std::string("hwloc_topology_init failed: ") + std::strerror(errno));
    return out;
  }
  TopologyPtr t(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  for (const char* c : {"cuda", "nvml", "opencl", "rsmi", "levelzero", "gl"}) {
    hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, c);
  }
  if (!xml.empty() && hwloc_topology_set_xml(raw, xml.c_str()) != 0) {
    out.setError("hwloc cannot read the topology file " + xml + ": " + std::strerror(errno));
    return out;
  }
  if (hwloc_topology_load(raw) != 0) {
    out.setError((xml.empty() ? std::string("hwloc could not read this machine's topology")
                              : "hwloc cannot load the topology file " + xml) +
                 ": " + std::strerror(errno));
    return out;
  }
  Extractor(raw).run(&out);
  out.setSource(xml.empty() ? "this machine" : xml, hwloc_topology_is_thissystem(raw) != 0,
                hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PACKAGE), hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PU));
  out.finish();
  return out;
}

}  // namespace

void Topology::setSource(std::string source, bool thisSystem, int packages, int cpus) {
  source_ = std::move(source);
  thisSystem_ = thisSystem;
  packages_ = packages;
  cpuCount_ = cpus;
}

void Topology::finish() {
  gpus_.clear();
  std::vector<int> g;
  for (int i = 0; i < static_cast<int>(pci_.size()); ++i) {
    if (isGpu(pci_[i].classId, pci_[i].vendorId)) g.push_back(i);
  }
  std::sort(g.begin(), g.end(), [&](int a, int b) { return pci_[a].busId < pci_[b].busId; });
  for (size_t k = 0; k < g.size(); ++k) gpus_.push_back(Gpu{g[k], "GPU" + std::to_string(k)});
  std::stable_sort(nics_.begin(), nics_.end(), [&](const Nic& a, const Nic& b) {
    return pci_[a.pci].busId != pci_[b.pci].busId ? pci_[a.pci].busId < pci_[b.pci].busId : a.name() < b.name();
  });
  if (cpuCount_ == 0) {
    for (const auto& n : numa_) cpuCount_ += static_cast<int>(n.cpus.size());
  }
}

Topology Topology::fromXml(const std::string& path) { return load(path); }

const Topology& Topology::host() {
  static Topology* host = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string& xml = params::getString("WEFT_TOPOLOGY_XML");
    const auto start = std::chrono::steady_clock::now();
    host = new Topology(load(xml));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!host->error().empty()) {
      WEFT_WARN("{}; weft goes on without the machine's layout (no NUMA placement, rails from WEFT_RAILS only)",
                host->error());
    } else if (host->pci().empty()) {
      WEFT_INFO(NCCL_INIT, "topology from {}: no PCI devices seen (a container without /sys?); NICs "
                "and GPUs get no locality", host->source());
    } else {
      WEFT_INFO(NCCL_INIT, "topology from {} (hwloc, {:.1f} ms): {} NUMA node{}, {} GPU{}, {} NIC{}", host->source(), ms,
                host->numa().size(), host->numa().size() == 1 ? "" : "s", host->gpus().size(),
                host->gpus().size() == 1 ? "" : "s", host->nics().size(), host->nics().size() == 1 ? "" : "s");
    }
  });
  return *host;
}

const NumaNode* Topology::numaNode(int os) const {
  for (const auto& n : numa_) {
    if (n.os == os) return &n;
  }
  return nullptr;
}

int Topology::pciIndex(const std::string& busId) const {
  std::string want = lower(busId);
  if (want.size() == 7) want = "0000:" + want;  // bb:dd.f
  for (int i = 0; i < static_cast<int>(pci_.size()); ++i) {
    if (pci_[i].busId == want) return i;
  }
  return -1;
}

int Topology::nicIndex(const std::string& name) const {
  if (name.empty()) return -1;
  for (int i = 0; i < static_cast<int>(nics_.size()); ++i) {
    if (nics_[i].netdev == name || nics_[i].rdma == name) return i;
  }
  // libfabric names EFA's domains after the device with the endpoint type: rdmap16s27-rdm, rdmap16s27-dgrm.
  for (const char* suffix : {"-rdm", "-dgrm"}) {
    const size_t n = std::strlen(suffix);
    if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0) return nicIndex(name.substr(0, name.size() - n));
  }
  return -1;
}

int Topology::pciOfNic(const std::string& name, const std::string& pciPath) const {
  const std::string bus = busIdOfPath(pciPath);
  if (!bus.empty()) {
    const int i = pciIndex(bus);
    if (i >= 0) return i;
  }
  const int n = nicIndex(name);
  return n >= 0 ? nics_[n].pci : -1;
}

Path Topology::path(int a, int b) const {
  if (a < 0 || b < 0 || a >= static_cast<int>(pci_.size()) || b >= static_cast<int>(pci_.size())) {
    return Path::kUnknown;
  }
  if (a == b) return Path::kSwitch;
  const PciDevice& x = pci_[a];
  const PciDevice& y = pci_[b];
  if (!x.units.empty() && !y.units.empty() && x.units[0] == y.units[0]) {
    size_t common = 0;
    while (common < x.units.size() && common < y.units.size() && x.units[common] == y.units[common]) ++common;
    if (common == 1) return Path::kHostBridge;
    return x.units.size() == common && y.units.size() == common ? Path::kSwitch : Path::kPciTree;
  }
  if (x.numa >= 0 && y.numa >= 0) return x.numa == y.numa ? Path::kNuma : Path::kSystem;
  if (x.package >= 0 && y.package >= 0) return x.package == y.package ? Path::kNuma : Path::kSystem;
  return Path::kUnknown;
}

std::vector<int> Topology::nearestGpus(int pci, Path* best) const {
  *best = Path::kUnknown;
  std::vector<int> out;
  for (int g = 0; g < static_cast<int>(gpus_.size()); ++g) {
    const Path p = path(pci, gpus_[g].pci);
    if (p == Path::kUnknown) continue;
    if (out.empty() || p < *best) {
      *best = p;
      out.assign(1, g);
    } else if (p == *best) {
      out.push_back(g);
    }
  }
  return out;
}

std::string Topology::map() const {
  std::string s;
  if (!error_.empty()) return "topology: none (" + error_ + ")\n";
  s += fmt::format("topology from {}{}: {} package{}, {} NUMA node{}, {} cpus, {} GPU{}, {} NIC{}\n", source_,
                   thisSystem_ || source_ == "this machine" ? "" : " (another machine's: informs, binds nothing)",
                   packages_, packages_ == 1 ? "" : "s", numa_.size(), numa_.size() == 1 ? "" : "s", cpuCount_,
                   gpus_.size(), gpus_.size() == 1 ? "" : "s", nics_.size(), nics_.size() == 1 ? "" : "s");
  for (const auto& n : numa_) {
    s += fmt::format("  NUMA node {} (package {}): cpus {}, {:.0f} GiB\n", n.os, n.package, cpuList(n.cpus),
                     static_cast<double>(n.bytes) / (1ull << 30));
  }
  auto where = [&](int pci) {
    const PciDevice& d = pci_[pci];
    return fmt::format("{} NUMA {} package {}", d.busId, d.numa < 0 ? std::string("-") : std::to_string(d.numa),
                       d.package < 0 ? std::string("-") : std::to_string(d.package));
  };
  for (const auto& g : gpus_) {
    const PciDevice& d = pci_[g.pci];
    s += fmt::format("  {:<6} {} [{:04x}:{:04x}]{}\n", g.name, where(g.pci), d.vendorId, d.deviceId,
                     d.model.empty() ? "" : " " + d.model);
  }
  for (const auto& n : nics_) {
    Path p;
    const auto near = nearestGpus(n.pci, &p);
    std::string gpus;
    for (int g : near) gpus += (gpus.empty() ? "" : ",") + gpus_[g].name;
    s += fmt::format("  {:<14} {}{}{}  nearest GPU {} ({})\n", n.name(), where(n.pci),
                     n.netdev.empty() || n.rdma.empty() ? "" : " netdev ", n.rdma.empty() ? "" : n.netdev,
                     gpus.empty() ? "-" : gpus, near.empty() ? "no GPU" : pathName(p));
  }
  if (!gpus_.empty() && !nics_.empty()) {
    s += "  GPU to NIC (PIX same switch, PXB same root port, PHB same host bridge, NODE same NUMA node, SYS across "
         "sockets):\n";
    s += fmt::format("  {:<14}", "");
    for (const auto& g : gpus_) s += fmt::format(" {:>5}", g.name);
    s += "\n";
    for (const auto& n : nics_) {
      s += fmt::format("  {:<14}", n.name());
      for (const auto& g : gpus_) s += fmt::format(" {:>5}", pathName(path(n.pci, g.pci)));
      s += "\n";
    }
  }
  return s;
}

}  // namespace weft::topo
