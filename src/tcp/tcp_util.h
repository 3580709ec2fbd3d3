// SPDX-License-Identifier: Apache-2.0
// Small helpers the TCP backend's comm files share (not part of any interface).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

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

// One non-blocking sendmsg of iov[0, n), again on EINTR, counted in `calls`: the bytes taken, or -1 with errno.
inline ssize_t sendIov(int fd, iovec* iov, int n, std::atomic<int64_t>& calls) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<size_t>(n);
  ssize_t w;
  do {
    w = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    add(calls, 1);
  } while (w < 0 && errno == EINTR);
  return w;
}

}  // namespace weft::tcp::detail
