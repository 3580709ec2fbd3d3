// SPDX-License-Identifier: Apache-2.0
// What the provider reports for a data comm's operations: completions, errors, and remote writes' data.
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

void FabricDataComm::onComplete(OpContext* ctx, size_t len) noexcept {
  if (ctx->kind == OpKind::kNote) {
    Rail& r = rails_[ctx->index];
    r.note &= static_cast<uint8_t>(~kNoteInFlight);
    if (notesWaiting_ > 0) postNotes();
    return;
  }
  if (ctx->kind == OpKind::kAck) {
    ackBusy_ &= static_cast<uint8_t>(~(1u << ctx->index));
    flushAcks();  // the messages taken meanwhile: at once, whether or not NCCL calls this comm again
    return;
  }
  silence_.completed();

  auto* r = static_cast<FabricRequest*>(ctx->owner);
  if (ctx->kind == OpKind::kOfferSend) {
    asRecv(r).offerSent = true;
    asRecv(r).offerBusy = false;
  } else if (ctx->kind == OpKind::kFlush) {
    FabricRecvRequest& q = asRecv(r);
    q.flags[ctx->index] = FabricRecvRequest::kDone;
    ++q.doneBufs;
    Endpoint::countFlushRead();
  } else if (!recvSide_) {
    FabricSendRequest& q = asSend(r);
    if (q.rma) {  // a piece of the current write counts; one of a write done again since does not
      const auto bit = static_cast<uint8_t>(1u << ctx->index);
      q.busyCtx &= static_cast<uint8_t>(~bit);
      if ((q.liveCtx & bit) != 0) {
        q.liveCtx &= static_cast<uint8_t>(~bit);
        if (--q.segsLeft == 0) sendDone(&q);
      }
    } else if (--q.segsLeft == 0 || (q.resends > 0 && ctx->index > 0 && q.nSeg == 1)) {
      sendDone(&q);  // a send sent again (rail failover) is sent by whichever of its operations completes first
    }
  } else {
    FabricRecvRequest& q = asRecv(r);
    int i = ctx->index;
    rails_[q.rail[i]].ep->dataRecvDone();
    q.flags[i] &= static_cast<uint8_t>(~(FabricRecvRequest::kPosted | FabricRecvRequest::kCanceled |
                                         FabricRecvRequest::kClaim));
    if ((q.flags[i] & FabricRecvRequest::kDone) == 0) {
      q.flags[i] |= FabricRecvRequest::kDone;
      q.sizes[i] = static_cast<int>(len > INT_MAX ? INT_MAX : len);
      ++q.doneBufs;
      noteTaken(q.tag[i]);
    }
  }
  opDone(r);
}

// An operation of this comm failed: what it means depends on what it was. Handled (a cancel of ours, a rail failed
// over, a stale piece, a lost offer given a grace period), the request just loses the operation; otherwise the
// request and the comm fail.
void FabricDataComm::onError(Endpoint* ep, OpContext* ctx, int fiErr, Status st) noexcept {
  if (ctx->kind == OpKind::kNote) {
    // The peer is gone or closed its side: nothing of ours can reach it any more, and nobody waits for it.
    Rail& r = rails_[ctx->index];
    r.note = static_cast<uint8_t>((r.note & ~kNoteInFlight) | kNoteFailed);
    return;
  }
  if (ctx->kind == OpKind::kAck) {
    ackFailed(ctx, fiErr, st);
    return;
  }
  silence_.completed();
  auto* r = static_cast<FabricRequest*>(ctx->owner);
  bool handled = false;
  switch (ctx->kind) {
    case OpKind::kFlush:
      WEFT_WARN("flush: the read on rail {} of the comm from {} failed: {}", ctx->index, peerName_,
                fi_strerror(fiErr));
      if (r->error == Status::kOk) r->error = st;
      handled = true;
      break;
    case OpKind::kData:
      handled = recvSide_ ? recvFailed(ep, asRecv(r), ctx->index, fiErr, st)
                          : sendFailed(ep, asSend(r), ctx->index, fiErr, st);
      break;
    case OpKind::kOfferSend:
      handled = offerFailed(ep, asRecv(r), fiErr, st);
      break;
    default:
      break;
  }
  if (!handled) failOperation(ep, r, fiErr, st);
  opDone(r);
}

// The sender's sends wait for an acknowledgement: without it they can never complete, so the connection is done for
// (the sender sees the same break through its own liveness check).
void FabricDataComm::ackFailed(OpContext* ctx, int fiErr, Status st) {
  ackBusy_ &= static_cast<uint8_t>(~(1u << ctx->index));
  ackQ_.clear();
  if (fatal_ == Status::kOk && !closing_) {
    WEFT_WARN("comm with {}: a delivery acknowledgement could not be sent ({}): the comm fails", peerName_,
              fi_strerror(fiErr));
    fatal_ = st;
  }
}

// A receive's buffer b: our own cancel, or a rail that failed under it (posted again on the control rail).
bool FabricDataComm::recvFailed(Endpoint* ep, FabricRecvRequest& r, int b, int fiErr, Status st) {
  rails_[r.rail[b]].ep->dataRecvDone();
  uint8_t& f = r.flags[b];
  if (fiErr == FI_ECANCELED && (f & FabricRecvRequest::kCanceled) != 0) {
    // Our own cancel: of a receive that RMA filled instead, of a claim that found no message waiting, or of a
    // receive on a rail failed over (both posted again later, the latter on the control rail). Not an error.
    const bool moved = (f & FabricRecvRequest::kMoved) != 0;
    const bool again = ((f & FabricRecvRequest::kClaim) != 0 || moved) && (f & FabricRecvRequest::kDone) == 0 &&
                       !closing_;
    f &= static_cast<uint8_t>(~(FabricRecvRequest::kPosted | FabricRecvRequest::kCanceled |
                                FabricRecvRequest::kClaim | FabricRecvRequest::kMoved));
    if (again) f |= FabricRecvRequest::kNeedPost;
    if (moved) moveToCtl(r, b);
    return true;
  }
  // A receive on a rail that failed (over, or now): posted again on the control rail.
  if (fiErr != FI_ECANCELED && (f & FabricRecvRequest::kDone) == 0 && !closing_ && failRailOnError(ep, fiErr, st)) {
    f = FabricRecvRequest::kNeedPost;
    moveToCtl(r, b);
    return true;
  }
  return false;
}

// A buffer offer that did not reach the sender.
bool FabricDataComm::offerFailed(Endpoint* ep, FabricRecvRequest& r, int fiErr, Status st) {
  r.offerBusy = false;
  // Lost with a failed rail: its buffers are offered again once the rail is reset (resetStep).
  if (proto_.rdma && failRailOnError(ep, fiErr, st)) return true;
  if (fiErr == FI_ECANCELED) return false;
  // Typically the sender's process closed the connection right after its last sends completed (NCCL's teardown
  // does), and a message of eager size needs no offer: what the sender sent before closing is still delivered. So
  // the receive is not failed at once: the comm fails if it still waits for data a grace period later
  // (FabricDataComm::failOnLostOffer).
  if (offerError_ == Status::kOk) {
    offerError_ = st;
    offerErrorMs_ = coarseNowMs();
  }
  return true;
}

// A send's operation k (a tagged send, or a piece of an RMA write).
bool FabricDataComm::sendFailed(Endpoint* ep, FabricSendRequest& q, int k, int fiErr, Status st) {
  // Rail failover: an operation of a message acknowledged since (its copy sent again, or written again, got
  // there), or of a write done again since, failing with the connection it was stuck in: nothing is lost.
  bool stale = proto_.failover && q.acked;
  if (q.rma) {
    const auto bit = static_cast<uint8_t>(1u << k);
    stale = stale || (proto_.failover && (q.liveCtx & bit) == 0);
    q.busyCtx &= static_cast<uint8_t>(~bit);
    q.liveCtx &= static_cast<uint8_t>(~bit);
  }
  if (stale) return true;
  // Unacknowledged: a tagged send is sent again on the control rail once the receiver has fenced the rail; an RMA
  // write is written again once the receiver offers its buffer again.
  return q.needAck && !q.acked && failRailOnError(ep, fiErr, st);
}

// A failed transfer breaks the ordered stream NCCL relies on: the request and the connection are done for.
void FabricDataComm::failOperation(Endpoint* ep, FabricRequest* r, int fiErr, Status st) {
  if (r->error == Status::kOk) r->error = st;
  if (fatal_ != Status::kOk) return;
  const int k = railOfEndpoint(ep);
  try {
    if (st == Status::kRemote) railDown(k, RailEvent::kErrorCompletion, fi_strerror(fiErr));  // (a truncation: not)
    WEFT_WARN("comm with {}: an operation on {} failed ({}); the comm fails", peerName_, railName(k),
              fi_strerror(fiErr));
  } catch (...) {  // a log line that cannot be formatted changes nothing
  }
  fatal_ = st;
}

// The completion data names this comm and the sequence of the buffer the sender wrote into. A write naming
// another comm is dropped (counted, with a warning); anything else that does not name a live offered buffer is a
// protocol violation by the peer: the connection fails, nothing is touched.
void FabricDataComm::onRemoteData(uint64_t d, size_t len) noexcept {
  silence_.completed();
  uint32_t comm, seq;
  uint64_t flags, pieces, bytes;
  if (!proto_.imm4) {
    comm = WriteImm::comm(d), seq = WriteImm::seq(d), flags = WriteImm::flags(d), pieces = WriteImm::pieces(d);
    bytes = WriteImm::bytes(d);
  } else if (proto_.immId) {
    comm = WriteImmId::comm(d), seq = WriteImmId::seq(d), flags = WriteImmId::flags(d);
    pieces = WriteImmId::pieces(d), bytes = len;
  } else {
    comm = localId_.get(), seq = WriteImm32::seq(d), flags = WriteImm32::flags(d), pieces = WriteImm32::pieces(d);
    bytes = WriteImm32::bytes(d);
  }
  if (comm != localId_.get()) {
    if (strayWrites_++ % 1024 == 0) {
      WEFT_WARN("on {}: a write from {} names comm {}, not this one ({}): dropped ({} so far)", dev_.props().name,
                peerName_, comm, localId_.get(), strayWrites_);
    }
    return;
  }
  const uint16_t entry = bySeq_ && seq < nSeqs_ ? bySeq_[seq] : kSeqFree;
  if (entry == kSeqParked) return;  // a buffer already reported done (LL/LL128): NCCL watches its data itself
  const int slot = static_cast<int>(entry) - 1;
  const int index = slot / kMaxRecvs, i = slot % kMaxRecvs;
  FabricRecvRequest* r = slot >= 0 && index < allocated() && recvSide_ ? &recvReq(index) : nullptr;
  if (r == nullptr || r->magic_ != kRequestMagic || i >= r->n ||
      (r->flags[i] & (FabricRecvRequest::kOffered | FabricRecvRequest::kDone)) != FabricRecvRequest::kOffered) {
    WEFT_WARN("peer {} on {} wrote into receive sequence {}, which it was not offered: connection closed for "
              "safety",
              peerName_, dev_.props().name, seq);
    if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
    return;
  }
  if ((flags & WriteImm::kTruncated) != 0) {
    WEFT_WARN("on {}: peer {} sent more than the {} B receive buffer holds: a send larger than its receive is "
              "not allowed",
              dev_.props().name, peerName_, r->len[i]);
    if (r->error == Status::kOk) r->error = Status::kInvalidUsage;
    if (fatal_ == Status::kOk) fatal_ = Status::kInvalidUsage;
  }
  r->rmaBytes[i] += bytes;
  if (++r->rmaSegs[i] < pieces) return;  // more pieces (rails, or lengths split for compact data) to come
  r->flags[i] |= FabricRecvRequest::kDone;
  bySeq_[seq] = kSeqFree;  // a second write naming it is a violation from now on
  r->sizes[i] = static_cast<int>(r->rmaBytes[i] > INT_MAX ? INT_MAX : r->rmaBytes[i]);
  ++r->doneBufs;
  noteTaken(r->tag[i]);
  if ((r->flags[i] & FabricRecvRequest::kNeedPost) != 0) {
    r->flags[i] &= static_cast<uint8_t>(~FabricRecvRequest::kNeedPost);  // never handed over: nothing to cancel
  } else if ((r->flags[i] & FabricRecvRequest::kPosted) != 0) {
    int rc = fi_cancel(&rails_[r->rail[i]].ep->ep()->fid, &r->ctx[i].fi);
    if (rc == 0) {
      r->flags[i] |= FabricRecvRequest::kCanceled;
    } else {
      // The receive stays posted under a tag nothing will send; the request is kept out of the pool.
      WEFT_WARN("on {}: canceling the unused tagged receive of sequence {} failed: {}", dev_.props().name, seq,
                fi_strerror(-rc));
    }
  }
}

}  // namespace weft::fabric
