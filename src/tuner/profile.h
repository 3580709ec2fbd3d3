// SPDX-License-Identifier: Apache-2.0
// Tuner profiles: what was measured for a topology, per collective and message size, for each candidate
// (algorithm, protocol, channel cap[, chunk]). A versioned JSON file (format in docs/tuning.md); NCCL's example
// CSV rules can be imported too. Parsing is strict and total: any malformed input gives one clear error and no
// profile (the tuner then passes NCCL's choices through), never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "tuner/nccl_model.h"

namespace weft::tuner {

constexpr int kNumColls = 5;  // ncclFunc_t Broadcast..AllReduce: the collectives NCCL asks the tuner about
constexpr int kNumAlgos = 7;
constexpr int kNumProtos = 3;
const char* collName(int coll) noexcept;
int collFromName(const std::string& s) noexcept;  // -1 when unknown
const char* algoName(int a) noexcept;
int algoFromName(const std::string& s) noexcept;
const char* protoName(int p) noexcept;
int protoFromName(const std::string& s) noexcept;

// A candidate: what the tuner can ask NCCL for.
struct Arm {
  int8_t algo = -1;
  int8_t proto = -1;
  int16_t channels = 0;  // 0: NCCL's own channel count
  uint32_t chunk = 0;    // 0: NCCL's own chunk size (v6 getChunkSize)
  bool operator<(const Arm& o) const {
    return std::tie(algo, proto, channels, chunk) < std::tie(o.algo, o.proto, o.channels, o.chunk);
  }
  bool operator==(const Arm& o) const {
    return algo == o.algo && proto == o.proto && channels == o.channels && chunk == o.chunk;
  }
};
std::string armName(const Arm& a);

struct Measurement;
// A measurement from raw samples (µs): median, MAD/median spread (at least minSpread), sample count.
Measurement summarize(int coll, uint64_t bytes, const struct Arm& arm, std::vector<double> samplesUs,
                      double minSpread = 0.0);

struct Measurement {
  int coll = 4;
  uint64_t bytes = 0;  // nBytes as NCCL passes it to the tuner (AllGather/ReduceScatter: nRanks × per-rank bytes)
  Arm arm;
  double timeUs = 0;   // central estimate (median) of the collective's time
  uint32_t samples = 0;
  double spread = 0;   // relative spread of the samples (MAD / median)
};

// What identifies the machine and NCCL a profile was measured on (all rank-consistent at the tuner's init).
struct Signature {
  int nRanks = 0;
  int nNodes = 0;
  int nvlDomains = -1;       // v5+: nNvlDomains; -1 unknown
  int cc = -1;               // the GPUs' compute capability index (model::kNumCompCaps; 4 Rubin); -1 unknown
  std::string ncclVersion;   // informational
  // Per collective: which (algo, proto) entries NCCL's cost table offered (bit algo*3+proto), 0 = not recorded.
  // A table whose entries differ at run time means a changed NCCL, topology or NCCL_ALGO/PROTO: pass-through.
  uint32_t masks[kNumColls] = {};
};

// A rule imported from NCCL's example CSV: in [minBytes, maxBytes] use `arm` (first matching rule wins, as in
// NCCL's example; channels -1 there means NCCL's default here, not one channel).
struct Rule {
  int coll = 4;
  uint64_t minBytes = 0, maxBytes = UINT64_MAX;
  Arm arm;
  int numPipeOps = -1;  // -1: any
};

// NCCL's own estimate (its cost table, µs) for an algorithm/protocol at a size, as the tuner saw it while the
// profile was measured (WEFT_TUNER_RECORD). With it the policy interpolates how far the measurements are from
// NCCL's model, not the times themselves: the model carries the shape (latency plus bytes over bandwidth) between
// measured sizes.
struct ModelPoint {
  int coll = 4;
  uint64_t bytes = 0;
  int8_t algo = -1, proto = -1;
  double us = 0;
};

struct Profile {
  Signature sig;
  std::vector<Measurement> measurements;
  std::vector<ModelPoint> model;
  std::vector<Rule> rules;
  std::map<std::string, std::string> source;  // tool, command, environment, created ...
  // NCCL's tuning constants as the tuner received them at init (WEFT_TUNER_RECORD, v5+; v7 has the fifth compute
  // capability's row): the reference model's numbers for this profile's tools (weft tune show, eval).
  std::optional<model::Constants> constants;
};

// JSON (format "weft-tuner-profile", version 1). On failure: nullopt and *error says where and why.
std::optional<Profile> parseProfile(const std::string& text, std::string* error);
// A JSON profile, or NCCL's example CSV (recognised by content; its rows are filtered for nRanks/nNodes).
std::optional<Profile> loadProfile(const std::string& path, int nRanks, int nNodes, std::string* error);
// The same from a file's contents already read.
std::optional<Profile> parseProfileText(const std::string& text, int nRanks, int nNodes, std::string* error);
std::string writeProfile(const Profile& p);
// NCCL's example tuner CSV: coll,min_bytes,max_bytes,algo,proto,channels,nNodes,nRanks[,numPipeOps[,regBuff]]
// (-1 = any). Rows for another nRanks/nNodes are dropped; regBuff is ignored (it differs between ranks).
std::optional<Profile> parseNcclCsv(const std::string& text, int nRanks, int nNodes, std::string* error);

}  // namespace weft::tuner
