// SPDX-License-Identifier: Apache-2.0
// Status of a weft operation. "Try again" is not an error: the data path reports it by leaving the out-request
// NULL and returning kOk, the way NCCL expects. Every other code maps to exactly one ncclResult_t in toNccl().
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "weft/nccl/common.h"

namespace weft {

enum class Status : uint8_t {
  kOk = 0,
  kSystem,        // network or OS failure (ncclSystemError)
  kRemote,        // the peer went away or misbehaved (ncclRemoteError)
  kInvalidUsage,  // the user's job or configuration is wrong (ncclInvalidUsage)
  kInternal,      // NCCL (or a harness) called us in a way the ABI does not allow (ncclInternalError)
};

constexpr ncclResult_t toNccl(Status s) {
  switch (s) {
    case Status::kOk: return ncclSuccess;
    case Status::kSystem: return ncclSystemError;
    case Status::kRemote: return ncclRemoteError;
    case Status::kInvalidUsage: return ncclInvalidUsage;
    case Status::kInternal: return ncclInternalError;
  }
  return ncclInternalError;
}

const char* statusName(Status s);

// Thrown by set-up code only (never on the data path); caught at the C ABI boundary and mapped by its status.
class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& what) : std::runtime_error(what), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

}  // namespace weft
