// SPDX-License-Identifier: Apache-2.0
// The device API's RMA over weft's TCP sockets: the data flows beside a pair's control flow, which carry large puts
// in pieces (tcp_rma.h says how they keep the control flow's order).
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "tcp/tcp_rma.h"
#include "weft/common/log.h"

namespace weft::tcp {

void TcpRmaComm::putSent(RmaOp* op) {
  if (op->state != RmaOp::kQueued || op->frameSent < sizeof(RmaFrame) || op->payloadSent < op->frame.size) return;
  if (op->src != nullptr) --op->src->inflight;
  op->state = RmaOp::kDone;
}

void TcpRmaComm::unlinkPiece(PeerSocket& p, RmaOp* op) {
  RmaOp* prev = nullptr;
  for (RmaOp* q = p.pieceHead; q != nullptr; prev = q, q = q->nextPiece) {
    if (q != op) continue;
    (prev != nullptr ? prev->nextPiece : p.pieceHead) = q->nextPiece;
    if (p.pieceTail == q) p.pieceTail = prev;
    q->nextPiece = nullptr;
    return;
  }
}

// The data flows write in turns, one sendmsg each a round (the first of a round turning), while any took all it
// was offered; a flow without a piece takes the next. So pieces go to the flows in step with what each socket takes:
// evenly where all keep up, fewer to one on a slow path. false when the peer was lost.
bool TcpRmaComm::pumpPiecesOut(uint32_t peer) {
  PeerSocket& p = peers_[peer];
  const size_t n = p.data.size();
  const size_t first = p.turn++ % n;
  bool more = true;
  while (more && !p.lost) {
    more = false;
    bool open = false;
    for (size_t i = 0; i < n && !p.lost; ++i) {
      const size_t k = (first + i) % n;
      DataFlow& f = p.data[k];
      if (f.fd < 0) continue;
      open = true;
      const int r = sendPiece(peer, f, k);
      if (r < 0) return false;
      more |= r > 0;
    }
    if (!open && p.pieceHead != nullptr) {
      lose(peer, "its data flows closed with pieces still to send");
      return false;
    }
  }
  return !p.lost;
}

// One sendmsg of flow k's piece, taking the next piece first if it has none: 1 when the piece went whole (the flow
// may take more), 0 when its socket is full or nothing waits, -1 when the peer was lost.
int TcpRmaComm::sendPiece(uint32_t peer, DataFlow& f, size_t k) {
  PeerSocket& p = peers_[peer];
  if (f.op == nullptr) {
    RmaOp* op = p.pieceHead;
    if (op == nullptr) return 0;
    f.op = op;
    f.off = op->assigned;
    f.len = std::min<uint64_t>(chunk_, op->frame.size - op->assigned);
    f.sent = 0;
    f.outSent = 0;
    f.staged = false;
    f.out = RmaFrame{};
    f.out.check = RmaFrame::kCheck ^ f.sendSeq++;
    f.out.type = RmaFrame::kPiece;
    f.out.context = op->frame.context;
    f.out.window = op->frame.window;
    f.out.off = op->frame.off + f.off;
    f.out.size = f.len;
    f.out.putId = op->frame.putId;
    op->assigned += f.len;
    if (op->assigned == op->frame.size) {
      p.pieceHead = op->nextPiece;
      if (p.pieceHead == nullptr) p.pieceTail = nullptr;
      op->nextPiece = nullptr;
    }
  }
  RmaOp* op = f.op;
  const char* bytes = op->src->base + op->srcOff + f.off;
  if (op->src->cuda) {
    if (!f.staged) {
      if (f.stage.size() < f.len) f.stage.resize(static_cast<size_t>(chunk_));
      std::string err;
      if (!rma::readWindow(f.stage.data(), *op->src, op->srcOff + f.off, static_cast<size_t>(f.len), &err)) {
        fail("a put could not read its GPU source: " + err, Status::kSystem);
        lose(peer, "its stream cannot continue after a failed GPU read");
        return -1;
      }
      f.staged = true;
    }
    bytes = f.stage.data();
  }
  iovec iov[2];
  int n = 0;
  if (f.outSent < sizeof(RmaFrame)) iov[n++] = {reinterpret_cast<char*>(&f.out) + f.outSent, sizeof(RmaFrame) - f.outSent};
  iov[n++] = {const_cast<char*>(bytes) + f.sent, static_cast<size_t>(f.len - f.sent)};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<size_t>(n);
  ssize_t sent;
  do {
    sent = ::sendmsg(f.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    lose(peer, fmt::format("send failed on data flow {}: {}", k + 1, std::strerror(errno)));
    return -1;
  }
  p.moved += static_cast<uint64_t>(sent);
  counters().rmaFlowBytesSent[std::min<size_t>(k + 1, kMaxFlows - 1)].fetch_add(sent, std::memory_order_relaxed);
  size_t left = static_cast<size_t>(sent);
  const size_t h = std::min(left, sizeof(RmaFrame) - f.outSent);
  f.outSent += h;
  left -= h;
  f.sent += left;
  if (f.sent < f.len) return 0;  // the socket is full
  op->payloadSent += f.len;
  f.op = nullptr;
  putSent(op);
  return 1;
}

// A piece frame is in: where its bytes go, or why they are dropped (the put's refusal, sent back once it is in).
bool TcpRmaComm::pieceFrame(uint32_t peer, DataFlow& f) {
  PeerSocket& p = peers_[peer];
  const RmaFrame& h = f.in;
  if (h.check != (RmaFrame::kCheck ^ f.recvSeq) || h.type != RmaFrame::kPiece || h.size == 0 || h.size > kRmaGpuStage) {
    lose(peer, "a data flow's piece with a wrong check word, type or size (a corrupted or desynchronised stream)");
    return false;
  }
  ++f.recvSeq;
  PeerSocket::Tally& t = p.tallies[h.putId];
  rma::Window* w = windowById(h.window);
  if (w == nullptr || !rma::inRange(w->size, h.off, h.size)) {
    if (t.refusal.empty()) {
      t.refusal = w == nullptr ? "window " + std::to_string(h.window) + " is not registered here"
                               : std::to_string(h.size) + " bytes at offset " + std::to_string(h.off) +
                                     " are outside window " + std::to_string(h.window) + " (" +
                                     std::to_string(w->size) + " bytes here)";
    }
    w = nullptr;
  }
  f.dst = w;
  f.dstOff = h.off;
  f.left = h.size;
  f.inPiece = true;
  return true;
}

// Reads every data flow: piece frames, their bytes into their windows; the last piece of the put the control flow
// waits on applies its signal. false when the peer was lost.
bool TcpRmaComm::pumpPiecesIn(uint32_t peer) {
  PeerSocket& p = peers_[peer];
  const size_t budget = std::max<size_t>(kRmaRecvBudget / p.data.size(), chunk_);
  for (size_t k = 0; k < p.data.size() && !p.lost; ++k) {
    DataFlow& f = p.data[k];
    size_t got = 0;
    while (f.fd >= 0 && got < budget) {
      void* into = nullptr;
      size_t want = 0;
      if (!f.inPiece) {
        into = reinterpret_cast<char*>(&f.in) + f.inGot;
        want = sizeof(RmaFrame) - f.inGot;
      } else if (f.dst != nullptr && !f.dst->cuda) {
        into = f.dst->base + f.dstOff;  // in place
        want = static_cast<size_t>(f.left);
      } else {
        if (f.inStage.empty()) f.inStage.resize(kRmaGpuStage);
        into = f.inStage.data();
        want = static_cast<size_t>(std::min<uint64_t>(f.left, f.inStage.size()));
      }
      const ssize_t n = ::recv(f.fd, into, want, MSG_DONTWAIT);
      if (n == 0) {
        if (f.inPiece || f.inGot > 0) {
          lose(peer, fmt::format("data flow {} closed in the middle of a piece (the process ended)", k + 1));
          return false;
        }
        // At a piece boundary: the peer closes its comm (or died, which its control flow tells).
        ::close(f.fd);
        f.fd = -1;
        break;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        lose(peer, fmt::format("receive failed on data flow {}: {}", k + 1, std::strerror(errno)));
        return false;
      }
      p.moved += static_cast<uint64_t>(n);
      got += static_cast<size_t>(n);
      if (!f.inPiece) {
        f.inGot += static_cast<size_t>(n);
        if (f.inGot == sizeof(RmaFrame) && !pieceFrame(peer, f)) return false;
        continue;
      }
      if (f.dst != nullptr && f.dst->cuda) {
        std::string err;
        if (!rma::writeWindow(*f.dst, f.dstOff, f.inStage.data(), static_cast<size_t>(n), &err)) {
          fail("an arriving piece could not be written to its GPU window: " + err, Status::kSystem);
          f.dst = nullptr;
        }
      }
      f.dstOff += static_cast<uint64_t>(n);
      f.left -= static_cast<uint64_t>(n);
      if (f.left > 0) continue;
      // The piece is in.
      f.inPiece = false;
      f.inGot = 0;
      f.dst = nullptr;
      p.tallies[f.in.putId].bytes += f.in.size;
      if (p.waitingPieces && p.cur.putId == f.in.putId) finishPieced(peer);
      if (p.lost) return false;
    }
  }
  return !p.lost;
}

void TcpRmaComm::finishPieced(uint32_t peer) {
  PeerSocket& p = peers_[peer];
  const RmaFrame& f = p.cur;
  const auto it = p.tallies.find(f.putId);
  if (it == p.tallies.end() || it->second.bytes < f.size) return;  // pieces still to come
  if (it->second.bytes > f.size) {
    lose(peer, fmt::format("pieces of {} bytes for a put of {}", it->second.bytes, f.size));
    return;
  }
  const std::string refusal = p.refusal.empty() ? it->second.refusal : p.refusal;
  p.tallies.erase(it);
  p.waitingPieces = false;
  putArrived(peer, f, refusal);
}

}  // namespace weft::tcp
