// SPDX-License-Identifier: Apache-2.0
// Ids for comms (and the listens that become them), chosen by one end and carried in every message to that end
// (the libfabric wire format: src/fabric/wire.h). An id is live from acquire() until release(); after release it
// is quarantined for `hold`, so that traffic still in flight for a closed comm can never reach a newer comm that
// was given the same id. Ids advance cyclically (each acquire starts after the last id given), so a released id
// comes back only after every other free id has been used once.
// Set-up path only (listen, connect, accept, close): one mutex, no use on the data path.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace weft {

class CommIds {
 public:
  using Clock = std::chrono::steady_clock;
  // Ids 1..maxId (0 means "none").
  CommIds(uint32_t maxId, std::chrono::milliseconds hold) : maxId_(maxId), hold_(hold) {}

  // A free id, or 0 when every id is live or still quarantined.
  uint32_t acquire(Clock::time_point now = Clock::now());
  // Ends a live id's life: quarantined until now + hold. Unknown or already released ids are ignored.
  void release(uint32_t id, Clock::time_point now = Clock::now());
  size_t live() const;
  size_t quarantined() const;
  uint32_t maxId() const { return maxId_; }

 private:
  const uint32_t maxId_;
  const std::chrono::milliseconds hold_;
  mutable std::mutex mutex_;  // guards everything below
  uint32_t cursor_ = 0;       // the last id given out
  std::unordered_set<uint32_t> live_;
  std::unordered_map<uint32_t, Clock::time_point> quarantine_;  // id -> free again from
};

// An id owned by one object: released (into quarantine) when it is destroyed, unless handed on.
class CommId {
 public:
  CommId() = default;
  CommId(CommIds* ids, uint32_t id) : ids_(ids), id_(id) {}
  CommId(CommId&& o) noexcept : ids_(o.ids_), id_(o.id_) { o.id_ = 0; }
  CommId& operator=(CommId&& o) noexcept {
    if (this != &o) {
      reset();
      ids_ = o.ids_;
      id_ = o.id_;
      o.id_ = 0;
    }
    return *this;
  }
  CommId(const CommId&) = delete;
  CommId& operator=(const CommId&) = delete;
  ~CommId() { reset(); }
  uint32_t get() const { return id_; }
  explicit operator bool() const { return id_ != 0; }
  void reset() {
    if (id_ != 0 && ids_ != nullptr) ids_->release(id_);
    id_ = 0;
  }
  // The id is never given out again (it stays taken): traffic for it may wait, unmatched, where no quarantine
  // ends it (a message on a rail its comm failed over, fabric/fabric_comm.h).
  void retire() { id_ = 0; }

 private:
  CommIds* ids_ = nullptr;
  uint32_t id_ = 0;
};

}  // namespace weft
