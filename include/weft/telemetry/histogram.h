// SPDX-License-Identifier: Apache-2.0
// A fixed-size, lock-free latency histogram: 4 sub-buckets per power of two of nanoseconds (≤ 19% bucket width,
// quantiles reported at the bucket's geometric middle, so within ~9%). Recording is one relaxed atomic add;
// reading (quantiles) may run concurrently and sees a consistent-enough snapshot for monitoring.
#pragma once

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>

namespace weft::telemetry {

class LatencyHistogram {
 public:
  static constexpr int kSub = 4;                 // sub-buckets per octave
  static constexpr int kOctaves = 44;            // up to ~4.9 hours in ns
  static constexpr int kBuckets = kSub * kOctaves;

  static int bucketOf(uint64_t ns) noexcept {
    if (ns < kSub) return static_cast<int>(ns);  // 0..3 ns land in the first octave's slots
    int octave = 63 - __builtin_clzll(ns);       // >= 2
    int sub = static_cast<int>((ns >> (octave - 2)) & (kSub - 1));
    int b = octave * kSub + sub;
    return b < kBuckets ? b : kBuckets - 1;
  }
  // The value a bucket stands for (geometric middle of its range).
  static double valueOf(int b) noexcept {
    if (b < kSub) return b;
    int octave = b / kSub, sub = b % kSub;
    double lo = std::ldexp(1.0 + sub / 4.0, octave);
    double hi = std::ldexp(1.0 + (sub + 1) / 4.0, octave);
    return std::sqrt(lo * hi);
  }

  void add(uint64_t ns) noexcept {
    counts_[bucketOf(ns)].fetch_add(1, std::memory_order_relaxed);
    total_.fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(ns, std::memory_order_relaxed);
  }
  uint64_t count() const noexcept { return total_.load(std::memory_order_relaxed); }
  uint64_t sumNs() const noexcept { return sum_.load(std::memory_order_relaxed); }
  // q in [0,1]; 0 when empty.
  double quantileNs(double q) const noexcept {
    uint64_t n = 0;
    std::array<uint64_t, kBuckets> snap;
    for (int i = 0; i < kBuckets; ++i) n += (snap[i] = counts_[i].load(std::memory_order_relaxed));
    if (n == 0) return 0.0;
    uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(n)));
    if (rank == 0) rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += snap[i];
      if (seen >= rank) return valueOf(i);
    }
    return valueOf(kBuckets - 1);
  }
  void reset() noexcept {
    for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
    total_.store(0, std::memory_order_relaxed);
    sum_.store(0, std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> total_{0};
  std::atomic<uint64_t> sum_{0};
};

}  // namespace weft::telemetry
