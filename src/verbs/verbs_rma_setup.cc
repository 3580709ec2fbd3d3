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

class VerbsRmaListen final : public rma::RmaListen {
 public:
  VerbsRmaListen(int dev, int fd, uint64_t token) : dev_(dev), fd_(fd), token_(token) {}
  ~VerbsRmaListen() override {
    if (fd_ >= 0) ::close(fd_);
  }
  int dev() const override { return dev_; }
  int fd() const { return fd_; }
  uint64_t token() const { return token_; }

 private:
  int dev_;
  int fd_;
  uint64_t token_;
};

// The ring's sockets at connect: blocking steps on non-blocking sockets, each bounded by the connect's deadline.
class RingSocket {
 public:
  explicit RingSocket(int fd = -1) : fd_(fd) {}
  ~RingSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  RingSocket(const RingSocket&) = delete;
  RingSocket& operator=(const RingSocket&) = delete;
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int fd() const { return fd_; }
  // Moves exactly n bytes; false with *why on failure or when the deadline passed.
  bool move(bool send, void* buf, size_t n, std::chrono::steady_clock::time_point deadline, std::string* why) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = send ? ::send(fd_, static_cast<char*>(buf) + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                       : ::recv(fd_, static_cast<char*>(buf) + done, n - done, MSG_DONTWAIT);
      if (r > 0) {
        done += static_cast<size_t>(r);
        continue;
      }
      if (r == 0 && !send) {
        *why = "the neighbour closed its socket";
        return false;
      }
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        *why = std::strerror(errno);
        return false;
      }
      if (!wait(send ? POLLOUT : POLLIN, deadline, why)) return false;
    }
    return true;
  }
  bool wait(short events, std::chrono::steady_clock::time_point deadline, std::string* why) {
    return waitFd(fd_, events, deadline, why);
  }
  // Waits (up to a second at a time) for `events` on fd; false with *why once the deadline passed or poll failed.
  static bool waitFd(int fd, short events, std::chrono::steady_clock::time_point deadline, std::string* why) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *why = "WEFT_CONNECT_TIMEOUT passed";
      return false;
    }
    pollfd p{fd, events, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0 && errno != EINTR) {
      *why = std::strerror(errno);
      return false;
    }
    return true;
  }

 private:
  int fd_;
};

// What a rank says first on its ring socket to the next one.
struct RingHello {
  static constexpr uint32_t kMagic = 0x57465652;  // "WFVR"
  uint32_t magic;
  uint32_t rank;
  uint64_t token;   // the listener's, from its handle
  uint64_t commId;
  uint32_t nranks;
  uint32_t reserved;
};

}  // namespace

std::unique_ptr<VerbsRmaTransport> VerbsRmaTransport::discover(std::string* why) {
  auto devs = VerbsDevice::discover(why);
  if (devs.empty()) return nullptr;
  auto t = std::unique_ptr<VerbsRmaTransport>(new VerbsRmaTransport());
  const int maxRecvs = static_cast<int>(params::getInt("WEFT_MAX_RECVS"));
  for (auto& d : devs) {
    const_cast<DeviceProps&>(d->props()).maxRecvs = maxRecvs;
    t->devices_.push_back(std::move(d));
  }
  return t;
}

Status VerbsRmaTransport::listen(int dev, void* handle, rma::RmaListen** out) {
  if (dev < 0 || dev >= deviceCount() || handle == nullptr || out == nullptr) {
    WEFT_WARN("RMA listen: device {} does not exist (weft's RMA has {} devices)", dev, deviceCount());
    return Status::kInternal;
  }
  const VerbsDevice& d = *devices_[static_cast<size_t>(dev)];
  sockaddr_storage sa = d.handshakeAddr();
  socklen_t len = d.handshakeAddrLen();
  if (sa.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&sa)->sin_port = 0;
  if (sa.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port = 0;
  int fd = bindTcpSocket(sa, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0 || ::listen(fd, 64) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    WEFT_WARN("RMA listen on {}: cannot open a listening socket at {}: {}", d.props().name,
              sockaddrString(reinterpret_cast<const sockaddr*>(&d.handshakeAddr()), false), std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return Status::kSystem;
  }
  WireHandle h;
  h.backend = BackendId::kVerbs;
  h.providerHash = rmaProviderHash();
  h.token = randomToken();
  h.addrLen = static_cast<uint16_t>(len);
  std::memcpy(h.addr.data(), &sa, std::min<size_t>(len, h.addr.size()));
  h.encode(handle);
  *out = new VerbsRmaListen(dev, fd, h.token);
  WEFT_INFO(NCCL_NET, "RMA: listening on {} at {}", d.props().name, sockaddrString(reinterpret_cast<sockaddr*>(&sa)));
  return Status::kOk;
}

Status VerbsRmaTransport::connect(void* const* handles, int nranks, int rank, rma::RmaListen* listenBase,
                                  uint64_t commId, rma::RmaComm** out) {
  auto* listen = dynamic_cast<VerbsRmaListen*>(listenBase);
  if (handles == nullptr || out == nullptr || listen == nullptr || nranks < 1 || rank < 0 || rank >= nranks) {
    WEFT_WARN("RMA connect: called with rank {} of {}, handles {}, listen comm {}", rank, nranks,
              static_cast<const void*>(handles), static_cast<const void*>(listenBase));
    return Status::kInternal;
  }
  VerbsDevice& d = *devices_[static_cast<size_t>(listen->dev())];
  const int next = (rank + 1) % nranks;
  WireHandle nh;
  if (handles[next] == nullptr || decodeForConnect(handles[next], d.props().name, BackendId::kVerbs, rmaProviderHash(),
                                                   "weft's verbs RMA", &nh) != Status::kOk) {
    WEFT_WARN("RMA connect (rank {} of {}): rank {}'s handle is not one of this transport's", rank, nranks, next);
    return Status::kInvalidUsage;
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(std::max<int64_t>(1, params::getInt("WEFT_CONNECT_TIMEOUT")));
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
  // The ring: a socket to the next rank, one accepted from the previous.
  RingSocket toNext, fromPrev;
  {
    sockaddr_storage sa{};
    std::memcpy(&sa, nh.addr.data(), std::min<size_t>(nh.addrLen, sizeof(sa)));
    int fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      return failed("a socket to the next rank");
    }
    toNext.reset(fd);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), nh.addrLen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      return failed("connecting to the next rank");
    }
    RingHello hello{RingHello::kMagic, static_cast<uint32_t>(rank), nh.token, commId, static_cast<uint32_t>(nranks), 0};
    if (!toNext.move(true, &hello, sizeof(hello), deadline, &why)) return failed("the hello to the next rank");
  }
  for (;;) {
    int fd = ::accept4(listen->fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        why = std::strerror(errno);
        return failed("accepting the previous rank");
      }
      if (!RingSocket::waitFd(listen->fd(), POLLIN, deadline, &why)) return failed("waiting for the previous rank");
      continue;
    }
    fromPrev.reset(fd);
    RingHello hello{};
    if (!fromPrev.move(false, &hello, sizeof(hello), deadline, &why)) return failed("the previous rank's hello");
    if (hello.magic != RingHello::kMagic || hello.token != listen->token() || hello.commId != commId ||
        hello.nranks != static_cast<uint32_t>(nranks) ||
        hello.rank != static_cast<uint32_t>((rank - 1 + nranks) % nranks)) {
      WEFT_WARN("RMA connect (rank {} of {}): refused a connection that is not this comm's previous rank (rank {} of "
                "{}, comm {:#x})",
                rank, nranks, hello.rank, hello.nranks, hello.commId);
      fromPrev.reset(-1);
      continue;  // a stray: keep waiting for the right one
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    break;
  }
  // The allgather: N - 1 steps, each passing on what came in the step before (rank r's record first).
  const size_t recBytes = sizeof(VerbsRmaPeerInfo) + sizeof(uint32_t) * static_cast<size_t>(nranks);
  std::vector<VerbsRmaPeerInfo> infos(static_cast<size_t>(nranks));
  std::vector<std::vector<uint32_t>> qpns(static_cast<size_t>(nranks));
  std::vector<char> outRec(recBytes), inRec(recBytes);
  infos[static_cast<size_t>(rank)] = self;
  qpns[static_cast<size_t>(rank)] = myQpns;
  std::memcpy(outRec.data(), &self, sizeof(self));
  std::memcpy(outRec.data() + sizeof(self), myQpns.data(), sizeof(uint32_t) * myQpns.size());
  for (int step = 1; step < nranks; ++step) {
    // Send and receive at once in pieces, so that no ring of full socket buffers can block everyone.
    size_t sent = 0, got = 0;
    while (sent < recBytes || got < recBytes) {
      if (sent < recBytes) {
        ssize_t r = ::send(toNext.fd(), outRec.data() + sent, recBytes - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) sent += static_cast<size_t>(r);
        else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          why = std::strerror(errno);
          return failed("the QP allgather (to the next rank)");
        }
      }
      if (got < recBytes) {
        ssize_t r = ::recv(fromPrev.fd(), inRec.data() + got, recBytes - got, MSG_DONTWAIT);
        if (r > 0) got += static_cast<size_t>(r);
        else if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          why = r == 0 ? "the previous rank closed its socket" : std::strerror(errno);
          return failed("the QP allgather (from the previous rank)");
        }
      }
      if (sent < recBytes || got < recBytes) {
        pollfd p[2] = {{toNext.fd(), static_cast<short>(sent < recBytes ? POLLOUT : 0), 0},
                       {fromPrev.fd(), static_cast<short>(got < recBytes ? POLLIN : 0), 0}};
        if (std::chrono::steady_clock::now() > deadline) {
          why = "WEFT_CONNECT_TIMEOUT passed";
          return failed("the QP allgather");
        }
        ::poll(p, 2, 100);
      }
    }
    const size_t origin = static_cast<size_t>((rank - step + nranks) % nranks);
    std::memcpy(&infos[origin], inRec.data(), sizeof(VerbsRmaPeerInfo));
    qpns[origin].resize(static_cast<size_t>(nranks));
    std::memcpy(qpns[origin].data(), inRec.data() + sizeof(VerbsRmaPeerInfo), sizeof(uint32_t) * nranks);
    outRec.swap(inRec);
  }
  if (Status st = comm->connectQps(infos, qpns); st != Status::kOk) return st;
  // Twice round the ring: after the first every rank's QPs are ready to receive, after the second everyone knows.
  for (int round = 0; round < 2; ++round) {
    uint8_t token = 1;
    if (rank == 0) {
      if (!toNext.move(true, &token, 1, deadline, &why)) return failed("the ready token");
      if (!fromPrev.move(false, &token, 1, deadline, &why)) return failed("the ready token");
    } else {
      if (!fromPrev.move(false, &token, 1, deadline, &why)) return failed("the ready token");
      if (!toNext.move(true, &token, 1, deadline, &why)) return failed("the ready token");
    }
  }
  WEFT_INFO(NCCL_INIT | NCCL_NET, "RMA: rank {} of {} connected over {} (a QP to each rank)", rank, nranks,
            d.props().name);
  *out = comm.release();
  return Status::kOk;
}

// ---- the comm's set-up ------------------------------------------------------------------------------------------

VerbsRmaComm::VerbsRmaComm(int rank, int nranks, uint64_t commId, VerbsDevice& dev)
    : ProviderComm(rank, nranks, commId, dev.props(), 0x57465652),
      dev_(dev),
      atomics_(dev.atomics() && params::getString("WEFT_RMA_SIGNAL") != "message"),
      peers_(static_cast<size_t>(nranks)),
      recvBuf_(static_cast<size_t>(nranks) * kRecvs),
      sendBuf_(kSendWr) {}

VerbsRmaComm::~VerbsRmaComm() {
  const IbvApi& api = ibv();
  for (auto& p : peers_) {
    if (p.qp != nullptr) api.destroyQp(p.qp);
  }
  for (auto& [w, reg] : regs_) {
    if (reg->mr != nullptr) api.deregMr(reg->mr);
  }
  if (recvMr_ != nullptr) api.deregMr(recvMr_);
  if (sendMr_ != nullptr) api.deregMr(sendMr_);
  if (scratchMr_ != nullptr) api.deregMr(scratchMr_);
  if (cq_ != nullptr) api.destroyCq(cq_);
}

Status VerbsRmaComm::createQps(VerbsRmaPeerInfo* self, std::vector<uint32_t>* qpns) {
  const IbvApi& api = ibv();
  const int sendWr = std::min(kSendWr, dev_.maxQpWr());
  const int cqe = std::min(dev_.maxCqe(), nranks_ * (sendWr + kRecvs) + 64);
  cq_ = api.createCq(dev_.context(), cqe, nullptr, nullptr, 0);
  if (cq_ == nullptr) {
    WEFT_WARN("RMA connect on {}: ibv_create_cq({}) failed: {}", dev_.props().name, cqe, std::strerror(errno));
    return Status::kSystem;
  }
  const int local = IBV_ACCESS_LOCAL_WRITE;
  recvMr_ = api.regMr(dev_.pd(), recvBuf_.data(), recvBuf_.size() * sizeof(rma::RingMsg), local);
  sendMr_ = api.regMr(dev_.pd(), sendBuf_.data(), sendBuf_.size() * sizeof(rma::RingMsg), local);
  scratchMr_ = api.regMr(dev_.pd(), scratch_, sizeof(scratch_), local);
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
    ibv_qp* qp = createRcQp(dev_, cq_, this, sendWr, kRecvs, 0,
                            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC, nullptr, &why);
    if (qp == nullptr) {
      WEFT_WARN("RMA connect on {}: the QP for rank {}: {}", dev_.props().name, r, why);
      return Status::kSystem;
    }
    peers_[static_cast<size_t>(r)].qp = qp;
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
    if (!connectRcQp(dev_, peers_[static_cast<size_t>(r)].qp, rc, myPsn, 0, 16, &why)) {
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
    if (Status st = dev_.registerRma(reinterpret_cast<uintptr_t>(w->base), w->size,
                                     w->cuda ? rma::kPtrCuda : rma::kPtrHost, dmabufFd, &reg->mr);
        st != Status::kOk) {
      return st;
    }
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
  if (it->second->mr != nullptr) ibv().deregMr(it->second->mr);
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
