// The endpoints of one device, one per rail, with their comm table: the unit that comms will share (shared
// endpoints, step 2). Completions of every rail are read by the rail's endpoint and routed through the table
// (fabric/comm_table.h) to the comm they name.
//
// By default each connection opens its own group (private: one comm, no lock). With WEFT_FABRIC_SHARED_EP=1 the
// comms of one NCCL context on one device share a group (step 2 of shared endpoints): listens, connects and the
// data path of every comm take the group's lock (its completions may be read by any of them), and a comm closed
// with operations still in the provider's hands is parked in the group until they complete.
// The lock breaks DESIGN rule 4 (the data path takes no lock) and is step 2's stopgap: step 3 makes one thread the
// only reader of a shared CQ (NCCL drives a context's comms from its one progress thread; the handshake moves to
// what the service thread may poll alone) before sharing becomes the default.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "fabric/comm_table.h"
#include "fabric/fabric_endpoint.h"

namespace weft::fabric {

class EndpointGroup {
 public:
  // One endpoint on each of `rails` (the device's NICs). Further rails' addresses must fit the handshake.
  static Status open(const std::vector<FabricDevice*>& rails, std::shared_ptr<EndpointGroup>* out,
                     bool shared = false);
  ~EndpointGroup();
  EndpointGroup(const EndpointGroup&) = delete;
  EndpointGroup& operator=(const EndpointGroup&) = delete;

  int rails() const { return static_cast<int>(eps_.size()); }
  Endpoint& rail(int k) const { return *eps_[static_cast<size_t>(k)]; }
  // Closes the endpoints of rails n and up (a peer with fewer rails); a shared group keeps them for others.
  void keepRails(int n);
  bool shared() const { return shared_; }
  std::mutex& mutex() { return mu_; }
  // The group's lock where it is shared (an empty lock for a private group): every listen, connect, accept and
  // data-path call on a shared group holds it.
  std::unique_lock<std::mutex> lockIfShared() {
    return shared_ ? std::unique_lock<std::mutex>(mu_) : std::unique_lock<std::mutex>();
  }

  // A closed comm whose operations are still in the provider's hands: kept (and still routed to) until
  // `drained` says they are over (sweep), or until the group closes its endpoints. Caller holds the lock.
  void park(DataSink* comm, bool (*drained)(DataSink*));
  void sweep();
  size_t parked() const { return parked_.size(); }
  CommTable& table() { return table_; }
  // This side's further rail addresses, for the handshake.
  RailAddrs railAddrs() const;

 private:
  explicit EndpointGroup(std::string where, bool shared) : table_(std::move(where)), shared_(shared) {}
  // The table outlives the endpoints and parked comms (declared first, destroyed last).
  CommTable table_;
  bool shared_;
  std::mutex mu_;
  struct Parked {
    std::unique_ptr<DataSink> comm;
    bool (*drained)(DataSink*);
  };
  std::vector<Parked> parked_;
  std::vector<std::unique_ptr<Endpoint>> eps_;
};

}  // namespace weft::fabric
