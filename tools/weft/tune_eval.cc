// SPDX-License-Identifier: Apache-2.0
// weft tune eval: a profile scored in a simulated world.
#include "tune_common.h"

namespace weft::tool::tune {

// Scores a profile in a simulated world (the same seed as nccl-sim) against NCCL's default and the oracle.
int evalCommand(int argc, char** argv) {
  model::Topology topo;
  std::string profilePath;
  int seed = 1;
  harness::Args a("weft tune eval", argc, argv, 3);
  while (a.next()) {
    if (topoOption(a, topo)) continue;
    const std::string& f = a.flag();
    if (f == "--profile") profilePath = a.value();
    else if (f == "--seed") seed = a.number(0, 1 << 30);
    else a.unknown();
  }
  std::string err;
  auto prof = loadProfile(profilePath, topo.nRanks, topo.nNodes, &err);
  if (!prof) {
    std::fprintf(stderr, "weft tune eval: %s: %s\n", profilePath.c_str(), err.c_str());
    return 1;
  }
  modelFromProfile(*prof, &topo);
  sim::WorldOptions wo;
  wo.seed = static_cast<uint64_t>(seed);
  sim::World w(topo, wo);
  std::set<int> colls;
  std::set<uint64_t> sizes;
  for (const auto& m : prof->measurements) colls.insert(m.coll), sizes.insert(m.bytes);
  auto pol = Policy::build(*prof, PolicyOptions{});
  sim::Score s = sim::evaluate(w, *pol, std::vector<int>(colls.begin(), colls.end()),
                               std::vector<uint64_t>(sizes.begin(), sizes.end()));
  std::printf("eval: %zu points: geomean speedup %.3fx over NCCL's default, min %.3fx, planted %.3fx, regret %.2f%% "
              "(max %.2f%%), %d changed\n",
              s.points.size(), s.geoSpeedup, s.minSpeedup, s.plantedGeoSpeedup, 100 * s.geoRegret, 100 * s.maxRegret,
              s.changed);
  return 0;
}

}  // namespace weft::tool::tune
