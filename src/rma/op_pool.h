// SPDX-License-Identifier: Apache-2.0
// A transport's RMA requests: chunks of Op that are never freed while the comm lives (a request NCCL holds stays a
// valid address), handed out from a free list, each with a generation bumped when it returns, so that an answer
// still on its way for a request given back finds no one. No allocation once the chunks cover what is in flight.
//
// Op must have: uint32_t magic, index, gen; a default constructor giving a free op.
#pragma once

#include <cstddef>
#include <cstdint>
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
  // The op with this index and generation while it is out (an answer's token), else nullptr.
  Op* find(uint32_t index, uint32_t gen) const {
    if (index >= chunks_.size() * kChunk) return nullptr;
    Op* op = &chunks_[index / kChunk][index % kChunk];
    return op->gen == gen && op->magic == kRequestMagic ? op : nullptr;
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

}  // namespace weft::rma
