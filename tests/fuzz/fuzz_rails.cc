// SPDX-License-Identifier: Apache-2.0
// libFuzzer: WEFT_RAILS and WEFT_NIC_RAILS values (a refusal always says why; an accepted rail and plane are in
// range).
#include <map>
#include <string>

#include "fabric/rails.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size), err;
  weft::fabric::RailSpec spec;
  if (!weft::fabric::parseRailSpec(text, &spec, &err) && err.empty()) __builtin_trap();
  err.clear();
  std::map<std::string, weft::fabric::NicRail> rails;
  if (!weft::fabric::parseNicRails(text, &rails, &err)) {
    if (err.empty()) __builtin_trap();
  } else {
    for (const auto& [name, r] : rails)
      if (name.empty() || r.rail < 0 || r.rail > 32767 || r.plane < -1 || r.plane > 32767) __builtin_trap();
  }
  return 0;
}
