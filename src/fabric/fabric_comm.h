// SPDX-License-Identifier: Apache-2.0
// Listen, send and receive comms over one libfabric endpoint per rail (NIC of the device) each, and their pooled
// requests.
// Data path (isend/irecv/iflush/test): no allocation, no lock, no syscall of ours; one bounded batch of
// completions per call.
//
// Two protocols (agreed per connection at connect, see Protocol):
// Every message names the comm that receives it (its id, told in the handshake; fabric/wire.h has the layouts).
// - sendrecv: every message is a tagged send matched by tag = (receiving comm id, NCCL tag, per-tag sequence).
// - rdma: each irecv sends the sender one offer (address, key, size, slot of every buffer; one message for a
//   grouped receive). The sender RMA-writes the payload straight into the offered buffer with remote completion
//   data naming the receiving comm and the buffer's sequence (fabric/wire.h: WriteImm, 8 bytes with the length;
//   WriteImmId, 4 bytes, the length from the receiver's completion; WriteImm32, 4 bytes carrying a length of the
//   form m * 2^e where the receiving provider reports none, a message of another length going as pieces).
//   The receiver completes the buffer when that data arrives. An isend whose offer has not come yet returns a
//   NULL request (NCCL retries), like NCCL's own IB transport.
// - eager (with rdma): messages up to Protocol::eagerMax go at once as tagged sends without waiting for the
//   offer, into a tagged receive the receiver posted beside the offer; the offer, when it comes, is dropped.
//   A buffer filled by RMA cancels its tagged receive (the request goes back to the pool when the cancel
//   completes; NCCL already has its answer).
//
// Rails (a device of several NICs, see rails.h): every comm has one endpoint per rail (its endpoint group's,
// fabric/endpoint_group.h, whose comm table routes every completion to the comm it names), rail 0 also carrying
// the handshake, offers and probes. A tagged message travels on rail (sequence % rails), which both ends compute
// alike; an RMA write of at least WEFT_STRIPE_MIN bytes is split into one segment per rail (the completion
// data says how many segments make the buffer), smaller ones go round-robin like tagged messages.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/endpoint_group.h"
#include "fabric/fabric_endpoint.h"
#include "weft/common/clock.h"
#include "weft/common/numa.h"
#include "weft/transport/comm_adaptor.h"
#include "weft/transport/comm_ids.h"
#include "weft/transport/offer_table.h"
#include "weft/transport/request_pool.h"
#include "weft/transport/silence.h"
#include "weft/transport/tag_seq.h"

namespace weft::fabric {

class FabricDataComm;

using wire::kOfferTaggedOnly;
using wire::OfferEntry;
using wire::OfferMsg;
using wire::WriteImm;
using wire::WriteImm32;
using wire::WriteImmId;

// What send and receive requests share: their comm and pool slot, the provider operations' contexts (a send's
// pieces, a receive's buffers) and the completion state test() reads. Each kind has its own type below (a send
// needs none of a receive's per-buffer arrays, a receive none of a send's write plan); a comm's pool holds one kind
// (FabricDataComm::recvSide_ says which).
class FabricRequest : public Request {
 public:
  Status test(bool* done, int* sizes) override;

  FabricDataComm* comm = nullptr;
  uint16_t poolIndex = 0;
  uint8_t n = 0;        // buffers (1 for sends)
  uint8_t doneBufs = 0;  // buffers whose data arrived (or, for a send, 1 when it completed)
  bool reported = false;   // test() said done (or failed): the request is NCCL's no more
  int ops = 0;          // operations in the provider's hands (the request is reusable only at 0)
  Status error = Status::kOk;
  OpContext ctx[kMaxRecvs];  // a send's pieces (wire::kMaxPieces), a receive's buffers
};
static_assert(wire::kMaxPieces <= kMaxRecvs, "a send's pieces use the request's operation contexts");
// A tagged send sent again (rail failover): its j-th time sent again uses ctx[kResendCtx + 1 - j], down to ctx[1].
constexpr int kResendCtx = wire::kMaxPieces - 1;
constexpr int kMaxResends = kResendCtx;

class FabricSendRequest final : public FabricRequest {
 public:
  int size = 0;  // what test() reports
  // An RMA write as pieces (one per rail when striped; more where the compact completion data cannot say a
  // length in one), posted piece by piece (a piece the provider pushed back on is posted from test()).
  uint8_t nSeg = 1;      // pieces of this send
  uint8_t nextSeg = 1;   // the next piece to post
  uint8_t segsLeft = 1;  // pieces whose completion has not come yet
  uint8_t immFlags = 0;  // WriteImm flags every piece carries
  uint8_t pieceRail[wire::kMaxPieces] = {};
  uint32_t pieceField[wire::kMaxPieces] = {};  // compact form: the m/e field of each piece
  uint64_t pieceOff[wire::kMaxPieces] = {};
  uint64_t pieceLen[wire::kMaxPieces] = {};
  const char* src = nullptr;
  const MemHandle* mh = nullptr;
  OfferEntry offer;
  // Delivery acknowledgements (Protocol::acks): done once the provider completed it (sent) and the receiver
  // acknowledged it (acked), in either order; ackKey names it (wire::ackKey of its data tag).
  bool needAck = false;
  bool sent = false;
  bool acked = false;
  bool resend = false;  // rail failover: to be sent again on the control rail (the provider pushed back)
  uint8_t resends = 0;  // times sent again (the j-th time with ctx[kResendCtx + 1 - j])
  uint64_t ackKey = 0;
  // An RMA write (the rdma protocol; a tagged send otherwise). Piece i goes with ctx[ctxOf[i]]: under rail failover
  // the receiver may offer the buffer again (kOfferAgain) and the whole message is written again, while pieces of
  // the earlier write may still be in the provider's hands (busyCtx: contexts it holds; liveCtx: those of the
  // current write's pieces, whose completions count; an earlier write's change nothing).
  bool rma = false;
  bool rewrite = false;  // to be written again: too few contexts free yet (from test())
  uint8_t rewrites = 0;
  uint8_t busyCtx = 0, liveCtx = 0;
  uint8_t ctxOf[wire::kMaxPieces] = {};
};

class FabricRecvRequest final : public FabricRequest {
 public:
  // Per receive buffer.
  enum BufFlags : uint8_t {
    kNeedPost = 1,   // a tagged receive must still be handed to the provider (it pushed back)
    kPosted = 2,     // a tagged receive is in the provider's hands
    kOffered = 4,    // offered for RMA: completion data may fill it
    kDone = 8,       // data arrived
    kCanceled = 16,  // its tagged receive is being canceled
    kClaim = 32,     // posted over the endpoint's budget and canceled at once: kept only if a message was waiting
    kMoved = 64,     // rail failover: canceled on a failed rail, to be posted again on the control rail
  };
  bool flush = false;      // a read-back flush (iflush): one read per rail, buffer k on rail k
  const MemHandle* flushMh = nullptr;
  bool optional = false;   // NCCL_NET_OPTIONAL_RECV_COMPLETION: done once the offer has left
  bool offerSent = false;  // the offer's send completed
  bool offerPosted = false;  // the offer was handed to the provider (not waiting in FabricRecvComm::offerQueue_)
  bool offerBusy = false;    // the offer's send (or an offer again) is in the provider's hands
  // Rail failover (rdma): its buffers still waiting for data are to be offered again (kReofferWant), or were, and
  // the offer waits for the provider (kReofferReady).
  enum : uint8_t { kReofferNone, kReofferWant, kReofferReady } reoffer = kReofferNone;
  uint8_t flags[kMaxRecvs] = {};
  uint8_t rmaSegs[kMaxRecvs] = {};  // pieces landed
  uint8_t rail[kMaxRecvs] = {};  // the rail each tagged receive is posted on
  uint16_t seq[kMaxRecvs] = {};  // rdma: the sequence each offered buffer is named by (wire::WriteImm)
  int sizes[kMaxRecvs] = {};
  void* data[kMaxRecvs] = {};
  const MemHandle* mh[kMaxRecvs] = {};  // rail failover: a receive posted again elsewhere takes its descriptor there
  size_t len[kMaxRecvs] = {};
  uint64_t tag[kMaxRecvs] = {};
  void* desc[kMaxRecvs] = {};
  uint64_t rmaBytes[kMaxRecvs] = {};
  OpContext offerCtx;
};

// One NIC of a comm: its endpoint (its group's), the peer's address on it, and what crossed it.
struct Rail {
  Endpoint* ep = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  RailHealth* health = nullptr;  // the comm's (FabricDataComm::health_): state, what was sent on it
  // Close notice (send comm) or ack (receive comm) on this rail (wire.h): Note* flags, its operation's context.
  uint8_t note = 0;
  OpContext noteCtx;
};

// What send and receive comms share: the endpoints, the peer, the request pool, progress and completion. A comm
// and its requests live on the NUMA node of its first rail's NIC (numa::make, docs/topology.md).
class FabricDataComm : public DataSink, public numa::Placed {
 public:
  // group: the endpoints `rails` name (one per rail, in order); localId: this comm's id (messages to it carry it,
  // and the group's comm table routes by it); peerId: the peer comm's.
  // recvSide: a receive comm (its pool holds receive requests).
  FabricDataComm(std::shared_ptr<EndpointGroup> group, std::vector<Rail> rails, std::string peerName, int poolSize,
                 Protocol proto, CommId localId, uint32_t peerId, bool recvSide);
  ~FabricDataComm() override;

  Status testRequest(FabricRequest* r, bool* done, int* sizes);
  uint32_t commId() const { return localId_.get(); }  // what messages to this comm carry
  EndpointGroup& group() const { return *group_; }
  // NCCL closed the comm. In a shared group, posted receives are canceled and, while operations are still in
  // the provider's hands, the comm stays parked in the group (routed to, never posting) until they complete.
  // A send comm with endpoints of its own (sendSide) that sent anything instead sends a close notice on every
  // rail and lingers (ClosingComms) until the peer acknowledged them all, so that nothing it reported sent is
  // lost with its endpoints.
  void closeComm(bool sendSide = false);
  void onComplete(OpContext* ctx, size_t len) noexcept override;
  void onError(Endpoint* ep, OpContext* ctx, int fiErr, Status st) noexcept override;
  void onRemoteData(uint64_t data, size_t len) noexcept override;
  // onError's cases: true when handled (the request only loses the operation); failOperation fails it and the comm.
  void ackFailed(OpContext* ctx, int fiErr, Status st);
  bool recvFailed(Endpoint* ep, FabricRecvRequest& r, int b, int fiErr, Status st);
  bool offerFailed(Endpoint* ep, FabricRecvRequest& r, int fiErr, Status st);
  bool sendFailed(Endpoint* ep, FabricSendRequest& q, int k, int fiErr, Status st);
  void failOperation(Endpoint* ep, FabricRequest* r, int fiErr, Status st);
  void onCloseNote(Endpoint* ep, bool ack) noexcept override;
  void onWritesOver(Endpoint* ep) noexcept override;
  void onRailNote(uint32_t rails) noexcept override;
  void refreshRailHealth() {
    if (railsDown_ > 0 && fatal_ == Status::kOk) recheckRails(coarseNowMs(), true);
  }
  const RailHealth* railHealth(int* n) const {
    *n = nRails_ > 1 ? nRails_ : 0;
    return nRails_ > 1 ? health_.get() : nullptr;
  }
  // Lingering after close: posts what waits, reads the endpoints; true once every rail's notice was acked or
  // failed (or the comm failed): it may be deleted.
  bool lingerStep();

 protected:
  FabricRequest* acquire();
  void release(FabricRequest* r);
  void opDone(FabricRequest* r);  // one provider operation of r finished
  Status progress();
  // progress()'s steps
  Status readRails();
  void failOnLostOffer();
  void deliverySteps();
  void livenessSteps();
  Status postPending(FabricRecvRequest* r);  // receives only: tagged receives (or flush reads) pushed back on
  // Registers on every rail's NIC (fd >= 0: a DMA-BUF); the handle chains the per-rail ones.
  Status registerMr(void* data, size_t size, int type, int fd, uint64_t offset, MemHandle** out);
  Status deregisterMr(MemHandle* mh);
  std::string commDeviceName() const;  // its rails' NICs: "eth0+eth1"
  const DeviceProps& commDeviceProps() const { return dev_.props(); }  // rail 0's NIC
  Status checkHandle(const MemHandle* mh, const char* op) const;
  // The rail of a tagged message: count % rails (its count among the messages of its tag), both ends alike; a rail
  // failed over (failed_) sends its share to the control rail instead, and so does one re-admitted for the messages
  // below the count both ends agreed it takes over from (switchAt_; rail failover, below).
  int railOf(uint64_t count) const {
    if (nRails_ == 1) return 0;
    const int k = static_cast<int>(count % static_cast<uint64_t>(nRails_));
    return (failed_ & (1u << k)) != 0 || count < switchAt_[k] ? ctlRail_ : k;
  }
  // The comm id the data tags of messages on rail k carry: the receive comm's own, or the alias it gave the rail
  // when it re-admitted it. base: this end's view of the receive comm's id.
  uint32_t tagComm(int k, uint32_t base) const { return railComm_[k] != 0 ? railComm_[k] : base; }
  // The control rail (handshake, offers, acknowledgements, notes): rail 0, until it fails over (the lowest rail not
  // failed then).
  Endpoint& ctl() const { return *rails_[ctlRail_].ep; }
  fi_addr_t ctlPeer() const { return rails_[ctlRail_].peer; }
  int ctlRail_ = 0;
  // Enters the group's comm table: from now on completions naming this comm come here. legacy32: remote writes
  // to it carry no comm id (it cannot share the group).
  Status join(bool legacy32);
  virtual void flushOffers() {}
  virtual void resumeSend(FabricSendRequest* r) { (void)r; }  // sends: post what the provider pushed back on

  // A tag NCCL passed that the wire cannot carry is refused (never folded onto another tag).
  Status checkTag(int tag, const char* op) const;

  FabricDevice& dev_;  // rail 0's NIC (names in messages; registration of weft's own buffers)
  std::shared_ptr<EndpointGroup> group_;
  bool joined_ = false;
  CommId localId_;
  uint32_t peerId_;
  std::vector<Rail> rails_;
  int nRails_;
  std::string peerName_;
  std::string localName_;  // rail 0's endpoint name (fi_av_straddr), as a peer that connected to it names it
  Protocol proto_;
  bool recvSide_;  // a receive comm: its pool holds FabricRecvRequests
  // The request pool (weft/transport/request_pool.h), up to pool_.capacity() requests; request i is req(i). A receive
  // comm of the rdma protocol (wantOffers_) gets with each chunk the registered offer messages of its requests:
  // request i sends offer(i) (one memory registration per chunk where the provider needs them: at most 16 for
  // a receive comm's 64 requests, and only as deep as NCCL ever went on it).
  struct Chunk {  // a send comm's chunk holds send requests, a receive comm's receive requests
    numa::ArrayPtr<FabricSendRequest> sends;  // on the NUMA node of rail 0's NIC
    numa::ArrayPtr<FabricRecvRequest> recvs;
    numa::ArrayPtr<OfferMsg> offers;
    MrPtr offersMr;
    void* offersDesc = nullptr;
  };
  using Pool = RequestPool<Chunk>;
  Pool pool_;
  bool wantOffers_ = false;
  bool makeChunk(Chunk& chunk, size_t base);  // the pool's next chunk: requests (and offers) for [base, +kChunk)
  int allocated() const { return static_cast<int>(pool_.allocated()); }
  FabricRequest& req(int i) const {
    const Chunk& c = pool_.chunkOf(static_cast<size_t>(i));
    const size_t k = Pool::slotOf(static_cast<size_t>(i));
    return c.recvs ? static_cast<FabricRequest&>(c.recvs[k]) : c.sends[k];
  }
  FabricRecvRequest& recvReq(int i) const {
    return pool_.chunkOf(static_cast<size_t>(i)).recvs[Pool::slotOf(static_cast<size_t>(i))];
  }
  static FabricRecvRequest& asRecv(FabricRequest* r) { return *static_cast<FabricRecvRequest*>(r); }
  static FabricSendRequest& asSend(FabricRequest* r) { return *static_cast<FabricSendRequest*>(r); }
  OfferMsg& offer(int i) const {
    return pool_.chunkOf(static_cast<size_t>(i)).offers[Pool::slotOf(static_cast<size_t>(i))];
  }
  void* offerDesc(int i) const { return pool_.chunkOf(static_cast<size_t>(i)).offersDesc; }
  TagSequence seqs_;
  Status fatal_ = Status::kOk;  // once set, every call on this comm fails with it

  // rdma, receive side: offered buffers by the sequence the sender's writes name (wire::WriteImm). Handed out
  // cyclically, skipping those in use; freed when the buffer's data has landed or its request goes back to the
  // pool. A buffer NCCL was told was done early (LL/LL128) is parked instead: its data may still come, and is
  // ignored; the cursor reuses the entry only after going round.
  static constexpr uint16_t kSeqFree = 0, kSeqParked = 0xffff;
  std::unique_ptr<uint16_t[]> bySeq_;  // sequence -> slot (request index * kMaxRecvs + buffer) + 1
  uint32_t nSeqs_ = 0, seqCursor_ = 0;
  uint64_t strayWrites_ = 0;  // writes naming another comm's id: dropped
  bool allocSeq(uint16_t slot, uint16_t* seq);
  void releaseSeqs(FabricRecvRequest* r);

  // Liveness (see checkPeer), looked at once per 1024 progress calls while requests are outstanding.
  void checkPeer();
  int opsInFlight() const;  // provider operations of this comm not yet completed
  void logRails() const;    // multi-rail: what each rail carried
  // Per-rail health (weft/common/rail_health.h), one entry per rail. A rail seen down is reported once (a warning
  // naming the comm, the rail and why), and again when it comes back. No traffic moves off a down rail yet
  // (docs/failover.md): the comm still fails when a rail stays down for WEFT_PEER_TIMEOUT or an operation on it fails.
  std::unique_ptr<RailHealth[]> health_;
  std::vector<int64_t> railDownSinceMs_;  // per rail: when it was seen down (0: up)
  std::vector<int64_t> unreachableSinceMs_;  // per rail: the first post refused for no route (0: none pending)
  int railsDown_ = 0;
  void railDown(int k, RailEvent why, const std::string& detail);
  void railUp(int k, int64_t nowMs);
  void recheckRails(int64_t nowMs, bool fresh = false);
  bool railDownWait(int k, ssize_t rc);
  uint32_t railPolls_ = 0;
  int railOfEndpoint(const Endpoint* ep) const;
  std::string railName(int k) const;  // "rail 1 (eth1)"
  static bool drained(DataSink* s);
  bool closing_ = false;          // NCCL closed it: nothing more is posted
  // The rdma protocol's receive side: buffers offered to the peer (the offer handed to the provider) whose data
  // has not landed: the peer may be writing them now. A comm closed with such writes on a provider whose endpoint
  // close races arrivals (Endpoint::closeRacesArrivals) waits for them until awaitUntilMs_ (fabric_closing.cc).
  int awaitedWrites() const;
  bool awaitingWrites() const;  // awaitedWrites() > 0 and the wait has not run out (nor the comm failed)
  void holdForWrites();         // at close: sets awaitUntilMs_ where the wait is needed
  int64_t awaitUntilMs_ = 0;
  uint32_t writesOverRails_ = 0;  // receive side: rails on which the peer said it writes no more (wire::kWritesOver)
  bool peerWritesOver() const { return std::popcount(writesOverRails_) >= nRails_; }  // ... on every rail
  void noteWritesOver();          // send side, closed with no write in the provider's hands: says so to the peer
  // Send side: whether the receiver may be waiting for a write of this comm (set at close: NCCL closed it with sends
  // outstanding, or holding offers no send took). Only then does the note go: over rxm a message to a peer that
  // closed already opens a new connection (40 connect cycles over 8 rails grew the receiver by 68 descriptors).
  bool writesAwaited_ = false;
  virtual bool offersHeld() const { return false; }
  // Delivery acknowledgements (Protocol::acks, wire::AckMsg). Receive side: the messages taken in one batch of
  // completions (whichever comm's call read it: on a shared endpoint, maybe another's) are acknowledged together
  // at its end (afterBatch), injected where the provider takes a message that size (copied at once: nothing to
  // wait for), else from one of kAckSlots buffers (allocated and registered with the first); with every slot in
  // flight, or the provider pushing back, they wait in ackQ_ (capacity for every buffer the comm can have
  // outstanding) and leave when a slot's send completes, or at the next progress call. A receiver whose
  // requests are all done may never be called again (NCCL's proxy idles): what it took must be handed to the
  // provider by then. Send side: sendDone/onAck complete a send once both have happened.
  static constexpr int kAckSlots = 4;
  std::vector<uint64_t> ackQ_;
  numa::ArrayPtr<wire::AckMsg> ackMsg_;
  MrPtr ackMr_;
  void* ackDesc_ = nullptr;
  uint8_t ackBusy_ = 0;  // slots in flight (bit per slot)
  OpContext ackCtx_[kAckSlots];
  uint64_t acksSent_ = 0, acksTaken_ = 0, strayAcks_ = 0;
  bool ackDeferred_ = false;  // in the comm table's list for afterBatch
  void noteTaken(uint64_t dataTag) {
    if (!proto_.acks) return;
    ackQ_.push_back(wire::ackKey(dataTag));
    if (takenRing_) takenRing_[takenCount_++ % kMostSends] = ackQ_.back();
    deferToBatchEnd();
  }
  void afterBatch() noexcept override {
    ackDeferred_ = false;
    flushAcks();
    if ((resetWant_ & senderStopped_) != 0) resetStep();
  }
  void deferToBatchEnd() {
    if (ackDeferred_) return;
    ackDeferred_ = true;
    (parkedIn_ != nullptr ? parkedIn_ : group_.get())->table().defer(this);
  }
  void flushAcks();
  bool postAck();  // one acknowledgement in the first free slot; false: not sent (pushed back or failed)
  static void sendDone(FabricSendRequest* r) {
    r->sent = true;
    if (!r->needAck || r->acked) r->doneBufs = 1;
  }
  void onAck(const wire::AckMsg& m, size_t len);

  // Rail failover (Protocol::failover, docs/failover.md step 3): a rail that fails is failed over (failed_) until it
  // is taken back (re-admission, below): its share of the messages goes to the control rail. The receive side
  // cancels what it had posted there and posts it again on the control rail (fencing_ until every such receive has
  // been canceled or completed), then tells the sender in its next acknowledgement (fenceOut_ -> AckMsg::fenced);
  // the send side tells the receive side when it saw the failure first (a rail-down note, railNoteWant_), and on the
  // fence sends again on the control rail every send of that rail still unacknowledged. With no rail left the comm
  // fails, as without failover.
  uint8_t failed_ = 0;
  uint8_t railMask() const { return static_cast<uint8_t>((1u << nRails_) - 1); }
  uint8_t fencing_ = 0, fenceOut_ = 0;  // receive side
  uint8_t railNoteWant_ = 0;            // send side: rails whose note waits for the provider
  int64_t fenceSinceMs_ = 0;
  void countMoved(int fromRail) {  // a send sent again, or a receive posted again, on the control rail
    RailHealth::bump(health_[fromRail].moved, 1);
    Endpoint::countMoved();
  }
  // Buffer b of r, off its failed rail: to be posted on the control rail, with its registration's descriptor
  // there, under the comm's own id (the sender sends it again there under that id, whatever alias the rail had).
  void moveToCtl(FabricRecvRequest& r, int b) {
    countMoved(r.rail[b]);
    r.rail[b] = static_cast<uint8_t>(ctlRail_);
    r.desc[b] = r.mh[b] != nullptr ? r.mh[b]->rail(ctlRail_)->desc() : nullptr;
    r.tag[b] = wire::dataTagOfKey(localId_.get(), wire::ackKey(r.tag[b]));
  }
  // The control rail fails over too (Protocol::failover where acknowledgements are injected: nothing of the
  // control traffic waits in a slot on a dead rail): acknowledgements, notes and the messages of failed rails move
  // to the lowest rail not failed. Receive side: its acknowledgements carry the number of times it moved (ctlEpoch_;
  // the sender drops those from before the last move, still arriving late on the old rail), and the keys of the
  // last messages it took (takenRing_: kMostSends of them, as many as a sender can still wait for) go again on the
  // new one, with every re-admission it announced: whatever was lost with the old rail comes again. Send side:
  // ctlEpoch_ is the receiver's last seen.
  bool ctlMoves_ = false;
  uint8_t ctlEpoch_ = 0;
  std::unique_ptr<uint64_t[]> takenRing_;
  uint64_t takenCount_ = 0;
  void moveCtl();
  // True when failover took the failure of rail k (the comm goes on); false: not enabled, no rail left, or the
  // control rail where it cannot move.
  bool failRail(int k, RailEvent why, const std::string& detail, bool peerSaid = false);
  // An operation on endpoint ep's rail completed with an error: the rail fails over if the error says the connection
  // broke (ncclRemoteError), not the message (a truncation), or if it had already. True: failover took it.
  bool failRailOnError(Endpoint* ep, int fiErr, Status st) {
    const int k = railOfEndpoint(ep);
    // (FI_ECANCELED: an operation the provider flushed when the connection was closed, Endpoint::resetPeer; weft never
    // cancels a send.)
    return (st == Status::kRemote || fiErr == FI_ECANCELED || (failed_ & (1u << k)) != 0) &&
           failRail(k, RailEvent::kErrorCompletion, fi_strerror(fiErr));
  }
  void fenceStep();   // receive side: cancels, reposts; the fence once nothing is left on a failed rail
  void resendFenced(uint8_t rails);  // send side
  bool postResend(FabricSendRequest* r);
  // A post the provider refused (not a pushback): r and the comm fail with it, with a warning naming `what` and rail k.
  void postFailed(FabricRequest* r, ssize_t rc, const char* what, int k);
  void postRailNote();
  // Resetting a failed rail's connection (resetRails_: failover where the provider can, FabricDevice::resetsPeers).
  // A write on a failed rail may still land once the rail is back (TCP retransmits what it held; an RC QP retries)
  // into a buffer NCCL has reused, and a connection the failure broke (a QP in the error state) never carries
  // anything again, though rxm keeps it. So the receive side, once the sender said it stopped sending there (its
  // rail-down note: senderStopped_), closes its connection to the sender on that rail (Endpoint::resetPeer: what it
  // held is dropped, never delivered; rails whose reset waits: resetWant_; a rail is not taken back meanwhile),
  // and with the rdma protocol only then offers again, under new sequences, every buffer still waiting for data
  // (the old sequences parked: late pieces naming them are ignored); the sender writes each such message again,
  // whole (rewriteSend). The send side closes its own before it tries to take the rail back (Readmit::resetGen).
  // The rdma protocol fails over only with it (Protocol::failover on an rdma connection).
  bool resetRails_ = false;
  uint8_t resetWant_ = 0, senderStopped_ = 0;  // receive side
  int reoffers_ = 0;  // receive side: requests with reoffer set
  void resetStep();
  void flushReoffers();
  bool reofferRequest(FabricRecvRequest* r);  // false: wait (the provider pushed back, or the offer is in flight)
  // Offer entry of buffer b of r (keyed: registered for RMA; else an entry that asks for a tagged send).
  void fillOfferEntry(const FabricRecvRequest& r, int b, bool keyed, OfferEntry* e) const;
  // A 16-byte note {kind, word} on rail `on`'s probe channel, injected (failover is agreed only where the provider
  // injects that much): nothing to wait for. Returns fi_tinject's answer.
  ssize_t injectNote(int on, uint64_t kind, uint64_t word);
  // Re-admission of a failed-over rail (docs/failover.md, "Recovery"; WEFT_RAIL_READMIT). The send comm drives it,
  // once the receiver fenced the rail (fencedIn_) and its link is up, after a wait that doubles with each try that
  // fails and each failure soon after a re-admission (1 s to 30 s by default): a hello on the rail and its answer
  // on the same rail (both ways work), then "ready" on the control rail. The receive comm then picks the count from which
  // the rail carries messages again (switchAt_) and a new comm id for the rail's messages (railComm_, an alias:
  // copies of earlier messages left on the rail can never match), and tells the sender in its next
  // acknowledgement (AckMsg::readmit), which the sender reads before any acknowledgement sent after it.
  // The count: every tag's next receive (maxNext) plus the most sends a send comm can have outstanding
  // (kMostSends). Every send completes only once acknowledged, and every message acknowledged before the re-admission
  // had been received, so was below maxNext: what the sender has sent at or beyond maxNext when it reads the
  // re-admission is outstanding, at most kMostSends messages. So no message of that count or beyond has left on
  // the control rail, where the receiver would no longer look for it (the sender checks, and fails the comm if not).
  uint64_t switchAt_[kMaxRails] = {};
  uint32_t railComm_[kMaxRails] = {};
  int64_t readmitFirstMs_ = 0;   // WEFT_RAIL_READMIT (0: never)
  static constexpr int64_t kReadmitMaxMs = 30000;
  static constexpr uint64_t kMostSends = static_cast<uint64_t>(kMaxRequests) * kMaxRecvs;  // a send comm's pool
  // Receive side.
  std::vector<CommId> aliases_;  // every alias it gave out (retired at close)
  uint8_t readmitOut_ = 0;  // rails whose re-admission the next acknowledgements carry (one each, lowest first)
  // Send side.
  uint8_t fencedIn_ = 0;  // rails the receiver fenced
  struct Readmit {
    enum : uint8_t { kIdle, kHello, kHelloAcked, kReady } state = kIdle;
    uint16_t attempt = 0;
    int64_t nextMs = 0, sentMs = 0, waitMs = 0, admittedMs = 0;
    int64_t againSinceMs = 0;  // the hello was pushed back (a connection opening) since then
    uint64_t resetGen = 0;     // the rail endpoint's resets of the peer when it failed, or this comm last reset it
  };
  Readmit readmit_[kMaxRails];
  uint32_t readmitPolls_ = 0;
  void readmitSchedule(int k, int64_t nowMs);  // after a failover (send side)
  void readmitStep(int64_t nowMs);
  bool sendRailUp(int k, wire::RailUpStep step, uint16_t attempt);  // injected; false: not sent
  void admitRail(int k, uint32_t alias, uint64_t at, bool sendSide);
  void onRailUp(Endpoint* ep, uint64_t word) noexcept override;
  // Close notices and acks (Rail::note).
  enum : uint8_t { kNoteWant = 1, kNoteInFlight = 2, kNoteAcked = 4, kNoteFailed = 8 };
  bool lingering_ = false;  // a closed send comm waiting for its acks (notes are notices, not acks)
  int notesWaiting_ = 0;    // rails with kNoteWant set (the provider pushed back)
  void postNotes();
  EndpointGroup* parkedIn_ = nullptr;  // parked: the group that owns it (group_ released)
  int outstanding_ = 0;
  // isend is waiting on the peer: for the receiver's offer, or for the provider to take a send it pushes back on
  // (a connection to a dead peer can push back for ever with nothing outstanding: probes must still run)
  bool waitingPeer_ = false;
  // For the stall warnings: what else fails with the outstanding requests.
  const char* retriedSend() const { return waitingPeer_ ? ", and so does the send NCCL keeps retrying" : ""; }
  Silence silence_;  // how long nothing completed, as checkPeer sees it
  // Stall warnings (WEFT_STALL_S, docs/hangs.md): from checkPeer, once per stall; busyEpoch_ counts the times the
  // comm went from nothing outstanding to something (a stall starts no earlier than that).
  void reportStall(int64_t nowMs, int64_t quietMs);
  int64_t stallMs_ = 0;
  uint32_t busyEpoch_ = 0, stallEpoch_ = 0;
  int64_t stallFromMs_ = 0;

 public:
  StallState stall_;  // what reportStall found (Comm::stallState)

 protected:
  uint32_t polls_ = 0;
  // rdma receives: an offer the provider failed to send (the first), and when; see onError.
  Status offerError_ = Status::kOk;
  int64_t offerErrorMs_ = 0;
  int64_t probeIntervalMs_;
  int64_t peerTimeoutMs_;
  // A probe goes behind the messages queued to the same peer on providers that deliver in order (tcp, shm): its
  // deadline grows with the send bytes in flight, drained at no less than 1% of the NIC's speed (as verbs does).
  uint64_t bytesInFlight_ = 0;
  uint64_t floorBytesPerMs_ = 1000;
};

class FabricSendComm final : public CommAdaptor<SendComm, FabricDataComm> {
 public:
  FabricSendComm(std::shared_ptr<EndpointGroup> group, std::vector<Rail> rails, std::string peerName, int maxRecvs,
                 Protocol proto, CommId localId, uint32_t peerId);
  Status start();  // joins the group; rdma: posts the offer receives
  Status isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) override;
  void close() override { closeComm(true); }

  // Offer receives of a private endpoint (one send comm) and of a shared one (all the send comms of a context on
  // the device; offers beyond wait in the provider as unexpected messages until a receive is posted again).
  static constexpr int kOfferRecvs = 2 * kMaxRequests;
  static constexpr int kSharedOfferRecvs = Endpoint::kSharedOfferRecvs;

 private:
  void onOffer(const void* msg, size_t len) noexcept override;
  void onOfferAgain(const OfferEntry& e);
  // Writes r's message again, whole, under its new offer (r->offer): the same pieces, every surviving rail that
  // carried a piece of the earlier write carrying its piece again after it (same connection, in order: nothing of
  // the earlier write lands after this one completes the buffer), a failed rail's piece on the control rail.
  // False: too few operation contexts free yet (pieces stuck on the failed rail hold theirs): from test().
  bool rewriteSend(FabricSendRequest* r);
  void resumeSend(FabricSendRequest* r) override {
    if (r->resend) {
      postResend(r);
      return;
    }
    if (r->rewrite) {
      rewriteSend(r);
      return;
    }
    bool again;
    postSegments(r, &again);
  }
  // *again: the provider pushed back; nothing was posted.
  Status sendTagged(FabricSendRequest* r, void* data, size_t size, MemHandle* mh, uint64_t ftag, int rail,
                    bool* again);
  Status write(FabricSendRequest* r, void* data, size_t size, MemHandle* mh, const OfferEntry& o, uint32_t seq,
               bool* again);
  Status postSegments(FabricSendRequest* r, bool* again);  // the pieces from r->nextSeg on

  bool offersHeld() const override { return table_ != nullptr && table_->size() > 0; }
  bool inject_;
  size_t stripeMin_;
  std::unique_ptr<OfferTable<OfferEntry>> table_;  // rdma only (start())
};

class FabricRecvComm final : public CommAdaptor<RecvComm, FabricDataComm> {
 public:
  FabricRecvComm(std::shared_ptr<EndpointGroup> group, std::vector<Rail> rails, std::string peerName, int maxRecvs,
                 Protocol proto, CommId localId, uint32_t peerId);
  Status start();  // joins the group; rdma: opens the offer array
  void close() override { closeComm(); }
  Status irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs, bool optional,
               Request** request) override;
  Status iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) override;

 private:
  void flushOffers() override;
  bool sendOffer(FabricRecvRequest* r);  // false: the provider pushed back (queued)

  int maxRecvs_;
  std::vector<uint16_t> offerQueue_;  // requests whose offer waits for the provider (capacity reserved)
};

class FabricListenComm final : public ListenComm {
 public:
  // group: one endpoint per rail of the device; rail 0's is the one the handle names. id: the listen id the
  // handle carries, which becomes the receive comm's id.
  FabricListenComm(std::shared_ptr<EndpointGroup> group, uint64_t token, int maxRecvs, CommId id);
  ~FabricListenComm() override;
  Status accept(RecvComm** recvComm) override;

 private:
  void noteStuck(Endpoint& ep);           // waiting on this end for 10 s is said once
  Status answerRequest(Endpoint& ep);     // a connection request checked and answered (replying_ once accepted)
  Status handOut(RecvComm** recvComm);    // the receive comm, once the reply has left
  FabricDevice& dev_;
  std::shared_ptr<EndpointGroup> group_;  // handed to the recv comm on accept
  std::vector<fi_addr_t> peers_;                 // the connector's address on each rail
  uint64_t token_;
  CommId id_;             // handed to the receive comm on accept
  uint32_t peerId_ = 0;   // the connector's comm id
  int maxRecvs_;
  bool accepted_ = false;
  bool replying_ = false;  // accepted; waiting for the reply to leave before handing out the recv comm
  int64_t stuckSinceMs_ = 0;  // since when accept has waited on this end (no reply slot, or its reply not gone)
  bool toldStuck_ = false;
  Endpoint::ReplyTicket reply_;
  std::string peerName_;
  Protocol proto_;
};

// Send comms with endpoints of their own that NCCL closed after sending, kept until the peer has acknowledged
// their close notices (FabricDataComm::closeComm), a rail failed, or WEFT_PEER_TIMEOUT passed. Process-wide.
// Moved on by every later call into the libfabric backend (the data path only try-locks: it never waits) and
// at finalize, which waits for them a bounded time. A table without finalize (v7-v10) leaves the last ones to
// later calls, or to process exit.
class ClosingComms {
 public:
  static void add(FabricDataComm* comm, int64_t deadlineMs);
  // From the service side (listen, connect, accept, close): every call looks.
  static void poll() {
    if (count_.load(std::memory_order_relaxed) != 0) pollSlow(false, false);
  }
  // From the data path (test): at most once per coarse millisecond, since each look reads every closing comm's
  // queues and a teardown can close thousands while other comms still carry data.
  static void pollFromDataPath() {
    if (count_.load(std::memory_order_relaxed) != 0) pollSlow(false, true);
  }
  // Moves them on until none is left or budgetMs passed; those left are closed as they are (with a warning).
  static void drain(int64_t budgetMs);
  static size_t size() { return count_.load(std::memory_order_relaxed); }

 private:
  static void pollSlow(bool wait, bool rateLimited);
  static std::atomic<size_t> count_;
};

// How an RMA write of `size` bytes goes out: from `stripeMin` bytes one segment per rail (4 KiB aligned), else
// all on `singleRail`; with the compact completion data (imm4) each segment as pieces of the form m * 2^e.
// railIds (nRails entries, nullptr: 0..nRails-1): the rail segment s goes on (a comm with failed rails stripes over
// the rails left). Fills off/len/field/rail (kMaxRecvs entries) and returns the piece count, or -1 past
// WriteImm32::kMaxPieces.
int planWrite(uint64_t size, int nRails, uint64_t stripeMin, bool imm4, int singleRail, uint64_t* off, uint64_t* len,
              uint32_t* field, uint8_t* rail, const uint8_t* railIds = nullptr);

// A comm id for the messages of a re-admitted rail (fabric_backend.cc: from the ids comms get); empty when none is
// free.
CommId railAliasId();

// What this process offers for a new connection (device capability and WEFT_EAGER_MAX).
// rails: the device's (under WEFT_RAIL_FAILOVER, WEFT_PROTOCOL=auto offers rdma on several rails only where the rdma
// protocol can fail over).
uint32_t localProtocolFlags(FabricDevice& dev, int rails);
// The listening end's agreement on a request whose flags are `theirs`, for a connection of nRails rails on a device
// of ourRails (the reply's flags), and the protocol those flags mean.
uint32_t agreeFlags(FabricDevice& dev, uint32_t theirs, int ourRails, int nRails, bool sharedGroup);
Protocol protocolOf(uint32_t agreed, uint32_t eagerMax);
const char* protocolName(const Protocol& p);

}  // namespace weft::fabric
