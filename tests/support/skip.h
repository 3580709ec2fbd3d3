// SPDX-License-Identifier: Apache-2.0
// Skips for the Catch2 tests (Debian's Catch2 2.13 has no SKIP()). A case that cannot run here says why with
// WEFT_SKIP and returns; the run then exits 77 when no case failed, which ctest reports as skipped
// (SKIP_RETURN_CODE 77), never as passed. WEFT_SKIP_UNLESS_CI is for what scripts/setup.sh installs (libfabric, its
// providers): under CI=true such a skip fails the case instead, since CI has everything setup.sh installs.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

namespace weft::testing {

inline std::atomic<int>& skippedCases() {
  static std::atomic<int> n{0};
  return n;
}

inline bool underCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::strcmp(ci, "true") == 0;
}

// "SKIPPED (optional)": scripts/test_report.py lets such a skip pass under CI=true (what is missing is not something
// setup.sh installs; the skips of what it installs fail under CI=true before they get here).
inline void noteSkip(const std::string& why) {
  skippedCases().fetch_add(1);
  std::printf("SKIPPED (optional): %s: %s\n", Catch::getResultCapture().getCurrentTestName().c_str(), why.c_str());
  std::fflush(stdout);
}

// What main returns: Catch's code where a case failed (or the command line was wrong); 77 where none failed and
// one or more skipped; 0 where every case that ran, ran whole.
inline int runResult(int catchRc) { return catchRc == 0 && skippedCases().load() > 0 ? 77 : catchRc; }

}  // namespace weft::testing

// Skips the case (the rest of it does not run), saying why.
#define WEFT_SKIP(why)                                             \
  do {                                                             \
    std::ostringstream weftSkipWhy_;                               \
    weftSkipWhy_ << why;                                           \
    ::weft::testing::noteSkip(weftSkipWhy_.str());                 \
    return;                                                        \
  } while (0)

// The same for what scripts/setup.sh installs: under CI=true the case fails instead.
#define WEFT_SKIP_UNLESS_CI(why)                                                                    \
  do {                                                                                             \
    if (::weft::testing::underCi()) FAIL("CI=true, yet this needs what scripts/setup.sh installs: " << why); \
    WEFT_SKIP(why);                                                                                \
  } while (0)
