// SPDX-License-Identifier: Apache-2.0
// Which NICs make one device: WEFT_RAILS parsing and the PCI-locality rule, on made-up machines.
#include <catch2/catch.hpp>

#include "fabric/rails.h"

using namespace weft::fabric;

namespace {
const std::string kRoot = "/sys/devices/pci0000:00/";
// A GPU server: two PCIe switches, each with a GPU and two NICs; one NIC straight on a root port.
const std::string kSw0 = kRoot + "0000:00:01.0/0000:01:00.0/";
const std::string kSw1 = kRoot + "0000:00:02.0/0000:02:00.0/";
std::vector<NicInfo> serverNics() {
  return {{"efa0", kSw0 + "0000:01:08.0/0000:03:00.0", 100000},
          {"efa1", kSw0 + "0000:01:09.0/0000:04:00.0", 100000},
          {"efa2", kSw1 + "0000:02:08.0/0000:05:00.0", 100000},
          {"efa3", kSw1 + "0000:02:09.0/0000:06:00.0", 100000},
          {"eth0", kRoot + "0000:00:03.0", 25000}};
}
const std::vector<std::string> kGpus = {kSw0 + "0000:01:10.0/0000:07:00.0", kSw1 + "0000:02:10.0/0000:08:00.0"};
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
  // Grouping by PCI locality stops at the table's limit too: six NICs under one switch make one device of 4.
  std::vector<NicInfo> nics;
  for (int i = 0; i < 6; ++i) {
    NicInfo n;
    n.name = "n" + std::to_string(i);
    n.pciPath = kSw0 + "0000:01:1" + std::to_string(i) + ".0/0000:0" + std::to_string(i + 1) + ":00.0";
    n.speedMbps = 100000;
    nics.push_back(n);
  }
  std::vector<std::string> warnings;
  auto groups4 = groupRails(nics, {kGpus[0]}, RailSpec{}, &warnings);
  CHECK(groups4[0].size() == 4);
  weft::setNetTableVersion(12);
  auto groups8 = groupRails(nics, {kGpus[0]}, RailSpec{}, &warnings);
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

TEST_CASE("pciChain lists bus ids from the root port down", "[rails]") {
  CHECK(pciChain(kSw0 + "0000:01:08.0/0000:03:00.0") ==
        std::vector<std::string>{"0000:00:01.0", "0000:01:00.0", "0000:01:08.0", "0000:03:00.0"});
  CHECK(pciChain("/sys/devices/virtual/net/veth0").empty());
  CHECK(pciChain("").empty());
}

TEST_CASE("auto fuses the NICs that share a GPU's switch, at equal speed", "[rails]") {
  std::vector<std::string> warnings;
  auto g = groupRails(serverNics(), kGpus, RailSpec{}, &warnings);
  CHECK(warnings.empty());
  CHECK(g == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4}});
  // Without GPUs (or with rails off) every NIC stays alone.
  CHECK(groupRails(serverNics(), {}, RailSpec{}, &warnings) ==
        std::vector<std::vector<int>>{{0}, {1}, {2}, {3}, {4}});
  RailSpec off;
  off.mode = RailSpec::Mode::kOff;
  CHECK(groupRails(serverNics(), kGpus, off, &warnings).size() == 5);
  // A slower NIC under the same switch is not fused with the fast ones.
  auto nics = serverNics();
  nics[1].speedMbps = 25000;
  CHECK(groupRails(nics, kGpus, RailSpec{}, &warnings) == std::vector<std::vector<int>>{{0}, {1}, {2, 3}, {4}});
  // Virtual NICs (no PCI path) are never fused automatically.
  std::vector<NicInfo> veths = {{"veth0", "", 10000}, {"veth1", "", 10000}};
  CHECK(groupRails(veths, kGpus, RailSpec{}, &warnings).size() == 2);
}

TEST_CASE("auto never puts more than kMaxRails NICs in one device", "[rails]") {
  std::vector<NicInfo> nics;
  for (int i = 0; i < kMaxRails + 2; ++i) {
    char bdf[32];
    std::snprintf(bdf, sizeof(bdf), "0000:01:%02x.0/0000:%02x:00.0", 8 + i, 0x10 + i);
    nics.push_back({"nic" + std::to_string(i), kSw0 + bdf, 100000});
  }
  std::vector<std::string> warnings;
  auto g = groupRails(nics, {kGpus[0]}, RailSpec{}, &warnings);
  REQUIRE(g.size() == 3);
  CHECK(static_cast<int>(g[0].size()) == kMaxRails);
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
