// SPDX-License-Identifier: Apache-2.0
// What the provider transports' RMA comms share (rma/provider_comm.h), written once for any transport's Op.
#include "rma/provider_comm.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <chrono>
#include <thread>

#include "weft/common/clock.h"
#include "weft/common/log.h"
#include "weft/common/params.h"

namespace weft::rma {

const char* ringMsgName(uint8_t type) {
  switch (type) {
    case RingMsg::kHello: return "hello";
    case RingMsg::kRecord: return "window record";
    case RingMsg::kSignal: return "signal";
    case RingMsg::kError: return "error";
    default: return "unknown message";
  }
}

// ---- the operations ------------------------------------------------------------------------------------------------

void ProviderOps::uses(ProviderOp* op, Window* w) {
  op->local = w;
  op->held = w;
  ++w->inflight;
}

void ProviderOps::done(ProviderOp* op, bool ok, Status st) {
  if (op->pending > 0) --op->pending;
  if (!ok && op->state == ProviderOp::kActive) {
    op->state = ProviderOp::kFailed;
    op->status = st;
  }
  if (op->pending > 0) return;
  op->held = nullptr;
  if (op->local != nullptr) {
    --op->local->inflight;
    op->local = nullptr;
  }
  if (op->state == ProviderOp::kActive) op->state = ProviderOp::kDone;
  if (op->state == ProviderOp::kOrphan) give(op);
}

void ProviderOps::release(ProviderOp* op) {
  if (op->pending > 0) {
    op->magic = 0;
    op->state = ProviderOp::kOrphan;
    return;
  }
  if (op->local != nullptr) --op->local->inflight;
  op->local = nullptr;
  give(op);
}

Status ProviderOps::test(ProviderOp* op, bool* finished) {
  if (op->state == ProviderOp::kDone) {
    release(op);
    *finished = true;
    return Status::kOk;
  }
  if (op->state == ProviderOp::kFailed) {
    const Status st = op->status;
    release(op);
    return st;
  }
  return Status::kOk;
}

void ProviderOps::lost(uint32_t peer) {
  forEach([&](ProviderOp& op) {
    if (op.peer != peer || op.pending == 0) return;
    if (op.state == ProviderOp::kActive) {
      op.state = ProviderOp::kFailed;
      op.status = Status::kRemote;
    }
    if (op.local != nullptr) {
      --op.local->inflight;
      op.local = nullptr;
    }
  });
}

void ProviderOps::abandoned() {
  forEach([&](ProviderOp& op) {
    if (op.pending == 0) return;
    op.pending = 1;
    done(&op, false, Status::kRemote);
  });
}

// ---- the comm --------------------------------------------------------------------------------------------------------

ProviderComm::ProviderComm(int rank, int nranks, uint64_t commId, const DeviceProps& props, uint32_t salt,
                           std::unique_ptr<ProviderOps> ops)
    : CommBase(rank, nranks, props),
      check_(static_cast<uint32_t>(commId ^ (commId >> 32)) ^ salt),
      peerTimeoutMs_(params::getInt("WEFT_PEER_TIMEOUT") * 1000),
      stallMs_(params::getInt("WEFT_STALL_S") * 1000),
      ops_(std::move(ops)) {}

Status ProviderComm::test(void* request, bool* done) {
  auto* op = static_cast<ProviderOp*>(request);
  if (done == nullptr || op == nullptr || op->magic != kRequestMagic || op->owner != this) {
    WEFT_WARN("RMA test: {} is not a pending request of this comm (completed already, or not weft's)", request);
    return Status::kInternal;
  }
  *done = false;
  if (ledgerWaiting()) return Status::kOk;  // a dump reads the ledger for a moment: NCCL calls again
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return Status::kOk;  // set-up holds the comm for a moment: NCCL calls again
  if (op->state == ProviderOp::kActive) pumpAll();
  return ops_->test(op, done);
}

Status ProviderComm::regMrSym(void* data, size_t size, int type, uint64_t flags, int dmabufFd, Window** out) {
  std::unique_ptr<Window> w;
  if (Status st = newWindow(data, size, type, flags, &w); st != Status::kOk) return st;
  if (w->cuda && (props_.ptrSupport & kPtrCuda) == 0) {
    WEFT_WARN("RMA regMrSym: GPU memory at {}, but device {} does not reach GPU memory", data, props_.name);
    return Status::kInvalidUsage;
  }
  uint64_t addr = 0, key = 0;
  if (Status st = registerWindow(w.get(), dmabufFd, &addr, &key); st != Status::kOk) return st;
  Window* win = w.get();
  {
    std::lock_guard<std::mutex> lock(mu_);
    addWindow(w.release());
    setRemote(win, static_cast<uint32_t>(rank_), addr, key);
    if (auto it = early_.find(win->id); it != early_.end()) {
      for (auto& [r, e] : it->second) {
        setRemote(win, r, e.addr, e.key);
        win->peerSize[r] = e.size;
      }
      early_.erase(it);
    }
    if (nranks_ > 1) {
      RingMsg m = msg(RingMsg::kRecord);
      m.origin = static_cast<uint32_t>(rank_);
      m.window = win->id;
      m.flags = static_cast<uint16_t>((flags & 0x7fff) | (win->cuda ? 0x8000 : 0));
      m.recordAddr() = addr;
      m.recordSize() = size;
      m.recordKey() = key;
      sendMsg(static_cast<uint32_t>((rank_ + 1) % nranks_), m);
    }
  }
  const uint32_t id = win->id;
  Status st = waitFor("the registration exchange of a window (its record round the ring)", [&] {
    if (failed()) return true;
    for (uint64_t s : win->peerSize) {
      if (s == UINT64_MAX) return false;
    }
    return sendsDrained();
  });
  std::lock_guard<std::mutex> lock(mu_);
  if (st == Status::kOk && failed()) {
    WEFT_WARN("RMA regMrSym (rank {}): the comm failed; window {} is not registered", rank_, id);
    st = Status::kRemote;
  }
  if (st != Status::kOk) {
    forgetWindow(win);
    dropWindow(win);
    return st;
  }
  WEFT_INFO(NCCL_NET | NCCL_REG, "RMA: window {} registered: {} bytes of {} memory at {}{}", id, size,
            win->cuda ? "GPU" : "host", data, (flags & kFlagSignalNeverReset) ? " (signals, never reset)" : "");
  *out = win;
  return Status::kOk;
}

Status ProviderComm::deregMrSym(Window* w) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!hasWindow(w)) {
      WEFT_WARN("RMA deregMrSym: {} is not a registered window of this comm", static_cast<void*>(w));
      return Status::kInvalidUsage;
    }
  }
  Status st = waitFor("deregistering a window still in use", [&] { return w->inflight == 0 || failed(); });
  std::lock_guard<std::mutex> lock(mu_);
  if (w->inflight > 0) {
    WEFT_WARN("RMA deregMrSym: window {} is still used by {} operation(s); not deregistered", w->id, w->inflight);
    return st == Status::kOk ? Status::kInvalidUsage : st;
  }
  // Operations to lost peers the provider still holds on this memory: it must let go before NCCL frees it.
  bool held = false;
  ops_->forEach([&](ProviderOp& op) { held |= op.pending > 0 && op.held == w; });
  if (held && abandonProvider("window " + std::to_string(w->id) + " is deregistered under operations to lost peers")) {
    ops_->abandoned();
  }
  forgetWindow(w);
  dropWindow(w);
  return Status::kOk;
}

Status ProviderComm::destroyContext(Context* ctx) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!hasContext(ctx)) {
      WEFT_WARN("RMA destroyContext: {} is not a live context of this comm", static_cast<void*>(ctx));
      return Status::kInternal;
    }
  }
  Status st = waitFor("finishing a destroyed context's operations", [&] {
    bool busy = false;
    ops_->forEach([&](ProviderOp& op) { busy |= op.ctx == ctx && op.pending > 0 && !peer(op.peer).lost; });
    return !busy;
  });
  std::lock_guard<std::mutex> lock(mu_);
  ops_->forEach([&](ProviderOp& op) {
    if (op.ctx != ctx || op.state == ProviderOp::kFree) return;
    op.ctx = nullptr;
    if (op.state != ProviderOp::kOrphan) ops_->release(&op);
  });
  forgetContext(ctx);
  return st;
}

ProviderOp* ProviderComm::takeOp(Context* ctx, uint32_t peerRank) {
  ProviderOp* op = ops_->take();
  if (op == nullptr) {
    WEFT_WARN("RMA: more than {} operations in flight on one comm", OpPool<ProviderOp>::kMax);
    return nullptr;
  }
  op->owner = this;
  op->ctx = ctx;
  op->peer = peerRank;
  op->state = ProviderOp::kActive;
  op->startMs = coarseNowMs();
  return op;
}

ProviderOp* ProviderComm::startOp(Context* ctx, uint32_t peerRank, void** request, const char* kind, uint64_t bytes) {
  ProviderOp* op = takeOp(ctx, peerRank);
  if (op == nullptr) return nullptr;
  op->kind = kind;
  op->bytes = bytes;
  *request = op;
  if (peer(peerRank).lost) failOp(op, Status::kRemote);
  return op;
}

Status ProviderComm::beginFlush(Context* ctx, int context, Window* w, uint32_t rank, void** request,
                                ProviderOp** readBack) {
  *readBack = nullptr;
  if (Status st = checkContext(ctx, context, rank, "iflush"); st != Status::kOk) return st;
  if (Status st = checkWindow(w, "flushed"); st != Status::kOk) return st;
  const auto self = static_cast<uint32_t>(rank_);
  ProviderOp* op = takeOp(ctx, self);
  if (op == nullptr) return Status::kSystem;
  *request = op;
  if (!cudaGetsSinceFlush_ || !w->cuda || w->size < sizeof(uint64_t) || peer(self).lost) {
    op->state = ProviderOp::kDone;
    return Status::kOk;
  }
  cudaGetsSinceFlush_ = false;
  *readBack = op;
  return Status::kOk;
}

void ProviderComm::onRingMsg(uint32_t from, const RingMsg& m) {
  if (m.check != check_ || m.origin >= static_cast<uint32_t>(nranks_)) {
    WEFT_WARN("RMA (rank {}): a message from rank {} that is not this comm's (check {:#x}, origin {}): dropped",
              rank_, from, m.check, m.origin);
    return;
  }
  if (from < static_cast<uint32_t>(nranks_)) peer(from).heardMs = coarseNowMs();
  const uint32_t next = static_cast<uint32_t>((rank_ + 1) % nranks_);
  switch (m.type) {
    case RingMsg::kHello:
      onHello(m);
      if (next != m.origin) sendMsg(next, m);
      return;
    case RingMsg::kRecord:
      if (Window* w = windowById(m.window); w != nullptr) {
        w->peerSize[m.origin] = m.recordSize();
        setRemote(w, m.origin, m.recordAddr(), m.recordKey());
      } else if (m.window >= nextWindow_) {
        early_[m.window][m.origin] = Early{m.recordAddr(), m.recordKey(), m.recordSize()};
      }
      if (next != m.origin) sendMsg(next, m);
      return;
    case RingMsg::kSignal:
      onSignal(m);
      return;
    case RingMsg::kError: {
      const Status st = static_cast<Status>((m.errorWord() >> 8) & 0xff);
      fail("rank " + std::to_string(m.origin) + " refused a " + ringMsgName(static_cast<uint8_t>(m.errorWord() & 0xff)) +
               " for window " + std::to_string(m.window) + " (" + statusName(st) + ")",
           st == Status::kOk ? Status::kRemote : st);
      return;
    }
    default:
      WEFT_WARN("RMA (rank {}): a message of unknown type {} from rank {}: dropped", rank_, m.type, from);
  }
}

bool ProviderComm::applySignalMsg(const RingMsg& m) {
  Window* w = windowById(m.window);
  std::string err;
  Status st = Status::kOk;
  if (w == nullptr || !isSignalSlot(w->size, m.signalOff()) || !isSignalOp(m.signalOp)) {
    st = Status::kInvalidUsage;
    err = "a signal for offset " + std::to_string(m.signalOff()) + " of window " + std::to_string(m.window) + " from rank " +
          std::to_string(m.origin) + " names no signal slot of this rank";
  } else if (!applySignal(*w, m.signalOff(), static_cast<SignalOp>(m.signalOp), m.signalValue(), &err)) {
    st = Status::kSystem;
    err = "a signal from rank " + std::to_string(m.origin) + " could not be applied: " + err;
  }
  if (st == Status::kOk) return true;
  fail(err, st);
  RingMsg e = msg(RingMsg::kError);
  e.origin = static_cast<uint32_t>(rank_);
  e.window = m.window;
  e.errorWord() = (static_cast<uint64_t>(st) << 8) | RingMsg::kSignal;
  sendMsg(m.origin, e);
  return false;
}

void ProviderComm::lose(uint32_t peerRank, const std::string& why) {
  PeerState& p = peer(peerRank);
  if (p.lost) return;
  p.lost = true;
  // The ledger: lost (a stall that found the link the likely cause keeps that name: lost over it).
  if (!(p.stallHeardMs >= 0 && p.kind == StallKind::kLink)) p.kind = StallKind::kPeerGone;
  stallEvents_.fetch_add(1, std::memory_order_relaxed);
  fail("rank " + std::to_string(peerRank) + " is lost: " + why, Status::kRemote);
  ops_->lost(peerRank);
  onLost(peerRank);
}

void ProviderComm::checkStalls() {
  const int64_t now = coarseNowMs();
  if (now - stallCheckMs_ < 100) return;
  stallCheckMs_ = now;
  std::vector<uint32_t> stalled;
  std::vector<int> quietOps(static_cast<size_t>(nranks_), 0);
  std::vector<int64_t> quietSince(static_cast<size_t>(nranks_), INT64_MAX);
  ops_->forEach([&](ProviderOp& op) {
    if (op.state != ProviderOp::kActive || op.pending == 0 || op.peer >= static_cast<uint32_t>(nranks_)) return;
    const PeerState& p = peer(op.peer);
    if (p.lost) return;
    const int64_t since = std::max(op.startMs, p.heardMs);
    if (now - since > peerTimeoutMs_) stalled.push_back(op.peer);
    if (stallMs_ > 0 && now - since > stallMs_) {
      ++quietOps[op.peer];
      quietSince[op.peer] = std::min(quietSince[op.peer], since);
    }
  });
  for (uint32_t r = 0; r < static_cast<uint32_t>(nranks_); ++r) {
    PeerState& p = peer(r);
    if (p.stallHeardMs >= 0 && p.heardMs != p.stallHeardMs) {  // it spoke: the episode ended
      WEFT_INFO(NCCL_NET, "RMA (rank {} of {}): rank {} answers again after a stall", rank_, nranks_, r);
      p.stallHeardMs = -1;
      if (!p.lost) p.kind = StallKind::kNone;
    }
    if (quietOps[r] == 0 || p.stallHeardMs >= 0) continue;
    p.stallHeardMs = p.heardMs;
    StallKind kind = StallKind::kOther;
    const char* hint = stallHint(&kind);
    ++p.stalls;
    p.kind = kind;
    stallEvents_.fetch_add(1, std::memory_order_relaxed);
    WEFT_WARN("RMA (rank {} of {}): stalled on rank {}: {} operation{} of ours {} had no completion for {} s, and "
              "nothing came from it since (WEFT_STALL_S): {}; it is lost after WEFT_PEER_TIMEOUT={} s [{}]",
              rank_, nranks_, r, quietOps[r], quietOps[r] == 1 ? "" : "s", quietOps[r] == 1 ? "has" : "have",
              (now - quietSince[r]) / 1000, hint,
              peerTimeoutMs_ / 1000, stallKindName(kind));
  }
  for (uint32_t r : stalled) {
    lose(r, "no completion from it for " + std::to_string(peerTimeoutMs_ / 1000) + " s (WEFT_PEER_TIMEOUT)");
  }
}

bool ProviderComm::ledger(std::vector<PeerLedger>* out) {
  std::unique_lock<std::mutex> lock;
  if (!lockForLedger(&lock)) return false;
  std::vector<std::vector<const ProviderOp*>> byPeer(static_cast<size_t>(nranks_));
  ops_->forEach([&](ProviderOp& op) {
    if (op.state == ProviderOp::kActive && op.peer < byPeer.size() && static_cast<int>(op.peer) != rank_) {
      byPeer[op.peer].push_back(&op);
    }
  });
  const std::string local = localAddress();
  for (uint32_t r = 0; r < static_cast<uint32_t>(nranks_); ++r) {
    if (static_cast<int>(r) == rank_) continue;
    const PeerState& p = peer(r);
    PeerLedger l;
    l.rank = static_cast<int>(r);
    l.name = "rank " + std::to_string(r);
    l.peer = peerAddress(r);
    l.local = local;
    l.stalls = p.stalls;
    l.stalledSinceMs = p.stallHeardMs >= 0 && !p.lost ? std::max<int64_t>(p.stallHeardMs, 1) : 0;
    l.kind = p.kind;
    auto& ops = byPeer[r];
    l.inflight = static_cast<uint32_t>(ops.size());
    std::sort(ops.begin(), ops.end(), [](const ProviderOp* a, const ProviderOp* b) { return a->startMs < b->startMs; });
    for (size_t i = 0; i < ops.size() && i < PeerLedger::kMaxOps; ++i) {
      LedgerOp o;
      o.kind = ops[i]->kind;
      o.bytes = ops[i]->bytes;
      o.postMs = ops[i]->startMs;
      l.ops.push_back(o);
    }
    out->push_back(std::move(l));
  }
  return true;
}

void ProviderComm::drainAndDelete() {
  const int64_t until = coarseNowMs() + 1000;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pumpAll();
      if (sendsDrained() || coarseNowMs() > until) break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  delete this;
}

}  // namespace weft::rma
