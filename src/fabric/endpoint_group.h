// SPDX-License-Identifier: Apache-2.0
// The endpoints of one device, one per rail, with their comm table: the unit that comms will share (shared
// endpoints, step 2). Completions of every rail are read by the rail's endpoint and routed through the table
// (fabric/comm_table.h) to the comm they name.
//
// By default each connection opens its own group (private: one comm, no lock). With WEFT_FABRIC_SHARED_EP=1 the
// comms of one NCCL context on one device share a group (step 2 of shared endpoints): whoever reads the group's
// completion queues dispatches to every comm of it, so one thread at a time works on the group. Listens,
// connects, accepts and closes (NCCL's service thread) take the group's lock and may wait for it; the data path
// (NCCL's progress thread) never waits: it try-locks, and backs off when the group is busy (isend/irecv return a
// NULL request, test reports not done, and NCCL calls again). A context's one progress thread finds the lock free
// except while its service thread runs a handshake step or a close (short, and only while connections are set up
// or torn down). A comm closed with operations still in the provider's hands is parked in the group until they
// complete. DESIGN rule 4 (no lock on the data path) is kept in what matters, never waiting; the uncontended
// try-lock is the one atomic operation it adds.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "fabric/comm_table.h"
#include "fabric/fabric_endpoint.h"
#include "weft/common/params.h"

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
  // close on a shared group holds it (NCCL's service thread: it may wait).
  std::unique_lock<std::mutex> lockIfShared() {
    return shared_ ? std::unique_lock<std::mutex>(mu_) : std::unique_lock<std::mutex>();
  }
  // The data path's way in (NCCL's progress thread: it never waits): the lock if it is free, else *busy and
  // the caller backs off (isend/irecv return a NULL request, test reports not done; NCCL calls again).
  std::unique_lock<std::mutex> tryLockIfShared(bool* busy) {
    if (!shared_) {
      *busy = false;
      return std::unique_lock<std::mutex>();
    }
    std::unique_lock<std::mutex> l(mu_, std::try_to_lock);
    *busy = !l.owns_lock();
    return l;
  }

  // A closed comm whose operations are still in the provider's hands: kept (and still routed to) until
  // `drained` says they are over (sweep), or until the group closes its endpoints. Caller holds the lock.
  // holdUntilMs (coarse clock): the group's endpoints, closing, wait for it until then (drain).
  void park(DataSink* comm, bool (*drained)(DataSink*), int64_t holdUntilMs = 0);
  void sweep();
  size_t parked() const { return parked_.size(); }
  CommTable& table() { return table_; }
  // This side's further rail addresses, for the handshake.
  RailAddrs railAddrs() const;

 private:
  // A closed comm's late traffic is expected for as long as its id is held back (WEFT_PEER_TIMEOUT).
  explicit EndpointGroup(std::string where, bool shared)
      : table_(std::move(where), std::chrono::seconds(params::getInt("WEFT_PEER_TIMEOUT"))), shared_(shared) {}
  void drain();  // reads what peers sent before the endpoints close (see endpoint_group.cc)
  // The table outlives the endpoints and parked comms (declared first, destroyed last).
  CommTable table_;
  bool shared_;
  std::mutex mu_;
  struct Parked {
    std::unique_ptr<DataSink> comm;
    bool (*drained)(DataSink*);
    int64_t holdUntilMs;
  };
  std::vector<Parked> parked_;
  std::vector<std::unique_ptr<Endpoint>> eps_;
};

}  // namespace weft::fabric
