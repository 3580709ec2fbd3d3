// SPDX-License-Identifier: Apache-2.0
// A listen comm: connection requests taken from the endpoint group, the handshake, and the receive comm made.
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

FabricListenComm::FabricListenComm(std::shared_ptr<EndpointGroup> group, uint64_t token, int maxRecvs, CommId id)
    : dev_(group->rail(0).device()), group_(std::move(group)), token_(token), id_(std::move(id)), maxRecvs_(maxRecvs) {}

// Requests still queued for this listen are refused; once accepted, the group belongs to the receive comm.
FabricListenComm::~FabricListenComm() {
  if (group_ == nullptr) return;
  auto lock = group_->lockIfShared();
  group_->rail(0).closeListen(id_.get());
}

Status FabricListenComm::accept(RecvComm** recvComm) {
  *recvComm = nullptr;
  ClosingComms::poll();
  if (accepted_) {
    WEFT_WARN("accept called again on a listen comm that already produced its connection");
    return Status::kInternal;
  }
  // `keep` outlives `lock`: the group moves to the receive comm below, which may go again if it fails to start.
  std::shared_ptr<EndpointGroup> keep = group_;
  auto lock = keep->lockIfShared();
  Endpoint& ep = group_->rail(0);
  if (Status st = ep.progress(); st != Status::kOk) return st;
  // Waiting for a peer to connect is normal; waiting on this end (every reply slot busy, or the accepting reply not
  // gone yet) for long is not: said once, with the handshake's state.
  const bool stuck = replying_ ? !ep.replyDone(reply_) : !ep.replySlotFree();
  if (!stuck) {
    stuckSinceMs_ = 0;
  } else if (stuckSinceMs_ == 0) {
    stuckSinceMs_ = coarseNowMs();
  } else if (!toldStuck_ && coarseNowMs() - stuckSinceMs_ > 10000) {
    toldStuck_ = true;
    WEFT_WARN("accept on {}: {} for 10 s ({})", dev_.props().name,
              replying_ ? "the accepting reply to " + peerName_ + " has not left" : "no reply slot free",
              ep.handshakeState());
  }
  if (!replying_) {
    if (!ep.replySlotFree()) return Status::kOk;  // the reply must not be dropped: NCCL calls accept again
    ConnectRequest req;
    if (!ep.takeConnRequest(id_.get(), &req)) return Status::kOk;
    std::string from = ep.addrString(wire::requestAddr(req), req.addrLen);
    if (req.token != token_) {
      ep.refuse(req, kBadToken);  // with a warning; the legitimate peer may still come
      return Status::kOk;
    }
    if (req.commId == 0 || req.commId > wire::kMaxCommId) {
      WEFT_WARN("listen on {}: connection from {} names comm id {}, outside [1, {}]", dev_.props().name, from,
                req.commId, wire::kMaxCommId);
      return Status::kOk;  // malformed: ignored, the legitimate peer may still come
    }
    if (!transport::agreesWith(req.tunerDigest)) {
      // The real peer, tuning differently: refused (it fails its connect naming both), and so does this accept.
      WEFT_WARN("listen on {}: connection from {}: {}", dev_.props().name, from,
                transport::agreementMismatch(req.tunerDigest, from));
      ep.refuse(req, kTunerMismatch);
      return Status::kInvalidUsage;
    }
    // rdma only if both ends offer it; the compact completion data if either end needs it.
    const uint32_t mine = localProtocolFlags(dev_, group_->rails());
    uint32_t agreed = req.flags & mine & ConnectRequest::kFlagRdma;
    if (agreed != 0) agreed |= (req.flags | mine) & ConnectRequest::kFlagImm4;
    // This end receives the writes: its provider decides whether their length comes with the completion (measured
    // once per device and remembered).
    if ((agreed & ConnectRequest::kFlagImm4) != 0 && Endpoint::writeLenReported(dev_)) {
      agreed |= ConnectRequest::kFlagLenFromCq;
    }
    // The compact form without the comm id (lengths in the completion data) names no comm: such a comm must be
    // alone in its group, so a shared group carries those connections with sendrecv instead.
    if ((agreed & ConnectRequest::kFlagImm4) != 0 && (agreed & ConnectRequest::kFlagLenFromCq) == 0 &&
        group_->shared()) {
      static std::once_flag once;
      std::call_once(once, [&] {
        WEFT_INFO(NCCL_INIT | NCCL_NET, "{}: the provider carries 4 bytes of completion data and does not report "
                  "write lengths, so writes cannot name their comm on a shared endpoint: connections use the "
                  "sendrecv protocol", dev_.props().name);
      });
      agreed = 0;
    }
    proto_.rdma = (agreed & ConnectRequest::kFlagRdma) != 0;
    proto_.imm4 = (agreed & ConnectRequest::kFlagImm4) != 0;
    proto_.immId = proto_.imm4 && (agreed & ConnectRequest::kFlagLenFromCq) != 0;
    proto_.eagerMax = proto_.rdma ? req.eagerMax : 0;
    fi_addr_t peer;
    if (Status st = ep.insert(wire::requestAddr(req), req.addrLen, &peer); st != Status::kOk) return st;
    // Rails: as many as both ends have (a peer with fewer NICs in its device uses fewer); rail k pairs with rail k.
    const int nRails = std::min<int>(req.rails.count, group_->rails());
    RailAddrs ours = group_->railAddrs();
    ours.count = static_cast<uint8_t>(nRails);
    peers_.assign(1, peer);
    for (int k = 1; k < nRails; ++k) {
      fi_addr_t a;
      if (Status st = group_->rail(k).insert(req.rails.addr[k], req.rails.len[k], &a); st != Status::kOk) return st;
      peers_.push_back(a);
    }
    // Delivery acknowledgements: the lesser of what the two ends ask for, for a connection of this many rails.
    const uint32_t ackAsk = req.flags & mine & (ConnectRequest::kFlagAckRails | ConnectRequest::kFlagAckAll);
    if ((ackAsk & ConnectRequest::kFlagAckAll) != 0 || ((ackAsk & ConnectRequest::kFlagAckRails) != 0 && nRails > 1)) {
      agreed |= ConnectRequest::kFlagAckRails;
    }
    proto_.acks = (agreed & ConnectRequest::kFlagAckRails) != 0;
    // Rail failover: with the rdma protocol only where both ends can (this one resets the rails it receives on).
    const uint32_t failAsk = req.flags & mine & (ConnectRequest::kFlagFailover | ConnectRequest::kFlagFailoverRma);
    if (proto_.acks && nRails > 1 && (failAsk & ConnectRequest::kFlagFailover) != 0 &&
        (!proto_.rdma || (failAsk & ConnectRequest::kFlagFailoverRma) != 0)) {
      agreed |= failAsk;
    }
    proto_.failover = (agreed & ConnectRequest::kFlagFailover) != 0;
    if (Status st = ep.sendReply(peer, req.commId, kAccepted, req.token, agreed, &ours, id_.get(), &reply_); st != Status::kOk) {
      return st;
    }
    ep.markAccepted(id_.get());
    if (nRails < group_->rails()) {
      WEFT_INFO(NCCL_NET, "peer {} has {} rails, this device {}: using {}", from, req.rails.count, group_->rails(),
                nRails);
      group_->keepRails(nRails);
    }
    replying_ = true;
    peerName_ = from;
    peerId_ = req.commId;
  }
  // Hand the comm out only once the reply has left this process: NCCL need not progress the new recv comm
  // before the peer's connect completes, and some providers (sockets) send only while progressed.
  if (!ep.replyDone(reply_)) return Status::kOk;
  WEFT_INFO(NCCL_NET, "accepted connection from {} on {} ({} protocol, eager up to {} B, {} rail{}{}{})", peerName_,
            dev_.props().name, protocolName(proto_), proto_.eagerMax, group_->rails(),
            group_->rails() == 1 ? "" : "s", proto_.acks ? ", delivery acknowledgements" : "",
            proto_.failover ? ", rail failover" : "");
  accepted_ = true;
  std::vector<Rail> rails(static_cast<size_t>(group_->rails()));
  for (int k = 0; k < group_->rails(); ++k) {
    rails[k].ep = &group_->rail(k);
    rails[k].peer = peers_[k];
  }
  auto rc = std::make_unique<FabricRecvComm>(std::move(group_), std::move(rails), peerName_, maxRecvs_, proto_,
                                             std::move(id_), peerId_);
  if (Status st = rc->start(); st != Status::kOk) return st;
  *recvComm = rc.release();
  return Status::kOk;
}

}  // namespace weft::fabric
