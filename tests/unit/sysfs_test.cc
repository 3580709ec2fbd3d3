// SPDX-License-Identifier: Apache-2.0
// The link-state source of a NIC, read from a sysfs tree made here: a network interface, an EFA domain (its name
// is the RDMA device's with "-rdm"), a verbs device with two ports (the one whose GID table holds the endpoint's
// address), a name sysfs does not know.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "weft/common/sysfs.h"

using weft::sysfs::LinkSource;

namespace {

struct Tree {
  std::string root;
  Tree() {
    char tmpl[] = "/tmp/weft-sysfs-XXXXXX";
    root = mkdtemp(tmpl);
  }
  ~Tree() { std::system(("rm -rf '" + root + "'").c_str()); }
  void write(const std::string& rel, const std::string& text) {
    std::string path = root + "/" + rel;
    for (size_t i = root.size() + 1; i < path.size(); ++i)
      if (path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
    std::ofstream(path) << text;
  }
};

}  // namespace

TEST_CASE("link state: netdev operstate, EFA and verbs port state, unknown names count as up", "[sysfs]") {
  Tree t;
  t.write("class/net/eth0/operstate", "up\n");
  t.write("class/net/lo/operstate", "unknown\n");
  t.write("class/infiniband/rdmap16s27/ports/1/state", "4: ACTIVE\n");
  t.write("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
  t.write("class/infiniband/mlx5_0/ports/1/gids/0", "fe80:0000:0000:0000:0000:0000:0000:0001\n");
  t.write("class/infiniband/mlx5_0/ports/2/state", "4: ACTIVE\n");
  t.write("class/infiniband/mlx5_0/ports/2/gids/0", "fe80:0000:0000:0000:0000:0000:0000:0002\n");
  t.write("class/infiniband/mlx5_0/ports/2/gids/1", "0000:0000:0000:0000:0000:ffff:0a00:0002\n");

  LinkSource eth = weft::sysfs::linkSourceFor("eth0", nullptr, t.root);
  CHECK(eth.kind == LinkSource::Kind::kNetdev);
  CHECK(weft::sysfs::linkUp(eth));
  t.write("class/net/eth0/operstate", "down\n");
  CHECK_FALSE(weft::sysfs::linkUp(eth));
  CHECK(weft::sysfs::linkUp(weft::sysfs::linkSourceFor("lo", nullptr, t.root)));  // loopback says "unknown"

  // EFA: libfabric names the domain "<device>-rdm"; the device has one port.
  LinkSource efa = weft::sysfs::linkSourceFor("rdmap16s27-rdm", nullptr, t.root);
  REQUIRE(efa.kind == LinkSource::Kind::kRdmaPort);
  CHECK(efa.describe == "rdmap16s27 port 1");
  CHECK(weft::sysfs::linkUp(efa));
  t.write("class/infiniband/rdmap16s27/ports/1/state", "1: DOWN\n");
  CHECK_FALSE(weft::sysfs::linkUp(efa));

  // Two ports: the one whose GID table holds the source address (10.0.0.2, IPv4-mapped), else port 1.
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  inet_pton(AF_INET, "10.0.0.2", &sin.sin_addr);
  LinkSource two = weft::sysfs::linkSourceFor("mlx5_0", reinterpret_cast<sockaddr*>(&sin), t.root);
  REQUIRE(two.kind == LinkSource::Kind::kRdmaPort);
  CHECK(two.describe == "mlx5_0 port 2");
  t.write("class/infiniband/mlx5_0/ports/2/state", "1: DOWN\n");
  CHECK_FALSE(weft::sysfs::linkUp(two));
  sockaddr_in6 sin6{};
  sin6.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "fe80::1", &sin6.sin6_addr);
  CHECK(weft::sysfs::linkSourceFor("mlx5_0", reinterpret_cast<sockaddr*>(&sin6), t.root).describe == "mlx5_0 port 1");
  inet_pton(AF_INET, "10.9.9.9", &sin.sin_addr);
  LinkSource guess = weft::sysfs::linkSourceFor("mlx5_0", reinterpret_cast<sockaddr*>(&sin), t.root);
  CHECK(guess.describe.rfind("mlx5_0 port 1 (", 0) == 0);  // says it is an assumption

  LinkSource none = weft::sysfs::linkSourceFor("nosuch0", nullptr, t.root);
  CHECK(none.kind == LinkSource::Kind::kNone);
  CHECK(weft::sysfs::linkUp(none));
  CHECK(weft::sysfs::linkSourceFor("../../etc", nullptr, t.root).kind == LinkSource::Kind::kNone);
  // An attribute that vanished (device removed) is not a link down.
  std::remove((t.root + "/class/net/eth0/operstate").c_str());
  CHECK(weft::sysfs::linkUp(eth));
  CHECK(weft::sysfs::readLine(t.root + "/class/infiniband/mlx5_0/ports/1/state") == "4: ACTIVE");
  CHECK(weft::sysfs::readLine(t.root + "/nothing") == "");
}
