// SPDX-License-Identifier: Apache-2.0
// Owning wrappers for libfabric objects: each closes its fid once, logging (never throwing) on failure.
// Declare members in acquisition order so teardown runs in reverse.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <memory>

#include "weft/common/log.h"

namespace weft::fabric {

template <typename T>
struct FidCloser {
  void operator()(T* p) const noexcept {
    if (p == nullptr) return;
    int rc = fi_close(&p->fid);
    if (rc != 0) WEFT_WARN("fi_close of fid class {} failed: {}", p->fid.fclass, fi_strerror(-rc));
  }
};

struct InfoDeleter {
  void operator()(fi_info* i) const noexcept { fi_freeinfo(i); }
};

using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;
using FabricPtr = std::unique_ptr<fid_fabric, FidCloser<fid_fabric>>;
using DomainPtr = std::unique_ptr<fid_domain, FidCloser<fid_domain>>;
using EpPtr = std::unique_ptr<fid_ep, FidCloser<fid_ep>>;
using CqPtr = std::unique_ptr<fid_cq, FidCloser<fid_cq>>;
using AvPtr = std::unique_ptr<fid_av, FidCloser<fid_av>>;
using MrPtr = std::unique_ptr<fid_mr, FidCloser<fid_mr>>;

inline InfoPtr dupInfo(const fi_info* i) { return InfoPtr(fi_dupinfo(i)); }

}  // namespace weft::fabric
