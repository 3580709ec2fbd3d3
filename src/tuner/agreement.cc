// SPDX-License-Identifier: Apache-2.0
#include "tuner/agreement.h"

#include <fmt/format.h>

#include <cctype>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "tuner/profile.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"

namespace weft::tuner {
namespace {

bool otherTunerNamed() {
  const char* t = std::getenv("NCCL_TUNER_PLUGIN");
  if (t == nullptr || *t == 0) return false;  // NCCL 2.21+ then takes the net library's tuner: this one
  std::string s(t);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s.find("weft") == std::string::npos;
}

}  // namespace

transport::Agreement decisionState() {
  transport::Agreement a;
  if (!params::getBool("WEFT_TUNER_CHECK")) {
    a.summary = "not checked (WEFT_TUNER_CHECK=0)";
    return a;
  }
  if (otherTunerNamed()) {
    a.summary = fmt::format("not checked (NCCL_TUNER_PLUGIN={})", std::getenv("NCCL_TUNER_PLUGIN"));
    return a;
  }
  std::string canon = "weft-tuner-decisions-1\n";
  if (!params::getBool("WEFT_TUNER")) {
    canon += "off\n";
    a.summary = "tuner off (WEFT_TUNER=0)";
  } else {
    const int margin = static_cast<int>(params::getInt("WEFT_TUNER_MARGIN"));
    const bool explore = params::getBool("WEFT_TUNER_EXPLORE");
    const std::string& force = params::getString("WEFT_TUNER_FORCE");
    const std::string& path = params::getString("WEFT_TUNER_PROFILE");
    canon += fmt::format("margin {}\nexplore {}\nforce {}\n", margin, explore ? 1 : 0, force);
    std::string what;
    if (path.empty()) {
      canon += "profile none\n";
      what = "no profile";
    } else {
      std::ifstream in(path, std::ios::binary);
      if (!in) {
        canon += "profile unreadable\n";
        what = fmt::format("profile {} cannot be read: NCCL's own choices", path);
      } else {
        std::stringstream ss;
        ss << in.rdbuf();
        const std::string bytes = ss.str();
        const uint64_t h = fnv1a64(bytes);
        canon += fmt::format("profile {} bytes {:016x}\n", bytes.size(), h);
        std::string err;
        auto p = parseProfileText(bytes, 0, 0, &err);
        what = p ? fmt::format("profile {} ({} bytes, {:016x})", path, bytes.size(), h)
                 : fmt::format("profile {} does not load ({}): NCCL's own choices", path, err);
      }
    }
    a.summary = fmt::format("{}, margin {}%{}{}", what, margin, explore ? ", exploring" : "",
                            force.empty() ? "" : ", forcing " + force);
  }
  a.digest = fnv1a64(canon);
  if (a.digest == 0) a.digest = 1;  // 0 means unchecked
  return a;
}

std::string stateLine(const transport::Agreement& a) {
  return fmt::format("{}{:016x}: {}", kStateTag, a.digest, a.summary);
}

std::vector<LoggedState> scanLog(std::istream& in, const std::string& name) {
  std::vector<LoggedState> out;
  std::set<std::string> seen;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t at = line.find(kStateTag);
    if (at == std::string::npos) continue;
    const size_t hex = at + std::strlen(kStateTag);
    if (line.size() < hex + 18 || line.compare(hex + 16, 2, ": ") != 0) continue;
    LoggedState s;
    try {
      size_t used = 0;
      s.digest = std::stoull(line.substr(hex, 16), &used, 16);
      if (used != 16) continue;
    } catch (const std::exception&) {
      continue;
    }
    s.summary = line.substr(hex + 18);
    // NCCL's prefix: "host:pid:tid [dev] NCCL INFO ..." (src/debug.cc): the process is host:pid.
    const size_t sp = line.find(' ');
    const std::string head = sp == std::string::npos ? "" : line.substr(0, sp);
    const size_t c1 = head.find(':'), c2 = c1 == std::string::npos ? std::string::npos : head.find(':', c1 + 1);
    s.who = c2 != std::string::npos && sp < at ? head.substr(0, c2) : fmt::format("{}:{}", name, n);
    if (seen.insert(s.who).second) out.push_back(std::move(s));
  }
  return out;
}

}  // namespace weft::tuner
