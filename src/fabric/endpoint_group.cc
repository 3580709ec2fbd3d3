#include "fabric/endpoint_group.h"

#include <cstring>

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
  eps_.clear();
  parked_.clear();
}

void EndpointGroup::keepRails(int n) {
  if (!shared_ && n >= 1 && n < rails()) eps_.resize(static_cast<size_t>(n));
}

void EndpointGroup::park(DataSink* comm, bool (*drained)(DataSink*)) {
  parked_.push_back(Parked{std::unique_ptr<DataSink>(comm), drained});
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
