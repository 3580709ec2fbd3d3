// SPDX-License-Identifier: Apache-2.0
// Small helpers the TCP backend's comm files share (not part of any interface).
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>

namespace weft::tcp::detail {

// Takes `node` out of a singly linked list (through `link`, its `next` by default) with a tail pointer; nothing
// when it is not there.
template <typename T>
void unlink(T*& head, T*& tail, T* node, T* T::*link = &T::next) {
  T* prev = nullptr;
  for (T* p = head; p != nullptr; prev = p, p = p->*link) {
    if (p != node) continue;
    (prev ? prev->*link : head) = node->*link;
    if (tail == node) tail = prev;
    return;
  }
}

inline bool wouldBlock(int e) { return e == EAGAIN || e == EWOULDBLOCK; }

inline void add(std::atomic<int64_t>& c, int64_t v) { c.fetch_add(v, std::memory_order_relaxed); }

}  // namespace weft::tcp::detail
