// SPDX-License-Identifier: Apache-2.0
// A backend's send or receive comm: NCCL's interface (Iface: SendComm or RecvComm) over the backend's data comm
// (Data), which answers the calls every comm answers alike. Data provides peerName_, localName_, commDeviceName(),
// railHealth(int*) (none: *n = 0, nullptr), refreshRailHealth(), a public StallState stall_, registerMr(data, size,
// type, dmabufFd, offset, out) (dmabufFd -1: plain memory) and deregisterMr(mh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "weft/transport/net.h"

namespace weft {

template <typename Iface, typename Data>
class CommAdaptor : public Iface, public Data {
 public:
  using Data::Data;

  std::string peerName() const override { return this->peerName_; }
  std::string localName() const override { return this->localName_; }
  std::string deviceName() const override { return Data::commDeviceName(); }
  const DeviceProps* deviceProps() const override { return &Data::commDeviceProps(); }
  const RailHealth* rails(int* n) const override { return Data::railHealth(n); }
  const StallState* stallState() const override { return &this->stall_; }
  void refreshRails() override { Data::refreshRailHealth(); }
  Status regMr(void* data, size_t size, int type, MemHandle** out) override {
    return Data::registerMr(data, size, type, -1, 0, out);
  }
  Status regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out) override {
    return Data::registerMr(data, size, type, fd, offset, out);
  }
  Status deregMr(MemHandle* mh) override { return Data::deregisterMr(mh); }
};

}  // namespace weft
