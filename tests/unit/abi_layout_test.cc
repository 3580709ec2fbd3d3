// Proves that our own declarations of NCCL's plugin ABI have exactly the field offsets and sizes that NCCL's
// headers have (layouts.tsv, measured from NCCL itself), for every struct we declare, and that we declare no
// field NCCL does not have.
#include <catch2/catch.hpp>

#include <cstddef>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "weft/nccl/net.h"

namespace {

struct Layout {
  std::string type;
  std::string field;
  size_t offset;
  size_t size;
};

#define WEFT_F(T, f) Layout{#T, #f, offsetof(T, f), sizeof(((T*)nullptr)->f)}
#define WEFT_A(T, f, n) Layout{#T, #f "[" #n "]", offsetof(T, f), sizeof(((T*)nullptr)->f)}
#define WEFT_S(T) Layout{#T, "sizeof", 0, sizeof(T)}

#define WEFT_NET_COMMON(T)                                                                                   \
  WEFT_S(T), WEFT_F(T, name), WEFT_F(T, init), WEFT_F(T, devices), WEFT_F(T, getProperties), WEFT_F(T, listen), \
      WEFT_F(T, connect), WEFT_F(T, accept), WEFT_F(T, regMr), WEFT_F(T, regMrDmaBuf), WEFT_F(T, deregMr),     \
      WEFT_F(T, isend), WEFT_F(T, irecv), WEFT_F(T, iflush), WEFT_F(T, test), WEFT_F(T, closeSend),            \
      WEFT_F(T, closeRecv), WEFT_F(T, closeListen)

#define WEFT_PROPS_V6(T)                                                                                        \
  WEFT_S(T), WEFT_F(T, name), WEFT_F(T, pciPath), WEFT_F(T, guid), WEFT_F(T, ptrSupport), WEFT_F(T, speed),     \
      WEFT_F(T, port), WEFT_F(T, latency), WEFT_F(T, maxComms), WEFT_F(T, maxRecvs)

#define WEFT_PROPS_V9(T, n)                                                                                     \
  WEFT_S(T), WEFT_F(T, name), WEFT_F(T, pciPath), WEFT_F(T, guid), WEFT_F(T, ptrSupport), WEFT_F(T, regIsGlobal), \
      WEFT_F(T, forceFlush), WEFT_F(T, speed), WEFT_F(T, port), WEFT_F(T, latency), WEFT_F(T, maxComms),        \
      WEFT_F(T, maxRecvs), WEFT_F(T, netDeviceType), WEFT_F(T, netDeviceVersion), WEFT_F(T, vProps),            \
      WEFT_F(T, vProps.ndevs), WEFT_A(T, vProps.devs, n), WEFT_F(T, maxP2pBytes), WEFT_F(T, maxCollBytes)

#define WEFT_ATTR(T)                                                                                          \
  WEFT_S(T), WEFT_F(T, sendCommAttr), WEFT_F(T, sendCommAttr.maxConcurrentPeers),                             \
      WEFT_F(T, sendCommAttr.minConcurrentPeers), WEFT_F(T, sendCommAttr.maxFlowsPerPeer),                    \
      WEFT_F(T, sendCommAttr.minFlowsPerPeer), WEFT_F(T, recvCommAttr), WEFT_F(T, recvCommAttr.maxConcurrentPeers), \
      WEFT_F(T, recvCommAttr.minConcurrentPeers), WEFT_F(T, recvCommAttr.maxFlowsPerPeer),                    \
      WEFT_F(T, recvCommAttr.minFlowsPerPeer), WEFT_F(T, op), WEFT_F(T, algo), WEFT_F(T, proto)

#define WEFT_COMM_ATTR(T)                                                                                     \
  WEFT_S(T), WEFT_F(T, maxConcurrentPeers), WEFT_F(T, minConcurrentPeers), WEFT_F(T, maxFlowsPerPeer),        \
      WEFT_F(T, minFlowsPerPeer)

// Every struct we declare, field by field.
const std::vector<Layout>& ourLayouts() {
  static const std::vector<Layout> kAll = {
      // net function tables
      WEFT_NET_COMMON(ncclNet_v6_t),
      WEFT_NET_COMMON(ncclNet_v7_t), WEFT_F(ncclNet_v7_t, getDeviceMr), WEFT_F(ncclNet_v7_t, irecvConsumed),
      WEFT_NET_COMMON(ncclNet_v8_t), WEFT_F(ncclNet_v8_t, getDeviceMr), WEFT_F(ncclNet_v8_t, irecvConsumed),
      WEFT_NET_COMMON(ncclNet_v9_t), WEFT_F(ncclNet_v9_t, getDeviceMr), WEFT_F(ncclNet_v9_t, irecvConsumed),
      WEFT_F(ncclNet_v9_t, makeVDevice),
      WEFT_NET_COMMON(ncclNet_v10_t), WEFT_F(ncclNet_v10_t, getDeviceMr), WEFT_F(ncclNet_v10_t, irecvConsumed),
      WEFT_F(ncclNet_v10_t, makeVDevice),
      WEFT_NET_COMMON(ncclNet_v11_t), WEFT_F(ncclNet_v11_t, getDeviceMr), WEFT_F(ncclNet_v11_t, irecvConsumed),
      WEFT_F(ncclNet_v11_t, makeVDevice), WEFT_F(ncclNet_v11_t, finalize), WEFT_F(ncclNet_v11_t, setNetAttr),
      WEFT_NET_COMMON(ncclNet_v12_t), WEFT_F(ncclNet_v12_t, getDeviceMr), WEFT_F(ncclNet_v12_t, irecvConsumed),
      WEFT_F(ncclNet_v12_t, makeVDevice), WEFT_F(ncclNet_v12_t, finalize), WEFT_F(ncclNet_v12_t, setNetAttr),
      // properties
      WEFT_PROPS_V6(ncclNetProperties_v6_t),
      WEFT_PROPS_V6(ncclNetProperties_v7_t), WEFT_F(ncclNetProperties_v7_t, netDeviceType),
      WEFT_F(ncclNetProperties_v7_t, netDeviceVersion),
      WEFT_PROPS_V6(ncclNetProperties_v8_t), WEFT_F(ncclNetProperties_v8_t, regIsGlobal),
      WEFT_F(ncclNetProperties_v8_t, netDeviceType), WEFT_F(ncclNetProperties_v8_t, netDeviceVersion),
      WEFT_PROPS_V9(ncclNetProperties_v9_t, 4),
      WEFT_PROPS_V9(ncclNetProperties_v10_t, 4),
      WEFT_PROPS_V9(ncclNetProperties_v11_t, 4), WEFT_F(ncclNetProperties_v11_t, maxMultiRequestSize),
      WEFT_PROPS_V9(ncclNetProperties_v12_t, 8), WEFT_F(ncclNetProperties_v12_t, maxMultiRequestSize),
      WEFT_F(ncclNetProperties_v12_t, railId), WEFT_F(ncclNetProperties_v12_t, planeId),
      // helpers
      WEFT_S(ncclNetDeviceHandle_v7_t), WEFT_F(ncclNetDeviceHandle_v7_t, netDeviceType),
      WEFT_F(ncclNetDeviceHandle_v7_t, netDeviceVersion), WEFT_F(ncclNetDeviceHandle_v7_t, handle),
      WEFT_F(ncclNetDeviceHandle_v7_t, size), WEFT_F(ncclNetDeviceHandle_v7_t, needsProxyProgress),
      WEFT_S(ncclNetVDeviceProps_v9_t), WEFT_F(ncclNetVDeviceProps_v9_t, ndevs), WEFT_A(ncclNetVDeviceProps_v9_t, devs, 4),
      WEFT_S(ncclNetVDeviceProps_v10_t), WEFT_F(ncclNetVDeviceProps_v10_t, ndevs),
      WEFT_A(ncclNetVDeviceProps_v10_t, devs, 4),
      WEFT_S(ncclNetVDeviceProps_v11_t), WEFT_F(ncclNetVDeviceProps_v11_t, ndevs),
      WEFT_A(ncclNetVDeviceProps_v11_t, devs, 4),
      WEFT_S(ncclNetVDeviceProps_v12_t), WEFT_F(ncclNetVDeviceProps_v12_t, ndevs),
      WEFT_A(ncclNetVDeviceProps_v12_t, devs, 8),
      WEFT_S(ncclNetCommConfig_v10_t), WEFT_F(ncclNetCommConfig_v10_t, trafficClass),
      WEFT_S(ncclNetCommConfig_v11_t), WEFT_F(ncclNetCommConfig_v11_t, trafficClass),
      WEFT_S(ncclNetCommConfig_v12_t), WEFT_F(ncclNetCommConfig_v12_t, trafficClass),
      WEFT_COMM_ATTR(ncclNetCommAttr_v11_t), WEFT_COMM_ATTR(ncclNetCommAttr_v12_t),
      WEFT_ATTR(ncclNetAttr_v11_t), WEFT_ATTR(ncclNetAttr_v12_t),
  };
  return kAll;
}

std::vector<Layout> readTsv(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<Layout> rows;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream ls(line);
    Layout row;
    REQUIRE(std::getline(ls, row.type, '\t'));
    REQUIRE(std::getline(ls, row.field, '\t'));
    std::string off, size;
    REQUIRE(std::getline(ls, off, '\t'));
    REQUIRE(std::getline(ls, size, '\t'));
    row.offset = std::stoul(off);
    row.size = std::stoul(size);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

TEST_CASE("every field of every NCCL struct we declare has NCCL's offset and size", "[abi]") {
  const auto nccl = readTsv(WEFT_LAYOUTS_TSV);
  std::map<std::pair<std::string, std::string>, Layout> ncclByKey;
  for (const auto& r : nccl) ncclByKey[{r.type, r.field}] = r;

  std::set<std::string> ourTypes;
  for (const auto& ours : ourLayouts()) {
    ourTypes.insert(ours.type);
    INFO(ours.type << "." << ours.field);
    auto it = ncclByKey.find({ours.type, ours.field});
    REQUIRE(it != ncclByKey.end());  // a field NCCL does not have
    CHECK(ours.offset == it->second.offset);
    CHECK(ours.size == it->second.size);
  }
  // Conversely: every field NCCL lists for a type we declare is declared (and checked) by us.
  std::set<std::pair<std::string, std::string>> oursByKey;
  for (const auto& ours : ourLayouts()) oursByKey.insert({ours.type, ours.field});
  size_t covered = 0;
  for (const auto& r : nccl) {
    if (!ourTypes.count(r.type)) continue;
    INFO(r.type << "." << r.field << " is in NCCL's layout but not checked here");
    CHECK(oursByKey.count({r.type, r.field}) == 1);
    ++covered;
  }
  CHECK(covered == ourLayouts().size());
}

TEST_CASE("the in-repo copy of layouts.tsv matches ../shared when that is present", "[abi]") {
  std::ifstream shared(WEFT_SHARED_LAYOUTS_TSV);
  if (!shared.good()) {
    WARN("../shared/nccl-abi/layouts.tsv not present beside this checkout; comparing nothing");
    SUCCEED();
    return;
  }
  std::ifstream local(WEFT_REPO_LAYOUTS_TSV);
  REQUIRE(local.good());
  std::stringstream a, b;
  a << shared.rdbuf();
  b << local.rdbuf();
  CHECK(a.str() == b.str());
}
