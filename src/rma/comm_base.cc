// SPDX-License-Identifier: Apache-2.0
// What every transport's RMA comm has in common (rma/comm_base.h).
#include "rma/comm_base.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "weft/common/cuda_shim.h"
#include "weft/common/log.h"
#include "weft/common/params.h"

namespace weft::rma {

CommBase::~CommBase() {
  for (auto* w : windows_) delete w;
  for (auto* c : contexts_) delete c;
}

bool CommBase::hasError(std::string* why) const {
  if (!hasError_.load(std::memory_order_acquire)) return false;
  if (why != nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    *why = firstError_;
  }
  return true;
}

void CommBase::fail(const std::string& why, Status st) {
  if (hasError_.load(std::memory_order_relaxed)) return;
  firstError_ = why;
  firstErrorStatus_ = st;
  hasError_.store(true, std::memory_order_release);
  WEFT_WARN("RMA (rank {} of {}): {}", rank_, nranks_, why);
}

Status CommBase::createContext(int nContexts, std::vector<int> peers, Context** out) {
  if (out == nullptr || nContexts < 1 || nContexts > 65535) {
    WEFT_WARN("RMA createContext: {} contexts asked (1 to 65535)", nContexts);
    return Status::kInternal;
  }
  for (int p : peers) {
    if (p < 0 || p >= nranks_) {
      WEFT_WARN("RMA createContext: peer {} outside the communicator's {} ranks", p, nranks_);
      return Status::kInternal;
    }
  }
  auto c = std::make_unique<Context>();
  c->comm = this;
  c->nContexts = nContexts;
  c->peers = std::move(peers);
  std::lock_guard<std::mutex> lock(mu_);
  contexts_.push_back(c.get());
  *out = c.release();
  return Status::kOk;
}

bool CommBase::lockForLedger(std::unique_lock<std::mutex>* lock) {
  *lock = std::unique_lock<std::mutex>(mu_, std::defer_lock);
  ledgerWants_.fetch_add(1, std::memory_order_relaxed);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (!lock->try_lock() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  ledgerWants_.fetch_sub(1, std::memory_order_relaxed);
  return lock->owns_lock();
}

Status CommBase::progress() {
  if (ledgerWaiting()) return Status::kOk;  // a dump reads the ledger: NCCL calls again
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return Status::kOk;
  pumpAll();
  return Status::kOk;
}

// ---- checks -----------------------------------------------------------------------------------------------------------

Status CommBase::checkContext(Context* ctx, int context, uint32_t rank, const char* what) const {
  if (ctx == nullptr || ctx->magic_ != kContextMagic || ctx->comm != this) {
    WEFT_WARN("RMA {}: {} is not a live context of this comm", what, static_cast<void*>(ctx));
    return Status::kInternal;
  }
  if (context < 0 || context >= ctx->nContexts) {
    WEFT_WARN("RMA {}: context {} outside the block's {}", what, context, ctx->nContexts);
    return Status::kInternal;
  }
  if (rank >= static_cast<uint32_t>(nranks_)) {
    WEFT_WARN("RMA {}: rank {} outside the communicator's {}", what, rank, nranks_);
    return Status::kInvalidUsage;
  }
  return Status::kOk;
}

Status CommBase::checkWindow(const Window* w, const char* what) const {
  if (w == nullptr || w->magic_ != kWindowMagic || w->owner != this) {
    WEFT_WARN("RMA: {} {} is not a live window of this comm (deregistered, or not weft's)", what,
              static_cast<const void*>(w));
    return Status::kInvalidUsage;
  }
  return Status::kOk;
}

Status CommBase::checkPut(Context* ctx, int context, const Window* src, uint64_t srcOff, size_t size,
                          const Window* dst, uint64_t dstOff, uint32_t rank, const Signal* signal) const {
  if (Status st = checkContext(ctx, context, rank, signal ? "iputSignal" : "iput"); st != Status::kOk) return st;
  if (size > 0) {
    if (Status st = checkWindow(src, "source"); st != Status::kOk) return st;
    if (Status st = checkWindow(dst, "destination"); st != Status::kOk) return st;
    if (!inRange(src->size, srcOff, size) || !inRange(dst->peerSize[rank], dstOff, size)) {
      WEFT_WARN("RMA iput: {} bytes from offset {} of window {} ({} bytes) to offset {} of rank {}'s part ({} bytes): "
                "outside the windows",
                size, srcOff, src->id, src->size, dstOff, rank, dst->peerSize[rank]);
      return Status::kInvalidUsage;
    }
  }
  if (signal != nullptr) {
    if (Status st = checkWindow(signal->window, "signal"); st != Status::kOk) return st;
    if (!isSignalOp(static_cast<uint8_t>(signal->op))) {
      WEFT_WARN("RMA iputSignal: signal operation {} is neither INC nor ADD", static_cast<int>(signal->op));
      return Status::kInvalidUsage;
    }
    if (!isSignalSlot(signal->window->peerSize[rank], signal->off)) {
      WEFT_WARN("RMA iputSignal: signal at offset {} of window {} (rank {}'s part: {} bytes): not an aligned 8-byte "
                "slot inside it",
                signal->off, signal->window->id, rank, signal->window->peerSize[rank]);
      return Status::kInvalidUsage;
    }
  }
  return Status::kOk;
}

Status CommBase::checkGet(Context* ctx, int context, const Window* remote, uint64_t remoteOff, size_t size,
                          const Window* local, uint64_t localOff, uint32_t rank) const {
  if (Status st = checkContext(ctx, context, rank, "iget"); st != Status::kOk) return st;
  if (Status st = checkWindow(remote, "remote"); st != Status::kOk) return st;
  if (Status st = checkWindow(local, "local"); st != Status::kOk) return st;
  if (!inRange(remote->peerSize[rank], remoteOff, size) || !inRange(local->size, localOff, size)) {
    WEFT_WARN("RMA iget: {} bytes from offset {} of rank {}'s part of window {} ({} bytes) to offset {} of window {} "
              "({} bytes): outside the windows",
              size, remoteOff, rank, remote->id, remote->peerSize[rank], localOff, local->id, local->size);
    return Status::kInvalidUsage;
  }
  return Status::kOk;
}

// ---- windows and contexts --------------------------------------------------------------------------------------------

Status CommBase::newWindow(void* data, size_t size, int type, uint64_t flags, std::unique_ptr<Window>* out) const {
  if (out == nullptr || (data == nullptr && size > 0) || (type != kPtrHost && type != kPtrCuda)) {
    WEFT_WARN("RMA regMrSym: {} bytes at {} of type {}: not host or CUDA memory weft can register", size, data, type);
    return Status::kInvalidUsage;
  }
  if (type == kPtrCuda) {
    const char* why = nullptr;
    if (cuda::deviceOfPointer(data, &why) < 0) {
      WEFT_WARN("RMA regMrSym: {} is said to be GPU memory, but {}", data, why);
      return Status::kInvalidUsage;
    }
  }
  if ((flags & kFlagSignalNeverReset) && size % 8 != 0) {
    WEFT_WARN("RMA regMrSym: a signal region of {} bytes (SIGNAL_NEVER_RESET) is not a whole number of signals", size);
    return Status::kInvalidUsage;
  }
  auto w = std::make_unique<Window>();
  w->base = static_cast<char*>(data);
  w->size = size;
  w->cuda = type == kPtrCuda;
  w->flags = flags;
  w->owner = this;
  w->peerSize.assign(static_cast<size_t>(nranks_), UINT64_MAX);
  w->peerSize[static_cast<size_t>(rank_)] = size;
  if (w->cuda && (flags & kFlagSignalNeverReset)) w->shadow.assign(size / 8, 0);
  *out = std::move(w);
  return Status::kOk;
}

void CommBase::addWindow(Window* w) {
  w->id = nextWindow_++;
  windows_.push_back(w);
}

void CommBase::dropWindow(Window* w) {
  if (w->id >= 1 && w->id <= windows_.size() && windows_[w->id - 1] == w) windows_[w->id - 1] = nullptr;
  w->magic_ = 0;
  delete w;
}

Window* CommBase::windowById(uint32_t id) const {
  if (id == 0 || id > windows_.size()) return nullptr;
  return windows_[id - 1];
}

bool CommBase::hasWindow(const Window* w) const {
  return w != nullptr && std::find(windows_.begin(), windows_.end(), w) != windows_.end();
}

bool CommBase::hasContext(const Context* c) const {
  return c != nullptr && std::find(contexts_.begin(), contexts_.end(), c) != contexts_.end();
}

void CommBase::forgetContext(Context* c) {
  contexts_.erase(std::find(contexts_.begin(), contexts_.end(), c));
  c->magic_ = 0;
  delete c;
}

// ---- set-up waits -----------------------------------------------------------------------------------------------------

Status CommBase::waitFor(const char* what, const std::function<bool()>& ready) {
  const int64_t timeoutSec = params::getInt("WEFT_CONNECT_TIMEOUT");
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pumpAll();
      if (ready()) return Status::kOk;
    }
    if (timeoutSec > 0 && std::chrono::steady_clock::now() - start > std::chrono::seconds(timeoutSec)) {
      WEFT_WARN("RMA (rank {} of {}): {} did not complete within WEFT_CONNECT_TIMEOUT={} s", rank_, nranks_, what,
                timeoutSec);
      return Status::kRemote;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace weft::rma
