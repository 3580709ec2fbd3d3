// SPDX-License-Identifier: Apache-2.0
// The send side of a data comm: offers from the receiver, tagged sends, RMA writes cut into pieces over rails.
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

Status FabricDataComm::checkTag(int tag, const char* op) const {
  if (wire::validNcclTag(tag)) return Status::kOk;
  WEFT_WARN("{}: tag {} is outside [0, {}] (NCCL passes ranks as tags)", op, tag, wire::kMaxNcclTag);
  return Status::kInvalidUsage;
}

FabricSendComm::FabricSendComm(std::shared_ptr<EndpointGroup> group, std::vector<Rail> rails, std::string peerName,
                               int maxRecvs, Protocol proto, CommId localId, uint32_t peerId)
    : CommAdaptor(std::move(group), std::move(rails), std::move(peerName), kMaxRequests * maxRecvs, proto,
                  std::move(localId), peerId, false),
      inject_(params::getBool("WEFT_INJECT")),
      stripeMin_(static_cast<size_t>(params::getInt("WEFT_STRIPE_MIN"))) {}

Status FabricSendComm::start() {
  if (Status st = join(false); st != Status::kOk) return st;
  // Acknowledgements come to rail 0's pool of offer receives (wire::AckMsg), whatever the protocol; under rail
  // failover to every rail's (the control rail moves when it fails).
  if (proto_.acks) {
    for (int k = 0; k < (ctlMoves_ ? nRails_ : 1); ++k) {
      if (Status st = rails_[k].ep->ensureOfferPool(group_->shared() ? kSharedOfferRecvs : kOfferRecvs);
          st != Status::kOk) {
        return st;
      }
    }
  }
  if (!proto_.rdma) return Status::kOk;
  // Only the rdma protocol keeps offers (a sendrecv comm holds no table: 2,048 slots are ~100 KiB).
  table_.reset(new (std::nothrow) OfferTable<OfferEntry>());
  if (!table_) return Status::kSystem;
  // The receiver's offers come to rail 0's endpoint, whose pool of receives serves every send comm on it.
  return ctl().ensureOfferPool(group_->shared() ? kSharedOfferRecvs : kOfferRecvs);
}

void FabricSendComm::onOffer(const void* msg, size_t len) noexcept {
  silence_.completed();
  if (closing_) return;
  const auto& m = *static_cast<const OfferMsg*>(msg);
  if (len >= offsetof(OfferMsg, entry) && m.magic == wire::AckMsg::kMagic) {
    onAck(*static_cast<const wire::AckMsg*>(msg), len);
    return;
  }
  if (proto_.failover && len >= offsetof(OfferMsg, entry) && m.magic == OfferMsg::kMagic) {
    // Sent before the receiver's control rail moved, arriving late: every buffer still waiting was offered again.
    const auto ahead = static_cast<uint8_t>(m.epoch - ctlEpoch_);
    if (ahead >= 128) return;
    ctlEpoch_ = m.epoch;
  }
  if (!table_) {  // a sendrecv connection: offers are not part of its protocol
    WEFT_WARN("peer {} on {} sent a buffer offer on a connection without the rdma protocol: connection closed for "
              "safety", peerName_, dev_.props().name);
    if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
    return;
  }
  if (len < offsetof(OfferMsg, entry) || m.magic != OfferMsg::kMagic || m.count < 1 || m.count > kMaxRecvs ||
      len < OfferMsg::bytes(m.count)) {
    WEFT_WARN("peer {} on {} sent a malformed buffer offer: connection closed for safety", peerName_,
              dev_.props().name);
    if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
    return;
  }
  for (int i = 0; i < m.count; ++i) {
    if ((m.entry[i].flags & wire::kOfferAgain) != 0) {
      if (!proto_.failover) {
        WEFT_WARN("peer {} on {} offered a buffer again on a connection without rail failover: connection closed for "
                  "safety", peerName_, dev_.props().name);
        if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
        return;
      }
      onOfferAgain(m.entry[i]);
      continue;
    }
    bool dropped = false;
    // Keyed by NCCL tag and sequence (wire::ackKey): the comm id part may be a rail's alias (rail failover).
    if (!table_->addOffer(wire::ackKey(m.entry[i].tagSeq), m.entry[i], &dropped)) {
      WEFT_WARN("peer {} on {} offered a buffer twice or more than NCCL can have outstanding: connection closed",
                peerName_, dev_.props().name);
      if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
      return;
    }
  }
}

// A buffer offered again (kOfferAgain). A send of that message in flight is written again under the new slot (a
// tagged one, sent eagerly, is the tagged failover's); one not posted yet takes the new offer, replacing the earlier
// one (or standing for one lost with the control rail); one acknowledged already needs nothing.
void FabricSendComm::onOfferAgain(const OfferEntry& e) {
  const uint64_t key = wire::ackKey(e.tagSeq);
  for (int i = 0; i < allocated(); ++i) {
    FabricSendRequest& r = asSend(&req(i));
    if (r.magic_ != kRequestMagic || r.ackKey != key || !r.needAck || r.acked) continue;
    if (!r.rma) return;
    if (e.len != r.offer.len || (e.flags & kOfferTaggedOnly) != 0) {
      WEFT_WARN("peer {} on {} offered a buffer again that is not the one it offered first: connection closed for "
                "safety", peerName_, dev_.props().name);
      if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
      return;
    }
    if (r.rewrites >= kMaxResends) {
      WEFT_WARN("comm with {}: a message was written {} times, each time onto a rail that then failed: the comm "
                "fails", peerName_, r.rewrites + 1);
      if (r.error == Status::kOk) r.error = Status::kRemote;
      if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
      return;
    }
    r.offer = e;
    rewriteSend(&r);
    return;
  }
  uint64_t next = 0;
  if (!seqs_.peek(wire::dataTagNccl(key), 0, &next)) return;  // (a tag never sent: only when the table is full)
  const uint32_t behind = (static_cast<uint32_t>(next) - wire::dataTagSeq(key)) & wire::kSeqMask;
  if (behind != 0 && behind <= wire::kSeqMask / 2) {  // sent already, and acknowledged
    table_->dropEagerMark(key);  // (its first offer, lost with a rail, would have found it)
    return;
  }
  if (OfferEntry* o = table_->findOffer(key); o != nullptr) {
    *o = e;
    return;
  }
  bool dropped = false;
  if (!table_->addOffer(key, e, &dropped)) {
    WEFT_WARN("peer {} on {} offered more buffers than NCCL can have outstanding: connection closed", peerName_,
              dev_.props().name);
    if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
  }
}

bool FabricSendComm::rewriteSend(FabricSendRequest* r) {
  auto freeCtx = static_cast<uint8_t>(~r->busyCtx);
  if (std::popcount(freeCtx) < r->nSeg) {
    r->rewrite = true;
    return false;
  }
  r->rewrite = false;
  ++r->rewrites;
  for (int i = 0; i < r->nSeg; ++i) {
    r->ctxOf[i] = static_cast<uint8_t>(std::countr_zero(freeCtx));
    freeCtx &= static_cast<uint8_t>(freeCtx - 1);
    if ((failed_ & (1u << r->pieceRail[i])) != 0) {
      countMoved(r->pieceRail[i]);
      r->pieceRail[i] = static_cast<uint8_t>(ctlRail_);
    }
  }
  r->liveCtx = 0;
  r->segsLeft = r->nSeg;
  r->nextSeg = 0;
  r->sent = false;
  r->doneBufs = 0;
  bool again = false;
  (void)postSegments(r, &again);  // pushed back: the rest from test(); a failure fails the comm there
  return true;
}

Status FabricSendComm::sendTagged(FabricSendRequest* r, void* data, size_t size, MemHandle* mh, uint64_t ftag,
                                  int k, bool* again) {
  Rail& rail = rails_[k];
  r->src = static_cast<const char*>(data);  // what sending it again (rail failover) needs
  r->mh = mh;
  r->pieceLen[0] = size;
  r->pieceRail[0] = static_cast<uint8_t>(k);
  ssize_t rc;
  // fi_tinject copies with the CPU and takes no descriptor: host memory only (a device pointer would be read by the
  // CPU). NCCL registers every buffer it sends from, so the handle says which memory this is.
  const bool host = mh == nullptr || mh->type == NCCL_PTR_HOST;
  if (inject_ && host && rail.ep->device().canInject(size)) {
    // Copied out by the provider right away: the request is complete as soon as it is accepted.
    rc = fi_tinject(rail.ep->ep(), data, size, rail.peer, ftag);
    if (rc == 0) sendDone(r);
  } else {
    const MemHandle* h = mh ? mh->rail(k) : nullptr;
    rc = fi_tsend(rail.ep->ep(), data, size, h ? h->desc() : nullptr, rail.peer, ftag, &r->ctx[0].fi);
    if (rc == 0) r->ops = 1;
  }
  *again = rc == -FI_EAGAIN || railDownWait(k, rc);
  if (rc == 0) {
    rail.health->countSend(size);
    unreachableSinceMs_[k] = 0;
  }
  if (rc == 0 || *again) return Status::kOk;
  WEFT_WARN("fi_tsend ({} B) to {} on {} failed: {}", size, peerName_, railName(k), fi_strerror(static_cast<int>(-rc)));
  return statusOfFiError(static_cast<int>(-rc));
}

// An RMA write into the offered buffer: on rail (seq % rails), or, from WEFT_STRIPE_MIN bytes on a multi-rail
// comm, one segment per rail; with the compact completion data a segment whose length is not m * 2^e is written
// as two or three pieces. The first piece decides whether the send is taken (*again: nothing was posted); later
// ones the provider pushes back on are posted from test().
Status FabricSendComm::write(FabricSendRequest* r, void* data, size_t size, MemHandle* mh, const OfferEntry& o,
                             uint32_t seq, bool* again) {
  *again = false;
  r->offer = o;
  r->src = static_cast<const char*>(data);
  r->mh = mh;
  uint64_t flags = 0;
  if (size > o.len) {
    // Tell the receiver (it fails its receive with ncclInvalidUsage, as a tagged receive would) and move nothing.
    WEFT_WARN("isend of {} B to {} on {}: the matching receive buffer holds only {} B", size, peerName_,
              dev_.props().name, o.len);
    flags = WriteImm::kTruncated;
    size = 0;
  }
  // With rails failed over, a striped write is cut over the rails left (one segment each), and a failed rail's
  // share of the smaller ones goes round them, not all piled on the control rail: 3 rails of 4 carry a third more
  // each, not rail 0 twice its share. (The writer alone picks an RMA write's rails: the receiver takes any.)
  uint8_t live[kMaxRails];
  int stripes = nRails_;
  int single = railOf(seq);
  if (failed_ != 0) {
    stripes = 0;
    for (int k = 0; k < nRails_; ++k) {
      if ((failed_ & (1u << k)) == 0) live[stripes++] = static_cast<uint8_t>(k);
    }
    if ((failed_ & (1u << (seq % static_cast<uint32_t>(nRails_)))) != 0)
      single = live[(seq / static_cast<uint32_t>(nRails_)) % static_cast<uint32_t>(stripes)];
  }
  const int n = planWrite(size, flags == 0 ? stripes : 1, stripeMin_, proto_.imm4 && !proto_.immId, single,
                          r->pieceOff, r->pieceLen, r->pieceField, r->pieceRail, failed_ != 0 ? live : nullptr);
  if (n < 0) {
    WEFT_WARN("isend of {} B to {}: more than the completion data of {} can describe in {} writes", size,
              peerName_, dev_.props().provider, wire::kMaxPieces);
    return Status::kInvalidUsage;
  }
  r->nSeg = static_cast<uint8_t>(n);
  r->segsLeft = r->nSeg;
  r->nextSeg = 0;
  r->immFlags = static_cast<uint8_t>(flags);
  r->rma = true;
  for (int i = 0; i < n; ++i) r->ctxOf[i] = static_cast<uint8_t>(i);  // (no piece on a failed rail: above)
  return postSegments(r, again);
}

int planWrite(uint64_t size, int nRails, uint64_t stripeMin, bool imm4, int singleRail, uint64_t* off,
              uint64_t* len, uint32_t* field, uint8_t* rail, const uint8_t* railIds) {
  int stripes = 1;
  uint64_t segLen = size;
  // The compact completion data counts at most kMaxPieces pieces a write, and its last stripe may take two (every
  // other stripe is one piece): with 8 rails (v12) such writes stripe over 7 of them.
  const int maxStripes = imm4 ? std::min(nRails, wire::kMaxPieces - 1) : nRails;
  if (maxStripes > 1 && size >= stripeMin) {
    constexpr uint64_t kAlign = 4096;
    segLen = ((size + maxStripes - 1) / maxStripes + kAlign - 1) / kAlign * kAlign;  // never more stripes than rails
    if (imm4) {  // a segment length of the form m * 2^e leaves only the last segment to split
      int e = std::max(12, static_cast<int>(std::bit_width(segLen)) - 14);
      e = std::min(e, WriteImm32::kMaxE);
      segLen = (segLen + (uint64_t{1} << e) - 1) >> e << e;
    }
    stripes = static_cast<int>((size + segLen - 1) / segLen);
  }
  int n = 0;
  for (int s = 0; s < stripes; ++s) {
    uint64_t at = static_cast<uint64_t>(s) * segLen;
    uint64_t left = std::min<uint64_t>(segLen, size - at);
    do {
      if (n == wire::kMaxPieces) return -1;
      uint32_t f = 0;
      uint64_t piece = imm4 ? WriteImm32::largestPiece(left, &f) : std::min(left, WriteImm::kMaxPiece);
      off[n] = at;
      len[n] = piece;
      field[n] = f;
      rail[n] = static_cast<uint8_t>(stripes == 1 ? singleRail : railIds != nullptr ? railIds[s] : s);
      ++n;
      at += piece;
      left -= piece;
    } while (left > 0);
  }
  return n;
}

Status FabricSendComm::postSegments(FabricSendRequest* r, bool* again) {
  *again = false;
  while (r->nextSeg < r->nSeg) {
    const int i = r->nextSeg;
    const int k = r->pieceRail[i];
    Rail& rail = rails_[k];
    const uint64_t off = r->pieceOff[i], len = r->pieceLen[i];
    const MemHandle* h = r->mh ? r->mh->rail(k) : nullptr;
    const uint64_t imm = !proto_.imm4   ? WriteImm::encode(peerId_, r->offer.slot, r->immFlags, r->nSeg, len)
                         : proto_.immId ? WriteImmId::encode(peerId_, r->offer.slot, r->immFlags, r->nSeg)
                                        : WriteImm32::encode(r->offer.slot, r->immFlags, r->nSeg, r->pieceField[i]);
    const int c = r->ctxOf[i];
    ssize_t rc = fi_writedata(rail.ep->ep(), r->src + off, len, h ? h->desc() : nullptr, imm, rail.peer,
                              r->offer.addr[k] + off, r->offer.key[k], &r->ctx[c].fi);
    if (rc == -FI_EAGAIN || railDownWait(k, rc)) {
      *again = true;
      return Status::kOk;
    }
    if (rc != 0) {
      WEFT_WARN("fi_writedata ({} B) to {} on {} failed: {}", len, peerName_, railName(k),
                fi_strerror(static_cast<int>(-rc)));
      Status st = statusOfFiError(static_cast<int>(-rc));
      if (r->error == Status::kOk) r->error = st;
      if (fatal_ == Status::kOk) fatal_ = st;
      return st;
    }
    ++r->ops;
    ++r->nextSeg;
    r->busyCtx |= static_cast<uint8_t>(1u << c);
    r->liveCtx |= static_cast<uint8_t>(1u << c);
    rail.health->countSend(len);
    unreachableSinceMs_[k] = 0;
  }
  return Status::kOk;
}

Status FabricSendComm::isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  bool busy = false;
  auto lock = group_->tryLockIfShared(&busy);
  if (busy) return Status::kOk;  // back-pressure: NCCL posts it again
  if (fatal_ != Status::kOk) return fatal_;
  if (Status st = checkHandle(mh, "isend"); st != Status::kOk) return st;
  if (Status st = checkTag(tag, "isend"); st != Status::kOk) return st;
  if (size > dev_.maxMsgSize()) {
    WEFT_WARN("isend of {} B exceeds provider {}'s largest message ({} B)", size, dev_.props().provider,
              dev_.maxMsgSize());
    return Status::kInvalidUsage;
  }
  uint64_t count;
  if (!seqs_.peek(tag, 0, &count)) {
    WEFT_WARN("isend: more than {} distinct tags on one connection", TagSequence::kCapacity);
    return Status::kInternal;
  }
  const auto seq = static_cast<uint32_t>(count);
  const int rail = railOf(count);  // the receiver posts this tag and sequence on the same rail
  const uint64_t ftag = wire::dataTag(tagComm(rail, peerId_), tag, seq);
  const uint64_t key = wire::ackKey(ftag);
  const bool eager = !proto_.rdma || (proto_.eagerMax > 0 && size <= proto_.eagerMax);
  const OfferEntry* offer = nullptr;
  if (proto_.rdma) {
    if (eager) {
      if (!table_->eagerRoom()) {  // the receiver is far behind: wait for its offers to catch up
        progress();
        return Status::kOk;
      }
    } else {
      offer = table_->findOffer(key);
      if (offer == nullptr) {
        progress();
        offer = table_->findOffer(key);
        // The receiver has not offered this buffer yet: NCCL retries. Waiting on the peer counts for liveness
        // like an outstanding request does (a dead receiver never offers).
        waitingPeer_ = offer == nullptr;
        if (offer == nullptr) return fatal_;
      }
    }
  }
  waitingPeer_ = false;
  FabricRequest* acquired = acquire();
  if (acquired == nullptr) return fatal_;  // all requests in flight: NCCL retries later (or the pool could not grow)
  FabricSendRequest* r = &asSend(acquired);
  r->n = 1;
  r->size = static_cast<int>(size > INT_MAX ? INT_MAX : size);
  bytesInFlight_ += static_cast<uint64_t>(r->size);
  r->ackKey = key;
  Status st;
  bool again = false;
  if (offer == nullptr || (offer->flags & kOfferTaggedOnly) != 0) {
    st = sendTagged(r, data, size, mh, ftag, rail, &again);
  } else {
    st = write(r, data, size, mh, *offer, seq, &again);
    again = again && r->nextSeg == 0;  // pushed back before any segment left: not taken
  }
  if (again) {
    release(r);
    waitingPeer_ = true;  // the stall check watches the peer while NCCL retries
    progress();
    return fatal_;
  }
  if (st != Status::kOk) {
    release(r);
    fatal_ = st;
    return st;
  }
  if (proto_.rdma) {
    if (offer != nullptr) {
      table_->eraseOffer(key);
    } else {
      table_->markEager(key);
    }
  }
  seqs_.consume(tag);
  *request = r;
  return Status::kOk;
}

}  // namespace weft::fabric
