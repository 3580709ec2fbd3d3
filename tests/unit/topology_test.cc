// SPDX-License-Identifier: Apache-2.0
// The machine's layout through hwloc, on fixtures of real machine classes (tests/fixtures/topology): what is found,
// how far each NIC is from each GPU, which NUMA node and cores are local to a NIC, and that trouble degrades to
// an empty topology with a reason.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "weft/common/sysfs.h"
#include "weft/common/topology.h"

using weft::topo::Path;
using weft::topo::Topology;

namespace {
const std::string kDir = WEFT_TOPOLOGY_FIXTURES;

Topology fixture(const std::string& name) {
  Topology t = Topology::fromXml(kDir + "/" + name);
  INFO(name << ": " << t.error());
  REQUIRE(t.error().empty());
  return t;
}

// The path from the GPU of that name to the NIC of that name.
Path gpuNic(const Topology& t, int gpu, const std::string& nic) {
  const int n = t.nicIndex(nic);
  REQUIRE(n >= 0);
  REQUIRE(gpu < static_cast<int>(t.gpus().size()));
  return t.path(t.gpus()[gpu].pci, t.nics()[n].pci);
}

int numaOfNic(const Topology& t, const std::string& nic) {
  const int n = t.nicIndex(nic);
  REQUIRE(n >= 0);
  return t.pci()[t.nics()[n].pci].numa;
}
}  // namespace

TEST_CASE("topology: a DGX H100 class server has 8 GPUs, 12 NICs, 2 sockets, and each GPU one NIC on its switch",
          "[topology]") {
  const Topology t = fixture("dgx-h100.xml");
  CHECK_FALSE(t.thisSystem());
  CHECK(t.packages() == 2);
  REQUIRE(t.numa().size() == 2);
  CHECK(t.cpuCount() == 224);
  CHECK(weft::topo::cpuList(t.numa()[0].cpus) == "0-55,112-167");
  CHECK(weft::topo::cpuList(t.numa()[1].cpus) == "56-111,168-223");
  CHECK(t.gpus().size() == 8);
  CHECK(t.nics().size() == 12);
  const int n0 = t.nicIndex("mlx5_0");
  REQUIRE(n0 >= 0);
  CHECK(t.nics()[n0].netdev == "ibp0");
  CHECK(t.nicIndex("ibp0") == n0);
  // GPU0: its own NIC through its switch, its neighbour's through the switch above, the other switch of its socket
  // through another host bridge, the other socket's NICs across the socket link.
  CHECK(gpuNic(t, 0, "mlx5_0") == Path::kSwitch);
  CHECK(gpuNic(t, 0, "mlx5_1") == Path::kPciTree);
  CHECK(gpuNic(t, 1, "mlx5_1") == Path::kSwitch);
  CHECK(gpuNic(t, 0, "mlx5_2") == Path::kNuma);
  CHECK(gpuNic(t, 0, "mlx5_4") == Path::kSystem);
  CHECK(gpuNic(t, 7, "mlx5_7") == Path::kSwitch);
  CHECK(gpuNic(t, 0, "mlx5_8") == Path::kNuma);  // storage NIC, same socket
  CHECK(numaOfNic(t, "mlx5_0") == 0);
  CHECK(numaOfNic(t, "mlx5_5") == 1);
  CHECK(numaOfNic(t, "mlx5_10") == 1);
  Path p;
  CHECK(t.nearestGpus(t.nics()[n0].pci, &p) == std::vector<int>{0});
  CHECK(p == Path::kSwitch);
  // The two ports of a dual-port card are two functions of one device: PIX to each other.
  CHECK(t.path(t.nics()[t.nicIndex("mlx5_8")].pci, t.nics()[t.nicIndex("mlx5_9")].pci) == Path::kSwitch);
  // A NIC's local cores are its socket's.
  CHECK(t.pci()[t.nics()[t.nicIndex("mlx5_6")].pci].cpus == t.numa()[1].cpus);
}

TEST_CASE("topology: an EFA server with four NICs a socket (p4d class) shows EFA devices without interfaces",
          "[topology]") {
  const Topology t = fixture("efa-4-per-socket.xml");
  CHECK(t.gpus().size() == 8);
  REQUIRE(t.nics().size() == 8);
  int onNode0 = 0;
  for (const auto& n : t.nics()) {
    CHECK(n.netdev.empty());
    CHECK(n.rdma.rfind("rdmap", 0) == 0);
    onNode0 += t.pci()[n.pci].numa == 0;
  }
  CHECK(onNode0 == 4);
  // Each switch: two GPUs and two NICs side by side, every GPU PIX with both.
  const std::string first = t.nics()[0].rdma, second = t.nics()[1].rdma, third = t.nics()[2].rdma;
  CHECK(gpuNic(t, 0, first) == Path::kSwitch);
  CHECK(gpuNic(t, 1, second) == Path::kSwitch);
  CHECK(gpuNic(t, 0, third) == Path::kNuma);
  CHECK(gpuNic(t, 4, first) == Path::kSystem);
  // libfabric's EFA domain names carry the endpoint type.
  CHECK(t.nicIndex(first + "-rdm") == 0);
  CHECK(t.nicIndex(first + "-dgrm") == 0);
}

TEST_CASE("topology: a p5 class EFA server has four NICs on every GPU's switch", "[topology]") {
  const Topology t = fixture("efa-4-per-gpu.xml");
  REQUIRE(t.gpus().size() == 8);
  REQUIRE(t.nics().size() == 32);
  for (int g = 0; g < 8; ++g) {
    int pix = 0;
    for (const auto& n : t.nics()) pix += t.path(t.gpus()[g].pci, n.pci) == Path::kSwitch;
    CHECK(pix == 4);
  }
}

TEST_CASE("topology: a two-socket RoCE server, one NIC a socket, tells host bridge, NUMA node and socket apart",
          "[topology]") {
  const Topology t = fixture("roce-2s.xml");
  REQUIRE(t.gpus().size() == 4);
  REQUIRE(t.nics().size() == 2);
  CHECK(t.nics()[0].rdma == "mlx5_0");
  CHECK(t.nics()[0].netdev == "ens1f0np0");
  CHECK(gpuNic(t, 0, "mlx5_0") == Path::kHostBridge);
  CHECK(gpuNic(t, 1, "mlx5_0") == Path::kNuma);
  CHECK(gpuNic(t, 2, "mlx5_0") == Path::kSystem);
  CHECK(gpuNic(t, 2, "mlx5_1") == Path::kHostBridge);
  CHECK(numaOfNic(t, "ens2f0np0") == 1);
}

TEST_CASE("topology: a NIC on the other socket from both GPUs is SYS from each", "[topology]") {
  const Topology t = fixture("roce-far-nic.xml");
  REQUIRE(t.gpus().size() == 2);
  CHECK(gpuNic(t, 0, "mlx5_0") == Path::kSystem);
  CHECK(gpuNic(t, 1, "mlx5_0") == Path::kSystem);
  CHECK(numaOfNic(t, "mlx5_0") == 1);
  CHECK(t.pci()[t.gpus()[0].pci].numa == 0);
}

TEST_CASE("topology: a NIC is found by its sysfs PCI path's bus id, else by name", "[topology]") {
  const Topology t = fixture("roce-2s.xml");
  const int pci = t.nics()[1].pci;
  const std::string bus = t.pci()[pci].busId;
  CHECK(t.pciOfNic("whatever", "/sys/devices/pci0000:80/0000:80:02.0/" + bus) == pci);
  CHECK(t.pciOfNic("mlx5_1", "") == pci);
  CHECK(t.pciOfNic("ens2f0np0", "/sys/devices/virtual/net/x") == pci);
  CHECK(t.pciOfNic("veth0", "") == -1);
  CHECK(t.pciIndex(bus.substr(5)) == pci);  // without the domain
  CHECK(t.pciIndex("0000:ff:1f.7") == -1);
  CHECK(weft::topo::busIdOfPath("/sys/devices/pci0000:00/0000:00:03.0") == "0000:00:03.0");
  CHECK(weft::topo::busIdOfPath("/sys/devices/virtual/net/lo").empty());
}

TEST_CASE("topology: the map names every GPU and NIC with its NUMA node and the path between them", "[topology]") {
  const Topology t = fixture("roce-far-nic.xml");
  const std::string m = t.map();
  INFO(m);
  CHECK(m.find("2 packages, 2 NUMA nodes, 128 cpus, 2 GPUs, 1 NIC") != std::string::npos);
  CHECK(m.find("another machine's") != std::string::npos);
  CHECK(m.find("NUMA node 1 (package 1): cpus 32-63,96-127, 256 GiB") != std::string::npos);
  CHECK(m.find("mlx5_0         0000:81:00.0 NUMA 1 package 1 netdev ens2f0np0  nearest GPU GPU0,GPU1 (SYS)") !=
        std::string::npos);
  CHECK(m.find("  mlx5_0           SYS   SYS") != std::string::npos);
}

TEST_CASE("topology: a file hwloc cannot read gives an empty topology and the reason, never a failure",
          "[topology]") {
  Topology missing = Topology::fromXml(kDir + "/no-such-file.xml");
  CHECK(missing.empty());
  CHECK(missing.error().find("no-such-file.xml") != std::string::npos);
  CHECK(missing.map().find("topology: none") == 0);
  CHECK(missing.path(0, 1) == Path::kUnknown);
  CHECK(missing.nicIndex("mlx5_0") == -1);
  const std::string garbage = "build-topology-garbage.xml";
  {
    std::ofstream f(garbage);
    f << "<topology version=\"2.0\"><object type=\"Machine\" cpuset=\"zz\"><object type=\"PCIDev\"";
  }
  Topology bad = Topology::fromXml(garbage);
  CHECK(bad.empty());
  CHECK_FALSE(bad.error().empty());
  std::remove(garbage.c_str());
}

TEST_CASE("topology: this machine loads, and is this system", "[topology]") {
  const Topology t = Topology::fromXml("");
  INFO(t.error());
  REQUIRE(t.error().empty());
  CHECK(t.thisSystem());
  CHECK(t.cpuCount() >= 1);
  CHECK(t.numa().size() >= 1);
  CHECK(t.source() == "this machine");
}

TEST_CASE("topology: a connection's locality is its NIC's NUMA node and the path to its GPU", "[topology]") {
  const Topology far = fixture("roce-far-nic.xml");
  auto l = weft::topo::localityOf(far, "ens2f0np0", "", -1, "0000:01:00.0");
  CHECK(l.numa == 1);
  CHECK(l.gpu == "0000:01:00.0");
  CHECK(l.path == Path::kSystem);
  // The backend's own NUMA node wins; a GPU or NIC the topology does not know leaves the path unknown.
  CHECK(weft::topo::localityOf(far, "ens2f0np0", "", 0, "").numa == 0);
  CHECK(weft::topo::localityOf(far, "ens2f0np0", "", -1, "0000:ee:00.0").path == Path::kUnknown);
  CHECK(weft::topo::localityOf(far, "veth7", "", -1, "0000:01:00.0").path == Path::kUnknown);
  CHECK(weft::topo::localityOf(far, "veth7", "", -1, "0000:01:00.0").numa == -1);
  const Topology dgx = fixture("dgx-h100.xml");
  const std::string gpu0 = dgx.pci()[dgx.gpus()[0].pci].busId;
  CHECK(weft::topo::localityOf(dgx, "mlx5_0", "", -1, gpu0).path == Path::kSwitch);
  CHECK(weft::topo::localityOf(dgx, "mlx5_0-rdm", "", -1, gpu0).path == Path::kSwitch);
}

TEST_CASE("topology: the PCI path NCCL gets for a NIC is the exact sysfs path, through hwloc where it sees the NIC",
          "[topology]") {
  int physical = 0;
  if (DIR* d = opendir("/sys/class/net")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name[0] == '.') continue;
      INFO(name);
      const std::string viaSysfs = weft::sysfs::netdevPciPath(name);
      CHECK(weft::topo::nicPciPath(name, false) == viaSysfs);  // virtual ones: "" both ways
      if (!viaSysfs.empty()) {
        ++physical;
        // hwloc sees it, and places it (on a machine of one NUMA node: node 0).
        CHECK(Topology::host().nicIndex(name) >= 0);
        if (Topology::host().numa().size() == 1) CHECK(weft::topo::numaNodeOfNic(name, viaSysfs) == 0);
      }
    }
    closedir(d);
  }
  if (physical == 0) WARN("no network interface with a PCI device here: only virtual ones compared");
}

TEST_CASE("topology: a NIC's PCI vendor comes from the topology, else from sysfs; a virtual NIC has none",
          "[topology]") {
  const Topology t = fixture("dgx-h100.xml");
  CHECK(weft::topo::nicPciVendor(t, "enp82s0f0np0", "") == 0x15b3);  // ConnectX, from hwloc
  // a NIC the topology does not know: its PCI function's vendor file
  char dir[] = "/tmp/weft-vendor-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/0000:00:05.0";
  REQUIRE(mkdir(path.c_str(), 0755) == 0);
  std::ofstream(path + "/vendor") << "0x1d0f\n";
  CHECK(weft::topo::nicPciVendor(t, "ens5", path) == 0x1d0f);
  CHECK(weft::topo::nicPciVendor(t, "veth0", "") == 0);                      // no PCI device
  CHECK(weft::topo::nicPciVendor(t, "ens6", std::string(dir) + "/none") == 0);  // no vendor file
  std::remove((path + "/vendor").c_str());
  rmdir(path.c_str());
  rmdir(dir);
}
