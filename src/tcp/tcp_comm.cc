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

TcpDataComm::TcpDataComm(TcpDevice& dev, std::vector<int> fds, std::string peerName)
    : dev_(dev), nRails_(static_cast<int>(fds.size())), peerName_(std::move(peerName)),
      pool_(kMaxPool, dev.props.numaNode) {
  for (int k = 0; k < nRails_; ++k) {
    rails_[k].fd = fds[k];
    health_[k].setDevice(static_cast<size_t>(k) < dev_.rails.size() ? dev_.rails[k].ifname.c_str()
                                                                     : dev_.props.name.c_str());
  }
  add(counters().commsOpen, 1);
}

TcpDataComm::~TcpDataComm() {
  for (int k = 0; k < nRails_; ++k) {
    if (rails_[k].fd >= 0) ::close(rails_[k].fd);
  }
  add(counters().commsOpen, -1);
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

// A rail of a multi-rail comm is marked down by what failed it (its health, weft/common/rail_health.h). A socket
// cannot come back: no recovery here (docs/failover.md).
void TcpDataComm::railDown(int k, RailEvent why) {
  if (nRails_ > 1 && k >= 0 && k < nRails_) health_[k].markDown(why);
}

void TcpDataComm::failErrno(int err, const char* call, int k) {
  const bool peer = err == EPIPE || err == ECONNRESET || err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH;
  const bool unreachable = err == EHOSTUNREACH || err == ENETUNREACH;
  railDown(k, err == ETIMEDOUT ? RailEvent::kProbeLost
              : unreachable ? RailEvent::kLinkDown
              : peer        ? RailEvent::kPeerGone
                            : RailEvent::kErrorCompletion);
  std::string why = std::string(call) + (nRails_ > 1 ? " on rail " + std::to_string(k) : std::string()) + ": " +
                    std::strerror(err);
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


// Where piece k of a message of `size` bytes cut into `n` pieces starts, and its length (the last takes the rest).
uint64_t pieceOffset(uint64_t size, int k, int n) { return size / static_cast<uint64_t>(n) * static_cast<uint64_t>(k); }
uint64_t pieceLength(uint64_t size, int k, int n) {
  return k == n - 1 ? size - pieceOffset(size, k, n) : size / static_cast<uint64_t>(n);
}

// ---- sending ----------------------------------------------------------------------------------------------------

Status TcpSendComm::isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  if (Status st = checkMh(mh, data, size, "isend"); st != Status::kOk) return st;
  TcpRequest* r = acquire();
  if (r == nullptr) return Status::kOk;  // back-pressure
  r->n = 0;
  r->size = size;
  const uint32_t check = MsgHeader::kCheck ^ seq_++;
  const auto* src = static_cast<const uint8_t*>(data);
  const int pieces = nRails_ > 1 && size >= stripeMin_ ? nRails_ : 1;
  r->segsLeft = static_cast<uint8_t>(pieces);
  for (int k = 0; k < pieces; ++k) {
    TcpRequest::Segment& g = r->seg[k];
    // rail 0's header names the whole message (the receiver matches on it); a piece's header its own length
    g.hdr.size = k == 0 ? size : pieceLength(size, k, pieces);
    g.hdr.tag = tag;
    g.hdr.check = check;
    g.src = src + pieceOffset(size, k, pieces);
    g.len = pieceLength(size, k, pieces);
    g.sent = 0;
    g.next = nullptr;
    Rail& q = rails_[k];
    const bool idle = q.head == nullptr;
    if (q.tail != nullptr) {
      q.tail->seg[k].next = r;
    } else {
      q.head = r;
    }
    q.tail = r;
    if (idle) progressRail(k);  // header and payload leave in this call when the socket has room
  }
  *request = r;
  return Status::kOk;
}

void TcpSendComm::progress() {
  for (int k = 0; k < nRails_ && fatal_ == Status::kOk; ++k) {
    if (rails_[k].head != nullptr) progressRail(k);
  }
}

void TcpSendComm::progressRail(int k) {
  if (fatal_ != Status::kOk) return;
  Rail& q = rails_[k];
  constexpr int kIov = 64;
  while (q.head != nullptr) {
    iovec iov[kIov];
    int n = 0;
    size_t want = 0;
    // At most writeMax_ bytes a call: one huge sendmsg (8 queued 1 MiB messages) measured half the bandwidth of
    // 512 KiB ones on loopback (docs/tcp.md), the receiver draining while the sender copies.
    for (TcpRequest* r = q.head; r != nullptr && n + 2 <= kIov && want < writeMax_; r = r->seg[k].next) {
      TcpRequest::Segment& g = r->seg[k];
      if (g.sent < sizeof(MsgHeader)) {
        iov[n++] = {reinterpret_cast<uint8_t*>(&g.hdr) + g.sent, sizeof(MsgHeader) - g.sent};
        want += sizeof(MsgHeader) - g.sent;
      }
      const uint64_t off = g.sent > sizeof(MsgHeader) ? g.sent - sizeof(MsgHeader) : 0;
      if (g.len > off && want < writeMax_) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(g.len - off, writeMax_ - want));
        iov[n++] = {const_cast<uint8_t*>(g.src) + off, len};
        want += len;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = ::sendmsg(q.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    add(counters().sendCalls, 1);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (wouldBlock(errno)) return;
      failErrno(errno, "send", k);
      return;
    }
    add(counters().bytesSent, w);
    RailHealth& h = health_[k];
    RailHealth::bump(h.bytes, w);
    uint64_t left = static_cast<uint64_t>(w);
    while (q.head != nullptr && left > 0) {
      TcpRequest* r = q.head;
      TcpRequest::Segment& g = r->seg[k];
      const uint64_t total = sizeof(MsgHeader) + g.len;
      const uint64_t take = std::min(left, total - g.sent);
      g.sent += take;
      left -= take;
      if (g.sent < total) break;
      q.head = g.next;
      if (q.head == nullptr) q.tail = nullptr;
      RailHealth::bump(h.msgs, 1);
      if (--r->segsLeft == 0) r->complete = true;
    }
    if (static_cast<size_t>(w) < want) return;  // the socket is full
  }
}

void TcpSendComm::forget(TcpRequest* r) {
  for (int k = 0; k < nRails_; ++k) {
    Rail& q = rails_[k];
    TcpRequest* prev = nullptr;
    for (TcpRequest* p = q.head; p != nullptr; prev = p, p = p->seg[k].next) {
      if (p != r) continue;
      (prev ? prev->seg[k].next : q.head) = r->seg[k].next;
      if (q.tail == r) q.tail = prev;
      break;
    }
  }
}

// ---- receiving --------------------------------------------------------------------------------------------------

TcpRecvComm::TcpRecvComm(TcpDevice& dev, std::vector<int> fds, std::string peerName, const SocketOptions& opts)
    : TcpComm<RecvComm>(dev, std::move(fds), std::move(peerName)), stage_(numa::makeArray<uint8_t>(kStage, dev.props.numaNode)),
      stripeMin_(opts.stripeMin) {
  if (!stage_) throw std::bad_alloc();
  for (int k = 1; k < nRails_; ++k) rails_[k].pieces.reset(new Rail::Piece[Rail::kPieces]);
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

size_t TcpRecvComm::readSome(int k, uint8_t* p, size_t len) {
  for (;;) {
    const ssize_t got = ::recv(rails_[k].fd, p, len, MSG_DONTWAIT);
    add(counters().recvCalls, 1);
    if (got > 0) {
      add(counters().bytesReceived, got);
      return static_cast<size_t>(got);
    }
    if (got == 0) {
      railDown(k, RailEvent::kPeerGone);
      fail(Status::kRemote, std::string("the peer closed the connection") +
                                (nRails_ > 1 ? " (rail " + std::to_string(k) + ")" : std::string()) +
                                " with receives outstanding: its process ended or closed the comm");
      return 0;
    }
    if (errno == EINTR) continue;
    if (!wouldBlock(errno)) failErrno(errno, "recv", k);
    return 0;
  }
}

bool TcpRecvComm::fillStage() {
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (begin_ > 0 && kStage - end_ < sizeof(MsgHeader) * 4) {
    std::memmove(stage_.get(), stage_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  const size_t got = readSome(0, stage_.get() + end_, kStage - end_);
  end_ += got;
  return got > 0;
}

bool TcpRecvComm::matchHeader() {
  MsgHeader h;
  std::memcpy(&h, stage_.get() + begin_, sizeof(h));
  if (h.check != (MsgHeader::kCheck ^ seq_)) {
    fail(Status::kRemote, "a message header failed its check (message " + std::to_string(seq_) +
                              "): the stream is corrupt or out of step");
    return false;
  }
  const int pieces = nRails_ > 1 && h.size >= stripeMin_ ? nRails_ : 1;
  for (int k = 1; k < pieces; ++k) {
    if (rails_[k].pieceCount == Rail::kPieces) return false;  // rail k is that far behind: match later
  }
  for (TcpRequest* r = head_; r != nullptr; r = r->next) {
    if (r->matched == r->n) continue;
    for (int i = 0; i < r->n; ++i) {
      if (r->bufMatched[i] || r->tags[i] != h.tag) continue;
      if (h.size > r->cap[i]) {
        // The receive fails and, the stream holding bytes nobody will take, so does the comm.
        fail(Status::kInvalidUsage, "a " + std::to_string(h.size) + "-byte message (tag " + std::to_string(h.tag) +
                                        ") arrived for a " + std::to_string(r->cap[i]) +
                                        "-byte receive: sender and receiver disagree on the size");
        return false;
      }
      begin_ += sizeof(MsgHeader);
      ++seq_;
      r->bufMatched[i] = true;
      ++r->matched;
      --unmatched_;
      r->want[i] = h.size;
      r->got[i] = 0;
      for (int k = 1; k < pieces; ++k) {
        Rail& q = rails_[k];
        Rail::Piece& p = q.pieces[(q.pieceHead + q.pieceCount++) % Rail::kPieces];
        p.r = r;
        p.u = nullptr;
        p.buf = static_cast<uint8_t>(i);
        p.check = h.check;
        p.off = pieceOffset(h.size, k, pieces);
        p.len = pieceLength(h.size, k, pieces);
      }
      cur_ = r;
      curBuf_ = i;
      curOff_ = 0;
      curLeft_ = pieceLength(h.size, 0, pieces);
      if (curLeft_ == 0) {
        cur_ = nullptr;
        bytesIn(r, i, 0);
      }
      return true;
    }
  }
  // Its receive is not posted yet: held aside while there is room (the rest of its pieces and payload land there);
  // otherwise the header waits.
  if (unexpBytes_ + h.size > kUnexpectedMax) return false;
  auto* u = new Unexpected;
  u->tag = h.tag;
  u->size = h.size;
  u->data.reset(new uint8_t[h.size > 0 ? h.size : 1]);
  (unexpTail_ ? unexpTail_->next : unexpHead_) = u;
  unexpTail_ = u;
  unexpBytes_ += h.size;
  begin_ += sizeof(MsgHeader);
  ++seq_;
  for (int k = 1; k < pieces; ++k) {
    Rail& q = rails_[k];
    Rail::Piece& p = q.pieces[(q.pieceHead + q.pieceCount++) % Rail::kPieces];
    p.r = nullptr;
    p.u = u;
    p.check = h.check;
    p.off = pieceOffset(h.size, k, pieces);
    p.len = pieceLength(h.size, k, pieces);
  }
  curU_ = u;
  curOff_ = 0;
  curLeft_ = pieceLength(h.size, 0, pieces);
  if (curLeft_ == 0) {
    curU_ = nullptr;
    unexpectedIn(u, 0);
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

void TcpRecvComm::progressRail0() {
  while (fatal_ == Status::kOk) {
    if (cur_ != nullptr || curU_ != nullptr) {
      TcpRequest* r = cur_;
      Unexpected* u = curU_;
      const int i = curBuf_;
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
      if (curLeft_ == 0) cur_ = nullptr, curU_ = nullptr;
      if (u != nullptr) {
        unexpectedIn(u, n);
      } else {
        bytesIn(r, i, n);
      }
      if (drained) return;
      continue;
    }
    // Nothing posted that waits for a header: leave the bytes in the socket (and the end of the stream too: a
    // sender that closed after its last message has ended rail 0 while other rails still bring pieces).
    if (unmatched_ == 0) return;
    if (end_ - begin_ >= sizeof(MsgHeader)) {
      if (!matchHeader()) return;
      continue;
    }
    if (!fillStage()) return;
  }
}

void TcpRecvComm::progressPieces(int k) {
  Rail& q = rails_[k];
  while (fatal_ == Status::kOk) {
    if (!q.inPiece) {
      if (q.pieceCount == 0) return;  // rail 0 has matched no message with a piece here yet
      q.cur = q.pieces[q.pieceHead];
      q.pieceHead = (q.pieceHead + 1) % Rail::kPieces;
      --q.pieceCount;
      q.inPiece = true;
      q.hdrGot = 0;
    }
    Rail::Piece& c = q.cur;
    if (q.hdrGot < sizeof(MsgHeader)) {
      const size_t n = readSome(k, reinterpret_cast<uint8_t*>(&q.hdrIn) + q.hdrGot, sizeof(MsgHeader) - q.hdrGot);
      if (n == 0) return;
      q.hdrGot += n;
      if (q.hdrGot < sizeof(MsgHeader)) return;
      const int32_t tag = c.u != nullptr ? c.u->tag : c.r->tags[c.buf];
      if (q.hdrIn.check != c.check || q.hdrIn.size != c.len || q.hdrIn.tag != tag) {
        fail(Status::kRemote, "a piece header on rail " + std::to_string(k) +
                                  " does not match its message: the streams are corrupt or out of step");
        return;
      }
    }
    if (c.len > 0) {
      uint8_t* dst = (c.u != nullptr ? c.u->base() : c.r->dst[c.buf]) + c.off;
      const size_t n = readSome(k, dst, c.len);
      if (n == 0) return;
      c.off += n;
      c.len -= n;
      const bool more = c.len > 0;
      if (!more) q.inPiece = false;
      if (c.u != nullptr) {
        unexpectedIn(c.u, n);
      } else {
        bytesIn(c.r, c.buf, n);
      }
      if (more) return;  // the socket is empty for now
      continue;
    }
    q.inPiece = false;
  }
}

void TcpRecvComm::progress() {
  progressRail0();
  for (int k = 1; k < nRails_ && fatal_ == Status::kOk; ++k) progressPieces(k);
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
  for (size_t k = 0; k < listenFds_.size() && incoming_.size() < kMaxIncoming; ++k) {
    sockaddr_storage sa{};
    socklen_t len = sizeof(sa);
    int fd = ::accept4(listenFds_[k], reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || wouldBlock(errno)) continue;
      WEFT_WARN("accept on {}: {}", dev_.props.name, std::strerror(errno));
      return errno == EMFILE || errno == ENFILE ? Status::kSystem : Status::kInternal;
    }
    // One a call per rail: NCCL's listen has one connector (more, refused, come on later calls).
    Incoming in;
    in.fd = fd;
    in.listenRail = static_cast<int>(k);
    in.peer = sockaddrString(reinterpret_cast<sockaddr*>(&sa));
    in.started = std::chrono::steady_clock::now();
    incoming_.push_back(std::move(in));
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
  // A connection is complete when every one of its rails said hello (same nonce).
  for (const Incoming& first : incoming_) {
    if (!first.ready || first.hello.rail != 0) continue;
    const int rails = first.hello.rails;
    std::vector<size_t> members(static_cast<size_t>(rails), SIZE_MAX);
    for (size_t k = 0; k < incoming_.size(); ++k) {
      const Incoming& in = incoming_[k];
      if (in.ready && in.hello.nonce == first.hello.nonce && in.hello.rails == rails && in.hello.rail < rails) {
        members[in.hello.rail] = k;
      }
    }
    if (std::find(members.begin(), members.end(), SIZE_MAX) != members.end()) continue;
    std::vector<int> fds;
    for (size_t m : members) {
      answer(incoming_[m], Hello::kAccepted, nullptr);
      fds.push_back(incoming_[m].fd);  // -1 where the answer could not be sent (the connector is gone)
    }
    const std::string peer = first.peer;
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
    *recvComm = numa::make<TcpRecvComm>(dev_.props.numaNode, dev_, fds, peer, opts_);
    WEFT_INFO(NCCL_NET, "accepted {} on {} (tcp{})", peer, dev_.props.name,
              fds.size() > 1 ? ", " + std::to_string(fds.size()) + " rails" : std::string());
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
  a.rail = in.hello.rail;
  a.rails = in.hello.rails;
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
  } else if (h.rails < 1 || h.rails > listenFds_.size() || h.rail >= h.rails || h.rail != in.listenRail) {
    answer(in, Hello::kBadRequest, "a rail this listen does not have");
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
