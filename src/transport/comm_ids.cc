// SPDX-License-Identifier: Apache-2.0
#include "weft/transport/comm_ids.h"

#include <iterator>

namespace weft {

uint32_t CommIds::acquire(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (live_.size() >= maxId_) return 0;
  for (uint32_t n = 0; n < maxId_; ++n) {
    uint32_t id = cursor_ % maxId_ + 1;  // 1..maxId_, after the last one given
    cursor_ = id;
    if (live_.count(id) != 0) continue;
    auto q = quarantine_.find(id);
    if (q != quarantine_.end()) {
      if (now < q->second) continue;
      quarantine_.erase(q);
    }
    live_.insert(id);
    return id;
  }
  return 0;
}

void CommIds::release(uint32_t id, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (live_.erase(id) == 0) return;
  quarantine_[id] = now + hold_;
  // Expired entries go when acquire meets them, and in a sweep here whenever the table reaches a multiple of 64
  // entries, so it stays near the ids released within `hold` (plus at most 63).
  if (quarantine_.size() > 64 && quarantine_.size() % 64 == 0) {
    for (auto it = quarantine_.begin(); it != quarantine_.end();) {
      it = now >= it->second ? quarantine_.erase(it) : std::next(it);
    }
  }
}

size_t CommIds::live() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_.size();
}

size_t CommIds::quarantined() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return quarantine_.size();
}

}  // namespace weft
