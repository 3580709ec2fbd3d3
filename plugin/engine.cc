// SPDX-License-Identifier: Apache-2.0
#include "plugin/engine.h"

#include <rdma/fabric.h>

#include "fabric/fabric_backend.h"
#include "fabric/fabric_device.h"
#include "fabric/fabric_rma.h"
#include "tcp/tcp_backend.h"
#include "tcp/tcp_rma.h"
#include "verbs/verbs_backend.h"
#include "verbs/verbs_rma.h"
#include "weft/common/cuda_shim.h"
#include "weft/common/log.h"
#include "weft/common/numa.h"
#include "weft/common/params.h"
#include "weft/common/topology.h"
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
  try {
    backend_ = selectBackend(params::getString("WEFT_BACKEND"), &declineReason_);
  } catch (const std::exception& e) {
    declineReason_ = e.what();
  }
  if (backend_) {
    WEFT_INFO(NCCL_INIT | NCCL_NET, "transport: {} (WEFT_BACKEND={})", backend_->name(),
              params::getString("WEFT_BACKEND"));
    // weft's own thread (the telemetry writer) goes near the first device's NIC; comms' memory near their own.
    if (backend_->deviceCount() > 0) numa::setHomeNode(backend_->props(0).numaNode);
    WEFT_INFO(NCCL_INIT, "NUMA placement {} (WEFT_NUMA={}, {} NUMA node{}), first device's NIC on node {}",
              numa::placementOn() ? "on" : "off", params::getString("WEFT_NUMA"),
              topo::Topology::host().numa().size(), topo::Topology::host().numa().size() == 1 ? "" : "s",
              numa::homeNode());
  } else {
    WEFT_WARN("not offering any device: {}; NCCL will use its own transports", declineReason_);
  }
  return Status::kOk;
}

namespace {

bool reachesGpu(const rma::RmaTransport& t) {
  for (int d = 0; d < t.deviceCount(); ++d) {
    if ((t.props(d).ptrSupport & rma::kPtrCuda) != 0) return true;
  }
  return false;
}
bool socketProvider(const rma::RmaTransport& t) {
  if (t.deviceCount() == 0) return false;
  const std::string& p = t.props(0).provider;
  return p.rfind("tcp", 0) == 0 || p.rfind("sockets", 0) == 0;
}

}  // namespace

std::unique_ptr<rma::RmaTransport> selectRmaTransport(const std::string& mode, const Backend* net, std::string* why) {
  const std::string netName = net != nullptr ? net->name() : "none";
  std::string which = mode;
  if (mode == "auto") which = netName == "libfabric" ? "fabric" : netName == "tcp" ? "tcp" : "";
  if (mode == "on") which = netName == "libfabric" ? "fabric" : netName == "verbs" ? "verbs" : "tcp";
  std::string w;
  std::unique_ptr<rma::RmaTransport> t;
  if (mode == "off") {
    *why = "WEFT_RMA=off";
  } else if (which.empty()) {
    *why = "WEFT_RMA=auto and the net backend is " + netName +
           " (NCCL's own InfiniBand GIN serves the device API there; WEFT_RMA=on or verbs uses weft's)";
  } else if (which == "verbs") {
    t = verbs::VerbsRmaTransport::discover(&w);
    if (t == nullptr) *why = "no verbs device: " + w;
  } else if (which == "fabric") {
    t = fabric::FabricRmaTransport::discover(&w);
    if (t == nullptr) *why = w;
    // NCCL's device API puts and signals GPU memory. A provider over TCP sockets that cannot reach it (a libfabric
    // built without CUDA, Debian's) leaves the device API to weft's own sockets, which reach it through the driver's
    // copies; WEFT_RMA=fabric keeps libfabric anyway.
    if (t != nullptr && mode != "fabric" && !reachesGpu(*t) && socketProvider(*t) && cuda::driverPresent()) {
      WEFT_INFO(NCCL_INIT | NCCL_NET,
                "RMA: provider {} does not reach GPU memory (no FI_HMEM); the device API goes over weft's TCP sockets "
                "instead (WEFT_RMA=fabric keeps libfabric)",
                t->props(0).provider);
      t = tcp::TcpRmaTransport::discover(&w);
      if (t == nullptr) *why = "no interface for its TCP sockets: " + w;
    }
  } else {
    t = tcp::TcpRmaTransport::discover(&w);
    if (t == nullptr) *why = "no interface for its TCP sockets: " + w;
  }
  return t;
}

std::unique_ptr<Backend> selectBackend(const std::string& which, std::string* why) {
  std::string verbsWhy, fabricWhy, tcpWhy;
  std::unique_ptr<Backend> b;
  if (which == "auto" || which == "verbs") {
    b = verbs::VerbsBackend::discover(&verbsWhy);
    if (b || which == "verbs") {
      if (!b) *why = "WEFT_BACKEND=verbs: " + verbsWhy;
      return b;
    }
    WEFT_INFO(NCCL_INIT | NCCL_NET, "verbs backend not used: {}", verbsWhy);
  }
  // auto without an RDMA NIC: weft's own sockets, unless the user named a libfabric provider or libfabric has a
  // hardware one (EFA; verbs through rxm where the native backend declined). The TCP backend makes 2 system calls
  // per small message where libfabric's tcp;ofi_rxm makes 16-18 (docs/tcp.md).
  if (which == "tcp" || (which == "auto" && params::getString("WEFT_PROVIDER").empty() &&
                         fabric::probe("efa", &fabricWhy).empty() && fabric::probe("verbs;ofi_rxm", &fabricWhy).empty())) {
    b = tcp::TcpBackend::discover(&tcpWhy);
    if (b || which == "tcp") {
      if (!b) *why = "WEFT_BACKEND=tcp: " + tcpWhy;
      if (b && which == "auto") {
        WEFT_INFO(NCCL_INIT | NCCL_NET, "no RDMA device and no WEFT_PROVIDER: native TCP sockets (WEFT_BACKEND=fabric "
                  "for libfabric's tcp)");
      }
      return b;
    }
    WEFT_INFO(NCCL_INIT | NCCL_NET, "native TCP backend not used: {}; trying libfabric", tcpWhy);
  }
  fabricWhy.clear();
  b = fabric::FabricBackend::discover(&fabricWhy);
  if (!b) *why = which == "fabric" ? fabricWhy : fabricWhy + "; verbs: " + verbsWhy;
  return b;
}

std::string describeHost() {
  uint32_t v = fi_version();
  std::string out = fmt::format("libfabric {}.{} at run time (built against {}.{})\n\n", FI_MAJOR(v), FI_MINOR(v),
                                FI_MAJOR_VERSION, FI_MINOR_VERSION);
  out += "providers with reliable tagged endpoints:\n";
  for (const char* prov : {"efa", "verbs;ofi_rxm", "tcp;ofi_rxm", "tcp", "sockets", "shm"}) {
    std::string why;
    auto found = fabric::probe(prov, &why);
    out += fmt::format("  {:<14} ", prov);
    if (found.empty()) out += "-";
    for (const auto& c : found) out += c.props.name + " ";
    out += "\n";
  }
  out += "\nnative verbs (ibverbs) ports:\n";
  std::string vwhy;
  auto vb = verbs::VerbsBackend::discover(&vwhy);
  if (!vb) return out + "  none: " + vwhy + "\n";
  for (int d = 0; d < vb->deviceCount(); ++d) {
    const auto& p = vb->props(d);
    out += fmt::format("  {}: {:<10} {:<18} {:>6} Mb/s  maxRecvs {}  ptrSupport {:#x}  pci {}\n", d, p.name, p.provider,
                       p.speedMbps, p.maxRecvs, p.ptrSupport, p.pciPath.empty() ? "-" : p.pciPath);
  }
  return out;
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
