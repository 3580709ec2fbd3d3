// SPDX-License-Identifier: Apache-2.0
// Rail failover (Protocol::failover, docs/failover.md step 3): a failed rail's messages move to the rails left;
// with the rdma protocol, the receiving end resets the rail's connections and offers its buffers again
// (docs/failover.md, "RMA failover").
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

bool FabricDataComm::failRail(int k, RailEvent why, const std::string& detail, bool peerSaid) {
  if (!proto_.failover || k < 0 || k >= nRails_ || fatal_ != Status::kOk) return false;
  const auto bit = static_cast<uint8_t>(1u << k);
  if ((failed_ & bit) != 0) return true;
  if ((railMask() & ~(failed_ | bit)) == 0) return false;  // no rail left: the comm fails
  if (k == ctlRail_ && !ctlMoves_) return false;          // the control rail, where it cannot move
  const int64_t now = coarseNowMs();
  failed_ |= bit;
  fencedIn_ &= static_cast<uint8_t>(~bit);
  if (!recvSide_) {
    readmitSchedule(k, now);
    readmit_[k].resetGen = rails_[k].ep->resetGen(rails_[k].peer);
  }
  RailHealth::bump(health_[k].failovers, 1);
  Endpoint::countRailFailover();
  if (recvSide_) {
    fencing_ |= bit;
    fenceSinceMs_ = now;
    if (resetRails_) resetWant_ |= bit;
  }
  if (k == ctlRail_) moveCtl();
  try {  // (called from completion handlers too: a log line that cannot be formatted changes nothing)
    if (health_[k].isUp()) railDown(k, why, detail);
    WEFT_INFO(NCCL_NET, "comm with {}: {} failed over ({}): its messages go to {} from now on", peerName_,
              railName(k), detail, railName(ctlRail_));
  } catch (...) {
  }
  if (recvSide_) {
    fenceStep();
  } else if (!peerSaid || resetRails_) {  // the receive side waits for it to reset the rail (resetStep)
    railNoteWant_ |= bit;
    postRailNote();
  }

  return true;
}

// The control rail failed: the lowest rail left takes over (failRail made sure there is one). The receive side says
// again, on it, what the old one may have lost (fabric_comm.h).
void FabricDataComm::moveCtl() {
  ctlRail_ = std::countr_zero(static_cast<uint8_t>(railMask() & ~failed_));
  if (!recvSide_) return;
  ++ctlEpoch_;
  const uint64_t n = std::min<uint64_t>(takenCount_, kMostSends);
  for (uint64_t i = 0; i < n; ++i) ackQ_.push_back(takenRing_[(takenCount_ - n + i) % kMostSends]);
  for (int j = 0; j < nRails_; ++j) {
    if ((failed_ & (1u << j)) == 0 && railComm_[j] != 0) readmitOut_ |= static_cast<uint8_t>(1u << j);
  }
  fenceOut_ |= static_cast<uint8_t>(failed_ & ~fencing_);  // rails fenced before: their fence again
}

void FabricDataComm::onRailNote(uint32_t rails) noexcept {
  silence_.completed();
  if (!proto_.failover || recvSide_ == false || (rails >> nRails_) != 0) {
    WEFT_WARN("peer {} on {} sent a rail-down note this connection did not agree to (rails {:#x}): ignored",
              peerName_, dev_.props().name, rails);
    return;
  }
  try {
    for (int k = 0; k < nRails_; ++k) {
      if ((rails & (1u << k)) != 0) failRail(k, RailEvent::kLinkDown, "the peer saw it fail", true);
    }
  } catch (...) {  // a log line that could not be formatted: the rails are failed over all the same
  }
  if (resetRails_ && (rails & failed_) != 0) {  // the sender sends there no more: the rail's reset may go
    senderStopped_ |= static_cast<uint8_t>(rails & failed_);
    deferToBatchEnd();
  }
}

// Receive side: every receive still posted on a rail being fenced is canceled (its cancel completion posts it again
// on the control rail, onError); one the provider will not cancel (being matched) completes, and is acknowledged. Once none is
// left on the rail, the fence goes out with the next acknowledgement. A receive that never resolves (matched, its
// data stuck on the dead rail) fails the comm after WEFT_PEER_TIMEOUT.
void FabricDataComm::fenceStep() {
  uint8_t left = 0;
  for (int i = 0; i < allocated(); ++i) {
    FabricRecvRequest& r = recvReq(i);
    if (r.magic_ != kRequestMagic || r.flush) continue;
    bool repost = false;
    for (int b = 0; b < r.n; ++b) {
      const int k = r.rail[b];
      uint8_t& f = r.flags[b];
      if ((fencing_ & (1u << k)) == 0 || (f & FabricRecvRequest::kDone) != 0) continue;
      if ((f & FabricRecvRequest::kNeedPost) != 0 && (f & FabricRecvRequest::kPosted) == 0) {
        moveToCtl(r, b);  // never handed over: posted on the control rail instead
        repost = true;
        continue;
      }
      if ((f & FabricRecvRequest::kPosted) == 0) continue;
      left |= static_cast<uint8_t>(1u << k);
      if ((f & FabricRecvRequest::kCanceled) != 0) continue;
      if (fi_cancel(&rails_[k].ep->ep()->fid, &r.ctx[b].fi) == 0) {
        f |= FabricRecvRequest::kCanceled | FabricRecvRequest::kMoved;  // moved when its cancel completes
      }
    }
    if (repost) postPending(&r);
  }
  const auto fenced = static_cast<uint8_t>(fencing_ & ~left);
  fencing_ &= left;
  if (fenced != 0) {
    fenceOut_ |= fenced;
    flushAcks();
  }
  if (fencing_ != 0 && coarseNowMs() - fenceSinceMs_ > peerTimeoutMs_ && fatal_ == Status::kOk) {
    WEFT_WARN("comm with {}: a receive on a failed rail could not be taken back within WEFT_PEER_TIMEOUT (its "
              "message was arriving when the rail failed): the comm fails", peerName_);
    fatal_ = Status::kRemote;
  }
}

// Send side, on the receiver's fence: every send of those rails not acknowledged was not taken (the fence follows
// the acknowledgement of every message taken there), so it is sent again on the control rail with the same tag,
// where the receiver has posted its receive again.
void FabricDataComm::resendFenced(uint8_t rails) {
  for (int k = 0; k < nRails_; ++k) {
    if ((rails & (1u << k)) != 0) failRail(k, RailEvent::kLinkDown, "the peer fenced it", true);
  }
  for (int i = 0; i < allocated(); ++i) {
    FabricSendRequest& r = asSend(&req(i));
    if (r.magic_ != kRequestMagic || !r.needAck || r.acked || r.resend || r.rma || r.nSeg != 1 ||
        (rails & (1u << r.pieceRail[0])) == 0) {
      continue;
    }
    if (r.resends >= kMaxResends) {  // moved off one failed rail after another: its operations are all taken
      WEFT_WARN("comm with {}: a message was sent again {} times, each time onto a rail that then failed: the comm "
                "fails", peerName_, r.resends);
      if (r.error == Status::kOk) r.error = Status::kRemote;
      if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
      continue;
    }
    r.resend = true;
    postResend(&r);
  }
}

void FabricDataComm::postFailed(FabricRequest* r, ssize_t rc, const char* what, int k) {
  WEFT_WARN("comm with {}: {} on {} failed: {}", peerName_, what, railName(k), fi_strerror(static_cast<int>(-rc)));
  if (r->error == Status::kOk) r->error = statusOfFiError(static_cast<int>(-rc));
  if (fatal_ == Status::kOk) fatal_ = r->error;
}

// On the control rail (where the receiver posted it again), under the receive comm's own id.
bool FabricDataComm::postResend(FabricSendRequest* r) {
  const int on = ctlRail_;
  const uint64_t ftag = wire::dataTagOfKey(peerId_, r->ackKey);
  const MemHandle* h = r->mh != nullptr ? r->mh->rail(on) : nullptr;
  ssize_t rc = fi_tsend(rails_[on].ep->ep(), r->src, r->pieceLen[0], h != nullptr ? h->desc() : nullptr,
                        rails_[on].peer, ftag, &r->ctx[kResendCtx - r->resends].fi);
  if (rc == -FI_EAGAIN) return false;  // from test(), or the next fence
  r->resend = false;
  if (rc != 0) {
    postFailed(r, rc, "sending a message again", on);
    return true;
  }
  ++r->ops;
  ++r->resends;
  countMoved(r->pieceRail[0]);
  r->pieceRail[0] = static_cast<uint8_t>(on);
  rails_[on].health->countSend(r->pieceLen[0]);
  return true;
}

ssize_t FabricDataComm::injectNote(int on, uint64_t kind, uint64_t word) {
  const uint64_t body[2] = {kind, word};
  return fi_tinject(rails_[on].ep->ep(), body, sizeof(body), rails_[on].peer, wire::ctrlTag(wire::CtrlKind::kProbe));
}

// Send side: a rail-down note to the receive comm, on the control rail.
void FabricDataComm::postRailNote() {
  ssize_t rc = injectNote(ctlRail_, wire::kRailDown, (static_cast<uint64_t>(railNoteWant_) << 32) | peerId_);
  if (rc == -FI_EAGAIN) return;
  if (rc != 0) {
    WEFT_WARN("comm with {}: the rail-down note could not be sent on {}: {} (the receiver finds the failure itself)",
              peerName_, railName(ctlRail_), fi_strerror(static_cast<int>(-rc)));
  }
  railNoteWant_ = 0;
}

void FabricDataComm::fillOfferEntry(const FabricRecvRequest& r, int b, bool keyed, OfferEntry* e) const {
  e->tagSeq = r.tag[b];
  e->len = r.len[b];
  e->slot = r.seq[b];
  e->flags = keyed ? 0 : kOfferTaggedOnly;
  for (int q = 0; q < kMaxRails; ++q) {
    const MemHandle* hq = keyed && q < nRails_ ? r.mh[b]->rail(q) : nullptr;
    e->addr[q] = hq ? rails_[q].ep->device().remoteAddr(reinterpret_cast<uintptr_t>(r.data[b]), hq->entry->base) : 0;
    e->key[q] = hq ? hq->entry->key : 0;
  }
  e->reserved = 0;
}

// Receive side: the sender said it no longer writes on these failed rails. Their connections to it are closed
// (whatever they still held is dropped: nothing of an earlier write can land once its buffer is written again),
// then every buffer still waiting for data is offered again.
void FabricDataComm::resetStep() {
  const auto rails = static_cast<uint8_t>(resetWant_ & senderStopped_);
  resetWant_ &= static_cast<uint8_t>(~rails);
  senderStopped_ &= static_cast<uint8_t>(~rails);
  if (fatal_ != Status::kOk || closing_) return;
  for (int k = 0; k < nRails_; ++k) {
    if ((rails & (1u << k)) == 0) continue;
    if (Status st = rails_[k].ep->resetPeer(rails_[k].peer); st != Status::kOk) {
      WEFT_WARN("comm with {}: {} failed, and its connection could not be closed (a write it held could land in a "
                "buffer NCCL reused): the comm fails", peerName_, railName(k));
      fatal_ = Status::kRemote;
      return;
    }
  }
  if (!proto_.rdma) return;
  int n = 0;
  for (int i = 0; i < allocated(); ++i) {
    FabricRecvRequest& r = recvReq(i);
    if (r.magic_ != kRequestMagic || r.flush || !r.offerPosted || r.reoffer != FabricRecvRequest::kReofferNone) {
      continue;  // (an offer not posted yet goes as it is: nothing was written under it)
    }
    bool waits = false;
    for (int b = 0; b < r.n; ++b) {
      waits = waits || (r.flags[b] & (FabricRecvRequest::kOffered | FabricRecvRequest::kDone)) ==
                           FabricRecvRequest::kOffered;
    }
    if (!waits) continue;
    r.reoffer = FabricRecvRequest::kReofferWant;
    ++reoffers_;
    ++n;
  }
  try {
    WEFT_INFO(NCCL_NET, "comm with {}: closed the connection of failed rail(s) {:#x} to the sender; {} receives "
              "offered again", peerName_, rails, n);
  } catch (...) {
  }
  flushReoffers();
}

void FabricDataComm::flushReoffers() {
  for (int i = 0; i < allocated() && reoffers_ > 0; ++i) {
    FabricRecvRequest& r = recvReq(i);
    if (r.magic_ != kRequestMagic || r.reoffer == FabricRecvRequest::kReofferNone || !reofferRequest(&r)) continue;
    r.reoffer = FabricRecvRequest::kReofferNone;
    --reoffers_;
  }
}

// The request's buffers still waiting for data, offered again in its own offer message (once its earlier offer
// has left the provider's hands) under new sequences; the old ones are parked, so a late piece of the earlier write
// (on a rail that works, ahead of the new write on the same connection) is ignored.
bool FabricDataComm::reofferRequest(FabricRecvRequest* r) {
  if (r->offerBusy) return false;
  OfferMsg& m = offer(r->poolIndex);
  if (r->reoffer == FabricRecvRequest::kReofferWant) {
    int c = 0;
    for (int b = 0; b < r->n; ++b) {
      if ((r->flags[b] & (FabricRecvRequest::kOffered | FabricRecvRequest::kDone)) != FabricRecvRequest::kOffered) {
        continue;
      }
      const auto slot = static_cast<uint16_t>(r->poolIndex * kMaxRecvs + b);
      if (bySeq_[r->seq[b]] == slot + 1) bySeq_[r->seq[b]] = kSeqParked;
      uint16_t sq = 0;
      if (!allocSeq(slot, &sq)) {  // (parked sequences are reused: only with every one held by a live buffer)
        WEFT_WARN("comm with {}: no receive sequence free to offer a buffer again: the comm fails", peerName_);
        if (fatal_ == Status::kOk) fatal_ = Status::kInternal;
        return true;
      }
      r->seq[b] = sq;
      r->rmaBytes[b] = 0;
      r->rmaSegs[b] = 0;
      fillOfferEntry(*r, b, true, &m.entry[c]);
      m.entry[c].flags |= wire::kOfferAgain;
      ++c;
    }
    if (c == 0) return true;
    m.count = static_cast<uint16_t>(c);
    r->reoffer = FabricRecvRequest::kReofferReady;
  }
  m.epoch = ctlEpoch_;
  ssize_t rc = fi_tsend(ctl().ep(), &m, OfferMsg::bytes(m.count), offerDesc(r->poolIndex), ctlPeer(),
                        wire::ctrlTag(wire::CtrlKind::kOffer), &r->offerCtx.fi);
  if (rc == -FI_EAGAIN) return false;
  if (rc != 0) {
    postFailed(r, rc, "offering a buffer again", ctlRail_);
    return true;
  }
  ++r->ops;
  r->offerBusy = true;
  return true;
}

}  // namespace weft::fabric
