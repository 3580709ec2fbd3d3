// SPDX-License-Identifier: Apache-2.0
#include "weft/common/log.h"

#include <atomic>
#include <cstdio>

#include "weft/common/status.h"

namespace weft {

const char* statusName(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kSystem: return "system error";
    case Status::kRemote: return "remote error";
    case Status::kInvalidUsage: return "invalid usage";
    case Status::kInternal: return "internal error";
  }
  return "unknown";
}

namespace log {
namespace {
std::atomic<ncclDebugLogger_t> gLogger{nullptr};
std::atomic<bool> gStderrVerbose{false};
}  // namespace

void setStderrVerbose(bool verbose) noexcept { gStderrVerbose.store(verbose, std::memory_order_relaxed); }

void setLogger(ncclDebugLogger_t l) noexcept {
  if (l != nullptr) gLogger.store(l, std::memory_order_release);
}

ncclDebugLogger_t logger() noexcept { return gLogger.load(std::memory_order_acquire); }

void emit(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const std::string& msg) noexcept {
  ncclDebugLogger_t l = logger();
  if (l != nullptr) {
    l(level, flags, file, line, "NET/weft : %s", msg.c_str());
    return;
  }
  // Before NCCL gave us its logger (or in our own tools): warnings always, the rest only when asked for.
  if (level == NCCL_LOG_WARN || gStderrVerbose.load(std::memory_order_relaxed)) {
    std::fprintf(stderr, "NET/weft %s : %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", msg.c_str());
  }
}

}  // namespace log
}  // namespace weft
