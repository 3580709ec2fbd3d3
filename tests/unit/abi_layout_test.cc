// SPDX-License-Identifier: Apache-2.0
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

#include "tests/support/skip.h"
#include "weft/nccl/net.h"
#include "weft/nccl/profiler.h"
#include "weft/nccl/rma.h"
#include "weft/nccl/tuner.h"

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
      // tuner tables and the model constants of v5+
#define WEFT_TUNER4(T, last) WEFT_S(T), WEFT_F(T, name), WEFT_F(T, init), WEFT_F(T, getCollInfo), WEFT_F(T, last)
      WEFT_TUNER4(ncclTuner_v1_t, destroy), WEFT_TUNER4(ncclTuner_v2_t, destroy), WEFT_TUNER4(ncclTuner_v3_t, destroy),
      WEFT_TUNER4(ncclTuner_v4_t, destroy), WEFT_TUNER4(ncclTuner_v5_t, finalize),
      WEFT_TUNER4(ncclTuner_v6_t, finalize), WEFT_F(ncclTuner_v6_t, getChunkSize),
      WEFT_TUNER4(ncclTuner_v7_t, finalize), WEFT_F(ncclTuner_v7_t, getChunkSize),
#undef WEFT_TUNER4
      WEFT_S(ncclTunerConstants_v7_t), WEFT_A(ncclTunerConstants_v7_t, baseLatencies, 7][3),
      WEFT_A(ncclTunerConstants_v7_t, hwLatencies, 3][7][3), WEFT_A(ncclTunerConstants_v7_t, llMaxBws, 5][3),
      WEFT_A(ncclTunerConstants_v7_t, perChMaxRingLL128Bws, 5][3),
      WEFT_A(ncclTunerConstants_v7_t, perChMaxTreeLL128Bws, 5][3),
      WEFT_A(ncclTunerConstants_v7_t, perChMaxTreeBws, 5][3), WEFT_A(ncclTunerConstants_v7_t, perChMaxNVLSTreeBws, 5][3),
      WEFT_S(ncclTunerConstants_v5_t), WEFT_A(ncclTunerConstants_v5_t, baseLatencies, 7][3),
      WEFT_A(ncclTunerConstants_v5_t, hwLatencies, 3][7][3), WEFT_A(ncclTunerConstants_v5_t, llMaxBws, 4][3),
      WEFT_A(ncclTunerConstants_v5_t, perChMaxRingLL128Bws, 4][3),
      WEFT_A(ncclTunerConstants_v5_t, perChMaxTreeLL128Bws, 4][3),
      WEFT_A(ncclTunerConstants_v5_t, perChMaxTreeBws, 4][3), WEFT_A(ncclTunerConstants_v5_t, perChMaxNVLSTreeBws, 4][3),
      // profiler tables, descriptors (every arm of every version) and NCCL's net-event descriptors
      WEFT_F(ncclProfilerEventDescr_v1_t, type), WEFT_F(ncclProfilerEventDescr_v1_t, parentObj), WEFT_F(ncclProfilerEventDescr_v1_t, rank),
      WEFT_F(ncclProfilerEventDescr_v1_t, coll), WEFT_F(ncclProfilerEventDescr_v1_t, coll.name), WEFT_F(ncclProfilerEventDescr_v1_t, coll.commHash),
      WEFT_F(ncclProfilerEventDescr_v1_t, coll.seqNumber), WEFT_F(ncclProfilerEventDescr_v1_t, coll.func), WEFT_F(ncclProfilerEventDescr_v1_t, coll.sendBuff),
      WEFT_F(ncclProfilerEventDescr_v1_t, coll.recvBuff), WEFT_F(ncclProfilerEventDescr_v1_t, coll.count), WEFT_F(ncclProfilerEventDescr_v1_t, coll.root),
      WEFT_F(ncclProfilerEventDescr_v1_t, coll.datatype), WEFT_F(ncclProfilerEventDescr_v1_t, coll.op), WEFT_F(ncclProfilerEventDescr_v1_t, coll.trafficBytes),
      WEFT_F(ncclProfilerEventDescr_v1_t, coll.nMaxChannels), WEFT_F(ncclProfilerEventDescr_v1_t, coll.nWarps), WEFT_F(ncclProfilerEventDescr_v1_t, coll.algo),
      WEFT_F(ncclProfilerEventDescr_v1_t, coll.proto), WEFT_F(ncclProfilerEventDescr_v1_t, coll.isCollnet), WEFT_F(ncclProfilerEventDescr_v1_t, coll.isNvls),
      WEFT_F(ncclProfilerEventDescr_v1_t, p2p), WEFT_F(ncclProfilerEventDescr_v1_t, p2p.name), WEFT_F(ncclProfilerEventDescr_v1_t, p2p.commHash),
      WEFT_F(ncclProfilerEventDescr_v1_t, p2p.func), WEFT_F(ncclProfilerEventDescr_v1_t, p2p.buff), WEFT_F(ncclProfilerEventDescr_v1_t, p2p.datatype),
      WEFT_F(ncclProfilerEventDescr_v1_t, p2p.count), WEFT_F(ncclProfilerEventDescr_v1_t, p2p.peer), WEFT_F(ncclProfilerEventDescr_v1_t, proxyOp),
      WEFT_F(ncclProfilerEventDescr_v1_t, proxyOp.pid), WEFT_F(ncclProfilerEventDescr_v1_t, proxyOp.channelId), WEFT_F(ncclProfilerEventDescr_v1_t, proxyOp.peer),
      WEFT_F(ncclProfilerEventDescr_v1_t, proxyOp.nSteps), WEFT_F(ncclProfilerEventDescr_v1_t, proxyOp.chunkSize), WEFT_F(ncclProfilerEventDescr_v1_t, proxyOp.isSend),
      WEFT_F(ncclProfilerEventDescr_v1_t, proxyStep), WEFT_F(ncclProfilerEventDescr_v1_t, proxyStep.step), WEFT_S(ncclProfilerEventDescr_v1_t),
      WEFT_F(ncclProfilerEventDescr_v2_t, type), WEFT_F(ncclProfilerEventDescr_v2_t, parentObj), WEFT_F(ncclProfilerEventDescr_v2_t, rank),
      WEFT_F(ncclProfilerEventDescr_v2_t, coll), WEFT_F(ncclProfilerEventDescr_v2_t, coll.name), WEFT_F(ncclProfilerEventDescr_v2_t, coll.commHash),
      WEFT_F(ncclProfilerEventDescr_v2_t, coll.seqNumber), WEFT_F(ncclProfilerEventDescr_v2_t, coll.func), WEFT_F(ncclProfilerEventDescr_v2_t, coll.sendBuff),
      WEFT_F(ncclProfilerEventDescr_v2_t, coll.recvBuff), WEFT_F(ncclProfilerEventDescr_v2_t, coll.count), WEFT_F(ncclProfilerEventDescr_v2_t, coll.root),
      WEFT_F(ncclProfilerEventDescr_v2_t, coll.datatype), WEFT_F(ncclProfilerEventDescr_v2_t, coll.trafficBytes), WEFT_F(ncclProfilerEventDescr_v2_t, coll.nMaxChannels),
      WEFT_F(ncclProfilerEventDescr_v2_t, coll.nWarps), WEFT_F(ncclProfilerEventDescr_v2_t, coll.algo), WEFT_F(ncclProfilerEventDescr_v2_t, coll.proto),
      WEFT_F(ncclProfilerEventDescr_v2_t, p2p), WEFT_F(ncclProfilerEventDescr_v2_t, p2p.name), WEFT_F(ncclProfilerEventDescr_v2_t, p2p.commHash),
      WEFT_F(ncclProfilerEventDescr_v2_t, p2p.func), WEFT_F(ncclProfilerEventDescr_v2_t, p2p.buff), WEFT_F(ncclProfilerEventDescr_v2_t, p2p.datatype),
      WEFT_F(ncclProfilerEventDescr_v2_t, p2p.count), WEFT_F(ncclProfilerEventDescr_v2_t, p2p.peer), WEFT_F(ncclProfilerEventDescr_v2_t, proxyOp),
      WEFT_F(ncclProfilerEventDescr_v2_t, proxyOp.pid), WEFT_F(ncclProfilerEventDescr_v2_t, proxyOp.channelId), WEFT_F(ncclProfilerEventDescr_v2_t, proxyOp.peer),
      WEFT_F(ncclProfilerEventDescr_v2_t, proxyOp.nSteps), WEFT_F(ncclProfilerEventDescr_v2_t, proxyOp.chunkSize), WEFT_F(ncclProfilerEventDescr_v2_t, proxyOp.isSend),
      WEFT_F(ncclProfilerEventDescr_v2_t, proxyStep), WEFT_F(ncclProfilerEventDescr_v2_t, proxyStep.step), WEFT_S(ncclProfilerEventDescr_v2_t),
      WEFT_F(ncclProfilerEventDescr_v3_t, type), WEFT_F(ncclProfilerEventDescr_v3_t, parentObj), WEFT_F(ncclProfilerEventDescr_v3_t, rank),
      WEFT_F(ncclProfilerEventDescr_v3_t, coll), WEFT_F(ncclProfilerEventDescr_v3_t, coll.name), WEFT_F(ncclProfilerEventDescr_v3_t, coll.commHash),
      WEFT_F(ncclProfilerEventDescr_v3_t, coll.seqNumber), WEFT_F(ncclProfilerEventDescr_v3_t, coll.func), WEFT_F(ncclProfilerEventDescr_v3_t, coll.sendBuff),
      WEFT_F(ncclProfilerEventDescr_v3_t, coll.recvBuff), WEFT_F(ncclProfilerEventDescr_v3_t, coll.count), WEFT_F(ncclProfilerEventDescr_v3_t, coll.root),
      WEFT_F(ncclProfilerEventDescr_v3_t, coll.datatype), WEFT_F(ncclProfilerEventDescr_v3_t, coll.nMaxChannels), WEFT_F(ncclProfilerEventDescr_v3_t, coll.nWarps),
      WEFT_F(ncclProfilerEventDescr_v3_t, coll.algo), WEFT_F(ncclProfilerEventDescr_v3_t, coll.proto), WEFT_F(ncclProfilerEventDescr_v3_t, p2p),
      WEFT_F(ncclProfilerEventDescr_v3_t, p2p.name), WEFT_F(ncclProfilerEventDescr_v3_t, p2p.commHash), WEFT_F(ncclProfilerEventDescr_v3_t, p2p.func),
      WEFT_F(ncclProfilerEventDescr_v3_t, p2p.buff), WEFT_F(ncclProfilerEventDescr_v3_t, p2p.datatype), WEFT_F(ncclProfilerEventDescr_v3_t, p2p.count),
      WEFT_F(ncclProfilerEventDescr_v3_t, p2p.peer), WEFT_F(ncclProfilerEventDescr_v3_t, proxyOp), WEFT_F(ncclProfilerEventDescr_v3_t, proxyOp.pid),
      WEFT_F(ncclProfilerEventDescr_v3_t, proxyOp.channelId), WEFT_F(ncclProfilerEventDescr_v3_t, proxyOp.peer), WEFT_F(ncclProfilerEventDescr_v3_t, proxyOp.nSteps),
      WEFT_F(ncclProfilerEventDescr_v3_t, proxyOp.chunkSize), WEFT_F(ncclProfilerEventDescr_v3_t, proxyOp.isSend), WEFT_F(ncclProfilerEventDescr_v3_t, proxyStep),
      WEFT_F(ncclProfilerEventDescr_v3_t, proxyStep.step), WEFT_F(ncclProfilerEventDescr_v3_t, kernelCh), WEFT_F(ncclProfilerEventDescr_v3_t, kernelCh.channelId),
      WEFT_F(ncclProfilerEventDescr_v3_t, netPlugin), WEFT_F(ncclProfilerEventDescr_v3_t, netPlugin.id), WEFT_F(ncclProfilerEventDescr_v3_t, netPlugin.data),
      WEFT_S(ncclProfilerEventDescr_v3_t), WEFT_F(ncclProfilerEventDescr_v4_t, type), WEFT_F(ncclProfilerEventDescr_v4_t, parentObj),
      WEFT_F(ncclProfilerEventDescr_v4_t, rank), WEFT_F(ncclProfilerEventDescr_v4_t, coll), WEFT_F(ncclProfilerEventDescr_v4_t, coll.seqNumber),
      WEFT_F(ncclProfilerEventDescr_v4_t, coll.func), WEFT_F(ncclProfilerEventDescr_v4_t, coll.sendBuff), WEFT_F(ncclProfilerEventDescr_v4_t, coll.recvBuff),
      WEFT_F(ncclProfilerEventDescr_v4_t, coll.count), WEFT_F(ncclProfilerEventDescr_v4_t, coll.root), WEFT_F(ncclProfilerEventDescr_v4_t, coll.datatype),
      WEFT_F(ncclProfilerEventDescr_v4_t, coll.nChannels), WEFT_F(ncclProfilerEventDescr_v4_t, coll.nWarps), WEFT_F(ncclProfilerEventDescr_v4_t, coll.algo),
      WEFT_F(ncclProfilerEventDescr_v4_t, coll.proto), WEFT_F(ncclProfilerEventDescr_v4_t, p2p), WEFT_F(ncclProfilerEventDescr_v4_t, p2p.func),
      WEFT_F(ncclProfilerEventDescr_v4_t, p2p.buff), WEFT_F(ncclProfilerEventDescr_v4_t, p2p.datatype), WEFT_F(ncclProfilerEventDescr_v4_t, p2p.count),
      WEFT_F(ncclProfilerEventDescr_v4_t, p2p.peer), WEFT_F(ncclProfilerEventDescr_v4_t, p2p.nChannels), WEFT_F(ncclProfilerEventDescr_v4_t, proxyOp),
      WEFT_F(ncclProfilerEventDescr_v4_t, proxyOp.pid), WEFT_F(ncclProfilerEventDescr_v4_t, proxyOp.channelId), WEFT_F(ncclProfilerEventDescr_v4_t, proxyOp.peer),
      WEFT_F(ncclProfilerEventDescr_v4_t, proxyOp.nSteps), WEFT_F(ncclProfilerEventDescr_v4_t, proxyOp.chunkSize), WEFT_F(ncclProfilerEventDescr_v4_t, proxyOp.isSend),
      WEFT_F(ncclProfilerEventDescr_v4_t, proxyStep), WEFT_F(ncclProfilerEventDescr_v4_t, proxyStep.step), WEFT_F(ncclProfilerEventDescr_v4_t, kernelCh),
      WEFT_F(ncclProfilerEventDescr_v4_t, kernelCh.channelId), WEFT_F(ncclProfilerEventDescr_v4_t, kernelCh.pTimer), WEFT_F(ncclProfilerEventDescr_v4_t, netPlugin),
      WEFT_F(ncclProfilerEventDescr_v4_t, netPlugin.id), WEFT_F(ncclProfilerEventDescr_v4_t, netPlugin.data), WEFT_S(ncclProfilerEventDescr_v4_t),
      WEFT_F(ncclProfilerEventDescr_v5_t, type), WEFT_F(ncclProfilerEventDescr_v5_t, parentObj), WEFT_F(ncclProfilerEventDescr_v5_t, rank),
      WEFT_F(ncclProfilerEventDescr_v5_t, groupApi), WEFT_F(ncclProfilerEventDescr_v5_t, groupApi.graphCaptured), WEFT_F(ncclProfilerEventDescr_v5_t, groupApi.groupDepth),
      WEFT_F(ncclProfilerEventDescr_v5_t, collApi), WEFT_F(ncclProfilerEventDescr_v5_t, collApi.func), WEFT_F(ncclProfilerEventDescr_v5_t, collApi.count),
      WEFT_F(ncclProfilerEventDescr_v5_t, collApi.datatype), WEFT_F(ncclProfilerEventDescr_v5_t, collApi.root), WEFT_F(ncclProfilerEventDescr_v5_t, collApi.stream),
      WEFT_F(ncclProfilerEventDescr_v5_t, collApi.graphCaptured), WEFT_F(ncclProfilerEventDescr_v5_t, p2pApi), WEFT_F(ncclProfilerEventDescr_v5_t, p2pApi.func),
      WEFT_F(ncclProfilerEventDescr_v5_t, p2pApi.count), WEFT_F(ncclProfilerEventDescr_v5_t, p2pApi.datatype), WEFT_F(ncclProfilerEventDescr_v5_t, p2pApi.stream),
      WEFT_F(ncclProfilerEventDescr_v5_t, p2pApi.graphCaptured), WEFT_F(ncclProfilerEventDescr_v5_t, kernelLaunch), WEFT_F(ncclProfilerEventDescr_v5_t, kernelLaunch.stream),
      WEFT_F(ncclProfilerEventDescr_v5_t, coll), WEFT_F(ncclProfilerEventDescr_v5_t, coll.seqNumber), WEFT_F(ncclProfilerEventDescr_v5_t, coll.func),
      WEFT_F(ncclProfilerEventDescr_v5_t, coll.sendBuff), WEFT_F(ncclProfilerEventDescr_v5_t, coll.recvBuff), WEFT_F(ncclProfilerEventDescr_v5_t, coll.count),
      WEFT_F(ncclProfilerEventDescr_v5_t, coll.root), WEFT_F(ncclProfilerEventDescr_v5_t, coll.datatype), WEFT_F(ncclProfilerEventDescr_v5_t, coll.nChannels),
      WEFT_F(ncclProfilerEventDescr_v5_t, coll.nWarps), WEFT_F(ncclProfilerEventDescr_v5_t, coll.algo), WEFT_F(ncclProfilerEventDescr_v5_t, coll.proto),
      WEFT_F(ncclProfilerEventDescr_v5_t, coll.parentGroup), WEFT_F(ncclProfilerEventDescr_v5_t, p2p), WEFT_F(ncclProfilerEventDescr_v5_t, p2p.func),
      WEFT_F(ncclProfilerEventDescr_v5_t, p2p.buff), WEFT_F(ncclProfilerEventDescr_v5_t, p2p.datatype), WEFT_F(ncclProfilerEventDescr_v5_t, p2p.count),
      WEFT_F(ncclProfilerEventDescr_v5_t, p2p.peer), WEFT_F(ncclProfilerEventDescr_v5_t, p2p.nChannels), WEFT_F(ncclProfilerEventDescr_v5_t, p2p.parentGroup),
      WEFT_F(ncclProfilerEventDescr_v5_t, proxyOp), WEFT_F(ncclProfilerEventDescr_v5_t, proxyOp.pid), WEFT_F(ncclProfilerEventDescr_v5_t, proxyOp.channelId),
      WEFT_F(ncclProfilerEventDescr_v5_t, proxyOp.peer), WEFT_F(ncclProfilerEventDescr_v5_t, proxyOp.nSteps), WEFT_F(ncclProfilerEventDescr_v5_t, proxyOp.chunkSize),
      WEFT_F(ncclProfilerEventDescr_v5_t, proxyOp.isSend), WEFT_F(ncclProfilerEventDescr_v5_t, proxyStep), WEFT_F(ncclProfilerEventDescr_v5_t, proxyStep.step),
      WEFT_F(ncclProfilerEventDescr_v5_t, kernelCh), WEFT_F(ncclProfilerEventDescr_v5_t, kernelCh.channelId), WEFT_F(ncclProfilerEventDescr_v5_t, kernelCh.pTimer),
      WEFT_F(ncclProfilerEventDescr_v5_t, netPlugin), WEFT_F(ncclProfilerEventDescr_v5_t, netPlugin.id), WEFT_F(ncclProfilerEventDescr_v5_t, netPlugin.data),
      WEFT_S(ncclProfilerEventDescr_v5_t), WEFT_F(ncclProfilerEventDescr_v6_t, type), WEFT_F(ncclProfilerEventDescr_v6_t, parentObj),
      WEFT_F(ncclProfilerEventDescr_v6_t, rank), WEFT_F(ncclProfilerEventDescr_v6_t, groupApi), WEFT_F(ncclProfilerEventDescr_v6_t, groupApi.graphCaptured),
      WEFT_F(ncclProfilerEventDescr_v6_t, groupApi.groupDepth), WEFT_F(ncclProfilerEventDescr_v6_t, collApi), WEFT_F(ncclProfilerEventDescr_v6_t, collApi.func),
      WEFT_F(ncclProfilerEventDescr_v6_t, collApi.count), WEFT_F(ncclProfilerEventDescr_v6_t, collApi.datatype), WEFT_F(ncclProfilerEventDescr_v6_t, collApi.root),
      WEFT_F(ncclProfilerEventDescr_v6_t, collApi.stream), WEFT_F(ncclProfilerEventDescr_v6_t, collApi.graphCaptured), WEFT_F(ncclProfilerEventDescr_v6_t, p2pApi),
      WEFT_F(ncclProfilerEventDescr_v6_t, p2pApi.func), WEFT_F(ncclProfilerEventDescr_v6_t, p2pApi.count), WEFT_F(ncclProfilerEventDescr_v6_t, p2pApi.datatype),
      WEFT_F(ncclProfilerEventDescr_v6_t, p2pApi.stream), WEFT_F(ncclProfilerEventDescr_v6_t, p2pApi.graphCaptured), WEFT_F(ncclProfilerEventDescr_v6_t, kernelLaunch),
      WEFT_F(ncclProfilerEventDescr_v6_t, kernelLaunch.stream), WEFT_F(ncclProfilerEventDescr_v6_t, coll), WEFT_F(ncclProfilerEventDescr_v6_t, coll.seqNumber),
      WEFT_F(ncclProfilerEventDescr_v6_t, coll.func), WEFT_F(ncclProfilerEventDescr_v6_t, coll.sendBuff), WEFT_F(ncclProfilerEventDescr_v6_t, coll.recvBuff),
      WEFT_F(ncclProfilerEventDescr_v6_t, coll.count), WEFT_F(ncclProfilerEventDescr_v6_t, coll.root), WEFT_F(ncclProfilerEventDescr_v6_t, coll.datatype),
      WEFT_F(ncclProfilerEventDescr_v6_t, coll.nChannels), WEFT_F(ncclProfilerEventDescr_v6_t, coll.nWarps), WEFT_F(ncclProfilerEventDescr_v6_t, coll.algo),
      WEFT_F(ncclProfilerEventDescr_v6_t, coll.proto), WEFT_F(ncclProfilerEventDescr_v6_t, coll.parentGroup), WEFT_F(ncclProfilerEventDescr_v6_t, p2p),
      WEFT_F(ncclProfilerEventDescr_v6_t, p2p.func), WEFT_F(ncclProfilerEventDescr_v6_t, p2p.buff), WEFT_F(ncclProfilerEventDescr_v6_t, p2p.datatype),
      WEFT_F(ncclProfilerEventDescr_v6_t, p2p.count), WEFT_F(ncclProfilerEventDescr_v6_t, p2p.peer), WEFT_F(ncclProfilerEventDescr_v6_t, p2p.nChannels),
      WEFT_F(ncclProfilerEventDescr_v6_t, p2p.parentGroup), WEFT_F(ncclProfilerEventDescr_v6_t, proxyOp), WEFT_F(ncclProfilerEventDescr_v6_t, proxyOp.pid),
      WEFT_F(ncclProfilerEventDescr_v6_t, proxyOp.channelId), WEFT_F(ncclProfilerEventDescr_v6_t, proxyOp.peer), WEFT_F(ncclProfilerEventDescr_v6_t, proxyOp.nSteps),
      WEFT_F(ncclProfilerEventDescr_v6_t, proxyOp.chunkSize), WEFT_F(ncclProfilerEventDescr_v6_t, proxyOp.isSend), WEFT_F(ncclProfilerEventDescr_v6_t, proxyStep),
      WEFT_F(ncclProfilerEventDescr_v6_t, proxyStep.step), WEFT_F(ncclProfilerEventDescr_v6_t, kernelCh), WEFT_F(ncclProfilerEventDescr_v6_t, kernelCh.channelId),
      WEFT_F(ncclProfilerEventDescr_v6_t, kernelCh.pTimer), WEFT_F(ncclProfilerEventDescr_v6_t, netPlugin), WEFT_F(ncclProfilerEventDescr_v6_t, netPlugin.id),
      WEFT_F(ncclProfilerEventDescr_v6_t, netPlugin.data), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.seqNumber),
      WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.func), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.sendBuff), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.recvBuff),
      WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.count), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.root), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.datatype),
      WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.syncStrategy), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.intraBatchSync), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.batchSize),
      WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.numBatches), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.ceSeqNum), WEFT_F(ncclProfilerEventDescr_v6_t, ceColl.stream),
      WEFT_F(ncclProfilerEventDescr_v6_t, ceCollSync), WEFT_F(ncclProfilerEventDescr_v6_t, ceCollSync.isComplete), WEFT_F(ncclProfilerEventDescr_v6_t, ceCollSync.nRanks),
      WEFT_F(ncclProfilerEventDescr_v6_t, ceCollBatch), WEFT_F(ncclProfilerEventDescr_v6_t, ceCollBatch.numOps), WEFT_F(ncclProfilerEventDescr_v6_t, ceCollBatch.totalBytes),
      WEFT_F(ncclProfilerEventDescr_v6_t, ceCollBatch.useIntraSync), WEFT_S(ncclProfilerEventDescr_v6_t), WEFT_F(ncclProfilerNetIbDescr_v1_t, type),
      WEFT_F(ncclProfilerNetIbDescr_v1_t, qp), WEFT_F(ncclProfilerNetIbDescr_v1_t, qp.device), WEFT_F(ncclProfilerNetIbDescr_v1_t, qp.wr_id),
      WEFT_F(ncclProfilerNetIbDescr_v1_t, qp.opcode), WEFT_F(ncclProfilerNetIbDescr_v1_t, qp.qpNum), WEFT_F(ncclProfilerNetIbDescr_v1_t, qp.length),
      WEFT_S(ncclProfilerNetIbDescr_v1_t), WEFT_F(ncclProfilerNetSockDescr_v1_t, type), WEFT_F(ncclProfilerNetSockDescr_v1_t, sock),
      WEFT_F(ncclProfilerNetSockDescr_v1_t, sock.fd), WEFT_F(ncclProfilerNetSockDescr_v1_t, sock.op), WEFT_F(ncclProfilerNetSockDescr_v1_t, sock.length),
      WEFT_S(ncclProfilerNetSockDescr_v1_t), WEFT_F(ncclProfiler_v1_t, name), WEFT_F(ncclProfiler_v1_t, init),
      WEFT_F(ncclProfiler_v1_t, startEvent), WEFT_F(ncclProfiler_v1_t, stopEvent), WEFT_F(ncclProfiler_v1_t, recordEventState),
      WEFT_F(ncclProfiler_v1_t, finalize), WEFT_S(ncclProfiler_v1_t), WEFT_F(ncclProfiler_v2_t, name),
      WEFT_F(ncclProfiler_v2_t, init), WEFT_F(ncclProfiler_v2_t, startEvent), WEFT_F(ncclProfiler_v2_t, stopEvent),
      WEFT_F(ncclProfiler_v2_t, recordEventState), WEFT_F(ncclProfiler_v2_t, finalize), WEFT_S(ncclProfiler_v2_t),
      WEFT_F(ncclProfiler_v3_t, name), WEFT_F(ncclProfiler_v3_t, init), WEFT_F(ncclProfiler_v3_t, startEvent),
      WEFT_F(ncclProfiler_v3_t, stopEvent), WEFT_F(ncclProfiler_v3_t, recordEventState), WEFT_F(ncclProfiler_v3_t, finalize),
      WEFT_S(ncclProfiler_v3_t), WEFT_F(ncclProfiler_v4_t, name), WEFT_F(ncclProfiler_v4_t, init),
      WEFT_F(ncclProfiler_v4_t, startEvent), WEFT_F(ncclProfiler_v4_t, stopEvent), WEFT_F(ncclProfiler_v4_t, recordEventState),
      WEFT_F(ncclProfiler_v4_t, finalize), WEFT_S(ncclProfiler_v4_t), WEFT_F(ncclProfiler_v5_t, name),
      WEFT_F(ncclProfiler_v5_t, init), WEFT_F(ncclProfiler_v5_t, startEvent), WEFT_F(ncclProfiler_v5_t, stopEvent),
      WEFT_F(ncclProfiler_v5_t, recordEventState), WEFT_F(ncclProfiler_v5_t, finalize), WEFT_S(ncclProfiler_v5_t),
      WEFT_F(ncclProfiler_v6_t, name), WEFT_F(ncclProfiler_v6_t, init), WEFT_F(ncclProfiler_v6_t, startEvent),
      WEFT_F(ncclProfiler_v6_t, stopEvent), WEFT_F(ncclProfiler_v6_t, recordEventState), WEFT_F(ncclProfiler_v6_t, finalize),
      WEFT_S(ncclProfiler_v6_t),
      // v7 (NCCL 2.32)
#define D7(f) WEFT_F(ncclProfilerEventDescr_v7_t, f)
      D7(type), D7(parentObj), D7(rank), D7(groupApi), D7(groupApi.graphCaptured), D7(groupApi.groupDepth),
      D7(collApi), D7(collApi.func), D7(collApi.count), D7(collApi.datatype), D7(collApi.root), D7(collApi.stream),
      D7(collApi.graphCaptured), D7(collApi.userTag),
      D7(p2pApi), D7(p2pApi.func), D7(p2pApi.count), D7(p2pApi.datatype), D7(p2pApi.stream), D7(p2pApi.graphCaptured),
      D7(p2pApi.userTag), D7(kernelLaunch), D7(kernelLaunch.stream),
      D7(coll), D7(coll.seqNumber), D7(coll.func), D7(coll.sendBuff), D7(coll.recvBuff), D7(coll.count), D7(coll.root),
      D7(coll.datatype), D7(coll.nChannels), D7(coll.nWarps), D7(coll.algo), D7(coll.proto), D7(coll.parentGroup),
      D7(coll.kernelVariant), D7(coll.isSymColl), D7(coll.userTag),
      D7(p2p), D7(p2p.func), D7(p2p.buff), D7(p2p.datatype), D7(p2p.count), D7(p2p.peer), D7(p2p.nChannels),
      D7(p2p.parentGroup), D7(p2p.userTag),
      D7(proxyOp), D7(proxyOp.pid), D7(proxyOp.channelId), D7(proxyOp.peer), D7(proxyOp.nSteps), D7(proxyOp.chunkSize),
      D7(proxyOp.isSend), D7(proxyStep), D7(proxyStep.step), D7(kernelCh), D7(kernelCh.channelId), D7(kernelCh.pTimer),
      D7(netPlugin), D7(netPlugin.id), D7(netPlugin.data),
      D7(ceColl), D7(ceColl.seqNumber), D7(ceColl.func), D7(ceColl.sendBuff), D7(ceColl.recvBuff), D7(ceColl.count),
      D7(ceColl.root), D7(ceColl.datatype), D7(ceColl.syncStrategy), D7(ceColl.intraBatchSync), D7(ceColl.batchSize),
      D7(ceColl.numBatches), D7(ceColl.ceSeqNum), D7(ceColl.stream), D7(ceColl.userTag),
      D7(ceCollSync), D7(ceCollSync.isComplete), D7(ceCollSync.nRanks),
      D7(ceCollBatch), D7(ceCollBatch.numOps), D7(ceCollBatch.totalBytes), D7(ceCollBatch.useIntraSync),
      D7(kernelPhase), D7(kernelPhase.channelId), D7(kernelPhase.phaseId), D7(kernelPhase.phaseName),
      D7(kernelPhase.pTimer), WEFT_S(ncclProfilerEventDescr_v7_t),
#undef D7
#define SA7(f) WEFT_F(ncclProfilerEventStateArgs_v7_t, f)
      SA7(proxyStep), SA7(proxyStep.transSize), SA7(proxyCtrl), SA7(proxyCtrl.appendedProxyOps), SA7(netPlugin),
      SA7(netPlugin.data), SA7(kernelCh), SA7(kernelCh.pTimer), WEFT_S(ncclProfilerEventStateArgs_v7_t),
#undef SA7
      WEFT_F(ncclProfiler_v7_t, name), WEFT_F(ncclProfiler_v7_t, init), WEFT_F(ncclProfiler_v7_t, startEvent),
      WEFT_F(ncclProfiler_v7_t, stopEvent), WEFT_F(ncclProfiler_v7_t, recordEventState), WEFT_F(ncclProfiler_v7_t, finalize),
      WEFT_S(ncclProfiler_v7_t),
      // The device API's proxy tables (layouts-rma.tsv).
      WEFT_F(ncclGinConfig_v13_t, nSignals), WEFT_F(ncclGinConfig_v13_t, nCounters),
      WEFT_F(ncclGinConfig_v13_t, nContexts), WEFT_F(ncclGinConfig_v13_t, queueDepth),
      WEFT_F(ncclGinConfig_v13_t, trafficClass), WEFT_S(ncclGinConfig_v13_t), WEFT_F(ncclRmaConfig_v14_t, nContexts),
      WEFT_F(ncclRmaConfig_v14_t, trafficClass), WEFT_F(ncclRmaConfig_v14_t, rankStride),
      WEFT_S(ncclRmaConfig_v14_t), WEFT_F(ncclRmaConfig_v17_t, nContexts), WEFT_F(ncclRmaConfig_v17_t, trafficClass),
      WEFT_F(ncclRmaConfig_v17_t, peerArray), WEFT_F(ncclRmaConfig_v17_t, peerArrayCount),
      WEFT_S(ncclRmaConfig_v17_t), WEFT_F(ncclRmaProperties_v16_t, flushesAllPutsOnAnySignal),
      WEFT_S(ncclRmaProperties_v16_t), WEFT_F(ncclGin_v11_t, name), WEFT_F(ncclGin_v11_t, init),
      WEFT_F(ncclGin_v11_t, devices), WEFT_F(ncclGin_v11_t, getProperties), WEFT_F(ncclGin_v11_t, listen),
      WEFT_F(ncclGin_v11_t, connect), WEFT_F(ncclGin_v11_t, createContext), WEFT_F(ncclGin_v11_t, regMrSym),
      WEFT_F(ncclGin_v11_t, regMrSymDmaBuf), WEFT_F(ncclGin_v11_t, deregMrSym),
      WEFT_F(ncclGin_v11_t, destroyContext), WEFT_F(ncclGin_v11_t, closeColl), WEFT_F(ncclGin_v11_t, closeListen),
      WEFT_F(ncclGin_v11_t, iput), WEFT_F(ncclGin_v11_t, iputSignal), WEFT_F(ncclGin_v11_t, test),
      WEFT_F(ncclGin_v11_t, ginProgress), WEFT_F(ncclGin_v11_t, queryLastError), WEFT_F(ncclGin_v11_t, finalize),
      WEFT_S(ncclGin_v11_t), WEFT_F(ncclGin_v12_t, name), WEFT_F(ncclGin_v12_t, init),
      WEFT_F(ncclGin_v12_t, devices), WEFT_F(ncclGin_v12_t, getProperties), WEFT_F(ncclGin_v12_t, listen),
      WEFT_F(ncclGin_v12_t, connect), WEFT_F(ncclGin_v12_t, createContext), WEFT_F(ncclGin_v12_t, regMrSym),
      WEFT_F(ncclGin_v12_t, regMrSymDmaBuf), WEFT_F(ncclGin_v12_t, deregMrSym),
      WEFT_F(ncclGin_v12_t, destroyContext), WEFT_F(ncclGin_v12_t, closeColl), WEFT_F(ncclGin_v12_t, closeListen),
      WEFT_F(ncclGin_v12_t, iput), WEFT_F(ncclGin_v12_t, iputSignal), WEFT_F(ncclGin_v12_t, test),
      WEFT_F(ncclGin_v12_t, ginProgress), WEFT_F(ncclGin_v12_t, queryLastError), WEFT_F(ncclGin_v12_t, finalize),
      WEFT_S(ncclGin_v12_t), WEFT_F(ncclGin_v13_t, name), WEFT_F(ncclGin_v13_t, init),
      WEFT_F(ncclGin_v13_t, devices), WEFT_F(ncclGin_v13_t, getProperties), WEFT_F(ncclGin_v13_t, listen),
      WEFT_F(ncclGin_v13_t, connect), WEFT_F(ncclGin_v13_t, createContext), WEFT_F(ncclGin_v13_t, regMrSym),
      WEFT_F(ncclGin_v13_t, regMrSymDmaBuf), WEFT_F(ncclGin_v13_t, deregMrSym),
      WEFT_F(ncclGin_v13_t, destroyContext), WEFT_F(ncclGin_v13_t, closeColl), WEFT_F(ncclGin_v13_t, closeListen),
      WEFT_F(ncclGin_v13_t, iput), WEFT_F(ncclGin_v13_t, iputSignal), WEFT_F(ncclGin_v13_t, iget),
      WEFT_F(ncclGin_v13_t, iflush), WEFT_F(ncclGin_v13_t, test), WEFT_F(ncclGin_v13_t, ginProgress),
      WEFT_F(ncclGin_v13_t, queryLastError), WEFT_F(ncclGin_v13_t, finalize), WEFT_S(ncclGin_v13_t),
      WEFT_F(ncclRma_v14_t, name), WEFT_F(ncclRma_v14_t, init), WEFT_F(ncclRma_v14_t, devices),
      WEFT_F(ncclRma_v14_t, getProperties), WEFT_F(ncclRma_v14_t, listen), WEFT_F(ncclRma_v14_t, connect),
      WEFT_F(ncclRma_v14_t, createContext), WEFT_F(ncclRma_v14_t, regMrSym), WEFT_F(ncclRma_v14_t, regMrSymDmaBuf),
      WEFT_F(ncclRma_v14_t, deregMrSym), WEFT_F(ncclRma_v14_t, destroyContext), WEFT_F(ncclRma_v14_t, closeColl),
      WEFT_F(ncclRma_v14_t, closeListen), WEFT_F(ncclRma_v14_t, iput), WEFT_F(ncclRma_v14_t, iputSignal),
      WEFT_F(ncclRma_v14_t, iget), WEFT_F(ncclRma_v14_t, iflush), WEFT_F(ncclRma_v14_t, test),
      WEFT_F(ncclRma_v14_t, rmaProgress), WEFT_F(ncclRma_v14_t, queryLastError), WEFT_F(ncclRma_v14_t, finalize),
      WEFT_S(ncclRma_v14_t), WEFT_F(ncclRma_v15_t, name), WEFT_F(ncclRma_v15_t, init),
      WEFT_F(ncclRma_v15_t, devices), WEFT_F(ncclRma_v15_t, getProperties), WEFT_F(ncclRma_v15_t, listen),
      WEFT_F(ncclRma_v15_t, connect), WEFT_F(ncclRma_v15_t, createContext), WEFT_F(ncclRma_v15_t, regMrSym),
      WEFT_F(ncclRma_v15_t, regMrSymDmaBuf), WEFT_F(ncclRma_v15_t, deregMrSym),
      WEFT_F(ncclRma_v15_t, destroyContext), WEFT_F(ncclRma_v15_t, closeColl), WEFT_F(ncclRma_v15_t, closeListen),
      WEFT_F(ncclRma_v15_t, iput), WEFT_F(ncclRma_v15_t, iputSignal), WEFT_F(ncclRma_v15_t, iget),
      WEFT_F(ncclRma_v15_t, iflush), WEFT_F(ncclRma_v15_t, test), WEFT_F(ncclRma_v15_t, rmaProgress),
      WEFT_F(ncclRma_v15_t, queryLastError), WEFT_F(ncclRma_v15_t, finalize), WEFT_S(ncclRma_v15_t),
      WEFT_F(ncclRma_v16_t, name), WEFT_F(ncclRma_v16_t, init), WEFT_F(ncclRma_v16_t, devices),
      WEFT_F(ncclRma_v16_t, getRmaProperties), WEFT_F(ncclRma_v16_t, getProperties), WEFT_F(ncclRma_v16_t, listen),
      WEFT_F(ncclRma_v16_t, connect), WEFT_F(ncclRma_v16_t, createContext), WEFT_F(ncclRma_v16_t, regMrSym),
      WEFT_F(ncclRma_v16_t, regMrSymDmaBuf), WEFT_F(ncclRma_v16_t, deregMrSym),
      WEFT_F(ncclRma_v16_t, destroyContext), WEFT_F(ncclRma_v16_t, closeColl), WEFT_F(ncclRma_v16_t, closeListen),
      WEFT_F(ncclRma_v16_t, iput), WEFT_F(ncclRma_v16_t, iputSignal), WEFT_F(ncclRma_v16_t, iget),
      WEFT_F(ncclRma_v16_t, iflush), WEFT_F(ncclRma_v16_t, test), WEFT_F(ncclRma_v16_t, rmaProgress),
      WEFT_F(ncclRma_v16_t, queryLastError), WEFT_F(ncclRma_v16_t, finalize), WEFT_S(ncclRma_v16_t),
      WEFT_F(ncclRma_v17_t, name), WEFT_F(ncclRma_v17_t, init), WEFT_F(ncclRma_v17_t, devices),
      WEFT_F(ncclRma_v17_t, getRmaProperties), WEFT_F(ncclRma_v17_t, getProperties), WEFT_F(ncclRma_v17_t, listen),
      WEFT_F(ncclRma_v17_t, connect), WEFT_F(ncclRma_v17_t, createContext), WEFT_F(ncclRma_v17_t, regMrSym),
      WEFT_F(ncclRma_v17_t, regMrSymDmaBuf), WEFT_F(ncclRma_v17_t, deregMrSym),
      WEFT_F(ncclRma_v17_t, destroyContext), WEFT_F(ncclRma_v17_t, closeColl), WEFT_F(ncclRma_v17_t, closeListen),
      WEFT_F(ncclRma_v17_t, iput), WEFT_F(ncclRma_v17_t, iputSignal), WEFT_F(ncclRma_v17_t, iget),
      WEFT_F(ncclRma_v17_t, iflush), WEFT_F(ncclRma_v17_t, test), WEFT_F(ncclRma_v17_t, rmaProgress),
      WEFT_F(ncclRma_v17_t, queryLastError), WEFT_F(ncclRma_v17_t, finalize), WEFT_S(ncclRma_v17_t),
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
  auto nccl = readTsv(WEFT_LAYOUTS_TSV);
  // NCCL 2.32's v7 tables, measured from its headers (tests/abi/README.md says how).
  for (const auto& r : readTsv(WEFT_LAYOUTS_232_TSV)) nccl.push_back(r);
  // The GIN (v11-v13) and RMA (v14-v17) tables, measured from NCCL's headers (tests/abi/README.md).
  for (const auto& r : readTsv(WEFT_LAYOUTS_RMA_TSV)) nccl.push_back(r);
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
  if (!shared.good()) WEFT_SKIP("../shared/nccl-abi/layouts.tsv is not beside this checkout: nothing to compare with");
  std::ifstream local(WEFT_REPO_LAYOUTS_TSV);
  REQUIRE(local.good());
  std::stringstream a, b;
  a << shared.rdbuf();
  b << local.rdbuf();
  CHECK(a.str() == b.str());
}
