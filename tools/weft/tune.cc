// SPDX-License-Identifier: Apache-2.0
// weft tune ...: the tuner's tools.
//   sim    simulated worlds: sweep, decide, score against NCCL's default and the oracle (no GPU needed)
//   show   the decision table of a profile for a topology, NCCL's default beside it (--plot: SVG heatmap)
//   sweep  run a command (nccl-tests) once per candidate, forced through the tuner, parse it, write a profile
//   import NCCL's example CSV rules into a profile
// and weft profile merge: a profile from weft's per-rank timing records.
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <strings.h>

#include <algorithm>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <tuple>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "args.h"
#include "svg.h"
#include "tuner/agreement.h"
#include "tuner/nccl_model.h"
#include "tuner/policy.h"
#include "tuner/profile.h"
#include "tuner/sim.h"
#include "weft/nccl/tuner.h"
#include "weft/telemetry/record_reader.h"

namespace weft::tool {
namespace {

using namespace weft::tuner;

std::vector<uint64_t> powersOfTwo(uint64_t lo, uint64_t hi) {
  std::vector<uint64_t> v;
  for (uint64_t n = lo; n <= hi; n *= 2) v.push_back(n);
  return v;
}

bool gCcGiven = false;  // --cc was given (a profile's own compute capability then does not replace it)

bool topoOption(harness::Args& a, model::Topology& t) {
  const std::string& f = a.flag();
  if (f == "--ranks") t.nRanks = a.number(1, 1 << 20);
  else if (f == "--nodes") t.nNodes = a.number(1, 1 << 20);
  else if (f == "--channels") t.nChannels = a.number(1, 64);
  else if (f == "--bw-intra") t.bwIntra = a.number(1, 10000);
  else if (f == "--bw-inter") t.bwInter = a.number(1, 10000);
  else if (f == "--cc") {
    const std::string v = a.value();
    t.cc = model::compCapFromName(v.c_str());
    gCcGiven = true;
    if (t.cc < 0) {
      std::fprintf(stderr, "weft tune: --cc '%s': want volta, ampere, hopper, blackwell, rubin or 0 to 4\n", v.c_str());
      std::exit(2);
    }
  }
  else if (f == "--amd") t.amdCpu = true;
  else if (f == "--nvls") t.nvls = true;
  else if (f == "--no-ll128") t.ll128 = false;
  else if (f == "--pci") t.nvlinkIntra = false;
  else return false;
  return true;
}

// A profile recorded by the tuner carries NCCL's own constants (and may name the GPUs' compute capability): the
// reference model uses them, unless --cc chose the capability.
void modelFromProfile(const Profile& p, model::Topology* t) {
  if (p.constants) t->constants = &*p.constants;
  if (p.sig.cc >= 0 && !gCcGiven) t->cc = p.sig.cc;
}

std::string sizeLabel(uint64_t n) { return svg::bytesLabel(static_cast<double>(n)); }

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

// ---- nccl-tests output ------------------------------------------------------------------------------------

struct TestRow {
  uint64_t bytes;
  double timeUs;
};

// Rows of an nccl-tests table (both layouts: with and without the root column). The out-of-place time is taken,
// as nccl-tests' own busbw column is. Lines that are not table rows are skipped.
std::vector<TestRow> parseNcclTests(const std::string& out, std::string* error) {
  std::vector<TestRow> rows;
  int timeCol = -1;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<std::string> tok;
    std::string t;
    while (ls >> t) tok.push_back(t);
    if (tok.empty()) continue;
    if (tok[0] == "#") {
      if (tok.size() > 4 && tok[1] == "size" && tok[2] == "count") {
        for (size_t i = 1; i < tok.size(); ++i)
          if (tok[i] == "time") {
            timeCol = static_cast<int>(i) - 1;  // data rows have no leading '#'
            break;
          }
      }
      continue;
    }
    if (timeCol < 0 || static_cast<int>(tok.size()) <= timeCol + 2) continue;
    char* end = nullptr;
    unsigned long long bytes = std::strtoull(tok[0].c_str(), &end, 10);
    if (*end != 0) continue;
    double us = std::strtod(tok[timeCol].c_str(), &end);
    if (*end != 0 || !(us > 0) || bytes == 0) continue;
    rows.push_back({bytes, us});
  }
  if (rows.empty() && error) *error = timeCol < 0 ? "no nccl-tests table header (# size count ... time ...)" : "no rows";
  return rows;
}

int collOfCommand(const std::string& cmd) {
  if (cmd.find("all_reduce") != std::string::npos) return 4;
  if (cmd.find("all_gather") != std::string::npos) return 2;
  if (cmd.find("reduce_scatter") != std::string::npos) return 3;
  if (cmd.find("broadcast") != std::string::npos) return 0;
  if (cmd.find("reduce_perf") != std::string::npos) return 1;
  return -1;
}

bool runCapture(const std::string& cmd, const std::vector<std::pair<std::string, std::string>>& env, std::string* out,
                int* status) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return false;
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    close(pipefd[1]);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) out->append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  waitpid(pid, status, 0);
  return true;
}

// Candidates x channel caps; false (said on stderr) for an entry that is not ALGO/PROTO.
bool parseArms(const std::string& candidates, const std::string& channels, std::vector<Arm>* arms) {
  for (const auto& c : harness::split(candidates, ',')) {
    auto slash = c.find('/');
    int al = algoFromName(c.substr(0, slash)), pr = slash == std::string::npos ? -1 : protoFromName(c.substr(slash + 1));
    if (al < 0 || pr < 0) {
      std::fprintf(stderr, "weft tune sweep: '%s' is not ALGO/PROTO\n", c.c_str());
      return false;
    }
    for (const auto& ch : harness::split(channels, ',')) {
      Arm arm;
      arm.algo = static_cast<int8_t>(al);
      arm.proto = static_cast<int8_t>(pr);
      arm.channels = static_cast<int16_t>(std::stoi(ch));
      arms->push_back(arm);
    }
  }
  return true;
}

// The profile being swept: resumed where one is there (its measurements kept, its done candidates listed), with
// where it comes from; false (said on stderr) when the file there is not a profile.
bool openSweepProfile(const std::string& outPath, const std::string& command, const std::string& via, Profile* prof,
                      std::set<std::string>* done) {
  // Resume: a profile already there keeps its measurements and says which candidates are done.
  std::string err;
  if (std::ifstream(outPath).good()) {
    auto old = loadProfile(outPath, 0, 0, &err);
    if (!old) {
      std::fprintf(stderr, "weft tune sweep: %s exists but is not a profile (%s); not overwriting it\n", outPath.c_str(),
                   err.c_str());
      return false;
    }
    *prof = *old;
    for (const auto& d : harness::split(prof->source["done"], ' ')) done->insert(d);
  }
  prof->source["tool"] = "weft tune sweep";
  prof->source["command"] = command;
  prof->source["via"] = via;
  std::string envList;
  for (const char* k : {"NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_ALGO", "NCCL_PROTO", "NCCL_IB_HCA",
                        "NCCL_SOCKET_IFNAME", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "WEFT_PROVIDER"})
    if (const char* v = std::getenv(k)) envList += fmt::format("{}{}={}", envList.empty() ? "" : " ", k, v);
  prof->source["env"] = envList;
  return true;
}

// The environment that forces one candidate: through weft's tuner (WEFT_TUNER_FORCE) or NCCL's own variables.
std::vector<std::pair<std::string, std::string>> armEnv(const Arm& arm, const std::string& via,
                                                        const std::string& recordPath) {
  std::vector<std::pair<std::string, std::string>> env = {{"WEFT_TUNER_RECORD", recordPath}};
  if (via == "tuner") {
    env.push_back({"WEFT_TUNER_FORCE", arm.channels > 0 ? fmt::format("{}/{}/{}", algoName(arm.algo), protoName(arm.proto), arm.channels)
                                                        : fmt::format("{}/{}", algoName(arm.algo), protoName(arm.proto))});
  } else {
    std::string algo = arm.algo == 0 ? "Tree" : arm.algo == 1 ? "Ring" : algoName(arm.algo);
    env.push_back({"NCCL_ALGO", algo});
    env.push_back({"NCCL_PROTO", arm.proto == 2 ? "Simple" : protoName(arm.proto)});
    if (arm.channels > 0) {
      env.push_back({"NCCL_MIN_NCHANNELS", std::to_string(arm.channels)});
      env.push_back({"NCCL_MAX_NCHANNELS", std::to_string(arm.channels)});
    }
  }
  return env;
}

// What the tuner recorded in one run (WEFT_TUNER_RECORD): the topology and masks, NCCL's model at the swept sizes
// (the first run that saw an entry gives it), and the sizes where the forced entry was not available.
void foldRecord(const std::string& recordPath, int coll, const std::map<uint64_t, std::vector<double>>& times,
                Profile* prof, std::set<std::tuple<uint64_t, int, int>>* modelSeen, std::set<uint64_t>* unavailable) {
  std::string rerr;
  if (auto rec = loadProfile(recordPath, 0, 0, &rerr)) {
    if (prof->sig.nRanks == 0) prof->sig = rec->sig;
    if (rec->constants && !prof->constants) prof->constants = rec->constants;  // NCCL's, as its init gave them
    for (int c = 0; c < kNumColls; ++c)
      if (rec->sig.masks[c] && !prof->sig.masks[c]) prof->sig.masks[c] = rec->sig.masks[c];
    // NCCL's model at the swept sizes (the first run that saw an entry gives it).
    for (const ModelPoint& m : rec->model)
      if (m.coll == coll && times.count(m.bytes) && modelSeen->insert({m.bytes, m.algo, m.proto}).second)
        prof->model.push_back(m);
    for (const auto& item : harness::split(rec->source["forced_unavailable"], ',')) {
      auto colon = item.find(':');
      if (colon != std::string::npos && std::stoi(item.substr(0, colon)) == coll)
        for (const auto& [b, v] : times)
          if (sizeBucket(b) == std::stoi(item.substr(colon + 1))) unavailable->insert(b);
    }
  }
}

int sweepCommand(int argc, char** argv) {
  std::string command, outPath, candidates = "TREE/LL,TREE/LL128,TREE/SIMPLE,RING/LL,RING/LL128,RING/SIMPLE";
  std::string channels = "0", via = "tuner";
  int coll = -1, repeat = 5, ranks = 0, nodes = 0;
  harness::Args a("weft tune sweep", argc, argv, 3);
  while (a.next()) {
    const std::string& f = a.flag();
    if (f == "--command") command = a.value();
    else if (f == "--out") outPath = a.value();
    else if (f == "--coll") coll = collFromName(a.value());
    else if (f == "--candidates") candidates = a.value();
    else if (f == "--channels") channels = a.value();
    else if (f == "--repeat") repeat = a.number(1, 100);
    else if (f == "--via") via = a.value();
    else if (f == "--ranks") ranks = a.number(1, 1 << 20);
    else if (f == "--nodes") nodes = a.number(1, 1 << 20);
    else a.unknown();
  }
  if (coll < 0) coll = collOfCommand(command);
  if (command.empty() || outPath.empty() || coll < 0 || (via != "tuner" && via != "env")) {
    std::fprintf(stderr, "usage: weft tune sweep --command 'CMD' --out PROFILE [--coll NAME (else from the command: "
                         "all_reduce_perf ...)] [--candidates ALGO/PROTO,...] [--channels 0,8] [--repeat N] "
                         "[--via tuner|env] [--ranks N --nodes M]\n"
                         "(--repeat: runs per candidate, default 5; with noisy runs use 7 or more: see docs/tuning.md)\n");
    return 2;
  }
  std::vector<Arm> arms;
  if (!parseArms(candidates, channels, &arms)) return 2;
  Profile prof;
  std::set<std::string> done;
  std::string err;
  if (!openSweepProfile(outPath, command, via, &prof, &done)) return 1;
  std::string recordPath = outPath + ".record.json";
  std::set<std::tuple<uint64_t, int, int>> modelSeen;  // (bytes, algo, proto) of prof.model
  for (const ModelPoint& m : prof.model)
    if (m.coll == coll) modelSeen.insert({m.bytes, m.algo, m.proto});
  size_t total = arms.size(), idx = 0;
  const bool tty = isatty(2) != 0;
  for (const Arm& arm : arms) {
    ++idx;
    std::string name = armName(arm);
    std::string key = fmt::format("{}:{}", collName(coll), name);
    if (done.count(key)) {
      std::fprintf(stderr, "[%zu/%zu] %s: done before, skipped\n", idx, total, name.c_str());
      continue;
    }
    std::map<uint64_t, std::vector<double>> times;
    std::set<uint64_t> unavailable;
    for (int r = 0; r < repeat; ++r) {
      int bar = static_cast<int>(30.0 * ((idx - 1) * repeat + r) / (total * repeat));
      if (tty) {
        std::fprintf(stderr, "\r[%s%s] %zu/%zu %-20s run %d/%d ", std::string(bar, '#').c_str(),
                     std::string(30 - bar, '.').c_str(), idx, total, name.c_str(), r + 1, repeat);
      } else if (r == 0) {
        std::fprintf(stderr, "[%zu/%zu] %s x %d\n", idx, total, name.c_str(), repeat);
      }
      auto env = armEnv(arm, via, recordPath);
      std::remove(recordPath.c_str());
      std::string out;
      int status = 0;
      if (!runCapture(command, env, &out, &status) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "\nweft tune sweep: the command failed for %s (exit %d); the profile keeps what is done\n",
                     name.c_str(), WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return 1;
      }
      auto rows = parseNcclTests(out, &err);
      if (rows.empty()) {
        std::fprintf(stderr, "\nweft tune sweep: %s: %s\n", name.c_str(), err.c_str());
        return 1;
      }
      for (const auto& row : rows) times[row.bytes].push_back(row.timeUs);
      foldRecord(recordPath, coll, times, &prof, &modelSeen, &unavailable);
    }
    for (auto& [bytes, v] : times) {
      if (unavailable.count(bytes) || bytes == 0) continue;  // NCCL ran its own pick there, not this candidate
      prof.measurements.push_back(summarize(coll, bytes, arm, v, 0.02));  // nccl-tests prints averages: >= 2%
    }
    done.insert(key);
    std::string d;
    for (const auto& x : done) d += (d.empty() ? "" : " ") + x;
    prof.source["done"] = d;
    if (ranks > 0) prof.sig.nRanks = ranks;
    if (nodes > 0) prof.sig.nNodes = nodes;
    if (prof.sig.nRanks == 0) {
      std::fprintf(stderr, "\nweft tune sweep: no WEFT_TUNER_RECORD came back (is weft's tuner loaded?); give --ranks "
                           "and --nodes\n");
      return 1;
    }
    std::string tmp = outPath + ".tmp";
    if (!svg::writeFile(tmp, writeProfile(prof), &err) || std::rename(tmp.c_str(), outPath.c_str()) != 0) {
      std::fprintf(stderr, "\nweft tune sweep: cannot write %s: %s\n", outPath.c_str(), err.c_str());
      return 1;
    }
  }
  std::remove(recordPath.c_str());
  if (tty) std::fprintf(stderr, "\r[%s] %zu/%zu done%30s\n", std::string(30, '#').c_str(), total, total, "");
  std::printf("profile %s: %zu measurements for %d ranks on %d nodes\n", outPath.c_str(), prof.measurements.size(),
              prof.sig.nRanks, prof.sig.nNodes);
  return 0;
}

// An NCCL stand-in for tests and demos: for each size, NCCL's table from the reference model goes through the
// real tuner plugin file (getCollInfo as enqueue.cc calls it), NCCL's argmin picks, and the simulated world
// times the pick; printed as nccl-tests prints it.
// NCCL's logger as the simulated NCCL's: WARN always, INFO with NCCL_DEBUG=INFO, in NCCL's line format
// ("host:pid:tid [dev] NCCL INFO ...", src/debug.cc) on standard error.
void simLogger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  static const bool info = [] {
    const char* d = std::getenv("NCCL_DEBUG");
    return d != nullptr && strcasecmp(d, "INFO") == 0;
  }();
  if (level != NCCL_LOG_WARN && !(level == NCCL_LOG_INFO && info)) return;
  char host[64] = "localhost";
  gethostname(host, sizeof(host) - 1);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "%s:%d:%d [0] NCCL %s %s\n", host, static_cast<int>(getpid()), static_cast<int>(getpid()),
               level == NCCL_LOG_WARN ? "WARN" : "INFO", msg);
}

int ncclSimCommand(int argc, char** argv) {
  model::Topology topo;
  std::string tunerPath;
  int coll = 4, seed = 1;
  uint64_t lo = 64 << 10, hi = 256u << 20;
  harness::Args a("weft tune nccl-sim", argc, argv, 3);
  while (a.next()) {
    if (topoOption(a, topo)) continue;
    const std::string& f = a.flag();
    if (f == "--tuner") tunerPath = a.value();
    else if (f == "--coll") coll = collFromName(a.value());
    else if (f == "--seed") seed = a.number(0, 1 << 30);
    else if (f == "--min") lo = static_cast<uint64_t>(a.number(1, 1 << 30));
    else if (f == "--max") hi = static_cast<uint64_t>(a.number(1, 1 << 30)) * 4;
    else a.unknown();
  }
  if (tunerPath.empty() || coll < 0) {
    std::fprintf(stderr, "usage: weft tune nccl-sim --tuner libnccl-tuner-weft.so [--coll AllReduce] [--seed N] [topology]\n");
    return 2;
  }
  void* lib = dlopen(tunerPath.c_str(), RTLD_NOW | RTLD_LOCAL);
  // As NCCL 2.32 does: the v7 table where the file has one (constants for five compute capabilities), else v5.
  // v5, v6 and v7 share getCollInfo's and finalize's places; only init's constants differ.
  auto* tuner7 = lib ? static_cast<const ncclTuner_v7_t*>(dlsym(lib, "ncclTunerPlugin_v7")) : nullptr;
  auto* tuner = lib ? static_cast<const ncclTuner_v5_t*>(dlsym(lib, "ncclTunerPlugin_v5")) : nullptr;
  if (tuner == nullptr && tuner7 == nullptr) {
    std::fprintf(stderr, "weft tune nccl-sim: %s has neither ncclTunerPlugin_v7 nor _v5\n", tunerPath.c_str());
    return 1;
  }
  void* ctx = nullptr;
  ncclNvlDomainInfo_v5_t nvl{topo.nNodes, topo.ppn(), topo.ppn()};
  // The constants NCCL would pass: the model's (NCCL's defaults unless a profile gave others).
  const model::Constants& mk = topo.constants ? *topo.constants : model::ncclDefaults();
  ncclTunerConstants_v7_t consts7{};
  static_assert(sizeof(consts7) == sizeof(mk.baseLat) + sizeof(mk.hwLat) + 5 * sizeof(mk.llMaxBws),
                "the model's constants have tuner v7's shape");
  std::memcpy(&consts7, &mk, sizeof(consts7));
  ncclTunerConstants_v5_t consts5{};
  std::memcpy(consts5.baseLatencies, mk.baseLat, sizeof(mk.baseLat));
  std::memcpy(consts5.hwLatencies, mk.hwLat, sizeof(mk.hwLat));
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 3; ++s) {
      consts5.llMaxBws[r][s] = mk.llMaxBws[r][s];
      consts5.perChMaxRingLL128Bws[r][s] = mk.perChMaxRingLL128Bws[r][s];
      consts5.perChMaxTreeLL128Bws[r][s] = mk.perChMaxTreeLL128Bws[r][s];
      consts5.perChMaxTreeBws[r][s] = mk.perChMaxTreeBws[r][s];
      consts5.perChMaxNVLSTreeBws[r][s] = mk.perChMaxNvlsTreeBws[r][s];
    }
  ncclTunerGetCollInfoV4_t getCollInfo = tuner7 ? tuner7->getCollInfo : tuner->getCollInfo;
  auto finalize = tuner7 ? tuner7->finalize : tuner->finalize;
  if (tuner7 != nullptr) tuner7->init(&ctx, 0x51111, topo.nRanks, topo.nNodes, simLogger, &nvl, &consts7);
  else tuner->init(&ctx, 0x51111, topo.nRanks, topo.nNodes, simLogger, &nvl, &consts5);
  sim::WorldOptions wo;
  wo.seed = static_cast<uint64_t>(seed);
  sim::World w(topo, wo);
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 31 + static_cast<uint64_t>(getpid()));
  std::printf("# weft tune nccl-sim (simulated NCCL; nccl-tests output format): %s, %d ranks, %d nodes\n",
              collName(coll), topo.nRanks, topo.nNodes);
  std::printf("#\n#                                                              out-of-place                       in-place\n");
  std::printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
  std::printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n");
  for (uint64_t n = lo; n <= hi; n *= 2) {
    model::Table after = model::costTable(topo, coll, n, 1);  // the tuner changes the costs in place
    int nch = 0;
    getCollInfo(ctx, static_cast<ncclFunc_t>(coll), n, 1, reinterpret_cast<float**>(after.flat()), 7, 3, 0,
                       &nch);
    model::Pick pk = model::pick(after);
    Arm arm;
    arm.algo = static_cast<int8_t>(pk.algo);
    arm.proto = static_cast<int8_t>(pk.proto);
    arm.channels = static_cast<int16_t>(nch);
    double us = w.measureUs(coll, arm, n, rng), us2 = w.measureUs(coll, arm, n, rng);
    double alg = n / 1000.0 / us;
    std::printf("%12llu  %12llu     float     sum      -1  %7.2f %7.2f %7.2f      0  %7.2f %7.2f %7.2f      0\n",
                static_cast<unsigned long long>(n), static_cast<unsigned long long>(n / 4), us, alg, alg, us2,
                n / 1000.0 / us2, n / 1000.0 / us2);
  }
  finalize(ctx);
  std::printf("# Out of bounds values : 0 OK\n");
  return 0;
}

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

}  // namespace

int tuneCommand(int argc, char** argv);
int profileCommand(int argc, char** argv);

int profileCommand(int argc, char** argv) {
  std::string sub = argc >= 3 ? argv[2] : "";
  if (sub == "merge") return mergeCommand(argc, argv);
  std::fprintf(stderr, "usage: weft profile merge DIR --out PROFILE [--ranks N --nodes M]\n");
  return 2;
}

int tuneCommand(int argc, char** argv) {
  std::string sub = argc >= 3 ? argv[2] : "";
  if (sub == "sim") return simCommand(argc, argv);
  if (sub == "show") return showCommand(argc, argv);
  if (sub == "sweep") return sweepCommand(argc, argv);
  if (sub == "nccl-sim") return ncclSimCommand(argc, argv);
  if (sub == "eval") return evalCommand(argc, argv);
  if (sub == "check") return checkCommand(argc, argv);
  std::fprintf(stderr, "usage: weft tune sim|show|sweep|nccl-sim|eval|check ... (weft help)\n");
  return 2;
}

}  // namespace weft::tool
