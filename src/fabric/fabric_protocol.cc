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
#include <mutex>

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

// The listening end's side of the agreement on a connection request (`theirs`: its flags) for a connection of nRails
// rails (ourRails: this device's): rdma only if both ends offer it, the compact completion data if either end needs
// it; delivery acknowledgements and rail failover the lesser of what the two ask for.
uint32_t agreeFlags(FabricDevice& dev, uint32_t theirs, int ourRails, int nRails, bool sharedGroup) {
  const uint32_t mine = localProtocolFlags(dev, ourRails);
  uint32_t agreed = theirs & mine & ConnectRequest::kFlagRdma;
  if (agreed != 0) agreed |= (theirs | mine) & ConnectRequest::kFlagImm4;
  // This end receives the writes: its provider decides whether their length comes with the completion (measured
  // once per device and remembered).
  if ((agreed & ConnectRequest::kFlagImm4) != 0 && Endpoint::writeLenReported(dev)) {
    agreed |= ConnectRequest::kFlagLenFromCq;
  }
  // The compact form without the comm id (lengths in the completion data) names no comm: such a comm must be
  // alone in its group, so a shared group carries those connections with sendrecv instead.
  if ((agreed & ConnectRequest::kFlagImm4) != 0 && (agreed & ConnectRequest::kFlagLenFromCq) == 0 && sharedGroup) {
    static std::once_flag once;
    std::call_once(once, [&] {
      WEFT_INFO(NCCL_INIT | NCCL_NET, "{}: the provider carries 4 bytes of completion data and does not report "
                "write lengths, so writes cannot name their comm on a shared endpoint: connections use the "
                "sendrecv protocol", dev.props().name);
    });
    agreed = 0;
  }
  // Delivery acknowledgements: the lesser of what the two ends ask for, for a connection of this many rails.
  const uint32_t ackAsk = theirs & mine & (ConnectRequest::kFlagAckRails | ConnectRequest::kFlagAckAll);
  if ((ackAsk & ConnectRequest::kFlagAckAll) != 0 || ((ackAsk & ConnectRequest::kFlagAckRails) != 0 && nRails > 1)) {
    agreed |= ConnectRequest::kFlagAckRails;
  }
  // Rail failover: with the rdma protocol only where both ends can (this one resets the rails it receives on).
  const uint32_t failAsk = theirs & mine & (ConnectRequest::kFlagFailover | ConnectRequest::kFlagFailoverRma);
  const bool rdma = (agreed & ConnectRequest::kFlagRdma) != 0;
  if ((agreed & ConnectRequest::kFlagAckRails) != 0 && nRails > 1 && (failAsk & ConnectRequest::kFlagFailover) != 0 &&
      (!rdma || (failAsk & ConnectRequest::kFlagFailoverRma) != 0)) {
    agreed |= failAsk;
  }
  return agreed;
}

Protocol protocolOf(uint32_t agreed, uint32_t eagerMax) {
  Protocol p;
  p.rdma = (agreed & ConnectRequest::kFlagRdma) != 0;
  p.imm4 = (agreed & ConnectRequest::kFlagImm4) != 0;
  p.immId = p.imm4 && (agreed & ConnectRequest::kFlagLenFromCq) != 0;
  p.eagerMax = p.rdma ? eagerMax : 0;
  p.acks = (agreed & ConnectRequest::kFlagAckRails) != 0;
  p.failover = (agreed & ConnectRequest::kFlagFailover) != 0;
  return p;
}

}  // namespace weft::fabric
