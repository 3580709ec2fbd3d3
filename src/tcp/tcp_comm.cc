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
  o.writeMax = static_cast<size_t>(params::getInt("WEFT_TCP_WRITE_MAX"));
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
}

// ---- requests and the comm's pool --------------------------------------------------------------------------------

Status TcpRequest::test(bool* done, int* sizes) {
  if (comm == nullptr || !inUse) {
    WEFT_WARN("test of a request that is not in flight (tested again after it completed?)");
    return Status::kInternal;
  }
  return comm->testRequest(this, done, sizes);
}

TcpDataComm::TcpDataComm(TcpDevice& dev, int fd, std::string peerName)
    : dev_(dev), fd_(fd), peerName_(std::move(peerName)) {
  add(counters().commsOpen, 1);
}

TcpDataComm::~TcpDataComm() {
  if (fd_ >= 0) ::close(fd_);
  add(counters().commsOpen, -1);
}

TcpRequest* TcpDataComm::acquire() {
  if (free_ == nullptr) {
    if (chunks_.size() * kChunk >= kMaxPool) return nullptr;  // NCCL retries a NULL request
    auto chunk = std::make_unique<TcpRequest[]>(kChunk);
    for (int i = kChunk - 1; i >= 0; --i) {
      chunk[i].comm = this;
      chunk[i].magic_ = kRequestMagic;
      chunk[i].next = free_;
      free_ = &chunk[i];
    }
    chunks_.push_back(std::move(chunk));
  }
  TcpRequest* r = free_;
  free_ = r->next;
  r->next = nullptr;
  r->inUse = true;
  r->complete = false;
  return r;
}

void TcpDataComm::release(TcpRequest* r) {
  r->inUse = false;
  r->next = free_;
  free_ = r;
}

void TcpDataComm::enqueue(TcpRequest* r) {
  r->next = nullptr;
  if (tail_ != nullptr) {
    tail_->next = r;
  } else {
    head_ = r;
  }
  tail_ = r;
}

void TcpDataComm::fail(Status st, const std::string& why) {
  if (fatal_ != Status::kOk) return;
  fatal_ = st;
  WEFT_WARN("connection with {} on {} failed: {}", peerName_, dev_.props.name, why);
}

Status TcpDataComm::testRequest(TcpRequest* r, bool* done, int* sizes) {
  *done = false;
  if (!r->complete) progress();
  if (!r->complete) {
    if (fatal_ == Status::kOk) return Status::kOk;
    // The request is NCCL's no more once an error is reported: it leaves the queue and returns to the pool.
    TcpRequest** p = &head_;
    TcpRequest* prev = nullptr;
    while (*p != nullptr && *p != r) {
      prev = *p;
      p = &(*p)->next;
    }
    if (*p == r) {
      *p = r->next;
      if (tail_ == r) tail_ = prev;
    }
    release(r);  // a receive's cur_ may still name it: the comm is failed, nothing reads cur_ again
    return fatal_;
  }
  *done = true;
  if (sizes != nullptr) {
    if (r->n == 0) {
      sizes[0] = static_cast<int>(std::min<uint64_t>(r->hdr.size, INT_MAX));
    } else {
      for (int i = 0; i < r->n; ++i) sizes[i] = static_cast<int>(std::min<uint64_t>(r->got[i], INT_MAX));
    }
  }
  release(r);
  return Status::kOk;
}

Status TcpDataComm::checkMh(const MemHandle* mh, const void* data, size_t size, const char* op) const {
  if (mh == nullptr) return Status::kOk;  // TCP reads and writes any host memory
  if (mh->magic_ != kMrMagic) {
    WEFT_WARN("{} with a memory handle that is not weft's", op);
    return Status::kInvalidUsage;
  }
  const auto p = reinterpret_cast<uintptr_t>(data);
  if (size > 0 && (p < mh->addr || p + size > mh->addr + mh->len)) {
    WEFT_WARN("{}: [{:#x}, +{}) lies outside its registration [{:#x}, +{})", op, p, size, mh->addr, mh->len);
    return Status::kInvalidUsage;
  }
  return Status::kOk;
}

Status TcpDataComm::regMrImpl(void* data, size_t size, int type, MemHandle** out) {
  *out = nullptr;
  if (type != NCCL_PTR_HOST) {
    WEFT_WARN("regMr on {}: memory type {:#x} is not host memory; the TCP backend advertises host memory only "
              "(NCCL stages GPU data through host buffers)",
              dev_.props.name, type);
    return Status::kInvalidUsage;
  }
  return dev_.cache->reg(data, size, type, out);
}

Status TcpDataComm::deregMrImpl(MemHandle* mh) {
  if (mh == nullptr || mh->magic_ != kMrMagic) return Status::kInvalidUsage;
  return dev_.cache->dereg(mh);
}

template <typename Iface>
Status TcpComm<Iface>::regMrDmaBuf(void*, size_t, int type, uint64_t, int, MemHandle** out) {
  *out = nullptr;
  WEFT_WARN("regMrDmaBuf on {} (type {:#x}): the TCP backend does not advertise NCCL_PTR_DMABUF; refused",
            dev_.props.name, type);
  return Status::kInvalidUsage;
}
template class TcpComm<SendComm>;
template class TcpComm<RecvComm>;

// ---- sending ----------------------------------------------------------------------------------------------------

Status TcpSendComm::isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  if (Status st = checkMh(mh, data, size, "isend"); st != Status::kOk) return st;
  TcpRequest* r = acquire();
  if (r == nullptr) return Status::kOk;  // back-pressure
  r->n = 0;
  r->hdr.size = size;
  r->hdr.tag = tag;
  r->hdr.check = MsgHeader::kCheck ^ seq_++;
  r->src = static_cast<const uint8_t*>(data);
  r->sent = 0;
  const bool idle = head_ == nullptr;
  enqueue(r);
  if (idle) progress();  // header and payload leave in this call when the socket has room
  *request = r;
  return Status::kOk;
}

void TcpSendComm::progress() {
  if (fatal_ != Status::kOk) return;
  constexpr int kIov = 64;
  while (head_ != nullptr) {
    iovec iov[kIov];
    int k = 0;
    size_t want = 0;
    // At most writeMax_ bytes a call: one huge sendmsg (8 queued 1 MiB messages) measured half the bandwidth of
    // 512 KiB ones on loopback (docs/tcp.md), the receiver draining while the sender copies.
    for (TcpRequest* r = head_; r != nullptr && k + 2 <= kIov && want < writeMax_; r = r->next) {
      if (r->sent < sizeof(MsgHeader)) {
        iov[k++] = {reinterpret_cast<uint8_t*>(&r->hdr) + r->sent, sizeof(MsgHeader) - r->sent};
        want += sizeof(MsgHeader) - r->sent;
      }
      const uint64_t off = r->sent > sizeof(MsgHeader) ? r->sent - sizeof(MsgHeader) : 0;
      if (r->hdr.size > off) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(r->hdr.size - off, writeMax_ - want));
        iov[k++] = {const_cast<uint8_t*>(r->src) + off, len};
        want += len;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(k);
    const ssize_t w = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    add(counters().sendCalls, 1);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (wouldBlock(errno)) return;
      fail(errno == EPIPE || errno == ECONNRESET || errno == ETIMEDOUT ? Status::kRemote : Status::kSystem,
           std::string("send: ") + std::strerror(errno) +
               (errno == ETIMEDOUT ? " (the peer stopped acknowledging: host or link down)"
                                   : " (the peer closed the connection: its process ended or aborted)"));
      return;
    }
    add(counters().bytesSent, w);
    uint64_t left = static_cast<uint64_t>(w);
    while (head_ != nullptr && left > 0) {
      TcpRequest* r = head_;
      const uint64_t total = sizeof(MsgHeader) + r->hdr.size;
      const uint64_t take = std::min(left, total - r->sent);
      r->sent += take;
      left -= take;
      if (r->sent == total) {
        r->complete = true;
        head_ = r->next;
        if (head_ == nullptr) tail_ = nullptr;
      }
    }
    if (static_cast<size_t>(w) < want) return;  // the socket is full
  }
}

// ---- receiving --------------------------------------------------------------------------------------------------

TcpRecvComm::TcpRecvComm(TcpDevice& dev, int fd, std::string peerName)
    : TcpComm<RecvComm>(dev, fd, std::move(peerName)), stage_(new uint8_t[kStage]) {}

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
  enqueue(r);
  *request = r;
  return Status::kOk;
}

Status TcpRecvComm::iflush(int, void**, const int*, MemHandle**, Request** request) {
  // Host memory only: what recv() wrote is visible to the CPU and to cudaMemcpy already; nothing to flush.
  *request = nullptr;
  return fatal_;
}

bool TcpRecvComm::fillStage() {
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (begin_ > 0 && kStage - end_ < sizeof(MsgHeader) * 4) {
    std::memmove(stage_.get(), stage_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  for (;;) {
    const ssize_t got = ::recv(fd_, stage_.get() + end_, kStage - end_, MSG_DONTWAIT);
    add(counters().recvCalls, 1);
    if (got > 0) {
      add(counters().bytesReceived, got);
      end_ += static_cast<size_t>(got);
      return true;
    }
    if (got == 0) {
      fail(Status::kRemote, "the peer closed the connection with receives outstanding (its process ended or "
                            "closed the comm)");
      return false;
    }
    if (errno == EINTR) continue;
    if (!wouldBlock(errno)) {
      fail(errno == ECONNRESET || errno == ETIMEDOUT ? Status::kRemote : Status::kSystem,
           std::string("recv: ") + std::strerror(errno) +
               (errno == ETIMEDOUT ? " (the peer stopped answering: host or link down)" : ""));
    }
    return false;
  }
}

bool TcpRecvComm::matchHeader() {
  MsgHeader h;
  std::memcpy(&h, stage_.get() + begin_, sizeof(h));
  if (h.check != (MsgHeader::kCheck ^ seq_)) {
    fail(Status::kRemote, "a message header failed its check (message " + std::to_string(seq_) +
                              "): the stream is corrupt or out of step");
    return false;
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
      r->want[i] = h.size;
      r->got[i] = 0;
      cur_ = r;
      curBuf_ = i;
      return true;
    }
  }
  return false;  // its receive is not posted yet: the header waits
}

void TcpRecvComm::bufferDone() {
  TcpRequest* r = cur_;
  cur_ = nullptr;
  if (++r->filled < r->n) return;
  r->complete = true;
  // Completed requests leave the queue (from anywhere: a later group may fill before an earlier one).
  TcpRequest** p = &head_;
  TcpRequest* prev = nullptr;
  while (*p != r) {
    prev = *p;
    p = &(*p)->next;
  }
  *p = r->next;
  if (tail_ == r) tail_ = prev;
}

void TcpRecvComm::progress() {
  while (fatal_ == Status::kOk) {
    if (cur_ != nullptr) {
      TcpRequest* r = cur_;
      const int i = curBuf_;
      uint64_t rem = r->want[i] - r->got[i];
      if (rem > 0 && end_ > begin_) {
        const size_t c = static_cast<size_t>(std::min<uint64_t>(rem, end_ - begin_));
        std::memcpy(r->dst[i] + r->got[i], stage_.get() + begin_, c);
        begin_ += c;
        r->got[i] += c;
        rem -= c;
      }
      if (rem == 0) {
        bufferDone();
        continue;
      }
      if (rem >= kDirectMin) {
        const ssize_t got = ::recv(fd_, r->dst[i] + r->got[i], rem, MSG_DONTWAIT);
        add(counters().recvCalls, 1);
        if (got > 0) {
          add(counters().bytesReceived, got);
          r->got[i] += static_cast<uint64_t>(got);
          if (static_cast<uint64_t>(got) < rem) return;  // the socket is empty for now
          continue;
        }
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && wouldBlock(errno)) return;
        if (got == 0) {
          fail(Status::kRemote, "the peer closed the connection in the middle of a message (its process ended)");
        } else {
          fail(errno == ECONNRESET || errno == ETIMEDOUT ? Status::kRemote : Status::kSystem,
               std::string("recv: ") + std::strerror(errno));
        }
        return;
      }
      if (!fillStage()) return;
      continue;
    }
    if (head_ == nullptr) return;  // nothing posted: leave the bytes in the socket
    if (end_ - begin_ >= sizeof(MsgHeader)) {
      if (!matchHeader()) return;
      continue;
    }
    if (!fillStage()) return;
  }
}

// ---- listening --------------------------------------------------------------------------------------------------

TcpListenComm::TcpListenComm(TcpDevice& dev, int fd, uint64_t token, SocketOptions opts)
    : dev_(dev), listenFd_(fd), token_(token), opts_(opts) {}

TcpListenComm::~TcpListenComm() {
  for (auto& in : incoming_) ::close(in.fd);
  ::close(listenFd_);
}

Status TcpListenComm::accept(RecvComm** recvComm) {
  *recvComm = nullptr;
  while (incoming_.size() < kMaxIncoming) {
    sockaddr_storage sa{};
    socklen_t len = sizeof(sa);
    int fd = ::accept4(listenFd_, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (wouldBlock(errno)) break;
      WEFT_WARN("accept on {}: {}", dev_.props.name, std::strerror(errno));
      return errno == EMFILE || errno == ENFILE ? Status::kSystem : Status::kInternal;
    }
    Incoming in;
    in.fd = fd;
    in.peer = sockaddrString(reinterpret_cast<sockaddr*>(&sa));
    in.started = std::chrono::steady_clock::now();
    incoming_.push_back(std::move(in));
    break;  // one a call: NCCL's listen has one connector (more, refused, come on later calls)
  }
  for (size_t k = 0; k < incoming_.size();) {
    if (serve(incoming_[k], recvComm)) {
      incoming_.erase(incoming_.begin() + static_cast<long>(k));
      if (*recvComm != nullptr) return Status::kOk;
      continue;
    }
    if (std::chrono::steady_clock::now() - incoming_[k].started > kHelloTimeout) {
      WEFT_WARN("accept on {}: {} connected but sent no complete hello within {} s; dropped", dev_.props.name,
                incoming_[k].peer, kHelloTimeout.count());
      ::close(incoming_[k].fd);
      incoming_.erase(incoming_.begin() + static_cast<long>(k));
      continue;
    }
    ++k;
  }
  return Status::kOk;
}

bool TcpListenComm::serve(Incoming& in, RecvComm** out) {
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
  Hello answer{};
  answer.magic = Hello::kMagic;
  answer.version = Hello::kVersion;
  answer.token = in.hello.token;
  answer.tunerDigest = transport::localDigest();
  const char* why = nullptr;
  if (in.hello.magic != Hello::kMagic || in.hello.version != Hello::kVersion || in.hello.status != Hello::kRequest) {
    answer.status = Hello::kBadRequest;
    why = "not a weft TCP hello of this version (run the same weft build on every node)";
  } else if (in.hello.token != token_) {
    answer.status = Hello::kWrongToken;
    why = "wrong token: the handle belongs to another listen or job";
  } else if (used_) {
    answer.status = Hello::kUsed;
    why = "this listen's handle was used already (a replayed handle)";
  } else if (!transport::agreesWith(in.hello.tunerDigest)) {
    answer.status = Hello::kTunerMismatch;
    WEFT_WARN("accept on {}: {}", dev_.props.name, transport::agreementMismatch(in.hello.tunerDigest, in.peer));
  } else {
    answer.status = Hello::kAccepted;
  }
  if (why != nullptr) WEFT_WARN("accept on {}: refused {}: {}", dev_.props.name, in.peer, why);
  // 32 bytes into a fresh connection's empty socket buffer: sent whole, or the connection is gone.
  const ssize_t w = ::send(in.fd, &answer, sizeof(answer), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (answer.status != Hello::kAccepted || w != static_cast<ssize_t>(sizeof(answer))) {
    if (answer.status == Hello::kAccepted) {
      WEFT_INFO(NCCL_NET, "accept on {}: {} went away during the handshake", dev_.props.name, in.peer);
    }
    ::close(in.fd);
    return true;
  }
  used_ = true;
  opts_.applyConnected(in.fd);
  *out = new TcpRecvComm(dev_, in.fd, in.peer);
  WEFT_INFO(NCCL_NET, "accepted {} on {} (tcp)", in.peer, dev_.props.name);
  return true;
}

}  // namespace weft::tcp
