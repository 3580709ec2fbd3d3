// SPDX-License-Identifier: Apache-2.0
// weft tune show: a profile's decision table for a topology, NCCL's default beside it (--plot: SVG).
#include "tune_common.h"

namespace weft::tool::tune {

int showCommand(int argc, char** argv) {
  model::Topology topo;
  std::string profilePath, plotPath;
  harness::Args a("weft tune show", argc, argv, 3);
  while (a.next()) {
    if (topoOption(a, topo)) continue;
    const std::string& f = a.flag();
    if (f == "--profile") profilePath = a.value();
    else if (f == "--plot") plotPath = a.value();
    else a.unknown();
  }
  if (profilePath.empty()) {
    std::fprintf(stderr, "usage: weft tune show --profile FILE --ranks N --nodes M [topology options] [--plot OUT.svg]\n");
    return 2;
  }
  std::string err;
  auto prof = loadProfile(profilePath, topo.nRanks, topo.nNodes, &err);
  if (!prof) {
    std::fprintf(stderr, "weft tune show: %s: %s\n", profilePath.c_str(), err.c_str());
    return 1;
  }
  std::string why;
  if (!signatureMatches(prof->sig, topo.nRanks, topo.nNodes, -1, &why)) {
    std::printf("weft tune show: %s: the tuner would pass NCCL's choices through\n", why.c_str());
    return 0;
  }
  modelFromProfile(*prof, &topo);
  auto pol = Policy::build(*prof, PolicyOptions{});
  auto sizes = powersOfTwo(1 << 10, 1u << 30);
  std::set<std::pair<int, uint64_t>> measured;
  for (const auto& m : prof->measurements) measured.insert({m.coll, m.bytes});
  std::printf("decisions for %d ranks on %d nodes (NCCL's default from weft's reference model of its cost table)\n",
              topo.nRanks, topo.nNodes);
  std::printf("%-14s %6s  %-18s %-22s %s\n", "collective", "size", "NCCL default", "weft", "why");
  svg::Heatmap hm;
  hm.title = fmt::format("weft tuner decisions, {} ranks / {} nodes", topo.nRanks, topo.nNodes);
  std::map<std::string, int> colour;
  for (int c = 0; c < kNumColls; ++c) {
    hm.rowLabels.push_back(collName(c));
    hm.text.emplace_back();
    hm.colour.emplace_back();
    for (uint64_t n : sizes) {
      model::Table t = model::costTable(topo, c, n, 1);
      // The entries NCCL really offered when the profile was made (its signature's mask), not those the reference
      // model assumes the hardware has: a GPU run without LL128 (no NVLink, say) is shown as it ran.
      if (prof->sig.masks[c] != 0)
        for (int al = 0; al < 7; ++al)
          for (int pr = 0; pr < 3; ++pr)
            if ((prof->sig.masks[c] & (1u << (al * 3 + pr))) == 0) t.t[al][pr] = -1.0f;
      model::Pick def = model::pick(t);
      Decision d = pol->decide(c, n, 1, t.flat(), 7, 3, 1000000);
      Arm da;
      da.algo = static_cast<int8_t>(def.algo);
      da.proto = static_cast<int8_t>(def.proto);
      Arm wa;
      wa.algo = static_cast<int8_t>(d.algo);
      wa.proto = static_cast<int8_t>(d.proto);
      wa.channels = static_cast<int16_t>(d.channels);
      std::printf("%-14s %6s  %-18s %-22s %s\n", collName(c), sizeLabel(n).c_str(),
                  fmt::format("{}/{}ch", armName(da), def.channels).c_str(), armName(wa).c_str(),
                  d.outcome == Outcome::kMeasured && !measured.count({c, n})
                      ? fmt::format("{} (not a measured size: estimated{})", outcomeName(d.outcome),
                                    prof->model.empty() ? "" : " with NCCL's model").c_str()
                      : outcomeName(d.outcome));
      std::string key = fmt::format("{}/{}", algoName(wa.algo), protoName(wa.proto));
      if (!colour.count(key)) {
        colour[key] = static_cast<int>(colour.size());
        hm.legend.push_back(key);
      }
      bool changed = !(wa.algo == da.algo && wa.proto == da.proto) || wa.channels != 0;
      hm.text.back().push_back(changed ? "*" + armName(wa) : armName(wa));
      hm.colour.back().push_back(colour[key]);
    }
  }
  for (uint64_t n : sizes) hm.colLabels.push_back(sizeLabel(n));
  if (!plotPath.empty()) {
    std::string e;
    if (!svg::writeFile(plotPath, svg::render(hm), &e)) {
      std::fprintf(stderr, "weft tune show: %s\n", e.c_str());
      return 1;
    }
    std::printf("plot: %s (* = changed from NCCL's default)\n", plotPath.c_str());
  }
  return 0;
}

}  // namespace weft::tool::tune
