// SPDX-License-Identifier: Apache-2.0
// One device's description (DeviceProps) as NCCL's properties struct of any table version: the fields the net and
// the device-API tables fill alike. Each table then sets what is its own (device type, registration, flush, fused
// devices).
#pragma once

#include <cstring>

#include "weft/nccl/net.h"
#include "weft/transport/net.h"

namespace weft {

template <typename P>
void fillDeviceProps(const DeviceProps& d, int dev, P* props) {
  std::memset(static_cast<void*>(props), 0, sizeof(P));
  // NCCL's struct holds char*, never written through; the strings live as long as the backend, i.e. the process.
  props->name = const_cast<char*>(d.name.c_str());
  props->pciPath = d.pciPath.empty() ? nullptr : const_cast<char*>(d.pciPath.c_str());
  props->guid = d.guid;
  props->ptrSupport = d.ptrSupport;
  props->speed = d.speedMbps;
  props->port = d.port;
  props->latency = d.latencyUs;
  props->maxComms = d.maxComms;
  props->maxRecvs = d.maxRecvs;
  if constexpr (requires { props->vProps; }) {
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = dev;
    props->maxP2pBytes = d.maxP2pBytes;
    props->maxCollBytes = d.maxCollBytes;
  }
  if constexpr (requires { props->maxMultiRequestSize; }) props->maxMultiRequestSize = 1;
  if constexpr (requires { props->railId; }) {
    props->railId = static_cast<int16_t>(d.railId >= 0 ? d.railId : NCCL_NET_ID_UNDEF);
    props->planeId = static_cast<int16_t>(d.planeId >= 0 ? d.planeId : NCCL_NET_ID_UNDEF);
  }
}

}  // namespace weft
