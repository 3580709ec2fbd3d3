// SPDX-License-Identifier: Apache-2.0
#include "weft/telemetry/record.h"

#include <strings.h>

#include <array>
#include <cstdio>

#include "weft/nccl/names.h"

namespace weft::telemetry {
namespace {

bool same(std::string_view a, const char* b) noexcept {
  size_t n = std::char_traits<char>::length(b);
  return a.size() == n && strncasecmp(a.data(), b, n) == 0;
}

// Func's numbers are NCCL's up to Recv (nccl::kFuncNames); the functions after are weft's own order.
constexpr std::array<const char*, kNumFuncs - nccl::kFuncNames.size()> kLaterFuncNames = {
    "AlltoAll", "Gather", "Scatter", "AllGatherV", "Unknown"};

struct TypeInfo {
  const char* name;
  size_t size;
};
constexpr std::array<TypeInfo, 12> kTypes = {{{"ncclInt8", 1}, {"ncclUint8", 1}, {"ncclInt32", 4}, {"ncclUint32", 4},
                                              {"ncclInt64", 8}, {"ncclUint64", 8}, {"ncclFloat16", 2},
                                              {"ncclFloat32", 4}, {"ncclFloat64", 8}, {"ncclBfloat16", 2},
                                              {"ncclFloat8e4m3", 1}, {"ncclFloat8e5m2", 1}}};


}  // namespace

const char* funcName(Func f) noexcept {
  auto i = static_cast<size_t>(f);
  if (i < nccl::kFuncNames.size()) return nccl::kFuncNames[i];
  i -= nccl::kFuncNames.size();
  return i < kLaterFuncNames.size() ? kLaterFuncNames[i] : "Unknown";
}

Func funcFromName(std::string_view s) noexcept {
  for (size_t i = 0; i < static_cast<size_t>(kNumFuncs) - 1; ++i)
    if (same(s, funcName(static_cast<Func>(i)))) return static_cast<Func>(i);
  if (same(s, "AllToAll")) return Func::kAllToAll;
  return Func::kUnknown;
}

Func funcFromNumber(unsigned v) noexcept { return v <= 7 ? static_cast<Func>(v) : Func::kUnknown; }

const char* typeName(uint8_t t) noexcept { return t < kTypes.size() ? kTypes[t].name : "unknown"; }

uint8_t typeFromName(std::string_view s) noexcept {
  for (size_t i = 0; i < kTypes.size(); ++i) {
    if (same(s, kTypes[i].name) || same(s, kTypes[i].name + 4)) return static_cast<uint8_t>(i);
  }
  // NCCL's aliases
  if (same(s, "ncclChar") || same(s, "ncclBool")) return 0;
  if (same(s, "ncclInt")) return 2;
  if (same(s, "ncclHalf")) return 6;
  if (same(s, "ncclFloat")) return 7;
  if (same(s, "ncclDouble")) return 8;
  return kUnknownType;
}

size_t typeSize(uint8_t t) noexcept { return t < kTypes.size() ? kTypes[t].size : 0; }

const char* algoName(uint8_t a) noexcept { return a < nccl::kAlgoNames.size() ? nccl::kAlgoNames[a] : "UNKNOWN"; }
uint8_t algoFromName(std::string_view s) noexcept {
  for (size_t i = 0; i < nccl::kAlgoNames.size(); ++i)
    if (same(s, nccl::kAlgoNames[i])) return static_cast<uint8_t>(i);
  return kUnknownAlgo;
}
const char* protoName(uint8_t p) noexcept { return p < nccl::kProtoNames.size() ? nccl::kProtoNames[p] : "UNKNOWN"; }
uint8_t protoFromName(std::string_view s) noexcept {
  for (size_t i = 0; i < nccl::kProtoNames.size(); ++i)
    if (same(s, nccl::kProtoNames[i])) return static_cast<uint8_t>(i);
  return kUnknownAlgo;
}

const char* timingSourceName(TimingSource s) noexcept {
  switch (s) {
    case TimingSource::kKernelGpu: return "kernel_gpu";
    case TimingSource::kKernelCpu: return "kernel_cpu";
    case TimingSource::kProxyCpu: return "proxy_cpu";
    case TimingSource::kCollectiveCpu: return "collective_cpu";
  }
  return "unknown";
}

const char* kernelPhaseName(int phase) noexcept {
  static const char* const kNames[kNumKernelPhases] = {"initial_sync", "compute", "final_sync"};
  return phase >= 0 && phase < kNumKernelPhases ? kNames[phase] : "unknown";
}

namespace {
bool perRankCount(Func f) noexcept {
  return f == Func::kAllGather || f == Func::kAllGatherV || f == Func::kReduceScatter || f == Func::kAllToAll ||
         f == Func::kGather || f == Func::kScatter;
}
}  // namespace

double trafficBytes(Func f, uint64_t bytes, int nRanks) noexcept {
  double b = static_cast<double>(bytes);
  return perRankCount(f) && nRanks > 0 ? b * nRanks : b;
}

double busFactor(Func f, int nRanks) noexcept {
  if (nRanks <= 0) return 1.0;
  double n = nRanks;
  if (f == Func::kAllReduce) return 2.0 * (n - 1) / n;
  if (perRankCount(f)) return (n - 1) / n;
  return 1.0;
}

double algBwGBs(Func f, uint64_t bytes, int nRanks, uint64_t ns) noexcept {
  if (ns == 0) return 0.0;
  return trafficBytes(f, bytes, nRanks) / static_cast<double>(ns);  // bytes/ns == GB/s
}

double busBwGBs(Func f, uint64_t bytes, int nRanks, uint64_t ns) noexcept {
  return algBwGBs(f, bytes, nRanks, ns) * busFactor(f, nRanks);
}

int octaveBucket(uint64_t bytes) noexcept {
  if (bytes <= 1) return 0;
  return 64 - __builtin_clzll(bytes - 1);  // ceil(log2(bytes))
}

const char* octaveBucketLabel(int bucket) noexcept {
  static const std::array<const char*, 65> kLabels = [] {
    std::array<const char*, 65> l{};
    static char text[65][8];
    const char* units = "BKMGTPE";
    for (int b = 0; b <= 64; ++b) {
      int u = b / 10;
      unsigned v = 1u << (b % 10);
      if (u == 0) snprintf(text[b], sizeof(text[b]), "%u", v);
      else snprintf(text[b], sizeof(text[b]), "%u%c", v, units[u]);
      l[b] = text[b];
    }
    return l;
  }();
  return bucket >= 0 && bucket <= 64 ? kLabels[bucket] : "?";
}

}  // namespace weft::telemetry
