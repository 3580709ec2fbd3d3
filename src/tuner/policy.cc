// SPDX-License-Identifier: Apache-2.0
#include "tuner/policy.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

namespace weft::tuner {

int sizeBucket(uint64_t n) noexcept {
  if (n <= 1) return 0;
  int msb = 63 - __builtin_clzll(n);
  int frac = msb >= 2 ? static_cast<int>((n >> (msb - 2)) & 3) : static_cast<int>((n << (2 - msb)) & 3);
  // Each octave is cut into four equal (linear) quarters: the two bits after the leading one. Integer-only, so
  // every rank computes the same bucket.
  int b = 4 * msb + frac;
  return b < kBuckets ? b : kBuckets - 1;
}

double bucketLowLog2(int b) noexcept { return (b / 4) + std::log2(1.0 + (b % 4) / 4.0); }

const char* outcomeName(Outcome o) noexcept {
  switch (o) {
    case Outcome::kNoValidEntry: return "no-valid-entry";
    case Outcome::kRule: return "rule";
    case Outcome::kForced: return "forced";
    case Outcome::kExplored: return "explored";
    case Outcome::kMeasured: return "measured";
    case Outcome::kKeptNccl: return "kept-nccl";
    case Outcome::kNotMeasured: return "not-measured";
    case Outcome::kSignatureMismatch: return "signature-mismatch";
    case Outcome::kForcedUnavailable: return "forced-unavailable";
  }
  return "?";
}

bool signatureMatches(const Signature& s, int nRanks, int nNodes, int nvlDomains, std::string* why) {
  if (s.nRanks != nRanks || s.nNodes != nNodes) {
    if (why) *why = fmt::format("profile is for {} ranks on {} nodes, this communicator has {} on {}", s.nRanks,
                                s.nNodes, nRanks, nNodes);
    return false;
  }
  if (s.nvlDomains >= 0 && nvlDomains >= 0 && s.nvlDomains != nvlDomains) {
    if (why) *why = fmt::format("profile is for {} NVLink domains, this communicator has {}", s.nvlDomains, nvlDomains);
    return false;
  }
  return true;
}

std::shared_ptr<const Policy> Policy::build(const Profile& p, const PolicyOptions& o) {
  auto pol = std::make_shared<Policy>();
  pol->opt_ = o;
  pol->rules_ = p.rules;
  for (int c = 0; c < kNumColls; ++c) pol->masks_[c] = p.sig.masks[c];
  // Per (coll, arm): points (log2 bytes, log time, relative standard error, size bucket), merged when a size
  // repeats.
  struct Pt {
    double x, y, se;
    int bucket;
    uint64_t bytes;
  };
  std::map<std::pair<int, Arm>, std::map<uint64_t, Pt>> series;
  for (const auto& m : p.measurements) {
    // Standard error of the median from the robust spread, with a floor: a few samples can show no spread at all
    // (measured: with 3-5 samples and 5% outliers, decisions without the floor lost up to 13% at some points).
    double se = std::max(1.4826 * m.spread, o.minSampleNoise) / std::sqrt(std::max<double>(1.0, m.samples));
    auto& s = series[{m.coll, m.arm}];
    auto it = s.find(m.bytes);
    Pt pt{std::log2(static_cast<double>(m.bytes)), std::log(m.timeUs), se, sizeBucket(m.bytes), m.bytes};
    if (it == s.end() || pt.y < it->second.y) s[m.bytes] = pt;  // the faster of repeated entries
  }
  // NCCL's model at the measured sizes, where the profile recorded it (ModelPoint).
  std::map<std::tuple<int, uint64_t, int, int>, double> model;
  for (const auto& m : p.model) model[{m.coll, m.bytes, m.algo, m.proto}] = std::log(m.us);
  std::vector<std::vector<Entry>> cells(kNumColls * kBuckets);
  for (const auto& [key, pts] : series) {
    auto [coll, arm] = key;
    std::vector<Pt> v;
    for (const auto& [b, pt] : pts) v.push_back(pt);
    // Where this arm is NCCL's pick, a narrow slowdown seen at one measured size only counts there only; between
    // measured sizes the chord of its neighbours stands in for it. A point is such a slowdown when it lies above
    // that chord by more than the spike threshold and 3 standard errors: times are convex in log-log size (latency
    // plus bytes over bandwidth), and residuals from NCCL's model flat, so a point above the chord is an anomaly.
    // Held-out evaluation (docs/tuning.md): a slowdown of NCCL's pick at one measured size otherwise made the
    // tuner leave NCCL's pick an octave either side, where it was fine. Neighbouring spikes lift each other's
    // chords: the chords are taken over the neighbours' corrected values, a few rounds (each halves what is left).
    auto despike = [&](const std::vector<double>& y) {
      std::vector<double> yd = y;
      for (int round = 0; o.spike > 0 && round < 6; ++round) {
        std::vector<double> next = yd;
        for (size_t k = 1; k + 1 < v.size(); ++k) {
          const Pt &a = v[k - 1], &c = v[k + 1];
          double t = (v[k].x - a.x) / (c.x - a.x);
          double chord = yd[k - 1] + t * (yd[k + 1] - yd[k - 1]);
          double se = std::sqrt(v[k].se * v[k].se + std::pow((1 - t) * a.se, 2) + std::pow(t * c.se, 2));
          next[k] = y[k] - chord > std::max(o.spike, 3 * se) ? chord : y[k];
        }
        yd.swap(next);
      }
      return yd;
    };
    std::vector<double> y(v.size()), r(v.size());
    bool haveModel = o.model;
    for (size_t k = 0; k < v.size(); ++k) {
      y[k] = v[k].y;
      auto it = model.find({coll, v[k].bytes, arm.algo, arm.proto});
      if (it == model.end()) haveModel = false;
      else r[k] = v[k].y - it->second;
    }
    const std::vector<double> yd = despike(y);
    const std::vector<double> rd = haveModel ? despike(r) : r;
    int lo = sizeBucket(pts.begin()->first) - o.maxExtrapolation;
    int hi = sizeBucket(pts.rbegin()->first) + o.maxExtrapolation;
    for (int b = std::max(0, lo); b <= std::min(kBuckets - 1, hi); ++b) {
      // Evaluated at the bucket's lower edge, where the sizes people measure (powers of two) sit: a measured size
      // gets exactly its measurement; the rest of the bucket (up to +25%) shares it.
      double x = bucketLowLog2(b);
      size_t i = 0, li = 0, hiI = 0;  // segment [i-1, i]; the measurements at or below and at or above x
      double t = 0;
      if (v.size() > 1) {
        i = 1;
        while (i + 1 < v.size() && v[i].x < x) ++i;  // the end segments extrapolate
        const Pt &a = v[i - 1], &c = v[i];
        t = (x - a.x) / (c.x - a.x);
        const double eps = 1e-9;
        li = x <= a.x + eps ? i - 1 : (x >= c.x - eps ? i : i - 1);
        hiI = x <= a.x + eps ? i - 1 : i;
      }
      auto at = [&](const std::vector<double>& s) { return v.size() == 1 ? s[0] : s[i - 1] + t * (s[i] - s[i - 1]); };
      const Pt *l = &v[li], *h = &v[hiI];
      if (std::min(std::abs(b - l->bucket), std::abs(b - h->bucket)) > o.reach) continue;
      Entry e{};
      e.arm = arm;
      e.timeUs = static_cast<float>(std::exp(at(y)));
      e.relErr = static_cast<float>(v.size() == 1 ? v[0].se : std::max(v[i - 1].se, v[i].se));
      e.loUs = static_cast<float>(std::exp(y[li]));
      e.hiUs = static_cast<float>(std::exp(y[hiI]));
      e.loBucket = static_cast<int16_t>(l->bucket);
      e.hiBucket = static_cast<int16_t>(h->bucket);
      e.asNcclUs = static_cast<float>(std::exp(std::min(at(y), at(yd))));
      e.loAsNcclUs = static_cast<float>(std::exp(std::min(y[li], yd[li])));
      e.hiAsNcclUs = static_cast<float>(std::exp(std::min(y[hiI], yd[hiI])));
      if (l == h && l->bucket == b) e.atBytes = l->bytes;
      if (haveModel) {
        // Beyond the measured sizes the ratio extrapolates along its end segment, as times do (held flat, it lost
        // more held-out points: 6 against 3 in the smooth world).
        e.overModel = static_cast<float>(std::exp(at(r)));
        e.overModelAsNccl = static_cast<float>(std::exp(std::min(at(r), at(rd))));
      }
      cells[coll * kBuckets + b].push_back(e);
    }
  }
  pol->start_.assign(kNumColls * kBuckets + 1, 0);
  for (size_t i = 0; i < cells.size(); ++i) {
    auto& c = cells[i];
    std::stable_sort(c.begin(), c.end(), [](const Entry& a, const Entry& b) {
      return a.timeUs < b.timeUs || (a.timeUs == b.timeUs && a.arm < b.arm);
    });
    pol->start_[i] = static_cast<uint32_t>(pol->entries_.size());
    pol->entries_.insert(pol->entries_.end(), c.begin(), c.end());
  }
  pol->start_[cells.size()] = static_cast<uint32_t>(pol->entries_.size());
  return pol;
}

std::pair<const Policy::Entry*, const Policy::Entry*> Policy::cell(int coll, int bucket) const noexcept {
  if (coll < 0 || coll >= kNumColls || bucket < 0 || bucket >= kBuckets || start_.empty()) return {nullptr, nullptr};
  size_t i = static_cast<size_t>(coll) * kBuckets + static_cast<size_t>(bucket);
  return {entries_.data() + start_[i], entries_.data() + start_[i + 1]};
}

namespace {

// Makes entry `pick` the one NCCL selects: strictly below every other valid entry, keeping its meaning as a
// time estimate (the smallest change that wins), and never touching an IGNORE entry.
void prefer(float* table, int numAlgo, int numProto, int pickA, int pickP, int ncclA, int ncclP) {
  float& target = table[pickA * numProto + pickP];
  float best = table[ncclA * numProto + ncclP];
  if (pickA == ncclA && pickP == ncclP) return;
  if (best > 0.0f) {
    target = std::nextafter(best, 0.0f);
    return;
  }
  // NCCL's best is already 0: give the pick 0 and lift the zero entries that come before it in NCCL's scan order
  // to the smallest positive value, so the scan's first minimum is the pick.
  target = 0.0f;
  for (int a = 0; a < numAlgo; ++a)
    for (int p = 0; p < numProto; ++p) {
      if (a * numProto + p >= pickA * numProto + pickP) return;
      float& e = table[a * numProto + p];
      if (e == 0.0f) e = std::numeric_limits<float>::denorm_min();
    }
}

}  // namespace

Decision Policy::decide(int coll, uint64_t nBytes, int numPipeOps, float* table, int numAlgo, int numProto,
                        uint32_t callIndex) const noexcept {
  Decision d;
  if (table == nullptr || numAlgo <= 0 || numProto <= 0 || numAlgo > kNumAlgos || numProto > kNumProtos) {
    d.outcome = Outcome::kNoValidEntry;
    return d;
  }
  // NCCL's own pick: the first minimum over entries >= 0, algorithms then protocols.
  int na = -1, np = -1;
  float best = 0;
  uint32_t mask = 0;
  for (int a = 0; a < numAlgo; ++a)
    for (int p = 0; p < numProto; ++p) {
      float v = table[a * numProto + p];
      if (!(v >= 0.0f)) continue;  // IGNORE (and NaN)
      mask |= 1u << (a * 3 + p);
      if (na < 0 || v < best) na = a, np = p, best = v;
    }
  if (na < 0) {
    d.outcome = Outcome::kNoValidEntry;
    return d;
  }
  d.algo = na;
  d.proto = np;
  auto valid = [&](int a, int p) { return a >= 0 && a < numAlgo && p >= 0 && p < numProto && table[a * numProto + p] >= 0.0f; };
  auto apply = [&](const Arm& arm, Outcome why) {
    prefer(table, numAlgo, numProto, arm.algo, arm.proto, na, np);
    d.algo = arm.algo;
    d.proto = arm.proto;
    d.channels = arm.channels;
    d.chunk = arm.chunk;
    d.outcome = why;
    return d;
  };
  if (coll < 0 || coll >= kNumColls) {
    d.outcome = Outcome::kNotMeasured;
    return d;
  }
  if (opt_.force) {
    if (!valid(opt_.forced.algo, opt_.forced.proto)) {
      d.outcome = Outcome::kForcedUnavailable;
      return d;
    }
    return apply(opt_.forced, Outcome::kForced);
  }
  for (const Rule& r : rules_) {
    if (r.coll != coll || nBytes < r.minBytes || nBytes > r.maxBytes) continue;
    if (r.numPipeOps >= 0 && r.numPipeOps != numPipeOps) continue;
    if (!valid(r.arm.algo, r.arm.proto)) continue;  // as NCCL's example: a rule for an unavailable entry is skipped
    return apply(r.arm, Outcome::kRule);
  }
  if (masks_[coll] != 0 && masks_[coll] != mask) {
    d.outcome = Outcome::kSignatureMismatch;
    return d;
  }
  int bucket = sizeBucket(nBytes);
  // The budget can never exceed every entry x repeats x rounds: past that, skip the candidate scan entirely.
  if (opt_.explore && static_cast<uint64_t>(callIndex) <
                          static_cast<uint64_t>(numAlgo) * numProto * opt_.exploreRepeats * opt_.exploreRounds) {
    // Candidates: NCCL's valid entries within explorePrune x of its best, in index order (the same on every rank).
    int cand[kNumAlgos * kNumProtos];
    int n = 0;
    for (int a = 0; a < numAlgo; ++a)
      for (int p = 0; p < numProto; ++p) {
        float v = table[a * numProto + p];
        if (v >= 0.0f && v <= best * opt_.explorePrune + 1e-6f) cand[n++] = a * numProto + p;
      }
    uint64_t budget = static_cast<uint64_t>(n) * opt_.exploreRepeats * opt_.exploreRounds;
    if (n > 1 && callIndex < budget) {
      int k = cand[(callIndex / opt_.exploreRepeats) % n];
      Arm arm;
      arm.algo = static_cast<int8_t>(k / numProto);
      arm.proto = static_cast<int8_t>(k % numProto);
      return apply(arm, Outcome::kExplored);
    }
  }
  auto [first, last] = cell(coll, bucket);
  const Entry* ncclEntry = nullptr;
  const Entry* winner = nullptr;
  for (const Entry* e = first; e != last; ++e) {
    if (!valid(e->arm.algo, e->arm.proto)) continue;
    if (winner == nullptr) winner = e;
    if (e->arm.algo == na && e->arm.proto == np && e->arm.channels == 0 && e->arm.chunk == 0) {
      ncclEntry = e;
      break;
    }
  }
  if (winner == nullptr || ncclEntry == nullptr) {
    d.outcome = Outcome::kNotMeasured;
    return d;
  }
  // The fastest candidate that beats NCCL's pick with confidence: by the margin and by z standard errors of the
  // difference, and, between measured sizes where the interpolation is a guess, also at the measured sizes on both
  // sides (held-out evaluation, docs/tuning.md: interpolation alone lost at 8% of the unmeasured sizes of the
  // smooth world, this rule at 2%). A candidate measured at other sizes than NCCL's pick cannot show that.
  // At exactly a measured size the measurements decide. Elsewhere, where the profile has NCCL's model at the
  // measured sizes, a candidate's time is NCCL's table entry for it here times its interpolated measured/model
  // ratio; without the model, its interpolated time. As NCCL's pick, narrow spikes do not count (Entry).
  const bool exact = ncclEntry->atBytes == nBytes;
  auto tableUs = [&](const Entry* e) { return table[e->arm.algo * numProto + e->arm.proto]; };
  const bool useModel = !exact && ncclEntry->overModel > 0.0f && tableUs(ncclEntry) > 0.0f;
  const double tn = exact ? ncclEntry->timeUs
                    : useModel ? static_cast<double>(tableUs(ncclEntry)) * ncclEntry->overModelAsNccl
                               : ncclEntry->asNcclUs;
  // Beyond the measured sizes (one measured neighbour) the model's shape is not checked by any measurement.
  const bool outside = ncclEntry->loBucket == ncclEntry->hiBucket;
  // ... and there the margin grows by itself again per octave beyond them.
  const double margin =
      opt_.margin * (1.0 + (outside && !exact ? std::abs(bucket - ncclEntry->loBucket) / 4.0 : 0.0));
  const Entry* pick = nullptr;
  double pickUs = 0;
  const double limit = (1.0 - margin) * tn, en = ncclEntry->relErr * tn;
  const bool bracket = opt_.bracket && (!useModel || outside);
  for (const Entry* e = first; e != last; ++e) {
    if (e == ncclEntry || !valid(e->arm.algo, e->arm.proto)) continue;  // (IGNORE entries included)
    const float tv = tableUs(e);
    double tw;
    if (useModel) {
      if (!(tv > 0.0f) || !(e->overModel > 0.0f)) continue;  // not comparable with NCCL's pick here
      tw = static_cast<double>(tv) * e->overModel;
    } else {
      tw = e->timeUs;
      if (tw > limit) break;  // sorted by interpolated time: the rest are slower still
    }
    if (tw > limit || (pick != nullptr && tw >= pickUs)) continue;
    const double ew = e->relErr * tw;
    if (tn - tw < opt_.z * std::sqrt(ew * ew + en * en)) continue;
    if (bracket && (e->loBucket != ncclEntry->loBucket || e->hiBucket != ncclEntry->hiBucket ||
                    e->loUs > (1.0 - opt_.margin) * (exact ? ncclEntry->loUs : ncclEntry->loAsNcclUs) ||
                    e->hiUs > (1.0 - opt_.margin) * (exact ? ncclEntry->hiUs : ncclEntry->hiAsNcclUs))) {
      continue;
    }
    pick = e;
    pickUs = tw;
  }
  if (pick != nullptr) return apply(pick->arm, Outcome::kMeasured);
  d.outcome = Outcome::kKeptNccl;
  return d;
}

uint32_t Policy::chunkFor(int coll, uint64_t nBytes, int algo, int proto, int channels) const noexcept {
  auto [first, last] = cell(coll, sizeBucket(nBytes));
  for (const Entry* e = first; e != last; ++e) {
    if (e->arm.algo == algo && e->arm.proto == proto && (e->arm.channels == 0 || e->arm.channels == channels))
      return e->arm.chunk;  // the fastest measured for this algorithm/protocol
  }
  return 0;
}

}  // namespace weft::tuner
