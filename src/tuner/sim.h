// SPDX-License-Identifier: Apache-2.0
// A simulated "true" performance world for evaluating the tuner without GPUs: NCCL's own model (nccl_model.h)
// with what NCCL's model gets wrong on real machines (tuning-research §5) planted in it: a per-candidate error that
// drifts with size, points where NCCL's own pick is much slower than modelled, channel saturation with a
// per-channel cost, and measurement noise with occasional outliers. Sweeps of this world make profiles; the
// tuner's decisions are then scored against NCCL's default and against the oracle (the truly fastest candidate).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tuner/nccl_model.h"
#include "tuner/policy.h"
#include "tuner/profile.h"

namespace weft::tuner::sim {

// How the world's error is shaped. kSmooth is the world the tuner was designed against; the others have a
// structure its assumptions (smooth error between measured sizes, a world that stays as measured, light noise,
// mis-modelling only at NCCL's own pick) do not share.
enum class Structure : uint8_t {
  kSmooth,     // per-candidate error drifting slowly with size (period ~19 octaves)
  kSignFlip,   // the error changes sign every octave: measured sizes every other octave all see one sign
  kDrift,      // the world changes between sweep and use (World::drifted)
  kHeavyTail,  // heavy-tailed noise: 15% outliers up to 10x, Student-t (3 degrees of freedom) log noise
  kOffPick,    // 1.7x slowdowns at unmeasured sizes on the candidate that is truly fastest there (not NCCL's pick)
};
const char* structureName(Structure s) noexcept;

struct WorldOptions {
  uint64_t seed = 1;
  double armSigma = 0.30;      // per-candidate model error (log-normal), drifting with size
  double noiseSigma = 0.04;    // per-sample measurement noise (log-normal)
  double outlierRate = 0.05;   // samples 1.5-3x slower (a straggling rank, a hiccup)
  int plantedPerColl = 2;      // sizes where NCCL's own pick is badly mis-modelled
  double plantedFactor = 1.7;
  int saturationChannels = 12; // more channels than this add no bandwidth
  double perChannelUs = 0.15;  // ... but each costs this much time
  Structure structure = Structure::kSmooth;
  double driftSigma = 0.15;    // kDrift: per-candidate error added between sweep and use (log-normal)
};

class World {
 public:
  World(const model::Topology& topo, const WorldOptions& o);
  const model::Topology& topo() const { return topo_; }
  // NCCL's table and its default choice for (coll, nBytes).
  model::Table table(int coll, uint64_t nBytes) const { return model::costTable(topo_, coll, nBytes, 1); }
  Arm ncclDefault(int coll, uint64_t nBytes) const;
  // Every candidate a sweep tries: NCCL's valid (algo, proto) pairs x channel caps {0, 4, 8}.
  std::vector<Arm> candidates(int coll, uint64_t nBytes) const;
  double trueUs(int coll, const Arm& arm, uint64_t nBytes) const;  // deterministic
  double measureUs(int coll, const Arm& arm, uint64_t nBytes, std::mt19937_64& rng) const;
  bool planted(int coll, uint64_t nBytes) const;
  // kDrift: the same world some time later (each candidate's error moved by driftSigma); others: a copy.
  World drifted(uint64_t seed) const;

 private:
  double unplantedUs(int coll, const Arm& arm, uint64_t nBytes) const;
  model::Topology topo_;
  WorldOptions o_;
  double err_[5][7][3], phase_[5][7][3];
  std::vector<std::pair<int, int>> planted_;  // (coll, log2 bytes)
  std::vector<std::pair<int, double>> offPick_;  // kOffPick: (coll, log2 bytes) slowed on their fastest candidate
};

// A sweep: every candidate at every size, `samples` measurements each; median and MAD into a profile.
Profile sweep(const World& w, const std::vector<int>& colls, const std::vector<uint64_t>& sizes, int samples,
              uint64_t seed);

struct Point {
  int coll;
  uint64_t bytes;
  bool planted;
  Arm ncclArm, tunedArm, oracleArm;
  double ncclUs, tunedUs, oracleUs;
  Outcome outcome;
};
struct Score {
  std::vector<Point> points;
  double geoSpeedup = 1, minSpeedup = 1, plantedGeoSpeedup = 1, geoRegret = 0, maxRegret = 0;
  int changed = 0;
};
// Scores a policy at the given sizes (decisions through Policy::decide on NCCL's table, as the plugin makes them).
Score evaluate(const World& w, const Policy& p, const std::vector<int>& colls, const std::vector<uint64_t>& sizes);

// Held-out evaluation: the sweep measures every other octave (64 KiB, 256 KiB, ... 256 MiB); the score is taken
// at the sizes it did not measure, between them and up to an octave beyond (quarter octaves from 32 KiB to
// 512 MiB), in the world as it is at use (World::drifted), after a sweep with its own noise seed; `reps` sweeps
// with different noise seeds per world seed.
std::vector<uint64_t> heldOutSweepSizes();
std::vector<uint64_t> heldOutScoreSizes();
struct HeldOut {
  std::vector<double> speedups;  // every scored point of every seed and repetition
  double geoSpeedup = 1, minSpeedup = 1, geoRegret = 0;
  int below99 = 0;  // points below 0.99x
  int changed = 0;
  std::vector<Point> worst;  // the 10 lowest speedups
};
HeldOut heldOut(const model::Topology& topo, WorldOptions wo, const std::vector<uint64_t>& seeds, int reps,
                int samples, const PolicyOptions& po, const std::vector<int>& colls);

}  // namespace weft::tuner::sim
