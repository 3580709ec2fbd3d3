// SPDX-License-Identifier: Apache-2.0
// The native ibverbs backend (WEFT_BACKEND=verbs, or auto where an InfiniBand/RoCE port is active): one NCCL
// device per active HCA port, reliable-connected QPs per connection, the rdma protocol of verbs_comm.h.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "verbs/verbs_comm.h"
#include "weft/transport/device_slots.h"
#include "weft/transport/pending_connects.h"

namespace weft::verbs {

class VerbsBackend final : public SlottedBackend<VerbsDevice> {
 public:
  // Every active port WEFT_IB_HCA allows; nullptr and `why` when there is none (or libibverbs is missing).
  static std::unique_ptr<VerbsBackend> discover(std::string* why);
  ~VerbsBackend() override;

  const char* name() const override { return "verbs"; }
  Status listen(int dev, const CommConfig& config, void* handle, ListenComm** out) override;
  Status connect(int dev, const CommConfig& config, void* handle, SendComm** out) override;
  // A virtual device of one port (NCCL asks for single ones too); fusing several ports is not offered over
  // verbs: NCCL is told so and keeps them separate.
  Status makeVDevice(const int* devs, int n, int* out) override;
  bool stat(std::string_view key, long long* value) const override;

  static uint32_t providerHash();

 private:
  struct PendingConnect {
    std::unique_ptr<HandshakeSocket> sock;
    std::unique_ptr<QpSet> qps;
    std::unique_ptr<VerbsSendComm> comm;  // built once the peer answered; handed out when "ready" has left
    std::string peerName;
    uint64_t token = 0;
    int trafficClass = -1;
    bool tcpUp = false;
    bool sentInfo = false;
    uint8_t handleBytes[kHandleSize];
    std::chrono::steady_clock::time_point started;
  };
  Status pollConnect(int dev, PendingConnect& pc, SendComm** out);

  int maxRecvs_ = 1;
  int qpsPerConn_ = 1;
  int connectTimeoutSec_ = 0;
  PendingConnects<PendingConnect> pending_;
};

}  // namespace weft::verbs
