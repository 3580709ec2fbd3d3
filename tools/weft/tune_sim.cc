// SPDX-License-Identifier: Apache-2.0
// weft tune sim: simulated worlds swept, decided and scored against NCCL's default and the oracle.
#include "tune_common.h"

namespace weft::tool::tune {

int simCommand(int argc, char** argv) {
  model::Topology topo;  // 2 nodes x 8 Hopper GPUs by default
  std::vector<uint64_t> seeds = {1, 2, 3, 4, 5};
  int samples = 10;
  bool verbose = false, held = false;
  PolicyOptions po;
  int reps = 3;
  sim::WorldOptions base;
  harness::Args a("weft tune sim", argc, argv, 3);
  while (a.next()) {
    if (topoOption(a, topo)) continue;
    const std::string& f = a.flag();
    if (f == "--seeds") {
      seeds.clear();
      for (const auto& s : harness::split(a.value(), ',')) seeds.push_back(std::stoull(s));
    } else if (f == "--samples") samples = a.number(1, 1000);
    else if (f == "--arm-error") base.armSigma = a.number(0, 100) / 100.0;
    else if (f == "--noise") base.noiseSigma = a.number(0, 100) / 100.0;
    else if (f == "--planted") base.plantedPerColl = a.number(0, 7);
    else if (f == "--verbose") verbose = true;
    else if (f == "--held-out") held = true;
    else if (f == "--reps") reps = a.number(1, 100);
    else if (f == "--no-bracket") po.bracket = false;
    else if (f == "--reach") po.reach = a.number(0, 1000);
    else if (f == "--no-despike") po.spike = 0;
    else if (f == "--no-model") po.model = false;
    else if (f == "--extrapolate") po.maxExtrapolation = a.number(0, 16);
    else if (f == "--spike") po.spike = a.number(1, 1000) / 100.0;
    else if (f == "--margin") po.margin = a.number(0, 50) / 100.0;
    else a.unknown();
  }
  if (topo.nNodes > topo.nRanks) {
    std::fprintf(stderr, "weft tune sim: more nodes than ranks\n");
    return 2;
  }
  if (held) {
    std::vector<int> colls = {2, 3, 4};
    std::printf("held-out evaluation: %d ranks on %d nodes; sweep at %zu sizes (64K, 256K, ... 256M: every other "
                "octave), %d samples, %d sweeps with their own noise per seed, %zu seeds; scored at %zu unmeasured "
                "sizes (quarter octaves 32K..512M)\n",
                topo.nRanks, topo.nNodes, sim::heldOutSweepSizes().size(), samples, reps, seeds.size(),
                sim::heldOutScoreSizes().size());
    std::printf("%-11s %9s %9s %9s %12s %9s %9s\n", "world", "geomean", "min", "p1", "below 0.99", "regret",
                "changed");
    for (sim::Structure st : {sim::Structure::kSmooth, sim::Structure::kSignFlip, sim::Structure::kDrift,
                              sim::Structure::kHeavyTail, sim::Structure::kOffPick}) {
      sim::WorldOptions wo = base;
      wo.structure = st;
      sim::HeldOut h = sim::heldOut(topo, wo, seeds, reps, samples, po, colls);
      std::vector<double> sp = h.speedups;
      std::sort(sp.begin(), sp.end());
      double p1 = sp.empty() ? 1.0 : sp[sp.size() / 100];
      std::printf("%-11s %8.3fx %8.3fx %8.3fx %6d/%-5zu %8.2f%% %9d\n", sim::structureName(st), h.geoSpeedup,
                  h.minSpeedup, p1, h.below99, sp.size(), 100 * h.geoRegret, h.changed);
      for (const auto& pt : verbose ? h.worst : std::vector<sim::Point>{}) {
        std::printf("    %-13s %8s nccl %-16s %9.1fus  tuned %-16s %9.1fus  oracle %-16s %9.1fus  %s\n",
                    collName(pt.coll), sizeLabel(pt.bytes).c_str(), armName(pt.ncclArm).c_str(), pt.ncclUs,
                    armName(pt.tunedArm).c_str(), pt.tunedUs, armName(pt.oracleArm).c_str(), pt.oracleUs,
                    outcomeName(pt.outcome));
      }
    }
    return 0;
  }
  std::vector<int> colls = {2, 3, 4};  // AllGather, ReduceScatter, AllReduce
  auto sizes = powersOfTwo(64 << 10, 256 << 20);
  std::printf("simulated worlds: %d ranks on %d nodes, %d channels, %g/%g GB/s per channel; model error %.0f%%, "
              "noise %.0f%%; sweep of %zu sizes (64K..256M) x every candidate x %d samples; %zu seeds\n",
              topo.nRanks, topo.nNodes, topo.nChannels, topo.bwIntra, topo.bwInter, 100 * base.armSigma,
              100 * base.noiseSigma, sizes.size(), samples, seeds.size());
  std::printf("%6s %10s %10s %10s %10s %10s %8s\n", "seed", "speedup", "min", "planted", "regret", "maxregret",
              "changed");
  double logAll = 0, logPlanted = 0, minAll = 1e30, regAll = 0, maxReg = 0;
  for (uint64_t seed : seeds) {
    sim::WorldOptions wo = base;
    wo.seed = seed;
    sim::World w(topo, wo);
    Profile p = sim::sweep(w, colls, sizes, samples, seed * 7919 + 1);
    auto pol = Policy::build(p, po);
    sim::Score s = sim::evaluate(w, *pol, colls, sizes);
    std::printf("%6llu %9.3fx %9.3fx %9.3fx %9.2f%% %9.2f%% %5d/%zu\n", static_cast<unsigned long long>(seed),
                s.geoSpeedup, s.minSpeedup, s.plantedGeoSpeedup, 100 * s.geoRegret, 100 * s.maxRegret, s.changed,
                s.points.size());
    if (verbose) {
      for (const auto& pt : s.points)
        std::printf("   %-13s %6s %s nccl %-12s %9.1fus  tuned %-16s %9.1fus  oracle %-16s %9.1fus  %s\n",
                    collName(pt.coll), sizeLabel(pt.bytes).c_str(), pt.planted ? "*" : " ", armName(pt.ncclArm).c_str(),
                    pt.ncclUs, armName(pt.tunedArm).c_str(), pt.tunedUs, armName(pt.oracleArm).c_str(), pt.oracleUs,
                    outcomeName(pt.outcome));
    }
    logAll += std::log(s.geoSpeedup);
    logPlanted += std::log(s.plantedGeoSpeedup);
    minAll = std::min(minAll, s.minSpeedup);
    regAll += std::log1p(s.geoRegret);
    maxReg = std::max(maxReg, s.maxRegret);
  }
  size_t n = seeds.size();
  std::printf("%6s %9.3fx %9.3fx %9.3fx %9.2f%% %9.2f%%\n", "all", std::exp(logAll / n), minAll,
              std::exp(logPlanted / n), 100 * (std::exp(regAll / n) - 1), 100 * maxReg);
  return 0;
}

}  // namespace weft::tool::tune
