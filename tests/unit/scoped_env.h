// SPDX-License-Identifier: Apache-2.0
// A variable set for a test's scope, then unset; weft's parameters are re-read both times.
#pragma once

#include <cstdlib>
#include <string>

#include "weft/common/params.h"

namespace weft::test {

struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const std::string& v) : name(n) {
    setenv(n, v.c_str(), 1);
    params::reload();
  }
  ~ScopedEnv() {
    unsetenv(name.c_str());
    params::reload();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

}  // namespace weft::test
