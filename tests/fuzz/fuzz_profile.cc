// SPDX-License-Identifier: Apache-2.0
// libFuzzer: tuner profiles (JSON) — parse, and when accepted, build a policy and decide on a table: never a
// crash, never an IGNORE entry made selectable.
#include <string>

#include "tuner/policy.h"
#include "tuner/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size), err;
  auto p = weft::tuner::parseProfile(text, &err);
  if (!p) {
    if (err.empty()) __builtin_trap();
    return 0;
  }
  auto pol = weft::tuner::Policy::build(*p, weft::tuner::PolicyOptions{});
  for (int coll = 0; coll < 5; ++coll) {
    float t[21];
    for (int i = 0; i < 21; ++i) t[i] = (i % 4 == 0) ? -1.0f : 10.0f + i;
    pol->decide(coll, 1u << (10 + coll * 4), 1, t, 7, 3, 0);
    for (int i = 0; i < 21; i += 4)
      if (t[i] != -1.0f) __builtin_trap();
  }
  return 0;
}
