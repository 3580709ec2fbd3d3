// SPDX-License-Identifier: Apache-2.0
// What a conformance run (net or RMA) exits with, so that ctest judges it by its exit code alone.
#pragma once

#include <cstdio>

namespace weft::harness {

// 1 when a check failed; 77 (a skip: ctest's SKIP_RETURN_CODE) when no check reached a verdict of its own, every
// one skipped, so a run that tested nothing never passes; 0 otherwise.
inline int verdictExitCode(int passed, int failed) {
  if (failed > 0) return 1;
  if (passed == 0) {
    std::printf("no check ran here (every one was skipped): exit 77\n");
    std::fflush(stdout);
    return 77;
  }
  return 0;
}

}  // namespace weft::harness
