// SPDX-License-Identifier: Apache-2.0
// Discovery from fi_info lists shaped as providers return them (fabric::candidatesFrom): which entries become
// devices. The EFA lists follow libfabric 2.1.0's efa provider (prov/efa/src/efa_prov.c: each device offered as
// fabric "efa-direct" first, with the device's own capabilities and no tagged messages, then as fabric "efa", the
// reliable-datagram endpoint with the provider's protocol, then as a datagram endpoint). No EFA host was available:
// they are written from that source, not recorded from a machine.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fabric/fabric_device.h"
#include "weft/common/cuda_shim.h"
#include "weft/nccl/net.h"

namespace {

using weft::fabric::Candidate;
using weft::fabric::candidatesFrom;

struct Entry {
  const char* prov;
  const char* fabric;
  const char* domain;
  fi_ep_type type;
  uint64_t caps;
  uint32_t addrFormat = FI_FORMAT_UNSPEC;
  const char* ip = nullptr;  // FI_SOCKADDR_IN / FI_SOCKADDR_IN6 source address
};

// A list as fi_getinfo hands it out, owned by the returned pointer (fi_freeinfo frees every string and address).
weft::fabric::InfoPtr makeList(const std::vector<Entry>& entries) {
  fi_info* head = nullptr;
  fi_info* tail = nullptr;
  for (const Entry& e : entries) {
    fi_info* i = fi_allocinfo();
    REQUIRE(i != nullptr);
    i->fabric_attr->prov_name = strdup(e.prov);
    i->fabric_attr->name = strdup(e.fabric);
    i->domain_attr->name = strdup(e.domain);
    i->ep_attr->type = e.type;
    i->caps = e.caps;
    i->addr_format = e.addrFormat;
    i->tx_attr->inject_size = 64;
    i->ep_attr->max_msg_size = size_t{1} << 30;
    if (e.addrFormat == FI_SOCKADDR_IN) {
      auto* sa = static_cast<sockaddr_in*>(calloc(1, sizeof(sockaddr_in)));
      sa->sin_family = AF_INET;
      REQUIRE(inet_pton(AF_INET, e.ip, &sa->sin_addr) == 1);
      i->src_addr = sa;
      i->src_addrlen = sizeof(sockaddr_in);
    } else if (e.addrFormat == FI_SOCKADDR_IN6) {
      auto* sa = static_cast<sockaddr_in6*>(calloc(1, sizeof(sockaddr_in6)));
      sa->sin6_family = AF_INET6;
      REQUIRE(inet_pton(AF_INET6, e.ip, &sa->sin6_addr) == 1);
      i->src_addr = sa;
      i->src_addrlen = sizeof(sockaddr_in6);
    }
    (head == nullptr ? head : tail->next) = i;
    tail = i;
  }
  return weft::fabric::InfoPtr(head);
}

constexpr uint64_t kRdmCaps = FI_MSG | FI_TAGGED | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE |
                              FI_SEND | FI_RECV;
constexpr uint64_t kDirectCaps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE |
                                 FI_SEND | FI_RECV;

std::vector<std::string> names(const std::vector<Candidate>& c) {
  std::vector<std::string> out;
  for (const auto& x : c) out.push_back(x.props.name + "@" + x.props.fabric);
  return out;
}

}  // namespace

TEST_CASE("discovery on a libfabric 2.x EFA host: the efa fabric's reliable endpoints, one device per NIC",
          "[fabric][discovery]") {
  auto list = makeList({
      {"efa", "efa-direct", "rdmap16s27-rdm", FI_EP_RDM, kDirectCaps, FI_ADDR_EFA},
      {"efa", "efa-direct", "rdmap32s27-rdm", FI_EP_RDM, kDirectCaps, FI_ADDR_EFA},
      {"efa", "efa", "rdmap16s27-rdm", FI_EP_RDM, kRdmCaps | FI_HMEM, FI_ADDR_EFA},
      {"efa", "efa", "rdmap32s27-rdm", FI_EP_RDM, kRdmCaps | FI_HMEM, FI_ADDR_EFA},
      {"efa", "efa", "rdmap16s27-dgrm", FI_EP_DGRAM, FI_MSG | FI_SEND | FI_RECV, FI_ADDR_EFA},
      {"efa", "efa", "rdmap32s27-dgrm", FI_EP_DGRAM, FI_MSG | FI_SEND | FI_RECV, FI_ADDR_EFA},
  });
  auto found = candidatesFrom(list.get(), "efa", false);
  CHECK(names(found) == std::vector<std::string>{"rdmap16s27-rdm@efa", "rdmap32s27-rdm@efa"});
  for (const auto& c : found) {
    CHECK(c.props.provider == "efa");
    CHECK(c.info->ep_attr->type == FI_EP_RDM);
    CHECK((c.info->caps & FI_TAGGED) != 0);
    CHECK(c.props.ptrSupport == NCCL_PTR_HOST);  // GPU memory not asked for
  }
  // Any provider: the same two.
  CHECK(names(candidatesFrom(list.get(), "", false)) == names(found));
  // Another provider named: nothing.
  CHECK(candidatesFrom(list.get(), "tcp;ofi_rxm", false).empty());
}

TEST_CASE("discovery: GPU memory only with FI_HMEM, RMA reads and a CUDA driver", "[fabric][discovery]") {
  auto list = makeList({
      {"efa", "efa", "with-hmem", FI_EP_RDM, kRdmCaps | FI_HMEM, FI_ADDR_EFA},
      {"efa", "efa", "no-hmem", FI_EP_RDM, kRdmCaps, FI_ADDR_EFA},
      {"efa", "efa", "hmem-no-read", FI_EP_RDM, (kRdmCaps & ~FI_READ) | FI_HMEM, FI_ADDR_EFA},
  });
  auto found = candidatesFrom(list.get(), "efa", true);
  REQUIRE(found.size() == 3);
  const bool gpu = weft::cuda::compiledIn() && weft::cuda::driverPresent();
  CHECK(((found[0].props.ptrSupport & NCCL_PTR_CUDA) != 0) == gpu);
  CHECK(found[1].props.ptrSupport == NCCL_PTR_HOST);
  CHECK(found[2].props.ptrSupport == NCCL_PTR_HOST);
}

TEST_CASE("discovery on tcp: IPv4 before IPv6, link-local-only interfaces left out, other providers filtered",
          "[fabric][discovery]") {
  auto list = makeList({
      {"tcp;ofi_rxm", "10.0.0.0/24", "eth0", FI_EP_RDM, kRdmCaps, FI_SOCKADDR_IN6, "fd00::2"},
      {"tcp;ofi_rxm", "10.0.0.0/24", "eth0", FI_EP_RDM, kRdmCaps, FI_SOCKADDR_IN, "10.0.0.2"},
      {"tcp;ofi_rxm", "fe80::/64", "eth1", FI_EP_RDM, kRdmCaps, FI_SOCKADDR_IN6, "fe80::1"},
      {"tcp;ofi_rxm", "fd01::/64", "eth2", FI_EP_RDM, kRdmCaps, FI_SOCKADDR_IN6, "fd01::5"},
      {"tcp", "10.0.0.0/24", "eth0", FI_EP_MSG, FI_MSG | FI_SEND | FI_RECV, FI_SOCKADDR_IN, "10.0.0.2"},
      {"shm", "shm", "shm", FI_EP_RDM, kRdmCaps, FI_ADDR_STR},
  });
  auto rxm = candidatesFrom(list.get(), "tcp;ofi_rxm", false);
  REQUIRE(names(rxm) == std::vector<std::string>{"eth0@10.0.0.0/24", "eth2@fd01::/64"});
  CHECK(rxm[0].info->addr_format == FI_SOCKADDR_IN);
  // 1.17's tcp offers message endpoints only: not a device (2.x's reliable-datagram tcp is).
  CHECK(candidatesFrom(list.get(), "tcp", false).empty());
  CHECK(names(candidatesFrom(list.get(), "shm", false)) == std::vector<std::string>{"shm@shm"});
}
