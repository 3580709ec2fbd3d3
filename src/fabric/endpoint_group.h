// The endpoints of one device, one per rail, with their comm table: the unit that comms will share (shared
// endpoints, step 2). Completions of every rail are read by the rail's endpoint and routed through the table
// (fabric/comm_table.h) to the comm they name.
//
// For now each connection opens its own group (the handshake runs on rail 0's endpoint, which the handle names),
// so a group serves one comm; the routing is already the shared one.
#pragma once

#include <memory>
#include <vector>

#include "fabric/comm_table.h"
#include "fabric/fabric_endpoint.h"

namespace weft::fabric {

class EndpointGroup {
 public:
  // One endpoint on each of `rails` (the device's NICs). Further rails' addresses must fit the handshake.
  static Status open(const std::vector<FabricDevice*>& rails, std::shared_ptr<EndpointGroup>* out);
  ~EndpointGroup();
  EndpointGroup(const EndpointGroup&) = delete;
  EndpointGroup& operator=(const EndpointGroup&) = delete;

  int rails() const { return static_cast<int>(eps_.size()); }
  Endpoint& rail(int k) const { return *eps_[static_cast<size_t>(k)]; }
  // Closes the endpoints of rails n and up (a peer with fewer rails).
  void keepRails(int n);
  CommTable& table() { return table_; }
  // This side's further rail addresses, for the handshake.
  RailAddrs railAddrs() const;

 private:
  explicit EndpointGroup(std::string where) : table_(std::move(where)) {}
  // The table outlives the endpoints (declared first, destroyed last): closing an endpoint may still deliver.
  CommTable table_;
  std::vector<std::unique_ptr<Endpoint>> eps_;
};

}  // namespace weft::fabric
