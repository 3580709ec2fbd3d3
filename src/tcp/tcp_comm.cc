// SPDX-License-Identifier: Apache-2.0
// The TCP backend's comms: what send and receive comms share, and the listen (tcp_comm.h says how it works).
#include "tcp/tcp_comm.h"

#include <netinet/tcp.h>
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "weft/common/clock.h"
#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"
#include "tcp/tcp_acceptor.h"
#include "tcp/tcp_helpers.h"
#include "tcp/tcp_util.h"

namespace weft::tcp {

Counters& counters() {
  static Counters* c = new Counters;  // never destroyed: comms may close during exit
  return *c;
}

using detail::add;

Hello helloRequest(uint64_t token, uint64_t nonce, int flow, int flows, int ifaces) {
  Hello h{};
  h.magic = Hello::kMagic;
  h.version = Hello::kVersion;
  h.status = Hello::kRequest;
  h.token = token;
  h.tunerDigest = transport::localDigest();
  h.nonce = nonce;
  h.flow = static_cast<uint8_t>(flow);
  h.flows = static_cast<uint8_t>(flows);
  h.ifaces = static_cast<uint8_t>(ifaces);
  return h;
}

// ---- socket options ---------------------------------------------------------------------------------------------

SocketOptions SocketOptions::fromParams() {
  SocketOptions o;
  o.peerTimeoutSec = static_cast<int>(params::getInt("WEFT_PEER_TIMEOUT"));
  const int64_t probeMs = params::getInt("WEFT_PROBE_INTERVAL");
  o.keepIdleSec = static_cast<int>(std::clamp<int64_t>((probeMs + 999) / 1000, 1, 32767));
  o.sockBuf = static_cast<int>(params::getInt("WEFT_TCP_SOCKBUF"));
  o.busyPollUs = static_cast<int>(params::getInt("WEFT_TCP_BUSY_POLL"));
  o.writeMax = static_cast<size_t>(params::getInt("WEFT_TCP_WRITE_MAX"));
  o.stripeMin = static_cast<uint64_t>(params::getInt("WEFT_STRIPE_MIN"));
  o.chunk = static_cast<uint32_t>(params::getInt("WEFT_TCP_CHUNK"));
  o.notsentLowat = static_cast<int>(params::getInt("WEFT_TCP_NOTSENT_LOWAT"));
  return o;
}

void SocketOptions::applyEarly(int fd) const {
  if (sockBuf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockBuf, sizeof(sockBuf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockBuf, sizeof(sockBuf));
  }
}

void SocketOptions::applyFlow(int fd) const {
  if (notsentLowat > 0) setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &notsentLowat, sizeof(notsentLowat));
}

void SocketOptions::applyConnected(int fd) const {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // A silent peer (host down, link cut, no reset ever comes): unacknowledged data fails after the peer timeout;
  // an idle connection (a receiver waiting) sends keepalive probes from WEFT_PROBE_INTERVAL on, one a second, and
  // fails when none is answered within the peer timeout (TCP_USER_TIMEOUT bounds those too).
  unsigned userTimeoutMs = static_cast<unsigned>(peerTimeoutSec) * 1000u;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeoutMs, sizeof(userTimeoutMs));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  // (No TCP_KEEPCNT: with TCP_USER_TIMEOUT set, Linux ends a connection on unanswered keepalives by that timeout.)
  int idle = keepIdleSec, intvl = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  if (busyPollUs > 0 && setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &busyPollUs, sizeof(busyPollUs)) != 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      WEFT_WARN("WEFT_TCP_BUSY_POLL={}: SO_BUSY_POLL refused ({}); sockets poll as usual", busyPollUs,
                std::strerror(errno));
    }
  }
}

// ---- requests and the comm's pool --------------------------------------------------------------------------------

Status TcpRequest::test(bool* done, int* sizes) {
  if (comm == nullptr || !inUse) {
    WEFT_WARN("test of a request that is not in flight (tested again after it completed?)");
    return Status::kInternal;
  }
  return comm->testRequest(this, done, sizes);
}

TcpDataComm::TcpDataComm(TcpDevice& dev, std::vector<int> fds, int flows, int ifaces, std::string peerName)
    : dev_(dev), nFlows_(std::clamp(std::max(flows, static_cast<int>(fds.size())), 1, kMaxFlows)),
      ready_(static_cast<int>(fds.size())), nIfaces_(std::clamp(ifaces, 1, kMaxRails)),
      peerName_(std::move(peerName)), pool_(kMaxPool, dev.props.numaNode) {
  flows_ = numa::makeArray<Flow>(static_cast<size_t>(nFlows_), dev.props.numaNode);
  if (!flows_) {
    for (int fd : fds) ::close(fd);
    throw std::bad_alloc();
  }
  for (int k = 0; k < nFlows_; ++k) {
    flows_[k].fd = static_cast<size_t>(k) < fds.size() ? fds[k] : -1;
    flows_[k].ready = flows_[k].fd >= 0;
    flows_[k].iface = static_cast<uint8_t>(k % nIfaces_);
  }
  for (int j = 0; j < nIfaces_; ++j) {
    health_[j].setDevice(static_cast<size_t>(j) < dev_.rails.size() ? dev_.rails[j].ifname.c_str()
                                                                     : dev_.props.name.c_str());
  }
  add(counters().commsOpen, 1);
  add(counters().flowsOpen, ready_);
  stallMs_ = params::getInt("WEFT_STALL_S") * 1000;
  if (!fds.empty()) localName_ = localAddressOf(fds[0]);
}

TcpDataComm::~TcpDataComm() {
  for (int k = 0; k < nFlows_; ++k) {
    if (flows_[k].fd >= 0) ::close(flows_[k].fd);
  }
  add(counters().commsOpen, -1);
  add(counters().flowsOpen, -ready_);
}

TcpRequest* TcpDataComm::acquire() {
  TcpRequest* r = pool_.takeRequest([this](TcpRequest& q, size_t i) {
    q.comm = this;
    q.magic_ = kRequestMagic;
    q.poolIndex = static_cast<uint16_t>(i);
  });
  if (r == nullptr) return nullptr;  // NCCL retries a NULL request
  r->next = nullptr;
  r->inUse = true;
  r->complete = false;
  if (stallMs_ > 0) r->postedMs = coarseNowMs();
  return r;
}

void TcpDataComm::release(TcpRequest* r) {
  if (stall_.over()) {  // a request is over: so is the stall (the next one counts from the next look)
    WEFT_INFO(NCCL_NET, "connection with {} on {}: requests complete again", peerName_, dev_.props.name);
    quietSinceMs_ = 0;
  }
  r->inUse = false;
  r->next = nullptr;
  pool_.giveBack(r->poolIndex);
}

void TcpDataComm::fail(Status st, const std::string& why) {
  if (fatal_ != Status::kOk) return;
  fatal_ = st;
  if (st == Status::kRemote) stall_.lostPeer();
  WEFT_WARN("connection with {} on {} failed: {}", peerName_, dev_.props.name, why);
  detachHelpers();  // nothing moves on a failed comm: its buffers are NCCL's again
}

void TcpDataComm::helpFlow(int k, bool send) {
  if (!dev_.helpers || k < 1 || k >= nFlows_ || flows_[k].task != nullptr || flows_[k].fd < 0) return;
  if (!tasks_) tasks_.reset(new FlowTask[static_cast<size_t>(nFlows_)]);
  FlowTask& t = tasks_[k];
  t.fd = flows_[k].fd;
  t.send = send;
  if (dev_.helpers->attach(&t)) flows_[k].task = &t;
}

// The flows keep their tasks (a flow once helped is never moved inline: its state is the task's).
void TcpDataComm::detachHelpers() {
  if (!tasks_) return;
  for (int k = 1; k < nFlows_; ++k) {
    if (flows_[k].task != nullptr) dev_.helpers->detach(flows_[k].task);
  }
}

// The interface of a comm over several is marked down by what failed one of its flows (its health,
// weft/common/rail_health.h). A socket cannot come back: no recovery here (docs/failover.md).
void TcpDataComm::flowDown(int k, RailEvent why) {
  if (nIfaces_ > 1 && k >= 0 && k < nFlows_) health_[flows_[k].iface].markDown(why);
}

std::string TcpDataComm::flowName(int k) const {
  if (nFlows_ <= 1) return {};
  std::string s = " (flow " + std::to_string(k) + " of " + std::to_string(nFlows_);
  if (nIfaces_ > 1) s += ", " + dev_.rails[flows_[k].iface % dev_.rails.size()].ifname;
  return s + ")";
}

void TcpDataComm::failErrno(int err, const char* call, int k) {
  const bool peer = err == EPIPE || err == ECONNRESET || err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH;
  const bool unreachable = err == EHOSTUNREACH || err == ENETUNREACH;
  flowDown(k, err == ETIMEDOUT ? RailEvent::kProbeLost
              : unreachable ? RailEvent::kLinkDown
              : peer        ? RailEvent::kPeerGone
                            : RailEvent::kErrorCompletion);
  std::string why = std::string(call) + flowName(k) + ": " + std::strerror(err);
  if (err == ETIMEDOUT) {
    why += " (the peer stopped answering: host or link down)";
  } else if (unreachable) {
    why += " (no way to the peer: a link or route on the way is down)";
  } else if (peer) {
    why += " (the peer closed the connection: its process ended or aborted)";
  }
  fail(peer ? Status::kRemote : Status::kSystem, why);
}

Status TcpDataComm::testRequest(TcpRequest* r, bool* done, int* sizes) {
  *done = false;
  if (!r->complete) progress();
  if (!r->complete) {
    if (fatal_ == Status::kOk) {
      if (stallMs_ > 0 && (++stallTick_ & 255) == 0) watchStall(r);
      return Status::kOk;
    }
    // The request is NCCL's no more once an error is reported: it leaves the queues and returns to the pool.
    forget(r);
    release(r);
    return fatal_;
  }
  *done = true;
  if (sizes != nullptr) {
    if (r->n == 0) {
      sizes[0] = static_cast<int>(std::min<uint64_t>(r->size, INT_MAX));
    } else {
      for (int i = 0; i < r->n; ++i) sizes[i] = static_cast<int>(std::min<uint64_t>(r->got[i], INT_MAX));
    }
  }
  release(r);
  return Status::kOk;
}

// Bytes that moved since the last look (a system call of the comm's, or a helper inside a piece) end a quiet spell;
// a request waits from its posting at the earliest (a comm that sat idle, untested, is not stalled).
void TcpDataComm::watchStall(TcpRequest* r) {
  const int64_t now = coarseNowMs();
  const uint64_t sig = movedSignature();
  if (sig != movedSeen_ || quietSinceMs_ == 0) {
    if (stall_.over()) {
      WEFT_INFO(NCCL_NET, "connection with {} on {}: bytes move again after {} s", peerName_, dev_.props.name,
                (now - quietSinceMs_) / 1000);
    }
    movedSeen_ = sig;
    quietSinceMs_ = now;
    return;
  }
  const int64_t quiet = now - std::max(quietSinceMs_, r->postedMs);
  if (stall_.reported || quiet < stallMs_) return;
  add(counters().stalls, 1);
  std::string cause;
  StallKind kind = StallKind::kOther;
  try {
    cause = stallCause(now, &kind);
  } catch (...) {
    cause = "(its state could not be described)";
  }
  stall_.begin(now - quiet, kind);
  WEFT_WARN("connection with {} on {}: stalled, no byte moved for {} s with requests outstanding: {} "
            "(WEFT_STALL_S; docs/hangs.md)", peerName_, dev_.props.name, quiet / 1000, cause);
}

uint64_t TcpDataComm::movedSignature() const {
  uint64_t s = moved_;
  if (tasks_) {
    for (int k = 1; k < nFlows_; ++k) {
      s += tasks_[k].got.load(std::memory_order_relaxed) + tasks_[k].written.load(std::memory_order_relaxed);
    }
  }
  return s;
}

// TCP reads and writes any host memory: a NULL handle passes.
Status TcpDataComm::checkMh(const MemHandle* mh, const void* data, size_t size, const char* op) const {
  return checkMemHandle(mh, data, size, op, /*nullOk=*/true, dev_.props.name);
}

Status TcpDataComm::registerMr(void* data, size_t size, int type, int fd, uint64_t offset, MemHandle** out) {
  (void)offset;
  *out = nullptr;
  if (fd >= 0) {
    WEFT_WARN("regMrDmaBuf on {} (type {:#x}): the TCP backend does not advertise NCCL_PTR_DMABUF; refused",
              dev_.props.name, type);
    return Status::kInvalidUsage;
  }
  if (type != NCCL_PTR_HOST) {
    WEFT_WARN("regMr on {}: memory type {:#x} is not host memory; the TCP backend advertises host memory only "
              "(NCCL stages GPU data through host buffers)",
              dev_.props.name, type);
    return Status::kInvalidUsage;
  }
  return dev_.cache->reg(data, size, type, out);
}

Status TcpDataComm::deregisterMr(MemHandle* mh) {
  if (mh == nullptr || mh->magic_ != kMrMagic) return Status::kInvalidUsage;
  return dev_.cache->dereg(mh);
}


// ---- sending ----------------------------------------------------------------------------------------------------

// ---- listening --------------------------------------------------------------------------------------------------

TcpListenComm::TcpListenComm(TcpDevice& dev, uint64_t token, SocketOptions opts)
    : dev_(dev), token_(token), opts_(opts) {
  dev_.acceptor->addListen(token_);
}

TcpListenComm::~TcpListenComm() { dev_.acceptor->removeListen(token_); }

Status TcpListenComm::accept(RecvComm** recvComm) {
  *recvComm = nullptr;
  Arrival a;
  bool mismatch = false;
  Status error = Status::kOk;
  const bool got = dev_.acceptor->takeArrival(token_, &a, &mismatch, &error);
  // A peer whose tuner would decide differently fails the accept, as on the other backends: NCCL's init then
  // stops with the warning that names both, instead of hanging later.
  if (mismatch) return Status::kInvalidUsage;
  if (error != Status::kOk) return error;
  if (!got) return Status::kOk;
  // The comm exists (and waits for its further flows) before the connector hears it is accepted.
  auto* comm = numa::make<TcpRecvComm>(dev_.props.numaNode, dev_, std::vector<int>{a.fd}, a.hello.flows,
                                       a.hello.ifaces, a.peer, dev_.acceptor, token_, a.hello.nonce);
  if (!sendAnswer(a.fd, a.hello, Hello::kAccepted)) {
    WEFT_INFO(NCCL_NET, "accept on {}: {} went away during the handshake", dev_.props.name, a.peer);
    delete comm;  // closes the socket
    return Status::kOk;
  }
  opts_.applyConnected(a.fd);
  *recvComm = comm;
  WEFT_INFO(NCCL_NET, "accepted {} on {} (tcp{})", a.peer, dev_.props.name,
            a.hello.flows > 1 ? ", " + std::to_string(a.hello.flows) + " flows as it carries bulk data"
                              : std::string());
  return Status::kOk;
}

}  // namespace weft::tcp
