// SPDX-License-Identifier: Apache-2.0
#include "verbs/verbs_backend.h"

#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/transport/agreement.h"
#include "weft/transport/handle.h"
#include "weft/transport/oob.h"

namespace weft::verbs {

uint32_t VerbsBackend::providerHash() { return static_cast<uint32_t>(fnv1a64("weft-verbs-rc-v1")); }

std::unique_ptr<VerbsBackend> VerbsBackend::discover(std::string* why) {
  auto devs = VerbsDevice::discover(why);
  if (devs.empty()) return nullptr;
  auto b = std::unique_ptr<VerbsBackend>(new VerbsBackend());
  b->maxRecvs_ = static_cast<int>(params::getInt("WEFT_MAX_RECVS"));
  b->qpsPerConn_ = static_cast<int>(params::getInt("WEFT_IB_QPS_PER_CONN"));
  b->connectTimeoutSec_ = static_cast<int>(params::getInt("WEFT_CONNECT_TIMEOUT"));
  b->pending_.setTimeout(b->connectTimeoutSec_);
  for (auto& d : devs) {
    if (b->slots_.count() >= kMaxDevices) break;
    const DeviceProps& p = d->props();
    WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft device {}: {} via {}, {} Mb/s, GID index {}, handshake on {}, pci {}, "
              "ptrSupport {:#x}",
              b->slots_.count(), p.name, p.provider, p.speedMbps, d->gidIndex(),
              sockaddrString(reinterpret_cast<const sockaddr*>(&d->handshakeAddr())),
              p.pciPath.empty() ? "none" : p.pciPath, p.ptrSupport);
    b->slots_.add(std::move(d), p);  // p is the device's own: it outlives the move of its owner
  }
  return b;
}

VerbsBackend::~VerbsBackend() = default;

Status VerbsBackend::makeVDevice(const int* devs, int n, int* out) {
  if (devs == nullptr || out == nullptr || n < 1) return Status::kInternal;
  if (n > 1) {
    WEFT_WARN("makeVDevice: fusing {} ports into one device is not offered by the verbs backend; NCCL keeps them "
              "separate",
              n);
    return Status::kInvalidUsage;
  }
  if (devs[0] < 0 || devs[0] >= deviceCount()) {
    WEFT_WARN("makeVDevice: device {} does not exist ({} devices)", devs[0], deviceCount());
    return Status::kInvalidUsage;
  }
  std::lock_guard<std::mutex> lock(slots_.mutex());
  const int i = slots_.addMemberView(devs[0]);
  if (i < 0) return Status::kInternal;
  *out = i;
  return Status::kOk;
}

Status VerbsBackend::listen(int dev, const CommConfig& config, void* handle, ListenComm** out) {
  (void)config;
  *out = nullptr;
  if (!validDevice(dev, "listen")) return Status::kInternal;
  if (handle == nullptr) return Status::kInternal;
  VerbsDevice& d = slots_.device(dev);
  oob::Listener l;
  if (Status st = oob::Listener::open(d.handshakeAddr(), d.handshakeAddrLen(), 64, nullptr, d.props().name, "listen",
                                      &l);
      st != Status::kOk) {
    return st;
  }
  l.handle(BackendId::kVerbs, providerHash(), handle);
  WEFT_INFO(NCCL_NET, "listening on {} at {}", d.props().name, sockaddrString(reinterpret_cast<const sockaddr*>(&l.addr)));
  *out = new VerbsListenComm(d, std::move(l.sock), l.token);
  return Status::kOk;
}

Status VerbsBackend::connect(int dev, const CommConfig& config, void* handle, SendComm** out) {
  constexpr const char* kCauses =
      "a firewall or security group dropping traffic between the nodes, or a handshake address the peer cannot reach";
  auto start = [&](PendingConnect& pc) {
    WireHandle h;
    if (Status st = decodeForConnect(handle, props(dev).name, BackendId::kVerbs, providerHash(), "verbs", &h);
        st != Status::kOk) {
      return st;
    }
    sockaddr_storage sa{};
    if (h.addrLen > sizeof(sa) || h.addrLen < sizeof(sockaddr_in)) {
      WEFT_WARN("connect on {}: the handle's address is malformed", props(dev).name);
      return Status::kInvalidUsage;
    }
    std::memcpy(&sa, h.addr.data(), h.addrLen);
    if (sa.ss_family != AF_INET && sa.ss_family != AF_INET6) {
      WEFT_WARN("connect on {}: the handle's address is malformed", props(dev).name);
      return Status::kInvalidUsage;
    }
    pc.peerName = sockaddrString(reinterpret_cast<sockaddr*>(&sa));
    pc.token = h.token;
    pc.trafficClass = static_cast<int>(params::getInt("WEFT_IB_TC"));
    if (pc.trafficClass < 0) pc.trafficClass = config.trafficClass;  // NCCL's, -1 when undefined
    int fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      WEFT_WARN("connect on {}: socket(): {}", props(dev).name, std::strerror(errno));
      return Status::kSystem;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    pc.sock = std::make_unique<HandshakeSocket>(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), h.addrLen) != 0 && errno != EINPROGRESS) {
      WEFT_WARN("connect to {} on {} failed: {} (nothing listening there any more, a firewall/security group, or "
                "an address this host cannot reach)",
                pc.peerName, props(dev).name, std::strerror(errno));
      return Status::kRemote;
    }
    return Status::kOk;
  };
  return pending_.connect(*this, dev, handle, kCauses, out, start,
                          [&](PendingConnect& pc, SendComm** o) { return pollConnect(dev, pc, o); });
}

Status VerbsBackend::pollConnect(int dev, PendingConnect& pc, SendComm** out) {
  VerbsDevice& d = slots_.device(dev);
  std::string why;
  if (!pc.tcpUp) {
    pollfd p{pc.sock->fd(), POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) return Status::kOk;
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(pc.sock->fd(), SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) {
      WEFT_WARN("connect to {} on {} failed: {} (nothing listening there any more, a firewall/security group, or "
                "an address this host cannot reach)",
                pc.peerName, d.props().name, std::strerror(err));
      return Status::kRemote;
    }
    pc.tcpUp = true;
  }
  if (!pc.sentInfo) {
    pc.qps = VerbsSendComm::makeQps(d, qpsPerConn_);
    if (Status st = pc.qps->create(&why); st != Status::kOk) {
      WEFT_WARN("connect to {} on {}: {}", pc.peerName, d.props().name, why);
      return st;
    }
    QpInfo info{};
    info.magic = QpInfo::kMagic;
    info.version = QpInfo::kVersion;
    info.token = pc.token;
    info.trafficClass = static_cast<uint32_t>(pc.trafficClass + 1);
    info.tunerDigest = transport::localDigest();
    pc.qps->describe(&info);
    pc.sock->queue(&info, sizeof(info));
    pc.sentInfo = true;
  }
  if (pc.sock->flush(&why) != Status::kOk) {
    WEFT_WARN("connect to {} on {}: the handshake failed: {}", pc.peerName, d.props().name, why);
    return Status::kRemote;
  }
  if (!pc.comm) {
    QpInfo peer;
    if (!pc.sock->readQpInfo(&peer, &why)) {
      if (why.empty()) return Status::kOk;
      WEFT_WARN("connect to {} on {}: the listener closed the handshake ({}): the listen is gone or refused us",
                pc.peerName, d.props().name, why);
      return Status::kRemote;
    }
    if (peer.magic != QpInfo::kMagic || peer.version != QpInfo::kVersion) {
      WEFT_WARN("connect to {} on {}: the answer is not a weft verbs handshake of this version (v{}, this end v{}: "
                "run the same weft build on every node)",
                pc.peerName, d.props().name, peer.version, QpInfo::kVersion);
      return Status::kRemote;
    }
    if (peer.status == QpInfo::kTunerMismatch) {
      WEFT_WARN("connect to {} on {}: {}", pc.peerName, d.props().name,
                transport::agreementMismatch(peer.tunerDigest, pc.peerName));
      return Status::kInvalidUsage;
    }
    if (peer.status != QpInfo::kAccepted) {
      WEFT_WARN("connect to {} on {}: refused by the listener ({})", pc.peerName, d.props().name,
                peer.status == QpInfo::kWrongToken   ? "wrong token: the handle belongs to another listen or job"
                : peer.status == QpInfo::kBadRequest ? "malformed request"
                                                     : "it could not create its QPs");
      return Status::kRemote;
    }
    if (peer.nQps != pc.qps->nQps || peer.token != pc.token) {
      WEFT_WARN("connect to {} on {}: the answer does not match this connection", pc.peerName, d.props().name);
      return Status::kRemote;
    }
    if (Status st = pc.qps->connect(peer, pc.trafficClass, &why); st != Status::kOk) {
      WEFT_WARN("connect to {} on {}: {}", pc.peerName, d.props().name, why);
      return st;
    }
    std::unique_ptr<VerbsSendComm> sc(numa::make<VerbsSendComm>(d.props().numaNode, std::move(pc.qps), pc.peerName,
                                                                 maxRecvs_));
    sc->setLocalName(localAddressOf(pc.sock->fd()));
    if (Status st = sc->start(); st != Status::kOk) return st;  // offer receives posted before "ready" leaves
    pc.comm = std::move(sc);
    const char ready = 'R';
    pc.sock->queue(&ready, 1);
  }
  if (pc.sock->flush(&why) != Status::kOk) {
    WEFT_WARN("connect to {} on {}: the handshake failed: {}", pc.peerName, d.props().name, why);
    return Status::kRemote;
  }
  if (!pc.sock->sent()) return Status::kOk;
  WEFT_INFO(NCCL_NET, "connected to {} on {} ({} QP{}, rdma writes)", pc.peerName, d.props().name,
            pc.comm->qpCount(), pc.comm->qpCount() == 1 ? "" : "s");
  *out = pc.comm.release();
  return Status::kOk;
}

bool VerbsBackend::stat(std::string_view key, long long* value) const {
  if (key == "verbs.stalls") {
    *value = stallCount().load(std::memory_order_relaxed);
    return true;
  }
  if (key != "flush_reads") return false;
  *value = VerbsRecvComm::flushReads();
  return true;
}

}  // namespace weft::verbs
