// SPDX-License-Identifier: Apache-2.0
// What weft records about one collective or point-to-point operation, and the arithmetic on it (bytes, algBw,
// busBw with nccl-tests' factors, size buckets). Shared by the profiler in the plugin, the exporters and
// `weft report`, so that all of them agree on names and numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace weft::telemetry {

// NCCL's function names as the profiler reports them (v2+ strings; v1 sends ncclFunc_t numbers 0..7).
enum class Func : uint8_t {
  kBroadcast, kReduce, kAllGather, kReduceScatter, kAllReduce, kSendRecv, kSend, kRecv,
  kAllToAll, kGather, kScatter, kAllGatherV, kUnknown
};
constexpr int kNumFuncs = static_cast<int>(Func::kUnknown) + 1;
const char* funcName(Func f) noexcept;
Func funcFromName(std::string_view s) noexcept;   // "AllReduce" ...; unknown -> kUnknown
Func funcFromNumber(unsigned v) noexcept;         // ncclFunc_t of NCCL 2.23 (v1 descriptors)

// Datatypes: ncclDataType_t numbering (v1) and "ncclFloat32"-style names (v2+).
constexpr uint8_t kUnknownType = 0xff;
const char* typeName(uint8_t t) noexcept;
uint8_t typeFromName(std::string_view s) noexcept;
size_t typeSize(uint8_t t) noexcept;  // 0 when unknown

// Algorithms and protocols: NCCL_ALGO_* / NCCL_PROTO_* numbering, names as in ncclAlgoToString.
constexpr uint8_t kUnknownAlgo = 0xff;
const char* algoName(uint8_t a) noexcept;
uint8_t algoFromName(std::string_view s) noexcept;
const char* protoName(uint8_t p) noexcept;
uint8_t protoFromName(std::string_view s) noexcept;

// Where the execution time came from, best first.
enum class TimingSource : uint8_t { kKernelGpu, kKernelCpu, kProxyCpu, kCollectiveCpu };
const char* timingSourceName(TimingSource s) noexcept;

enum RecordFlags : uint8_t {
  kRecP2p = 1 << 0,          // a send or receive (peer set), not a collective
  kRecGraphCaptured = 1 << 1,
  kRecPartial = 1 << 2,      // emitted before every expected kernel channel reported (timeout or finalize)
};

// One completed operation. Plain data: copied out of the event slots by the writer thread.
struct CollRecord {
  uint64_t commHash = 0;
  uint64_t seq = 0;
  uint64_t count = 0;
  uint64_t bytes = 0;        // count × type size (the message size, as nccl-tests' "size" column)
  uint64_t startNs = 0;      // wall clock (CLOCK_REALTIME) when NCCL started the event (enqueue)
  uint64_t enqueuedNs = 0;   // wall clock when NCCL stopped the Coll/P2p event (launched)
  uint64_t endNs = 0;        // wall clock of the last child stop (completion seen by the host); = enqueuedNs without children
  uint64_t gpuNs = 0;        // max over channels of kernel stop − start (GPU %globaltimer), 0 when not available
  uint64_t execNs = 0;       // the time used for bandwidths: gpuNs, else the best CPU estimate (see timing)
  int32_t rank = -1;
  int32_t nRanks = 0;
  int32_t nNodes = 0;
  int32_t root = -1;
  int32_t peer = -1;
  Func func = Func::kUnknown;
  uint8_t dtype = kUnknownType;
  uint8_t algo = kUnknownAlgo;
  uint8_t proto = kUnknownAlgo;
  uint8_t nChannels = 0;
  uint8_t nWarps = 0;
  uint8_t channelsTimed = 0;
  TimingSource timing = TimingSource::kCollectiveCpu;
  uint8_t flags = 0;
  uint8_t channelsPhased = 0;  // kernel channels that reported barrier phases (v7)
  uint64_t userTag = 0;        // the user's tag of the call (v7; 0 untagged)
  // Per kernel phase (initial sync, compute, final sync: NCCL's phase ids 0/1/2), the longest of the channels' (GPU
  // %globaltimer, ns); 0 where no channel reported it. The sync phases are time spent waiting for the other ranks.
  uint64_t phaseNs[3] = {0, 0, 0};
};
constexpr int kNumKernelPhases = 3;
const char* kernelPhaseName(int phase) noexcept;  // "initial_sync", "compute", "final_sync"
// Time waiting for the other ranks: the two sync phases.
inline uint64_t syncWaitNs(const CollRecord& r) noexcept { return r.phaseNs[0] + r.phaseNs[2]; }

// nccl-tests' bandwidth arithmetic (its PERFORMANCE.md): algBw = traffic / time, busBw = algBw × factor.
// AllReduce: traffic = bytes, factor 2(n−1)/n. AllGather(V), ReduceScatter, AllToAll, Gather, Scatter: traffic =
// bytes × n (bytes is the per-rank count), factor (n−1)/n. Broadcast, Reduce, Send, Recv: traffic = bytes, factor 1.
double trafficBytes(Func f, uint64_t bytes, int nRanks) noexcept;
double busFactor(Func f, int nRanks) noexcept;
// GB/s (decimal, as nccl-tests) for a time in ns; 0 when the time is 0.
double algBwGBs(Func f, uint64_t bytes, int nRanks, uint64_t ns) noexcept;
double busBwGBs(Func f, uint64_t bytes, int nRanks, uint64_t ns) noexcept;

// Size buckets: powers of two (bucket b holds sizes in (2^(b-1), 2^b]; 0 bytes is bucket 0). The label is the
// upper bound ("4K", "1M").
int octaveBucket(uint64_t bytes) noexcept;
const char* octaveBucketLabel(int bucket) noexcept;

}  // namespace weft::telemetry
