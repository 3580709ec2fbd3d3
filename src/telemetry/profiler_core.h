// SPDX-License-Identifier: Apache-2.0
// The profiler behind every exported ncclProfiler_vN table. Each table version converts NCCL's descriptor into
// an EventDesc and calls in here; everything below is version-independent.
//
// Events become handles into fixed pools allocated once (at the first init): collectives and p2p operations in
// OpSlots, their children (kernel channels, proxy ops and steps, net-plugin events) in SmallSlots, and events
// weft does not time (groups, API events, proxy control) in static sentinels. start/stop/record take no lock and
// allocate nothing; a handle is validated by address before it is used, so a garbage or stale handle is counted
// and ignored. A writer thread (sink.h) turns finished OpSlots into records.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "weft/nccl/common.h"
#include "weft/telemetry/histogram.h"
#include "weft/telemetry/record.h"

namespace weft::telemetry {

enum class Level : uint8_t { kOff = 0, kColl = 1, kProxy = 2, kNet = 3 };
Level levelFromParams();  // WEFT_TIMING
const char* levelName(Level l) noexcept;
// The activation mask a level asks NCCL for, for a table version (bits that version does not know are left out).
int maskFor(Level l, int version) noexcept;

enum class EvType : uint8_t {
  kGroup, kColl, kP2p, kProxyOp, kProxyStep, kProxyCtrl, kKernelCh, kNetPlugin,
  kGroupApi, kCollApi, kP2pApi, kKernelLaunch, kCeColl, kCeSync, kCeBatch, kKernelPhase, kUnknown
};
EvType evTypeFromBit(uint64_t type) noexcept;

// One event, whatever the table version.
struct EventDesc {
  EvType type = EvType::kUnknown;
  void* parent = nullptr;
  int rank = -1;
  // Coll / P2p
  uint64_t commHash = 0;  // v1-v3 carry it per event
  bool hasCommHash = false;
  uint64_t seq = 0;
  Func func = Func::kUnknown;
  uint8_t dtype = kUnknownType;
  uint64_t count = 0;
  int root = -1;
  int peer = -1;
  uint8_t algo = kUnknownAlgo;
  uint8_t proto = kUnknownAlgo;
  uint8_t nChannels = 0;
  uint8_t nWarps = 0;
  // ProxyOp
  pid_t pid = 0;
  uint8_t channelId = 0;
  int nSteps = 0;
  int chunkSize = 0;
  int isSend = 0;
  // ProxyStep
  int step = 0;
  // KernelCh (v4+)
  uint64_t pTimer = 0;
  // NetPlugin
  int64_t netId = 0;
  void* netData = nullptr;
  // CollApi / P2pApi / GroupApi
  bool graphCaptured = false;
  // Coll / P2p (v7): the user's tag of the call, 0 when untagged
  uint64_t userTag = 0;
  // KernelPhase (v7): channelId and pTimer (start) above, and which phase
  uint8_t phaseId = 0;
};

struct InitArgs {
  int version = 0;        // the table NCCL called: 1..7
  bool hasComm = false;   // v4+: the communicator's identity comes with init
  uint64_t commHash = 0;  // v4 commHash, v5+ commId
  const char* commName = nullptr;
  int nNodes = 0;
  int nRanks = 0;
  int rank = -1;
  ncclDebugLogger_t logger = nullptr;
};

struct PeerStats {
  std::atomic<int32_t> peer{-1};  // NCCL rank of the peer; -1 free
  std::atomic<uint64_t> sendBytes{0}, recvBytes{0}, sendSteps{0}, recvSteps{0}, ops{0};
  std::atomic<uint64_t> netBytes{0}, netMsgs{0};
  LatencyHistogram stepLatency;  // ProxyStep start -> stop
  LatencyHistogram netLatency;   // net-plugin event start -> stop
};

constexpr int kMaxPeersPerComm = 64;  // peers beyond land in the last entry (peer = -2, "other")

struct Context {
  std::atomic<uint32_t> live{0};
  uint32_t magic = 0;
  uint32_t index = 0;
  int version = 0;
  Level level = Level::kOff;
  bool hasComm = false;
  std::atomic<uint64_t> commHash{0};  // v1-v3: learnt from the first Coll/P2p descriptor
  std::string name;
  int nNodes = 0;
  int nRanks = 0;
  std::atomic<int> rank{-1};
  pid_t pid = 0;
  uint64_t initNs = 0;
  PeerStats* peers = nullptr;  // kMaxPeersPerComm entries, allocated at init
  // counters of what could not be recorded
  std::atomic<uint64_t> dropped{0};  // events refused because a pool was full
  std::atomic<uint64_t> started{0};  // collectives and p2p started
  // How far the GPU has got, for deciding that an operation's missing events will not come (profiler_core.cc):
  // the sequence number (per context, from 1 at each operation's start) of the latest operation a kernel channel
  // or proxy op of which finished, and whether any such event came at all.
  std::atomic<uint64_t> opSeq{0};
  std::atomic<uint64_t> progressSeq{0};
  std::atomic<bool> anyChild{false};
};

// The writer (telemetry/sink.h) is not named by the core: it installs these hooks (attachWriter) and pulls
// finished operations itself (drainOps). Without a writer, records wait in the rings and slots.
struct WriterHooks {
  void (*wake)() noexcept;            // a record ring is filling up: a writer round now
  void (*contextStarted)(Context*);   // a context was initialised (the writer starts, learns the communicator)
  void (*contextEnding)(Context*);    // a context is being finalized (the writer writes it out first)
};
void setWriterHooks(const WriterHooks* hooks) noexcept;

// The table entry points, version-independent.
ncclResult_t initContext(void** context, int* eActivationMask, const InitArgs& a) noexcept;
void* startEvent(void* context, const EventDesc& d) noexcept;
void stopEvent(void* handle) noexcept;
// arg: ProxyStep/ProxyOp transSize, KernelCh stop pTimer; hasArg false when NCCL passed no arguments.
void recordState(void* handle, int state, uint64_t arg, bool hasArg) noexcept;
void finalizeContext(void* context) noexcept;

// Process-wide anomaly counters (bad handles, stops without start ...), for the Prometheus file.
struct Anomalies {
  uint64_t badHandles;
  uint64_t doubleStops;
  uint64_t nullContexts;
  uint64_t foreignParents;  // PXN proxy ops whose parent lives in another process
  uint64_t unknownTypes;
  uint64_t ringFull;        // completions left to the writer's scan because a thread's ring was full
};
Anomalies anomalies() noexcept;

uint64_t wallNs() noexcept;

// ---- for the writer (sink.cc) ------------------------------------------------------------------------------------

// Visits finished operations of one context (or every context when ctx is null) and hands their records to fn.
// force: emit every stopped operation even when children are still missing (finalize, process exit).
// Returns how many were emitted.
template <typename F>
size_t drainOps(Context* ctx, bool force, F&& fn);
size_t drainOpsImpl(Context* ctx, bool force, void (*fn)(void*, const CollRecord&, Context*), void* arg);
template <typename F>
size_t drainOps(Context* ctx, bool force, F&& fn) {
  return drainOpsImpl(
      ctx, force, [](void* a, const CollRecord& r, Context* c) { (*static_cast<F*>(a))(r, c); }, &fn);
}

}  // namespace weft::telemetry
