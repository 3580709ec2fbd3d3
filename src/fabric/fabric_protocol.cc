// SPDX-License-Identifier: Apache-2.0
// What this end asks for at connect (protocol flags) and how a protocol is named in the log.
#include "fabric/fabric_comm.h"

#include "weft/common/clock.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <time.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>

#include "weft/common/params.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"

namespace weft::fabric {

const char* protocolName(const Protocol& p) {
  if (!p.rdma) return "sendrecv";
  if (!p.imm4) return "rdma";
  return p.immId ? "rdma (4-byte completion data, lengths from the completions)"
                 : "rdma (4-byte completion data carrying lengths)";
}

uint32_t localProtocolFlags(FabricDevice& dev, int rails) {
  const std::string& ack = params::getString("WEFT_DELIVERY_ACK");
  // Failover needs the acknowledgements: asking for it asks for them on connections of several rails.
  const bool failoverAsked = params::getBool("WEFT_RAIL_FAILOVER");
  const uint32_t acks = ack == "all"                       ? ConnectRequest::kFlagAckRails | ConnectRequest::kFlagAckAll
                        : ack == "rails" || failoverAsked ? ConnectRequest::kFlagAckRails
                                                          : 0;
  // The send side's rail-down note is injected (16 bytes). With the rdma protocol the receive side resets a failed
  // rail's connection (FabricDevice::resetsPeers).
  const bool rmaFailover = dev.resetsPeers();
  const uint32_t failover =
      failoverAsked && dev.injectSize() >= 16
          ? ConnectRequest::kFlagFailover | (rmaFailover ? ConnectRequest::kFlagFailoverRma : 0)
          : 0;
  // Failover asked for on several rails where the rdma protocol cannot fail over: auto means sendrecv there.
  if (!dev.rdma() || (failover != 0 && rails > 1 && !rmaFailover && params::getString("WEFT_PROTOCOL") == "auto")) {
    return failover | acks;
  }
  if (!dev.compactImm()) return failover | acks | ConnectRequest::kFlagRdma;
  return failover | acks | ConnectRequest::kFlagRdma | ConnectRequest::kFlagImm4 |
         (Endpoint::writeLenReported(dev) ? ConnectRequest::kFlagLenFromCq : 0);
}

}  // namespace weft::fabric
