// SPDX-License-Identifier: Apache-2.0
#include "tuner/profile.h"

#include <strings.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include <fmt/format.h>

#include "weft/nccl/names.h"

namespace weft::tuner {
namespace {

using nlohmann::json;

// The tuner's collectives are NCCL's functions 0-4; algorithms and protocols NCCL's, by number.
static_assert(kNumColls <= static_cast<int>(nccl::kFuncNames.size()) && kNumAlgos == nccl::kAlgoNames.size() &&
              kNumProtos == nccl::kProtoNames.size());
const auto& kColls = nccl::kFuncNames;
const auto& kAlgos = nccl::kAlgoNames;
const auto& kProtos = nccl::kProtoNames;

bool same(const std::string& a, const char* b) { return strcasecmp(a.c_str(), b) == 0; }

}  // namespace

const char* collName(int c) noexcept { return c >= 0 && c < kNumColls ? kColls[c] : "?"; }
int collFromName(const std::string& s) noexcept {
  for (int i = 0; i < kNumColls; ++i)
    if (same(s, kColls[i])) return i;
  return -1;
}
const char* algoName(int a) noexcept { return a >= 0 && a < kNumAlgos ? kAlgos[a] : "?"; }
int algoFromName(const std::string& s) noexcept {
  for (int i = 0; i < kNumAlgos; ++i)
    if (same(s, kAlgos[i])) return i;
  if (same(s, "collnetdirect")) return 2;
  if (same(s, "collnetchain")) return 3;
  if (same(s, "nvlstree")) return 5;
  return -1;
}
const char* protoName(int p) noexcept { return p >= 0 && p < kNumProtos ? kProtos[p] : "?"; }
int protoFromName(const std::string& s) noexcept {
  for (int i = 0; i < kNumProtos; ++i)
    if (same(s, kProtos[i])) return i;
  return -1;
}

Measurement summarize(int coll, uint64_t bytes, const Arm& arm, std::vector<double> v, double minSpread) {
  Measurement m;
  m.coll = coll;
  m.bytes = bytes;
  m.arm = arm;
  if (v.empty()) return m;
  std::sort(v.begin(), v.end());
  double med = v[v.size() / 2];
  std::vector<double> dev;
  for (double x : v) dev.push_back(std::fabs(x - med));
  std::sort(dev.begin(), dev.end());
  m.timeUs = med;
  m.samples = static_cast<uint32_t>(v.size());
  m.spread = std::max(minSpread, med > 0 ? dev[dev.size() / 2] / med : 0.0);
  return m;
}

std::string armName(const Arm& a) {
  std::string s = fmt::format("{}/{}", algoName(a.algo), protoName(a.proto));
  if (a.channels > 0) s += fmt::format("/{}ch", a.channels);
  if (a.chunk > 0) s += fmt::format("/chunk{}", a.chunk);
  return s;
}

namespace {

template <typename T>
bool getNum(const json& j, const char* key, T* out, std::string* err, const std::string& where, bool required = true) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) *err = fmt::format("{}: \"{}\" is missing", where, key);
    return !required;
  }
  if (!it->is_number()) {
    *err = fmt::format("{}: \"{}\" is not a number", where, key);
    return false;
  }
  double v = it->get<double>();
  if (!std::isfinite(v)) {
    *err = fmt::format("{}: \"{}\" is not finite", where, key);
    return false;
  }
  if constexpr (std::is_integral_v<T>) {
    if (v < 0 && std::is_unsigned_v<T>) {
      *err = fmt::format("{}: \"{}\" is negative", where, key);
      return false;
    }
    // Within T's own range (a JSON number converts to T only if T holds it) and within doubles' exact integers.
    constexpr double lo = std::max(static_cast<double>(std::numeric_limits<T>::lowest()), -9.0e15);
    constexpr double hi = std::min(static_cast<double>(std::numeric_limits<T>::max()), 9.0e15);
    if (v != std::floor(v) || v < lo || v > hi) {
      *err = fmt::format("{}: \"{}\" is not an integer in range", where, key);
      return false;
    }
  }
  *out = static_cast<T>(v);
  return true;
}

bool getStr(const json& j, const char* key, std::string* out, std::string* err, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    *err = fmt::format("{}: \"{}\" is missing or not a string", where, key);
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

bool parseArm(const json& j, Arm* a, std::string* err, const std::string& where) {
  std::string algo, proto;
  if (!getStr(j, "algo", &algo, err, where) || !getStr(j, "proto", &proto, err, where)) return false;
  int ai = algoFromName(algo), pi = protoFromName(proto);
  if (ai < 0 || pi < 0) {
    *err = fmt::format("{}: unknown algorithm/protocol \"{}/{}\"", where, algo, proto);
    return false;
  }
  a->algo = static_cast<int8_t>(ai);
  a->proto = static_cast<int8_t>(pi);
  int channels = 0;
  uint32_t chunk = 0;
  if (!getNum(j, "channels", &channels, err, where, false) || !getNum(j, "chunk", &chunk, err, where, false))
    return false;
  if (channels < 0 || channels > 64) {
    *err = fmt::format("{}: channels {} outside 0..64", where, channels);
    return false;
  }
  a->channels = static_cast<int16_t>(channels);
  a->chunk = chunk;
  return true;
}

}  // namespace

static std::optional<Profile> parseProfileChecked(const std::string& text, std::string* error);

// NCCL's tuning constants ("nccl_constants"): every table of its shape, numbers finite and not negative; the
// compute-capability tables have `compcaps` rows (4 from a v5/v6 tuner, 5 from v7), the rest keep NCCL's defaults.
namespace {
struct ConstTable {
  const char* key;
  double* data;
  int rows, cols;  // rows of cols numbers; rows < 0: compcaps rows
};

bool readMatrix(const json& j, const ConstTable& t, int rows, std::string* err) {
  auto a = j.find(t.key);
  if (a == j.end() || !a->is_array() || static_cast<int>(a->size()) != rows) {
    *err = fmt::format("nccl_constants.{}: want an array of {} rows", t.key, rows);
    return false;
  }
  for (int r = 0; r < rows; ++r) {
    const json& row = (*a)[static_cast<size_t>(r)];
    if (!row.is_array() || static_cast<int>(row.size()) != t.cols) {
      *err = fmt::format("nccl_constants.{}[{}]: want {} numbers", t.key, r, t.cols);
      return false;
    }
    for (int c = 0; c < t.cols; ++c) {
      const json& v = row[static_cast<size_t>(c)];
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
        *err = fmt::format("nccl_constants.{}[{}][{}]: not a finite number >= 0", t.key, r, c);
        return false;
      }
      t.data[r * t.cols + c] = v.get<double>();
    }
  }
  return true;
}

std::vector<ConstTable> constTables(model::Constants& k) {
  return {{"base_latencies", &k.baseLat[0][0], 7, 3},
          {"hw_latencies", &k.hwLat[0][0][0], 21, 3},  // [link][algo]: 3 x 7 rows
          {"ll_max_bws", &k.llMaxBws[0][0], -1, 3},
          {"per_ch_max_ring_ll128_bws", &k.perChMaxRingLL128Bws[0][0], -1, 3},
          {"per_ch_max_tree_ll128_bws", &k.perChMaxTreeLL128Bws[0][0], -1, 3},
          {"per_ch_max_tree_bws", &k.perChMaxTreeBws[0][0], -1, 3},
          {"per_ch_max_nvls_tree_bws", &k.perChMaxNvlsTreeBws[0][0], -1, 3}};
}

bool parseConstants(const json& j, model::Constants* out, std::string* err) {
  if (!j.is_object()) {
    *err = "nccl_constants is not an object";
    return false;
  }
  int n = 0;
  if (!getNum(j, "compcaps", &n, err, "nccl_constants")) return false;
  if (n != 4 && n != model::kNumCompCaps) {
    *err = fmt::format("nccl_constants.compcaps: {} (NCCL's tuners pass 4, or {} from v7)", n, model::kNumCompCaps);
    return false;
  }
  model::Constants k = model::kNcclDefaults;
  k.compCaps = n;
  for (const ConstTable& t : constTables(k)) {
    if (!readMatrix(j, t, t.rows < 0 ? n : t.rows, err)) return false;
  }
  *out = k;
  return true;
}

json writeConstants(const model::Constants& in) {
  model::Constants k = in;
  json j;
  j["compcaps"] = k.compCaps;
  for (const ConstTable& t : constTables(k)) {
    const int rows = t.rows < 0 ? k.compCaps : t.rows;
    json a = json::array();
    for (int r = 0; r < rows; ++r) {
      json row = json::array();
      for (int c = 0; c < t.cols; ++c) row.push_back(t.data[r * t.cols + c]);
      a.push_back(row);
    }
    j[t.key] = a;
  }
  return j;
}
}  // namespace

// Total: a field of an unexpected JSON type (which nlohmann reports by throwing) is refused like any other flaw.
std::optional<Profile> parseProfile(const std::string& text, std::string* error) {
  try {
    return parseProfileChecked(text, error);
  } catch (const std::exception& e) {
    if (error) *error = std::string("malformed profile: ") + e.what();
    return std::nullopt;
  }
}

static std::optional<Profile> parseProfileChecked(const std::string& text, std::string* error) {
  std::string scratch;
  std::string* err = error ? error : &scratch;
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    *err = "not valid JSON";
    return std::nullopt;
  }
  if (!j.is_object() || j.value("format", "") != "weft-tuner-profile") {
    *err = "not a weft tuner profile (\"format\": \"weft-tuner-profile\" missing)";
    return std::nullopt;
  }
  int version = 0;
  if (!getNum(j, "version", &version, err, "profile")) return std::nullopt;
  if (version != 1) {
    *err = fmt::format("profile format version {} (this weft reads 1)", version);
    return std::nullopt;
  }
  Profile p;
  auto sig = j.find("signature");
  if (sig == j.end() || !sig->is_object()) {
    *err = "\"signature\" is missing";
    return std::nullopt;
  }
  if (!getNum(*sig, "nranks", &p.sig.nRanks, err, "signature") || !getNum(*sig, "nnodes", &p.sig.nNodes, err, "signature"))
    return std::nullopt;
  if (p.sig.nRanks < 1 || p.sig.nNodes < 1 || p.sig.nNodes > p.sig.nRanks) {
    *err = fmt::format("signature: nranks {} / nnodes {} is not a topology", p.sig.nRanks, p.sig.nNodes);
    return std::nullopt;
  }
  if (!getNum(*sig, "nvl_domains", &p.sig.nvlDomains, err, "signature", false)) return std::nullopt;
  if (!getNum(*sig, "cc", &p.sig.cc, err, "signature", false)) return std::nullopt;
  if (p.sig.cc < -1 || p.sig.cc >= model::kNumCompCaps) {
    *err = fmt::format("signature.cc: {} is not a compute capability index (0 Volta .. {} Rubin)", p.sig.cc,
                       model::kNumCompCaps - 1);
    return std::nullopt;
  }
  if (sig->contains("nccl") && (*sig)["nccl"].is_string()) p.sig.ncclVersion = (*sig)["nccl"].get<std::string>();
  if (auto m = sig->find("masks"); m != sig->end()) {
    if (!m->is_object()) {
      *err = "signature: \"masks\" is not an object";
      return std::nullopt;
    }
    for (auto& [k, v] : m->items()) {
      int c = collFromName(k);
      if (c < 0 || !v.is_string()) {
        *err = fmt::format("signature.masks: \"{}\" is not a collective with a hex mask", k);
        return std::nullopt;
      }
      char* end = nullptr;
      std::string s = v.get<std::string>();
      unsigned long x = std::strtoul(s.c_str(), &end, 16);
      if (s.empty() || *end != 0 || x >= (1ul << 21)) {
        *err = fmt::format("signature.masks.{}: \"{}\" is not a 21-bit hex mask", k, s);
        return std::nullopt;
      }
      p.sig.masks[c] = static_cast<uint32_t>(x);
    }
  }
  if (auto k = j.find("nccl_constants"); k != j.end()) {
    model::Constants c;
    if (!parseConstants(*k, &c, err)) return std::nullopt;
    p.constants = c;
  }
  if (auto s = j.find("source"); s != j.end() && s->is_object()) {
    for (auto& [k, v] : s->items()) p.source[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  // The arrays of entries: each an object whose "coll" names a collective the tuner sees.
  auto entries = [&](const char* key, auto&& take) {
    auto a = j.find(key);
    if (a == j.end()) return true;
    if (!a->is_array()) {
      *err = fmt::format("\"{}\" is not an array", key);
      return false;
    }
    size_t i = 0;
    for (const auto& e : *a) {
      std::string where = fmt::format("{}[{}]", key, i++);
      std::string coll;
      if (!e.is_object()) {
        *err = where + ": not an object";
        return false;
      }
      if (!getStr(e, "coll", &coll, err, where)) return false;
      int c = collFromName(coll);
      if (c < 0) {
        *err = fmt::format("{}: \"{}\" is not a collective the tuner sees", where, coll);
        return false;
      }
      if (!take(e, c, where)) return false;
    }
    return true;
  };
  const bool ok =
      entries("measurements",
              [&](const json& m, int coll, const std::string& where) {
                Measurement x;
                x.coll = coll;
                if (!getNum(m, "bytes", &x.bytes, err, where) || !parseArm(m, &x.arm, err, where) ||
                    !getNum(m, "time_us", &x.timeUs, err, where) ||
                    !getNum(m, "samples", &x.samples, err, where, false) ||
                    !getNum(m, "spread", &x.spread, err, where, false))
                  return false;
                if (x.bytes == 0 || !(x.timeUs > 0) || x.spread < 0) {
                  *err = where + ": bytes and time_us must be positive, spread not negative";
                  return false;
                }
                p.measurements.push_back(x);
                return true;
              }) &&
      entries("model",
              [&](const json& m, int coll, const std::string& where) {
                ModelPoint x;
                Arm arm;
                x.coll = coll;
                if (!getNum(m, "bytes", &x.bytes, err, where) || !parseArm(m, &arm, err, where) ||
                    !getNum(m, "us", &x.us, err, where))
                  return false;
                if (x.bytes == 0 || !(x.us > 0)) {
                  *err = where + ": bytes and us must be positive";
                  return false;
                }
                x.algo = arm.algo;
                x.proto = arm.proto;
                p.model.push_back(x);
                return true;
              }) &&
      entries("rules", [&](const json& r, int coll, const std::string& where) {
        Rule x;
        x.coll = coll;
        if (!getNum(r, "min_bytes", &x.minBytes, err, where) || !getNum(r, "max_bytes", &x.maxBytes, err, where) ||
            !parseArm(r, &x.arm, err, where) || !getNum(r, "pipe_ops", &x.numPipeOps, err, where, false))
          return false;
        p.rules.push_back(x);
        return true;
      });
  if (!ok) return std::nullopt;
  return p;
}

std::string writeProfile(const Profile& p) {
  json j;
  j["format"] = "weft-tuner-profile";
  j["version"] = 1;
  json sig;
  sig["nranks"] = p.sig.nRanks;
  sig["nnodes"] = p.sig.nNodes;
  if (p.sig.nvlDomains >= 0) sig["nvl_domains"] = p.sig.nvlDomains;
  if (p.sig.cc >= 0) sig["cc"] = p.sig.cc;
  if (!p.sig.ncclVersion.empty()) sig["nccl"] = p.sig.ncclVersion;
  json masks = json::object();
  for (int c = 0; c < kNumColls; ++c)
    if (p.sig.masks[c] != 0) masks[collName(c)] = fmt::format("{:x}", p.sig.masks[c]);
  if (!masks.empty()) sig["masks"] = masks;
  j["signature"] = sig;
  j["source"] = p.source;
  if (p.constants) j["nccl_constants"] = writeConstants(*p.constants);
  // An array of entries, each starting with its collective's name (measurements always, the others when any).
  auto array = [&](const char* key, const auto& items, bool always, auto&& fill) {
    if (items.empty() && !always) return;
    json a = json::array();
    for (const auto& item : items) {
      json x;
      x["coll"] = collName(item.coll);
      fill(item, x);
      a.push_back(x);
    }
    j[key] = a;
  };
  array("measurements", p.measurements, true, [](const Measurement& m, json& x) {
    x["bytes"] = m.bytes;
    x["algo"] = algoName(m.arm.algo);
    x["proto"] = protoName(m.arm.proto);
    x["channels"] = m.arm.channels;
    if (m.arm.chunk) x["chunk"] = m.arm.chunk;
    x["time_us"] = m.timeUs;
    x["samples"] = m.samples;
    x["spread"] = m.spread;
  });
  array("model", p.model, false, [](const ModelPoint& m, json& x) {
    x["bytes"] = m.bytes;
    x["algo"] = algoName(m.algo);
    x["proto"] = protoName(m.proto);
    x["us"] = m.us;
  });
  array("rules", p.rules, false, [](const Rule& r, json& x) {
    x["min_bytes"] = r.minBytes;
    x["max_bytes"] = r.maxBytes;
    x["algo"] = algoName(r.arm.algo);
    x["proto"] = protoName(r.arm.proto);
    x["channels"] = r.arm.channels;
    if (r.numPipeOps >= 0) x["pipe_ops"] = r.numPipeOps;
  });
  return j.dump(1) + "\n";
}

std::optional<Profile> parseNcclCsv(const std::string& text, int nRanks, int nNodes, std::string* error) {
  std::string scratch;
  std::string* err = error ? error : &scratch;
  Profile p;
  p.sig.nRanks = nRanks;
  p.sig.nNodes = nNodes;
  p.source["tool"] = "NCCL example CSV";
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::vector<std::string> f;
    std::stringstream ls(line);
    std::string tok;
    while (std::getline(ls, tok, ',')) {
      size_t a = tok.find_first_not_of(" \t\r"), b = tok.find_last_not_of(" \t\r");
      f.push_back(a == std::string::npos ? "" : tok.substr(a, b - a + 1));
    }
    if (f.size() < 8 || f.size() > 10) {
      *err = fmt::format("line {}: {} fields (want coll,min_bytes,max_bytes,algo,proto,channels,nNodes,nRanks"
                         "[,numPipeOps[,regBuff]])", n, f.size());
      return std::nullopt;
    }
    auto num = [&](const std::string& s, long long* out) {
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(s.c_str(), &end, 10);
      if (s.empty() || *end != 0 || errno != 0 || v < -1) return false;
      *out = v;
      return true;
    };
    long long minB, maxB, ch, nn, nr, pipe = -1;
    if (!num(f[1], &minB) || !num(f[2], &maxB) || !num(f[5], &ch) || !num(f[6], &nn) || !num(f[7], &nr) ||
        (f.size() > 8 && !num(f[8], &pipe))) {
      *err = fmt::format("line {}: a number field is not an integer >= -1", n);
      return std::nullopt;
    }
    Rule r;
    r.coll = collFromName(f[0]);
    int a = algoFromName(f[3]), pr = protoFromName(f[4]);
    if (r.coll < 0 || a < 0 || pr < 0) {
      *err = fmt::format("line {}: unknown collective, algorithm or protocol ({}, {}, {})", n, f[0], f[3], f[4]);
      return std::nullopt;
    }
    if (ch > 64) {
      *err = fmt::format("line {}: channels {} (at most 64)", n, ch);
      return std::nullopt;
    }
    if ((nn != -1 && nn != nNodes) || (nr != -1 && nr != nRanks)) continue;  // another topology
    r.minBytes = minB < 0 ? 0 : static_cast<uint64_t>(minB);
    r.maxBytes = maxB < 0 ? UINT64_MAX : static_cast<uint64_t>(maxB);
    r.arm.algo = static_cast<int8_t>(a);
    r.arm.proto = static_cast<int8_t>(pr);
    r.arm.channels = static_cast<int16_t>(ch < 0 ? 0 : ch);
    r.numPipeOps = static_cast<int>(pipe);
    p.rules.push_back(r);
  }
  return p;
}

std::optional<Profile> loadProfile(const std::string& path, int nRanks, int nNodes, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    if (error) *error = "cannot open " + path;
    return std::nullopt;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parseProfileText(ss.str(), nRanks, nNodes, error);
}

std::optional<Profile> parseProfileText(const std::string& text, int nRanks, int nNodes, std::string* error) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') return parseProfile(text, error);
  return parseNcclCsv(text, nRanks, nNodes, error);
}

}  // namespace weft::tuner
