// SPDX-License-Identifier: Apache-2.0
// The exported ncclProfiler_v1 ... _v7 tables: each converts its version's descriptor and state arguments into
// the version-independent form of src/telemetry/profiler_core.h. Linked into libnccl-net-weft.so (NCCL 2.28.3+
// finds the profiler there by itself) and into libnccl-profiler-weft.so (NCCL_PROFILER_PLUGIN, for 2.23-2.27).
// Only init's result matters to NCCL; every other entry returns ncclSuccess whatever it is given.
#include <cstring>

#include "telemetry/profiler_core.h"
#include "telemetry/sink.h"
#include "weft/nccl/profiler.h"

namespace weft::telemetry {
namespace {

bool notEmpty(const char* s) { return s != nullptr && s[0] != 0; }
Func funcOf(const char* s) { return notEmpty(s) ? funcFromName(s) : Func::kUnknown; }
uint8_t typeOf(const char* s) { return notEmpty(s) ? typeFromName(s) : kUnknownType; }
uint8_t algoOf(const char* s) { return notEmpty(s) ? algoFromName(s) : kUnknownAlgo; }
uint8_t protoOf(const char* s) { return notEmpty(s) ? protoFromName(s) : kUnknownAlgo; }

template <typename D>
void header(EventDesc& e, const D* d) {
  e.type = evTypeFromBit(d->type);
  e.parent = d->parentObj;
  e.rank = d->rank;
}

template <typename D>
void proxyArms(EventDesc& e, const D* d) {
  if (e.type == EvType::kProxyOp) {
    e.pid = d->proxyOp.pid;
    e.channelId = d->proxyOp.channelId;
    e.peer = d->proxyOp.peer;
    e.nSteps = d->proxyOp.nSteps;
    e.chunkSize = d->proxyOp.chunkSize;
    e.isSend = d->proxyOp.isSend;
  } else if (e.type == EvType::kProxyStep) {
    e.step = d->proxyStep.step;
  }
}

EventDesc convert(const ncclProfilerEventDescr_v1_t* d) {
  EventDesc e;
  header(e, d);
  if (e.type == EvType::kColl) {
    e.hasCommHash = true;
    e.commHash = d->coll.commHash;
    e.seq = d->coll.seqNumber;
    e.func = funcFromNumber(d->coll.func);
    e.dtype = d->coll.datatype <= 11 ? d->coll.datatype : kUnknownType;
    e.count = d->coll.count;
    e.root = d->coll.root;
    e.algo = d->coll.algo <= 6 ? d->coll.algo : kUnknownAlgo;
    e.proto = d->coll.proto <= 2 ? d->coll.proto : kUnknownAlgo;
    e.nChannels = d->coll.nMaxChannels;
    e.nWarps = d->coll.nWarps;
  } else if (e.type == EvType::kP2p) {
    e.hasCommHash = true;
    e.commHash = d->p2p.commHash;
    e.func = funcFromNumber(d->p2p.func);
    e.dtype = d->p2p.datatype <= 11 ? d->p2p.datatype : kUnknownType;
    e.count = d->p2p.count;
    e.peer = d->p2p.peer;
  }
  proxyArms(e, d);
  return e;
}

// v2 and v3 share the collective and p2p arms (v3 drops trafficBytes and adds kernel-channel and net events).
// The fields the string-named (v2+) collective and p2p arms share.
template <typename C>
void collStrings(EventDesc& e, const C& c) {
  e.seq = c.seqNumber;
  e.func = funcOf(c.func);
  e.dtype = typeOf(c.datatype);
  e.count = c.count;
  e.root = c.root;
  e.algo = algoOf(c.algo);
  e.proto = protoOf(c.proto);
  e.nWarps = c.nWarps;
}
template <typename P>
void p2pStrings(EventDesc& e, const P& p) {
  e.func = funcOf(p.func);
  e.dtype = typeOf(p.datatype);
  e.count = p.count;
  e.peer = p.peer;
}

template <typename D>
void stringArmsV2(EventDesc& e, const D* d) {
  if (e.type == EvType::kColl) {
    e.hasCommHash = true;
    e.commHash = d->coll.commHash;
    collStrings(e, d->coll);
    e.nChannels = d->coll.nMaxChannels;
  } else if (e.type == EvType::kP2p) {
    e.hasCommHash = true;
    e.commHash = d->p2p.commHash;
    p2pStrings(e, d->p2p);
  }
  proxyArms(e, d);
}

EventDesc convert(const ncclProfilerEventDescr_v2_t* d) {
  EventDesc e;
  header(e, d);
  stringArmsV2(e, d);
  return e;
}

EventDesc convert(const ncclProfilerEventDescr_v3_t* d) {
  EventDesc e;
  header(e, d);
  stringArmsV2(e, d);
  if (e.type == EvType::kKernelCh) {
    e.channelId = d->kernelCh.channelId;
  } else if (e.type == EvType::kNetPlugin) {
    e.netId = d->netPlugin.id;
    e.netData = d->netPlugin.data;
  }
  return e;
}

// v4 and later: the communicator comes with init; kernel channels carry GPU timers.
template <typename D>
void armsV4(EventDesc& e, const D* d) {
  if (e.type == EvType::kColl) {
    collStrings(e, d->coll);
    e.nChannels = d->coll.nChannels;
  } else if (e.type == EvType::kP2p) {
    p2pStrings(e, d->p2p);
    e.nChannels = d->p2p.nChannels;
  } else if (e.type == EvType::kKernelCh) {
    e.channelId = d->kernelCh.channelId;
    e.pTimer = d->kernelCh.pTimer;
  } else if (e.type == EvType::kNetPlugin) {
    e.netId = d->netPlugin.id;
    e.netData = d->netPlugin.data;
  }
  proxyArms(e, d);
}

EventDesc convert(const ncclProfilerEventDescr_v4_t* d) {
  EventDesc e;
  header(e, d);
  armsV4(e, d);
  return e;
}

template <typename D>
EventDesc convertV5(const D* d) {
  EventDesc e;
  header(e, d);
  armsV4(e, d);
  if (e.type == EvType::kCollApi) {
    e.graphCaptured = d->collApi.graphCaptured;
  } else if (e.type == EvType::kP2pApi) {
    e.graphCaptured = d->p2pApi.graphCaptured;
  } else if (e.type == EvType::kGroupApi) {
    e.graphCaptured = d->groupApi.graphCaptured;
  }
  return e;
}
EventDesc convert(const ncclProfilerEventDescr_v5_t* d) { return convertV5(d); }
EventDesc convert(const ncclProfilerEventDescr_v6_t* d) { return convertV5(d); }
// v7 (2.32): the user's tag on every Coll/P2p, and kernel barrier phases (children of a KernelCh).
EventDesc convert(const ncclProfilerEventDescr_v7_t* d) {
  EventDesc e = convertV5(d);
  if (e.type == EvType::kColl) {
    e.userTag = d->coll.userTag;
  } else if (e.type == EvType::kP2p) {
    e.userTag = d->p2p.userTag;
  } else if (e.type == EvType::kKernelPhase) {
    e.channelId = d->kernelPhase.channelId;
    e.phaseId = d->kernelPhase.phaseId;
    e.pTimer = d->kernelPhase.pTimer;
  }
  return e;
}

template <typename D>
ncclResult_t start(void* context, void** eHandle, D* eDescr) {
  if (eHandle == nullptr) return ncclSuccess;
  if (eDescr == nullptr) {
    *eHandle = nullptr;
    return ncclSuccess;
  }
  *eHandle = startEvent(context, convert(eDescr));
  return ncclSuccess;
}

ncclResult_t stop(void* eHandle) {
  stopEvent(eHandle);
  return ncclSuccess;
}

// v1-v3: only ProxyOp states (0..7) carry arguments ({transSize, steps}).
ncclResult_t recordV1(void* eHandle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v1_t* args) {
  bool has = args != nullptr && state >= ncclProfilerProxyOpSendPosted && state <= ncclProfilerProxyOpRecvDone;
  recordState(eHandle, state, has ? args->proxyOp.transSize : 0, has);
  return ncclSuccess;
}

// v4+: ProxyStep states carry transSize, KernelChStop the GPU timer.
ncclResult_t recordV4(void* eHandle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v4_t* args) {
  if (args == nullptr) {
    recordState(eHandle, state, 0, false);
    return ncclSuccess;
  }
  bool step = (state >= ncclProfilerProxyStepSendGPUWait && state <= ncclProfilerProxyStepRecvGPUWait) ||
              state == ncclProfilerProxyStepSendPeerWait_v4;
  if (step) recordState(eHandle, state, args->proxyStep.transSize, true);
  else if (state == ncclProfilerKernelChStop || state == ncclProfilerKernelPhaseStop)
    recordState(eHandle, state, args->kernelCh.pTimer, true);  // v7's phase stop reuses the kernelCh arm
  else recordState(eHandle, state, 0, false);
  return ncclSuccess;
}

ncclResult_t finalize(void* context) {
  finalizeContext(context);
  return ncclSuccess;
}

// Every table's init: the writer attached first (it hears of the context), then the core.
ncclResult_t initTimed(void** c, int* mask, const InitArgs& a) {
  attachWriter();
  return initContext(c, mask, a);
}

InitArgs noComm(int version) {
  InitArgs a;
  a.version = version;
  return a;
}

ncclResult_t initV1(void** c, int* mask) { return initTimed(c, mask, noComm(1)); }
ncclResult_t initV2(void** c, int* mask) { return initTimed(c, mask, noComm(2)); }
ncclResult_t initV3(void** c, int* mask) { return initTimed(c, mask, noComm(3)); }
ncclResult_t initV4(void** c, int* mask, const char* commName, uint64_t commHash, int nNodes, int nranks, int rank,
                    ncclDebugLogger_t logfn) {
  InitArgs a{4, true, commHash, commName, nNodes, nranks, rank, logfn};
  return initTimed(c, mask, a);
}
template <int V>
ncclResult_t initV5(void** c, uint64_t commId, int* mask, const char* commName, int nNodes, int nranks, int rank,
                    ncclDebugLogger_t logfn) {
  InitArgs a{V, true, commId, commName, nNodes, nranks, rank, logfn};
  return initTimed(c, mask, a);
}

}  // namespace
}  // namespace weft::telemetry

using namespace weft::telemetry;

#define WEFT_PROFILER_EXPORT extern "C" __attribute__((visibility("default")))

WEFT_PROFILER_EXPORT const ncclProfiler_v1_t ncclProfiler_v1 = {
    "weft", initV1, start<ncclProfilerEventDescr_v1_t>, stop, recordV1, finalize};
WEFT_PROFILER_EXPORT const ncclProfiler_v2_t ncclProfiler_v2 = {
    "weft", initV2, start<ncclProfilerEventDescr_v2_t>, stop, recordV1, finalize};
WEFT_PROFILER_EXPORT const ncclProfiler_v3_t ncclProfiler_v3 = {
    "weft", initV3, start<ncclProfilerEventDescr_v3_t>, stop, recordV1, finalize};
WEFT_PROFILER_EXPORT const ncclProfiler_v4_t ncclProfiler_v4 = {
    "weft", initV4, start<ncclProfilerEventDescr_v4_t>, stop, recordV4, finalize};
WEFT_PROFILER_EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {
    "weft", initV5<5>, start<ncclProfilerEventDescr_v5_t>, stop, recordV4, finalize};
WEFT_PROFILER_EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {
    "weft", initV5<6>, start<ncclProfilerEventDescr_v6_t>, stop, recordV4, finalize};
WEFT_PROFILER_EXPORT const ncclProfiler_v7_t ncclProfiler_v7 = {
    "weft", initV5<7>, start<ncclProfilerEventDescr_v7_t>, stop, recordV4, finalize};
