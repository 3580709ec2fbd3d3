// SPDX-License-Identifier: Apache-2.0
// The device API's RMA over native verbs: the data path (verbs_rma.h says how it works).
#include "verbs/verbs_rma.h"
#include "weft/common/clock.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "weft/common/log.h"

namespace weft::verbs {
namespace {

constexpr int kCqBatch = 32;

uint64_t wrId(uint64_t kind, uint64_t value) { return (kind << 60) | (value & ((uint64_t{1} << 60) - 1)); }
uint64_t opToken(const RmaOp* op) { return (uint64_t{op->index} << 32) | op->gen; }

}  // namespace

// ---- posting ------------------------------------------------------------------------------------------------------

Status VerbsRmaComm::postRecv(uint32_t peer, uint32_t slot) {
  rma::RingMsg& buf = recvBuf_[static_cast<size_t>(peer) * kRecvs + slot];
  ibv_sge sge{reinterpret_cast<uint64_t>(&buf), sizeof(rma::RingMsg), recvMr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wrId(kWrRecv, (uint64_t{peer} << 16) | slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(peers_[peer].qp.get(), &wr, &bad)) {
    WEFT_WARN("RMA: posting a receive on the QP to rank {} failed: {}", peer, std::strerror(rc));
    return Status::kSystem;
  }
  return Status::kOk;
}

// A signalled work request on the peer's QP; its completion ends one of owner's pending operations.
Status VerbsRmaComm::postRdma(uint32_t peer, ibv_wr_opcode opcode, void* local, uint32_t lkey, size_t size,
                              uint64_t remote, uint32_t rkey, RmaOp* owner, bool signaled) {
  Peer& p = peers_[peer];
  ibv_sge sge{reinterpret_cast<uint64_t>(local), static_cast<uint32_t>(size), lkey};
  ibv_send_wr wr{};
  wr.wr_id = owner != nullptr ? wrId(kWrOp, opToken(owner)) : wrId(kWrQuiet, peer);
  wr.sg_list = size > 0 ? &sge : nullptr;
  wr.num_sge = size > 0 ? 1 : 0;
  wr.opcode = opcode;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  if (opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    wr.wr.atomic.remote_addr = remote;
    wr.wr.atomic.rkey = rkey;
  } else {
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
  }
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(p.qp.get(), &wr, &bad)) {
    lose(peer, std::string("posting to its QP failed: ") + std::strerror(rc));
    return Status::kRemote;
  }
  ++p.sendsOut;
  if (owner != nullptr && signaled) ++owner->pending;
  if (owner != nullptr && !signaled) ++owner->quiet;
  return Status::kOk;
}

bool VerbsRmaComm::sendCtl(uint32_t peer, const rma::RingMsg& m, RmaOp* owner) {
  Peer& p = peers_[peer];
  if (p.lost) {
    if (owner != nullptr) opDone(owner, false, Status::kRemote);
    return true;
  }
  if (p.sendsOut >= kSendWr - 8 || !backlog_.empty()) {
    if (owner != nullptr) {
      // An op's signal message waits for room like the op itself: the caller never queues one (iput checks room).
      opDone(owner, false, Status::kInternal);
      return false;
    }
    backlog_.emplace_back(peer, m);
    return false;
  }
  const uint32_t slot = nextSend_++ % kSendWr;
  sendBuf_[slot] = m;
  ibv_sge sge{reinterpret_cast<uint64_t>(&sendBuf_[slot]), sizeof(rma::RingMsg), sendMr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = owner != nullptr ? wrId(kWrOp, opToken(owner)) : wrId(kWrCtl, peer);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(p.qp.get(), &wr, &bad)) {
    lose(peer, std::string("posting a message to its QP failed: ") + std::strerror(rc));
    if (owner != nullptr) opDone(owner, false, Status::kRemote);
    return true;
  }
  ++p.sendsOut;
  if (owner != nullptr) ++owner->pending;
  return true;
}

// ---- operations --------------------------------------------------------------------------------------------------

// Waits (moving the comm) for room for `wrs` work requests on rank's QP: the send queue is as deep as NCCL keeps
// operations in flight, so this waits only when a peer stops answering; after WEFT_PEER_TIMEOUT the peer is lost.
void VerbsRmaComm::waitRoom(uint32_t rank, int wrs) {
  Peer& p = peers_[rank];
  const int64_t until = coarseNowMs() + peerTimeoutMs_;
  while (!p.lost && p.sendsOut + wrs > kSendWr - 8) {
    if (coarseNowMs() >= until) {
      lose(rank, "its QP took no work for WEFT_PEER_TIMEOUT");
      return;
    }
    pumpAll();
  }
}

Status VerbsRmaComm::iput(rma::Context* ctx, int context, rma::Window* src, uint64_t srcOff, size_t size,
                          rma::Window* dst, uint64_t dstOff, uint32_t rank, const rma::Signal* signal,
                          uint32_t optFlags, void** request) {
  (void)optFlags;
  if (request == nullptr) return Status::kInternal;
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = checkPut(ctx, context, src, srcOff, size, dst, dstOff, rank, signal); st != Status::kOk) return st;
  if (size > (size_t{1} << 31)) {
    WEFT_WARN("RMA iput: {} bytes in one put; a verbs write carries at most 2 GiB", size);
    return Status::kInvalidUsage;
  }
  waitRoom(rank, 2);  // the write and the signal
  RmaOp* op = startOp(ctx, rank, request, size > 0 ? "put" : "signal", size);
  if (op == nullptr) return Status::kSystem;
  if (op->state == RmaOp::kFailed) return Status::kOk;
  Peer& p = peers_[rank];
  if (size > 0) {
    const auto& to = regs_.at(dst)->remote[rank];
    // With a signal after it, the write needs no completion of its own: the signal's implies it on this QP.
    if (postRdma(rank, IBV_WR_RDMA_WRITE, src->base + srcOff, regs_.at(src)->mr->lkey, size, to.first + dstOff,
                 to.second, op, signal == nullptr) != Status::kOk) {
      failOp(op, Status::kRemote);
      return Status::kOk;
    }
    rma::ProviderOps::uses(op, src);
  }
  if (signal != nullptr) {
    if (atomics_) {
      const auto& sig = regs_.at(signal->window)->remote[rank];
      const uint64_t add = signal->op == rma::SignalOp::kInc ? 1 : signal->value;
      ibv_sge sge{reinterpret_cast<uint64_t>(&scratch_[0]), sizeof(uint64_t), scratchMr_->lkey};
      ibv_send_wr wr{};
      wr.wr_id = wrId(kWrOp, opToken(op));
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.atomic.remote_addr = sig.first + signal->off;
      wr.wr.atomic.rkey = sig.second;
      wr.wr.atomic.compare_add = add;
      ibv_send_wr* bad = nullptr;
      if (int rc = ibv_post_send(p.qp.get(), &wr, &bad)) {
        lose(rank, std::string("posting a fetch-and-add to its QP failed: ") + std::strerror(rc));
        opDone(op, false, Status::kRemote);
        return Status::kOk;
      }
      ++p.sendsOut;
      ++op->pending;
    } else {
      rma::RingMsg m = msg(rma::RingMsg::kSignal);
      m.origin = static_cast<uint32_t>(rank_);
      m.window = signal->window->id;
      m.signalOp = static_cast<uint8_t>(signal->op);
      m.signalOff() = signal->off;
      m.signalValue() = signal->value;
      sendCtl(rank, m, op);
    }
  }
  if (op->pending == 0 && op->state == RmaOp::kActive) op->state = RmaOp::kDone;
  return Status::kOk;
}

Status VerbsRmaComm::iget(rma::Context* ctx, int context, rma::Window* remote, uint64_t remoteOff, size_t size,
                          rma::Window* local, uint64_t localOff, uint32_t rank, uint32_t optFlags, void** request) {
  (void)optFlags;
  if (request == nullptr) return Status::kInternal;
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = checkGet(ctx, context, remote, remoteOff, size, local, localOff, rank); st != Status::kOk) {
    return st;
  }
  if (size > (size_t{1} << 31)) {
    WEFT_WARN("RMA iget: {} bytes in one get; a verbs read carries at most 2 GiB", size);
    return Status::kInvalidUsage;
  }
  waitRoom(rank, 1);
  RmaOp* op = startOp(ctx, rank, request, "get", size);
  if (op == nullptr) return Status::kSystem;
  if (op->state == RmaOp::kFailed) return Status::kOk;
  if (size == 0) {
    op->state = RmaOp::kDone;
    return Status::kOk;
  }
  const auto& from = regs_.at(remote)->remote[rank];
  if (postRdma(rank, IBV_WR_RDMA_READ, local->base + localOff, regs_.at(local)->mr->lkey, size, from.first + remoteOff,
               from.second, op, true) != Status::kOk) {
    failOp(op, Status::kRemote);
    return Status::kOk;
  }
  rma::ProviderOps::uses(op, local);
  if (local->cuda) cudaGetsSinceFlush_ = true;
  return Status::kOk;
}

Status VerbsRmaComm::iflush(rma::Context* ctx, int context, rma::Window* w, uint32_t rank, void** request) {
  if (request == nullptr) return Status::kInternal;
  std::lock_guard<std::mutex> lock(mu_);
  RmaOp* op = nullptr;
  if (Status st = beginFlush(ctx, context, w, rank, request, &op); st != Status::kOk || op == nullptr) return st;
  // One word of the window read back through this rank's own QP: it completes after the NIC's earlier writes there.
  const auto self = static_cast<uint32_t>(rank_);
  const auto& me = regs_.at(w)->remote[self];
  if (postRdma(self, IBV_WR_RDMA_READ, &scratch_[1], scratchMr_->lkey, sizeof(uint64_t), me.first, me.second, op,
               true) != Status::kOk) {
    failOp(op, Status::kRemote);
  }
  return Status::kOk;
}

// ---- completions ----------------------------------------------------------------------------------------------------

void VerbsRmaComm::pumpAll() {
  pollCq();
  while (!backlog_.empty()) {
    auto [peer, m] = backlog_.front();
    if (peers_[peer].lost) {
      backlog_.pop_front();
      continue;
    }
    if (peers_[peer].sendsOut >= kSendWr - 8) break;
    backlog_.pop_front();
    sendCtl(peer, m, nullptr);
  }
  if (const int64_t now = coarseNowMs(); now - asyncCheckMs_ >= 100) {  // the device's events, every 100 ms
    asyncCheckMs_ = now;
    dev_.pollAsync();
    if (const int ev = asyncError.exchange(0); ev != 0) {
      fail(std::string("an asynchronous error on the comm's QPs: ") + ibv().eventTypeStr(static_cast<ibv_event_type>(ev)),
           Status::kRemote);
    }
    if (!dev_.usable()) {
      for (uint32_t p = 0; p < peers_.size(); ++p) lose(p, "the port is down: " + dev_.stateReason());
    }
  }
  checkStalls();
}

void VerbsRmaComm::pollCq() {
  ibv_wc wc[kCqBatch];
  for (int round = 0; round < 16; ++round) {
    const int n = ibv_poll_cq(cq_.get(), kCqBatch, wc);
    if (n < 0) {
      fail("polling the completion queue failed", Status::kSystem);
      return;
    }
    for (int i = 0; i < n; ++i) onWc(wc[i]);
    if (n < kCqBatch) return;
  }
}

void VerbsRmaComm::onWc(const ibv_wc& wc) {
  const uint64_t kind = wc.wr_id >> 60;
  const uint64_t value = wc.wr_id & ((uint64_t{1} << 60) - 1);
  const bool ok = wc.status == IBV_WC_SUCCESS;
  const std::string err = ok ? "" : std::string(ibv().wcStatusStr(wc.status)) + " (vendor error " +
                                        std::to_string(wc.vendor_err) + ")";
  if (kind == kWrRecv) {
    const uint32_t peer = static_cast<uint32_t>(value >> 16), slot = static_cast<uint32_t>(value & 0xffff);
    if (peer >= peers_.size()) return;
    if (!ok) {
      if (wc.status != IBV_WC_WR_FLUSH_ERR) lose(peer, "a receive failed: " + err);
      return;
    }
    peers_[peer].heardMs = coarseNowMs();
    const rma::RingMsg m = recvBuf_[static_cast<size_t>(peer) * kRecvs + slot];
    if (postRecv(peer, slot) != Status::kOk) lose(peer, "a receive could not be posted again");
    onRingMsg(peer, m);
    return;
  }
  // A send-side completion: which peer's QP, from the QP number.
  uint32_t peer = UINT32_MAX;
  RmaOp* op = nullptr;
  if (kind == kWrOp) {
    op = findOp(static_cast<uint32_t>(value >> 32), static_cast<uint32_t>(value));
    if (op != nullptr) peer = op->peer;
  } else {
    peer = static_cast<uint32_t>(value);
  }
  if (peer < peers_.size()) {
    Peer& p = peers_[peer];
    // This work request's room, and that of the op's quiet ones before it (once, at its last completion).
    int freed = 1;
    if (op != nullptr && op->pending <= 1 && op->quiet > 0) {
      freed += op->quiet;
      op->quiet = 0;
    }
    p.sendsOut = std::max(0, p.sendsOut - freed);
    if (ok) p.heardMs = coarseNowMs();
    if (!ok && wc.status != IBV_WC_WR_FLUSH_ERR) lose(peer, "an operation to it failed: " + err);
  }
  if (op != nullptr) opDone(op, ok, ok ? Status::kOk : Status::kRemote);
}

}  // namespace weft::verbs
