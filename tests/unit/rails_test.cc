// SPDX-License-Identifier: Apache-2.0
// Which NICs make one device: WEFT_RAILS parsing and the PCI-locality rule, on made-up machines.
#include <catch2/catch.hpp>

#include "fabric/rails.h"

using namespace weft::fabric;

namespace {
using weft::topo::PciDevice;
using weft::topo::Topology;
const std::string kRoot = "/sys/devices/pci0000:00/0000:00:01.0/";

// A made-up GPU server, as the topology sees it: two PCIe switches (units: host bridge 0, root port, switch), each
// with a GPU and two NICs; one NIC on a root port of its own.
PciDevice device(const std::string& bus, bool gpu, std::vector<int> units) {
  PciDevice d;
  d.busId = bus;
  d.classId = gpu ? 0x0302 : 0x0200;
  d.vendorId = gpu ? 0x10de : 0x1d0f;
  d.units = std::move(units);
  d.numa = 0;
  return d;
}
Topology server(int nicsOnSwitch0 = 2) {
  Topology t;
  auto& pci = t.mutablePci();
  pci.push_back(device("0000:07:00.0", true, {0, 1, 2}));
  pci.push_back(device("0000:08:00.0", true, {0, 3, 4}));
  for (int i = 0; i < nicsOnSwitch0; ++i) {
    char bus[16];
    std::snprintf(bus, sizeof(bus), "0000:%02x:00.0", 0x10 + i);
    pci.push_back(device(bus, false, {0, 1, 2}));
  }
  pci.push_back(device("0000:05:00.0", false, {0, 3, 4}));
  pci.push_back(device("0000:06:00.0", false, {0, 3, 4}));
  pci.push_back(device("0000:00:03.0", false, {0, 5}));
  t.finish();
  return t;
}
std::vector<NicInfo> serverNics() {
  return {{"efa0", kRoot + "0000:10:00.0", 100000},
          {"efa1", kRoot + "0000:11:00.0", 100000},
          {"efa2", kRoot + "0000:05:00.0", 100000},
          {"efa3", kRoot + "0000:06:00.0", 100000},
          {"eth0", kRoot + "0000:00:03.0", 25000}};
}
// The NICs of a fixture as a backend would list them, every one at `speed`.
std::vector<NicInfo> nicsOf(const Topology& t, int speed) {
  std::vector<NicInfo> out;
  for (const auto& n : t.nics()) out.push_back({n.name(), "/sys/devices/pci0000:00/" + t.pci()[n.pci].busId, speed});
  return out;
}
}  // namespace

TEST_CASE("WEFT_RAILS parses auto, off and explicit groups, and refuses malformed text", "[rails]") {
  RailSpec s;
  std::string err;
  REQUIRE(parseRailSpec("", &s, &err));
  CHECK(s.mode == RailSpec::Mode::kAuto);
  REQUIRE(parseRailSpec("auto", &s, &err));
  CHECK(s.mode == RailSpec::Mode::kAuto);
  REQUIRE(parseRailSpec("off", &s, &err));
  CHECK(s.mode == RailSpec::Mode::kOff);
  REQUIRE(parseRailSpec("eth0+eth1,eth2+eth3", &s, &err));
  CHECK(s.mode == RailSpec::Mode::kExplicit);
  REQUIRE(s.groups.size() == 2);
  CHECK(s.groups[1] == std::vector<std::string>{"eth2", "eth3"});
  for (const char* bad : {"eth0+", "+eth1", "eth0++eth1", "a+b,,c+d", "a+b+c+d+e+f+g+h+i", "eth 0+eth1"}) {
    INFO(bad);
    err.clear();
    CHECK_FALSE(parseRailSpec(bad, &s, &err));
    CHECK_FALSE(err.empty());
  }
}

TEST_CASE("WEFT_RAILS: eight NICs a device with NCCL's v12 table, four with the older ones", "[rails]") {
  RailSpec s;
  std::string err;
  weft::setNetTableVersion(12);
  CHECK(weft::maxDevsPerNic() == 8);
  REQUIRE(parseRailSpec("a+b+c+d+e+f+g+h", &s, &err));
  CHECK(s.groups[0].size() == 8);
  weft::setNetTableVersion(11);
  CHECK(weft::maxDevsPerNic() == 4);
  CHECK_FALSE(parseRailSpec("a+b+c+d+e", &s, &err));
  CHECK(err.find("at most 4") != std::string::npos);
  CHECK(err.find("v12") != std::string::npos);
  REQUIRE(parseRailSpec("a+b+c+d", &s, &err));
  weft::setNetTableVersion(9);
  CHECK(weft::maxDevsPerNic() == 4);
  // Grouping by locality stops at the table's limit too: six NICs under one GPU's switch make one device of 4.
  const Topology t = server(6);
  std::vector<NicInfo> nics;
  for (int i = 0; i < 6; ++i) nics.push_back({"n" + std::to_string(i), kRoot + t.pci()[2 + i].busId, 100000});
  std::vector<std::string> warnings;
  auto groups4 = groupRails(nics, t, RailSpec{}, &warnings);
  CHECK(groups4[0].size() == 4);
  CHECK(groups4.size() == 3);
  weft::setNetTableVersion(12);
  auto groups8 = groupRails(nics, t, RailSpec{}, &warnings);
  CHECK(groups8[0].size() == 6);
  weft::setNetTableVersion(0);
}

TEST_CASE("WEFT_NIC_RAILS gives NICs NCCL 2.30's rail and plane, and refuses malformed text", "[rails]") {
  std::map<std::string, NicRail> m;
  std::string err;
  REQUIRE(parseNicRails("rdmap16s27:0,rdmap32s27:1:2,,", &m, &err));
  REQUIRE(m.size() == 2);
  CHECK(m["rdmap16s27"].rail == 0);
  CHECK(m["rdmap16s27"].plane == -1);
  CHECK(m["rdmap32s27"].rail == 1);
  CHECK(m["rdmap32s27"].plane == 2);
  REQUIRE(parseNicRails("", &m, &err));
  CHECK(m.empty());
  for (const char* bad : {"eth0", "eth0:", ":1", "eth0:a", "eth0:1:2:3", "eth0:40000", "eth0:1,eth0:2", "eth0:-1"}) {
    INFO(bad);
    err.clear();
    CHECK_FALSE(parseNicRails(bad, &m, &err));
    CHECK_FALSE(err.empty());
  }
}

TEST_CASE("auto fuses the NICs that share a GPU's switch, at equal speed", "[rails]") {
  std::vector<std::string> warnings;
  const Topology t = server();
  auto g = groupRails(serverNics(), t, RailSpec{}, &warnings);
  CHECK(warnings.empty());
  CHECK(g == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4}});
  // Without a topology (hwloc could not read one) or with rails off, every NIC stays alone.
  CHECK(groupRails(serverNics(), Topology(), RailSpec{}, &warnings) ==
        std::vector<std::vector<int>>{{0}, {1}, {2}, {3}, {4}});
  RailSpec off;
  off.mode = RailSpec::Mode::kOff;
  CHECK(groupRails(serverNics(), t, off, &warnings).size() == 5);
  // A slower NIC under the same switch is not fused with the fast ones.
  auto nics = serverNics();
  nics[1].speedMbps = 25000;
  CHECK(groupRails(nics, t, RailSpec{}, &warnings) == std::vector<std::vector<int>>{{0}, {1}, {2, 3}, {4}});
  // Virtual NICs (no PCI path, not in the topology) are never fused, and expected there: no warning.
  std::vector<NicInfo> veths = {{"veth0", "", 10000}, {"veth1", "", 10000}};
  CHECK(groupRails(veths, t, RailSpec{}, &warnings).size() == 2);
  CHECK(warnings.empty());
}

TEST_CASE("auto leaves alone, with a warning, a NIC whose PCI device hwloc does not see", "[rails]") {
  std::vector<std::string> warnings;
  auto nics = serverNics();
  nics[1].pciPath = kRoot + "0000:7f:00.0";
  nics[1].name = "hidden0";
  auto g = groupRails(nics, server(), RailSpec{}, &warnings);
  CHECK(g == std::vector<std::vector<int>>{{0}, {1}, {2, 3}, {4}});
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("hidden0") != std::string::npos);
  CHECK(warnings[0].find("not in hwloc's view") != std::string::npos);
}

TEST_CASE("auto never puts more than kMaxRails NICs in one device", "[rails]") {
  const Topology t = server(kMaxRails + 2);
  std::vector<NicInfo> nics;
  for (int i = 0; i < kMaxRails + 2; ++i) nics.push_back({"nic" + std::to_string(i), kRoot + t.pci()[2 + i].busId, 100000});
  std::vector<std::string> warnings;
  auto g = groupRails(nics, t, RailSpec{}, &warnings);
  REQUIRE(g.size() == 3);
  CHECK(static_cast<int>(g[0].size()) == kMaxRails);
}

TEST_CASE("auto on real machine classes: one NIC a GPU stays apart, four EFA NICs a GPU make one device",
          "[rails]") {
  std::vector<std::string> warnings;
  for (const char* apart : {"dgx-h100.xml", "efa-4-per-socket.xml", "roce-2s.xml", "roce-far-nic.xml"}) {
    INFO(apart);
    const Topology t = Topology::fromXml(std::string(WEFT_TOPOLOGY_FIXTURES) + "/" + apart);
    REQUIRE(t.error().empty());
    const auto nics = nicsOf(t, 400000);
    CHECK(groupRails(nics, t, RailSpec{}, &warnings).size() == nics.size());
  }
  const Topology p5 = Topology::fromXml(std::string(WEFT_TOPOLOGY_FIXTURES) + "/efa-4-per-gpu.xml");
  const auto nics = nicsOf(p5, 100000);
  for (int table : {9, 12}) {
    weft::setNetTableVersion(table);
    auto g = groupRails(nics, p5, RailSpec{}, &warnings);
    REQUIRE(g.size() == 8);
    for (const auto& d : g) {
      REQUIRE(d.size() == 4);
      // The four NICs of a device are those of one GPU's switch.
      weft::topo::Path p;
      const auto gpus = p5.nearestGpus(p5.pciOfNic(nics[d[0]].name, nics[d[0]].pciPath), &p);
      CHECK(gpus.size() == 1);
      for (int i : d) CHECK(p5.nearestGpus(p5.pciOfNic(nics[i].name, nics[i].pciPath), &p) == gpus);
    }
  }
  weft::setNetTableVersion(0);
  CHECK(warnings.empty());
}

TEST_CASE("explicit groups fuse named NICs; unknown or repeated names are warned about and left alone", "[rails]") {
  std::vector<NicInfo> nics = {{"eth0", "", 1}, {"eth1", "", 1}, {"eth2", "", 1}, {"eth3", "", 1}};
  RailSpec s;
  std::string err;
  REQUIRE(parseRailSpec("eth2+eth0", &s, &err));
  std::vector<std::string> warnings;
  auto g = groupRails(nics, {}, s, &warnings);
  // The group sits where its first NIC was found; rail order is the order given.
  CHECK(g == std::vector<std::vector<int>>{{2, 0}, {1}, {3}});
  CHECK(warnings.empty());

  REQUIRE(parseRailSpec("eth0+eth9,eth1+eth1", &s, &err));
  g = groupRails(nics, {}, s, &warnings);
  CHECK(g == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}});
  REQUIRE(warnings.size() == 2);
  CHECK(warnings[0].find("eth9") != std::string::npos);
  CHECK(warnings[1].find("eth1") != std::string::npos);

  REQUIRE(parseRailSpec("eth0+eth1,eth1+eth2", &s, &err));
  warnings.clear();
  g = groupRails(nics, {}, s, &warnings);
  CHECK(g == std::vector<std::vector<int>>{{0, 1}, {2}, {3}});
  CHECK(warnings.size() == 1);
}
