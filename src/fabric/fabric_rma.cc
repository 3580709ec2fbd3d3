// SPDX-License-Identifier: Apache-2.0
// The device API's RMA over libfabric: the data path (fabric_rma.h says how it works).
#include "fabric/fabric_rma.h"
#include "weft/common/clock.h"

#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <chrono>
#include <cstring>

#include "weft/common/cuda_shim.h"
#include "weft/common/log.h"

namespace weft::fabric {
namespace {

constexpr int kCqBatch = 64;

}  // namespace

FabricRmaComm::WindowReg* FabricRmaComm::regOf(const rma::Window* w) const {
  auto it = regs_.find(w);
  return it == regs_.end() ? nullptr : it->second.get();
}

// ---- requests -------------------------------------------------------------------------------------------------------

bool FabricRmaComm::postRma(bool write, RmaOp* op, uint32_t rank, void* local, size_t size, void* desc,
                            uint64_t remoteAddr, uint64_t key) {
  if (ep_->ep == nullptr) {  // abandoned (abandonProvider): every peer is lost, only a flush comes here
    failOp(op, Status::kRemote);
    return false;
  }
  op->data.kind = RmaCtx::kData;
  op->data.owner = op;
  iovec iov{local, size};
  fi_rma_iov rma{remoteAddr, size, key};
  fi_msg_rma m{};
  m.msg_iov = &iov;
  m.desc = &desc;
  m.iov_count = 1;
  m.addr = peers_[rank].addr;
  m.rma_iov = &rma;
  m.rma_iov_count = 1;
  m.context = &op->data.fi;
  m.data = static_cast<uint64_t>(rank_);  // a write's remote completion data: whose write landed
  // The provider pushing back (its queue full) is waited out here, moving completions: NCCL's proxy cannot take a
  // NULL request back. Bounded by WEFT_PEER_TIMEOUT.
  const int64_t until = coarseNowMs() + peerTimeoutMs_;
  ssize_t rc = 0;
  for (;;) {
    rc = write ? fi_writemsg(ep_->ep.get(), &m, orderedSignals_ ? FI_COMPLETION : FI_REMOTE_CQ_DATA | FI_COMPLETION)
               : fi_readmsg(ep_->ep.get(), &m, FI_COMPLETION);
    if (rc != -FI_EAGAIN || coarseNowMs() >= until) break;
    readCompletions();
  }
  if (rc == 0) {
    ++op->pending;
    return true;
  }
  const std::string why = rc == -FI_EAGAIN ? "the provider pushed back for WEFT_PEER_TIMEOUT"
                                           : std::string(fi_strerror(static_cast<int>(-rc)));
  if (rank == static_cast<uint32_t>(rank_)) {  // a flush's read-back: the comm's own failure
    fail("a flush's read-back could not be posted: " + why, Status::kSystem);
    failOp(op, Status::kSystem);
    return false;
  }
  lose(rank, fmt::format("a {} of {} bytes {} it could not be posted: {}", write ? "write" : "read", size,
                         write ? "to" : "from", why));
  failOp(op, Status::kRemote);
  return false;
}

Status FabricRmaComm::iput(rma::Context* ctx, int context, rma::Window* src, uint64_t srcOff, size_t size,
                           rma::Window* dst, uint64_t dstOff, uint32_t rank, const rma::Signal* signal,
                           uint32_t optFlags, void** request) {
  (void)optFlags;  // every operation is handed to the provider at once
  if (request == nullptr) return Status::kInternal;
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = checkPut(ctx, context, src, srcOff, size, dst, dstOff, rank, signal); st != Status::kOk) return st;
  if (size > maxMsg_) {
    WEFT_WARN("RMA iput: {} bytes in one put; {} carries at most {} in one write", size, dev_.props().provider, maxMsg_);
    return Status::kInvalidUsage;
  }
  RmaOp* op = startOp(ctx, rank, request, size > 0 ? "put" : "signal", size);
  if (op == nullptr) return Status::kSystem;
  if (op->state == RmaOp::kFailed) return Status::kOk;
  RmaPeer& p = peers_[rank];
  if (size > 0) {
    const RmaRemote& to = regOf(dst)->remote[rank];
    if (!postRma(true, op, rank, src->base + srcOff, size, regOf(src)->desc, to.addr + dstOff, to.key)) {
      return Status::kOk;
    }
    ++p.issued;
    rma::ProviderOps::uses(op, src);
  }
  if (signal != nullptr) {
    RmaMsg m = msg(RmaMsg::kSignal);
    m.origin = static_cast<uint32_t>(rank_);
    m.window = signal->window->id;
    m.signalOp = static_cast<uint8_t>(signal->op);
    m.signalOff() = signal->off;
    m.signalValue() = signal->value;
    m.signalAfterWrites() = orderedSignals_ ? 0 : p.issued;  // every write to that rank so far, this put's own included
    ++op->pending;
    sendCtl(rank, m, op);
  }
  if (op->pending == 0) op->state = RmaOp::kDone;
  return Status::kOk;
}

Status FabricRmaComm::iget(rma::Context* ctx, int context, rma::Window* remote, uint64_t remoteOff, size_t size,
                           rma::Window* local, uint64_t localOff, uint32_t rank, uint32_t optFlags, void** request) {
  (void)optFlags;
  if (request == nullptr) return Status::kInternal;
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = checkGet(ctx, context, remote, remoteOff, size, local, localOff, rank); st != Status::kOk) {
    return st;
  }
  if (size > maxMsg_) {
    WEFT_WARN("RMA iget: {} bytes in one get; {} carries at most {} in one read", size, dev_.props().provider, maxMsg_);
    return Status::kInvalidUsage;
  }
  RmaOp* op = startOp(ctx, rank, request, "get", size);
  if (op == nullptr) return Status::kSystem;
  if (op->state == RmaOp::kFailed) return Status::kOk;
  if (size == 0) {
    op->state = RmaOp::kDone;
    return Status::kOk;
  }
  const RmaRemote& from = regOf(remote)->remote[rank];
  if (!postRma(false, op, rank, local->base + localOff, size, regOf(local)->desc, from.addr + remoteOff, from.key)) {
    return Status::kOk;
  }
  rma::ProviderOps::uses(op, local);
  if (local->cuda) cudaGetsSinceFlush_ = true;
  return Status::kOk;
}

Status FabricRmaComm::iflush(rma::Context* ctx, int context, rma::Window* w, uint32_t rank, void** request) {
  if (request == nullptr) return Status::kInternal;
  std::lock_guard<std::mutex> lock(mu_);
  RmaOp* op = nullptr;
  if (Status st = beginFlush(ctx, context, w, rank, request, &op); st != Status::kOk || op == nullptr) return st;
  // One word of the window read back through the NIC, from this rank to itself: it completes after the writes the
  // NIC made to that memory before it.
  const RmaRemote& self = regOf(w)->remote[static_cast<size_t>(rank_)];
  postRma(false, op, static_cast<uint32_t>(rank_), &ctl_->flushSink, sizeof(uint64_t), ctlDesc_, self.addr, self.key);
  return Status::kOk;
}

// ---- the completion queue --------------------------------------------------------------------------------------------

void FabricRmaComm::pumpAll() {
  readCompletions();
  if (!recvRepost_.empty()) {
    std::vector<uint32_t> slots;
    slots.swap(recvRepost_);
    for (uint32_t slot : slots) {
      if (postRecv(slot) != Status::kOk) fail("a control receive could not be posted again", Status::kSystem);
    }
  }
  if (!backlog_.empty()) flushBacklog();
  checkStalls();
}

void FabricRmaComm::readCompletions() {
  fi_cq_data_entry e[kCqBatch];
  for (int round = 0; round < 16; ++round) {
    ssize_t n = fi_cq_read(ep_->cq.get(), e, kCqBatch);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        onCompletion(static_cast<RmaCtx*>(e[i].op_context), true, Status::kOk, e[i].flags, e[i].data, e[i].len, {});
      }
      if (n < kCqBatch) return;
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(ep_->cq.get(), &err, 0) != 1) return;
      const char* detail = fi_cq_strerror(ep_->cq.get(), err.prov_errno, err.err_data, nullptr, 0);
      const std::string why = std::string(fi_strerror(err.err)) + (detail != nullptr ? std::string(" (") + detail + ")" : "");
      const Status st = err.err == FI_ECANCELED ? Status::kRemote
                        : err.err == FI_EINVAL || err.err == FI_EACCES || err.err == FI_EKEYREJECTED
                            ? Status::kInvalidUsage
                            : Status::kRemote;
      onCompletion(static_cast<RmaCtx*>(err.op_context), false, st, err.flags, err.data, err.len, why);
      continue;
    }
    if (n != -FI_EAGAIN) fail(std::string("reading the completion queue failed: ") + fi_strerror(static_cast<int>(-n)), Status::kSystem);
    return;
  }
}

void FabricRmaComm::onCompletion(RmaCtx* c, bool ok, Status st, uint64_t flags, uint64_t data, size_t len,
                                 const std::string& err) {
  // A write with completion data landing here: count it for its sender. Its context is none of ours (shm hands one
  // of its own).
  if (c == nullptr || (flags & FI_REMOTE_WRITE) != 0) {
    if (ok && (flags & FI_REMOTE_CQ_DATA) != 0 && data < peers_.size()) {
      RmaPeer& p = peers_[data];
      ++p.landed;
      p.heardMs = coarseNowMs();
      if (!p.waitingSignals.empty()) {
        auto& w = p.waitingSignals;
        for (size_t i = 0; i < w.size();) {
          if (w[i].signalAfterWrites() <= p.landed) {
            RmaMsg m = w[i];
            w[i] = w.back();
            w.pop_back();
            applySignalMsg(m);
          } else {
            ++i;
          }
        }
      }
    } else if (!ok) {
      fail("an error completion with no operation of ours: " + err, st);
    }
    return;
  }
  switch (c->kind) {
    case RmaCtx::kCtlRecv: {
      const uint32_t slot = c->slot;
      if (ok && len != sizeof(RmaMsg)) {
        // Not one of weft's messages (the endpoint's address is in the handle: anyone may send to it): what the slot
        // holds is not read. (A longer one ends as a truncation error, below.)
        WEFT_WARN("RMA (rank {}): a message of {} bytes, not weft's {}: dropped", rank_, len, sizeof(RmaMsg));
        if (postRecv(slot) != Status::kOk) fail("a control receive could not be posted again", Status::kSystem);
      } else if (ok) {
        const RmaMsg m = ctl_->in[slot];
        if (postRecv(slot) != Status::kOk) fail("a control receive could not be posted again", Status::kSystem);
        // Hellos and records come round the ring from the previous rank; signals and errors from their origin.
        const uint32_t from = m.type == RmaMsg::kHello || m.type == RmaMsg::kRecord
                                  ? static_cast<uint32_t>((rank_ - 1 + nranks_) % nranks_)
                                  : m.origin;
        onRingMsg(from, m);
      } else if (st != Status::kRemote || err.find("Canceled") == std::string::npos) {
        if (postRecv(slot) != Status::kOk) fail("a control receive could not be posted again: " + err, Status::kSystem);
      }
      return;
    }
    case RmaCtx::kCtlSend: {
      const uint32_t slot = c->slot;
      const uint32_t to = static_cast<uint32_t>(ctl_->out[slot].sentTo);
      RmaOp* owner = ctlOwner_[slot];
      const uint32_t ownerGen = ctlOwnerGen_[slot];
      ctlOwner_[slot] = nullptr;
      ctlFree_.push_back(slot);
      if (to < peers_.size()) {
        if (ok) peers_[to].heardMs = coarseNowMs();
        if (!ok) lose(to, std::string("a ") + rma::ringMsgName(ctl_->out[slot].type) + " to it failed: " + err);
      }
      if (owner != nullptr && owner->gen == ownerGen) opDone(owner, ok, st);
      return;
    }
    case RmaCtx::kData: {
      // The op holding this context (its write, read or read-back).
      auto* op = static_cast<RmaOp*>(c->owner);
      if (op->peer < peers_.size()) {
        if (ok) peers_[op->peer].heardMs = coarseNowMs();
        if (!ok && op->state != RmaOp::kOrphan) {
          if (st == Status::kInvalidUsage) {
            fail("rank " + std::to_string(op->peer) + " refused an operation: " + err, st);
          } else {
            lose(op->peer, "an operation to it failed: " + err);
          }
        }
      }
      opDone(op, ok, st);
      return;
    }
  }
}

// A peer lost with operations on a window NCCL now deregisters (and will free): the provider (rxm and tcp keep the
// addresses of what they have yet to send) must let go first, and only closing the endpoint makes it. The comm is
// broken already; from here every operation fails at once and nothing arrives.
bool FabricRmaComm::abandonProvider(const std::string& why) {
  if (ep_->ep == nullptr) return true;
  fail("the comm's endpoint is closed: " + why, Status::kRemote);
  ep_->ep.reset();
  // What the close left in the queue names operations about to be abandoned: read and dropped.
  fi_cq_data_entry e[kCqBatch];
  for (int i = 0; i < 1024; ++i) {
    const ssize_t n = fi_cq_read(ep_->cq.get(), e, kCqBatch);
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(ep_->cq.get(), &err, 0) != 1) break;
    } else if (n <= 0) {
      break;
    }
  }
  for (RmaPeer& p : peers_) {
    p.lost = true;
    p.waitingSignals.clear();
  }
  std::fill(std::begin(ctlOwner_), std::end(ctlOwner_), nullptr);
  ctlFree_.clear();
  for (uint32_t i = 0; i < kCtlSlots; ++i) ctlFree_.push_back(kCtlSlots - 1 - i);
  backlog_.clear();
  recvRepost_.clear();
  return true;
}

// ---- control messages -------------------------------------------------------------------------------------------------

Status FabricRmaComm::postRecv(uint32_t slot) {
  if (ep_->ep == nullptr) return Status::kOk;  // abandoned: nothing more arrives
  ssize_t rc = fi_trecv(ep_->ep.get(), &ctl_->in[slot], sizeof(RmaMsg), ctlDesc_, FI_ADDR_UNSPEC, kRmaMsgTag, 0,
                        &ctlRecvCtx_[slot].fi);
  if (rc == -FI_EAGAIN) {
    recvRepost_.push_back(slot);  // posted again from the next pass
    return Status::kOk;
  }
  if (rc != 0) {
    WEFT_WARN("RMA: posting a control receive failed: {}", fi_strerror(static_cast<int>(-rc)));
    return Status::kSystem;
  }
  return Status::kOk;
}

void FabricRmaComm::sendCtl(uint32_t peer, const RmaMsg& m, RmaOp* owner) {
  if (backlog_.empty() && postCtl(peer, m, owner)) return;
  backlog_.push_back(Backlog{peer, m, owner, owner != nullptr ? owner->gen : 0});
}

bool FabricRmaComm::postCtl(uint32_t peer, const RmaMsg& m, RmaOp* owner) {
  if (ep_->ep == nullptr) {  // abandoned: nothing more leaves
    if (owner != nullptr) opDone(owner, false, Status::kRemote);
    return true;
  }
  // Injected where the provider takes 64 bytes that way: no completion to read, the source reusable at once (the
  // comm is progressed for as long as it lives: NCCL's proxy calls progress, and close moves what is queued).
  if (inject_) {
    ssize_t rc = fi_tinject(ep_->ep.get(), &m, sizeof(RmaMsg), peers_[peer].addr, kRmaMsgTag);
    if (rc == -FI_EAGAIN) return false;
    if (rc != 0) {
      lose(peer, std::string("a ") + rma::ringMsgName(m.type) + " could not be sent: " + fi_strerror(static_cast<int>(-rc)));
      if (owner != nullptr) opDone(owner, false, Status::kRemote);
      return true;
    }
    if (owner != nullptr) opDone(owner, true, Status::kOk);
    return true;
  }
  if (ctlFree_.empty()) return false;
  const uint32_t slot = ctlFree_.back();
  RmaMsg& out = ctl_->out[slot];
  out = m;
  out.sentTo = peer;
  ssize_t rc = fi_tsend(ep_->ep.get(), &out, sizeof(RmaMsg), ctlDesc_, peers_[peer].addr, kRmaMsgTag,
                        &ctlSendCtx_[slot].fi);
  if (rc == -FI_EAGAIN) return false;
  ctlFree_.pop_back();
  if (rc != 0) {
    ctlFree_.push_back(slot);
    lose(peer, std::string("a ") + rma::ringMsgName(m.type) + " could not be sent: " + fi_strerror(static_cast<int>(-rc)));
    if (owner != nullptr) opDone(owner, false, Status::kRemote);
    return true;
  }
  ctlOwner_[slot] = owner;
  ctlOwnerGen_[slot] = owner != nullptr ? owner->gen : 0;
  return true;
}

void FabricRmaComm::flushBacklog() {
  while (!backlog_.empty()) {
    Backlog& b = backlog_.front();
    RmaOp* owner = b.owner != nullptr && b.owner->gen == b.ownerGen ? b.owner : nullptr;
    if (peers_[b.peer].lost) {
      if (owner != nullptr) opDone(owner, false, Status::kRemote);
      backlog_.pop_front();
      continue;
    }
    if (!postCtl(b.peer, b.msg, owner)) return;
    backlog_.pop_front();
  }
}

void FabricRmaComm::onHello(const RmaMsg& m) {
  if (m.helloNranks() != static_cast<uint64_t>(nranks_)) {
    fail("rank " + std::to_string(m.origin) + " joined a comm of " + std::to_string(m.helloNranks()) + " ranks, this one has " +
             std::to_string(nranks_),
         Status::kInvalidUsage);
    return;
  }
  ++hellos_;
}

// A signal waits for the sender's writes before it (its count) to have landed here.
void FabricRmaComm::onSignal(const RmaMsg& m) {
  RmaPeer& p = peers_[m.origin];
  if (m.signalAfterWrites() <= p.landed) {
    applySignalMsg(m);
  } else {
    p.waitingSignals.push_back(m);
  }
}

}  // namespace weft::fabric
