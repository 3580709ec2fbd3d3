// SPDX-License-Identifier: Apache-2.0
// A verbs connection's set-up: the handshake socket, the QPs and their connect, and the listen side's accept.
#include "verbs/verbs_comm.h"

#include "weft/nccl/net.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <ctime>

#include "weft/common/clock.h"
#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/transport/agreement.h"
#include "weft/transport/handle.h"

namespace weft::verbs {

// ---- handshake socket ------------------------------------------------------------------------------------------

HandshakeSocket::~HandshakeSocket() {
  if (fd_ >= 0) ::close(fd_);
}

void HandshakeSocket::queue(const void* data, size_t len) { out_.append(static_cast<const char*>(data), len); }

Status HandshakeSocket::flush(std::string* why) {
  while (!out_.empty()) {
    ssize_t n = ::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL);
    if (n > 0) {
      out_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Status::kOk;
    *why = n < 0 ? std::strerror(errno) : "connection closed";
    return Status::kRemote;
  }
  return Status::kOk;
}

bool HandshakeSocket::fill(size_t want, std::string* why) {
  char buf[256];
  while (in_.size() < want) {
    size_t ask = std::min(sizeof(buf), want - in_.size());
    ssize_t n = ::recv(fd_, buf, ask, 0);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      *why = "the peer closed the connection";
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
    *why = std::strerror(errno);
    return false;
  }
  return true;
}

void HandshakeSocket::take(void* out, size_t n) {
  if (out != nullptr) std::memcpy(out, in_.data(), n);
  in_.erase(0, n);
}

bool HandshakeSocket::readQpInfo(QpInfo* out, std::string* why) {
  if (!fill(QpInfo::kBytesV1, why)) return false;
  uint16_t version = 0;
  std::memcpy(&version, in_.data() + offsetof(QpInfo, version), sizeof(version));
  const size_t n = version >= 2 ? sizeof(QpInfo) : QpInfo::kBytesV1;
  if (!fill(n, why)) return false;
  *out = QpInfo{};
  take(out, n);
  return true;
}

// ---- QPs -------------------------------------------------------------------------------------------------------

QpSet::QpSet(VerbsDevice& d, int n, int swr, int rwr) : dev(d), nQps(n), sendWr(swr), recvWr(rwr) {}

QpSet::~QpSet() {
  const IbvApi& api = ibv();
  for (auto*& qp : qps) {
    if (qp != nullptr) api.destroyQp(qp);  // waits for any asynchronous event on it to be acknowledged
    qp = nullptr;
  }
  if (ownCq && cq != nullptr) api.destroyCq(cq);
  if (probeMr != nullptr) api.deregMr(probeMr);
}

Status QpSet::create(std::string* why) {
  const IbvApi& api = ibv();
  if (cq == nullptr) {
    int cqe = std::min(nQps * (sendWr + recvWr) + 16, std::max(dev.maxCqe(), 64));
    cq = api.createCq(dev.context(), cqe, nullptr, nullptr, 0);
    if (cq == nullptr) {
      *why = std::string("ibv_create_cq(") + std::to_string(cqe) + ") failed: " + std::strerror(errno);
      return Status::kSystem;
    }
    ownCq = true;
  }
  probeMr = api.regMr(dev.pd(), probeWord, sizeof(probeWord), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (probeMr == nullptr) {
    *why = std::string("registering the probe word failed: ") + std::strerror(errno);
    return Status::kSystem;
  }
  psn = static_cast<uint32_t>(randomToken()) & 0xffffff;  // PSNs are 24 bits
  for (int i = 0; i < nQps; ++i) {
    qps[i] = createRcQp(dev, cq, this, sendWr, recvWr, 64, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                        i == 0 ? &maxInline : nullptr, why);
    if (qps[i] == nullptr) return Status::kSystem;
  }
  return Status::kOk;
}

void QpSet::describe(QpInfo* info) const {
  info->nQps = static_cast<uint16_t>(nQps);
  for (int i = 0; i < nQps; ++i) info->qpn[i] = qps[i]->qp_num;
  info->psn = psn;
  info->lid = dev.lid();
  info->roce = dev.roce() ? 1 : 0;
  info->mtu = static_cast<uint8_t>(dev.activeMtu());
  std::memcpy(info->gid, dev.gid().raw, 16);
  info->probeAddr = reinterpret_cast<uintptr_t>(&probeWord[0]);
  info->probeRkey = probeMr->rkey;
}

Status QpSet::connect(const QpInfo& peer, int trafficClass, std::string* why) {
  peerProbeAddr = peer.probeAddr;
  peerProbeRkey = peer.probeRkey;
  for (int i = 0; i < nQps; ++i) {
    RcPeer rc;
    rc.qpn = peer.qpn[i];
    rc.psn = peer.psn;
    rc.lid = peer.lid;
    rc.roce = peer.roce != 0;
    rc.mtu = peer.mtu;
    std::memcpy(rc.gid, peer.gid, 16);
    if (!connectRcQp(dev, qps[i], rc, psn, trafficClass, 1, why)) return Status::kSystem;
  }
  return Status::kOk;
}

// ---- listen / accept -------------------------------------------------------------------------------------------

VerbsListenComm::VerbsListenComm(VerbsDevice& dev, oob::Socket listen, uint64_t token)
    : dev_(dev), listen_(std::move(listen)), token_(token) {}

Status VerbsListenComm::accept(RecvComm** out) {
  *out = nullptr;
  std::string why;
  if (!sock_) {
    sockaddr_storage sa{};
    socklen_t len = sizeof(sa);
    int fd = ::accept4(listen_.fd(), reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return Status::kOk;
      WEFT_WARN("accept on {} failed: {}", dev_.props().name, std::strerror(errno));
      return Status::kSystem;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sock_ = std::make_unique<HandshakeSocket>(fd);
    peerName_ = sockaddrString(reinterpret_cast<sockaddr*>(&sa));
    started_ = std::chrono::steady_clock::now();
  }
  auto drop = [&](const std::string& reason) {
    WEFT_WARN("accept on {}: the handshake from {} failed: {}", dev_.props().name, peerName_, reason);
    sock_.reset();
    qps_.reset();
    replied_ = false;
  };
  // Whether `n` bytes of the handshake are in; a connector that closes, fails, or stalls past the handshake
  // timeout is dropped (and accept keeps listening).
  auto notYet = [&](const char* waitingFor) {
    if (!why.empty()) {
      drop(why);
    } else if (std::chrono::steady_clock::now() - started_ > kHandshakeTimeout) {
      drop(std::string("no ") + waitingFor + " within " + std::to_string(kHandshakeTimeout.count()) + " s");
    }
  };
  auto arrived = [&](size_t n, const char* waitingFor) {
    if (sock_->fill(n, &why)) return true;
    notYet(waitingFor);
    return false;
  };
  QpInfo reply{};
  reply.magic = QpInfo::kMagic;
  reply.version = QpInfo::kVersion;
  reply.token = token_;
  auto answer = [&](uint32_t status) {  // best effort for refusals: the socket closes right after
    reply.status = status;
    sock_->queue(&reply, sizeof(reply));
    sock_->flush(&why);
  };
  if (!replied_) {
    QpInfo peer;
    if (!sock_->readQpInfo(&peer, &why)) {
      notYet("request");
      return Status::kOk;
    }
    if (peer.magic != QpInfo::kMagic || peer.version != QpInfo::kVersion || peer.nQps < 1 || peer.nQps > kMaxQps) {
      answer(QpInfo::kBadRequest);
      drop("not a weft verbs connection request of this version");
      return Status::kOk;
    }
    if (peer.token != token_) {
      answer(QpInfo::kWrongToken);
      WEFT_WARN("refused a connection from {} on {}: wrong token (a handle of another listen or job, or forged)",
                peerName_, dev_.props().name);
      sock_.reset();
      return Status::kOk;
    }
    reply.tunerDigest = transport::localDigest();  // in the refusal too: the connector names both digests
    if (!transport::agreesWith(peer.tunerDigest)) {
      // The real peer, tuning differently: told why (it fails its connect naming both), and this accept fails.
      WEFT_WARN("accept on {} from {}: {}", dev_.props().name, peerName_,
                transport::agreementMismatch(peer.tunerDigest, peerName_));
      answer(QpInfo::kTunerMismatch);
      sock_.reset();
      return Status::kInvalidUsage;
    }
    qps_ = VerbsRecvComm::makeQps(dev_, peer.nQps);
    Status st = qps_->create(&why);
    if (st == Status::kOk) st = qps_->connect(peer, static_cast<int>(peer.trafficClass) - 1, &why);
    if (st != Status::kOk) {
      WEFT_WARN("accept on {} from {}: {}", dev_.props().name, peerName_, why);
      answer(QpInfo::kNoResources);
      sock_.reset();
      qps_.reset();
      return st;
    }
    qps_->describe(&reply);
    reply.status = QpInfo::kAccepted;
    sock_->queue(&reply, sizeof(reply));
    replied_ = true;
  }
  if (sock_->flush(&why) != Status::kOk) {
    drop(why);
    return Status::kOk;
  }
  if (!arrived(1, "confirmation")) return Status::kOk;
  sock_->take(nullptr, 1);
  std::unique_ptr<VerbsRecvComm> rc(numa::make<VerbsRecvComm>(dev_.props().numaNode, std::move(qps_), peerName_));
  rc->setLocalName(localAddressOf(sock_->fd()));
  if (Status st = rc->start(); st != Status::kOk) return st;
  WEFT_INFO(NCCL_NET, "accepted a connection from {} on {} ({} QP{})", peerName_, dev_.props().name,
            rc->qpCount(), rc->qpCount() == 1 ? "" : "s");
  sock_.reset();
  replied_ = false;
  *out = rc.release();
  return Status::kOk;
}

}  // namespace weft::verbs
