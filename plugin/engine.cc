#include "plugin/engine.h"

#include <rdma/fabric.h>

#include "fabric/fabric_backend.h"
#include "tcp/tcp_backend.h"
#include "verbs/verbs_backend.h"
#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/version.h"

namespace weft {

Engine& Engine::instance() {
  static Engine* e = new Engine();  // never destroyed: NCCL may call in from its threads during exit
  return *e;
}

Status Engine::init(ncclDebugLogger_t logger) {
  log::setLogger(logger);
  std::lock_guard<std::mutex> lock(mutex_);
  if (initialized_) return Status::kOk;
  initialized_ = true;
  uint32_t fv = fi_version();
  WEFT_INFO(NCCL_INIT | NCCL_NET, "weft {} (net tables v7-v12), libfabric {}.{} at run time", kVersionString,
            FI_MAJOR(fv), FI_MINOR(fv));
  bool badValue = false;
  for (const auto& v : params::values()) {
    if (v.fromEnv && v.valid) WEFT_INFO(NCCL_INIT | NCCL_ENV, "{} set by environment to '{}'", v.def->name, v.raw);
    badValue |= !v.valid;
  }
  for (const auto& problem : params::problems()) WEFT_WARN("{}", problem);
  if (badValue) {
    declineReason_ = "invalid WEFT_* setting (see the warnings above)";
    WEFT_WARN("not offering any device: {}; NCCL will use its own transports", declineReason_);
    return Status::kOk;
  }
  // WEFT_BACKEND: verbs where an InfiniBand/RoCE port is active (auto), else libfabric; tcp only when asked for; a
  // forced backend that finds nothing declines instead of silently using another.
  const std::string& which = params::getString("WEFT_BACKEND");
  try {
    std::string verbsWhy, fabricWhy, tcpWhy;
    if (which == "tcp") backend_ = tcp::TcpBackend::discover(&tcpWhy);
    if (which == "auto" || which == "verbs") {
      backend_ = verbs::VerbsBackend::discover(&verbsWhy);
      if (!backend_ && which == "auto")
        WEFT_INFO(NCCL_INIT | NCCL_NET, "verbs backend not used: {}; trying libfabric", verbsWhy);
    }
    if (!backend_ && (which == "auto" || which == "fabric")) backend_ = fabric::FabricBackend::discover(&fabricWhy);
    if (!backend_) {
      declineReason_ = which == "verbs"    ? "WEFT_BACKEND=verbs: " + verbsWhy
                       : which == "tcp"    ? "WEFT_BACKEND=tcp: " + tcpWhy
                       : which == "fabric" ? fabricWhy
                                           : fabricWhy + "; verbs: " + verbsWhy;
    } else {
      WEFT_INFO(NCCL_INIT | NCCL_NET, "transport: {} (WEFT_BACKEND={})", backend_->name(), which);
    }
  } catch (const std::exception& e) {
    declineReason_ = e.what();
  }
  if (!backend_) WEFT_WARN("not offering any device: {}; NCCL will use its own transports", declineReason_);
  return Status::kOk;
}

int Engine::deviceCount() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return backend_ ? backend_->deviceCount() : 0;
}

Backend* Engine::backend() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return backend_.get();
}

}  // namespace weft
