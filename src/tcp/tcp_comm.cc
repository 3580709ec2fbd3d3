// SPDX-License-Identifier: Apache-2.0
#include "tcp/tcp_comm.h"

#include <netinet/tcp.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"

namespace weft::tcp {

Counters& counters() {
  static Counters* c = new Counters;  // never destroyed: comms may close during exit
  return *c;
}

namespace {

// Takes `node` out of a singly linked list (through its `next`) with a tail pointer; nothing when it is not there.
template <typename T>
void unlink(T*& head, T*& tail, T* node) {
  T* prev = nullptr;
  for (T* p = head; p != nullptr; prev = p, p = p->next) {
    if (p != node) continue;
    (prev ? prev->next : head) = node->next;
    if (tail == node) tail = prev;
    return;
  }
}

bool wouldBlock(int e) { return e == EAGAIN || e == EWOULDBLOCK; }

void add(std::atomic<int64_t>& c, int64_t v) { c.fetch_add(v, std::memory_order_relaxed); }

}  // namespace

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
  return o;
}

void SocketOptions::applyEarly(int fd) const {
  if (sockBuf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockBuf, sizeof(sockBuf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockBuf, sizeof(sockBuf));
  }
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

TcpDataComm::TcpDataComm(TcpDevice& dev, std::vector<int> fds, int ifaces, std::string peerName)
    : dev_(dev), nFlows_(static_cast<int>(fds.size())), nIfaces_(std::clamp(ifaces, 1, kMaxRails)),
      peerName_(std::move(peerName)), pool_(kMaxPool, dev.props.numaNode) {
  flows_ = numa::makeArray<Flow>(fds.size(), dev.props.numaNode);
  if (!flows_) {
    for (int fd : fds) ::close(fd);
    throw std::bad_alloc();
  }
  for (int k = 0; k < nFlows_; ++k) {
    flows_[k].fd = fds[k];
    flows_[k].iface = static_cast<uint8_t>(k % nIfaces_);
  }
  for (int j = 0; j < nIfaces_; ++j) {
    health_[j].setDevice(static_cast<size_t>(j) < dev_.rails.size() ? dev_.rails[j].ifname.c_str()
                                                                     : dev_.props.name.c_str());
  }
  add(counters().commsOpen, 1);
  add(counters().flowsOpen, nFlows_);
}

TcpDataComm::~TcpDataComm() {
  for (int k = 0; k < nFlows_; ++k) {
    if (flows_[k].fd >= 0) ::close(flows_[k].fd);
  }
  add(counters().commsOpen, -1);
  add(counters().flowsOpen, -nFlows_);
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

TcpSendComm::TcpSendComm(TcpDevice& dev, std::vector<int> fds, int ifaces, std::string peerName,
                         const SocketOptions& opts)
    : TcpComm<SendComm>(dev, std::move(fds), ifaces, std::move(peerName)), writeMax_(opts.writeMax),
      stripeMin_(std::max<uint64_t>(opts.stripeMin, 1)), chunk_(std::max<uint32_t>(opts.chunk, 4096)) {
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
  TcpRequest* r = acquire();
  if (r == nullptr) return Status::kOk;  // back-pressure
  r->n = 0;
  r->size = size;
  r->seq = seq_++;
  r->assigned = 0;
  r->itemsLeft = 1;
  const bool pieces = nFlows_ > 1 && size >= stripeMin_;
  Item& h = r->head;
  MsgHeader mhdr{size | (pieces ? MsgHeader::kInPieces : 0), tag, msgCheck(r->seq)};
  std::memcpy(h.hdr, &mhdr, sizeof(mhdr));
  h.src = static_cast<const uint8_t*>(data);
  h.len = pieces ? 0 : size;
  h.sent = 0;
  h.r = r;
  h.next = nullptr;
  r->next = nullptr;
  if (pieces) {
    (bulkTail_ ? bulkTail_->next : bulkHead_) = r;
    bulkTail_ = r;
  } else {
    r->assigned = size;
  }
  Flow& f0 = flows_[0];
  const bool idle = f0.head == nullptr;
  enqueue(f0, &h);
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
//
// Flow 0 takes pieces of the newest message only: a piece of an earlier one behind a later header would wait on
// the receiver for that later message's receive, which NCCL may post only once the earlier one completed.
bool TcpSendComm::pullPiece(int k) {
  TcpRequest* r = bulkHead_;
  if (r == nullptr || freeItems_ == nullptr) return false;
  if (k == 0 && r->seq != seq_ - 1) return false;
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
  if (r->assigned == r->size) {
    bulkHead_ = r->next;
    if (bulkHead_ == nullptr) bulkTail_ = nullptr;
    r->next = nullptr;
  }
  enqueue(flows_[k], it);
  return true;
}

void TcpSendComm::itemDone(Item* it) {
  TcpRequest* r = it->r;
  if (it != &r->head) {
    it->r = nullptr;
    it->next = freeItems_;
    freeItems_ = it;
  }
  if (--r->itemsLeft == 0 && r->assigned == r->size) r->complete = true;
}

// The flows write in turns, one sendmsg each a round, while any took all it was offered: pieces go to the flows
// in step with what each socket takes.
void TcpSendComm::progress() {
  bool more = true;
  while (more && fatal_ == Status::kOk) {
    more = false;
    for (int k = 0; k < nFlows_ && fatal_ == Status::kOk; ++k) {
      if (flows_[k].head != nullptr || bulkHead_ != nullptr) more = progressFlow(k) || more;
    }
  }
}

bool TcpSendComm::progressFlow(int k) {
  Flow& f = flows_[k];
  constexpr int kIov = 64;
  {
    // A flow keeps about two chunks queued: one being written, one to follow in the same call.
    while (f.queued < 2 * uint64_t{chunk_} && bulkHead_ != nullptr && pullPiece(k)) {
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
void TcpSendComm::forget(TcpRequest* r) { unlink(bulkHead_, bulkTail_, r); }

// ---- receiving --------------------------------------------------------------------------------------------------

TcpRecvComm::TcpRecvComm(TcpDevice& dev, std::vector<int> fds, int ifaces, std::string peerName,
                         const SocketOptions& opts)
    : TcpComm<RecvComm>(dev, std::move(fds), ifaces, std::move(peerName)),
      stage_(numa::makeArray<uint8_t>(kStage, dev.props.numaNode)) {
  (void)opts;  // the sender decides what travels in pieces (its header says so)
  if (!stage_) throw std::bad_alloc();
  if (nFlows_ > 1) {
    slots_ = numa::makeArray<Slot>(kWindow, dev.props.numaNode);
    if (!slots_) throw std::bad_alloc();
  }
}

TcpRecvComm::~TcpRecvComm() {
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
    if (got == 0) {
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
  bool all = true;
  for (int j = 0; j < nFlows_; ++j) all = all && flows_[j].ended;
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
  const uint64_t size = h.size & ~MsgHeader::kInPieces;
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
  while (fatal_ == Status::kOk && !f.ended) {
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
  progressFlow0();
  for (int k = 1; k < nFlows_ && fatal_ == Status::kOk; ++k) progressPieces(k);
}

// ---- listening --------------------------------------------------------------------------------------------------

TcpListenComm::TcpListenComm(TcpDevice& dev, std::vector<int> fds, uint64_t token, SocketOptions opts)
    : dev_(dev), listenFds_(std::move(fds)), token_(token), opts_(opts) {}

TcpListenComm::~TcpListenComm() {
  for (auto& in : incoming_) ::close(in.fd);
  for (int fd : listenFds_) ::close(fd);
}

Status TcpListenComm::accept(RecvComm** recvComm) {
  *recvComm = nullptr;
  for (size_t k = 0; k < listenFds_.size(); ++k) {
    while (incoming_.size() < kMaxIncoming) {
      sockaddr_storage sa{};
      socklen_t len = sizeof(sa);
      int fd = ::accept4(listenFds_[k], reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (wouldBlock(errno)) break;
        WEFT_WARN("accept on {}: {}", dev_.props.name, std::strerror(errno));
        return errno == EMFILE || errno == ENFILE ? Status::kSystem : Status::kInternal;
      }
      Incoming in;
      in.fd = fd;
      in.listenIface = static_cast<int>(k);
      in.peer = sockaddrString(reinterpret_cast<sockaddr*>(&sa));
      in.started = std::chrono::steady_clock::now();
      incoming_.push_back(std::move(in));
    }
  }
  bool mismatch = false;
  for (size_t k = 0; k < incoming_.size();) {
    Incoming& in = incoming_[k];
    if (!in.ready && serve(in, &mismatch)) {
      incoming_.erase(incoming_.begin() + static_cast<long>(k));
      continue;
    }
    if (!in.ready && std::chrono::steady_clock::now() - in.started > kHelloTimeout) {
      WEFT_WARN("accept on {}: {} connected but sent no complete hello within {} s; dropped", dev_.props.name,
                in.peer, kHelloTimeout.count());
      ::close(in.fd);
      incoming_.erase(incoming_.begin() + static_cast<long>(k));
      continue;
    }
    ++k;
  }
  // A peer whose tuner would decide differently fails the accept, as on the other backends: NCCL's init then
  // stops with the warning that names both, instead of hanging later.
  if (mismatch) return Status::kInvalidUsage;
  // A connection is complete when every one of its flows said hello (same nonce).
  for (const Incoming& first : incoming_) {
    if (!first.ready || first.hello.flow != 0) continue;
    const int flows = first.hello.flows;
    std::vector<size_t> members(static_cast<size_t>(flows), SIZE_MAX);
    for (size_t k = 0; k < incoming_.size(); ++k) {
      const Incoming& in = incoming_[k];
      if (in.ready && in.hello.nonce == first.hello.nonce && in.hello.flows == flows &&
          in.hello.ifaces == first.hello.ifaces && in.hello.flow < flows) {
        members[in.hello.flow] = k;
      }
    }
    if (std::find(members.begin(), members.end(), SIZE_MAX) != members.end()) continue;
    std::vector<int> fds;
    for (size_t m : members) {
      answer(incoming_[m], Hello::kAccepted, nullptr);
      fds.push_back(incoming_[m].fd);  // -1 where the answer could not be sent (the connector is gone)
    }
    const std::string peer = first.peer;
    const int ifaces = first.hello.ifaces;
    std::vector<Incoming> rest;
    for (size_t k = 0; k < incoming_.size(); ++k) {
      if (std::find(members.begin(), members.end(), k) == members.end()) rest.push_back(incoming_[k]);
    }
    incoming_ = std::move(rest);
    if (std::find(fds.begin(), fds.end(), -1) != fds.end()) {
      WEFT_INFO(NCCL_NET, "accept on {}: {} went away during the handshake", dev_.props.name, peer);
      for (int fd : fds) {
        if (fd >= 0) ::close(fd);
      }
      return Status::kOk;
    }
    used_ = true;
    for (int fd : fds) opts_.applyConnected(fd);
    *recvComm = numa::make<TcpRecvComm>(dev_.props.numaNode, dev_, fds, ifaces, peer, opts_);
    WEFT_INFO(NCCL_NET, "accepted {} on {} (tcp{})", peer, dev_.props.name,
              fds.size() > 1 ? ", " + std::to_string(fds.size()) + " flows" : std::string());
    return Status::kOk;
  }
  return Status::kOk;
}

// Sends the verdict; a refusal closes the socket. An accepted socket whose answer could not be sent whole (32 bytes
// into a fresh connection's empty buffer: only when the connector is gone) is closed too, its fd set to -1.
void TcpListenComm::answer(Incoming& in, uint16_t status, const char* why) {
  Hello a{};
  a.magic = Hello::kMagic;
  a.version = Hello::kVersion;
  a.status = status;
  a.token = in.hello.token;
  a.tunerDigest = transport::localDigest();
  a.nonce = in.hello.nonce;
  a.flow = in.hello.flow;
  a.flows = in.hello.flows;
  a.ifaces = in.hello.ifaces;
  if (why != nullptr) WEFT_WARN("accept on {}: refused {}: {}", dev_.props.name, in.peer, why);
  const ssize_t w = ::send(in.fd, &a, sizeof(a), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (status != Hello::kAccepted || w != static_cast<ssize_t>(sizeof(a))) {
    ::close(in.fd);
    in.fd = -1;
  }
}

bool TcpListenComm::serve(Incoming& in, bool* tunerMismatch) {
  while (in.got < sizeof(Hello)) {
    ssize_t r = ::recv(in.fd, reinterpret_cast<uint8_t*>(&in.hello) + in.got, sizeof(Hello) - in.got, MSG_DONTWAIT);
    if (r > 0) {
      in.got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && wouldBlock(errno)) return false;
    WEFT_INFO(NCCL_NET, "accept on {}: {} went away during the handshake", dev_.props.name, in.peer);
    ::close(in.fd);
    return true;
  }
  const Hello& h = in.hello;
  if (h.magic != Hello::kMagic || h.version != Hello::kVersion || h.status != Hello::kRequest) {
    answer(in, Hello::kBadRequest, "not a weft TCP hello of this version (run the same weft build on every node)");
  } else if (h.token != token_) {
    answer(in, Hello::kWrongToken, "wrong token: the handle belongs to another listen or job");
  } else if (h.flows < 1 || h.flows > kMaxFlows || h.flow >= h.flows || h.ifaces < 1 ||
             h.ifaces > listenFds_.size() || h.flow % h.ifaces != in.listenIface) {
    answer(in, Hello::kBadRequest, "a flow or interface this listen does not have");
  } else if (used_) {
    answer(in, Hello::kUsed, "this listen's handle was used already (a replayed handle)");
  } else if (!transport::agreesWith(h.tunerDigest)) {
    WEFT_WARN("accept on {}: {}", dev_.props.name, transport::agreementMismatch(h.tunerDigest, in.peer));
    answer(in, Hello::kTunerMismatch, nullptr);
    *tunerMismatch = true;
  } else {
    in.ready = true;
    return false;
  }
  return true;
}

}  // namespace weft::tcp
