// SPDX-License-Identifier: Apache-2.0
// The TCP backend's receive comm: headers on flow 0, pieces on every flow, messages held aside (tcp_comm.h says how it works).
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
  for (int k = 1; k < nFlows_; ++k) helpFlow(k, false);
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
    helpFlow(k, false);
  }
  if (ready_ == nFlows_) {
    acceptor_->removeJoin(token_, &box_);
    WEFT_INFO(NCCL_NET, "connection with {} on {}: {} flows", peerName_, dev_.props.name, ready_);
  }
}

TcpRecvComm::~TcpRecvComm() {
  detachHelpers();  // before the messages held aside go: a helper may be reading into one
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

// A message held aside into the receive that matched it: all of it but the pieces helpers are reading into it now
// (those are copied over once they are in, progressHelped).
void TcpRecvComm::copyAside(Unexpected* u, uint8_t* dst) {
  if (u->size == 0) return;
  if (u->helperPieces == 0) {
    std::memcpy(dst, u->data.get(), u->size);
    return;
  }
  std::pair<uint64_t, uint64_t> busy[kMaxFlows];  // [begin, end) a helper writes
  int n = 0;
  for (int k = 1; k < nFlows_; ++k) {
    if (flows_[k].aside != u) continue;
    const uint64_t at = static_cast<uint64_t>(flows_[k].task->dst - u->data.get());
    busy[n++] = {at, at + flows_[k].task->len};
  }
  std::sort(busy, busy + n);
  uint64_t from = 0;
  for (int j = 0; j <= n; ++j) {
    const uint64_t to = j < n ? busy[j].first : u->size;
    if (to > from) std::memcpy(dst + from, u->data.get() + from, to - from);
    if (j < n) from = std::max(from, busy[j].second);
  }
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
    copyAside(u, r->dst[i]);
    const uint64_t arrived = u->got;
    if (arrived == u->size) {
      dropUnexpected(u);
    } else {
      u->r = r;
      u->buf = i;
      if (u->helperPieces == 0) u->data.reset();  // else once the pieces helpers read into it are in
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
      ++moved_;
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
  for (int k = 1; k < nFlows_ && fatal_ == Status::kOk; ++k) {
    if (flows_[k].task != nullptr) {
      progressHelped(k);
    } else {
      progressPieces(k);
    }
  }
}

// A flow a helper moves: a piece header it read goes to its message (or waits, as inline, until flow 0 matched
// it), and the helper is told where the bytes go; a piece it read whole is counted in. A piece read into a message
// held aside that a receive matched meanwhile is copied over to that receive.
void TcpRecvComm::progressHelped(int k) {
  Flow& f = flows_[k];
  FlowTask& t = *f.task;
  for (int round = 0; round < 4 && fatal_ == Status::kOk && !f.ended; ++round) {
    switch (t.state.load(std::memory_order_acquire)) {
      case FlowTask::kHeaderReady: {
        bool wait = false;
        const int slot = pieceSlot(t.hdr, k, &wait);
        if (slot < 0) return;  // not matched yet, or the comm failed
        if (t.hdr.len == 0) {
          t.state.store(FlowTask::kHeader, std::memory_order_release);
          kick(&t);
          continue;
        }
        const Slot& s = slots_[slot];
        f.slot = slot;
        f.aside = s.u != nullptr && s.u->r == nullptr ? s.u : nullptr;
        if (f.aside != nullptr) ++f.aside->helperPieces;
        t.dst = (s.u != nullptr ? s.u->base() : s.r->dst[s.buf]) + t.hdr.offset;
        t.len = t.hdr.len;
        t.got.store(0, std::memory_order_relaxed);
        ++moved_;
        t.state.store(FlowTask::kBody, std::memory_order_release);
        kick(&t);
        return;
      }
      case FlowTask::kBodyDone: {
        const uint64_t n = t.len, off = t.hdr.offset;  // read before the helper may take the next header
        Unexpected* u = f.aside;
        f.aside = nullptr;
        ++moved_;
        t.state.store(FlowTask::kHeader, std::memory_order_release);
        kick(&t);
        if (u != nullptr && --u->helperPieces >= 0 && u->r != nullptr) {
          std::memcpy(u->r->dst[u->buf] + off, u->data.get() + off, n);
          if (u->helperPieces == 0) u->data.reset();
        }
        pieceIn(f.slot, n);
        continue;
      }
      case FlowTask::kEnded:
        f.ended = true;
        flowEnded(k);
        return;
      case FlowTask::kFailed: {
        const int e = t.err.load(std::memory_order_relaxed);
        if (e == FlowTask::kClosedMidPiece) {
          flowDown(k, RailEvent::kPeerGone);
          fail(Status::kRemote, "the peer closed the connection" + flowName(k) +
                                    " inside a piece: its process ended or closed the comm");
        } else {
          failErrno(e, "recv", k);
        }
        return;
      }
      default:
        return;  // the helper's turn
    }
  }
}

}  // namespace weft::tcp
