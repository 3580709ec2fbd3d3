// SPDX-License-Identifier: Apache-2.0
#include "tuner/nccl_env.h"

#include <strings.h>

#include <cmath>

#include <fmt/format.h>

namespace weft::tuner {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  for (;;) {
    size_t e = s.find(sep, b);
    std::string piece = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!piece.empty()) out.push_back(piece);  // strtok skips empty tokens, as NCCL's parse does
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}

// One variable into list[coll][n]: names(i) is element i's name as NCCL spells it.
template <int N, typename Names>
bool parseOne(const char* env, const char* what, bool (&list)[kNumColls][N], Names names, std::string* why) {
  if (env == nullptr || *env == 0) return true;
  const std::string str(env);
  const std::vector<std::string> entries = split(str, ';');
  for (size_t k = 0; k < entries.size(); ++k) {
    std::string prefix, elems = entries[k];
    const size_t colon = elems.find(':');
    if (colon != std::string::npos) {
      prefix = elems.substr(0, colon);
      elems = elems.substr(colon + 1);
    } else if (k > 0) {
      *why = fmt::format("{}=\"{}\": every entry but the first must name its collective (\"allreduce:...\")", what, str);
      return false;
    }
    bool set = true;
    if (!elems.empty() && elems[0] == '^') set = false, elems.erase(0, 1);
    bool found = false;
    for (int c = 0; c < kNumColls; ++c) {
      if (!prefix.empty() && strcasecmp(prefix.c_str(), collName(c)) != 0) continue;
      found = true;
      for (int e = 0; e < N; ++e) list[c][e] = !set;
      for (const std::string& name : split(elems, ',')) {
        int e = 0;
        while (e < N && strcasecmp(name.c_str(), names(e)) != 0) ++e;
        if (e == N) {
          *why = fmt::format("{}=\"{}\": unknown name \"{}\"", what, str, name);
          return false;
        }
        list[c][e] = set;
      }
    }
    if (!found) {
      *why = fmt::format("{}=\"{}\": unknown collective \"{}\"", what, str, prefix);
      return false;
    }
  }
  return true;
}

// NCCL's own spellings (src/init.cc ncclAlgoStr/ncclProtoStr).
const char* ncclAlgoName(int a) {
  static const char* const kNames[kNumAlgos] = {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree",
                                                "PAT"};
  return kNames[a];
}
const char* ncclProtoName(int p) {
  static const char* const kNames[kNumProtos] = {"LL", "LL128", "Simple"};
  return kNames[p];
}

std::string bytesText(double b) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:g} {}", std::round(b * 10) / 10, kUnits[u]);
}

}  // namespace

NcclEnables::NcclEnables() {
  for (auto& row : algo)
    for (bool& x : row) x = true;
  for (auto& row : proto)
    for (bool& x : row) x = true;
}

bool NcclEnables::allows(int coll, int a, int p) const {
  if (coll < 0 || coll >= kNumColls || a < 0 || a >= kNumAlgos || p < 0 || p >= kNumProtos) return true;
  return algo[coll][a] && proto[coll][p];
}

bool parseNcclEnables(const char* algoEnv, const char* protoEnv, NcclEnables* out, std::string* why) {
  *out = NcclEnables{};
  return parseOne<kNumAlgos>(algoEnv, "NCCL_ALGO", out->algo, ncclAlgoName, why) &&
         parseOne<kNumProtos>(protoEnv, "NCCL_PROTO", out->proto, ncclProtoName, why);
}

std::vector<std::string> blockedChoices(const Policy& p, const NcclEnables& e) {
  std::vector<std::string> out;
  const PolicyOptions& o = p.options();
  if (o.force) {
    for (int c = 0; c < kNumColls; ++c) {
      if (!e.allows(c, o.forced.algo, o.forced.proto)) {
        out.push_back(fmt::format("{}: the forced {} (WEFT_TUNER_FORCE)", collName(c), armName(o.forced)));
      }
    }
    return out;  // forcing decides everything: nothing else applies
  }
  for (const Rule& r : p.rules()) {
    if (!e.allows(r.coll, r.arm.algo, r.arm.proto)) {
      out.push_back(fmt::format("{} {}-{}: {} (a rule)", collName(r.coll), bytesText(static_cast<double>(r.minBytes)),
                                r.maxBytes == UINT64_MAX ? "any" : bytesText(static_cast<double>(r.maxBytes)),
                                armName(r.arm)));
    }
  }
  for (int c = 0; c < kNumColls; ++c) {
    const uint32_t mask = p.mask(c);
    bool offeredNowDisabled = false;
    for (int a = 0; a < kNumAlgos && mask != 0; ++a)
      for (int q = 0; q < kNumProtos; ++q)
        if ((mask >> (a * kNumProtos + q) & 1u) != 0 && !e.allows(c, a, q)) offeredNowDisabled = true;
    if (offeredNowDisabled) {
      out.push_back(fmt::format("{}: every measured choice (the profile was measured with NCCL offering what these "
                                "settings disable: its table no longer matches the profile's, so the tuner leaves {} "
                                "to NCCL)",
                                collName(c), collName(c)));
      continue;
    }
    int runStart = -1;
    Arm runArm;
    auto flush = [&](int endBucket) {
      if (runStart < 0) return;
      out.push_back(fmt::format("{} {}-{}: {}", collName(c), bytesText(std::exp2(bucketLowLog2(runStart))),
                                bytesText(std::exp2(bucketLowLog2(endBucket))), armName(runArm)));
      runStart = -1;
    };
    for (int b = 0; b < kBuckets; ++b) {
      auto [first, last] = p.cell(c, b);
      const bool blocked = first != last && !e.allows(c, first->arm.algo, first->arm.proto);
      if (blocked && runStart >= 0 && first->arm == runArm) continue;
      flush(b);
      if (blocked) runStart = b, runArm = first->arm;
    }
    flush(kBuckets - 1);
  }
  return out;
}

}  // namespace weft::tuner
