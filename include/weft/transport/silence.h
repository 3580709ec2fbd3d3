// SPDX-License-Identifier: Apache-2.0
// A comm's liveness clock, shared by the backends that probe a silent peer (libfabric, verbs): how long the comm has
// gone without any completion, as its periodic check sees it. The data path counts completions (one increment, no
// clock read); the check, every so many progress calls, asks whether anything completed since its last look.
#pragma once

#include <cstdint>

namespace weft {

class Silence {
 public:
  void completed() { ++completions_; }  // every completion, success or error
  // True when something completed since the last look (or at the first look): the silence starts again at `now`.
  bool restarted(int64_t nowMs) {
    if (completions_ == seen_ && sinceMs_ != 0) return false;
    seen_ = completions_;
    sinceMs_ = nowMs;
    return true;
  }
  // When the comm was last seen doing something (the check's clock, coarse milliseconds).
  int64_t sinceMs() const { return sinceMs_; }

 private:
  uint64_t completions_ = 0;
  uint64_t seen_ = 0;  // completions_ at the last look
  int64_t sinceMs_ = 0;
};

}  // namespace weft
