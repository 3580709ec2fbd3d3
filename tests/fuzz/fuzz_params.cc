// SPDX-License-Identifier: Apache-2.0
// libFuzzer: the strict parsers behind every WEFT_* variable.
#include <string>

#include "weft/common/params.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size), err;
  int64_t v = 0;
  if (weft::params::parseInt(text, -5, 1 << 20, &v, &err)) {
    if (v < -5 || v > (1 << 20)) __builtin_trap();
  } else if (err.empty()) {
    __builtin_trap();
  }
  bool b;
  err.clear();
  if (!weft::params::parseBool(text, &b, &err) && err.empty()) __builtin_trap();
  return 0;
}
