// SPDX-License-Identifier: Apache-2.0
// The native TCP backend (WEFT_BACKEND=tcp): one NCCL device per network interface WEFT_IFACE selects (by default
// every interface that is up except loopback and container bridges; loopback when nothing else is), one
// non-blocking socket per connection, everything progressed inline from NCCL's calls (tcp_comm.h). Host memory
// only, as NCCL's own Socket transport: NCCL stages GPU data through host buffers.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tcp/tcp_comm.h"
#include "weft/transport/device_slots.h"
#include "weft/transport/pending_connects.h"

namespace weft::tcp {

class TcpBackend final : public SlottedBackend<TcpDevice> {
 public:
  // Every interface with an address that WEFT_IFACE allows; nullptr and `why` when there is none.
  static std::unique_ptr<TcpBackend> discover(std::string* why);
  ~TcpBackend() override;

  const char* name() const override { return "tcp"; }
  Status listen(int dev, const CommConfig& config, void* handle, ListenComm** out) override;
  Status connect(int dev, const CommConfig& config, void* handle, SendComm** out) override;
  // NCCL's NIC fusion: a device over its member interfaces (at most kMaxRails), each with its flows; one member
  // gives that interface again.
  Status makeVDevice(const int* devs, int n, int* out) override;
  bool stat(std::string_view key, long long* value) const override;
  std::string describe(int dev) const override;

  static uint32_t providerHash();
  // Flows a connection opens on a NIC of this PCI vendor when WEFT_TCP_FLOWS is 0; *why names the NIC.
  static int flowsForNic(unsigned vendor, const char** why);
  static constexpr int kGrowMax = 16;  // flows a connection may grow to on a NIC weft does not know
  // A device's interfaces and their addresses (the RMA transport listens on the first one's).
  const TcpDevice& device(int dev) const { return slots_.device(dev); }
  const SocketOptions& socketOptions() const { return opts_; }

 private:
  struct PendingConnect {
    struct Sock {  // one per flow
      int fd = -1;  // -1: not started, or waiting to try again (retryAt)
      size_t helloSent = 0;
      Hello answer{};
      size_t answerGot = 0;
      std::chrono::steady_clock::time_point retryAt{};
    };
    std::vector<Sock> socks;
    std::vector<sockaddr_storage> peer;  // the listener's address on each interface
    std::string peerName;
    uint64_t token = 0;
    uint64_t nonce = 0;
    size_t flows = 1;  // the connection's, flow 0 opened here
    uint8_t handleBytes[kHandleSize];
    std::chrono::steady_clock::time_point started;
    ~PendingConnect();
  };
  Status pollConnect(int dev, PendingConnect& pc, SendComm** out);
  // Opens flow k's socket and starts its connect. No route to the peer now (its interface is down: ENETUNREACH,
  // EHOSTUNREACH) leaves the flow waiting to try again in 100 ms, until the connect's timeout.
  Status startFlow(const TcpDevice& d, PendingConnect& pc, size_t k);

  SocketOptions opts_;
  int helperThreads_ = 0;  // WEFT_TCP_THREADS: each device's helper pool
  PendingConnects<PendingConnect> pending_;
};

}  // namespace weft::tcp
