#include "tuner/sim.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace weft::tuner::sim {

World::World(const model::Topology& topo, const WorldOptions& o) : topo_(topo), o_(o) {
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 6.283);
  for (int c = 0; c < 5; ++c)
    for (int a = 0; a < 7; ++a)
      for (int p = 0; p < 3; ++p) {
        err_[c][a][p] = n01(rng) * o.armSigma;
        phase_[c][a][p] = u(rng);
      }
  // Planted mis-modelled points: mid sizes (256 KiB .. 16 MiB), distinct per collective.
  std::uniform_int_distribution<int> mid(18, 24);
  for (int c = 0; c < 5; ++c) {
    std::vector<int> chosen;
    while (static_cast<int>(chosen.size()) < o.plantedPerColl) {
      int l = mid(rng);
      if (std::find(chosen.begin(), chosen.end(), l) == chosen.end()) chosen.push_back(l);
    }
    for (int l : chosen) planted_.push_back({c, l});
  }
}

bool World::planted(int coll, uint64_t nBytes) const {
  double l = std::log2(static_cast<double>(nBytes));
  for (auto [c, pl] : planted_)
    if (c == coll && std::fabs(l - pl) <= 0.25) return true;
  return false;
}

Arm World::ncclDefault(int coll, uint64_t nBytes) const {
  model::Pick p = model::pick(table(coll, nBytes));
  Arm a;
  a.algo = static_cast<int8_t>(p.algo);
  a.proto = static_cast<int8_t>(p.proto);
  return a;
}

std::vector<Arm> World::candidates(int coll, uint64_t nBytes) const {
  model::Table t = table(coll, nBytes);
  std::vector<Arm> out;
  for (int a = 0; a < 7; ++a)
    for (int p = 0; p < 3; ++p) {
      if (!(t.t[a][p] >= 0)) continue;
      for (int ch : {0, 4, 8}) {
        if (ch >= topo_.nChannels) continue;
        Arm arm;
        arm.algo = static_cast<int8_t>(a);
        arm.proto = static_cast<int8_t>(p);
        arm.channels = static_cast<int16_t>(ch);
        out.push_back(arm);
      }
    }
  return out;
}

double World::trueUs(int coll, const Arm& arm, uint64_t nBytes) const {
  model::Table t = table(coll, nBytes);
  double modelUs = t.t[arm.algo][arm.proto];
  if (!(modelUs >= 0)) return 1e30;
  double lat = std::max(0.0, model::latencyUs(topo_, coll, arm.algo, arm.proto));
  lat = std::min(lat, modelUs);
  double bwPart = modelUs - lat;
  int ncDefault = std::max(1, t.channels[arm.algo][arm.proto]);
  int nc = arm.channels > 0 ? std::min<int>(arm.channels, topo_.nChannels) : ncDefault;
  double sat = o_.saturationChannels;
  double us = lat + o_.perChannelUs * nc + bwPart * std::min<double>(ncDefault, sat) / std::min<double>(nc, sat);
  double l = std::log2(static_cast<double>(nBytes));
  double e = err_[coll][arm.algo][arm.proto] * (0.6 + 0.4 * std::sin(l / 3.0 + phase_[coll][arm.algo][arm.proto]));
  us *= std::exp(e);
  Arm def = ncclDefault(coll, nBytes);
  if (planted(coll, nBytes) && arm.algo == def.algo && arm.proto == def.proto) us *= o_.plantedFactor;
  return us;
}

double World::measureUs(int coll, const Arm& arm, uint64_t nBytes, std::mt19937_64& rng) const {
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double us = trueUs(coll, arm, nBytes) * std::exp(n01(rng) * o_.noiseSigma);
  if (u(rng) < o_.outlierRate) us *= 1.5 + 1.5 * u(rng);
  return us;
}

Profile sweep(const World& w, const std::vector<int>& colls, const std::vector<uint64_t>& sizes, int samples,
              uint64_t seed) {
  std::mt19937_64 rng(seed);
  Profile p;
  p.sig.nRanks = w.topo().nRanks;
  p.sig.nNodes = w.topo().nNodes;
  p.source["tool"] = "weft tune sim (simulated sweep)";
  for (int c : colls) {
    uint32_t mask = 0;
    model::Table t = w.table(c, sizes.empty() ? 1 : sizes.front());
    for (int a = 0; a < 7; ++a)
      for (int pr = 0; pr < 3; ++pr)
        if (t.t[a][pr] >= 0) mask |= 1u << (a * 3 + pr);
    p.sig.masks[c] = mask;
    for (uint64_t n : sizes) {
      for (const Arm& arm : w.candidates(c, n)) {
        std::vector<double> v;
        for (int i = 0; i < samples; ++i) v.push_back(w.measureUs(c, arm, n, rng));
        p.measurements.push_back(summarize(c, n, arm, std::move(v)));
      }
    }
  }
  return p;
}

Score evaluate(const World& w, const Policy& pol, const std::vector<int>& colls, const std::vector<uint64_t>& sizes) {
  Score s;
  double logSum = 0, logPlanted = 0, logRegret = 0;
  int nPlanted = 0;
  s.minSpeedup = 1e30;
  for (int c : colls)
    for (uint64_t n : sizes) {
      Point pt{};
      pt.coll = c;
      pt.bytes = n;
      pt.planted = w.planted(c, n);
      pt.ncclArm = w.ncclDefault(c, n);
      model::Table after = w.table(c, n);  // the tuner changes the costs in place
      Decision d = pol.decide(c, n, 1, after.flat(), 7, 3, 1000000 /* past any exploration */);
      model::Pick chosen = model::pick(after);  // what NCCL does with the table the tuner returned
      pt.tunedArm.algo = static_cast<int8_t>(chosen.algo);
      pt.tunedArm.proto = static_cast<int8_t>(chosen.proto);
      pt.tunedArm.channels = static_cast<int16_t>(d.channels);
      pt.outcome = d.outcome;
      pt.ncclUs = w.trueUs(c, pt.ncclArm, n);
      pt.tunedUs = w.trueUs(c, pt.tunedArm, n);
      pt.oracleUs = 1e30;
      for (const Arm& arm : w.candidates(c, n)) {
        double x = w.trueUs(c, arm, n);
        if (x < pt.oracleUs) pt.oracleUs = x, pt.oracleArm = arm;
      }
      double sp = pt.ncclUs / pt.tunedUs;
      double reg = pt.tunedUs / pt.oracleUs - 1.0;
      logSum += std::log(sp);
      logRegret += std::log(pt.tunedUs / pt.oracleUs);
      s.minSpeedup = std::min(s.minSpeedup, sp);
      s.maxRegret = std::max(s.maxRegret, reg);
      if (pt.planted) logPlanted += std::log(sp), ++nPlanted;
      if (!(pt.tunedArm == pt.ncclArm)) ++s.changed;
      s.points.push_back(pt);
    }
  size_t n = s.points.size();
  if (n > 0) {
    s.geoSpeedup = std::exp(logSum / n);
    s.geoRegret = std::exp(logRegret / n) - 1.0;
  }
  if (nPlanted > 0) s.plantedGeoSpeedup = std::exp(logPlanted / nPlanted);
  return s;
}

}  // namespace weft::tuner::sim
