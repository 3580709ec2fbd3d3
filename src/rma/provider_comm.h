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

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "rma/comm_base.h"
#include "rma/op_pool.h"
#include "rma/rma.h"
#include "weft/common/rail_health.h"

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
  int64_t stallHeardMs = -1;  // heardMs when its stall was reported (WEFT_STALL_S); -1: no stall this episode
  // The ledger (ProviderComm::ledger): stalls reported; the current stall's kind, or why the peer was lost.
  uint64_t stalls = 0;
  StallKind kind = StallKind::kNone;
};

// The shared part, written once for any transport's Op (provider_comm.cc); ProviderCommOf<Op> below gives the
// transport its own Op back.
class ProviderComm : public CommBase {
 public:
  Status test(void* request, bool* done) override;
  // Collective: registers the memory (the transport's registerWindow), sends this rank's record round the ring and
  // waits until every rank's came and what this rank forwards has left.
  Status regMrSym(void* data, size_t size, int type, uint64_t flags, int dmabufFd, Window** out) override;
  // A window still read or written by an operation of ours waits until the provider is done with it: its memory is
  // NCCL's to free once this returns. (Peers' operations on it are theirs to finish: NCCL deregisters after a
  // barrier.)
  Status deregMrSym(Window* w) override;
  // What the provider still holds for the context finishes first (its completion contexts must stay valid).
  Status destroyContext(Context* ctx) override;
  // Every peer, its operations in flight (put, signal, get; no bytes done: the provider reports none), stalls and
  // loss; addresses where the transport names them (peerAddress, localAddress).
  bool ledger(std::vector<PeerLedger>* out) override;
  uint64_t stallEvents() const override { return stallEvents_.load(std::memory_order_relaxed); }

 protected:
  ProviderComm(int rank, int nranks, uint64_t commId, const DeviceProps& props, uint32_t salt,
               std::unique_ptr<ProviderOps> ops);

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
  // What a stall line (WEFT_STALL_S) says a silent peer may be, by what this provider needs of it; and the kind.
  // The ledger's addresses of a pair's two ends, as each end names them ("": the report pairs by rank instead).
  virtual std::string peerAddress(uint32_t rank) const {
    (void)rank;
    return {};
  }
  virtual std::string localAddress() const { return {}; }
  virtual const char* stallHint(StallKind* kind) const {
    *kind = StallKind::kOther;
    return "the link, its host, or its proxy not progressing (a provider over TCP sockets needs the target's "
           "progress)";
  }

  ProviderOp* takeOp(Context* ctx, uint32_t peerRank);
  // An operation's request to peerRank, handed to NCCL (*request): failed at once (kRemote) where that peer is lost.
  // nullptr past the pool's bound.
  // kind and bytes: what the ledger says of it (put, signal, get).
  ProviderOp* startOp(Context* ctx, uint32_t peerRank, void** request, const char* kind = "", uint64_t bytes = 0);
  static void failOp(ProviderOp* op, Status st) {
    op->state = ProviderOp::kFailed;
    op->status = st;
  }
  // iflush's opening: its checks and its request (*request). *readBack is that request where one word of w must be
  // read back through the provider (gets into GPU memory since the last flush, and w is GPU memory of a word or
  // more); else nullptr, and the request is done at once.
  Status beginFlush(Context* ctx, int context, Window* w, uint32_t rank, void** request, ProviderOp** readBack);
  void opDone(ProviderOp* op, bool ok, Status st) { ops_->done(op, ok, st); }
  void release(ProviderOp* op) { ops_->release(op); }

  RingMsg msg(uint8_t type) const {
    RingMsg m{};
    m.check = check_;
    m.type = type;
    return m;
  }
  // A message from `from` (its transport delivered it whole).
  void onRingMsg(uint32_t from, const RingMsg& m);
  // Applies a signal message to its slot here; one naming no slot is refused (the comm's error, and an error message
  // back to its sender).
  bool applySignalMsg(const RingMsg& m);
  // The peer is gone: what waits on it fails, later operations to it fail at once, queryLastError says so.
  void lose(uint32_t peerRank, const std::string& why);
  // An operation the provider has held with no news from its peer for WEFT_STALL_S warns once per episode (a stall
  // line, docs/hangs.md); for WEFT_PEER_TIMEOUT it loses the peer. At most every 100 ms.
  void checkStalls();
  // close(): what this rank still sends (a record it forwards) leaves first, within a second; then the comm goes.
  void drainAndDelete();

  const uint32_t check_;
  const int64_t peerTimeoutMs_;
  const int64_t stallMs_;  // WEFT_STALL_S in ms; 0: no stall lines
  // Guarded by mu_.
  const std::unique_ptr<ProviderOps> ops_;

 private:
  struct Early {
    uint64_t addr, key, size;
  };
  // Records of windows this rank has not registered yet: id -> rank -> record.
  std::unordered_map<uint32_t, std::unordered_map<uint32_t, Early>> early_;
  int64_t stallCheckMs_ = 0;
  std::atomic<uint64_t> stallEvents_{0};  // stalls reported and peers lost (stallEvents)
};

// A transport's comm over its own Op (derived from ProviderOp): the shared part's requests as that type.
template <typename Op>
class ProviderCommOf : public ProviderComm {
 protected:
  ProviderCommOf(int rank, int nranks, uint64_t commId, const DeviceProps& props, uint32_t salt)
      : ProviderComm(rank, nranks, commId, props, salt, std::make_unique<ProviderOpPool<Op>>()) {}
  Op* startOp(Context* ctx, uint32_t peerRank, void** request, const char* kind = "", uint64_t bytes = 0) {
    return static_cast<Op*>(ProviderComm::startOp(ctx, peerRank, request, kind, bytes));
  }
  Status beginFlush(Context* ctx, int context, Window* w, uint32_t rank, void** request, Op** readBack) {
    ProviderOp* op = nullptr;
    const Status st = ProviderComm::beginFlush(ctx, context, w, rank, request, &op);
    *readBack = static_cast<Op*>(op);
    return st;
  }
  // The op a completion or an answer names, while it is out.
  Op* findOp(uint32_t index, uint32_t gen) const {
    return static_cast<const ProviderOpPool<Op>&>(*ops_).find(index, gen);
  }
};

}  // namespace weft::rma
