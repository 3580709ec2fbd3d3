// SPDX-License-Identifier: Apache-2.0
// Connect attempts in progress, for a backend's non-blocking connect(): NCCL polls connect() with the same handle
// buffer until a comm comes back, so attempts are keyed by that buffer (and its bytes: a buffer reused for another
// connection abandons the old attempt). An attempt older than the connect timeout is answered as timed out; attempts
// nobody polled for twice the timeout (a communicator aborted mid-connect) are freed when a new one starts.
#pragma once

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "weft/common/log.h"
#include "weft/transport/net.h"

namespace weft {

// Attempt must have: uint8_t handleBytes[kHandleSize]; std::chrono::steady_clock::time_point started;
// std::string peerName.
template <typename Attempt>
class PendingConnects {
 public:
  enum class Lookup { kNone, kFound, kTimedOut };

  void setTimeout(int seconds) { timeoutSec_ = seconds; }

  // The attempt polled with this handle buffer. kTimedOut: it outlived the timeout; it is dropped with a warning
  // naming the peer, `device` and the likely `causes` (answered here, under the lock, so an entry old enough to be
  // purged is never in use).
  Lookup find(const void* handle, Attempt** out, const std::string& device, const char* causes) {
    std::lock_guard<std::mutex> lock(mutex_);
    *out = nullptr;
    auto it = map_.find(handle);
    if (it == map_.end()) return Lookup::kNone;
    if (std::memcmp(it->second->handleBytes, handle, kHandleSize) != 0) {
      map_.erase(it);
      return Lookup::kNone;
    }
    if (timeoutSec_ > 0 && std::chrono::steady_clock::now() - it->second->started > std::chrono::seconds(timeoutSec_)) {
      WEFT_WARN("connect to {} on {} timed out after {} s without an answer: likely {}, or the peer process is "
                "gone (WEFT_CONNECT_TIMEOUT sets the limit)",
                it->second->peerName, device, timeoutSec_, causes);
      map_.erase(it);
      return Lookup::kTimedOut;
    }
    *out = it->second.get();
    return Lookup::kFound;
  }

  // A new attempt for this handle buffer (its handleBytes and started already set).
  Attempt* add(const void* handle, std::unique_ptr<Attempt> a) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (timeoutSec_ > 0) {
      auto stale = a->started - std::chrono::seconds(2 * timeoutSec_);
      std::erase_if(map_, [&](const auto& kv) { return kv.second->started < stale; });
    }
    Attempt* p = a.get();
    map_[handle] = std::move(a);
    return p;
  }

  // The frame of a backend's non-blocking connect: checks the device, answers an attempt that outlived the timeout
  // (the warning names `causes`), starts a new attempt for a new handle with start(Attempt&) (it decodes the handle
  // and begins; its handleBytes and started are set), and polls it with poll(Attempt&, SendComm**) until a comm
  // comes back or it fails; either ends the attempt.
  template <typename Start, typename Poll>
  Status connect(const Backend& backend, int dev, void* handle, const char* causes, SendComm** out, Start&& start,
                 Poll&& poll) {
    *out = nullptr;
    if (!backend.validDevice(dev, "connect")) return Status::kInternal;
    Attempt* a = nullptr;
    if (find(handle, &a, backend.props(dev).name, causes) == Lookup::kTimedOut) return Status::kRemote;
    if (a == nullptr) {
      auto fresh = std::make_unique<Attempt>();
      std::memcpy(fresh->handleBytes, handle, kHandleSize);
      fresh->started = std::chrono::steady_clock::now();
      if (Status st = start(*fresh); st != Status::kOk) return st;
      a = add(handle, std::move(fresh));
    }
    Status st = poll(*a, out);
    if (st != Status::kOk || *out != nullptr) erase(handle);
    return st;
  }

  void erase(const void* handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    map_.erase(handle);
  }

 private:
  int timeoutSec_ = 0;
  std::mutex mutex_;  // guards map_ (the attempts themselves are polled by their own caller only)
  std::map<const void*, std::unique_ptr<Attempt>> map_;
};

}  // namespace weft
