// SPDX-License-Identifier: Apache-2.0
// libFuzzer: NCCL's example tuner CSV as weft imports it.
#include <string>

#include "tuner/policy.h"
#include "tuner/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size), err;
  auto p = weft::tuner::parseNcclCsv(text, 16, 2, &err);
  if (!p) {
    if (err.empty()) __builtin_trap();
    return 0;
  }
  auto pol = weft::tuner::Policy::build(*p, weft::tuner::PolicyOptions{});
  float t[21];
  for (int i = 0; i < 21; ++i) t[i] = (i % 3 == 1) ? -1.0f : 5.0f + i;
  pol->decide(4, 4096, 1, t, 7, 3, 0);
  for (int i = 1; i < 21; i += 3)
    if (t[i] != -1.0f) __builtin_trap();
  return 0;
}
