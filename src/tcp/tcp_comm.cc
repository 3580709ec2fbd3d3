// SPDX-License-Identifier: Apache-2.0
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

namespace weft::tcp {

Counters& counters() {
  static Counters* c = new Counters;  // never destroyed: comms may close during exit
  return *c;
}

namespace {

// Takes `node` out of a singly linked list (through `link`, its `next` by default) with a tail pointer; nothing
// when it is not there.
template <typename T>
void unlink(T*& head, T*& tail, T* node, T* T::*link = &T::next) {
  T* prev = nullptr;
  for (T* p = head; p != nullptr; prev = p, p = p->*link) {
    if (p != node) continue;
    (prev ? prev->*link : head) = node->*link;
    if (tail == node) tail = prev;
    return;
  }
}

bool wouldBlock(int e) { return e == EAGAIN || e == EWOULDBLOCK; }

void add(std::atomic<int64_t>& c, int64_t v) { c.fetch_add(v, std::memory_order_relaxed); }

}  // namespace

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
  return r;
}

void TcpDataComm::release(TcpRequest* r) {
  r->inUse = false;
  r->next = nullptr;
  pool_.giveBack(r->poolIndex);
}

void TcpDataComm::fail(Status st, const std::string& why) {
  if (fatal_ != Status::kOk) return;
  fatal_ = st;
  WEFT_WARN("connection with {} on {} failed: {}", peerName_, dev_.props.name, why);
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
    if (fatal_ == Status::kOk) return Status::kOk;
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

TcpSendComm::TcpSendComm(TcpDevice& dev, std::vector<int> fds, int flows, int ifaces, std::string peerName,
                         const SocketOptions& opts, JoinPlan plan)
    : TcpComm<SendComm>(dev, std::move(fds), flows, ifaces, std::move(peerName)), plan_(std::move(plan)),
      writeMax_(opts.writeMax), stripeMin_(std::max<uint64_t>(opts.stripeMin, 1)),
      chunk_(std::max<uint32_t>(opts.chunk, 4096)), opts_(opts) {
  grow_ = dev.grow && nFlows_ > 1;
  opened_ = ready_;  // flow 0, or every flow where the caller opened them all
  if (nFlows_ > 1) {
    const size_t n = static_cast<size_t>(nFlows_) * kItemsPerFlow;
    items_ = numa::makeArray<Item>(n, dev.props.numaNode);
    if (!items_) throw std::bad_alloc();
    for (size_t i = n; i-- > 0;) {
      items_[i].next = freeItems_;
      freeItems_ = &items_[i];
    }
  }
}

Status TcpSendComm::isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  if (Status st = checkMh(mh, data, size, "isend"); st != Status::kOk) return st;
  if (size >= stripeMin_ && nFlows_ > 1) {
    // Bulk data: the other flows open now. A large message waits for them a moment (NCCL retries a NULL
    // request), so that even the first one travels over all of them.
    if (!joinsStarted_) openFlows(grow_ ? nIfaces_ : nFlows_);  // growing: the first window on a flow an interface
    if (joiningLeft_ > 0) {
      pollJoins();
      if (joiningLeft_ > 0 && std::chrono::steady_clock::now() - joinStart_ < kJoinWait) {
        progress();
        return fatal_;
      }
    }
  }
  TcpRequest* r = acquire();
  if (r == nullptr) return Status::kOk;  // back-pressure
  r->n = 0;
  r->size = size;
  r->seq = seq_++;
  r->assigned = 0;
  r->itemsLeft = 1;
  if (grow_ && size >= stripeMin_) bulkStarted();
  const bool pieces = ready_ > 1 && size >= stripeMin_;
  Item& h = r->head;
  MsgHeader mhdr{size | (pieces ? MsgHeader::kInPieces : 0) | (joiningLeft_ > 0 ? MsgHeader::kJoining : 0), tag,
                 msgCheck(r->seq)};
  std::memcpy(h.hdr, &mhdr, sizeof(mhdr));
  h.src = static_cast<const uint8_t*>(data);
  h.len = pieces ? 0 : size;
  h.sent = 0;
  h.r = r;
  h.next = nullptr;
  r->next = nullptr;
  r->hdrNext = nullptr;
  if (pieces) {
    (bulkTail_ ? bulkTail_->next : bulkHead_) = r;
    bulkTail_ = r;
  } else {
    r->assigned = size;
  }
  Flow& f0 = flows_[0];
  const bool idle = f0.head == nullptr;
  (heldTail_ ? heldTail_->hdrNext : heldHead_) = r;
  heldTail_ = r;
  releaseHeaders();
  if (pieces) {
    progress();  // every flow with room takes a piece now
  } else if (idle) {
    while (progressFlow(0)) {  // header and payload leave in this call when the socket has room
    }
  }
  *request = r;
  return Status::kOk;
}

void TcpSendComm::enqueue(Flow& f, Item* it) {
  it->next = nullptr;
  (f.tail ? f.tail->next : f.head) = it;
  f.tail = it;
  f.queued += it->total();
}

// Flow k pulls the next chunk of the oldest message still in pieces: a flow whose socket takes bytes faster pulls
// more often, so a slow path carries less.
bool TcpSendComm::pullPiece(int k) {
  TcpRequest* r = bulkHead_;
  if (r == nullptr || freeItems_ == nullptr || k >= active_) return false;
  Item* it = freeItems_;
  freeItems_ = it->next;
  const uint64_t len = std::min<uint64_t>(chunk_, r->size - r->assigned);
  PieceHeader ph{r->assigned, static_cast<uint32_t>(len), pieceCheck(r->seq)};
  std::memcpy(it->hdr, &ph, sizeof(ph));
  it->src = r->head.src + r->assigned;
  it->len = len;
  it->sent = 0;
  it->r = r;
  r->assigned += len;
  ++r->itemsLeft;
  enqueue(flows_[k], it);
  if (r->assigned == r->size) {
    bulkHead_ = r->next;
    if (bulkHead_ == nullptr) bulkTail_ = nullptr;
    r->next = nullptr;
    releaseHeaders();  // the headers held behind it may go now
  }
  return true;
}

// A header goes on flow 0 once no earlier message has pieces still to hand out: a piece of an earlier message
// behind a later header on flow 0 would wait, on the receiver, for that later message's receive, which NCCL may
// post only once the earlier one completed. Holding the later header back costs nothing: its message's own
// pieces are handed out only after the earlier ones' anyway, and NCCL consumes a connection's messages in order.
void TcpSendComm::releaseHeaders() {
  while (heldHead_ != nullptr && (bulkHead_ == nullptr || static_cast<int32_t>(bulkHead_->seq - heldHead_->seq) >= 0)) {
    TcpRequest* r = heldHead_;
    heldHead_ = r->hdrNext;
    if (heldHead_ == nullptr) heldTail_ = nullptr;
    r->hdrNext = nullptr;
    enqueue(flows_[0], &r->head);
  }
}

void TcpSendComm::itemDone(Item* it) {
  TcpRequest* r = it->r;
  if (it != &r->head) {
    it->r = nullptr;
    it->next = freeItems_;
    freeItems_ = it;
  }
  if (--r->itemsLeft == 0 && r->assigned == r->size) {
    r->complete = true;
    if (grow_ && r->size >= stripeMin_) bulkDone(r->size, r->seq);
  }
}

// The flows write in turns, one sendmsg each a round, while any took all it was offered: pieces go to the flows
// in step with what each socket takes.
void TcpSendComm::progress() {
  if (joiningLeft_ > 0) pollJoins();
  bool more = true;
  // the first flow of a round turns, so that no flow is always first to take pieces
  const int n = opened_;  // flows [opened_, nFlows_) are not open
  const int first = n > 1 ? static_cast<int>(turn_++ % static_cast<uint32_t>(n)) : 0;
  while (more && fatal_ == Status::kOk) {
    more = false;
    for (int i = 0; i < n && fatal_ == Status::kOk; ++i) {
      const int k = first + i < n ? first + i : first + i - n;
      if (flows_[k].ready && (flows_[k].head != nullptr || bulkHead_ != nullptr)) more = progressFlow(k) || more;
    }
  }
}

void TcpSendComm::openFlows(int upTo) {
  upTo = std::min(upTo, nFlows_);
  if (plan_.peers.empty() || upTo <= opened_) {
    joinsStarted_ = true;
    return;
  }
  if (!joinsStarted_) opts_.applyFlow(flows_[0].fd);
  joinsStarted_ = true;
  if (!joining_) joining_.reset(new Joining[static_cast<size_t>(nFlows_)]);
  joinStart_ = std::chrono::steady_clock::now();
  for (int k = opened_; k < upTo; ++k) {
    const size_t j = static_cast<size_t>(k) % plan_.peers.size();
    const sockaddr_storage& sa = plan_.peers[j];
    int fd = -1;
    if (plan_.peers.size() > 1 && j < dev_.rails.size() && dev_.rails[j].addr.ss_family == sa.ss_family) {
      fd = bindTcpSocket(dev_.rails[j].addr, dev_.rails[j].len, SOCK_NONBLOCK | SOCK_CLOEXEC);  // by interface j
    } else {
      fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    }
    if (fd < 0) {
      WEFT_INFO(NCCL_NET, "connection with {} on {}: flow {} not opened ({}); {} flows carry it", peerName_,
                dev_.props.name, k, std::strerror(errno), k);
      upTo = nFlows_;  // no more
      break;
    }
    opts_.applyEarly(fd);
    const socklen_t len = sa.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), len) != 0 && errno != EINPROGRESS) {
      WEFT_INFO(NCCL_NET, "connection with {} on {}: flow {} could not connect ({}); left out", peerName_,
                dev_.props.name, k, std::strerror(errno));
      ::close(fd);
      continue;
    }
    joining_[k] = Joining{};
    flows_[k].fd = fd;
    ++joiningLeft_;
  }
  opened_ = upTo;
}

// Growing (a NIC weft does not know, WEFT_TCP_FLOWS unset): bulk messages' bytes over the time some were in
// flight, per window; the flows double while a window with more of them carries at least 10% more.
void TcpSendComm::bulkStarted() {
  if (bulkOut_++ == 0) busyFrom_ = std::chrono::steady_clock::now();
}

void TcpSendComm::bulkDone(uint64_t size, uint32_t seq) {
  const auto now = std::chrono::steady_clock::now();
  if (--bulkOut_ == 0) busy_ += now - busyFrom_;
  if (static_cast<int32_t>(seq - settleSeq_) < 0) {
    // a message sent before the count changed (queued on fewer flows): the window starts after the last of them
    winBytes_ = 0;
    busy_ = {};
    busyFrom_ = now;
    return;
  }
  winBytes_ += size;
  const auto busy = busy_ + (bulkOut_ > 0 ? now - busyFrom_ : std::chrono::steady_clock::duration{});
  if (winBytes_ < kGrowWindowBytes || busy < kGrowWindowTime) return;
  const double gbps = static_cast<double>(winBytes_) * 8 / std::chrono::duration<double, std::nano>(busy).count();
  winBytes_ = 0;
  busy_ = {};
  busyFrom_ = now;
  // measured while flows joined, or the first window since the count changed (socket buffers filling, messages
  // queued before on fewer flows draining): again
  if (joiningLeft_ > 0) {
    settleSeq_ = seq_;
    return;
  }
  if (lastGbps_ > 0 && gbps < lastGbps_ * 1.1) {
    // the last ones added nothing: they stay open but take no pieces (the flows below lastFlows_ carry on)
    grow_ = false;
    if (gbps < lastGbps_) active_ = std::max(1, lastFlows_);
    WEFT_INFO(NCCL_NET, "connection with {} on {}: {} flows carry its pieces ({} carried {:.2f} Gb/s, {} {:.2f})",
              peerName_, dev_.props.name, std::min(active_, ready_), lastFlows_, lastGbps_, ready_, gbps);
    return;
  }
  lastGbps_ = gbps;
  lastFlows_ = ready_;
  if (opened_ >= nFlows_) {
    grow_ = false;
    WEFT_INFO(NCCL_NET, "connection with {} on {}: {} flows ({:.2f} Gb/s), the most it may have", peerName_,
              dev_.props.name, ready_, gbps);
    return;
  }
  openFlows(opened_ * 4);
  settleSeq_ = seq_;
}

// Each joining flow, without blocking: connected, hello sent, answer read. A flow that fails to join is closed and
// left out; the connection carries on with the flows it has.
void TcpSendComm::pollJoins() {
  const bool late = std::chrono::steady_clock::now() - joinStart_ > Acceptor::kHelloTimeout;
  for (int k = 1; k < nFlows_ && joiningLeft_ > 0; ++k) {
    Flow& f = flows_[k];
    if (f.fd < 0 || f.ready) continue;
    Joining& jn = joining_[k];
    const char* why = nullptr;
    if (!jn.connected) {
      pollfd p{f.fd, POLLOUT, 0};
      if (::poll(&p, 1, 0) > 0) jn.connected = true;
    }
    if (jn.connected && jn.helloSent < sizeof(Hello)) {
      const Hello hello = helloRequest(plan_.token, plan_.nonce, k, nFlows_, static_cast<int>(plan_.peers.size()));
      const auto* bytes = reinterpret_cast<const uint8_t*>(&hello);
      const ssize_t w =
          ::send(f.fd, bytes + jn.helloSent, sizeof(hello) - jn.helloSent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) jn.helloSent += static_cast<size_t>(w);
      if (w < 0 && !wouldBlock(errno) && errno != EINTR) why = std::strerror(errno);
    }
    if (why == nullptr && jn.helloSent == sizeof(Hello)) {
      while (jn.answerGot < sizeof(Hello)) {
        const ssize_t r = ::recv(f.fd, reinterpret_cast<uint8_t*>(&jn.answer) + jn.answerGot,
                                 sizeof(Hello) - jn.answerGot, MSG_DONTWAIT);
        if (r > 0) {
          jn.answerGot += static_cast<size_t>(r);
          continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && wouldBlock(errno)) break;
        why = r == 0 ? "the listener closed it" : std::strerror(errno);
        break;
      }
      if (jn.answerGot == sizeof(Hello)) {
        const Hello& a = jn.answer;
        if (a.magic != Hello::kMagic || a.version != Hello::kVersion || a.status != Hello::kAccepted ||
            a.token != plan_.token || a.nonce != plan_.nonce || a.flow != k) {
          why = "refused by the listener";
        } else {
          opts_.applyConnected(f.fd);
          opts_.applyFlow(f.fd);
          f.ready = true;
          ++ready_;
          --joiningLeft_;
          add(counters().flowsOpen, 1);
          if (joiningLeft_ == 0) {
            WEFT_INFO(NCCL_NET, "connection with {} on {}: {} flows", peerName_, dev_.props.name, ready_);
          }
          continue;
        }
      }
    }
    if (why == nullptr && late) why = "no answer within the hello timeout";
    if (why == nullptr) continue;
    WEFT_INFO(NCCL_NET, "connection with {} on {}: flow {} did not join ({}); left out", peerName_, dev_.props.name,
              k, why);
    ::close(f.fd);
    f.fd = -1;
    --joiningLeft_;
  }
}

bool TcpSendComm::progressFlow(int k) {
  Flow& f = flows_[k];
  constexpr int kIov = 64;
  {
    // A flow takes a piece when less than one is queued on it: one being written, at most one to follow.
    while (f.queued < chunk_ && bulkHead_ != nullptr && pullPiece(k)) {
    }
    if (f.head == nullptr) return false;
    iovec iov[kIov];
    int n = 0;
    size_t want = 0;
    // At most writeMax_ bytes a call: one huge sendmsg (8 queued 1 MiB messages) measured half the bandwidth of
    // 512 KiB ones on loopback (docs/tcp.md), the receiver draining while the sender copies.
    for (Item* it = f.head; it != nullptr && n + 2 <= kIov && want < writeMax_; it = it->next) {
      if (it->sent < sizeof(it->hdr)) {
        iov[n++] = {it->hdr + it->sent, sizeof(it->hdr) - it->sent};
        want += sizeof(it->hdr) - it->sent;
      }
      const uint64_t off = it->sent > sizeof(it->hdr) ? it->sent - sizeof(it->hdr) : 0;
      if (it->len > off && want < writeMax_) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(it->len - off, writeMax_ - want));
        iov[n++] = {const_cast<uint8_t*>(it->src) + off, len};
        want += len;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w;
    do {
      w = ::sendmsg(f.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      add(counters().sendCalls, 1);
    } while (w < 0 && errno == EINTR);
    if (w < 0) {
      if (!wouldBlock(errno)) failErrno(errno, "send", k);
      return false;
    }
    add(counters().bytesSent, w);
    add(counters().flowBytesSent[k], w);
    RailHealth& h = health_[f.iface];
    RailHealth::bump(h.bytes, w);
    f.queued -= static_cast<uint64_t>(w);
    uint64_t left = static_cast<uint64_t>(w);
    while (f.head != nullptr && left > 0) {
      Item* it = f.head;
      const uint64_t take = std::min(left, it->total() - it->sent);
      it->sent += take;
      left -= take;
      if (it->sent < it->total()) break;
      f.head = it->next;
      if (f.head == nullptr) f.tail = nullptr;
      if (it == &it->r->head) RailHealth::bump(h.msgs, 1);
      itemDone(it);
    }
    // the socket took all: more may go now
    return static_cast<size_t>(w) == want && (f.head != nullptr || bulkHead_ != nullptr);
  }
}

// The comm has failed (test reports a request only then): nothing is sent again, but the request must not stay
// in the queue of messages whose pieces are handed out.
void TcpSendComm::forget(TcpRequest* r) {
  unlink(bulkHead_, bulkTail_, r);
  unlink(heldHead_, heldTail_, r, &TcpRequest::hdrNext);
}

// ---- receiving --------------------------------------------------------------------------------------------------

TcpRecvComm::TcpRecvComm(TcpDevice& dev, std::vector<int> fds, int flows, int ifaces, std::string peerName,
                         std::shared_ptr<Acceptor> acceptor, uint64_t token, uint64_t nonce)
    : TcpComm<RecvComm>(dev, std::move(fds), flows, ifaces, std::move(peerName)),
      acceptor_(std::move(acceptor)), token_(token), stage_(numa::makeArray<uint8_t>(kStage, dev.props.numaNode)) {
  if (!stage_) throw std::bad_alloc();
  if (nFlows_ > 1) {
    slots_ = numa::makeArray<Slot>(kWindow, dev.props.numaNode);
    if (!slots_) throw std::bad_alloc();
    if (acceptor_ && ready_ < nFlows_) {
      box_.nonce = nonce;
      box_.flows = nFlows_;
      acceptor_->addJoin(token_, &box_);
    }
  }
}

// Flows the acceptor handed over, into their places.
void TcpRecvComm::adoptFlows() {
  std::vector<std::pair<int, int>> got;
  {
    std::lock_guard<std::mutex> lock(acceptor_->mutex());
    got.swap(box_.fds);
    box_.waiting.store(0, std::memory_order_relaxed);
  }
  for (auto [k, fd] : got) {
    Flow& f = flows_[k];
    if (k <= 0 || k >= nFlows_ || f.fd >= 0) {
      ::close(fd);
      continue;
    }
    f.fd = fd;
    f.ready = true;
    ++ready_;
    add(counters().flowsOpen, 1);
  }
  if (ready_ == nFlows_) {
    acceptor_->removeJoin(token_, &box_);
    WEFT_INFO(NCCL_NET, "connection with {} on {}: {} flows", peerName_, dev_.props.name, ready_);
  }
}

TcpRecvComm::~TcpRecvComm() {
  if (acceptor_ && nFlows_ > 1 && ready_ < nFlows_) acceptor_->removeJoin(token_, &box_);
  while (unexpHead_ != nullptr) {
    Unexpected* u = unexpHead_;
    unexpHead_ = u->next;
    delete u;
  }
}

uint8_t* Unexpected::base() const { return r != nullptr ? r->dst[buf] : data.get(); }

void TcpRecvComm::dropUnexpected(Unexpected* u) {
  unlink(unexpHead_, unexpTail_, u);
  unexpBytes_ -= u->size;
  delete u;
}

void TcpRecvComm::unexpectedIn(Unexpected* u, uint64_t n) {
  u->got += n;
  if (u->r == nullptr) return;  // still aside
  TcpRequest* r = u->r;
  const int i = u->buf;
  const bool all = u->got == u->size;
  if (all) dropUnexpected(u);  // nothing names it any more: its last bytes are in
  bytesIn(r, i, n);
}

bool TcpRecvComm::matchUnexpected(TcpRequest* r, int i) {
  for (Unexpected* u = unexpHead_; u != nullptr; u = u->next) {
    if (u->r != nullptr || u->tag != r->tags[i]) continue;
    if (u->size > r->cap[i]) {
      fail(Status::kInvalidUsage, "a " + std::to_string(u->size) + "-byte message (tag " + std::to_string(u->tag) +
                                      ") arrived for a " + std::to_string(r->cap[i]) +
                                      "-byte receive: sender and receiver disagree on the size");
      return false;
    }
    r->bufMatched[i] = true;
    ++r->matched;
    --unmatched_;
    r->want[i] = u->size;
    r->got[i] = 0;
    // What has arrived moves over; the rest will land in the buffer itself (base() follows the match).
    if (u->size > 0) std::memcpy(r->dst[i], u->data.get(), u->size);
    const uint64_t arrived = u->got;
    if (arrived == u->size) {
      dropUnexpected(u);
    } else {
      u->r = r;
      u->buf = i;
      u->data.reset();
    }
    bytesIn(r, i, arrived);
    return true;
  }
  return false;
}

Status TcpRecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs, bool optional,
                          Request** request) {
  (void)optional;  // every receive completes when its bytes are in: the data's own flags are NCCL's business
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  if (n < 1 || n > kMaxRecvs) return Status::kInternal;
  for (int i = 0; i < n; ++i) {
    if (Status st = checkMh(mhs ? mhs[i] : nullptr, data[i], sizes[i], "irecv"); st != Status::kOk) return st;
  }
  TcpRequest* r = acquire();
  if (r == nullptr) return Status::kOk;
  r->n = static_cast<uint8_t>(n);
  r->matched = r->filled = 0;
  for (int i = 0; i < n; ++i) {
    r->dst[i] = static_cast<uint8_t*>(data[i]);
    r->cap[i] = sizes[i];
    r->tags[i] = tags[i];
    r->got[i] = r->want[i] = 0;
    r->bufMatched[i] = false;
  }
  r->next = nullptr;
  (tail_ ? tail_->next : head_) = r;
  tail_ = r;
  unmatched_ += n;
  for (int i = 0; i < n && unexpHead_ != nullptr; ++i) matchUnexpected(r, i);
  if (fatal_ != Status::kOk) {
    forget(r);
    release(r);
    return fatal_;
  }
  *request = r;
  return Status::kOk;
}

Status TcpRecvComm::iflush(int, void**, const int*, MemHandle**, Request** request) {
  // Host memory only: what recv() wrote is visible to the CPU and to cudaMemcpy already; nothing to flush.
  *request = nullptr;
  return fatal_;
}

void TcpRecvComm::forget(TcpRequest* r) {
  // cur_ and the rails' pieces may still name a failed request: the comm is failed, and nothing reads them again
  unlink(head_, tail_, r);
}

size_t TcpRecvComm::readSome(int k, uint8_t* p, size_t len, bool mayEnd) {
  for (;;) {
    const ssize_t got = ::recv(flows_[k].fd, p, len, MSG_DONTWAIT);
    add(counters().recvCalls, 1);
    if (got > 0) {
      add(counters().bytesReceived, got);
      return static_cast<size_t>(got);
    }
    // Between pieces a flow may end: the sender closed after its last send. A reset there is an end too: a
    // sender that closes while a flow is still joining (its answer unread) resets that flow, which carried nothing.
    if (got == 0 || (got < 0 && errno == ECONNRESET && mayEnd && k > 0)) {
      if (mayEnd) {
        flows_[k].ended = true;
        flowEnded(k);
        return 0;
      }
      flowDown(k, RailEvent::kPeerGone);
      fail(Status::kRemote, "the peer closed the connection" + flowName(k) +
                                " with receives outstanding: its process ended or closed the comm");
      return 0;
    }
    if (errno == EINTR) continue;
    if (!wouldBlock(errno)) failErrno(errno, "recv", k);
    return 0;
  }
}

// A sender closes its comm once its sends are in the kernel: flows end one by one, each at a message or piece
// boundary. Headers come on flow 0 only; pieces on any flow.
void TcpRecvComm::flowEnded(int k) {
  if (box_.waiting.load(std::memory_order_acquire) > 0) adoptFlows();
  bool all = true;
  for (int j = 0; j < nFlows_; ++j) all = all && (flows_[j].ended || flows_[j].fd < 0);
  const bool headersWanted = flows_[0].ended && unmatched_ > 0;
  if (!headersWanted && !(all && piecesOpen())) return;
  flowDown(k, RailEvent::kPeerGone);
  fail(Status::kRemote, "the peer closed the connection" + flowName(k) +
                            " with receives outstanding: its process ended or closed the comm");
}

bool TcpRecvComm::fillStage() {
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (begin_ > 0 && kStage - end_ < sizeof(MsgHeader) * 4) {
    std::memmove(stage_.get(), stage_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  // Between messages (nothing staged, none being placed), flow 0 may end while other flows still bring pieces.
  const bool between = begin_ == end_ && cur_ == nullptr && curU_ == nullptr;
  const size_t got = readSome(0, stage_.get() + end_, kStage - end_, between);
  end_ += got;
  return got > 0;
}

int TcpRecvComm::pieceSlot(const PieceHeader& h, int k, bool* wait) {
  *wait = false;
  const uint32_t seq = h.check & kSeqMask;
  const uint32_t behind = (seq_ - seq) & kSeqMask;  // 1: the message flow 0 matched last
  if (nFlows_ > 1 && isPiece(h.check)) {
    if (behind == 0 || behind > kSeqMask / 2) {  // flow 0 has not matched it yet
      *wait = true;
      return -1;
    }
    const int i = static_cast<int>(seq % kWindow);
    const Slot& s = slots_[i];
    if (behind <= kWindow && s.open && s.seq == seq && h.len <= s.left && h.offset <= s.size - h.len) return i;
  }
  fail(Status::kRemote, "a piece header" + flowName(k) + " names no message in flight (message " +
                            std::to_string(seq) + ", " + std::to_string(h.len) + " bytes at " +
                            std::to_string(h.offset) + "): the streams are corrupt or out of step");
  return -1;
}

void TcpRecvComm::pieceIn(int slot, uint64_t n) {
  Slot& s = slots_[slot];
  s.left -= n;
  if (s.left == 0) {
    s.open = false;
    --openSlots_;
  }
  if (s.u != nullptr) {
    unexpectedIn(s.u, n);
  } else {
    bytesIn(s.r, s.buf, n);
  }
}

bool TcpRecvComm::matchHeader() {
  MsgHeader h;
  std::memcpy(&h, stage_.get() + begin_, sizeof(h));
  if (isPiece(h.check)) {  // a piece of a message flow 0 matched before
    PieceHeader ph;
    std::memcpy(&ph, &h, sizeof(ph));
    bool wait = false;
    const int slot = pieceSlot(ph, 0, &wait);
    if (slot < 0) {
      if (wait) fail(Status::kRemote, "a piece on flow 0 came before its message's header: the stream is corrupt");
      return false;
    }
    begin_ += sizeof(ph);
    Slot& s = slots_[slot];
    cur_ = s.r;
    curU_ = s.u;
    curBuf_ = s.buf;
    curSlot_ = slot;
    curOff_ = ph.offset;
    curLeft_ = ph.len;
    if (curLeft_ == 0) cur_ = nullptr, curU_ = nullptr, curSlot_ = -1;
    return true;
  }
  // Read only for the pieces of open messages (no receive waits for a header): the header stays staged. No piece
  // of an earlier message follows it on flow 0 (the sender's rule, pullPiece).
  if (unmatched_ == 0) return false;
  if (h.check != msgCheck(seq_)) {
    fail(Status::kRemote, "a message header failed its check (message " + std::to_string(seq_) +
                              "): the stream is corrupt or out of step");
    return false;
  }
  const bool pieces = (h.size & MsgHeader::kInPieces) != 0;
  const uint64_t size = h.size & MsgHeader::kSizeMask;
  if (pieces && nFlows_ == 1) {
    fail(Status::kRemote, "a message in pieces on a connection of one flow: the stream is corrupt");
    return false;
  }
  Slot* slot = nullptr;
  if (pieces) {
    slot = &slots_[seq_ % kWindow];
    if (slot->open) return false;  // the message kWindow before is not all in yet: match later
  }
  TcpRequest* mr = nullptr;
  int mi = 0;
  for (TcpRequest* r = head_; r != nullptr && mr == nullptr; r = r->next) {
    if (r->matched == r->n) continue;
    for (int i = 0; i < r->n; ++i) {
      if (r->bufMatched[i] || r->tags[i] != h.tag) continue;
      if (size > r->cap[i]) {
        // The receive fails and, the stream holding bytes nobody will take, so does the comm.
        fail(Status::kInvalidUsage, "a " + std::to_string(size) + "-byte message (tag " + std::to_string(h.tag) +
                                        ") arrived for a " + std::to_string(r->cap[i]) +
                                        "-byte receive: sender and receiver disagree on the size");
        return false;
      }
      mr = r;
      mi = i;
      break;
    }
  }
  Unexpected* u = nullptr;
  if (mr == nullptr) {
    // Its receive is not posted yet: held aside while there is room (the rest of its payload lands there);
    // otherwise the header waits.
    if (unexpBytes_ + size > kUnexpectedMax) return false;
    u = new Unexpected;
    u->tag = h.tag;
    u->size = size;
    u->data.reset(new uint8_t[size > 0 ? size : 1]);
    (unexpTail_ ? unexpTail_->next : unexpHead_) = u;
    unexpTail_ = u;
    unexpBytes_ += size;
  } else {
    mr->bufMatched[mi] = true;
    ++mr->matched;
    --unmatched_;
    mr->want[mi] = size;
    mr->got[mi] = 0;
  }
  begin_ += sizeof(MsgHeader);
  joinHint_ = (h.size & MsgHeader::kJoining) != 0;
  if (slot != nullptr && size > 0) {
    *slot = Slot{mr, u, static_cast<uint8_t>(mi), true, seq_ & kSeqMask, size, size};
    ++openSlots_;
  }
  ++seq_;
  cur_ = mr;
  curU_ = u;
  curBuf_ = mi;
  curSlot_ = -1;
  curOff_ = 0;
  curLeft_ = pieces ? 0 : size;
  if (curLeft_ == 0) {  // nothing follows on flow 0: an empty message, or one in pieces
    cur_ = nullptr, curU_ = nullptr;
    if (size == 0 || !pieces) {
      if (u != nullptr) {
        unexpectedIn(u, 0);
      } else {
        bytesIn(mr, mi, 0);
      }
    }
  }
  return true;
}

void TcpRecvComm::bytesIn(TcpRequest* r, int i, uint64_t n) {
  r->got[i] += n;
  if (r->got[i] < r->want[i]) return;
  if (++r->filled < r->n) return;
  r->complete = true;
  forget(r);  // completed requests leave the queue (from anywhere: a later group may fill before an earlier one)
}

void TcpRecvComm::progressFlow0() {
  while (fatal_ == Status::kOk) {
    if (cur_ != nullptr || curU_ != nullptr) {
      TcpRequest* r = cur_;
      Unexpected* u = curU_;
      const int i = curBuf_;
      const int slot = curSlot_;
      uint8_t* dst = (u != nullptr ? u->base() : r->dst[i]) + curOff_;
      uint64_t n = 0;
      if (end_ > begin_) {
        n = std::min<uint64_t>(curLeft_, end_ - begin_);
        std::memcpy(dst, stage_.get() + begin_, n);
        begin_ += n;
      } else if (curLeft_ >= kDirectMin) {
        n = readSome(0, dst, curLeft_);  // exactly what is left: the next header stays in the socket
        if (n == 0) return;
      } else {
        if (!fillStage()) return;
        continue;
      }
      curOff_ += n;
      curLeft_ -= n;
      const bool drained = curLeft_ > 0 && end_ == begin_;  // a direct read came short: the socket is empty now
      if (curLeft_ == 0) cur_ = nullptr, curU_ = nullptr, curSlot_ = -1;
      if (slot >= 0) {
        pieceIn(slot, n);
      } else if (u != nullptr) {
        unexpectedIn(u, n);
      } else {
        bytesIn(r, i, n);
      }
      if (drained) return;
      continue;
    }
    // Nothing posted that waits for a header and no message in pieces open: leave the bytes in the socket (and
    // the end of the stream too: a sender that closed after its last message has ended flow 0 while other flows
    // still bring pieces).
    if (unmatched_ == 0 && !piecesOpen()) return;
    if (flows_[0].ended) {
      flowEnded(0);
      return;
    }
    if (end_ - begin_ >= sizeof(MsgHeader)) {
      if (!matchHeader()) return;
      continue;
    }
    if (!fillStage()) return;
  }
}

void TcpRecvComm::progressPieces(int k) {
  Flow& f = flows_[k];
  while (fatal_ == Status::kOk && !f.ended && f.fd >= 0) {
    if (!f.inPiece) {
      if (f.hdrGot < sizeof(PieceHeader)) {
        const size_t n = readSome(k, reinterpret_cast<uint8_t*>(&f.hdrIn) + f.hdrGot, sizeof(PieceHeader) - f.hdrGot,
                                  f.hdrGot == 0);
        if (n == 0) return;
        f.hdrGot += n;
        if (f.hdrGot < sizeof(PieceHeader)) return;
      }
      bool wait = false;
      const int slot = pieceSlot(f.hdrIn, k, &wait);
      if (slot < 0) return;  // its message is not matched yet (flow 0 will), or the comm failed
      f.hdrGot = 0;
      f.slot = slot;
      f.off = f.hdrIn.offset;
      f.left = f.hdrIn.len;
      f.inPiece = true;
    }
    if (f.left > 0) {
      const Slot& s = slots_[f.slot];
      uint8_t* dst = (s.u != nullptr ? s.u->base() : s.r->dst[s.buf]) + f.off;
      const size_t n = readSome(k, dst, f.left);
      if (n == 0) return;
      f.off += n;
      f.left -= n;
      const bool more = f.left > 0;
      if (!more) f.inPiece = false;
      pieceIn(f.slot, n);
      if (more) return;  // the socket is empty for now
      continue;
    }
    f.inPiece = false;
  }
}

void TcpRecvComm::progress() {
  if (ready_ < nFlows_ && acceptor_) {
    // flows on their way: the acceptor is polled now and then while the sender says so, or pieces are open
    if (box_.waiting.load(std::memory_order_acquire) > 0) {
      adoptFlows();
    } else if (joinHint_ || piecesOpen() ? (++joinPolls_ & 15) == 0 : coarseNowMs() != lastJoinPollMs_) {
      // every millisecond at most while nothing says flows are on their way (a connection that carries small
      // messages only never opens them: the look costs a clock read)
      lastJoinPollMs_ = coarseNowMs();
      (void)acceptor_->poll(false);
      if (box_.waiting.load(std::memory_order_acquire) > 0) adoptFlows();
    }
  }
  progressFlow0();
  for (int k = 1; k < nFlows_ && fatal_ == Status::kOk; ++k) progressPieces(k);
}

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
