// SPDX-License-Identifier: Apache-2.0
// Process-wide plugin state: the backend and its devices, set up once however many times NCCL calls init
// (per communicator on v11+, once per load before, again after a reload; see docs/nccl-semantics.md §loading).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "weft/nccl/common.h"
#include "weft/transport/net.h"

namespace weft::rma {
class RmaTransport;
}

namespace weft {

// The backend WEFT_BACKEND (`which`) selects on this host: verbs where an InfiniBand/RoCE port is active (auto), else
// weft's own TCP sockets where libfabric offers no hardware provider and WEFT_PROVIDER is unset, else libfabric; a
// forced backend that finds nothing declines instead of using another. nullptr, and *why, when there is none.
std::unique_ptr<Backend> selectBackend(const std::string& which, std::string* why);

// The device API's transport WEFT_RMA (`mode`) selects beside the net backend `net` (nullptr when declined): auto, the
// net backend's own where weft has one (libfabric, TCP; beside verbs NCCL's own InfiniBand GIN serves it); on, that or
// weft's TCP sockets; verbs, fabric or tcp, that one; off, none. A libfabric provider over TCP sockets that does not
// reach GPU memory gives way to weft's TCP sockets where a CUDA driver is present (unless WEFT_RMA=fabric). nullptr,
// and *why, when there is none.
std::unique_ptr<rma::RmaTransport> selectRmaTransport(const std::string& mode, const Backend* net, std::string* why);

// What each backend finds on this host, for `weft info`: the libfabric version, the libfabric providers with reliable
// tagged endpoints and their devices, the active verbs ports. Lines of text, each ending in a newline.
std::string describeHost();

class Engine {
 public:
  static Engine& instance();

  // Idempotent. Succeeds even when weft declines (no devices, bad configuration): NCCL then sees 0 devices
  // and falls back to its own transports, where a failing init would crash NCCL 2.28.3-2.29.3
  // (docs/nccl-semantics.md §loading).
  Status init(ncclDebugLogger_t logger);
  int deviceCount() const;
  Backend* backend() const;  // nullptr when declined
  const std::string& declineReason() const { return declineReason_; }

 private:
  mutable std::mutex mutex_;  // guards everything below during init; read-only afterwards
  bool initialized_ = false;
  std::unique_ptr<Backend> backend_;
  std::string declineReason_;
};

}  // namespace weft
