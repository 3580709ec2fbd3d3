// SPDX-License-Identifier: Apache-2.0
// weft profile merge: a profile from weft's per-rank timing records.
#include "tune_common.h"

namespace weft::tool::tune {

// weft profile merge DIR: a profile from weft's per-rank timing records (WEFT_TELEMETRY_DIR). Collectives are
// joined across ranks by communicator, function and sequence number; the minimum over ranks estimates the
// collective's own time (the others include waiting for the last rank to arrive).
int mergeCommand(int argc, char** argv) {
  std::string dir, outPath;
  int ranks = 0, nodes = 0;
  if (argc >= 4 && argv[3][0] != '-') dir = argv[3];
  harness::Args a("weft profile merge", argc, argv, dir.empty() ? 3 : 4);
  while (a.next()) {
    const std::string& f = a.flag();
    if (f == "--out" || f == "-o") outPath = a.value();
    else if (f == "--ranks") ranks = a.number(1, 1 << 20);
    else if (f == "--nodes") nodes = a.number(1, 1 << 20);
    else a.unknown();
  }
  if (dir.empty() || outPath.empty()) {
    std::fprintf(stderr, "usage: weft profile merge DIR --out PROFILE [--ranks N --nodes M]\n");
    return 2;
  }
  struct Rec {
    int rank, nRanks, nNodes;
    std::string algo, proto;
    uint64_t bytes, execNs;
  };
  std::map<std::tuple<std::string, std::string, uint64_t>, std::vector<Rec>> groups;  // (comm, func, seq)
  size_t files = 0, bad = 0;
  std::string err;
  const std::vector<std::string> paths = telemetry::recordFiles(dir, &err);
  if (!err.empty()) {
    std::fprintf(stderr, "weft profile merge: %s\n", err.c_str());
    return 1;
  }
  for (const auto& path : paths) {
    ++files;
    std::ifstream in(path);
    std::string line, comm, name;
    while (std::getline(in, line)) {
      telemetry::OpRecord op;
      telemetry::LineKind kind = telemetry::parseRecordLine(line, &op, &comm, &name, &err);
      if (kind == telemetry::LineKind::kMalformed) ++bad;
      if (kind != telemetry::LineKind::kOp || op.type != "coll" || op.partial || op.execNs == 0) continue;
      groups[{op.comm, op.func, op.seq}].push_back(Rec{op.rank, op.nRanks, op.nNodes, op.algo, op.proto, op.bytes,
                                                       op.execNs});
    }
  }
  std::map<std::string, std::set<int>> ranksOf;
  for (const auto& [k, g] : groups)
    for (const auto& r : g) ranksOf[std::get<0>(k)].insert(r.rank);
  // (nranks, nnodes, coll, bytes, arm) -> per-invocation minimum times (us)
  std::map<std::pair<int, int>, std::map<std::tuple<int, uint64_t, Arm>, std::vector<double>>> byTopo;
  for (const auto& [k, g] : groups) {
    int coll = collFromName(std::get<1>(k));
    if (coll < 0) continue;  // not a collective the tuner is asked about
    const Rec& f = g.front();
    int al = algoFromName(f.algo), pr = protoFromName(f.proto);
    if (al < 0 || pr < 0) continue;
    int n = f.nRanks > 0 ? f.nRanks : static_cast<int>(ranksOf[std::get<0>(k)].size());
    uint64_t minNs = UINT64_MAX;
    for (const auto& r : g) minNs = std::min(minNs, r.execNs);
    uint64_t tunerBytes = (coll == 2 || coll == 3) ? f.bytes * static_cast<uint64_t>(n) : f.bytes;
    Arm arm;
    arm.algo = static_cast<int8_t>(al);
    arm.proto = static_cast<int8_t>(pr);
    byTopo[{n, f.nNodes}][{coll, tunerBytes, arm}].push_back(minNs / 1e3);
  }
  if (byTopo.empty()) {
    std::fprintf(stderr, "weft profile merge: no complete collective records with algorithm and protocol in %s (%zu "
                         "files, %zu unreadable lines)\n", dir.c_str(), files, bad);
    return 1;
  }
  auto chosen = byTopo.end();
  size_t most = 0;
  for (auto it = byTopo.begin(); it != byTopo.end(); ++it) {
    size_t c = 0;
    for (const auto& [k, v] : it->second) c += v.size();
    bool wanted = (ranks == 0 || it->first.first == ranks) && (nodes == 0 || it->first.second == nodes || it->first.second == 0);
    if (wanted && c > most) most = c, chosen = it;
  }
  if (chosen == byTopo.end()) {
    std::fprintf(stderr, "weft profile merge: no records for %d ranks on %d nodes\n", ranks, nodes);
    return 1;
  }
  Profile p;
  p.sig.nRanks = chosen->first.first;
  p.sig.nNodes = chosen->first.second > 0 ? chosen->first.second : nodes;
  if (p.sig.nNodes <= 0) {
    std::fprintf(stderr, "weft profile merge: the records do not say the number of nodes (NCCL < 2.27): give --nodes\n");
    return 1;
  }
  p.source["tool"] = "weft profile merge";
  p.source["records"] = dir;
  for (auto& [k, v] : chosen->second) {
    auto [coll, bytes, arm] = k;
    p.measurements.push_back(summarize(coll, bytes, arm, v));
  }
  if (!svg::writeFile(outPath, writeProfile(p), &err)) {
    std::fprintf(stderr, "weft profile merge: %s\n", err.c_str());
    return 1;
  }
  std::printf("profile %s: %zu measurements (%zu collectives joined) for %d ranks on %d nodes\n", outPath.c_str(),
              p.measurements.size(), most, p.sig.nRanks, p.sig.nNodes);
  return 0;
}

}  // namespace weft::tool::tune
