// SPDX-License-Identifier: Apache-2.0
// The one place where an exported call's failure becomes an ncclResult_t (STYLE.md, convention 1): every adapter of
// every table runs its body through guarded(), which maps weft's status, and catches whatever set-up code threw.
#pragma once

#include <exception>
#include <new>

#include "weft/common/log.h"
#include "weft/common/status.h"

namespace weft {

template <typename F>
ncclResult_t guarded(const char* what, F&& f) noexcept {
  try {
    return toNccl(f());
  } catch (const Error& e) {
    WEFT_WARN("{}: {}", what, e.what());
    return toNccl(e.status());
  } catch (const std::bad_alloc&) {
    WEFT_WARN("{}: out of memory", what);
    return ncclSystemError;
  } catch (const std::exception& e) {
    WEFT_WARN("{}: {}", what, e.what());
    return ncclInternalError;
  } catch (...) {
    WEFT_WARN("{}: unknown exception", what);
    return ncclInternalError;
  }
}

}  // namespace weft
