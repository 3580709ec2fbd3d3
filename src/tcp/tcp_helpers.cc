// SPDX-License-Identifier: Apache-2.0
// Helper threads of the native TCP backend: the threads and what they do with a flow (tcp_helpers.h).
#include "tcp/tcp_helpers.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <system_error>

#include "weft/common/log.h"
#include "weft/common/numa.h"
#include "weft/common/params.h"
#include "tcp/tcp_util.h"

namespace weft::tcp {

namespace {

using detail::add;
using detail::wouldBlock;

// One sendmsg of what the ring holds, in order: true when bytes moved.
bool stepSend(FlowTask& t) {
  const uint32_t posted = t.posted.load(std::memory_order_acquire);
  uint32_t done = t.done.load(std::memory_order_relaxed);
  t.blocked = false;
  if (done == posted || t.err.load(std::memory_order_relaxed) != 0) return false;
  constexpr int kIov = 32;
  iovec iov[kIov];
  int n = 0;
  uint64_t off = t.cursor;
  for (uint32_t i = done; i != posted && n + 2 <= kIov; ++i) {
    const Item* it = t.ring[i % FlowTask::kRing];
    if (off < sizeof(it->hdr)) iov[n++] = {const_cast<uint8_t*>(it->hdr) + off, sizeof(it->hdr) - off};
    const uint64_t p = off > sizeof(it->hdr) ? off - sizeof(it->hdr) : 0;
    if (it->len > p) iov[n++] = {const_cast<uint8_t*>(it->src) + p, static_cast<size_t>(it->len - p)};
    off = 0;
  }
  const ssize_t w = detail::sendIov(t.fd, iov, n, counters().sendCalls);
  if (w < 0) {
    if (wouldBlock(errno)) {
      t.blocked = true;
    } else {
      t.err.store(errno, std::memory_order_release);
    }
    return false;
  }
  add(counters().bytesSent, w);
  add(counters().helperBytes, w);
  uint64_t left = static_cast<uint64_t>(w);
  while (done != posted && left > 0) {
    const Item* it = t.ring[done % FlowTask::kRing];
    const uint64_t take = std::min(left, it->total() - t.cursor);
    t.cursor += take;
    left -= take;
    if (t.cursor < it->total()) break;
    t.cursor = 0;
    ++done;
  }
  t.written.fetch_add(static_cast<uint64_t>(w), std::memory_order_release);
  t.done.store(done, std::memory_order_release);
  return true;
}

// One recv of the header or the body in hand: true when bytes moved or the state changed.
bool stepRecv(FlowTask& t) {
  t.blocked = false;
  const uint32_t s = t.state.load(std::memory_order_acquire);
  if (s != FlowTask::kHeader && s != FlowTask::kBody) return false;
  uint8_t* p;
  size_t want;
  if (s == FlowTask::kHeader) {
    p = reinterpret_cast<uint8_t*>(&t.hdr) + t.hdrGot;
    want = sizeof(PieceHeader) - t.hdrGot;
  } else {
    const uint64_t got = t.got.load(std::memory_order_relaxed);
    p = t.dst + got;
    want = static_cast<size_t>(t.len - got);
  }
  ssize_t got;
  do {
    got = ::recv(t.fd, p, want, MSG_DONTWAIT);
    add(counters().recvCalls, 1);
  } while (got < 0 && errno == EINTR);
  if (got > 0) {
    add(counters().bytesReceived, got);
    add(counters().helperBytes, got);
    if (s == FlowTask::kHeader) {
      t.hdrGot += static_cast<size_t>(got);
      if (t.hdrGot == sizeof(PieceHeader)) {
        t.hdrGot = 0;
        t.state.store(FlowTask::kHeaderReady, std::memory_order_release);
      }
    } else {
      const uint64_t now = t.got.load(std::memory_order_relaxed) + static_cast<uint64_t>(got);
      t.got.store(now, std::memory_order_relaxed);
      if (now == t.len) t.state.store(FlowTask::kBodyDone, std::memory_order_release);
    }
    return true;
  }
  if (got < 0 && wouldBlock(errno)) {
    t.blocked = true;
    return false;
  }
  // The end of the stream (or a reset: a sender closing while this flow was still joining resets it) between
  // pieces ends the flow; inside a piece it is the peer's failure.
  const bool between = s == FlowTask::kHeader && t.hdrGot == 0;
  if (got == 0 || errno == ECONNRESET) {
    if (between) {
      t.state.store(FlowTask::kEnded, std::memory_order_release);
      return true;
    }
    t.err.store(got == 0 ? FlowTask::kClosedMidPiece : errno, std::memory_order_relaxed);
  } else {
    t.err.store(errno, std::memory_order_relaxed);
  }
  t.state.store(FlowTask::kFailed, std::memory_order_release);
  return true;
}

}  // namespace

class Helper {
 public:
  Helper(int node, std::string name) : node_(node), name_(std::move(name)) {
    wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakeFd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
    try {
      thread_ = std::thread([this] { run(); });
    } catch (...) {
      ::close(wakeFd_);
      throw;
    }
  }
  ~Helper() {
    stop_.store(true, std::memory_order_seq_cst);
    wake();
    if (thread_.joinable()) thread_.join();
    ::close(wakeFd_);
  }
  size_t load() {
    std::lock_guard<std::mutex> lock(mu_);
    return tasks_.size();
  }
  void attach(FlowTask* t) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(t);
    t->helper = this;
    wake();
  }
  void detach(FlowTask* t) {
    wake();  // out of poll, so that the pass it is in ends soon
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.erase(std::remove(tasks_.begin(), tasks_.end(), t), tasks_.end());
    t->helper = nullptr;
  }
  void kick() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst)) wake();
  }

 private:
  void wake() {
    const uint64_t one = 1;
    ssize_t rc;
    do {
      rc = ::write(wakeFd_, &one, sizeof(one));
    } while (rc < 0 && errno == EINTR);
  }
  // Moves every task once, or while bytes move (bounded, so that attach and detach get the lock): true when any
  // moved. Fills `pfds` with the sockets the tasks wait on.
  bool pass(std::vector<pollfd>& pfds) {
    std::lock_guard<std::mutex> lock(mu_);
    bool any = false;
    pfds.clear();
    for (FlowTask* t : tasks_) {
      for (int i = 0; i < 16; ++i) {
        if (!(t->send ? stepSend(*t) : stepRecv(*t))) break;
        any = true;
      }
      if (t->blocked) pfds.push_back({t->fd, static_cast<short>(t->send ? POLLOUT : POLLIN), 0});
    }
    return any;
  }
  void run() {
    add(counters().helperThreads, 1);
    std::string what;
    const bool bound = numa::bindThisThreadNear(node_, &what);
    WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft {}: a TCP helper thread {}{}", name_, bound ? "runs on " : "stays "
              "where it is: ", what);
    std::vector<pollfd> pfds;
    while (!stop_.load(std::memory_order_relaxed)) {
      if (pass(pfds)) continue;
      // Nothing moved: say so, then look once more (a comm that posted before it saw us asleep is seen here; one
      // that posts after sees us asleep and wakes us), then sleep until a socket or a comm wakes us.
      sleeping_.store(true, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with kick()'s: one of the two sees the other
      if (pass(pfds)) {
        sleeping_.store(false, std::memory_order_relaxed);
        continue;
      }
      pfds.push_back({wakeFd_, POLLIN, 0});
      // Bounded, whatever happens: a helper never sleeps for ever on something it missed.
      (void)::poll(pfds.data(), pfds.size(), pfds.size() > 1 ? 100 : 1000);
      sleeping_.store(false, std::memory_order_relaxed);
      uint64_t drained;
      while (::read(wakeFd_, &drained, sizeof(drained)) > 0) {
      }
    }
    add(counters().helperThreads, -1);
  }

  const int node_;
  const std::string name_;
  int wakeFd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  std::mutex mu_;  // guards tasks_; the helper holds it for a pass (never in poll)
  std::vector<FlowTask*> tasks_;
  std::thread thread_;  // last: started once the rest is there
};

HelperPool::HelperPool(int threads, int numaNode, std::string device)
    : max_(threads), node_(numaNode), device_(std::move(device)) {}

HelperPool::~HelperPool() = default;

bool HelperPool::attach(FlowTask* t) {
  Helper* h = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = SIZE_MAX;
    for (auto& c : helpers_) {
      const size_t l = c->load();
      if (l < best) best = l, h = c.get();
    }
    if ((h == nullptr || best > 0) && static_cast<int>(helpers_.size()) < max_) {
      try {
        helpers_.push_back(std::make_unique<Helper>(node_, device_));
        h = helpers_.back().get();
      } catch (const std::exception& e) {
        WEFT_WARN("NET/weft {}: a TCP helper thread could not start ({}); {}", device_, e.what(),
                  h != nullptr ? "the flows share the helpers there are" : "the flows move on NCCL's thread");
      }
    }
  }
  if (h == nullptr) return false;
  h->attach(t);
  return true;
}

void HelperPool::detach(FlowTask* t) {
  if (t->helper != nullptr) t->helper->detach(t);
}

void kick(FlowTask* t) {
  if (t->helper != nullptr) t->helper->kick();
}

int helperThreadsFromParams() { return static_cast<int>(params::getInt("WEFT_TCP_THREADS")); }

}  // namespace weft::tcp
