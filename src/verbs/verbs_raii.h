// SPDX-License-Identifier: Apache-2.0
// Owning handles for verbs objects, as fabric_raii.h is for libfabric's: each is released once through the run-time
// table (ibv_api.h), logging (never throwing) on failure. Declare members in acquisition order (the CQ before the QPs
// on it, the MRs after the buffers they cover) so that teardown runs in reverse.
#pragma once

#include <cerrno>
#include <cstring>
#include <memory>

#include "verbs/ibv_api.h"
#include "weft/common/log.h"

namespace weft::verbs {

struct QpDestroyer {
  void operator()(ibv_qp* p) const noexcept {
    if (p == nullptr) return;
    if (int rc = ibv().destroyQp(p); rc != 0) WEFT_WARN("ibv_destroy_qp failed: {}", std::strerror(rc));
  }
};
struct CqDestroyer {
  void operator()(ibv_cq* p) const noexcept {
    if (p == nullptr) return;
    if (int rc = ibv().destroyCq(p); rc != 0) WEFT_WARN("ibv_destroy_cq failed: {}", std::strerror(rc));
  }
};
struct MrDeregisterer {
  void operator()(ibv_mr* p) const noexcept {
    if (p == nullptr) return;
    if (int rc = ibv().deregMr(p); rc != 0) WEFT_WARN("ibv_dereg_mr failed: {}", std::strerror(rc));
  }
};

using QpPtr = std::unique_ptr<ibv_qp, QpDestroyer>;
using CqPtr = std::unique_ptr<ibv_cq, CqDestroyer>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeregisterer>;

}  // namespace weft::verbs
