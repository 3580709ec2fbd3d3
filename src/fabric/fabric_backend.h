// The libfabric backend: discovery (provider and NIC choice), listen, and the non-blocking connect.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/fabric_comm.h"

namespace weft::fabric {

class FabricBackend final : public Backend {
 public:
  // Finds devices as WEFT_PROVIDER / WEFT_IFACE say. Returns nullptr and `why` when there are none.
  static std::unique_ptr<FabricBackend> discover(std::string* why);
  ~FabricBackend() override;

  const char* name() const override { return "libfabric"; }
  int deviceCount() const override { return static_cast<int>(devices_.size()); }
  const DeviceProps& props(int dev) const override { return devices_[dev]->props(); }
  const FabricDevice& device(int dev) const { return *devices_[dev]; }
  Status listen(int dev, void* handle, ListenComm** out) override;
  Status connect(int dev, const CommConfig& config, void* handle, SendComm** out) override;

 private:
  struct PendingConnect {
    std::unique_ptr<Endpoint> ep;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    std::string peerName;
    uint64_t token = 0;
    uint8_t handleBytes[kHandleSize];
    std::chrono::steady_clock::time_point started;
  };
  Status pollConnect(PendingConnect& pc, SendComm** out);

  std::vector<std::unique_ptr<FabricDevice>> devices_;
  int maxRecvs_ = 1;
  int connectTimeoutSec_ = 0;
  std::mutex pendingMutex_;  // guards pending_ (the entries themselves are polled by their own caller only)
  std::map<const void*, std::unique_ptr<PendingConnect>> pending_;  // keyed by NCCL's handle buffer
};

}  // namespace weft::fabric
