// SPDX-License-Identifier: Apache-2.0
#include "fabric/endpoint_group.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "weft/common/clock.h"
#include "weft/common/log.h"

namespace weft::fabric {

Status EndpointGroup::open(const std::vector<FabricDevice*>& rails, std::shared_ptr<EndpointGroup>* out,
                           bool shared) {
  out->reset();
  if (rails.empty()) return Status::kInternal;
  std::shared_ptr<EndpointGroup> g(new EndpointGroup(rails[0]->props().name, shared));
  for (size_t k = 0; k < rails.size(); ++k) {
    std::unique_ptr<Endpoint> ep;
    if (Status st = Endpoint::open(*rails[k], &ep, shared); st != Status::kOk) return st;
    if (k > 0 && ep->name().size() > RailAddrs::kMaxAddr) {
      WEFT_WARN("provider address of {} bytes on {} does not fit the rail handshake ({} B)", ep->name().size(),
                ep->device().props().name, RailAddrs::kMaxAddr);
      return Status::kInternal;
    }
    ep->setTable(&g->table_);
    g->eps_.push_back(std::move(ep));
  }
  *out = std::move(g);
  return Status::kOk;
}

// Endpoints close first (cancelling what is in flight), while the table they route to still exists; parked
// comms go after, their operations gone with the endpoints.
EndpointGroup::~EndpointGroup() {
  if (shared_) drain();
  eps_.clear();
  parked_.clear();
}

// Before a shared group's endpoints close, what peers sent them (buffer offers for sends that went eagerly,
// probes) is read: over TCP a socket closed with unread input sends a reset, and the peer then loses data this
// side sent it that it has not read yet (seen as a receive failing after its sender closed, 1 run in 10 of
// comms.scale with the rdma protocol). Bounded: until the queues have been quiet for 10 ms, at most 200 ms; and
// while a parked comm holds the group (writes it offered still on their way, FabricDataComm::awaitingWrites), until
// it is drained or its hold runs out.
void EndpointGroup::drain() {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto quietSince = start;
  bool wasHeld = false;
  for (;;) {
    if (!parked_.empty()) {
      const size_t before = parked_.size();
      sweep();
      if (parked_.size() != before) quietSince = Clock::now();  // what a comm said as it left (a note) goes out first
    }
    const int64_t nowMs = coarseNowMs();
    bool held = false;
    for (const Parked& p : parked_) held = held || p.holdUntilMs > nowMs;
    const auto now = Clock::now();
    if (!held &&
        (now - quietSince >= std::chrono::milliseconds(10) || now - start >= std::chrono::milliseconds(200))) {
      if (wasHeld) {
        WEFT_INFO(NCCL_NET, "{}: endpoints close after {} ms waiting for writes offered by closed comms ({} comms "
                  "still parked)", eps_.empty() ? std::string("a group") : eps_[0]->device().props().name,
                  std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count(), parked_.size());
      }
      break;
    }
    wasHeld = wasHeld || held;
    bool any = false;
    for (auto& ep : eps_) {
      int n = 0;
      if (ep->progress(&n) != Status::kOk) return;  // the queue itself failed: nothing more to read
      any = any || n > 0;
    }
    if (any) {
      quietSince = Clock::now();
    } else if (held) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));  // a write on its way: no need to spin
    }
  }
}

void EndpointGroup::keepRails(int n) {
  if (!shared_ && n >= 1 && n < rails()) eps_.resize(static_cast<size_t>(n));
}

void EndpointGroup::park(DataSink* comm, bool (*drained)(DataSink*), int64_t holdUntilMs) {
  parked_.push_back(Parked{std::unique_ptr<DataSink>(comm), drained, holdUntilMs});
}

void EndpointGroup::sweep() {
  for (size_t i = 0; i < parked_.size();) {
    if (!parked_[i].drained(parked_[i].comm.get())) {
      ++i;
      continue;
    }
    std::unique_ptr<DataSink> done = std::move(parked_[i].comm);
    parked_[i] = std::move(parked_.back());
    parked_.pop_back();
    done.reset();  // leaves the table
  }
}

RailAddrs EndpointGroup::railAddrs() const {
  RailAddrs a;
  a.count = static_cast<uint8_t>(eps_.size());
  for (size_t k = 1; k < eps_.size(); ++k) {
    const auto& name = eps_[k]->name();  // length checked when the endpoints were opened
    a.len[k] = static_cast<uint8_t>(name.size());
    std::memcpy(a.addr[k], name.data(), name.size());
  }
  return a;
}

}  // namespace weft::fabric
