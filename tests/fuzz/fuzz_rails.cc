// libFuzzer: WEFT_RAILS values.
#include <string>

#include "fabric/rails.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size), err;
  weft::fabric::RailSpec spec;
  if (!weft::fabric::parseRailSpec(text, &spec, &err) && err.empty()) __builtin_trap();
  return 0;
}
