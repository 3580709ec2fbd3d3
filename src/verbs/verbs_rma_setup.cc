// SPDX-License-Identifier: Apache-2.0
// Setting up the device API's verbs transport: devices, listen, the collective connect over a ring of TCP sockets,
// window registration and teardown (verbs_rma.h says how it works).
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "verbs/verbs_rma.h"
#include "weft/common/clock.h"
#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"

namespace weft::verbs {
namespace {

uint32_t rmaProviderHash() { return fnv1a32("weft-rma-verbs-rc", 17); }

}  // namespace

std::unique_ptr<VerbsRmaTransport> VerbsRmaTransport::discover(std::string* why) {
  auto devs = VerbsDevice::discover(why);
  if (devs.empty()) return nullptr;
  auto t = std::unique_ptr<VerbsRmaTransport>(new VerbsRmaTransport());
  // Each device's properties already say WEFT_MAX_RECVS (VerbsDevice::fillProps), as the device API wants them.
  for (auto& d : devs) t->devices_.push_back(std::move(d));
  return t;
}

Status VerbsRmaTransport::listen(int dev, void* handle, rma::RmaListen** out) {
  if (dev < 0 || dev >= deviceCount() || handle == nullptr || out == nullptr) {
    WEFT_WARN("RMA listen: device {} does not exist (weft's RMA has {} devices)", dev, deviceCount());
    return Status::kInternal;
  }
  const VerbsDevice& d = *devices_[static_cast<size_t>(dev)];
  sockaddr_storage sa = d.handshakeAddr();
  if (sa.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&sa)->sin_port = 0;
  if (sa.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port = 0;
  oob::Listener l;
  if (Status st = oob::Listener::open(sa, d.handshakeAddrLen(), 64, nullptr, d.props().name, "RMA listen", &l);
      st != Status::kOk) {
    return st;
  }
  *out = rma::SocketListen::publish(dev, std::move(l), BackendId::kVerbs, rmaProviderHash(), d.props().name, handle);
  return Status::kOk;
}

Status VerbsRmaTransport::connect(void* const* handles, int nranks, int rank, rma::RmaListen* listenBase,
                                  uint64_t commId, rma::RmaComm** out) {
  rma::SocketListen* listen = rma::SocketListen::forConnect(handles, nranks, rank, listenBase, out);
  if (listen == nullptr) return Status::kInternal;
  VerbsDevice& d = *devices_[static_cast<size_t>(listen->dev())];
  const int next = (rank + 1) % nranks;
  WireHandle nh;
  sockaddr_storage nextAddr{};
  socklen_t nextLen = 0;
  if (handles[next] == nullptr ||
      decodeForConnect(handles[next], d.props().name, BackendId::kVerbs, rmaProviderHash(), "weft's verbs RMA", &nh) !=
          Status::kOk ||
      !oob::handleAddress(nh, &nextAddr, &nextLen)) {
    WEFT_WARN("RMA connect (rank {} of {}): rank {}'s handle is not one of this transport's", rank, nranks, next);
    return Status::kInvalidUsage;
  }
  const oob::Deadline deadline = oob::connectDeadline();
  std::string why;
  auto failed = [&](const char* step) {
    WEFT_WARN("RMA connect (rank {} of {}) on {}: {}: {}", rank, nranks, d.props().name, step, why);
    return Status::kRemote;
  };
  auto comm = std::make_unique<VerbsRmaComm>(rank, nranks, commId, d);
  VerbsRmaPeerInfo self{};
  std::vector<uint32_t> myQpns;
  if (Status st = comm->createQps(&self, &myQpns); st != Status::kOk) return st;
  if (nranks == 1) {
    if (Status st = comm->connectQps({self}, {myQpns}); st != Status::kOk) return st;
    *out = comm.release();
    return Status::kOk;
  }
  oob::Ring ring;
  if (!ring.open(listen->listener(), nextAddr, nextLen, nh.token, rank, nranks, commId, deadline, &why)) {
    return failed("the ring");
  }
  // Every rank's record: its QP attributes, then the number of its QP for each rank.
  const size_t recBytes = sizeof(VerbsRmaPeerInfo) + sizeof(uint32_t) * static_cast<size_t>(nranks);
  std::vector<char> mine(recBytes), all;
  std::memcpy(mine.data(), &self, sizeof(self));
  std::memcpy(mine.data() + sizeof(self), myQpns.data(), sizeof(uint32_t) * myQpns.size());
  if (!ring.allgather(mine.data(), recBytes, &all, deadline, &why)) return failed("the QP allgather");
  std::vector<VerbsRmaPeerInfo> infos(static_cast<size_t>(nranks));
  std::vector<std::vector<uint32_t>> qpns(static_cast<size_t>(nranks), std::vector<uint32_t>(nranks));
  for (size_t r = 0; r < infos.size(); ++r) {
    const char* rec = all.data() + r * recBytes;
    std::memcpy(&infos[r], rec, sizeof(VerbsRmaPeerInfo));
    std::memcpy(qpns[r].data(), rec + sizeof(VerbsRmaPeerInfo), sizeof(uint32_t) * static_cast<size_t>(nranks));
  }
  if (Status st = comm->connectQps(infos, qpns); st != Status::kOk) return st;
  // After the barrier every rank's QPs are ready to receive.
  if (!ring.barrier(deadline, &why)) return failed("the ready barrier");
  WEFT_INFO(NCCL_INIT | NCCL_NET, "RMA: rank {} of {} connected over {} (a QP to each rank)", rank, nranks,
            d.props().name);
  *out = comm.release();
  return Status::kOk;
}

// ---- the comm's set-up ------------------------------------------------------------------------------------------

VerbsRmaComm::VerbsRmaComm(int rank, int nranks, uint64_t commId, VerbsDevice& dev)
    : ProviderCommOf(rank, nranks, commId, dev.props(), 0x57465652),
      dev_(dev),
      atomics_(dev.atomics() && params::getString("WEFT_RMA_SIGNAL") != "message"),
      peers_(static_cast<size_t>(nranks)),
      recvBuf_(static_cast<size_t>(nranks) * kRecvs),
      sendBuf_(kSendWr) {}

VerbsRmaComm::~VerbsRmaComm() {
  // The QPs go first, as before any of the memory they could reach; the members then go in reverse order.
  for (auto& p : peers_) p.qp.reset();
  regs_.clear();
}

Status VerbsRmaComm::createQps(VerbsRmaPeerInfo* self, std::vector<uint32_t>* qpns) {
  const IbvApi& api = ibv();
  const int sendWr = std::min(kSendWr, dev_.maxQpWr());
  const int cqe = std::min(dev_.maxCqe(), nranks_ * (sendWr + kRecvs) + 64);
  cq_.reset(api.createCq(dev_.context(), cqe, nullptr, nullptr, 0));
  if (cq_ == nullptr) {
    WEFT_WARN("RMA connect on {}: ibv_create_cq({}) failed: {}", dev_.props().name, cqe, std::strerror(errno));
    return Status::kSystem;
  }
  const int local = IBV_ACCESS_LOCAL_WRITE;
  recvMr_.reset(api.regMr(dev_.pd(), recvBuf_.data(), recvBuf_.size() * sizeof(rma::RingMsg), local));
  sendMr_.reset(api.regMr(dev_.pd(), sendBuf_.data(), sendBuf_.size() * sizeof(rma::RingMsg), local));
  scratchMr_.reset(api.regMr(dev_.pd(), scratch_, sizeof(scratch_), local));
  if (recvMr_ == nullptr || sendMr_ == nullptr || scratchMr_ == nullptr) {
    WEFT_WARN("RMA connect on {}: registering the control buffers failed: {}", dev_.props().name, std::strerror(errno));
    return Status::kSystem;
  }
  self->psn = static_cast<uint32_t>(randomToken()) & 0xffffff;
  self->lid = dev_.lid();
  self->roce = dev_.roce() ? 1 : 0;
  self->mtu = static_cast<uint8_t>(dev_.activeMtu());
  std::memcpy(self->gid, dev_.gid().raw, 16);
  qpns->resize(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) {
    std::string why;
    ibv_qp* qp = createRcQp(dev_, cq_.get(), this, sendWr, kRecvs, 0,
                            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC, nullptr, &why);
    if (qp == nullptr) {
      WEFT_WARN("RMA connect on {}: the QP for rank {}: {}", dev_.props().name, r, why);
      return Status::kSystem;
    }
    peers_[static_cast<size_t>(r)].qp.reset(qp);
    (*qpns)[static_cast<size_t>(r)] = qp->qp_num;
    for (uint32_t s = 0; s < kRecvs; ++s) {
      if (Status st = postRecv(static_cast<uint32_t>(r), s); st != Status::kOk) return st;
    }
  }
  return Status::kOk;
}

Status VerbsRmaComm::connectQps(const std::vector<VerbsRmaPeerInfo>& infos,
                                const std::vector<std::vector<uint32_t>>& qpns) {
  const uint32_t myPsn = infos[static_cast<size_t>(rank_)].psn;
  for (int r = 0; r < nranks_; ++r) {
    const VerbsRmaPeerInfo& p = infos[static_cast<size_t>(r)];
    RcPeer rc;
    rc.qpn = qpns[static_cast<size_t>(r)][static_cast<size_t>(rank_)];
    rc.psn = p.psn;
    rc.lid = p.lid;
    rc.roce = p.roce != 0;
    rc.mtu = p.mtu;
    std::memcpy(rc.gid, p.gid, 16);
    // Gets and signals (reads and fetch-and-adds) keep up to 16 in flight each way.
    std::string why;
    if (!connectRcQp(dev_, peers_[static_cast<size_t>(r)].qp.get(), rc, myPsn, 0, 16, &why)) {
      WEFT_WARN("RMA connect on {}: the QP to rank {}: {}", dev_.props().name, r, why);
      return Status::kSystem;
    }
    peers_[static_cast<size_t>(r)].heardMs = coarseNowMs();
  }
  return Status::kOk;
}

// ---- windows -------------------------------------------------------------------------------------------------------

Status VerbsRmaComm::registerWindow(rma::Window* w, int dmabufFd, uint64_t* addr, uint64_t* key) {
  auto reg = std::make_unique<WindowReg>();
  reg->remote.resize(static_cast<size_t>(nranks_));
  if (w->size > 0) {
    ibv_mr* mr = nullptr;
    if (Status st = dev_.registerRma(reinterpret_cast<uintptr_t>(w->base), w->size,
                                     w->cuda ? rma::kPtrCuda : rma::kPtrHost, dmabufFd, &mr);
        st != Status::kOk) {
      return st;
    }
    reg->mr.reset(mr);
  }
  *addr = reinterpret_cast<uint64_t>(w->base);
  *key = reg->mr != nullptr ? reg->mr->rkey : 0;
  std::lock_guard<std::mutex> lock(mu_);
  regs_[w] = std::move(reg);
  return Status::kOk;
}

void VerbsRmaComm::forgetWindow(rma::Window* w) {
  auto it = regs_.find(w);
  if (it == regs_.end()) return;
  regs_.erase(it);
}

void VerbsRmaComm::setRemote(rma::Window* w, uint32_t rank, uint64_t addr, uint64_t key) {
  if (auto it = regs_.find(w); it != regs_.end()) it->second->remote[rank] = {addr, static_cast<uint32_t>(key)};
}

bool VerbsRmaComm::sendsDrained() const {
  if (!backlog_.empty()) return false;
  for (const auto& p : peers_) {
    if (p.sendsOut > 0 && !p.lost) return false;
  }
  return true;
}

}  // namespace weft::verbs
