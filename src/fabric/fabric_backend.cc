#include "fabric/fabric_backend.h"

#include <cstdlib>
#include <cstring>

#include "weft/common/params.h"
#include "weft/transport/handle.h"

namespace weft::fabric {

namespace {
// Registered memory and fork() (PyTorch DataLoader workers): copy-on-write of registered pages corrupts data
// unless rdma-core's fork support is on before the first registration (NCCL's own IB transport does the same
// with ibv_fork_init). A value the user set is kept.
void forkSafetyDefaults() {
  setenv("RDMAV_FORK_SAFE", "1", 0);
  setenv("FI_EFA_FORK_SAFE", "1", 0);
}
}  // namespace

std::unique_ptr<FabricBackend> FabricBackend::discover(std::string* why) {
  forkSafetyDefaults();
  const std::string& provider = params::getString("WEFT_PROVIDER");
  const std::string& iface = params::getString("WEFT_IFACE");
  std::vector<Candidate> found;
  std::string reasons;
  if (!provider.empty()) {
    std::string w;
    found = filterInterfaces(probe(provider, &w), iface);
    if (found.empty()) reasons = w.empty() ? "WEFT_IFACE='" + iface + "' matched none of its domains" : w;
  } else {
    for (const auto& p : defaultProviders()) {
      std::string w;
      found = filterInterfaces(probe(p, &w), iface);
      if (!found.empty()) break;
      reasons += (reasons.empty() ? "" : "; ") + p + ": " + (w.empty() ? "no domain matches WEFT_IFACE" : w);
    }
  }
  if (found.empty()) {
    *why = "no usable libfabric device (" + reasons + ")";
    return nullptr;
  }
  auto b = std::unique_ptr<FabricBackend>(new FabricBackend());
  b->maxRecvs_ = static_cast<int>(params::getInt("WEFT_MAX_RECVS"));
  b->connectTimeoutSec_ = static_cast<int>(params::getInt("WEFT_CONNECT_TIMEOUT"));
  for (auto& c : found) {
    c.props.maxRecvs = b->maxRecvs_;
    int index = static_cast<int>(b->devices_.size());
    b->devices_.push_back(std::make_unique<FabricDevice>(index, std::move(c)));
    const DeviceProps& p = b->devices_.back()->props();
    WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft device {}: {} via {} (fabric {}), {} Mb/s, pci {}, ptrSupport {:#x}",
              index, p.name, p.provider, p.fabric, p.speedMbps, p.pciPath.empty() ? "none" : p.pciPath, p.ptrSupport);
  }
  return b;
}

FabricBackend::~FabricBackend() = default;

Status FabricBackend::listen(int dev, void* handle, ListenComm** out) {
  *out = nullptr;
  if (dev < 0 || dev >= deviceCount()) {
    WEFT_WARN("listen on device {}, but there are {} devices", dev, deviceCount());
    return Status::kInternal;
  }
  if (handle == nullptr) return Status::kInternal;
  std::unique_ptr<Endpoint> ep;
  if (Status st = Endpoint::open(*devices_[dev], &ep); st != Status::kOk) return st;
  if (ep->name().size() > WireHandle::kMaxAddr) {
    WEFT_WARN("provider address of {} bytes does not fit the handle", ep->name().size());
    return Status::kInternal;
  }
  if (Status st = ep->postConnRequestRecv(); st != Status::kOk) return st;
  WireHandle h;
  h.backend = BackendId::kFabric;
  h.providerHash = devices_[dev]->providerHash();
  h.token = randomToken();
  h.addrLen = static_cast<uint16_t>(ep->name().size());
  std::memcpy(h.addr.data(), ep->name().data(), h.addrLen);
  h.encode(handle);
  WEFT_INFO(NCCL_NET, "listening on {} at {}", devices_[dev]->props().name,
            ep->addrString(ep->name().data(), ep->name().size()));
  *out = new FabricListenComm(std::move(ep), h.token, maxRecvs_);
  return Status::kOk;
}

Status FabricBackend::connect(int dev, const CommConfig& config, void* handle, SendComm** out) {
  (void)config;
  *out = nullptr;
  if (dev < 0 || dev >= deviceCount()) {
    WEFT_WARN("connect on device {}, but there are {} devices", dev, deviceCount());
    return Status::kInternal;
  }
  PendingConnect* pc = nullptr;
  {
    std::lock_guard<std::mutex> lock(pendingMutex_);
    auto it = pending_.find(handle);
    if (it != pending_.end()) {
      if (std::memcmp(it->second->handleBytes, handle, kHandleSize) != 0) {
        pending_.erase(it);  // the buffer was reused for another connection: the old attempt is abandoned
      } else if (connectTimeoutSec_ > 0 &&
                 std::chrono::steady_clock::now() - it->second->started > std::chrono::seconds(connectTimeoutSec_)) {
        // Past its timeout: answered here, under the lock, so an entry old enough to be purged below is
        // never in anyone's hands.
        WEFT_WARN("connect to {} on {} timed out after {} s without an answer: likely a firewall or security "
                  "group dropping traffic between the nodes, WEFT_IFACE choosing an interface the peer cannot "
                  "reach, or the peer process is gone (WEFT_CONNECT_TIMEOUT sets the limit)",
                  it->second->peerName, devices_[dev]->props().name, connectTimeoutSec_);
        pending_.erase(it);
        return Status::kRemote;
      } else {
        pc = it->second.get();
      }
    }
  }
  if (pc == nullptr) {
    WireHandle h;
    std::string why;
    if (Status st = WireHandle::decode(handle, &h, &why); st != Status::kOk) {
      WEFT_WARN("connect on {}: {}", devices_[dev]->props().name, why);
      return st;
    }
    if (h.backend != BackendId::kFabric || h.providerHash != devices_[dev]->providerHash()) {
      WEFT_WARN("connect on {}: the handle comes from a different transport or provider than {} (every rank "
                "must use the same WEFT_PROVIDER)",
                devices_[dev]->props().name, devices_[dev]->props().provider);
      return Status::kInvalidUsage;
    }
    auto fresh = std::make_unique<PendingConnect>();
    std::memcpy(fresh->handleBytes, handle, kHandleSize);
    fresh->started = std::chrono::steady_clock::now();
    if (Status st = Endpoint::open(*devices_[dev], &fresh->ep); st != Status::kOk) return st;
    fresh->peerName = fresh->ep->addrString(h.addr.data(), h.addrLen);
    if (Status st = fresh->ep->insert(h.addr.data(), h.addrLen, &fresh->peer); st != Status::kOk) return st;
    fresh->token = h.token;
    if (Status st = fresh->ep->startConnect(fresh->peer, h.token, localProtocolFlags(*devices_[dev]),
                                            static_cast<uint32_t>(devices_[dev]->eagerMax()));
        st != Status::kOk) {
      return st;
    }
    std::lock_guard<std::mutex> lock(pendingMutex_);
    // Attempts nobody polled past their timeout were abandoned (a communicator aborted mid-connect): free
    // their endpoints instead of keeping them for the life of the process.
    if (connectTimeoutSec_ > 0) {
      auto stale = fresh->started - std::chrono::seconds(2 * connectTimeoutSec_);
      std::erase_if(pending_, [&](const auto& kv) { return kv.second->started < stale; });
    }
    pc = fresh.get();
    pending_[handle] = std::move(fresh);
  }
  Status st = pollConnect(*pc, out);
  if (st != Status::kOk || *out != nullptr) {
    std::lock_guard<std::mutex> lock(pendingMutex_);
    pending_.erase(handle);
  }
  return st;
}

Status FabricBackend::pollConnect(PendingConnect& pc, SendComm** out) {
  Endpoint& ep = *pc.ep;
  const DeviceProps& p = ep.device().props();
  if (Status st = ep.progress(nullptr); st != Status::kOk) return st;
  if (ep.connectError() != Status::kOk) {
    WEFT_WARN("connect to {} via {} on {} failed: the peer is unreachable or refused the connection (nothing "
              "listening there any more, a firewall/security group, or an interface the peer cannot reach: check "
              "WEFT_IFACE)",
              pc.peerName, p.provider, p.name);
    return ep.connectError();
  }
  ConnectReply reply;
  if (ep.takeReply(&reply)) {
    if (reply.magic != ConnectReply::kMagic || reply.token != pc.token) {
      WEFT_WARN("connect to {} on {}: ignored a reply that does not answer this connection", pc.peerName, p.name);
      if (Status st = ep.repostReplyRecv(); st != Status::kOk) return st;
      return Status::kOk;
    }
    if (reply.status != kAccepted) {
      WEFT_WARN("connect to {} on {}: {}", pc.peerName, p.name, replyStatusName(reply.status));
      return Status::kRemote;
    }
    Protocol proto;
    proto.rdma = (reply.flags & localProtocolFlags(pc.ep->device()) & ConnectRequest::kFlagRdma) != 0;
    proto.eagerMax = proto.rdma ? static_cast<uint32_t>(pc.ep->device().eagerMax()) : 0;
    WEFT_INFO(NCCL_NET, "connected to {} on {} via {} ({} protocol, eager up to {} B)", pc.peerName, p.name,
              p.provider, proto.rdma ? "rdma" : "sendrecv", proto.eagerMax);
    auto sc = std::make_unique<FabricSendComm>(std::move(pc.ep), pc.peer, pc.peerName, maxRecvs_, proto);
    if (Status st = sc->start(); st != Status::kOk) return st;
    *out = sc.release();
    return Status::kOk;
  }
  return Status::kOk;
}

}  // namespace weft::fabric
