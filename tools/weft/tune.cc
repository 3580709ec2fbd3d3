// weft tune ...: the tuner's tools.
//   sim    simulated worlds: sweep, decide, score against NCCL's default and the oracle (no GPU needed)
//   show   the decision table of a profile for a topology, NCCL's default beside it (--plot: SVG heatmap)
//   sweep  run a command (nccl-tests) once per candidate, forced through the tuner, parse it, write a profile
//   import NCCL's example CSV rules into a profile
// and weft profile merge: a profile from weft's per-rank timing records.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "args.h"
#include "svg.h"
#include "tuner/nccl_model.h"
#include "tuner/policy.h"
#include "tuner/profile.h"
#include "tuner/sim.h"

namespace weft::tool {
namespace {

using namespace weft::tuner;

std::vector<uint64_t> powersOfTwo(uint64_t lo, uint64_t hi) {
  std::vector<uint64_t> v;
  for (uint64_t n = lo; n <= hi; n *= 2) v.push_back(n);
  return v;
}

bool topoOption(harness::Args& a, model::Topology& t) {
  const std::string& f = a.flag();
  if (f == "--ranks") t.nRanks = a.number(1, 1 << 20);
  else if (f == "--nodes") t.nNodes = a.number(1, 1 << 20);
  else if (f == "--channels") t.nChannels = a.number(1, 64);
  else if (f == "--bw-intra") t.bwIntra = a.number(1, 10000);
  else if (f == "--bw-inter") t.bwInter = a.number(1, 10000);
  else if (f == "--cc") t.cc = a.number(0, 3);
  else if (f == "--amd") t.amdCpu = true;
  else if (f == "--nvls") t.nvls = true;
  else if (f == "--no-ll128") t.ll128 = false;
  else if (f == "--pci") t.nvlinkIntra = false;
  else return false;
  return true;
}

std::string sizeLabel(uint64_t n) { return svg::bytesLabel(static_cast<double>(n)); }

int simCommand(int argc, char** argv) {
  model::Topology topo;  // 2 nodes x 8 Hopper GPUs by default
  std::vector<uint64_t> seeds = {1, 2, 3, 4, 5};
  int samples = 10;
  bool verbose = false;
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
    else if (f == "--verbose") verbose = true;
    else a.unknown();
  }
  if (topo.nNodes > topo.nRanks) {
    std::fprintf(stderr, "weft tune sim: more nodes than ranks\n");
    return 2;
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
    auto pol = Policy::build(p, PolicyOptions{});
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
  auto pol = Policy::build(*prof, PolicyOptions{});
  auto sizes = powersOfTwo(1 << 10, 1u << 30);
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
      float table[21];
      for (int x = 0; x < 7; ++x)
        for (int y = 0; y < 3; ++y) table[x * 3 + y] = t.t[x][y];
      model::Pick def = model::pick(t);
      Decision d = pol->decide(c, n, 1, table, 7, 3, 1000000);
      Arm da;
      da.algo = static_cast<int8_t>(def.algo);
      da.proto = static_cast<int8_t>(def.proto);
      Arm wa;
      wa.algo = static_cast<int8_t>(d.algo);
      wa.proto = static_cast<int8_t>(d.proto);
      wa.channels = static_cast<int16_t>(d.channels);
      std::printf("%-14s %6s  %-18s %-22s %s\n", collName(c), sizeLabel(n).c_str(),
                  fmt::format("{}/{}ch", armName(da), def.channels).c_str(), armName(wa).c_str(), outcomeName(d.outcome));
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

}  // namespace

int tuneCommand(int argc, char** argv);
int profileCommand(int argc, char** argv);

int tuneCommand(int argc, char** argv) {
  std::string sub = argc >= 3 ? argv[2] : "";
  if (sub == "sim") return simCommand(argc, argv);
  if (sub == "show") return showCommand(argc, argv);
  std::fprintf(stderr, "usage: weft tune sim|show ... (weft help)\n");
  return 2;
}

}  // namespace weft::tool
