// SPDX-License-Identifier: Apache-2.0
// The TCP backend's send comm: messages, pieces over the flows, flows joining and growing (tcp_comm.h says how it works).
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
#include "tcp/tcp_acceptor.h"
#include "tcp/tcp_helpers.h"
#include "tcp/tcp_util.h"

namespace weft::tcp {

using detail::add;
using detail::unlink;
using detail::wouldBlock;

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
  for (int k = 1; k < ready_; ++k) helpFlow(k, true);
}

TcpSendComm::~TcpSendComm() { detachHelpers(); }

Status TcpSendComm::isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  if (Status st = checkMh(mh, data, size, "isend"); st != Status::kOk) return st;
  if (size >= stripeMin_ && nFlows_ > 1) {
    // Bulk data: the other flows open now. A large message waits for them a moment (NCCL retries a NULL
    // request), so that even the first one travels over all of them.
    if (!joinsStarted_) openFlows(grow_ ? growStart() : nFlows_);
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
  // In pieces where several flows carry it, and where more are on their way or may be added (growing): a
  // message queued whole on flow 0 would stay there when they come, at one flow's pace.
  const bool pieces = size >= stripeMin_ && (ready_ > 1 || joiningLeft_ > 0 || grow_);
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
  if (f.task != nullptr) {
    f.task->ring[f.postedItems % FlowTask::kRing] = it;
    f.task->posted.store(++f.postedItems, std::memory_order_release);
  }
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
    if (grow_ && r->size >= stripeMin_) bulkDone(r->size);
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
  // Flow 0 of a connection of several keeps little unsent (TCP_NOTSENT_LOWAT), from its first bulk data on, the
  // first window of a growing one on this flow alone included: every message's header travels on it, and one
  // queued behind megabytes of earlier pieces in its socket buffer holds back the pieces of its message that the
  // other flows bring.
  if (!joinsStarted_ && nFlows_ > 1) opts_.applyFlow(flows_[0].fd);
  joinsStarted_ = true;
  if (plan_.peers.empty() || upTo <= opened_) return;
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
// flight, per window; the flows grow x4 while a window with more of them carries at least 10% more.
void TcpSendComm::bulkStarted() {
  if (bulkOut_++ == 0) busyFrom_ = std::chrono::steady_clock::now();
}

void TcpSendComm::bulkDone(uint64_t size) {
  const auto now = std::chrono::steady_clock::now();
  if (--bulkOut_ == 0) busy_ += now - busyFrom_;
  winBytes_ += size;
  const auto busy = busy_ + (bulkOut_ > 0 ? now - busyFrom_ : std::chrono::steady_clock::duration{});
  if (winBytes_ < kGrowWindowBytes || busy < kGrowWindowTime) return;
  const double gbps = static_cast<double>(winBytes_) * 8 / std::chrono::duration<double, std::nano>(busy).count();
  winBytes_ = 0;
  busy_ = {};
  busyFrom_ = now;
  // The window in which the count changed (the new flows' socket buffers filling, the pieces of messages queued
  // before spreading over them) says little: the next one measures. So does one in which flows still joined.
  // Every message, whenever it was sent, counts: its pieces are handed out as flows have room.
  if (settle_ || joiningLeft_ > 0) {
    settle_ = joiningLeft_ > 0;
    return;
  }
  if (lastGbps_ > 0 && gbps < lastGbps_ * 1.1) {
    // the last ones added nothing: they stay open but take no pieces (the flows below lastFlows_ carry on)
    grow_ = false;
    if (gbps < lastGbps_) active_ = std::max(1, lastFlows_);
    dev_.learnedFlows.store(std::min(active_, ready_), std::memory_order_relaxed);
    WEFT_INFO(NCCL_NET, "connection with {} on {}: {} flows carry its pieces ({} carried {:.2f} Gb/s, {} {:.2f})",
              peerName_, dev_.props.name, std::min(active_, ready_), lastFlows_, lastGbps_, ready_, gbps);
    return;
  }
  lastGbps_ = gbps;
  lastFlows_ = ready_;
  if (opened_ >= nFlows_) {
    grow_ = false;
    dev_.learnedFlows.store(ready_, std::memory_order_relaxed);
    WEFT_INFO(NCCL_NET, "connection with {} on {}: {} flows ({:.2f} Gb/s), the most it may have", peerName_,
              dev_.props.name, ready_, gbps);
    return;
  }
  // x4, or straight to what another connection of the device has found since this one started
  openFlows(std::max(opened_ * 4, dev_.learnedFlows.load(std::memory_order_relaxed)));
  settle_ = true;
}

// Growing: the first bulk data goes on a flow an interface, or on as many as the device's last grown connection
// found worth having (as many on each interface).
int TcpSendComm::growStart() const {
  const int learned = dev_.learnedFlows.load(std::memory_order_relaxed);
  return std::clamp((learned + nIfaces_ - 1) / nIfaces_ * nIfaces_, nIfaces_, nFlows_);
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
          helpFlow(k, true);
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

// A flow a helper moves: the bytes it wrote counted, the items it finished retired (completing their messages),
// and pieces handed to it while less than one is left to write, as progressFlow does inline.
void TcpSendComm::progressHelped(int k) {
  Flow& f = flows_[k];
  FlowTask& t = *f.task;
  if (const int e = t.err.load(std::memory_order_acquire); e != 0) {
    failErrno(e, "send", k);
    return;
  }
  const uint32_t done = t.done.load(std::memory_order_acquire);
  const uint64_t written = t.written.load(std::memory_order_acquire);
  if (written != f.seenWritten) {
    const uint64_t w = written - f.seenWritten;
    f.seenWritten = written;
    f.queued -= w;
    ++moved_;
    add(counters().flowBytesSent[k], static_cast<int64_t>(w));
    RailHealth::bump(health_[f.iface].bytes, w);
  }
  while (f.retired != done && f.head != nullptr) {
    Item* it = f.head;
    f.head = it->next;
    if (f.head == nullptr) f.tail = nullptr;
    ++f.retired;
    itemDone(it);
  }
  if (fatal_ != Status::kOk) return;
  bool posted = false;
  while (f.queued < chunk_ && bulkHead_ != nullptr && f.postedItems - f.retired < FlowTask::kRing && pullPiece(k)) {
    posted = true;
  }
  if (posted) kick(&t);
}

bool TcpSendComm::progressFlow(int k) {
  Flow& f = flows_[k];
  constexpr int kIov = 64;
  if (f.task != nullptr) {
    progressHelped(k);
    return false;  // the helper writes; nothing to repeat here
  }
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
    const ssize_t w = detail::sendIov(f.fd, iov, n, counters().sendCalls);
    if (w < 0) {
      if (!wouldBlock(errno)) failErrno(errno, "send", k);
      return false;
    }
    add(counters().bytesSent, w);
    add(counters().flowBytesSent[k], w);
    ++moved_;
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

}  // namespace weft::tcp
