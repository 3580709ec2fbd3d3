// SPDX-License-Identifier: Apache-2.0
// weft tune check: one tuner decision state in every rank's NCCL log, or which processes differ.
#include "tune_common.h"

namespace weft::tool::tune {

// Checks the NCCL logs of a job (NCCL_DEBUG=INFO, every rank; files, or - for standard input) for the tuner's
// decision state line: one state everywhere, or which processes differ. The handshake refuses such connections in
// the combined library; with the standalone tuner only the logs tell.
int checkCommand(int argc, char** argv) {
  std::vector<std::string> files;
  int k = 3;
  for (; k < argc && (argv[k][0] != '-' || std::string(argv[k]) == "-"); ++k) files.emplace_back(argv[k]);
  int expect = 0;
  harness::Args a("weft tune check", argc, argv, k);
  while (a.next()) {
    if (a.flag() == "--expect") expect = a.number(1, 1 << 24);
    else a.unknown();
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: weft tune check LOG... [--expect N]   (LOG: NCCL_DEBUG=INFO output of every rank; - for stdin)\n");
    return 2;
  }
  std::map<uint64_t, std::vector<LoggedState>> byDigest;
  size_t processes = 0;
  for (const std::string& f : files) {
    std::vector<LoggedState> got;
    if (f == "-") {
      got = scanLog(std::cin, "stdin");
    } else {
      std::ifstream in(f);
      if (!in) {
        std::fprintf(stderr, "weft tune check: cannot read %s\n", f.c_str());
        return 2;
      }
      got = scanLog(in, f);
    }
    for (auto& g : got) byDigest[g.digest].push_back(std::move(g)), ++processes;
  }
  if (processes == 0) {
    std::fprintf(stderr, "weft tune check: no \"%s\" line in the logs (NCCL_DEBUG=INFO, and a weft tuner loaded?)\n",
                 kStateTag);
    return 2;
  }
  const bool agree = byDigest.size() == 1;
  const bool complete = expect == 0 || static_cast<int>(processes) == expect;
  if (agree) {
    const LoggedState& s = byDigest.begin()->second.front();
    std::printf("tune check: %zu processes, one tuner decision state %016llx: %s\n", processes,
                static_cast<unsigned long long>(s.digest), s.summary.c_str());
  } else {
    std::printf("tune check: %zu processes, %zu different tuner decision states: their ranks would pick different "
                "algorithms and NCCL would hang\n", processes, byDigest.size());
    for (const auto& [d, v] : byDigest) {
      std::printf("  %016llx (%zu): %s\n    ", static_cast<unsigned long long>(d), v.size(), v.front().summary.c_str());
      for (size_t i = 0; i < v.size() && i < 8; ++i) std::printf("%s%s", i ? ", " : "", v[i].who.c_str());
      std::printf("%s\n", v.size() > 8 ? ", ..." : "");
    }
    std::printf("  give every rank the same WEFT_TUNER* settings and the same profile file\n");
  }
  if (!complete) {
    std::printf("tune check: %zu processes logged their state, %d expected: the others did not load the tuner, or "
                "their logs are missing\n", processes, expect);
  }
  return agree && complete ? 0 : 1;
}

}  // namespace weft::tool::tune
