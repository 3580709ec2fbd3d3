// SPDX-License-Identifier: Apache-2.0
// Logging through NCCL's logger once NCCL has handed it to us (stderr before that), with the "NET/weft" prefix
// NCCL users grep for. Formatting happens only when a message is emitted; nothing here belongs on a hot path
// except WEFT_TRACE, which compiles away unless WEFT_ENABLE_TRACE is defined.
#pragma once

#include <fmt/format.h>

#include "weft/nccl/common.h"

namespace weft::log {

void setLogger(ncclDebugLogger_t logger) noexcept;
ncclDebugLogger_t logger() noexcept;
// Without NCCL's logger only warnings reach stderr; tools turn INFO on with this.
void setStderrVerbose(bool verbose) noexcept;
void emit(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const std::string& msg) noexcept;

template <typename... Args>
void write(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, fmt::format_string<Args...> f,
           Args&&... args) noexcept {
  try {
    emit(level, flags, file, line, fmt::format(f, std::forward<Args>(args)...));
  } catch (...) {
  }
}

}  // namespace weft::log

#define WEFT_WARN(...) ::weft::log::write(NCCL_LOG_WARN, NCCL_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define WEFT_INFO(flags, ...) ::weft::log::write(NCCL_LOG_INFO, (flags), __FILE__, __LINE__, __VA_ARGS__)
#ifdef WEFT_ENABLE_TRACE
#define WEFT_TRACE(flags, ...) ::weft::log::write(NCCL_LOG_TRACE, (flags), __FILE__, __LINE__, __VA_ARGS__)
#else
#define WEFT_TRACE(flags, ...) \
  do {                         \
  } while (0)
#endif
