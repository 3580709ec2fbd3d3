// SPDX-License-Identifier: Apache-2.0
#include "fabric/comm_table.h"

#include <algorithm>

#include "fabric/wire.h"
#include "weft/common/log.h"

namespace weft::fabric {

Status CommTable::attach(uint32_t id, DataSink* sink, bool legacy32) {
  if (id == 0 || id > wire::kMaxCommId || sink == nullptr) {
    WEFT_WARN("on {}: comm id {} cannot join an endpoint group (ids are 1 to {})", where_, id, wire::kMaxCommId);
    return Status::kInternal;
  }
  if (comms_.count(id) != 0) {
    WEFT_WARN("on {}: comm id {} is already in use on this endpoint group", where_, id);
    return Status::kInternal;
  }
  if (legacy_ != 0 || (legacy32 && !comms_.empty())) {
    WEFT_WARN("on {}: a comm whose remote writes carry no comm id (4-byte completion data with the length, "
              "provider reports no write length) cannot share its endpoints with another comm",
              where_);
    return Status::kInternal;
  }
  comms_.emplace(id, sink);
  if (legacy32) legacy_ = id;
  return Status::kOk;
}

void CommTable::runDeferred() {
  // A comm's afterBatch posts sends and reads no completion: nothing joins the list meanwhile.
  for (size_t i = 0; i < deferred_.size(); ++i) deferred_[i]->afterBatch();
  deferred_.clear();
}

void CommTable::detach(uint32_t id, Clock::time_point now) {
  auto found = comms_.find(id);
  if (found == comms_.end()) return;
  std::erase(deferred_, found->second);
  comms_.erase(found);
  if (closed_.size() >= pruneAt_) {  // amortized: the next prune waits until the record has doubled
    for (auto it = closed_.begin(); it != closed_.end();) {
      it = now - it->second > closedHold_ ? closed_.erase(it) : std::next(it);
    }
    pruneAt_ = std::max<size_t>(64, 2 * closed_.size());
  }
  closed_[id] = now;
  if (legacy_ == id) legacy_ = 0;
  if (lastId_ == id) {
    lastId_ = 0;
    last_ = nullptr;
  }
}

DataSink* CommTable::find(uint32_t id) const {
  auto it = comms_.find(id);
  return it == comms_.end() ? nullptr : it->second;
}

uint32_t CommTable::remoteDataComm(uint64_t d) const {
  if ((d >> 32) != 0) return wire::WriteImm::comm(d);
  if (legacy_ != 0) return legacy_;
  return wire::WriteImmId::comm(d);
}

DataSink* CommTable::lookup(uint32_t id, const char* what) {
  auto it = comms_.find(id);
  if (it != comms_.end()) {
    lastId_ = id;
    last_ = it->second;
    return last_;
  }
  if (auto c = closed_.find(id); c != closed_.end() && Clock::now() - c->second <= closedHold_) {
    if (lateStrays_++ == 0) {
      WEFT_INFO(NCCL_NET, "on {}: {} names comm {}, closed moments ago: dropped (traffic the peer sent before it "
                "learned of the close; said once per endpoint group)", where_, what, id);
    }
    return nullptr;
  }
  if (strays_++ % 1024 == 0) {
    WEFT_WARN("on {}: {} names comm {}, which this endpoint group does not serve (closed, or never opened here): "
              "dropped ({} so far)",
              where_, what, id, strays_);
  }
  return nullptr;
}

}  // namespace weft::fabric
