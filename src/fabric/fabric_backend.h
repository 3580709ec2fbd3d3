// SPDX-License-Identifier: Apache-2.0
// The libfabric backend: discovery (provider and NIC choice), listen, and the non-blocking connect.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/endpoint_group.h"
#include "fabric/fabric_comm.h"
#include "weft/transport/pending_connects.h"

namespace weft::fabric {

class FabricBackend final : public Backend {
 public:
  // Finds devices as WEFT_PROVIDER / WEFT_IFACE say. Returns nullptr and `why` when there are none.
  static std::unique_ptr<FabricBackend> discover(std::string* why);
  ~FabricBackend() override;

  const char* name() const override { return "libfabric"; }
  int deviceCount() const override { return groupCount_.load(std::memory_order_acquire); }
  const DeviceProps& props(int dev) const override { return groups_[dev]->props; }
  // NICs (rails) of NCCL device `dev`; rail 0 is the one the handle names.
  int railCount(int dev) const { return static_cast<int>(groups_[dev]->rails.size()); }
  const FabricDevice& device(int dev, int rail = 0) const { return *groups_[dev]->rails[rail]; }
  Status listen(int dev, const CommConfig& config, void* handle, ListenComm** out) override;
  Status connect(int dev, const CommConfig& config, void* handle, SendComm** out) override;
  Status makeVDevice(const int* devs, int n, int* out) override;
  bool stat(std::string_view key, long long* value) const override;
  std::string describe(int dev) const override;
  // The context's groups leave the registry; any still held by comms NCCL has not closed stay open for them
  // (with a warning) and close with their last comm.
  void releaseScope(const void* scope) override;

  static constexpr int kMaxDevices = 256;

 private:
  struct Group {
    std::vector<FabricDevice*> rails;
    DeviceProps props;
  };
  // Appends a device of these NICs (props: sum of speeds, the first NIC's PCI path). False when full.
  bool addGroup(std::vector<FabricDevice*> rails, const int* vdevs, int nVdevs);
  // A fresh comm id (listen or connect), or an empty one with a warning when every id is taken.
  CommId newCommId(const char* what, int dev);

  struct PendingConnect {
    CommId id;                                   // the send comm's, told to the listener
    std::shared_ptr<EndpointGroup> group;        // one endpoint per rail; rail 0 runs the handshake
    int slot = -1;                               // rail 0's connect slot (-1: not started yet)
    uint32_t listenId = 0, flags = 0, eagerMax = 0;
    ~PendingConnect() {
      if (group == nullptr || slot < 0) return;
      auto lock = group->lockIfShared();
      group->rail(0).endConnect(slot);
    }
    fi_addr_t peer = FI_ADDR_UNSPEC;
    std::string peerName;
    uint64_t token = 0;
    uint8_t handleBytes[kHandleSize];
    std::chrono::steady_clock::time_point started;
    bool toldSlow = false;  // the one line about a connect waiting long was logged
  };
  Status pollConnect(PendingConnect& pc, SendComm** out);
  Status groupFor(int dev, const CommConfig& config, std::shared_ptr<EndpointGroup>* out);
  bool sharedEndpoints_ = false;  // WEFT_FABRIC_SHARED_EP
  std::mutex sharedMutex_;
  std::map<std::pair<const void*, int>, std::weak_ptr<EndpointGroup>> shared_;

  std::vector<std::unique_ptr<FabricDevice>> nics_;
  // Devices NCCL sees. makeVDevice appends while other communicators may read: slots are written before the
  // count that publishes them, and never change afterwards.
  std::array<std::unique_ptr<Group>, kMaxDevices> groups_;
  std::atomic<int> groupCount_{0};
  std::mutex groupsMutex_;  // serializes appends
  int maxRecvs_ = 1;
  int connectTimeoutSec_ = 0;
  PendingConnects<PendingConnect> pending_;
};

}  // namespace weft::fabric
