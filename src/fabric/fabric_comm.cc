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

Status FabricRequest::test(bool* done, int* sizesOut) { return comm->testRequest(this, done, sizesOut); }

// ---- shared data-comm machinery --------------------------------------------------------------------------------

FabricDataComm::FabricDataComm(std::shared_ptr<EndpointGroup> group, std::vector<Rail> rails, std::string peerName,
                               int poolSize, Protocol proto, CommId localId, uint32_t peerId, bool recvSide)
    : dev_(rails.at(0).ep->device()),
      group_(std::move(group)),
      localId_(std::move(localId)),
      peerId_(peerId),
      rails_(std::move(rails)),
      nRails_(static_cast<int>(rails_.size())),
      peerName_(std::move(peerName)),
      proto_(proto),
      poolSize_(poolSize),
      recvSide_(recvSide),
      probeIntervalMs_(params::getInt("WEFT_PROBE_INTERVAL")),
      peerTimeoutMs_(params::getInt("WEFT_PEER_TIMEOUT") * 1000) {
  health_ = std::make_unique<RailHealth[]>(rails_.size());
  railDownSinceMs_.assign(rails_.size(), 0);
  unreachableSinceMs_.assign(rails_.size(), 0);
  for (size_t k = 0; k < rails_.size(); ++k) {
    health_[k].setDevice(rails_[k].ep->device().props().name.c_str());
    rails_[k].health = &health_[k];
    OpContext& c = rails_[k].noteCtx;
    c.owner = this;
    c.comm = localId_.get();
    c.index = static_cast<uint16_t>(k);
    c.kind = OpKind::kNote;
  }
  for (int i = 0; i < kAckSlots; ++i) {
    ackCtx_[i].owner = this;
    ackCtx_[i].comm = localId_.get();
    ackCtx_[i].index = static_cast<uint16_t>(i);
    ackCtx_[i].kind = OpKind::kAck;
  }
  if (proto_.failover) {
    readmitFirstMs_ = params::getInt("WEFT_RAIL_READMIT");
    ctlMoves_ = dev_.injectSize() >= wire::AckMsg::bytes(1, true);
    resetRails_ = dev_.resetsPeers();
    if (ctlMoves_ && recvSide_) takenRing_.reset(new uint64_t[kMostSends]());
  }
  if (proto_.acks && recvSide_) {
    ackQ_.reserve(static_cast<size_t>(poolSize_) * kMaxRecvs + (takenRing_ ? kMostSends : 0));
  }
}

// Requests come kChunk at a time, when the comm first has more in flight than it had: an idle connection holds
// none, a busy one what it used at its peak (at most poolSize_). Growing is the only allocation of the data path,
// at most poolSize_ / kChunk times in a comm's life; a failed one is back-pressure (NULL request, NCCL retries),
// except a failed registration of the chunk's offer messages, which fails the comm (it would fail again).
bool FabricDataComm::grow() {
  if (allocated_ >= poolSize_ || fatal_ != Status::kOk) return false;
  Chunk chunk;
  if (recvSide_) {
    chunk.recvs.reset(new (std::nothrow) FabricRecvRequest[kChunk]);
  } else {
    chunk.sends.reset(new (std::nothrow) FabricSendRequest[kChunk]);
  }
  if (!chunk.recvs && !chunk.sends) return false;
  if (wantOffers_) {
    chunk.offers.reset(new (std::nothrow) OfferMsg[kChunk]);
    if (!chunk.offers) return false;
    std::memset(static_cast<void*>(chunk.offers.get()), 0, sizeof(OfferMsg) * kChunk);
    Status st = dev_.registerInternal(chunk.offers.get(), sizeof(OfferMsg) * kChunk, "offer buffers",
                                      &chunk.offersMr, &chunk.offersDesc);
    if (st != Status::kOk) {
      fatal_ = st;
      return false;
    }
  }
  const int base = allocated_;
  for (int j = 0; j < kChunk; ++j) {
    FabricRequest& r = recvSide_ ? static_cast<FabricRequest&>(chunk.recvs[j]) : chunk.sends[j];
    const int i = base + j;
    r.comm = this;
    r.poolIndex = static_cast<uint16_t>(i);
    for (int k = 0; k < kMaxRecvs; ++k) {
      r.ctx[k].owner = &r;
      r.ctx[k].comm = localId_.get();
      r.ctx[k].index = static_cast<uint16_t>(k);
      r.ctx[k].kind = OpKind::kData;
    }
    if (!recvSide_) continue;
    OpContext& o = chunk.recvs[j].offerCtx;
    o.owner = &r;
    o.comm = localId_.get();
    o.index = static_cast<uint16_t>(i);
    o.kind = OpKind::kOfferSend;
  }
  // The list of chunks grows as it needs (not reserved for poolSize_ up front: 2.5 KiB a send comm); requests
  // live in the chunks' own arrays, which never move.
  chunks_.push_back(std::move(chunk));
  allocated_ = std::min(poolSize_, base + kChunk);
  // Room for every request allocated so far: release() never allocates.
  if (free_.capacity() < static_cast<size_t>(allocated_)) {
    free_.reserve(std::max(static_cast<size_t>(allocated_), 2 * free_.capacity()));
  }
  for (int i = allocated_ - 1; i >= base; --i) free_.push_back(static_cast<uint16_t>(i));
  return true;
}

void FabricDataComm::logRails() const {
  if (nRails_ <= 1) return;
  std::string per;
  for (int k = 0; k < nRails_; ++k) {
    const RailHealth& h = health_[k];
    per += fmt::format("{}{}: {} msgs {} B", per.empty() ? "" : ", ", h.device, h.msgs.load(std::memory_order_relaxed),
                       h.bytes.load(std::memory_order_relaxed));
    if (uint32_t downs = h.downs.load(std::memory_order_relaxed); downs != 0) {
      per += fmt::format(" (down {} times, last: {}{})", downs, railEventName(h.lastDownEvent()),
                         h.up.load(std::memory_order_relaxed) != 0 ? ", back up" : "");
    }
  }
  WEFT_INFO(NCCL_NET, "comm with {} closed; sent per rail: {}", peerName_, per);
}

std::string FabricDataComm::railName(int k) const {
  return nRails_ > 1 ? fmt::format("rail {} ({})", k, health_[k].device) : std::string(health_[k].device);
}

int FabricDataComm::railOfEndpoint(const Endpoint* ep) const {
  for (int k = 0; k < nRails_; ++k) {
    if (rails_[k].ep == ep) return k;
  }
  return 0;
}

// A send or write the provider refused at once because the rail's NIC has no route (its link is down: the
// kernel drops the interface's routes, and rxm's connection attempt fails with it) is pushed back, as for
// FI_EAGAIN, while the link has been down for less than WEFT_PEER_TIMEOUT: a flap is ridden out, as for what was
// already in flight on the rail. True: wait (the rail is marked down); false: the error stands.
bool FabricDataComm::railDownWait(int k, ssize_t rc) {
  if (rc != -FI_ENETUNREACH && rc != -FI_EHOSTUNREACH) return false;
  const int64_t now = coarseNowMs();
  // Measured from the first refusal (the link may be back already while the route, or the provider's
  // connection, is not): a later post that the provider takes ends the wait (unreachableSinceMs_ cleared).
  if (unreachableSinceMs_[k] == 0) unreachableSinceMs_[k] = now;
  if (health_[k].isUp()) {  // (NCCL posts again at once: the line is formatted only for the transition)
    railDown(k, RailEvent::kLinkDown, fmt::format("a send found no route to the peer ({})",
                                                  fi_strerror(static_cast<int>(-rc))));
  }
  // Failed over: pushed back, and posted again (by NCCL, or from test()) on the control rail.
  if (failRail(k, RailEvent::kLinkDown, "a send found no route to the peer")) return true;
  return now - unreachableSinceMs_[k] <= peerTimeoutMs_;
}

// Counted on the rail and in the process (weftNetStat "fabric.rail_downs"), reported once per transition. The
// first comm of an endpoint to see its NIC go down (or come back) warns; the others of the same endpoint (a shared
// one carries every comm of its context) say it at INFO: one NIC flapping under thousands of connections is a few
// lines, not thousands.
void FabricDataComm::railDown(int k, RailEvent why, const std::string& detail) {
  if (!health_[k].markDown(why)) return;
  ++railsDown_;
  railDownSinceMs_[k] = coarseNowMs();
  Endpoint::countRailDown();
  const std::string line = fmt::format(
      "comm with {}: {} is down ({}: {}); {} requests outstanding{}", peerName_, railName(k), railEventName(why),
      detail, outstanding_,
      proto_.failover               ? "; its traffic moves to another rail while one is left (WEFT_RAIL_FAILOVER)"
      : why == RailEvent::kLinkDown ? "; weft does not move traffic off a failed rail yet (docs/failover.md): the "
                                      "comm fails unless the link comes back within WEFT_PEER_TIMEOUT"
                                    : "");
  if (rails_[k].ep->noteLinkReport(false)) {
    WEFT_WARN("{} (other comms on this NIC: INFO lines)", line);
  } else {
    WEFT_INFO(NCCL_NET, "{}", line);
  }
}

void FabricDataComm::railUp(int k, int64_t nowMs) {
  if (!health_[k].markUp()) return;
  --railsDown_;
  Endpoint::countRailRecovery();
  const std::string line =
      fmt::format("comm with {}: {} is back up after {} ms", peerName_, railName(k), nowMs - railDownSinceMs_[k]);
  if (rails_[k].ep->noteLinkReport(true)) {
    WEFT_WARN("{}", line);
  } else {
    WEFT_INFO(NCCL_NET, "{}", line);
  }
  railDownSinceMs_[k] = 0;
}

// Leaving the group's table first: from then on a completion naming this comm is a stray, never delivered to
// freed memory. A private group closes its endpoints with this comm, which cancels whatever is still in flight:
// NCCL may close a comm with requests outstanding (communicator abort), and nothing of ours waits for the network
// here.
FabricDataComm::~FabricDataComm() {
  // A receive comm that failed a rail over may have left a copy of a message (sent again elsewhere) unmatched in
  // that rail's queue, under a tag naming its id: the id is never given out again, so no later comm matches it.
  // Likewise every alias it gave a re-admitted rail.
  bool retire = false;
  for (int k = 0; recvSide_ && k < nRails_; ++k) retire |= health_[k].failovers.load(std::memory_order_relaxed) != 0;
  for (CommId& a : aliases_) a.retire();
  if (parkedIn_ != nullptr) {  // its endpoints may be closed already (the group is closing): not touched
    parkedIn_->table().detach(localId_.get());
    if (retire) localId_.retire();
    return;
  }
  logRails();
  if (joined_) group_->table().detach(localId_.get());
  rails_[0].ep->closeListen(localId_.get());  // a receive comm: the listen it came from refuses replays until now
  for (Rail& r : rails_) r.ep = nullptr;
  group_.reset();
  if (retire) localId_.retire();
}

int FabricDataComm::opsInFlight() const {
  int n = 0;
  for (int i = 0; i < allocated_; ++i) n += req(i).ops;
  for (const Rail& r : rails_) n += (r.note & kNoteInFlight) != 0 ? 1 : 0;  // a close ack: its context is ours
  return n + std::popcount(ackBusy_);
}

// A parked receive comm first sends the acknowledgements it still owes (the sender's sends wait for them).
bool FabricDataComm::drained(DataSink* s) {
  auto* c = static_cast<FabricDataComm*>(s);
  if (!c->ackQ_.empty()) c->flushAcks();
  return c->opsInFlight() == 0 && c->ackQ_.empty();
}

void FabricDataComm::closeComm(bool sendSide) {
  ClosingComms::poll();
  refreshRailHealth();  // what its last log line says
  if (!ackQ_.empty()) flushAcks();  // owed to the sender (a private endpoint: best effort, it closes now)
  if (proto_.acks) {
    WEFT_INFO(NCCL_NET, "comm with {}: delivery acknowledgements {} {} messages in {} acknowledgements{}",
              peerName_, recvSide_ ? "sent for" : "received for", acksTaken_, acksSent_,
              strayAcks_ != 0 ? fmt::format(" ({} naming no send in flight)", strayAcks_) : std::string());
  }
  if (!group_->shared()) {
    // Its own endpoints close with it, canceling whatever is in flight (an abort: NCCL closed it with requests
    // outstanding). A send comm whose sends are all done first makes sure they reached the peer where the
    // provider runs over TCP: it may still hold their last bytes (tcp: in its own buffer, thrown away with the
    // endpoint; or the socket's, lost to the reset that closing with the peer's offers unread sends), and the
    // peer's receive would then wait for them forever (seen: 17 runs in 200 of data.recv_larger on a loaded
    // machine, two rails between namespaces).
    bool sent = false;
    for (const Rail& r : rails_) sent = sent || r.health->msgs.load(std::memory_order_relaxed) > 0;
    if (sendSide && sent && fatal_ == Status::kOk && opsInFlight() == 0 && dev_.streamSockets()) {
      closing_ = true;
      lingering_ = true;
      for (Rail& r : rails_) r.note = kNoteWant;
      notesWaiting_ = nRails_;
      postNotes();
      ClosingComms::add(this, coarseNowMs() + peerTimeoutMs_);
      return;
    }
    delete this;
    return;
  }
  std::shared_ptr<EndpointGroup> keep = group_;  // the group (and its lock) outlive this comm
  {
    std::lock_guard<std::mutex> lock(keep->mutex());
    closing_ = true;
    // Receives nothing will fill any more: canceled (each comes back as a canceled completion).
    for (int i = 0; recvSide_ && i < allocated_; ++i) {
      FabricRecvRequest& r = recvReq(i);
      if (r.magic_ != kRequestMagic) continue;
      for (int b = 0; b < r.n; ++b) {
        if ((r.flags[b] & FabricRecvRequest::kPosted) == 0 || (r.flags[b] & FabricRecvRequest::kCanceled) != 0) {
          continue;
        }
        if (fi_cancel(&rails_[r.rail[b]].ep->ep()->fid, &r.ctx[b].fi) == 0) r.flags[b] |= FabricRecvRequest::kCanceled;
      }
    }
    if (opsInFlight() == 0 && ackQ_.empty()) {
      delete this;  // leaves the table under the lock
    } else {
      WEFT_INFO(NCCL_NET, "comm with {} closed with {} operations in flight: parked until they complete", peerName_,
                opsInFlight());
      logRails();
      rails_[0].ep->closeListen(localId_.get());
      parkedIn_ = keep.get();
      group_.reset();
      keep->park(this, &FabricDataComm::drained);
    }
  }
}  // the last comm of the group gone: the group closes here, outside its lock

Status FabricDataComm::join(bool legacy32) {
  if (Status st = group_->table().attach(localId_.get(), this, legacy32); st != Status::kOk) return st;
  joined_ = true;
  return Status::kOk;
}

FabricRequest* FabricDataComm::acquire() {
  if (free_.empty() && !grow()) return nullptr;
  FabricRequest* r = &req(free_.back());
  free_.pop_back();
  r->magic_ = kRequestMagic;
  ++outstanding_;
  r->n = 0;
  r->doneBufs = 0;
  r->ops = 0;
  r->reported = false;
  r->error = Status::kOk;
  if (recvSide_) {
    FabricRecvRequest& q = asRecv(r);
    q.optional = false;
    q.offerSent = q.offerPosted = q.offerBusy = false;
    if (q.flush) {
      for (OpContext& c : q.ctx) c.kind = OpKind::kData;
      q.flush = false;
      q.flushMh = nullptr;
    }
  } else {
    FabricSendRequest& q = asSend(r);
    q.nSeg = q.nextSeg = q.segsLeft = 1;
    q.needAck = proto_.acks;
    q.sent = q.acked = q.resend = false;
    q.resends = 0;
    q.rma = q.rewrite = false;
    q.rewrites = q.busyCtx = q.liveCtx = 0;
  }
  return r;
}

void FabricDataComm::release(FabricRequest* r) {
  if (recvSide_ && bySeq_) releaseSeqs(&asRecv(r));
  if (recvSide_ && asRecv(r).reoffer != FabricRecvRequest::kReofferNone) {
    asRecv(r).reoffer = FabricRecvRequest::kReofferNone;
    --reoffers_;
  }
  r->magic_ = 0;
  --outstanding_;
  free_.push_back(r->poolIndex);
}

bool FabricDataComm::allocSeq(uint16_t slot, uint16_t* seq) {
  for (uint32_t n = 0; n < nSeqs_; ++n) {
    const uint32_t s = seqCursor_;
    seqCursor_ = (seqCursor_ + 1) & (nSeqs_ - 1);
    if (bySeq_[s] == kSeqFree || bySeq_[s] == kSeqParked) {
      bySeq_[s] = static_cast<uint16_t>(slot + 1);
      *seq = static_cast<uint16_t>(s);
      return true;
    }
  }
  return false;
}

void FabricDataComm::releaseSeqs(FabricRecvRequest* r) {
  for (int i = 0; i < r->n; ++i) {
    if ((r->flags[i] & FabricRecvRequest::kOffered) == 0) continue;
    uint16_t& e = bySeq_[r->seq[i]];
    if (e != r->poolIndex * kMaxRecvs + i + 1) continue;  // freed when its data landed, maybe reused since
    e = (r->flags[i] & FabricRecvRequest::kDone) == 0 && r->optional ? kSeqParked : kSeqFree;
  }
}

// A request goes back to the pool once NCCL has its answer and the provider holds none of its operations.
void FabricDataComm::opDone(FabricRequest* r) {
  --r->ops;
  if (r->ops == 0 && r->reported) release(r);
}

Status FabricDataComm::progress() {
  ClosingComms::pollFromDataPath();
  Status st = Status::kOk;
  for (Rail& rail : rails_) {
    Status s = rail.ep->progress();
    if (s != Status::kOk && st == Status::kOk) st = s;
  }
  if (st != Status::kOk && fatal_ == Status::kOk) fatal_ = st;
  if (group_->shared() && group_->parked() > 0) group_->sweep();
  if (offerError_ != Status::kOk && fatal_ == Status::kOk && outstanding_ > 0 &&
      coarseNowMs() - offerErrorMs_ >= std::max<int64_t>(probeIntervalMs_, 1000)) {
    WEFT_WARN("peer {} on {}: a buffer offer could not be sent (the connection broke) and {} receives still wait "
              "for data: they fail", peerName_, dev_.props().name, outstanding_);
    fatal_ = offerError_;
  }
  flushOffers();
  if (!ackQ_.empty() || fenceOut_ != 0 || readmitOut_ != 0) flushAcks();
  if (fencing_ != 0) fenceStep();
  if ((resetWant_ & senderStopped_) != 0) resetStep();
  if (reoffers_ > 0) flushReoffers();
  if (railNoteWant_ != 0) postRailNote();
  if ((failed_ & fencedIn_) != 0 && (++readmitPolls_ & 15) == 0) readmitStep(coarseNowMs());
  if (notesWaiting_ > 0) postNotes();
  if ((outstanding_ > 0 || waitingOffer_) && probeIntervalMs_ > 0 && (++polls_ & 1023) == 0) checkPeer();
  if (railsDown_ > 0 && (++railPolls_ & 255) == 0) recheckRails(coarseNowMs());
  return st;
}

// Requests have been outstanding with nothing completing. A live peer may simply be busy (NCCL posts receives
// long before the data comes), so silence alone proves nothing: after WEFT_PROBE_INTERVAL ms of it, the peer is
// probed (per peer address, by the endpoint: every comm to one peer shares the probes). A live peer's host takes
// a probe at once, whatever its process is doing; a dead process answers with a connection error (reported by
// the provider on the probe's completion); a probe the provider cannot even hand over within WEFT_PEER_TIMEOUT
// means the host or the link is gone.
// A rail seen down for its link comes back when its link does, whether or not traffic stalls meanwhile: looked at
// from checkPeer, from progress while a rail is down (every 256 calls; sysfs is read at most every 100 ms per
// endpoint), and at close.
void FabricDataComm::recheckRails(int64_t nowMs, bool fresh) {
  for (int k = 0; k < nRails_; ++k) {
    if (!health_[k].isUp() && health_[k].lastDownEvent() == RailEvent::kLinkDown &&
        rails_[k].ep->linkDownForMs(nowMs, fresh) == 0)
      railUp(k, nowMs);
  }
}

void FabricDataComm::checkPeer() {
  if (fatal_ != Status::kOk) return;
  int64_t now = coarseNowMs();
  if (railsDown_ > 0) recheckRails(now);
  if (completions_ != completionsSeen_ || lastActivityMs_ == 0) {  // something completed since the last look
    completionsSeen_ = completions_;
    lastActivityMs_ = now;
    return;
  }
  if (now - lastActivityMs_ < probeIntervalMs_) return;

  // Stalled past the probe interval: a NIC whose link is down (its own cable, or for a veth the peer end) fails
  // the connection once it has stayed down for WEFT_PEER_TIMEOUT. A probe cannot show that over TCP: it is
  // "delivered" into the socket buffer and retransmitted for minutes. (The endpoint reads sysfs at most every
  // 100 ms, whatever the number of comms.)
  // A rail whose link is seen down is marked down at once (and up again if it returns before the timeout).
  for (int k = 0; k < nRails_; ++k) {
    if ((failed_ & (1u << k)) != 0) continue;  // failed over: nothing of this comm waits on it
    int64_t down = rails_[k].ep->linkDownForMs(now);
    if (down == 0) continue;  // (a rail back up was seen above)
    if (health_[k].isUp()) railDown(k, RailEvent::kLinkDown, fmt::format("its link has been down for {} ms", down));
    if (failRail(k, RailEvent::kLinkDown, fmt::format("its link has been down for {} ms", down))) continue;
    if (down > peerTimeoutMs_) {
      WEFT_WARN("peer {} unreachable: the link of {} has been down for {} s with {} requests outstanding; they fail "
                "(WEFT_PEER_TIMEOUT)", peerName_, railName(k), down / 1000, outstanding_);
      fatal_ = Status::kRemote;
      return;
    }
  }
  // Every rail is probed: a link down on one NIC of a device stalls the messages that rail carries.
  for (int k = 0; k < nRails_; ++k) {
    if ((failed_ & (1u << k)) != 0) continue;
    Rail& rail = rails_[k];
    Status why = Status::kOk;
    switch (rail.ep->checkPeer(rail.peer, lastActivityMs_, now, probeIntervalMs_, peerTimeoutMs_, &why)) {
      case Endpoint::PeerVerdict::kOk: break;
      case Endpoint::PeerVerdict::kGone:
        railDown(k, RailEvent::kPeerGone, "a liveness probe failed");
        if (failRail(k, RailEvent::kPeerGone, "a liveness probe failed")) break;  // the last rail's answers for the peer
        WEFT_WARN("peer {} on {} is gone: a liveness probe failed after {} ms without progress (process exited or "
                  "was killed, or the connection broke); its {} outstanding requests fail",
                  peerName_, railName(k), now - lastActivityMs_, outstanding_);
        (void)why;  // the provider's error was logged with the completion; NCCL sees a remote failure
        fatal_ = Status::kRemote;
        return;
      case Endpoint::PeerVerdict::kUnreachable:
        railDown(k, RailEvent::kProbeLost, "a liveness probe was not delivered");
        if (failRail(k, RailEvent::kProbeLost, "a liveness probe was not delivered")) break;
        WEFT_WARN("peer {} on {} unreachable: a liveness probe was not delivered within {} s (host down, link "
                  "down, or traffic filtered); its {} outstanding requests fail (WEFT_PEER_TIMEOUT)",
                  peerName_, railName(k), peerTimeoutMs_ / 1000, outstanding_);
        fatal_ = Status::kRemote;
        return;
    }
  }
}

// Close notices (a lingering send comm) and acks (a receive comm): posted where wanted; a push-back leaves the
// rail wanting, for the next progress call.
void FabricDataComm::postNotes() {
  for (Rail& r : rails_) {
    if ((r.note & kNoteWant) == 0 || (r.note & kNoteInFlight) != 0) continue;
    bool again = false;
    Status st = r.ep->sendCloseNote(r.peer, peerId_, !lingering_, r.noteCtx, &again);
    if (again) continue;
    r.note = static_cast<uint8_t>((r.note & ~kNoteWant) | (st == Status::kOk ? kNoteInFlight : kNoteFailed));
    --notesWaiting_;
  }
}

void FabricDataComm::onCloseNote(Endpoint* ep, bool ack) noexcept {
  for (Rail& r : rails_) {
    if (r.ep != ep) continue;
    if (ack) {
      if (lingering_) r.note |= kNoteAcked;
      return;
    }
    if (lingering_ || (r.note & kNoteWant) != 0) return;  // a notice to a send comm: not ours to answer
    r.note |= kNoteWant;
    ++notesWaiting_;
    postNotes();  // an ack in flight already: this one goes when it has completed
    return;
  }
}

// A notice is sent once per rail. A peer that closed its side before reading it never acks: the comm then waits
// for WEFT_PEER_TIMEOUT (or finalize). Sending it again to find out costs more: over rxm each send to a closed
// peer sets up a new connection attempt, and repeating every 100 ms grew a process by 140 MiB over the
// hygiene.connect_cycles check that followed.
bool FabricDataComm::lingerStep() {
  if (notesWaiting_ > 0) postNotes();
  for (Rail& rail : rails_) {
    if (rail.ep->progress() != Status::kOk) return true;  // the queue itself failed: nothing more will come
  }
  if (fatal_ != Status::kOk) return true;
  for (const Rail& r : rails_) {
    if ((r.note & (kNoteAcked | kNoteFailed)) == 0) return false;
  }
  return true;
}

// The messages taken and not yet acknowledged, up to AckMsg::kMaxKeys of them in one acknowledgement, on the control
// rail (where the sender's offer receives are), while a slot is free: a message taken is acknowledged at once, and
// those taken while every slot is in flight leave together when one completes.
void FabricDataComm::flushAcks() {
  if ((ackQ_.empty() && fenceOut_ == 0 && readmitOut_ == 0) || fatal_ != Status::kOk) return;
  if (dev_.injectSize() >= wire::AckMsg::bytes(1)) {
    while (!ackQ_.empty() || fenceOut_ != 0 || readmitOut_ != 0) {
      if (!postAck()) return;
    }
    return;
  }
  if (!ackMsg_) {
    ackMsg_.reset(new (std::nothrow) wire::AckMsg[kAckSlots]);
    if (!ackMsg_) return;  // tried again at the next progress call
    if (Status st = dev_.registerInternal(ackMsg_.get(), sizeof(wire::AckMsg) * kAckSlots,
                                          "acknowledgement buffers", &ackMr_, &ackDesc_);
        st != Status::kOk) {
      fatal_ = st;
      return;
    }
  }
  while ((!ackQ_.empty() || fenceOut_ != 0 || readmitOut_ != 0) && ackBusy_ != (1u << kAckSlots) - 1) {
    if (!postAck()) return;
  }
}

bool FabricDataComm::postAck() {
  const size_t injectMax = dev_.injectSize();
  const bool inject = injectMax >= wire::AckMsg::bytes(1);
  wire::AckMsg local;
  const int slot = inject ? -1 : std::countr_one(ackBusy_);
  wire::AckMsg& m = inject ? local : ackMsg_[slot];
  const bool readmit = readmitOut_ != 0;
  const int rk = readmit ? std::countr_zero(readmitOut_) : 0;  // the rail re-admitted
  size_t most = wire::AckMsg::kMaxKeys;
  if (inject) most = std::min(most, (injectMax - offsetof(wire::AckMsg, key)) / sizeof(uint64_t) - (readmit ? 1 : 0));
  const int n = static_cast<int>(std::min(ackQ_.size(), most));
  m.magic = wire::AckMsg::kMagic;
  m.count = static_cast<uint8_t>(n);
  // The fence rides on the acknowledgement that empties the queue: every message taken before it comes with it.
  // A re-admission rides on the first one: never after a fence of the same rail (the sender takes the re-admission
  // first, then the fence).
  m.fenced = static_cast<size_t>(n) == ackQ_.size() ? fenceOut_ : 0;
  m.epoch = ctlEpoch_;
  m.readmit = static_cast<uint8_t>(readmit ? rk + 1 : 0);
  m.toComm = peerId_;
  m.alias = readmit ? railComm_[rk] : 0;
  std::copy(ackQ_.begin(), ackQ_.begin() + n, m.key);
  if (readmit) m.key[n] = switchAt_[rk];
  const size_t bytes = wire::AckMsg::bytes(n, readmit);
  const int on = ctlRail_;
  ssize_t rc = inject ? fi_tinject(ctl().ep(), &m, bytes, ctlPeer(), wire::ctrlTag(wire::CtrlKind::kOffer))
                      : fi_tsend(ctl().ep(), &m, bytes, ackDesc_, ctlPeer(), wire::ctrlTag(wire::CtrlKind::kOffer),
                                 &ackCtx_[slot].fi);
  if (rc == -FI_EAGAIN || railDownWait(on, rc)) return false;  // the next progress call (or completion) tries again
  if (rc != 0) {
    WEFT_WARN("comm with {}: sending a delivery acknowledgement on {} failed: {}", peerName_, railName(on),
              fi_strerror(static_cast<int>(-rc)));
    fatal_ = statusOfFiError(static_cast<int>(-rc));
    return false;
  }
  unreachableSinceMs_[on] = 0;
  if (!inject) ackBusy_ |= static_cast<uint8_t>(1u << slot);
  ++acksSent_;
  acksTaken_ += static_cast<uint64_t>(n);
  ackQ_.erase(ackQ_.begin(), ackQ_.begin() + n);
  fenceOut_ &= static_cast<uint8_t>(~m.fenced);
  if (readmit) readmitOut_ &= static_cast<uint8_t>(~(1u << rk));
  return true;
}

// Each key names a send of this comm in flight (the receiver took it); one naming none (its request failed and
// went back to the pool) is counted and dropped. A malformed acknowledgement is a protocol violation.
void FabricDataComm::onAck(const wire::AckMsg& m, size_t len) {
  if (!proto_.acks || m.count > wire::AckMsg::kMaxKeys || len < wire::AckMsg::bytes(m.count, m.readmit != 0)) {
    WEFT_WARN("peer {} on {} sent a malformed (or unagreed) delivery acknowledgement: connection closed for safety",
              peerName_, dev_.props().name);
    if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
    return;
  }
  if (proto_.failover) {  // one sent before the receiver's control rail moved, arriving late: had again since
    const auto ahead = static_cast<uint8_t>(m.epoch - ctlEpoch_);
    if (ahead >= 128) {
      ++strayAcks_;
      return;
    }
    ctlEpoch_ = m.epoch;
  }
  acksSent_ += 1;
  acksTaken_ += m.count;
  for (int j = 0; j < m.count; ++j) {
    const uint64_t key = m.key[j];
    bool found = false;
    for (int i = 0; i < allocated_ && !found; ++i) {
      FabricSendRequest& r = asSend(&req(i));
      if (r.magic_ != kRequestMagic || !r.needAck || r.acked || r.ackKey != key) continue;
      r.acked = true;
      if (r.sent) r.doneBufs = 1;
      found = true;
    }
    if (!found) ++strayAcks_;
  }
  if (m.readmit != 0) {
    const int k = m.readmit - 1;
    const uint64_t at = m.key[m.count];
    const bool again = k < nRails_ && (failed_ & (1u << k)) == 0 && railComm_[k] == m.alias && switchAt_[k] == at;
    if (!proto_.failover || k >= nRails_ || ((failed_ & (1u << k)) == 0 && !again) || m.alias == 0 ||
        m.alias > wire::kMaxCommId) {
      WEFT_WARN("peer {} on {} re-admitted a rail it cannot (rail {}, alias {}): connection closed for safety",
                peerName_, dev_.props().name, k, m.alias);
      if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
      return;
    }
    // By construction this end cannot have reached the threshold yet (fabric_comm.h): a message at or beyond it
    // already sent on the control rail would wait there for a receive posted on the rail.
    if (!again && seqs_.maxNext() > at) {
      WEFT_WARN("comm with {}: the peer re-admitted {} from message {}, but messages up to {} have left on {}: "
                "connection closed for safety", peerName_, railName(k), at, seqs_.maxNext() - 1, railName(ctlRail_));
      if (fatal_ == Status::kOk) fatal_ = Status::kInternal;
      return;
    }
    if (!again) admitRail(k, m.alias, at, true);  // (again: said once more after the control rail moved)
  }
  if ((m.fenced >> nRails_) != 0 || (m.fenced != 0 && !proto_.failover)) {
    WEFT_WARN("peer {} on {} fenced a rail it cannot (rails {:#x}): connection closed for safety", peerName_,
              dev_.props().name, m.fenced);
    if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
    return;
  }
  if (m.fenced != 0) {
    resendFenced(m.fenced);
    fencedIn_ |= m.fenced;
  }
}

// ---- rail failover (Protocol::failover, docs/failover.md step 3) ----

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
  ++completions_;
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
  for (int i = 0; i < allocated_; ++i) {
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
  for (int i = 0; i < allocated_; ++i) {
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

// ---- rail failover with the rdma protocol (docs/failover.md, "RMA failover") ----

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
  for (int i = 0; i < allocated_; ++i) {
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
  for (int i = 0; i < allocated_ && reoffers_ > 0; ++i) {
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

// ---- re-admission of a failed-over rail (docs/failover.md, "Recovery") ----

// Send side, when rail k fails over: the first try after WEFT_RAIL_READMIT, or after twice the last wait when the rail
// fails again within a minute of being taken back (a flapping rail is tried less and less often, up to 30 s).
void FabricDataComm::readmitSchedule(int k, int64_t nowMs) {
  Readmit& r = readmit_[k];
  int64_t wait = readmitFirstMs_;
  if (r.admittedMs != 0 && nowMs - r.admittedMs < 60000) wait = std::min(std::max(r.waitMs * 2, wait), kReadmitMaxMs);
  r.waitMs = wait;
  r.state = Readmit::kIdle;
  r.nextMs = nowMs + wait;
}

// The hello and its answer go on the rail itself, the rest on the control rail.
bool FabricDataComm::sendRailUp(int k, wire::RailUpStep step, uint16_t attempt) {
  const int on = step == wire::kRailHello || step == wire::kRailHelloAck ? k : ctlRail_;
  return injectNote(on, wire::kRailUp, wire::railUpWord(peerId_, k, step, attempt)) == 0;
}

// Send side, from progress while a fenced rail waits: see fabric_comm.h.
void FabricDataComm::readmitStep(int64_t nowMs) {
  if (fatal_ != Status::kOk || readmitFirstMs_ <= 0) return;
  for (int k = 0; k < nRails_; ++k) {
    const auto bit = static_cast<uint8_t>(1u << k);
    if ((failed_ & fencedIn_ & bit) == 0) continue;
    Readmit& r = readmit_[k];
    auto later = [&] {  // this try failed: the next one waits twice as long
      r.waitMs = std::min(std::max(r.waitMs * 2, readmitFirstMs_), kReadmitMaxMs);
      r.nextMs = nowMs + r.waitMs;
      r.state = Readmit::kIdle;
      WEFT_INFO(NCCL_NET, "comm with {}: {} not taken back yet; next try in {} ms", peerName_, railName(k), r.waitMs);
    };
    switch (r.state) {
      case Readmit::kIdle:
        if (nowMs < r.nextMs) break;
        if (rails_[k].ep->linkDownForMs(nowMs) > 0) {  // its link is still down: looked at again shortly
          r.nextMs = nowMs + 100;
          break;
        }
        {
          // The rail's connection as the failure left it may be dead for good (a QP in the error state, which rxm
          // keeps): closed first, unless another comm to the peer closed it since (that one's new connection is
          // fresh, and other comms may be using it).
          Endpoint& ep = *rails_[k].ep;
          if (resetRails_ && r.againSinceMs == 0 && ep.resetGen(rails_[k].peer) == r.resetGen) {
            if (Status st = ep.resetPeer(rails_[k].peer); st != Status::kOk) {
              later();
              break;
            }
          }
          r.resetGen = ep.resetGen(rails_[k].peer);
          const ssize_t rc = injectNote(k, wire::kRailUp, wire::railUpWord(peerId_, k, wire::kRailHello, r.attempt + 1));
          if (rc == 0) {
            ++r.attempt;
            r.state = Readmit::kHello;
            r.sentMs = nowMs;
            r.againSinceMs = 0;
          } else if (rc == -FI_EAGAIN && (r.againSinceMs == 0 || nowMs - r.againSinceMs < peerTimeoutMs_)) {
            // The provider is opening a new connection on the rail (its old one was closed): shortly again.
            if (r.againSinceMs == 0) r.againSinceMs = nowMs;
            r.nextMs = nowMs + 10;
          } else {
            WEFT_INFO(NCCL_NET, "comm with {}: the health check of {} could not be sent: {}", peerName_, railName(k),
                      fi_strerror(static_cast<int>(-rc)));
            r.againSinceMs = 0;
            later();
          }
        }
        break;
      case Readmit::kHello:  // no answer on the rail within a probe interval (at least 1 s)
        if (nowMs - r.sentMs > std::max<int64_t>(probeIntervalMs_, 1000)) later();
        break;
      case Readmit::kHelloAcked:
        if (sendRailUp(k, wire::kRailReady, r.attempt)) {
          r.state = Readmit::kReady;
          r.sentMs = nowMs;
        }
        break;
      case Readmit::kReady:  // the receiver did not take it (it may not: no id free); its answer, if late, holds
        if (nowMs - r.sentMs > peerTimeoutMs_) later();
        break;
    }
  }
}

// Both ends: from now on rail k carries the messages of count `at` and beyond (the tags under `alias`).
void FabricDataComm::admitRail(int k, uint32_t alias, uint64_t at, bool sendSide) {
  const int64_t now = coarseNowMs();
  const auto bit = static_cast<uint8_t>(1u << k);
  failed_ &= static_cast<uint8_t>(~bit);
  fencedIn_ &= static_cast<uint8_t>(~bit);
  resetWant_ &= static_cast<uint8_t>(~bit);
  senderStopped_ &= static_cast<uint8_t>(~bit);
  switchAt_[k] = at;
  railComm_[k] = alias;
  unreachableSinceMs_[k] = 0;
  Readmit& r = readmit_[k];
  r.state = Readmit::kIdle;
  r.admittedMs = now;
  RailHealth::bump(health_[k].readmits, 1);
  health_[k].msgsAtReadmit.store(health_[k].msgs.load(std::memory_order_relaxed), std::memory_order_relaxed);
  Endpoint::countRailReadmit();
  if (!health_[k].isUp()) railUp(k, now);
  try {
    WEFT_INFO(NCCL_NET, "comm with {}: {} taken back ({}): messages from number {} of each tag travel on it again",
              peerName_, railName(k), sendSide ? "the receiver agreed" : "the sender asked", at);
  } catch (...) {
  }
}

void FabricDataComm::onRailUp(Endpoint* ep, uint64_t word) noexcept {
  ++completions_;
  const int k = wire::railUpRail(word);
  const uint8_t step = wire::railUpStep(word);
  const uint16_t attempt = wire::railUpAttempt(word);
  if (!proto_.failover || k < 0 || k >= nRails_) {
    WEFT_WARN("peer {} on {} sent a rail re-admission note this connection did not agree to (rail {}): ignored",
              peerName_, dev_.props().name, k);
    return;
  }
  const bool onRail = ep == rails_[k].ep;
  const bool onCtl = (failed_ & (1u << railOfEndpoint(ep))) == 0 && !onRail;  // a rail both ends still use
  const auto bit = static_cast<uint8_t>(1u << k);
  if (recvSide_) {
    // Only a rail this end failed over and fenced, and not while it still announces a re-admission.
    // rdma: and not before its connection was reset (resetStep).
    const bool ready = readmitFirstMs_ > 0 && (failed_ & bit) != 0 && (fencing_ & bit) == 0 &&
                       (resetWant_ & bit) == 0 && fatal_ == Status::kOk;
    if (step == wire::kRailHello && onRail) {
      const ssize_t rc =
          ready ? injectNote(k, wire::kRailUp, wire::railUpWord(peerId_, k, wire::kRailHelloAck, attempt)) : 1;
      if (rc != 0) {  // the sender tries again later
        WEFT_INFO(NCCL_NET, "comm with {}: health check {} of {} not answered ({})", peerName_, attempt, railName(k),
                  ready ? fi_strerror(static_cast<int>(-rc)) : "not ready to take the rail back yet");
      }
    } else if (step == wire::kRailReady && onCtl) {
      if (!ready || readmitOut_ != 0) return;
      if (aliases_.size() >= 64) {  // a rail that keeps failing stays failed over (each try retires an id)
        WEFT_INFO(NCCL_NET, "comm with {}: {} re-admitted {} times: it stays failed over", peerName_, railName(k),
                  aliases_.size());
        return;
      }
      CommId alias;
      try {
        alias = railAliasId();
        aliases_.reserve(aliases_.size() + 1);
      } catch (...) {
        return;
      }
      if (!alias) return;  // no id free: the sender tries again later
      const uint64_t at = seqs_.maxNext() + kMostSends;
      admitRail(k, alias.get(), at, false);
      aliases_.push_back(std::move(alias));
      readmitOut_ |= bit;
      flushAcks();
    }
    return;
  }
  Readmit& r = readmit_[k];
  if (step == wire::kRailHelloAck && onRail && r.state == Readmit::kHello && attempt == r.attempt) {
    r.state = Readmit::kHelloAcked;
    if (sendRailUp(k, wire::kRailReady, r.attempt)) {  // else from progress
      r.state = Readmit::kReady;
      r.sentMs = coarseNowMs();
    }
  }
}

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
  ++completions_;

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

void FabricDataComm::onError(Endpoint* ep, OpContext* ctx, int fiErr, Status st) noexcept {
  if (ctx->kind == OpKind::kNote) {
    // The peer is gone or closed its side: nothing of ours can reach it any more, and nobody waits for it.
    (void)fiErr;
    (void)st;
    Rail& r = rails_[ctx->index];
    r.note = static_cast<uint8_t>((r.note & ~kNoteInFlight) | kNoteFailed);
    return;
  }
  if (ctx->kind == OpKind::kAck) {
    // The sender's sends wait for it: without it they can never complete, so the connection is done for (the
    // sender sees the same break through its own liveness check).
    ackBusy_ &= static_cast<uint8_t>(~(1u << ctx->index));
    ackQ_.clear();
    if (fatal_ == Status::kOk && !closing_) {
      WEFT_WARN("comm with {}: a delivery acknowledgement could not be sent ({}): the comm fails", peerName_,
                fi_strerror(fiErr));
      fatal_ = st;
    }
    (void)ep;
    return;
  }
  ++completions_;
  auto* r = static_cast<FabricRequest*>(ctx->owner);
  if (ctx->kind == OpKind::kFlush) {
    WEFT_WARN("flush: the read on rail {} of the comm from {} failed: {}", ctx->index, peerName_, fi_strerror(fiErr));
    if (r->error == Status::kOk) r->error = st;
    opDone(r);
    return;
  }
  if (ctx->kind == OpKind::kData && recvSide_) {
    rails_[asRecv(r).rail[ctx->index]].ep->dataRecvDone();
    uint8_t& f = asRecv(r).flags[ctx->index];
    if (fiErr == FI_ECANCELED && (f & FabricRecvRequest::kCanceled) != 0) {
      // Our own cancel: of a receive that RMA filled instead, of a claim that found no message waiting, or of a
      // receive on a rail failed over (both posted again later, the latter on the control rail). Not an error.
      const bool moved = (f & FabricRecvRequest::kMoved) != 0;
      const bool again = ((f & FabricRecvRequest::kClaim) != 0 || moved) && (f & FabricRecvRequest::kDone) == 0 &&
                         !closing_;
      f &= static_cast<uint8_t>(~(FabricRecvRequest::kPosted | FabricRecvRequest::kCanceled |
                                  FabricRecvRequest::kClaim | FabricRecvRequest::kMoved));
      if (again) f |= FabricRecvRequest::kNeedPost;
      if (moved) moveToCtl(asRecv(r), ctx->index);
      opDone(r);
      return;
    }
    // A receive on a rail that failed (over, or now): posted again on the control rail.
    if (fiErr != FI_ECANCELED && (f & FabricRecvRequest::kDone) == 0 && !closing_ && failRailOnError(ep, fiErr, st)) {
      f = FabricRecvRequest::kNeedPost;
      moveToCtl(asRecv(r), ctx->index);
      opDone(r);
      return;
    }
  }
  if (ctx->kind == OpKind::kOfferSend) asRecv(r).offerBusy = false;
  if (ctx->kind == OpKind::kOfferSend && proto_.rdma && failRailOnError(ep, fiErr, st)) {
    opDone(r);  // lost with a failed rail: its buffers are offered again once the rail is reset (resetStep)
    return;
  }
  if (ctx->kind == OpKind::kOfferSend && fiErr != FI_ECANCELED) {
    // The offer did not reach the sender: typically its process closed the connection right after its last sends
    // completed (NCCL's teardown does), and a message of eager size needs no offer: what the sender sent before
    // closing is still delivered. So the receive is not failed at once: the comm fails if it still waits for
    // data a grace period later (FabricDataComm::progress).
    if (offerError_ == Status::kOk) {
      offerError_ = st;
      offerErrorMs_ = coarseNowMs();
    }
    opDone(r);
    return;
  }
  if (ctx->kind == OpKind::kData && !recvSide_) {
    FabricSendRequest& q = asSend(r);
    // Rail failover: an operation of a message acknowledged since (its copy sent again, or written again, got
    // there), or of a write done again since, failing with the connection it was stuck in: nothing is lost.
    bool stale = proto_.failover && q.acked;
    if (q.rma) {
      const auto bit = static_cast<uint8_t>(1u << ctx->index);
      stale = stale || (proto_.failover && (q.liveCtx & bit) == 0);
      q.busyCtx &= static_cast<uint8_t>(~bit);
      q.liveCtx &= static_cast<uint8_t>(~bit);
    }
    if (stale) {
      opDone(r);
      return;
    }
  }
  if (ctx->kind == OpKind::kData && !recvSide_ && asSend(r).needAck && !asSend(r).acked &&
      failRailOnError(ep, fiErr, st)) {
    // Unacknowledged: a tagged send is sent again on the control rail once the receiver has fenced the rail; an RMA
    // write is written again once the receiver offers its buffer again.
    opDone(r);
    return;
  }
  if (r->error == Status::kOk) r->error = st;
  // A failed transfer breaks the ordered stream NCCL relies on: the connection is done for.
  if (fatal_ == Status::kOk) {
    const int k = railOfEndpoint(ep);
    try {
      if (st == Status::kRemote) railDown(k, RailEvent::kErrorCompletion, fi_strerror(fiErr));  // (a truncation: not)
      WEFT_WARN("comm with {}: an operation on {} failed ({}); the comm fails", peerName_, railName(k),
                fi_strerror(fiErr));
    } catch (...) {  // a log line that cannot be formatted changes nothing
    }
    fatal_ = st;
  }
  opDone(r);
}

// The completion data names this comm and the sequence of the buffer the sender wrote into. A write naming
// another comm is dropped (counted, with a warning); anything else that does not name a live offered buffer is a
// protocol violation by the peer: the connection fails, nothing is touched.
void FabricDataComm::onRemoteData(uint64_t d, size_t len) noexcept {
  ++completions_;
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
  FabricRecvRequest* r = slot >= 0 && index < allocated_ && recvSide_ ? &recvReq(index) : nullptr;
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

Status FabricDataComm::postPending(FabricRecvRequest* r) {
  for (int i = 0; i < r->n; ++i) {
    if ((r->flags[i] & FabricRecvRequest::kNeedPost) == 0) continue;
    const Rail& rail = rails_[r->rail[i]];
    if (r->flush) {
      const MemHandle* h = r->flushMh->rail(i);
      bool again = false;
      Status st = rail.ep->postFlushRead(rail.ep->device().remoteAddr(reinterpret_cast<uintptr_t>(r->data[i]),
                                                                     h->entry->base),
                                         h->entry->key, &r->ctx[i], &again);
      if (again) return Status::kOk;  // posted when earlier operations made room
      if (st != Status::kOk) {
        r->error = st;
        return st;
      }
      r->flags[i] = FabricRecvRequest::kPosted;
      ++r->ops;
      continue;
    }
    const bool claim = !rail.ep->dataRecvRoom();
    ssize_t rc = fi_trecv(rail.ep->ep(), r->data[i], r->len[i], r->desc[i],
                          dev_.directedRecv() ? rail.peer : FI_ADDR_UNSPEC, r->tag[i], 0, &r->ctx[i].fi);
    // A full receive queue: -FI_EAGAIN, or -FI_ENOMEM from shm (1.17 says so when its rx_size entries, shared by
    // every comm of the endpoint, are all posted). Either way the receive is posted once earlier ones complete.
    if (rc == -FI_EAGAIN || rc == -FI_ENOMEM) return Status::kOk;
    if (rc != 0) {
      WEFT_WARN("fi_trecv ({} B) from {} on {} failed: {}", r->len[i], peerName_, dev_.props().name,
                fi_strerror(static_cast<int>(-rc)));
      r->error = Status::kSystem;
      fatal_ = Status::kSystem;
      return Status::kSystem;
    }
    r->flags[i] = static_cast<uint8_t>((r->flags[i] & ~FabricRecvRequest::kNeedPost) | FabricRecvRequest::kPosted);
    ++r->ops;
    rail.ep->dataRecvPosted();
    // Over the endpoint's budget (Endpoint::dataRecvRoom): the receive stays only if it matched a message that
    // came before it (the provider hands it over at once; the cancel then finds nothing). Otherwise the cancel
    // takes it back, its completion marks it to be posted again, and its entry stays free for early messages.
    if (claim && fi_cancel(&rail.ep->ep()->fid, &r->ctx[i].fi) == 0) {
      r->flags[i] |= FabricRecvRequest::kCanceled | FabricRecvRequest::kClaim;
    }
  }
  return Status::kOk;
}

Status FabricDataComm::testRequest(FabricRequest* r, bool* done, int* sizesOut) {
  *done = false;
  bool busy = false;
  auto lock = group_->tryLockIfShared(&busy);
  if (busy) return Status::kOk;  // another thread works on the group: not done yet
  if (r->reported) {
    WEFT_WARN("test on a request that already completed");
    return Status::kInternal;
  }
  if (r->doneBufs < r->n && r->error == Status::kOk) {
    if (recvSide_) {
      postPending(&asRecv(r));
    } else if (asSend(r).nextSeg < asSend(r).nSeg || asSend(r).resend || asSend(r).rewrite) {
      resumeSend(&asSend(r));
    }
    progress();
    if (recvSide_) postPending(&asRecv(r));
  }
  if (r->error != Status::kOk || (fatal_ != Status::kOk && r->doneBufs < r->n)) {
    Status st = r->error != Status::kOk ? r->error : fatal_;
    // Operations of this request still in libfabric's hands would complete into a recycled request: the request
    // stays out of the pool until they have (if ever: the comm is dead anyway; its memory goes with close).
    r->reported = true;
    if (r->ops == 0) release(r);
    return st;
  }
  // LL/LL128 with NCCL_NET_OPTIONAL_RECV_COMPLETION: NCCL watches the data's own flags, so the receive may be
  // reported done as soon as the sender can write (its offer has left).
  bool early = recvSide_ && asRecv(r).optional && asRecv(r).offerSent;
  if (r->doneBufs < r->n && !early) return Status::kOk;
  *done = true;
  if (sizesOut != nullptr && !(recvSide_ && asRecv(r).flush)) {  // a flush has no sizes (NCCL passes NULL)
    if (recvSide_) {
      for (int i = 0; i < r->n; ++i) sizesOut[i] = asRecv(r).sizes[i];
    } else {
      sizesOut[0] = asSend(r).size;
    }
  }
  r->reported = true;
  if (r->ops == 0) release(r);
  return Status::kOk;
}

Status FabricDataComm::checkHandle(const MemHandle* mh, const char* op) const {
  if (mh == nullptr) {
    if (dev_.localMr()) {
      WEFT_WARN("{}: NULL memory handle, but provider {} needs registered buffers", op, dev_.props().provider);
      return Status::kInternal;
    }
    return Status::kOk;
  }
  if (mh->magic_ != kMrMagic) {
    WEFT_WARN("{}: {} is not a live weft memory handle", op, static_cast<const void*>(mh));
    return Status::kInternal;
  }
  if (nRails_ > 1 && mh->rail(nRails_ - 1) == nullptr) {
    WEFT_WARN("{}: memory handle {} was registered on fewer NICs than this {}-rail comm uses (registered "
              "through a comm of another device?)",
              op, static_cast<const void*>(mh), nRails_);
    return Status::kInternal;
  }
  return Status::kOk;
}

Status FabricDataComm::regOnDevice(void* data, size_t size, int type, int fd, uint64_t offset, MemHandle** out) {
  if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
    WEFT_WARN("regMr: unknown memory type {:#x}", type);
    return Status::kInternal;
  }
  *out = nullptr;
  if (fd >= 0 && (dev_.props().ptrSupport & NCCL_PTR_DMABUF) == 0) {
    WEFT_WARN("regMrDmaBuf on {}, which does not advertise NCCL_PTR_DMABUF: refused", dev_.props().name);
    return Status::kInvalidUsage;
  }
  MemHandle* head = nullptr;
  MemHandle** link = &head;
  for (int k = 0; k < nRails_; ++k) {
    MemHandle* h = nullptr;
    MrCache& cache = rails_[k].ep->device().mrCache();
    Status st = fd >= 0 ? cache.regDmaBuf(data, size, type, offset, fd, &h) : cache.reg(data, size, type, &h);
    if (st != Status::kOk) {
      if (head != nullptr) deregOnDevice(head);
      return st;
    }
    *link = h;
    link = &h->nextRail;
  }
  *out = head;
  return Status::kOk;
}

Status FabricDataComm::deregOnDevice(MemHandle* mh) {
  if (mh == nullptr || mh->magic_ != kMrMagic) return rails_[0].ep->device().mrCache().dereg(mh);  // it says why
  Status first = Status::kOk;
  for (int k = 0; k < nRails_ && mh != nullptr; ++k) {
    MemHandle* next = mh->nextRail;
    Status st = rails_[k].ep->device().mrCache().dereg(mh);
    if (first == Status::kOk) first = st;
    mh = next;
  }
  return first;
}

// ---- send ------------------------------------------------------------------------------------------------------

Status FabricDataComm::checkTag(int tag, const char* op) const {
  if (wire::validNcclTag(tag)) return Status::kOk;
  WEFT_WARN("{}: tag {} is outside [0, {}] (NCCL passes ranks as tags)", op, tag, wire::kMaxNcclTag);
  return Status::kInvalidUsage;
}

FabricSendComm::FabricSendComm(std::shared_ptr<EndpointGroup> group, std::vector<Rail> rails, std::string peerName,
                               int maxRecvs, Protocol proto, CommId localId, uint32_t peerId)
    : FabricDataComm(std::move(group), std::move(rails), std::move(peerName), kMaxRequests * maxRecvs, proto,
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
  ++completions_;
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
  for (int i = 0; i < allocated_; ++i) {
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

// ---- closed send comms waiting for their close acks -------------------------------------------------------------

namespace {

struct Closing {
  FabricDataComm* comm;
  int64_t deadlineMs;
};

struct ClosingState {
  std::mutex mu;
  std::vector<Closing> list;
  std::atomic<int64_t> lastMs{0};  // the last look (coarse milliseconds)
};

ClosingState& closingState() {
  static ClosingState* s = new ClosingState;  // never destroyed: nothing of libfabric is touched at exit
  return *s;
}

}  // namespace

std::atomic<size_t> ClosingComms::count_{0};

void ClosingComms::add(FabricDataComm* comm, int64_t deadlineMs) {
  ClosingState& s = closingState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.list.push_back(Closing{comm, deadlineMs});
  count_.store(s.list.size(), std::memory_order_relaxed);
}

void ClosingComms::pollSlow(bool wait, bool rateLimited) {
  ClosingState& s = closingState();
  const int64_t now = coarseNowMs();
  if (rateLimited && now == s.lastMs.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> lock(s.mu, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return;  // another thread is at it
  }
  s.lastMs.store(now, std::memory_order_relaxed);
  for (size_t i = 0; i < s.list.size();) {
    Closing& c = s.list[i];
    const bool done = c.comm->lingerStep();
    if (!done && now < c.deadlineMs) {
      ++i;
      continue;
    }
    if (!done) {
      WEFT_INFO(NCCL_NET, "a closed send comm's close notice was not acknowledged within WEFT_PEER_TIMEOUT (the "
                "peer closed its side, or runs an older weft): its endpoints close now");
    }
    delete c.comm;
    c = s.list.back();
    s.list.pop_back();
  }
  count_.store(s.list.size(), std::memory_order_relaxed);
}

void ClosingComms::drain(int64_t budgetMs) {
  const int64_t end = coarseNowMs() + budgetMs;
  while (size() != 0 && coarseNowMs() < end) pollSlow(true, false);
  ClosingState& s = closingState();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.list.empty()) {
    WEFT_INFO(NCCL_NET, "finalize: {} closed send comms still wait for their peers' close acks after {} ms; their "
              "endpoints close now", s.list.size(), budgetMs);
  }
  for (Closing& c : s.list) delete c.comm;
  s.list.clear();
  count_.store(0, std::memory_order_relaxed);
}

int planWrite(uint64_t size, int nRails, uint64_t stripeMin, bool imm4, int singleRail, uint64_t* off,
              uint64_t* len, uint32_t* field, uint8_t* rail, const uint8_t* railIds) {
  int stripes = 1;
  uint64_t segLen = size;
  if (nRails > 1 && size >= stripeMin) {
    constexpr uint64_t kAlign = 4096;
    segLen = ((size + nRails - 1) / nRails + kAlign - 1) / kAlign * kAlign;  // never more stripes than rails
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
        waitingOffer_ = offer == nullptr;
        if (offer == nullptr) return fatal_;
      }
    }
  }
  waitingOffer_ = false;
  FabricRequest* acquired = acquire();
  if (acquired == nullptr) return fatal_;  // all requests in flight: NCCL retries later (or the pool could not grow)
  FabricSendRequest* r = &asSend(acquired);
  r->n = 1;
  r->size = static_cast<int>(size > INT_MAX ? INT_MAX : size);
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
    progress();
    return Status::kOk;
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

// ---- receive ---------------------------------------------------------------------------------------------------

FabricRecvComm::FabricRecvComm(std::shared_ptr<EndpointGroup> group, std::vector<Rail> rails, std::string peerName,
                               int maxRecvs, Protocol proto, CommId localId, uint32_t peerId)
    : FabricDataComm(std::move(group), std::move(rails), std::move(peerName), 2 * kMaxRequests, proto,
                     std::move(localId), peerId, true),
      maxRecvs_(maxRecvs) {
  offerQueue_.reserve(poolSize_);
}

Status FabricRecvComm::start() {
  // Remote writes into its buffers name it, except in the 4-byte form that carries the length.
  if (Status st = join(proto_.imm4 && !proto_.immId); st != Status::kOk) return st;
  if (!proto_.rdma) return Status::kOk;
  nSeqs_ = proto_.imm4 && !proto_.immId ? WriteImm32::kSeqs : WriteImm::kSeqs;
  bySeq_.reset(new uint16_t[nSeqs_]());
  wantOffers_ = true;  // registered with each chunk of requests (grow())
  return Status::kOk;
}

bool FabricRecvComm::sendOffer(FabricRecvRequest* r) {
  OfferMsg& m = offer(r->poolIndex);
  m.epoch = ctlEpoch_;
  ssize_t rc = fi_tsend(ctl().ep(), &m, OfferMsg::bytes(m.count), offerDesc(r->poolIndex), ctlPeer(),
                        wire::ctrlTag(wire::CtrlKind::kOffer), &r->offerCtx.fi);
  if (rc == 0) {
    ++r->ops;
    r->offerPosted = r->offerBusy = true;
    return true;
  }
  if (rc != -FI_EAGAIN) {
    WEFT_WARN("sending a buffer offer to {} on {} failed: {}", peerName_, dev_.props().name,
              fi_strerror(static_cast<int>(-rc)));
    if (r->error == Status::kOk) r->error = statusOfFiError(static_cast<int>(-rc));
    if (fatal_ == Status::kOk) fatal_ = r->error;
    return true;
  }
  return false;
}

// Offers the provider pushed back on leave in irecv order (the sender matches by tag, so order is only fairness).
void FabricRecvComm::flushOffers() {
  size_t k = 0;
  while (k < offerQueue_.size() && sendOffer(&recvReq(offerQueue_[k]))) ++k;
  if (k > 0) offerQueue_.erase(offerQueue_.begin(), offerQueue_.begin() + static_cast<std::ptrdiff_t>(k));
}

Status FabricRecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs, bool optional,
                             Request** request) {
  *request = nullptr;
  bool busy = false;
  auto lock = group_->tryLockIfShared(&busy);
  if (busy) return Status::kOk;  // back-pressure: NCCL posts it again
  if (fatal_ != Status::kOk) return fatal_;
  if (n < 1 || n > maxRecvs_) {
    WEFT_WARN("irecv with n={} buffers, but this device reported maxRecvs={}", n, maxRecvs_);
    return Status::kInternal;
  }
  for (int i = 0; i < n; ++i) {
    if (Status st = checkHandle(mhs ? mhs[i] : nullptr, "irecv"); st != Status::kOk) return st;
    if (Status st = checkTag(tags[i], "irecv"); st != Status::kOk) return st;
  }
  FabricRequest* acquired = acquire();
  if (acquired == nullptr) return fatal_;  // kOk: NCCL retries (see grow())
  FabricRecvRequest* r = &asRecv(acquired);
  r->n = static_cast<uint8_t>(n);
  // Early completion is safe only where the provider places data without further calls from us (hardware
  // RMA): with manual progress in software (tcp, sockets, shm) the data would land only when NCCL next calls
  // test, which for an early-completed LL receive it never does.
  // With delivery acknowledgements the receiver must see the data land to acknowledge it: no early completion.
  r->optional = optional && n == 1 && proto_.rdma && dev_.hardwarePlacement() && !proto_.acks;
  OfferMsg* m = proto_.rdma ? &offer(r->poolIndex) : nullptr;
  for (int i = 0; i < n; ++i) {
    uint32_t ahead = 0;  // the same tag twice in one group takes consecutive sequence numbers
    for (int j = 0; j < i; ++j) ahead += tags[j] == tags[i] ? 1 : 0;
    uint64_t count;
    if (!seqs_.peek(tags[i], ahead, &count)) {
      r->reported = true;
      release(r);
      WEFT_WARN("irecv: more than {} distinct tags on one connection", TagSequence::kCapacity);
      return Status::kInternal;
    }
    MemHandle* mh = mhs ? mhs[i] : nullptr;
    const int k = railOf(count);  // where the sender's tagged message for this sequence travels
    const MemHandle* h = mh ? mh->rail(k) : nullptr;
    r->data[i] = data[i];
    r->mh[i] = mh;
    r->len[i] = sizes[i];
    r->tag[i] = wire::dataTag(tagComm(k, localId_.get()), tags[i], static_cast<uint32_t>(count));
    r->desc[i] = h ? h->desc() : nullptr;
    r->rail[i] = static_cast<uint8_t>(k);
    r->sizes[i] = 0;
    r->rmaBytes[i] = 0;
    r->rmaSegs[i] = 0;
    r->flags[i] = 0;
    if (m == nullptr) {
      r->flags[i] = FabricRecvRequest::kNeedPost;
      continue;
    }
    const bool keyed = mh != nullptr && mh->entry != nullptr && mh->entry->backendMr != nullptr;
    uint16_t sq = 0;
    if (keyed && !allocSeq(static_cast<uint16_t>(r->poolIndex * kMaxRecvs + i), &sq)) {
      r->n = static_cast<uint8_t>(i);  // the buffers before this one hold sequences: given back with the request
      r->optional = false;
      r->reported = true;
      release(r);
      return Status::kOk;  // every sequence is in use: NCCL retries
    }
    r->seq[i] = sq;
    fillOfferEntry(*r, i, keyed, &m->entry[i]);
    r->flags[i] = keyed ? FabricRecvRequest::kOffered : 0;
    if (!keyed || proto_.eagerMax > 0) r->flags[i] |= FabricRecvRequest::kNeedPost;
  }
  // The first tagged receive decides: if the provider has no room at all, hand the request back (NCCL retries).
  // Later ones that meet a full queue are posted from test().
  if (Status st = postPending(r); st != Status::kOk) {
    r->reported = true;
    if (r->ops == 0) release(r);
    return st;
  }
  if (m == nullptr && r->ops == 0) {
    r->reported = true;
    release(r);
    progress();
    return Status::kOk;
  }
  if (m != nullptr) {
    m->magic = OfferMsg::kMagic;
    m->count = static_cast<uint16_t>(n);
    m->reserved = 0;
    m->toComm = peerId_;
    m->reserved2 = 0;
    if (!sendOffer(r)) offerQueue_.push_back(r->poolIndex);  // capacity reserved: never allocates
  }
  for (int i = 0; i < n; ++i) seqs_.consume(tags[i]);
  *request = r;
  return Status::kOk;
}

Status FabricRecvComm::iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) {
  *request = nullptr;
  bool busy = false;
  auto lock = group_->tryLockIfShared(&busy);
  if (!busy && fatal_ != Status::kOk) return fatal_;  // (busy: the failure shows in the next test)
  for (int i = 0; i < n; ++i) {
    if (Status st = checkHandle(mhs ? mhs[i] : nullptr, "iflush"); st != Status::kOk) return st;
  }
  // As NCCL's IB transport: one read of the last non-empty buffer, on every rail (the data may have come through
  // any), after which everything the NICs wrote before is visible to the GPU (PCIe orders a read after the writes
  // before it). Host buffers are coherent once the receive completed: nothing to flush, a NULL request, unless
  // WEFT_FLUSH=all.
  int last = -1;
  for (int i = 0; i < n; ++i)
    if (sizes != nullptr && sizes[i] != 0) last = i;
  const MemHandle* mh = last >= 0 && mhs != nullptr ? mhs[last] : nullptr;
  if (mh == nullptr || !dev_.flushes() || (mh->type != NCCL_PTR_CUDA && !dev_.flushHost())) return Status::kOk;
  if (busy) {
    // Another thread holds the shared group: a flush cannot be dropped, and an error would fail NCCL's proxy.
    // Wait for the lock (held only for one bounded progress batch).
    lock = group_->lockIfShared();
    if (fatal_ != Status::kOk) return fatal_;
  }
  for (int k = 0; k < nRails_; ++k) {
    if (mh->rail(k) == nullptr || mh->rail(k)->entry == nullptr || mh->rail(k)->entry->backendMr == nullptr) {
      WEFT_WARN("iflush: buffer {} is not registered for RMA on rail {}", data[last], k);
      return Status::kInternal;
    }
  }
  FabricRequest* acquired = acquire();
  if (acquired == nullptr) {
    // The pool holds every request NCCL may have in flight on the comm (maxRecvs grouped receives x its steps);
    // a flush beyond is a caller that never tests its requests.
    WEFT_WARN("iflush: every request of the comm from {} is in flight", peerName_);
    return fatal_ != Status::kOk ? fatal_ : Status::kInternal;
  }
  FabricRecvRequest* r = &asRecv(acquired);
  r->flush = true;
  r->flushMh = mh;
  r->n = static_cast<uint8_t>(nRails_);
  for (int k = 0; k < nRails_; ++k) {
    r->flags[k] = FabricRecvRequest::kNeedPost;
    r->rail[k] = static_cast<uint8_t>(k);
    r->data[k] = data[last];
    r->sizes[k] = 0;
    r->ctx[k].kind = OpKind::kFlush;
  }
  if (Status st = postPending(r); st != Status::kOk) {
    r->reported = true;
    if (r->ops == 0) release(r);
    return st;
  }
  *request = r;
  return Status::kOk;
}

// ---- listen ----------------------------------------------------------------------------------------------------

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

namespace weft::fabric {
namespace {
std::string railNames(const std::vector<Rail>& rails) {
  std::string s;
  for (const auto& r : rails) s += (s.empty() ? "" : "+") + r.ep->device().props().name;
  return s;
}
}  // namespace
std::string FabricSendComm::deviceName() const { return railNames(rails_); }
std::string FabricRecvComm::deviceName() const { return railNames(rails_); }
}  // namespace weft::fabric
