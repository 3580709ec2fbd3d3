// SPDX-License-Identifier: Apache-2.0
#include "tuner/sim.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace weft::tuner::sim {

const char* structureName(Structure s) noexcept {
  switch (s) {
    case Structure::kSmooth: return "smooth";
    case Structure::kSignFlip: return "sign-flip";
    case Structure::kDrift: return "drift";
    case Structure::kHeavyTail: return "heavy-tail";
    case Structure::kOffPick: return "off-pick";
  }
  return "?";
}

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
  if (o.structure == Structure::kOffPick) {
    // Two unmeasured sizes per collective (odd octaves and quarter points between 128 KiB and 128 MiB).
    std::uniform_int_distribution<int> q(4 * 17, 4 * 27);
    for (int c = 0; c < 5; ++c) {
      for (int k = 0; k < 2;) {
        int x = q(rng);
        if (x % 8 == 0) continue;  // a measured size (even octave)
        offPick_.push_back({c, x / 4.0});
        ++k;
      }
    }
  }
}

World World::drifted(uint64_t seed) const {
  World w = *this;
  if (o_.structure != Structure::kDrift) return w;
  std::mt19937_64 rng(seed ^ 0xd1f7u);
  std::normal_distribution<double> n01(0.0, 1.0);
  for (auto& c : w.err_)
    for (auto& a : c)
      for (double& e : a) e += n01(rng) * o_.driftSigma;
  return w;
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
  double us = unplantedUs(coll, arm, nBytes);
  Arm def = ncclDefault(coll, nBytes);
  if (planted(coll, nBytes) && arm.algo == def.algo && arm.proto == def.proto) us *= o_.plantedFactor;
  if (!offPick_.empty()) {
    const double l = std::log2(static_cast<double>(nBytes));
    for (auto [c, pl] : offPick_) {
      if (c != coll || std::fabs(l - pl) > 0.01) continue;
      Arm best;
      double bestUs = 1e30;
      for (const Arm& cand : candidates(coll, nBytes)) {
        double x = unplantedUs(coll, cand, nBytes);
        if (x < bestUs) bestUs = x, best = cand;
      }
      if (arm.algo == best.algo && arm.proto == best.proto) us *= o_.plantedFactor;
    }
  }
  return us;
}

double World::unplantedUs(int coll, const Arm& arm, uint64_t nBytes) const {
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
  const double amp = err_[coll][arm.algo][arm.proto], ph = phase_[coll][arm.algo][arm.proto];
  double e = o_.structure == Structure::kSignFlip ? std::fabs(amp) * std::sin(3.14159265358979 * l + ph)
                                                  : amp * (0.6 + 0.4 * std::sin(l / 3.0 + ph));
  us *= std::exp(e);
  return us;
}

double World::measureUs(int coll, const Arm& arm, uint64_t nBytes, std::mt19937_64& rng) const {
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  if (o_.structure == Structure::kHeavyTail) {
    std::student_t_distribution<double> t3(3.0);
    double us = trueUs(coll, arm, nBytes) * std::exp(t3(rng) * o_.noiseSigma);
    if (u(rng) < 0.15) us *= 1.0 + 9.0 * u(rng) * u(rng);
    return us;
  }
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
      // What the tuner's record mode keeps: NCCL's table at each measured size.
      model::Table tn = w.table(c, n);
      for (int a = 0; a < 7; ++a)
        for (int pr = 0; pr < 3; ++pr)
          if (tn.t[a][pr] > 0) {
            ModelPoint mp;
            mp.coll = c;
            mp.bytes = n;
            mp.algo = static_cast<int8_t>(a);
            mp.proto = static_cast<int8_t>(pr);
            mp.us = tn.t[a][pr];
            p.model.push_back(mp);
          }
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

std::vector<uint64_t> heldOutSweepSizes() {
  std::vector<uint64_t> v;
  for (uint64_t n = 64 << 10; n <= (256ull << 20); n *= 4) v.push_back(n);
  return v;
}

std::vector<uint64_t> heldOutScoreSizes() {
  const std::vector<uint64_t> measured = heldOutSweepSizes();
  std::vector<uint64_t> v;
  for (int q = 4 * 15; q <= 4 * 29; ++q) {  // 32 KiB .. 512 MiB in quarter octaves
    uint64_t n = static_cast<uint64_t>(std::llround(std::exp2(q / 4.0)));
    n &= ~uint64_t{3};  // whole 4-byte elements
    if (std::find(measured.begin(), measured.end(), n) == measured.end()) v.push_back(n);
  }
  return v;
}

HeldOut heldOut(const model::Topology& topo, WorldOptions wo, const std::vector<uint64_t>& seeds, int reps,
                int samples, const PolicyOptions& po, const std::vector<int>& colls) {
  HeldOut h;
  double logSum = 0, logReg = 0;
  h.minSpeedup = 1e30;
  const std::vector<uint64_t> sweepSizes = heldOutSweepSizes(), scoreSizes = heldOutScoreSizes();
  for (uint64_t seed : seeds) {
    wo.seed = seed;
    World w(topo, wo);
    World use = w.drifted(seed);
    for (int r = 0; r < reps; ++r) {
      auto pol = Policy::build(sweep(w, colls, sweepSizes, samples, seed * 7919 + 1 + 104729 * (r + 1)), po);
      Score s = evaluate(use, *pol, colls, scoreSizes);
      for (const Point& pt : s.points) {
        double sp = pt.ncclUs / pt.tunedUs;
        h.speedups.push_back(sp);
        logSum += std::log(sp);
        logReg += std::log(pt.tunedUs / pt.oracleUs);
        h.minSpeedup = std::min(h.minSpeedup, sp);
        if (sp < 0.99) ++h.below99;
        h.worst.push_back(pt);
      }
      std::sort(h.worst.begin(), h.worst.end(), [](const Point& a, const Point& b) {
        return a.ncclUs / a.tunedUs < b.ncclUs / b.tunedUs;
      });
      if (h.worst.size() > 10) h.worst.resize(10);
      h.changed += s.changed;
    }
  }
  if (!h.speedups.empty()) {
    h.geoSpeedup = std::exp(logSum / static_cast<double>(h.speedups.size()));
    h.geoRegret = std::exp(logReg / static_cast<double>(h.speedups.size())) - 1.0;
  }
  return h;
}

}  // namespace weft::tuner::sim
