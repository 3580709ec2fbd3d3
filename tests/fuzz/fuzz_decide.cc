// SPDX-License-Identifier: Apache-2.0
// libFuzzer: the decision function on arbitrary cost tables (NaN, negative, zero, huge entries; any collective,
// size, call counter) under exploration and a small profile: the pick NCCL makes afterwards is always an entry
// that was valid (>= 0) on input, and no IGNORE or NaN entry is ever written.
#include <cmath>
#include <cstring>

#include "tuner/policy.h"
#include "tuner/profile.h"

using namespace weft::tuner;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 21 * 4 + 16) return 0;
  float t[21], before[21];
  std::memcpy(t, data, sizeof(t));
  std::memcpy(before, t, sizeof(t));
  uint64_t n;
  uint32_t counter;
  int32_t coll;
  std::memcpy(&n, data + 84, 8);
  std::memcpy(&counter, data + 92, 4);
  std::memcpy(&coll, data + 96, 4);
  static std::shared_ptr<const Policy> pols[2] = {
      [] {
        PolicyOptions o;
        o.explore = true;
        return Policy::build(Profile{}, o);
      }(),
      [] {
        Profile p;
        p.sig.nRanks = 2;
        p.sig.nNodes = 1;
        for (int a = 0; a < 2; ++a)
          for (int pr = 0; pr < 3; ++pr)
            for (uint64_t b = 1024; b < (1u << 30); b *= 8) {
              Measurement m;
              m.coll = 4;
              m.bytes = b;
              m.arm.algo = static_cast<int8_t>(a);
              m.arm.proto = static_cast<int8_t>(pr);
              m.timeUs = 1.0 + static_cast<double>(b) / (1000.0 + 300 * a + 100 * pr);
              m.samples = 10;
              p.measurements.push_back(m);
            }
        return Policy::build(p, PolicyOptions{});
      }()};
  pols[counter & 1]->decide(coll, n, 1, t, 7, 3, counter >> 1);
  int pick = -1;
  for (int i = 0; i < 21; ++i) {
    bool wasValid = before[i] >= 0.0f;
    if (!wasValid && std::memcmp(&t[i], &before[i], 4) != 0) __builtin_trap();  // an IGNORE/NaN entry was written
    if (t[i] >= 0.0f && (pick < 0 || t[i] < t[pick])) pick = i;
  }
  if (pick >= 0 && !(before[pick] >= 0.0f)) __builtin_trap();
  return 0;
}
