// SPDX-License-Identifier: Apache-2.0
// A millisecond clock cheap enough for data-path stall checks (the coarse monotonic clock is read from the vDSO,
// without a system call; its resolution, a few ms, is plenty for timeouts of hundreds of ms and more).
#pragma once

#include <cstdint>
#include <ctime>

namespace weft {

inline int64_t coarseNowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace weft
