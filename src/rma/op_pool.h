// SPDX-License-Identifier: Apache-2.0
// A transport's RMA requests: chunks of Op that are never freed while the comm lives (a request NCCL holds stays a
// valid address), handed out from a free list, each with a generation bumped when it returns, so that an answer
// still on its way for a request given back finds no one. No allocation once the chunks cover what is in flight.
//
// Op must have: uint32_t magic, index, gen; a default constructor giving a free op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "rma/rma.h"

namespace weft::rma {

template <typename Op>
class OpPool {
 public:
  static constexpr size_t kChunk = 64;
  static constexpr size_t kMax = size_t{1} << 20;  // far above NCCL's bound (32 x maxRecvs a context and rank)

  // A cleared op with magic kRequestMagic, or nullptr past kMax.
  Op* take() {
    if (free_.empty()) {
      if (chunks_.size() * kChunk >= kMax) return nullptr;
      auto chunk = std::make_unique<Op[]>(kChunk);
      const auto base = static_cast<uint32_t>(chunks_.size() * kChunk);
      for (size_t i = 0; i < kChunk; ++i) chunk[i].index = base + static_cast<uint32_t>(i);
      for (size_t i = kChunk; i-- > 0;) free_.push_back(&chunk[i]);
      chunks_.push_back(std::move(chunk));
    }
    Op* op = free_.back();
    free_.pop_back();
    const uint32_t index = op->index, gen = op->gen;
    *op = Op{};
    op->index = index;
    op->gen = gen;
    op->magic = kRequestMagic;
    ++inUse_;
    return op;
  }
  void give(Op* op) {
    const uint32_t index = op->index, gen = op->gen + 1;
    *op = Op{};
    op->index = index;
    op->gen = gen;
    free_.push_back(op);
    --inUse_;
  }
  // The op with this index and generation while it is out (an answer's token, a completion's), else nullptr: an op
  // given back has a new generation.
  Op* find(uint32_t index, uint32_t gen) const {
    if (index >= chunks_.size() * kChunk) return nullptr;
    Op* op = &chunks_[index / kChunk][index % kChunk];
    return op->gen == gen ? op : nullptr;
  }
  size_t inUse() const { return inUse_; }
  // Every op, out or free (a peer lost: what waits on it fails).
  template <typename F>
  void forEach(F&& f) {
    for (auto& chunk : chunks_) {
      for (size_t i = 0; i < kChunk; ++i) f(chunk[i]);
    }
  }

 private:
  std::vector<std::unique_ptr<Op[]>> chunks_;
  std::vector<Op*> free_;
  size_t inUse_ = 0;
};

// A request whose work a provider holds (libfabric, verbs): the provider operations it waits for, and what happens
// when it ends. A request NCCL gives back (test reports its end) while the provider still holds an operation of it
// stays out of the pool as an orphan until the provider returns that operation: its completion context stays valid.
struct ProviderOp {
  uint32_t magic = 0;  // kRequestMagic while NCCL holds it
  uint32_t index = 0, gen = 0;
  const void* owner = nullptr;  // the comm (test refuses another comm's request)
  enum : uint8_t { kFree, kActive, kDone, kFailed, kOrphan } state = kFree;
  Status status = Status::kOk;
  uint8_t pending = 0;   // provider operations not completed yet
  uint32_t peer = 0;
  Context* ctx = nullptr;
  Window* local = nullptr;  // the window it reads or writes here: counted in its inflight until the provider is done
  // That window still, while the provider holds an operation on its memory, even after `local` let go of it (its peer
  // lost): deregistering it must first make the provider let go (ProviderComm::deregMrSym).
  Window* held = nullptr;
  int64_t startMs = 0;
  const char* kind = "";  // the ledger's (docs/hangs.md): put, signal, get, flush
  uint64_t bytes = 0;
};

// A provider comm's operations, whatever the transport's Op: their life written once (provider_comm.cc) over what
// depends on the type, taking one, giving one back and visiting all.
class ProviderOps {
 public:
  virtual ~ProviderOps() = default;
  virtual ProviderOp* take() = 0;  // OpPool::take: a cleared op, or nullptr past the bound
  virtual void give(ProviderOp* op) = 0;
  virtual void forEach(const std::function<void(ProviderOp&)>& f) = 0;

  // `op` reads or writes w's memory here (a put's source, a get's destination).
  static void uses(ProviderOp* op, Window* w);
  // One provider operation of `op` ended (ok, or failed with st).
  void done(ProviderOp* op, bool ok, Status st);
  // NCCL is done with `op`: back to the pool, or an orphan while the provider holds an operation of it.
  void release(ProviderOp* op);
  // test()'s ending: *finished and the op released once it completed; its status (released too) once it failed.
  Status test(ProviderOp* op, bool* finished);
  // A peer is lost: its ops still waiting fail now, and their windows are free to deregister (nothing moves to or
  // from a lost peer any more), while the provider keeps their contexts until it returns them.
  void lost(uint32_t peer);
  // The provider dropped everything it held (its endpoint closed): no operation waits for it any more; those still
  // active fail (kRemote), orphans go back to the pool.
  void abandoned();
};

template <typename Op>
class ProviderOpPool final : public ProviderOps {
 public:
  ProviderOp* take() override { return pool_.take(); }
  void give(ProviderOp* op) override { pool_.give(static_cast<Op*>(op)); }
  void forEach(const std::function<void(ProviderOp&)>& f) override {
    pool_.forEach([&](Op& op) { f(op); });
  }
  // The op a completion or an answer names (OpPool::find).
  Op* find(uint32_t index, uint32_t gen) const { return pool_.find(index, gen); }

 private:
  OpPool<Op> pool_;
};

}  // namespace weft::rma
