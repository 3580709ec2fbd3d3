// SPDX-License-Identifier: Apache-2.0
// The exported ncclTunerPlugin_v2 ... _v7 tables (in libnccl-net-weft.so, where NCCL 2.21+ finds them when
// NCCL_TUNER_PLUGIN is unset, and alone in libnccl-tuner-weft.so). Every entry returns ncclSuccess: an error from
// init fails communicator creation and one from getCollInfo fails the collective (docs/nccl-semantics.md §tuner), so
// a problem (no profile, a malformed one, another topology) turns this communicator's tuner into a pass-through with one
// warning. Decisions come from src/tuner/policy.h and depend only on rank-consistent inputs.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tuner/agreement.h"
#include "tuner/nccl_env.h"
#include "tuner/policy.h"
#include "tuner/profile.h"
#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/nccl/tuner.h"

namespace weft::tuner {
namespace {

constexpr uint32_t kTunerMagic = 0x57545543;  // "WTUC"

struct TunerContext {
  uint32_t magic = kTunerMagic;
  uint64_t commId = 0;
  int nRanks = 0, nNodes = 0, nvlDomains = -1;
  std::shared_ptr<const Policy> policy;  // null: pass-through
  bool logDecisions = false;
  std::atomic<uint32_t> counters[kNumColls][kBuckets];  // per-key call counter (same sequence on every rank)
  std::atomic<uint32_t> masksSeen[kNumColls];
  std::atomic<uint8_t> forcedUnavailable[kNumColls][kBuckets];  // sweep mode: buckets where the forced entry was IGNORE
  std::atomic<uint64_t> calls{0}, changed{0};
  std::string recordPath;
  // NCCL's tuning constants as init received them (v5+), for the recorded profile (the reference model's numbers).
  std::optional<model::Constants> constants;
  // Record mode: NCCL's cost table at the first call of each (collective, size bucket), for the profile's model.
  struct SeenTable {
    std::atomic<uint8_t> seen{0};
    uint64_t bytes = 0;
    float us[kNumAlgos * kNumProtos];
  };
  std::unique_ptr<SeenTable[]> tables;  // kNumColls * kBuckets, only while recording
  TunerContext() {
    for (auto& row : counters)
      for (auto& c : row) c.store(0, std::memory_order_relaxed);
    for (auto& m : masksSeen) m.store(0, std::memory_order_relaxed);
    for (auto& row : forcedUnavailable)
      for (auto& f : row) f.store(0, std::memory_order_relaxed);
  }
};

std::mutex gCacheMutex;
std::map<std::string, std::shared_ptr<const Profile>> gProfiles;  // by path; loaded once per process

bool parseArmSpec(const std::string& s, Arm* arm, std::string* why) {
  // ALGO/PROTO[/CHANNELS]
  size_t a = s.find('/');
  if (a == std::string::npos) {
    *why = "want ALGO/PROTO[/CHANNELS], e.g. RING/LL128 or TREE/SIMPLE/8";
    return false;
  }
  size_t b = s.find('/', a + 1);
  int algo = algoFromName(s.substr(0, a));
  int proto = protoFromName(s.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1));
  if (algo < 0 || proto < 0) {
    *why = "unknown algorithm or protocol in '" + s + "'";
    return false;
  }
  int channels = 0;
  if (b != std::string::npos) {
    int64_t v = 0;
    std::string e;
    if (!params::parseInt(s.substr(b + 1), 1, 64, &v, &e)) {
      *why = "channels: " + e;
      return false;
    }
    channels = static_cast<int>(v);
  }
  arm->algo = static_cast<int8_t>(algo);
  arm->proto = static_cast<int8_t>(proto);
  arm->channels = static_cast<int16_t>(channels);
  return true;
}

// NCCL_ALGO / NCCL_PROTO make NCCL ignore what the tuner chooses where they disable it (NVIDIA/nccl#1661): said
// once per process as a warning, then per communicator at INFO.
void reportNcclOverrides(const Policy& policy, uint64_t commId) {
  const char* algo = std::getenv("NCCL_ALGO");
  const char* proto = std::getenv("NCCL_PROTO");
  if ((algo == nullptr || *algo == 0) && (proto == nullptr || *proto == 0)) return;
  const std::string set = fmt::format("{}{}{}", algo && *algo ? fmt::format("NCCL_ALGO={}", algo) : "",
                                      algo && *algo && proto && *proto ? " " : "",
                                      proto && *proto ? fmt::format("NCCL_PROTO={}", proto) : "");
  NcclEnables enables;
  std::string why;
  if (!parseNcclEnables(algo, proto, &enables, &why)) {
    WEFT_INFO(NCCL_TUNING, "tuner: {} (NCCL refuses it too)", why);
    return;
  }
  std::vector<std::string> blocked = blockedChoices(policy, enables);
  if (blocked.empty()) {
    WEFT_INFO(NCCL_TUNING, "tuner: communicator {:#x}: {} takes none of the tuner's choices away", commId, set);
    return;
  }
  std::string list;
  for (size_t i = 0; i < blocked.size() && i < 12; ++i) list += (i ? "; " : "") + blocked[i];
  if (blocked.size() > 12) list += fmt::format("; and {} more", blocked.size() - 12);
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    WEFT_WARN("tuner: {} disables what the tuner would choose for: {}. NCCL ignores those choices (they are IGNORE in "
              "its table) and keeps its own there: unset the variable{} to let the profile decide", set, list,
              algo && *algo && proto && *proto ? "s" : "");
  } else {
    WEFT_INFO(NCCL_TUNING, "tuner: communicator {:#x}: {} disables what the tuner would choose for: {}", commId, set,
              list);
  }
}

TunerContext* makeContext(uint64_t commId, size_t nRanks, size_t nNodes, int nvlDomains, ncclDebugLogger_t logger) {
  if (logger != nullptr) log::setLogger(logger);
  // Once per process, on every rank: what decides this tuner's choices, for `weft tune check` over the logs.
  static std::once_flag stateLogged;
  std::call_once(stateLogged, [] { WEFT_INFO(NCCL_INIT | NCCL_TUNING, "{}", stateLine(decisionState())); });
  auto* c = new TunerContext();
  c->commId = commId;
  c->nRanks = static_cast<int>(nRanks);
  c->nNodes = static_cast<int>(nNodes);
  c->nvlDomains = nvlDomains;
  c->logDecisions = params::getBool("WEFT_TUNER_LOG");
  c->recordPath = params::getString("WEFT_TUNER_RECORD");
  if (!c->recordPath.empty()) c->tables.reset(new TunerContext::SeenTable[kNumColls * kBuckets]);
  if (!params::getBool("WEFT_TUNER")) {
    WEFT_INFO(NCCL_TUNING, "tuner: off (WEFT_TUNER=0): NCCL's own choices");
    return c;
  }
  PolicyOptions opt;
  opt.margin = static_cast<double>(params::getInt("WEFT_TUNER_MARGIN")) / 100.0;
  opt.explore = params::getBool("WEFT_TUNER_EXPLORE");
  const std::string& force = params::getString("WEFT_TUNER_FORCE");
  if (!force.empty()) {
    std::string why;
    if (!parseArmSpec(force, &opt.forced, &why)) {
      WEFT_WARN("tuner: WEFT_TUNER_FORCE='{}': {}; NCCL's own choices", force, why);
      return c;
    }
    opt.force = true;
  }
  const std::string& path = params::getString("WEFT_TUNER_PROFILE");
  std::shared_ptr<const Profile> prof;
  if (!path.empty()) {
    std::lock_guard<std::mutex> lock(gCacheMutex);
    auto it = gProfiles.find(path);
    if (it != gProfiles.end()) {
      prof = it->second;
    } else {
      std::string err;
      auto p = loadProfile(path, c->nRanks, c->nNodes, &err);
      if (!p) {
        WEFT_WARN("tuner: profile {}: {}; NCCL's own choices", path, err);
      } else {
        prof = std::make_shared<const Profile>(std::move(*p));
        WEFT_INFO(NCCL_TUNING, "tuner: profile {}: {} measurements, {} rules, for {} ranks on {} nodes", path,
                  prof->measurements.size(), prof->rules.size(), prof->sig.nRanks, prof->sig.nNodes);
      }
      gProfiles[path] = prof;  // a failed load is remembered too: one warning per process
    }
  }
  if (prof) {
    std::string why;
    if (!signatureMatches(prof->sig, c->nRanks, c->nNodes, nvlDomains, &why)) {
      WEFT_INFO(NCCL_TUNING, "tuner: communicator {:#x}: {}: NCCL's own choices", commId, why);
      prof.reset();
    }
  }
  if (prof || opt.force || opt.explore) {
    c->policy = Policy::build(prof ? *prof : Profile{}, opt);
    reportNcclOverrides(*c->policy, commId);
    WEFT_INFO(NCCL_TUNING, "tuner: communicator {:#x} ({} ranks, {} nodes): {}{}{}", commId, nRanks, nNodes,
              prof ? "profile" : "no profile", opt.explore ? ", exploring" : "",
              opt.force ? ", forcing " + armName(opt.forced) : "");
  } else if (path.empty()) {
    WEFT_INFO(NCCL_TUNING, "tuner: no WEFT_TUNER_PROFILE: NCCL's own choices");
  }
  return c;
}

TunerContext* asContext(void* p) {
  auto* c = static_cast<TunerContext*>(p);
  return c != nullptr && c->magic == kTunerMagic ? c : nullptr;
}

ncclResult_t collInfo(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                      int numAlgo, int numProto, int* nChannels) noexcept {
  TunerContext* c = asContext(context);
  if (c == nullptr || collCostTable == nullptr) return ncclSuccess;
  int coll = static_cast<int>(collType);
  if (coll < 0 || coll >= kNumColls) return ncclSuccess;
  c->calls.fetch_add(1, std::memory_order_relaxed);
  // A contiguous float[numAlgo][numProto] (docs/nccl-semantics.md §tuner).
  float* table = reinterpret_cast<float*>(collCostTable);
  if (!c->recordPath.empty() && c->masksSeen[coll].load(std::memory_order_relaxed) == 0) {
    uint32_t mask = 0;
    for (int a = 0; a < numAlgo && a < kNumAlgos; ++a)
      for (int p = 0; p < numProto && p < kNumProtos; ++p)
        if (table[a * numProto + p] >= 0.0f) mask |= 1u << (a * 3 + p);
    c->masksSeen[coll].store(mask, std::memory_order_relaxed);
  }
  if (c->tables) {
    auto& seen = c->tables[coll * kBuckets + sizeBucket(nBytes)];
    if (seen.seen.load(std::memory_order_acquire) == 0) {
      for (int a = 0; a < kNumAlgos; ++a)
        for (int p = 0; p < kNumProtos; ++p)
          seen.us[a * kNumProtos + p] = a < numAlgo && p < numProto ? table[a * numProto + p] : -1.0f;
      seen.bytes = nBytes;
      seen.seen.store(1, std::memory_order_release);
    }
  }
  if (!c->policy) return ncclSuccess;
  int bucket = sizeBucket(nBytes);
  std::atomic<uint32_t>& counter = c->counters[coll][bucket];
  uint32_t index = counter.load(std::memory_order_relaxed);
  counter.store(index + 1, std::memory_order_relaxed);
  Decision d = c->policy->decide(coll, nBytes, numPipeOps, table, numAlgo, numProto, index);
  if (d.outcome == Outcome::kForcedUnavailable) c->forcedUnavailable[coll][bucket].store(1, std::memory_order_relaxed);
  if (d.outcome == Outcome::kMeasured || d.outcome == Outcome::kRule || d.outcome == Outcome::kForced ||
      d.outcome == Outcome::kExplored) {
    c->changed.fetch_add(1, std::memory_order_relaxed);
    if (nChannels != nullptr && d.channels > 0) *nChannels = d.channels;
  }
  if (c->logDecisions && index == 0) {
    WEFT_INFO(NCCL_TUNING, "tuner: {} {} B pipeOps {} -> {}/{}{} ({})", collName(coll), nBytes, numPipeOps,
              algoName(d.algo), protoName(d.proto), d.channels > 0 ? fmt::format("/{}ch", d.channels) : "",
              outcomeName(d.outcome));
  }
  return ncclSuccess;
}

void writeRecord(const TunerContext* c) {
  if (c->recordPath.empty()) return;
  Profile p;
  p.sig.nRanks = c->nRanks;
  p.sig.nNodes = c->nNodes;
  p.sig.nvlDomains = c->nvlDomains;
  p.constants = c->constants;
  for (int i = 0; i < kNumColls; ++i) p.sig.masks[i] = c->masksSeen[i].load(std::memory_order_relaxed);
  p.source["tool"] = "weft tuner record (WEFT_TUNER_RECORD)";
  std::string fu;
  for (int i = 0; i < kNumColls; ++i)
    for (int b = 0; b < kBuckets; ++b)
      if (c->forcedUnavailable[i][b].load(std::memory_order_relaxed)) fu += fmt::format("{}{}:{}", fu.empty() ? "" : ",", i, b);
  if (!fu.empty()) p.source["forced_unavailable"] = fu;
  for (int i = 0; c->tables && i < kNumColls * kBuckets; ++i) {
    const auto& seen = c->tables[i];
    if (seen.seen.load(std::memory_order_acquire) == 0) continue;
    for (int k = 0; k < kNumAlgos * kNumProtos; ++k) {
      if (!(seen.us[k] > 0.0f) || !std::isfinite(seen.us[k])) continue;  // IGNORE, or nothing to scale
      ModelPoint m;
      m.coll = i / kBuckets;
      m.bytes = seen.bytes;
      m.algo = static_cast<int8_t>(k / kNumProtos);
      m.proto = static_cast<int8_t>(k % kNumProtos);
      m.us = seen.us[k];
      p.model.push_back(m);
    }
  }
  std::string tmp = c->recordPath + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    WEFT_WARN("tuner: cannot write WEFT_TUNER_RECORD {}: {}", tmp, std::strerror(errno));
    return;
  }
  std::string text = writeProfile(p);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), c->recordPath.c_str());
}

ncclResult_t finalizeContext(void* context) noexcept {
  TunerContext* c = asContext(context);
  if (c == nullptr) return ncclSuccess;
  try {
    if (c->policy)
      WEFT_INFO(NCCL_TUNING, "tuner: communicator {:#x}: {} decisions, {} changed NCCL's choice", c->commId,
                c->calls.load(), c->changed.load());
    writeRecord(c);
  } catch (...) {
  }
  c->magic = 0;
  delete c;
  return ncclSuccess;
}

// ---- per-version adapters ------------------------------------------------------------------------------------

template <typename F>
ncclResult_t guardedInit(void** ctx, F&& make) noexcept {
  if (ctx == nullptr) return ncclSuccess;
  *ctx = nullptr;
  try {
    *ctx = make();
  } catch (...) {
    WEFT_WARN("tuner: init failed; NCCL's own choices");
  }
  return ncclSuccess;  // never fail communicator creation (docs/nccl-semantics.md §tuner)
}

ncclResult_t initV2(size_t nRanks, size_t nNodes, ncclDebugLogger_t logger, void** ctx) noexcept {
  return guardedInit(ctx, [&] { return makeContext(0, nRanks, nNodes, -1, logger); });
}

// NCCL's constants, read (never changed: NCCL reads them back after init). v5/v6 carry 4 compute capabilities, v7
// 5; a row NCCL did not pass keeps the model's default.
template <typename C>
model::Constants readConstants(const C& in) {
  constexpr int rows = static_cast<int>(sizeof(in.llMaxBws) / sizeof(in.llMaxBws[0]));
  static_assert(rows <= model::kNumCompCaps, "more compute capabilities than the model knows");
  model::Constants k = model::kNcclDefaults;
  k.compCaps = rows;
  std::memcpy(k.baseLat, in.baseLatencies, sizeof(k.baseLat));
  std::memcpy(k.hwLat, in.hwLatencies, sizeof(k.hwLat));
  std::memcpy(k.llMaxBws, in.llMaxBws, sizeof(in.llMaxBws));
  std::memcpy(k.perChMaxRingLL128Bws, in.perChMaxRingLL128Bws, sizeof(in.perChMaxRingLL128Bws));
  std::memcpy(k.perChMaxTreeLL128Bws, in.perChMaxTreeLL128Bws, sizeof(in.perChMaxTreeLL128Bws));
  std::memcpy(k.perChMaxTreeBws, in.perChMaxTreeBws, sizeof(in.perChMaxTreeBws));
  std::memcpy(k.perChMaxNvlsTreeBws, in.perChMaxNVLSTreeBws, sizeof(in.perChMaxNVLSTreeBws));
  return k;
}
static_assert(sizeof(model::Constants::baseLat) == sizeof(ncclTunerConstants_v7_t::baseLatencies) &&
                  sizeof(model::Constants::hwLat) == sizeof(ncclTunerConstants_v7_t::hwLatencies) &&
                  sizeof(model::Constants::llMaxBws) == sizeof(ncclTunerConstants_v7_t::llMaxBws),
              "the model's constants have tuner v7's shape");

template <typename Domain, typename Constants>
ncclResult_t initV5(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logger,
                    Domain* nvl, Constants* constants /*read only: NCCL reads them back*/) noexcept {
  return guardedInit(ctx, [&] {
    TunerContext* c = makeContext(commId, nRanks, nNodes, nvl ? nvl->nNvlDomains : -1, logger);
    if (constants != nullptr && !c->recordPath.empty()) c->constants = readConstants(*constants);
    return c;
  });
}

// v2 (NCCL 2.21 natively) has no cost table: NCCL would take a returned pair without checking NCCL_ALGO/PROTO or
// hardware support. So v2 only ever follows forced/rule arms of RING or TREE with LL or SIMPLE, and only where the
// caller said nothing about CollNet/NVLS; everything else is left to NCCL.
ncclResult_t collInfoV2(void* context, ncclFunc_t collType, size_t nBytes, int /*collNet*/, int /*nvls*/,
                        int numPipeOps, int* algorithm, int* protocol, int* nChannels) noexcept {
  TunerContext* c = asContext(context);
  if (c == nullptr || !c->policy || algorithm == nullptr || protocol == nullptr) return ncclSuccess;
  float table[kNumAlgos * kNumProtos];
  for (float& v : table) v = NCCL_ALGO_PROTO_IGNORE;
  // Only the safe pairs are offered; their cost is unknown (equal), so measured decisions never apply here.
  for (int a : {NCCL_ALGO_TREE, NCCL_ALGO_RING})
    for (int p : {NCCL_PROTO_LL, NCCL_PROTO_SIMPLE}) table[a * kNumProtos + p] = 1.0f;
  int coll = static_cast<int>(collType);
  if (coll < 0 || coll >= kNumColls) return ncclSuccess;
  Decision d = c->policy->decide(coll, nBytes, numPipeOps, table, kNumAlgos, kNumProtos, 0);
  if (d.outcome == Outcome::kForced || d.outcome == Outcome::kRule) {
    *algorithm = d.algo;
    *protocol = d.proto;
    if (nChannels != nullptr && d.channels > 0) *nChannels = d.channels;
  }
  return ncclSuccess;
}

ncclResult_t collInfoV3(void* ctx, ncclFunc_t coll, size_t nBytes, int numPipeOps, float** table, int numAlgo,
                        int numProto, int* nChannels) noexcept {
  return collInfo(ctx, coll, nBytes, numPipeOps, table, numAlgo, numProto, nChannels);
}

ncclResult_t collInfoV4(void* ctx, ncclFunc_t coll, size_t nBytes, int numPipeOps, float** table, int numAlgo,
                        int numProto, int /*regBuff: differs between ranks, never used*/, int* nChannels) noexcept {
  return collInfo(ctx, coll, nBytes, numPipeOps, table, numAlgo, numProto, nChannels);
}

ncclResult_t chunkSizeV6(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto, int nChannels,
                         size_t* chunkSize) noexcept {
  TunerContext* c = asContext(context);
  if (c == nullptr || !c->policy || chunkSize == nullptr) return ncclSuccess;
  uint32_t chunk = c->policy->chunkFor(static_cast<int>(collType), nBytes, algo, proto, nChannels);
  if (chunk > 0) *chunkSize = chunk;  // NCCL clamps it to the buffer and rounds it to the protocol's grain
  return ncclSuccess;
}

}  // namespace
}  // namespace weft::tuner

using namespace weft::tuner;

#define WEFT_TUNER_EXPORT __attribute__((visibility("default")))

extern "C" {

WEFT_TUNER_EXPORT ncclTuner_v2_t ncclTunerPlugin_v2 = {"weft", initV2, collInfoV2, finalizeContext};
WEFT_TUNER_EXPORT ncclTuner_v3_t ncclTunerPlugin_v3 = {"weft", initV2, collInfoV3, finalizeContext};
WEFT_TUNER_EXPORT ncclTuner_v4_t ncclTunerPlugin_v4 = {"weft", initV2, collInfoV4, finalizeContext};
WEFT_TUNER_EXPORT ncclTuner_v5_t ncclTunerPlugin_v5 = {
    "weft", initV5<ncclNvlDomainInfo_v5_t, ncclTunerConstants_v5_t>, collInfoV4, finalizeContext};
WEFT_TUNER_EXPORT ncclTuner_v6_t ncclTunerPlugin_v6 = {
    "weft", initV5<ncclNvlDomainInfo_v6_t, ncclTunerConstants_v6_t>, collInfoV4, finalizeContext, chunkSizeV6};
WEFT_TUNER_EXPORT ncclTuner_v7_t ncclTunerPlugin_v7 = {
    "weft", initV5<ncclNvlDomainInfo_v7_t, ncclTunerConstants_v7_t>, collInfoV4, finalizeContext, chunkSizeV6};

}  // extern "C"
