// SPDX-License-Identifier: Apache-2.0
// The device API's RMA over weft's TCP sockets: the data path (tcp_rma.h says how it works).
#include "tcp/tcp_rma.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "weft/common/clock.h"
#include "weft/common/cuda_shim.h"
#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"

namespace weft::tcp {
namespace {

constexpr size_t kInBuffer = 16 << 10;             // a socket's staging buffer: frames and small payloads
constexpr size_t kGpuStage = kRmaGpuStage;
constexpr size_t kDirectMin = 4096;                // host payloads from this size are received in place
constexpr size_t kRecvBudget = kRmaRecvBudget;
constexpr int kMaxIov = 64;

uint64_t tokenOf(const RmaOp* op) { return (uint64_t{op->gen} << 32) | op->index; }

const char* frameName(uint8_t t) {
  switch (t) {
    case RmaFrame::kPut: return "put";
    case RmaFrame::kGetRequest: return "get";
    case RmaFrame::kGetAnswer: return "get answer";
    case RmaFrame::kRegister: return "registration";
    case RmaFrame::kError: return "error";
    case RmaFrame::kBye: return "bye";
    default: return "unknown frame";
  }
}

}  // namespace

TcpRmaComm::TcpRmaComm(int rank, int nranks, std::vector<PeerSocket> peers, const DeviceProps& props,
                       const SocketOptions& opts)
    : CommBase(rank, nranks, props),
      writeMax_(opts.writeMax),
      stripeMin_(std::max<uint64_t>(opts.stripeMin, 1)),
      chunk_(std::clamp<uint64_t>(opts.chunk, 4096, kGpuStage)),
      stallMs_(params::getInt("WEFT_STALL_S") * 1000),
      peers_(std::move(peers)) {
  for (auto& p : peers_) {
    if (p.fd < 0) continue;
    p.in.resize(kInBuffer);
    p.localAddr = localAddressOf(p.fd);
    sockaddr_storage sa{};
    socklen_t len = sizeof(sa);
    if (::getpeername(p.fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0 &&
        (sa.ss_family == AF_INET || sa.ss_family == AF_INET6)) {
      p.peerAddr = sockaddrString(reinterpret_cast<const sockaddr*>(&sa));
    }
  }
}

TcpRmaComm::~TcpRmaComm() {
  for (auto& p : peers_) {
    if (p.fd >= 0) ::close(p.fd);
    for (auto& f : p.data) {
      if (f.fd >= 0) ::close(f.fd);
    }
  }
}

// ---- requests ------------------------------------------------------------------------------------------------------

RmaOp* TcpRmaComm::takeOp() {
  RmaOp* op = pool_.take();
  if (op != nullptr) op->comm = this;
  return op;
}

void TcpRmaComm::freeOp(RmaOp* op) { pool_.give(op); }

// ---- operations -------------------------------------------------------------------------------------------------------

void TcpRmaComm::enqueue(PeerSocket& p, RmaOp* op) {
  op->state = RmaOp::kQueued;
  op->next = nullptr;
  if (p.tail != nullptr) {
    p.tail->next = op;
  } else {
    p.head = op;
  }
  p.tail = op;
  ++p.queued;
}

Status TcpRmaComm::putLocal(rma::Window* src, uint64_t srcOff, size_t size, rma::Window* dst, uint64_t dstOff,
                            const rma::Signal* signal) {
  std::string err;
  if (size > 0) {
    if (!src->cuda && !dst->cuda) {
      std::memmove(dst->base + dstOff, src->base + srcOff, size);
    } else {
      std::vector<char> bounce(std::min<size_t>(size, kGpuStage));
      for (size_t done = 0; done < size;) {
        const size_t n = std::min(bounce.size(), size - done);
        if (!rma::readWindow(bounce.data(), *src, srcOff + done, n, &err) ||
            !rma::writeWindow(*dst, dstOff + done, bounce.data(), n, &err)) {
          fail("a put to itself failed: " + err, Status::kSystem);
          return Status::kSystem;
        }
        done += n;
      }
    }
  }
  if (signal != nullptr && !rma::applySignal(*signal->window, signal->off, signal->op, signal->value, &err)) {
    fail("a signal to itself failed: " + err, Status::kSystem);
    return Status::kSystem;
  }
  return Status::kOk;
}

Status TcpRmaComm::iput(rma::Context* ctx, int context, rma::Window* src, uint64_t srcOff, size_t size,
                        rma::Window* dst, uint64_t dstOff, uint32_t rank, const rma::Signal* signal,
                        uint32_t optFlags, void** request) {
  if (request == nullptr) return Status::kInternal;
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = checkPut(ctx, context, src, srcOff, size, dst, dstOff, rank, signal); st != Status::kOk) return st;
  RmaOp* op = takeOp();
  if (op == nullptr) {
    WEFT_WARN("RMA iput: more than {} operations in flight on one comm", rma::OpPool<RmaOp>::kMax);
    return Status::kSystem;
  }
  op->ctx = ctx;
  op->peer = rank;
  op->postMs = coarseNowMs();
  *request = op;
  if (static_cast<int>(rank) == rank_) {
    const Status st = putLocal(src, srcOff, size, dst, dstOff, signal);
    op->state = st == Status::kOk ? RmaOp::kDone : RmaOp::kFailed;
    op->status = st;
    return Status::kOk;
  }
  PeerSocket& p = peers_[rank];
  if (p.lost || (size == 0 && signal == nullptr)) {
    op->state = p.lost ? RmaOp::kFailed : RmaOp::kDone;
    op->status = p.lost ? Status::kRemote : Status::kOk;
    return Status::kOk;
  }
  RmaFrame& f = op->frame;
  f.type = RmaFrame::kPut;
  f.context = static_cast<uint16_t>(context);
  f.window = size > 0 ? dst->id : 0;
  f.off = dstOff;
  f.size = size;
  if (signal != nullptr) {
    f.signalOp = static_cast<uint8_t>(signal->op);
    f.sigWindow = signal->window->id;
    f.sigOff = signal->off;
    f.value = signal->value;
  }
  if (size > 0) {
    op->src = src;
    op->srcOff = srcOff;
    ++src->inflight;
  }
  if (size >= stripeMin_ && !p.data.empty()) {
    // Its frame on the control flow; its payload in pieces the data flows take (the frame may go first).
    op->pieced = true;
    f.aux = RmaFrame::kPieced;
    f.putId = p.nextPutId++;
    if (p.pieceTail != nullptr) {
      p.pieceTail->nextPiece = op;
    } else {
      p.pieceHead = op;
    }
    p.pieceTail = op;
  }
  enqueue(p, op);
  if ((optFlags & 1u) == 0 && pumpSend(p) && op->pieced) pumpPiecesOut(rank);
  return Status::kOk;
}

Status TcpRmaComm::iget(rma::Context* ctx, int context, rma::Window* remote, uint64_t remoteOff, size_t size,
                        rma::Window* local, uint64_t localOff, uint32_t rank, uint32_t optFlags, void** request) {
  if (request == nullptr) return Status::kInternal;
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = checkGet(ctx, context, remote, remoteOff, size, local, localOff, rank); st != Status::kOk) {
    return st;
  }
  RmaOp* op = takeOp();
  if (op == nullptr) return Status::kSystem;
  op->ctx = ctx;
  op->peer = rank;
  op->postMs = coarseNowMs();
  *request = op;
  if (static_cast<int>(rank) == rank_ || size == 0) {
    const Status st = size == 0 ? Status::kOk : putLocal(remote, remoteOff, size, local, localOff, nullptr);
    if (local->cuda && size > 0) cudaGetsSinceFlush_ = true;
    op->state = st == Status::kOk ? RmaOp::kDone : RmaOp::kFailed;
    op->status = st;
    return Status::kOk;
  }
  PeerSocket& p = peers_[rank];
  if (p.lost) {
    op->state = RmaOp::kFailed;
    op->status = Status::kRemote;
    return Status::kOk;
  }
  RmaFrame& f = op->frame;
  f.type = RmaFrame::kGetRequest;
  f.context = static_cast<uint16_t>(context);
  f.window = remote->id;
  f.off = remoteOff;
  f.size = size;
  f.value = tokenOf(op);
  op->src = local;  // where the answer goes
  op->srcOff = localOff;
  ++local->inflight;
  enqueue(p, op);
  if ((optFlags & 1u) == 0) pumpSend(p);
  return Status::kOk;
}

Status TcpRmaComm::iflush(rma::Context* ctx, int context, rma::Window* w, uint32_t rank, void** request) {
  if (request == nullptr) return Status::kInternal;
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = checkContext(ctx, context, rank, "iflush"); st != Status::kOk) return st;
  if (Status st = checkWindow(w, "flushed"); st != Status::kOk) return st;
  RmaOp* op = takeOp();
  if (op == nullptr) return Status::kSystem;
  op->ctx = ctx;
  op->peer = rank;
  op->state = RmaOp::kDone;
  // Every completed get's bytes were handed to the driver before its request completed; a copy to the device may
  // still be on its way (from pageable memory the driver returns once it has the bytes), so wait for them to land.
  if (cudaGetsSinceFlush_) {
    std::string err;
    if (!cuda::synchronize(&err)) {
      fail("a flush could not wait for the GPU: " + err, Status::kSystem);
      op->state = RmaOp::kFailed;
      op->status = Status::kSystem;
    }
    cudaGetsSinceFlush_ = false;
  }
  *request = op;
  return Status::kOk;
}

Status TcpRmaComm::test(void* request, bool* done) {
  auto* op = static_cast<RmaOp*>(request);
  if (done == nullptr || op == nullptr || op->magic != rma::kRequestMagic || op->comm != this) {
    WEFT_WARN("RMA test: {} is not a pending request of this comm (completed already, or not weft's)", request);
    return Status::kInternal;
  }
  *done = false;
  if (ledgerWaiting()) return Status::kOk;  // a dump reads the ledger for a moment: NCCL calls again
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return Status::kOk;  // set-up holds the comm for a moment: NCCL calls again
  if (op->state == RmaOp::kQueued || op->state == RmaOp::kWaiting) {
    pump(op->peer);
    watchStalls();
  }
  if (op->state == RmaOp::kDone) {
    freeOp(op);
    *done = true;
    return Status::kOk;
  }
  if (op->state == RmaOp::kFailed) {
    const Status st = op->status;
    freeOp(op);
    return st;
  }
  return Status::kOk;
}


// ---- sockets ------------------------------------------------------------------------------------------------------

void TcpRmaComm::pump(uint32_t peer) {
  PeerSocket& p = peers_[peer];
  if (p.fd < 0 || p.lost) return;
  // Send, read (which may queue get answers and error frames), and send those. Pieces come in before the control
  // flow is read: the last piece of a put it waits on lets it go on.
  // The data flows are written while pieces wait to leave, and read only while a pieced put waits for its pieces
  // (pieces that come first wait in the kernel meanwhile): a pair that moves small operations makes no system
  // call on them.
  if (!pumpSend(p)) return;
  if (!p.data.empty()) {
    bool out = p.pieceHead != nullptr, in = p.waitingPieces;
    for (const auto& f : p.data) out |= f.op != nullptr, in |= f.inPiece;
    if ((out && !pumpPiecesOut(peer)) || (in && !pumpPiecesIn(peer))) return;
  }
  if (!pumpRecv(peer)) return;
  if (p.waitingPieces) {  // a pieced put's frame just came: its pieces may be in already
    if (!pumpPiecesIn(peer)) return;
    if (!p.waitingPieces && !pumpRecv(peer)) return;
  }
  if (p.head != nullptr) pumpSend(p);
}

void TcpRmaComm::lose(uint32_t peer, const std::string& why) {
  PeerSocket& p = peers_[peer];
  if (p.lost) return;
  p.lost = true;
  if (p.fd >= 0) ::close(p.fd);
  p.fd = -1;
  bool waiting = p.head != nullptr || p.inPayload || p.waitingPieces || p.pieceHead != nullptr;
  for (auto& f : p.data) {
    waiting |= f.op != nullptr || f.inPiece;
    if (f.fd >= 0) ::close(f.fd);
    f.fd = -1;
    f.op = nullptr;
    f.inPiece = false;
    f.dst = nullptr;
  }
  p.pieceHead = p.pieceTail = nullptr;
  p.waitingPieces = false;
  p.tallies.clear();
  pool_.forEach([&](RmaOp& op) { waiting |= op.state == RmaOp::kWaiting && op.peer == peer; });
  if (p.bye && !waiting) {
    WEFT_INFO(NCCL_NET, "RMA (rank {}): {} closed its comm", rank_, p.name);
    p.stallKind = StallKind::kNone;
    return;
  }
  // The ledger: lost (a stall that found the bytes stopped on the way keeps that name: lost over that link).
  if (!(p.stallReported && p.stallKind == StallKind::kLink)) p.stallKind = StallKind::kPeerGone;
  stallEvents_.fetch_add(1, std::memory_order_relaxed);
  fail(p.name + " is lost: " + why + (p.bye ? " (it had closed its comm with operations still waiting on it)" : ""),
       Status::kRemote);
  for (RmaOp* op = p.head; op != nullptr;) {
    RmaOp* next = op->next;
    if (op->src != nullptr) --op->src->inflight;
    if (op->internal) {
      freeOp(op);
    } else {
      op->state = RmaOp::kFailed;
      op->status = Status::kRemote;
      op->next = nullptr;
    }
    op = next;
  }
  p.head = p.tail = nullptr;
  p.queued = 0;
  // Gets waiting for this peer's answers fail too, and pieced puts whose frame went but not all their pieces.
  pool_.forEach([&](RmaOp& op) {
      if ((op.state == RmaOp::kWaiting || op.state == RmaOp::kQueued) && op.peer == peer) {
        if (op.src != nullptr) --op.src->inflight;
        op.state = RmaOp::kFailed;
        op.status = Status::kRemote;
      }
  });
  p.inPayload = false;
  p.dst = nullptr;
  p.getOp = nullptr;
}

// Writes what the peer's queue holds, several frames a call. false when the peer was lost.
bool TcpRmaComm::pumpSend(PeerSocket& p) {
  const uint32_t peer = static_cast<uint32_t>(&p - peers_.data());
  while (p.head != nullptr && !p.lost) {
    iovec iov[kMaxIov];
    int n = 0;
    size_t bytes = 0;
    // Frames not started yet get the sequence numbers they will have if this write takes them; one it does not
    // take is numbered again next time (a context destroyed meanwhile may have dropped the ones before it).
    uint32_t seq = p.sendSeq;
    for (RmaOp* op = p.head; op != nullptr && n < kMaxIov - 2 && bytes < writeMax_; op = op->next) {
      if (op->frameSent < sizeof(RmaFrame)) {
        if (op->frameSent == 0) op->frame.check = RmaFrame::kCheck ^ seq++;
        iov[n++] = {reinterpret_cast<char*>(&op->frame) + op->frameSent, sizeof(RmaFrame) - op->frameSent};
        bytes += sizeof(RmaFrame) - op->frameSent;
      }
      const bool carries = (op->frame.type == RmaFrame::kPut && !op->pieced) || op->frame.type == RmaFrame::kGetAnswer;
      const uint64_t payload = carries ? op->frame.size : 0;
      if (op->payloadSent >= payload) continue;
      if (!op->src->cuda) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(payload - op->payloadSent, writeMax_));
        iov[n++] = {op->src->base + op->srcOff + op->payloadSent, len};
        bytes += len;
        if (op->payloadSent + len < payload) break;
        continue;
      }
      // A GPU source goes through the peer's stage, one chunk at a time, and only for the queue's head.
      if (op != p.head) break;
      if (p.stageSent == p.stageLen) {
        if (p.sendStage.empty()) p.sendStage.resize(kGpuStage);
        const size_t len = static_cast<size_t>(std::min<uint64_t>(payload - op->payloadSent, kGpuStage));
        std::string err;
        if (!rma::readWindow(p.sendStage.data(), *op->src, op->srcOff + op->payloadSent, len, &err)) {
          fail("a put could not read its GPU source: " + err, Status::kSystem);
          lose(peer, "its stream cannot continue after a failed GPU read");
          return false;
        }
        p.stageLen = len;
        p.stageSent = 0;
      }
      iov[n++] = {p.sendStage.data() + p.stageSent, p.stageLen - p.stageSent};
      bytes += p.stageLen - p.stageSent;
      break;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t sent = ::sendmsg(p.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      p.moved += static_cast<uint64_t>(sent);
      counters().rmaFlowBytesSent[0].fetch_add(sent, std::memory_order_relaxed);
    }
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      lose(peer, std::string("send failed: ") + std::strerror(errno));
      return false;
    }
    // Account the bytes to the operations in order; completed ones leave the queue.
    size_t left = static_cast<size_t>(sent);
    while (p.head != nullptr) {
      RmaOp* op = p.head;
      if (op->frameSent < sizeof(RmaFrame)) {
        const size_t k = std::min(left, sizeof(RmaFrame) - op->frameSent);
        if (op->frameSent == 0 && k > 0) ++p.sendSeq;
        op->frameSent += k;
        left -= k;
        if (op->frameSent < sizeof(RmaFrame)) break;
      }
      const bool carries = (op->frame.type == RmaFrame::kPut && !op->pieced) || op->frame.type == RmaFrame::kGetAnswer;
      const uint64_t payload = carries ? op->frame.size : 0;
      if (op->payloadSent < payload) {
        const size_t k = static_cast<size_t>(std::min<uint64_t>(left, payload - op->payloadSent));
        op->payloadSent += k;
        if (op->src->cuda) p.stageSent += k;
        left -= k;
        if (op->payloadSent < payload) break;
      }
      // Whole: off the queue.
      p.head = op->next;
      if (p.head == nullptr) p.tail = nullptr;
      --p.queued;
      op->next = nullptr;
      if (op->frame.type == RmaFrame::kGetRequest) {
        op->state = RmaOp::kWaiting;  // its answer completes it
      } else if (op->pieced) {
        putSent(op);  // done once its pieces are out too
      } else {
        if (op->src != nullptr) --op->src->inflight;
        if (op->internal) {
          freeOp(op);
        } else {
          op->state = RmaOp::kDone;  // every byte is in the kernel: the source may be reused
        }
      }
      if (left == 0) break;
    }
    if (static_cast<size_t>(sent) < bytes) return true;  // the socket is full
  }
  return !p.lost;
}

void TcpRmaComm::sendError(uint32_t peer, const RmaFrame& refused, Status st, uint64_t token) {
  RmaOp* op = takeOp();
  if (op == nullptr) return;
  op->internal = true;
  op->peer = peer;
  op->frame.type = RmaFrame::kError;
  op->frame.window = refused.window;
  op->frame.off = refused.off;
  op->frame.size = refused.size;
  op->frame.value = token;
  op->frame.aux = (uint64_t{static_cast<uint8_t>(st)} << 8) | refused.type;
  enqueue(peers_[peer], op);
}

ssize_t TcpRmaComm::recvSome(uint32_t peer, void* into, size_t want) {
  PeerSocket& p = peers_[peer];
  for (;;) {
    const ssize_t n = ::recv(p.fd, into, want, MSG_DONTWAIT);
    if (n > 0) {
      p.moved += static_cast<uint64_t>(n);
      return n;
    }
    if (n == 0) {
      lose(peer, "its socket closed (the process ended)");
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    lose(peer, std::string("receive failed: ") + std::strerror(errno));
    return -1;
  }
}

// Reads what the peer sent: frames, payloads into their windows, signals after their puts. false when lost.
bool TcpRmaComm::pumpRecv(uint32_t peer) {
  PeerSocket& p = peers_[peer];
  size_t budget = kRecvBudget;
  while (!p.lost && budget > 0) {
    if (p.waitingPieces) return true;  // nothing after a pieced put is read before its pieces are all in
    if (p.inPayload) {
      size_t avail = p.inLen - p.inPos;
      if (avail > 0) {
        const size_t k = static_cast<size_t>(std::min<uint64_t>(avail, p.payloadLeft));
        if (p.dst != nullptr) {
          std::string err;
          if (!rma::writeWindow(*p.dst, p.payloadOff, p.in.data() + p.inPos, k, &err)) {
            fail("an arriving payload could not be written to its GPU window: " + err, Status::kSystem);
            p.dst = nullptr;
          }
        }
        p.inPos += k;
        p.payloadLeft -= k;
        p.payloadOff += k;
      } else if (p.dst != nullptr && !p.dst->cuda && p.payloadLeft >= kDirectMin) {
        // A large host payload lands in place.
        const size_t want = static_cast<size_t>(std::min<uint64_t>(p.payloadLeft, budget));
        const ssize_t n = recvSome(peer, p.dst->base + p.payloadOff, want);
        if (n <= 0) return n == 0;  // 0: nothing more now; -1: the peer is lost
        p.payloadLeft -= static_cast<uint64_t>(n);
        p.payloadOff += static_cast<uint64_t>(n);
        budget -= std::min(budget, static_cast<size_t>(n));
      } else if (p.dst != nullptr && p.dst->cuda && p.payloadLeft >= kDirectMin) {
        if (p.recvStage.empty()) p.recvStage.resize(kGpuStage);
        const size_t want = static_cast<size_t>(std::min<uint64_t>(p.payloadLeft, kGpuStage));
        const ssize_t n = recvSome(peer, p.recvStage.data(), want);
        if (n <= 0) return n == 0;  // 0: nothing more now; -1: the peer is lost
        std::string err;
        if (!rma::writeWindow(*p.dst, p.payloadOff, p.recvStage.data(), static_cast<size_t>(n), &err)) {
          fail("an arriving payload could not be written to its GPU window: " + err, Status::kSystem);
          p.dst = nullptr;
        }
        p.payloadLeft -= static_cast<uint64_t>(n);
        p.payloadOff += static_cast<uint64_t>(n);
        budget -= std::min(budget, static_cast<size_t>(n));
      } else {
        p.inPos = p.inLen = 0;
        const ssize_t n = recvSome(peer, p.in.data(), p.in.size());
        if (n <= 0) return n == 0;  // 0: nothing more now; -1: the peer is lost
        p.inLen = static_cast<size_t>(n);
        budget -= std::min(budget, static_cast<size_t>(n));
      }
      if (p.payloadLeft == 0 && !payloadDone(peer)) return false;
      continue;
    }
    if (p.inLen - p.inPos >= sizeof(RmaFrame)) {
      std::memcpy(&p.cur, p.in.data() + p.inPos, sizeof(RmaFrame));
      p.inPos += sizeof(RmaFrame);
      if (!handleFrame(peer)) return false;
      continue;
    }
    // Too little for a frame: keep the tail at the front and read more after it.
    const size_t tail = p.inLen - p.inPos;
    if (tail > 0 && p.inPos > 0) std::memmove(p.in.data(), p.in.data() + p.inPos, tail);
    p.inPos = 0;
    p.inLen = tail;
    const ssize_t n = recvSome(peer, p.in.data() + tail, p.in.size() - tail);
    if (n <= 0) return n == 0;  // 0: nothing more now; -1: the peer is lost
    p.inLen += static_cast<size_t>(n);
    budget -= std::min(budget, static_cast<size_t>(n));
  }
  return !p.lost;
}

bool TcpRmaComm::handleFrame(uint32_t peer) {
  PeerSocket& p = peers_[peer];
  const RmaFrame& f = p.cur;
  if (f.check != (RmaFrame::kCheck ^ p.recvSeq)) {
    lose(peer, "a frame with a wrong check word (a corrupted or desynchronised stream)");
    return false;
  }
  ++p.recvSeq;
  p.refusal.clear();
  p.dst = nullptr;
  p.getOp = nullptr;
  switch (f.type) {
    case RmaFrame::kPut: {
      rma::Window* w = f.size > 0 ? windowById(f.window) : nullptr;
      if (f.size > 0 && w == nullptr) {
        p.refusal = "window " + std::to_string(f.window) + " is not registered here";
      } else if (f.size > 0 && !rma::inRange(w->size, f.off, f.size)) {
        p.refusal = std::to_string(f.size) + " bytes at offset " + std::to_string(f.off) + " are outside window " +
                    std::to_string(f.window) + " (" + std::to_string(w->size) + " bytes here)";
      } else if (f.signalOp != 0) {
        rma::Window* s = windowById(f.sigWindow);
        if (s == nullptr || !rma::isSignalSlot(s->size, f.sigOff) || !rma::isSignalOp(f.signalOp)) {
          p.refusal = "signal at offset " + std::to_string(f.sigOff) + " of window " + std::to_string(f.sigWindow) +
                      " is not a registered, aligned 8-byte slot";
        }
      }
      if (f.aux & RmaFrame::kPieced) {
        if (p.data.empty() || f.size == 0) {
          lose(peer, "a pieced put on a pair without data flows");
          return false;
        }
        p.waitingPieces = true;
        finishPieced(peer);  // when its pieces are all in already
        return true;
      }
      p.dst = p.refusal.empty() ? w : nullptr;
      p.payloadLeft = f.size;
      p.payloadOff = f.off;
      p.inPayload = true;
      if (f.size == 0) return payloadDone(peer);
      return true;
    }
    case RmaFrame::kGetRequest: {
      rma::Window* w = windowById(f.window);
      if (w == nullptr || !rma::inRange(w->size, f.off, f.size)) {
        WEFT_WARN("RMA (rank {}): refused a get of {} bytes at offset {} of window {} from {}: {}", rank_, f.size, f.off,
                  f.window, p.name, w == nullptr ? "no such window here" : "outside the window");
        sendError(peer, f, Status::kInvalidUsage, f.value);
        return true;
      }
      RmaOp* op = takeOp();
      if (op == nullptr) {
        sendError(peer, f, Status::kSystem, f.value);
        return true;
      }
      op->internal = true;
      op->peer = peer;
      op->frame.type = RmaFrame::kGetAnswer;
      op->frame.size = f.size;
      op->frame.value = f.value;
      op->src = w;
      op->srcOff = f.off;
      ++w->inflight;
      enqueue(p, op);
      return true;
    }
    case RmaFrame::kGetAnswer: {
      const uint32_t index = static_cast<uint32_t>(f.value), gen = static_cast<uint32_t>(f.value >> 32);
      RmaOp* op = pool_.find(index, gen);
      if (op != nullptr && op->gen == gen && op->state == RmaOp::kWaiting && op->peer == peer &&
          op->frame.type == RmaFrame::kGetRequest) {
        if (f.size != op->frame.size) {
          lose(peer, "a get answer of " + std::to_string(f.size) + " bytes for a get of " +
                         std::to_string(op->frame.size));
          return false;
        }
        p.getOp = op;
        p.dst = op->src;
        p.payloadOff = op->srcOff;
      } else {
        p.payloadOff = 0;  // a get forgotten by destroyContext: its answer is read and dropped
      }
      p.payloadLeft = f.size;
      p.inPayload = true;
      if (f.size == 0) return payloadDone(peer);
      return true;
    }
    case RmaFrame::kRegister: {
      if (rma::Window* w = windowById(f.window); w != nullptr) {
        w->peerSize[peer] = f.size;
      } else if (f.window >= nextWindow_) {
        auto& sizes = announced_[f.window];
        if (sizes.empty()) sizes.assign(static_cast<size_t>(nranks_), -1);
        sizes[peer] = static_cast<int64_t>(f.size);
      }
      return true;
    }
    case RmaFrame::kBye:
      p.bye = true;
      return true;
    case RmaFrame::kError: {
      const Status st = static_cast<Status>(f.aux >> 8);
      const uint8_t what = static_cast<uint8_t>(f.aux & 0xff);
      const std::string why = p.name + " refused a " + frameName(what) + " of " + std::to_string(f.size) +
                              " bytes at offset " + std::to_string(f.off) + " of window " + std::to_string(f.window) +
                              " (" + statusName(st) + ")";
      if (f.value != 0 || what == RmaFrame::kGetRequest) {
        const uint32_t index = static_cast<uint32_t>(f.value), gen = static_cast<uint32_t>(f.value >> 32);
        RmaOp* op = pool_.find(index, gen);
        if (op != nullptr && op->gen == gen && op->state == RmaOp::kWaiting && op->peer == peer) {
          if (op->src != nullptr) --op->src->inflight;
          op->state = RmaOp::kFailed;
          op->status = st == Status::kOk ? Status::kRemote : st;
        }
      }
      fail(why, st == Status::kOk ? Status::kRemote : st);
      return true;
    }
    default:  // a piece belongs on a data flow
      lose(peer, std::string("an unknown frame type ") + std::to_string(f.type) + " on the control flow");
      return false;
  }
}

void TcpRmaComm::putArrived(uint32_t peer, const RmaFrame& f, const std::string& refusal) {
  if (!refusal.empty()) {
    WEFT_WARN("RMA (rank {}): refused a put from {}: {}", rank_, peers_[peer].name, refusal);
    sendError(peer, f, Status::kInvalidUsage, 0);
  } else if (f.signalOp != 0) {
    std::string err;
    if (!rma::applySignal(*windowById(f.sigWindow), f.sigOff, static_cast<rma::SignalOp>(f.signalOp), f.value,
                          &err)) {
      fail("a signal could not be written to its GPU window: " + err, Status::kSystem);
    }
  }
}

// The current frame's payload is all in: a put's signal is applied now (after its bytes), a get completes.
bool TcpRmaComm::payloadDone(uint32_t peer) {
  PeerSocket& p = peers_[peer];
  p.inPayload = false;
  const RmaFrame& f = p.cur;
  if (f.type == RmaFrame::kPut) {
    putArrived(peer, f, p.refusal);
  } else if (f.type == RmaFrame::kGetAnswer && p.getOp != nullptr) {
    RmaOp* op = p.getOp;
    if (op->src != nullptr) {
      if (op->src->cuda) cudaGetsSinceFlush_ = true;
      --op->src->inflight;
    }
    op->state = RmaOp::kDone;
  }
  p.dst = nullptr;
  p.getOp = nullptr;
  return true;
}

}  // namespace weft::tcp
