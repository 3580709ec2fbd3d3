// SPDX-License-Identifier: Apache-2.0
// The tuner's decisions: a table precomputed from a profile (per collective and quarter-octave size bucket, the
// measured candidates sorted by interpolated time), and a decision function that is a pure function of what
// every rank has in common: collective, nBytes, numPipeOps, NCCL's cost table, the per-key call counter and the
// profile. No allocation, no lock, no I/O, no clock, no randomness, no regBuff.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tuner/profile.h"

namespace weft::tuner {

constexpr int kBuckets = 4 * 48;  // four buckets per octave, from 1 B to 2^48 B
int sizeBucket(uint64_t nBytes) noexcept;  // 4 * floor(log2 n) + the two bits after the leading one
double bucketLowLog2(int bucket) noexcept;  // log2 of the smallest size in the bucket

struct PolicyOptions {
  double margin = 0.03;     // a measured winner must be at least this much faster than NCCL's own pick
  double z = 2.0;           // ... and by this many standard errors of the difference
  int maxExtrapolation = 2; // buckets (quarter octaves) beyond the measured sizes: half an octave (held-out: one
                            // octave lost up to 4% at 32 KiB)
  int reach = 1000;         // buckets from the nearest measured size a decision may be (experiment: held-out)
  double minSampleNoise = 0.05;  // assumed relative noise of one sample, at least (spread floor)
  // Between measured sizes, change NCCL's pick only where the winner also beat it by the margin at the measured
  // sizes on both sides (off: the interpolated times alone decide; for comparisons).
  bool bracket = true;
  // A measured time of NCCL's pick more than this far (log, and 3 standard errors) above the chord of its
  // neighbours is a narrow anomaly: it counts at its own size bucket, not between measured sizes (0: off).
  double spike = 0.15;
  // Interpolate measured/model ratios where the profile has NCCL's model at the measured sizes (off: times; for
  // comparisons).
  bool model = true;
  // Exploration (WEFT_TUNER_EXPLORE): per key, the first `exploreRounds * |candidates| * exploreRepeats` calls
  // go round-robin over NCCL's valid entries within `explorePrune` x of its best model time.
  bool explore = false;
  int exploreRepeats = 5;
  int exploreRounds = 1;
  double explorePrune = 3.0;
  // Sweep mode (WEFT_TUNER_FORCE): this (algo, proto[, channels]) wherever NCCL's table allows it.
  bool force = false;
  Arm forced;
};

enum class Outcome : uint8_t {
  kNoValidEntry,  // NCCL's table had no usable entry: untouched
  kRule,          // an imported CSV rule applied
  kForced,        // sweep mode
  kExplored,      // exploration schedule
  kMeasured,      // a measured winner beat NCCL's pick
  kKeptNccl,      // measured, and NCCL's pick is best (or not beaten with confidence)
  kNotMeasured,   // nothing measured here (or NCCL's pick not measured): untouched
  kSignatureMismatch,  // NCCL offers other entries than when the profile was made: untouched
  kForcedUnavailable,  // sweep mode, but the forced entry is IGNORE here: untouched
};
const char* outcomeName(Outcome o) noexcept;

struct Decision {
  Outcome outcome = Outcome::kNotMeasured;
  int algo = -1, proto = -1;  // what NCCL will pick after the call
  int channels = 0;           // written to *nChannels (0: NCCL's own)
  uint32_t chunk = 0;         // for getChunkSize (0: NCCL's own)
};

class Policy {
 public:
  // A policy for one topology; the profile's signature must already match it (see signatureMatches).
  static std::shared_ptr<const Policy> build(const Profile& p, const PolicyOptions& o);
  // table: float[numAlgo][numProto] as NCCL passes it; modified in place only by lowering a valid entry.
  // callIndex: how many times this (collective, size bucket) was asked before on this communicator.
  Decision decide(int coll, uint64_t nBytes, int numPipeOps, float* table, int numAlgo, int numProto,
                  uint32_t callIndex) const noexcept;
  // The chunk size measured best for the arm NCCL ended up with (0: no opinion).
  uint32_t chunkFor(int coll, uint64_t nBytes, int algo, int proto, int channels) const noexcept;
  const PolicyOptions& options() const { return opt_; }
  const std::vector<Rule>& rules() const { return rules_; }
  uint32_t mask(int coll) const { return coll >= 0 && coll < kNumColls ? masks_[coll] : 0; }  // the signature's

  struct Entry {
    Arm arm;
    float timeUs;
    float relErr;  // relative standard error of timeUs
    // The arm's measured times at the nearest measured sizes at or below and at or above the bucket (the same
    // one twice where the bucket is a measured size, or beyond the measured range), and those sizes' buckets.
    float loUs, hiUs;
    int16_t loBucket, hiBucket;
    // The same three times where this arm is NCCL's pick at a size other than a measured one: a narrow slowdown
    // at one measured size (a spike, see PolicyOptions::spike) replaced by its neighbours' chord. Never above the
    // raw ones.
    float asNcclUs, loAsNcclUs, hiAsNcclUs;
    uint64_t atBytes;  // the measured size in this bucket (0: none); there, the raw times stand
    // With NCCL's model recorded at every measured size of this arm (Profile::model): its measured time over
    // NCCL's estimate, interpolated (and without narrow spikes, as NCCL's pick). At the call the estimate is
    // NCCL's table entry times this. 0: no model.
    float overModel, overModelAsNccl;

  };
  // Measured/interpolated candidates for a collective and bucket, fastest first (empty span: nothing known).
  std::pair<const Entry*, const Entry*> cell(int coll, int bucket) const noexcept;

 private:
  PolicyOptions opt_;
  std::vector<Rule> rules_;
  uint32_t masks_[kNumColls] = {};
  std::vector<Entry> entries_;
  std::vector<uint32_t> start_;  // (kNumColls * kBuckets + 1) offsets into entries_
};

// Whether a profile was made for this topology (nRanks, nNodes, NVLink domains when both know them).
bool signatureMatches(const Signature& s, int nRanks, int nNodes, int nvlDomains, std::string* why);

}  // namespace weft::tuner
