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
  noteStuck(ep);
  if (!replying_) {
    if (Status st = answerRequest(ep); st != Status::kOk || !replying_) return st;
  }
  // Hand the comm out only once the reply has left this process: NCCL need not progress the new recv comm
  // before the peer's connect completes, and some providers (sockets) send only while progressed.
  if (!ep.replyDone(reply_)) return Status::kOk;
  return handOut(recvComm);
}

// Waiting for a peer to connect is normal; waiting on this end (every reply slot busy, or the accepting reply not
// gone yet) for long is not: said once, with the handshake's state.
void FabricListenComm::noteStuck(Endpoint& ep) {
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
}

// The next connection request for this listen, checked and answered: a wrong token or a malformed request is
// refused or ignored (the legitimate peer may still come); a peer whose tuner decides differently is refused and
// fails this accept. Accepted: the protocol agreed, the peer's rails inserted, the reply posted (replying_).
Status FabricListenComm::answerRequest(Endpoint& ep) {
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
  // Rails: as many as both ends have (a peer with fewer NICs in its device uses fewer); rail k pairs with rail k.
  const int nRails = std::min<int>(req.rails.count, group_->rails());
  const uint32_t agreed = agreeFlags(dev_, req.flags, group_->rails(), nRails, group_->shared());
  proto_ = protocolOf(agreed, req.eagerMax);
  fi_addr_t peer;
  if (Status st = ep.insert(wire::requestAddr(req), req.addrLen, &peer); st != Status::kOk) return st;
  RailAddrs ours = group_->railAddrs();
  ours.count = static_cast<uint8_t>(nRails);
  peers_.assign(1, peer);
  for (int k = 1; k < nRails; ++k) {
    fi_addr_t a;
    if (Status st = group_->rail(k).insert(req.rails.addr[k], req.rails.len[k], &a); st != Status::kOk) return st;
    peers_.push_back(a);
  }
  if (Status st = ep.sendReply(peer, req.commId, kAccepted, req.token, agreed, &ours, id_.get(), &reply_);
      st != Status::kOk) {
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
  return Status::kOk;
}

// The receive comm, on the group, rails and id this listen held.
Status FabricListenComm::handOut(RecvComm** recvComm) {
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
  const int node = rails[0].ep->device().props().numaNode;
  std::unique_ptr<FabricRecvComm> rc(numa::make<FabricRecvComm>(node, std::move(group_), std::move(rails), peerName_,
                                                                maxRecvs_, proto_, std::move(id_), peerId_));
  if (Status st = rc->start(); st != Status::kOk) return st;
  *recvComm = rc.release();
  return Status::kOk;
}

}  // namespace weft::fabric
