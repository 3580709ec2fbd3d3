// SPDX-License-Identifier: Apache-2.0
// What the RMA comms over a provider that moves bytes itself (libfabric, verbs) share, beside rma::CommBase: their
// requests (rma::ProviderOp), the 64-byte messages of weft's own, window records travelling the ring of ranks,
// signals applied from a message, the peers lost and the stalls found, and the set-up calls built on those. A
// transport adds how it registers memory, posts work and sends a message (fabric/fabric_rma.h, verbs/verbs_rma.h).
//
// The ring: a collective call's record (one per rank) goes to the next rank, which keeps it and forwards it, until it
// reaches the rank before its origin: N - 1 messages of 64 bytes a rank for a comm of N, to two neighbours only.
//
// Locking: CommBase's mu_ guards everything here too.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rma/comm_base.h"
#include "rma/op_pool.h"
#include "rma/rma.h"
#include "weft/common/clock.h"
#include "weft/common/log.h"
#include "weft/common/params.h"

namespace weft::rma {

// A message of weft's own between two ranks of a comm.
struct RingMsg {
  enum : uint8_t { kHello = 1, kRecord = 2, kSignal = 3, kError = 4 };
  uint32_t check;   // the comm's check word (its id folded): another comm's message is dropped
  uint8_t type;
  uint8_t signalOp;  // signal: SignalOp
  uint16_t flags;    // record: the window's flags, bit 15 set for GPU memory
  uint32_t origin;   // hello, record: the rank it is about; signal, error: the sender
  uint32_t window;   // record: the window's id; signal: the signal's window; error: the window it named
  // The four words below mean what the type says: read and write them through the views that name them.
  uint64_t a;
  uint64_t b;
  uint64_t c;
  uint64_t d;
  uint64_t sentTo;  // libfabric, this rank's own out slot: the rank it went to (the peer never reads it)
  uint64_t reserved;

  uint64_t& helloNranks() { return a; }
  uint64_t& recordAddr() { return a; }  // the address peers name
  uint64_t& recordSize() { return b; }
  uint64_t& recordKey() { return c; }
  uint64_t& signalOff() { return a; }
  uint64_t& signalValue() { return b; }
  uint64_t& signalAfterWrites() { return c; }  // libfabric: writes of the sender that must have landed first
  uint64_t& errorWord() { return d; }          // status << 8 | the refused message's type
  uint64_t helloNranks() const { return a; }
  uint64_t recordAddr() const { return a; }
  uint64_t recordSize() const { return b; }
  uint64_t recordKey() const { return c; }
  uint64_t signalOff() const { return a; }
  uint64_t signalValue() const { return b; }
  uint64_t signalAfterWrites() const { return c; }
  uint64_t errorWord() const { return d; }
};
static_assert(sizeof(RingMsg) == 64);
const char* ringMsgName(uint8_t type);

// What the shared code reads of a transport's peer.
struct PeerState {
  bool lost = false;
  int64_t heardMs = 0;  // the last completion of an operation to it, or message from it
};

template <typename Op>
class ProviderComm : public CommBase {
 public:
  ProviderComm(int rank, int nranks, uint64_t commId, const DeviceProps& props, uint32_t salt)
      : CommBase(rank, nranks, props),
        check_(static_cast<uint32_t>(commId ^ (commId >> 32)) ^ salt),
        peerTimeoutMs_(params::getInt("WEFT_PEER_TIMEOUT") * 1000) {}

  Status test(void* request, bool* done) override {
    auto* op = static_cast<Op*>(request);
    if (done == nullptr || op == nullptr || op->magic != kRequestMagic || op->owner != this) {
      WEFT_WARN("RMA test: {} is not a pending request of this comm (completed already, or not weft's)", request);
      return Status::kInternal;
    }
    *done = false;
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return Status::kOk;  // set-up holds the comm for a moment: NCCL calls again
    if (op->state == ProviderOp::kActive) pumpAll();
    return providerOpTest(pool_, op, done);
  }

  // Collective: registers the memory (the transport's registerWindow), sends this rank's record round the ring and
  // waits until every rank's came and what this rank forwards has left.
  Status regMrSym(void* data, size_t size, int type, uint64_t flags, int dmabufFd, Window** out) override {
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

  // A window still read or written by an operation of ours waits until the provider is done with it: its memory is
  // NCCL's to free once this returns. (Peers' operations on it are theirs to finish: NCCL deregisters after a
  // barrier.)
  Status deregMrSym(Window* w) override {
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
    pool_.forEach([&](Op& op) { held |= op.pending > 0 && op.held == w; });
    if (held && abandonProvider("window " + std::to_string(w->id) + " is deregistered under operations to lost peers")) {
      providerOpsAbandoned(pool_);
    }
    forgetWindow(w);
    dropWindow(w);
    return Status::kOk;
  }

  // What the provider still holds for the context finishes first (its completion contexts must stay valid).
  Status destroyContext(Context* ctx) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!hasContext(ctx)) {
        WEFT_WARN("RMA destroyContext: {} is not a live context of this comm", static_cast<void*>(ctx));
        return Status::kInternal;
      }
    }
    Status st = waitFor("finishing a destroyed context's operations", [&] {
      bool busy = false;
      pool_.forEach([&](Op& op) { busy |= op.ctx == ctx && op.pending > 0 && !peer(op.peer).lost; });
      return !busy;
    });
    std::lock_guard<std::mutex> lock(mu_);
    pool_.forEach([&](Op& op) {
      if (op.ctx != ctx || op.state == ProviderOp::kFree) return;
      op.ctx = nullptr;
      if (op.state != ProviderOp::kOrphan) providerOpRelease(pool_, &op);
    });
    forgetContext(ctx);
    return st;
  }

 protected:
  // The transport's part. Caller holds mu_ for all but registerWindow (no lock: it may take long).
  virtual PeerState& peer(uint32_t rank) = 0;
  // Registers w's memory for remote access: the address and key peers name it by.
  virtual Status registerWindow(Window* w, int dmabufFd, uint64_t* addr, uint64_t* key) = 0;
  virtual void forgetWindow(Window* w) = 0;  // its registration released (no-op for one never registered)
  // The provider must stop touching any memory of this comm's operations now (the comm is broken: a peer is lost);
  // true when it dropped every operation it held (none will complete). Where the NIC checks every access against the
  // registration (verbs), deregistering is enough: false, nothing done, the operations end with flush errors.
  virtual bool abandonProvider(const std::string& why) {
    (void)why;
    return false;
  }
  virtual void setRemote(Window* w, uint32_t rank, uint64_t addr, uint64_t key) = 0;
  // A message of weft's own to a peer, sent now or queued until the provider takes it.
  virtual void sendMsg(uint32_t peer, const RingMsg& m) = 0;
  // Nothing of weft's own waits to be sent or for its send to complete.
  virtual bool sendsDrained() const = 0;
  // Another rank's hello (libfabric's connect); a signal message (libfabric waits for the sender's writes first).
  virtual void onHello(const RingMsg& m) { (void)m; }
  virtual void onSignal(const RingMsg& m) { applySignalMsg(m); }
  virtual void onLost(uint32_t peer) { (void)peer; }

  Op* takeOp(Context* ctx, uint32_t peerRank) {
    Op* op = pool_.take();
    if (op == nullptr) {
      WEFT_WARN("RMA: more than {} operations in flight on one comm", OpPool<Op>::kMax);
      return nullptr;
    }
    op->owner = this;
    op->ctx = ctx;
    op->peer = peerRank;
    op->state = ProviderOp::kActive;
    op->startMs = coarseNowMs();
    return op;
  }
  // An operation's request to peerRank, handed to NCCL (*request): failed at once (kRemote) where that peer is lost.
  // nullptr past the pool's bound.
  Op* startOp(Context* ctx, uint32_t peerRank, void** request) {
    Op* op = takeOp(ctx, peerRank);
    if (op == nullptr) return nullptr;
    *request = op;
    if (peer(peerRank).lost) failOp(op, Status::kRemote);
    return op;
  }
  static void failOp(Op* op, Status st) {
    op->state = ProviderOp::kFailed;
    op->status = st;
  }
  // iflush's opening: its checks and its request (*request). *readBack is that request where one word of w must be
  // read back through the provider (gets into GPU memory since the last flush, and w is GPU memory of a word or
  // more); else nullptr, and the request is done at once.
  Status beginFlush(Context* ctx, int context, Window* w, uint32_t rank, void** request, Op** readBack) {
    *readBack = nullptr;
    if (Status st = checkContext(ctx, context, rank, "iflush"); st != Status::kOk) return st;
    if (Status st = checkWindow(w, "flushed"); st != Status::kOk) return st;
    const auto self = static_cast<uint32_t>(rank_);
    Op* op = takeOp(ctx, self);
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
  void opDone(Op* op, bool ok, Status st) { providerOpDone(pool_, op, ok, st); }
  void release(Op* op) { providerOpRelease(pool_, op); }

  RingMsg msg(uint8_t type) const {
    RingMsg m{};
    m.check = check_;
    m.type = type;
    return m;
  }

  // A message from `from` (its transport delivered it whole).
  void onRingMsg(uint32_t from, const RingMsg& m) {
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

  // Applies a signal message to its slot here; one naming no slot is refused (the comm's error, and an error message
  // back to its sender).
  bool applySignalMsg(const RingMsg& m) {
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

  // The peer is gone: what waits on it fails, later operations to it fail at once, queryLastError says so.
  void lose(uint32_t peerRank, const std::string& why) {
    PeerState& p = peer(peerRank);
    if (p.lost) return;
    p.lost = true;
    fail("rank " + std::to_string(peerRank) + " is lost: " + why, Status::kRemote);
    providerOpsLost(pool_, peerRank);
    onLost(peerRank);
  }

  // An operation the provider has held with no news from its peer for WEFT_PEER_TIMEOUT loses the peer (at most
  // every 100 ms).
  void checkStalls() {
    const int64_t now = coarseNowMs();
    if (now - stallCheckMs_ < 100) return;
    stallCheckMs_ = now;
    std::vector<uint32_t> stalled;
    pool_.forEach([&](Op& op) {
      if (op.state != ProviderOp::kActive || op.pending == 0 || op.peer >= static_cast<uint32_t>(nranks_)) return;
      const PeerState& p = peer(op.peer);
      if (!p.lost && now - std::max(op.startMs, p.heardMs) > peerTimeoutMs_) stalled.push_back(op.peer);
    });
    for (uint32_t r : stalled) {
      lose(r, "no completion from it for " + std::to_string(peerTimeoutMs_ / 1000) + " s (WEFT_PEER_TIMEOUT)");
    }
  }

  // close(): what this rank still sends (a record it forwards) leaves first, within a second; then the comm goes.
  void drainAndDelete() {
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

  const uint32_t check_;
  const int64_t peerTimeoutMs_;
  // Guarded by mu_.
  OpPool<Op> pool_;

 private:
  struct Early {
    uint64_t addr, key, size;
  };
  // Records of windows this rank has not registered yet: id -> rank -> record.
  std::unordered_map<uint32_t, std::unordered_map<uint32_t, Early>> early_;
  int64_t stallCheckMs_ = 0;
};

}  // namespace weft::rma
