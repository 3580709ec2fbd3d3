// SPDX-License-Identifier: Apache-2.0
// The objects a plugin table handed to NCCL by the calls that are off the data path (listen, connect, accept,
// register, create), so that close, deregister and destroy can refuse an object that is closed already or was never
// ours without touching freed memory. The data path checks an object's magic word only: it runs for every operation.
#pragma once

#include <mutex>
#include <unordered_set>

namespace weft {

class LiveObjects {
 public:
  void add(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(p);
  }
  bool contains(const void* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(p) != 0;
  }
  bool remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.erase(p) != 0;
  }

 private:
  mutable std::mutex mu_;  // guards live_
  std::unordered_set<const void*> live_;
};

}  // namespace weft
