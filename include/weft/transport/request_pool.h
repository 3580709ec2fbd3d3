// SPDX-License-Identifier: Apache-2.0
// The request pool every backend's data comm keeps: requests live in chunks of kChunk that never move, made when the
// comm first has more in flight than it had (an idle connection holds none, a busy one what it used at its peak, at
// most `capacity`), and index i names one request for the comm's life. Taking and giving back allocate nothing:
// growing is the data path's only allocation, at most capacity / kChunk times in a comm's life, and a growth that
// fails is back-pressure (no request: NCCL calls again). What a chunk holds is the backend's (Chunk: its array of
// requests, and whatever goes with them, such as libfabric's registered offer messages).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>  // std::nothrow
#include <type_traits>
#include <utility>
#include <vector>

#include "weft/common/numa.h"

namespace weft {

template <typename Chunk, int kChunkSize = 4>
class RequestPool {
 public:
  static constexpr int kChunk = kChunkSize;

  // `node`: the NUMA node of the comm's NIC, where chunks of plain requests (numa::ArrayPtr) are made; -1 anywhere.
  explicit RequestPool(size_t capacity, int node = -1) : capacity_(std::min<size_t>(capacity, UINT16_MAX)), node_(node) {}

  // A free index, making one more chunk first when none is free: make(Chunk&, base) fills a chunk for indexes
  // [base, base + kChunk) and says whether it could (false: no memory, or what goes with it failed). -1 when every
  // request is in use or the chunk could not be made.
  template <typename Make>
  int take(Make&& make) {
    if (free_.empty() && !grow(make)) return -1;
    const int i = free_.back();
    free_.pop_back();
    return i;
  }
  // For a pool whose chunks are plain arrays of requests (Chunk = numa::ArrayPtr<T>, on the pool's node, or
  // std::unique_ptr<T[]>): a free request (nullptr: none), its chunk made on the way where needed, init(T&, index)
  // run once for each request made.
  template <typename Init>
  auto* takeRequest(Init&& init) {
    using T = std::remove_reference_t<decltype(std::declval<Chunk&>()[0])>;
    const int i = take([&](Chunk& c, size_t base) {
      if constexpr (std::is_same_v<Chunk, numa::ArrayPtr<T>>) {
        c = numa::makeArray<T>(kChunk, node_);
      } else {
        c.reset(new (std::nothrow) T[kChunk]);
      }
      if (!c) return false;
      for (int j = 0; j < kChunk; ++j) init(c[j], base + static_cast<size_t>(j));
      return true;
    });
    return i < 0 ? static_cast<T*>(nullptr) : &chunkOf(static_cast<size_t>(i))[slotOf(static_cast<size_t>(i))];
  }
  void giveBack(uint16_t i) { free_.push_back(i); }  // room reserved as chunks came: never allocates

  const Chunk& chunkOf(size_t i) const { return chunks_[i / kChunk]; }
  static size_t slotOf(size_t i) { return i % kChunk; }
  size_t allocated() const { return allocated_; }
  size_t capacity() const { return capacity_; }
  int node() const { return node_; }

 private:
  template <typename Make>
  bool grow(Make& make) {
    if (allocated_ >= capacity_) return false;
    Chunk chunk{};
    const size_t base = allocated_;
    if (!make(chunk, base)) return false;
    // The chunk list grows as it needs (not reserved for the capacity up front: an idle comm stays small); the
    // requests live in the chunks' own arrays, which never move.
    const size_t next = std::min(capacity_, base + kChunk);
    try {
      if (free_.capacity() < next) free_.reserve(std::max(next, 2 * free_.capacity()));
      chunks_.push_back(std::move(chunk));
    } catch (...) {  // no memory: back-pressure, as a chunk that could not be made
      return false;
    }
    allocated_ = next;
    for (size_t i = allocated_; i-- > base;) free_.push_back(static_cast<uint16_t>(i));
    return true;
  }

  size_t capacity_;
  int node_;
  size_t allocated_ = 0;
  std::vector<Chunk> chunks_;
  std::vector<uint16_t> free_;
};

}  // namespace weft
