// SPDX-License-Identifier: Apache-2.0
// A data comm of the libfabric backend: its rails, its request pool, progress, test, and memory registration.
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
      recvSide_(recvSide),
      pool_(static_cast<size_t>(poolSize), dev_.props().numaNode),
      probeIntervalMs_(params::getInt("WEFT_PROBE_INTERVAL")),
      peerTimeoutMs_(params::getInt("WEFT_PEER_TIMEOUT") * 1000) {
  stallMs_ = params::getInt("WEFT_STALL_S") * 1000;
  // This end's endpoint as the provider names it: what the peer's peerName_ is where it connected to this endpoint.
  const std::vector<uint8_t>& self = rails_[0].ep->name();
  localName_ = rails_[0].ep->addrString(self.data(), self.size());
  // Mb/s / 100 -> bytes per ms: speed * 1e6 / 8 / 100 / 1000
  floorBytesPerMs_ = std::max<uint64_t>(1000, static_cast<uint64_t>(std::max(dev_.props().speedMbps, 0)) * 10 / 8);
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
    ackQ_.reserve(pool_.capacity() * kMaxRecvs + (takenRing_ ? kMostSends : 0));
  }
}

// A chunk's requests, with their operation contexts, and for a receive comm of the rdma protocol their offer
// messages, registered once for the chunk. A failed registration fails the comm (it would fail again); a failed
// allocation is back-pressure (NULL request, NCCL retries).
bool FabricDataComm::makeChunk(Chunk& chunk, size_t base) {
  if (fatal_ != Status::kOk) return false;
  constexpr int kChunk = Pool::kChunk;
  if (recvSide_) {
    chunk.recvs = numa::makeArray<FabricRecvRequest>(kChunk, pool_.node());
  } else {
    chunk.sends = numa::makeArray<FabricSendRequest>(kChunk, pool_.node());
  }
  if (!chunk.recvs && !chunk.sends) return false;
  if (wantOffers_) {
    chunk.offers = numa::makeArray<OfferMsg>(kChunk, pool_.node());
    if (!chunk.offers) return false;
    std::memset(static_cast<void*>(chunk.offers.get()), 0, sizeof(OfferMsg) * kChunk);
    Status st = dev_.registerInternal(chunk.offers.get(), sizeof(OfferMsg) * kChunk, "offer buffers",
                                      &chunk.offersMr, &chunk.offersDesc);
    if (st != Status::kOk) {
      fatal_ = st;
      return false;
    }
  }
  for (int j = 0; j < kChunk; ++j) {
    FabricRequest& r = recvSide_ ? static_cast<FabricRequest&>(chunk.recvs[j]) : chunk.sends[j];
    const size_t i = base + static_cast<size_t>(j);
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
  for (int i = 0; i < allocated(); ++i) n += req(i).ops;
  for (const Rail& r : rails_) n += (r.note & kNoteInFlight) != 0 ? 1 : 0;  // a close ack: its context is ours
  return n + std::popcount(ackBusy_);
}

Status FabricDataComm::join(bool legacy32) {
  if (Status st = group_->table().attach(localId_.get(), this, legacy32); st != Status::kOk) return st;
  joined_ = true;
  return Status::kOk;
}

FabricRequest* FabricDataComm::acquire() {
  const int i = pool_.take([this](Chunk& c, size_t base) { return makeChunk(c, base); });
  if (i < 0) return nullptr;
  FabricRequest* r = &req(i);
  r->magic_ = kRequestMagic;
  if (outstanding_++ == 0) ++busyEpoch_;
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
    q.size = 0;
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
  if (stall_.over()) {  // a request is over: so is the stall
    WEFT_INFO(NCCL_NET, "comm with {}: requests complete again", peerName_);
  }
  if (!recvSide_) bytesInFlight_ -= static_cast<uint64_t>(asSend(r).size);
  --outstanding_;
  pool_.giveBack(r->poolIndex);
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

// Everything a comm waits on moves when NCCL tests any of its requests, step by step: the rails' completion
// queues, comms parked on the group, a lost offer, the offers, acknowledgements and failover, close notices, and
// the peer's liveness. Each step costs a test of a member when it has nothing to do.
Status FabricDataComm::progress() {
  ClosingComms::pollFromDataPath();
  const Status st = readRails();
  if (group_->shared() && group_->parked() > 0) group_->sweep();
  if (offerError_ != Status::kOk) failOnLostOffer();
  flushOffers();
  if (proto_.acks || proto_.failover) deliverySteps();
  if (notesWaiting_ > 0) postNotes();
  livenessSteps();
  return st;
}

Status FabricDataComm::readRails() {
  Status st = Status::kOk;
  for (Rail& rail : rails_) {
    Status s = rail.ep->progress();
    if (s != Status::kOk && st == Status::kOk) st = s;
  }
  if (st != Status::kOk && fatal_ == Status::kOk) fatal_ = st;
  return st;
}

// An offer that could not be sent (its connection broke) fails the receives still waiting once the peer has had
// a probe interval (at least a second) to show the connection back.
void FabricDataComm::failOnLostOffer() {
  if (fatal_ == Status::kOk && outstanding_ > 0 &&
      coarseNowMs() - offerErrorMs_ >= std::max<int64_t>(probeIntervalMs_, 1000)) {
    WEFT_WARN("peer {} on {}: a buffer offer could not be sent (the connection broke) and {} receives still wait "
              "for data: they fail", peerName_, dev_.props().name, outstanding_);
    fatal_ = offerError_;
  }
}

// Delivery acknowledgements and rail failover (fabric_acks.cc, fabric_failover.cc, fabric_readmit.cc): nothing of
// it is set on a comm that agreed to neither.
void FabricDataComm::deliverySteps() {
  if (!ackQ_.empty() || fenceOut_ != 0 || readmitOut_ != 0) flushAcks();
  if (fencing_ != 0) fenceStep();
  if ((resetWant_ & senderStopped_) != 0) resetStep();
  if (reoffers_ > 0) flushReoffers();
  if (railNoteWant_ != 0) postRailNote();
  if ((failed_ & fencedIn_) != 0 && (++readmitPolls_ & 15) == 0) readmitStep(coarseNowMs());
}

// The peer probed after a silence (every 1024 calls with something outstanding), rails seen down looked at again
// (every 256 calls) (fabric_liveness.cc).
void FabricDataComm::livenessSteps() {
  if ((outstanding_ > 0 || waitingPeer_) && probeIntervalMs_ > 0 && (++polls_ & 1023) == 0) checkPeer();
  if (railsDown_ > 0 && (++railPolls_ & 255) == 0) recheckRails(coarseNowMs());
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
    // A full receive queue: -FI_EAGAIN, or -FI_ENOMEM from shm before libfabric 2.0 (1.17 says so when its rx_size
    // entries, shared by every comm of the endpoint, are all posted). Either way the receive is posted once earlier
    // ones complete. From 2.0 shm's receive entries grow as needed: -FI_ENOMEM there is a failed allocation.
    if (rc == -FI_EAGAIN || (rc == -FI_ENOMEM && dev_.enomemIsFull())) return Status::kOk;
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
  if (Status st = checkMemHandle(mh, nullptr, 0, op, !dev_.localMr(), dev_.props().name); st != Status::kOk) return st;
  if (mh == nullptr) return Status::kOk;
  if (nRails_ > 1 && mh->rail(nRails_ - 1) == nullptr) {
    WEFT_WARN("{}: memory handle {} was registered on fewer NICs than this {}-rail comm uses (registered "
              "through a comm of another device?)",
              op, static_cast<const void*>(mh), nRails_);
    return Status::kInternal;
  }
  return Status::kOk;
}

Status FabricDataComm::registerMr(void* data, size_t size, int type, int fd, uint64_t offset, MemHandle** out) {
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
      if (head != nullptr) deregisterMr(head);
      return st;
    }
    *link = h;
    link = &h->nextRail;
  }
  *out = head;
  return Status::kOk;
}

Status FabricDataComm::deregisterMr(MemHandle* mh) {
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

namespace {
std::string railNames(const std::vector<Rail>& rails) {
  std::string s;
  for (const auto& r : rails) s += (s.empty() ? "" : "+") + r.ep->device().props().name;
  return s;
}
}  // namespace
std::string FabricDataComm::commDeviceName() const { return railNames(rails_); }

}  // namespace weft::fabric
