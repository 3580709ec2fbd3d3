// SPDX-License-Identifier: Apache-2.0
// One reliable-datagram endpoint with its own completion queue and address vector, one rail of an endpoint group
// (fabric/endpoint_group.h). Its completions are routed through the group's comm table to the comm they name;
// they are read only by the thread that drives its comms (NCCL's progress thread), so the data path needs no lock
// of ours.
//
// The endpoint also runs the connection handshake (fabric/wire.h), over control tags:
//   connector --ConnectRequest{token, listen id, its comm id, its address}--> listener
//   listener  --ConnectReply{accepted | bad token | already connected | bad version | no such listen,
//                            the receiving comm's id}--> connector
// Requests are queued per listen id; after a listen accepted, the endpoint refuses further requests for it (a
// replayed or forged handle can never attach a second sender to a connection).
#pragma once

#include <rdma/fi_tagged.h>

#include <array>
#include <climits>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric/comm_table.h"
#include "fabric/fabric_device.h"
#include "fabric/op_context.h"
#include "fabric/rails.h"
#include "fabric/wire.h"
#include "weft/common/numa.h"

namespace weft::fabric {

using wire::ConnectReply;
using wire::ConnectRequest;
using wire::RailAddrs;
using wire::replyStatusName;
using wire::kAccepted;
using wire::kAlreadyConnected;
using wire::kBadToken;
using wire::kBadVersion;
using wire::kNoSuchListen;
using wire::kTunerMismatch;

// What both ends of a connection agree on at connect: the rdma protocol only if both offer it; eager up to the
// connector's (the sender's) limit, since the receiver must post tagged receives whenever eager sends may come.
struct Protocol {
  bool rdma = false;
  bool imm4 = false;  // rdma with the 4-byte completion-data form (either end's NIC carries only 4 bytes)
  bool immId = false;  // imm4 with the comm id, the length taken from the receiver's completion (WriteImmId)
  uint32_t eagerMax = 0;
  // Delivery acknowledgements (wire::AckMsg, WEFT_DELIVERY_ACK): a send completes once the receiver took it.
  bool acks = false;
  // Rail failover (WEFT_RAIL_FAILOVER): with acks and several rails; with the rdma protocol only where the receiver
  // can reset a rail's connection (ConnectRequest::kFlagFailoverRma).
  bool failover = false;
};

Status statusOfFiError(int err);

class Endpoint {
 public:
  static constexpr int64_t kCloseDrainMs = 5;  // rxm over verbs: the queue read this long before closing (~Endpoint)
  // rxm over verbs (and 2.x's over tcp): a comm closed with RMA writes offered and not yet landed keeps its
  // endpoints open for at most this long, until they land (see fabric_closing.cc).
  static constexpr int64_t kAwaitWritesMs = 1000;
  // Whether closing an endpoint of `provider` races what peers send it (libfabric's rxm: ~Endpoint).
  static bool closeRacesArrivals(const std::string& provider);
  static constexpr int kSharedOfferRecvs = 512;  // offer receives of a shared endpoint (see FabricSendComm)
  // shared: the endpoint of a shared group (its completion queue sized for every comm of a context, below).
  static Status open(FabricDevice& dev, std::unique_ptr<Endpoint>* out, bool shared = false);
  // Completion queue entries: a private endpoint's comm has at most kMaxRequests requests of kMaxRecvs
  // operations each in flight (x4 for offers, remote writes and control: 1,088). A shared endpoint's comms
  // together have at most what its queues take (the provider's tx and rx sizes: a send or receive beyond them is
  // pushed back and waits in weft's own queue), plus its offer receives and control messages.
  static size_t cqEntries(const fi_info* info, bool shared);
  // Whether `dev`'s provider reports an RMA write's length at the target: one write with completion data to an
  // endpoint of our own, its target completion read (bounded wait). False on any failure.
  static bool measureWriteLen(FabricDevice& dev);
  // The same, measured once per device and remembered.
  static bool writeLenReported(FabricDevice& dev);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Process-wide: endpoints open now (the measure of sharing: it must not grow with connections), and liveness
  // probes sent so far.
  static int64_t openCount();
  static int64_t probesSent();
  static int64_t stalls();  // stall warnings of this process's fabric comms (WEFT_STALL_S)
  static void countStall();
  // Rails comms saw go down and come back, every comm together (weftNetStat "fabric.rail_downs",
  // "fabric.rail_recoveries"; per comm: FabricDataComm's RailHealth).
  static int64_t railDowns();
  static int64_t railRecoveries();
  static void countRailDown();
  static void countRailRecovery();
  // Rail failover (WEFT_RAIL_FAILOVER): rails comms failed over, and messages they moved to rail 0 (sends sent
  // again, receives posted again), every comm together ("fabric.rail_failovers", "fabric.moved_messages").
  static int64_t railFailovers();
  static int64_t movedMessages();
  static void countRailFailover();
  static void countMoved();
  // Rails comms took back after a failover (WEFT_RAIL_READMIT), every comm together ("fabric.rail_readmits").
  static int64_t railReadmits();
  static void countRailReadmit();
  static int64_t flushReads();  // read-back flush reads completed in this process
  static void countFlushRead();

  fid_ep* ep() const { return ep_.get(); }
  FabricDevice& device() const { return dev_; }
  const std::vector<uint8_t>& name() const { return name_; }
  Status insert(const void* addr, size_t len, fi_addr_t* out);
  // Closes this endpoint's connection to the peer at `to` (an address insert() returned), keeping the address valid:
  // whatever the connection still held is dropped, never delivered later, and the next operation to or from the
  // peer opens a new one. Every comm to that peer process on this endpoint loses what was in flight on it. Only
  // where FabricDevice::resetsPeers (rxm: the address is inserted a second time, then removed once, which closes
  // the connection and leaves the first insertion). Rail failover with the rdma protocol (FabricDataComm).
  Status resetPeer(fi_addr_t to);
  // Times resetPeer closed (or found closed) this endpoint's connection to `to`: a comm that saw a rail fail skips
  // its own reset where another comm's came after the failure (the stale connection is gone already; another
  // reset would cut the new one other comms use).
  uint64_t resetGen(fi_addr_t to) const {
    auto it = resetGens_.find(to);
    return it == resetGens_.end() ? 0 : it->second;
  }
  static int64_t peerResets();  // every endpoint together ("fabric.peer_resets")
  // A read-back flush: an RMA read of one byte at `remoteAddr` (key `key`, a registration of this endpoint's own
  // domain) from this endpoint to itself, into its control memory. *again: the provider pushed back, nothing was
  // posted. Needs FabricDevice::flushes() (the endpoint's own address is in its AV then).
  Status postFlushRead(uint64_t remoteAddr, uint64_t key, OpContext* ctx, bool* again);
  std::string addrString(const void* addr, size_t len) const;

  // Reads one bounded batch of completions. A comm's completions go where the comm table routes them (none
  // before the endpoint joins a group: dropped as strays); control ones are handled here. Returns a non-OK
  // status only for a failure of the queue itself.
  Status progress(int* read = nullptr);  // *read: completions read (0 when the queue was empty)
  void setTable(CommTable* t) { table_ = t; }

  // Listener side. Connection requests are received by the endpoint (kRequestSlots at a time) and queued per
  // listen id; a request for a listen the endpoint does not have is refused (kNoSuchListen), one for a listen
  // that already accepted its connection too (kAlreadyConnected), one of another handshake version as well
  // (kBadVersion, naming both versions), each with a warning. Refusals are best effort: with no reply slot free
  // the connector times out instead.
  Status openListen(uint32_t listenId);
  void closeListen(uint32_t listenId);  // requests still queued for it are refused
  void markAccepted(uint32_t listenId);  // later requests for it are refused
  bool takeConnRequest(uint32_t listenId, ConnectRequest* out);
  // Refuses a request with a warning, replying where the budget of refusals allows.
  void refuse(const ConnectRequest& req, uint16_t status);
  // A reply slot is free: an accepting reply will be sent, not dropped.
  bool replySlotFree() const;
  // Queues a reply; *ticket (when given) tells replyDone() which. Without a free slot nothing is sent (refusals
  // only: accept checks replySlotFree first).
  struct ReplyTicket {
    int slot = -1;
    uint32_t gen = 0;
  };
  // toComm: the connecting comm's id (its reply receive is tagged with it; 0 for a version-3 connector).
  Status sendReply(fi_addr_t to, uint32_t toComm, uint16_t status, uint64_t token, uint32_t flags = 0,
                   const RailAddrs* rails = nullptr, uint32_t commId = 0, ReplyTicket* ticket = nullptr,
                   uint16_t peerVersion = ConnectRequest::kVersion);  // an older connector gets its own, shorter reply
  // True once that reply has left this process (its send completed, or failed).
  bool replyDone(const ReplyTicket& t) const;

  // Posts a receive for a message of weft's own (not NCCL data), retrying a bounded number of times while the
  // provider pushes back. A failure is logged naming `what`.
  Status postOwnRecv(void* buf, size_t len, void* desc, fi_addr_t from, uint64_t tag, OpContext& ctx,
                     const char* what);

  // Liveness, per peer address: every comm to one peer process shares its probes, so a thousand stalled comms to
  // one peer send one probe per interval, not a thousand. A probe is a small message the peer's endpoint drains
  // and discards: its send completing proves a live peer's host took it; an error proves the peer (or the way
  // to it) is gone.
  Status postProbeRecv();
  // A close notice (ack false) or ack (true) to the comm `commId` of the peer at `to` (wire.h). The body is the
  // endpoint's; ctx (kind kNote) is the comm's. *again: the provider pushed back, nothing was sent.
  Status sendCloseNote(fi_addr_t to, uint32_t commId, bool ack, OpContext& ctx, bool* again);
  enum class PeerVerdict : uint8_t {
    kOk,           // nothing proves the peer gone (a probe is out, or one came back since the stall began)
    kGone,         // a probe sent after the stall began failed (*why: its status)
    kUnreachable,  // a probe has not been delivered within timeoutMs
  };
  // For a comm to `to` that has seen no progress since `stalledSinceMs`: probes the peer at most every
  // intervalMs (whichever comm asks), and says what the probes found. An error seen before the stall began
  // (the peer's address reused by a new process since) is forgotten and the peer probed again.
  PeerVerdict checkPeer(fi_addr_t to, int64_t stalledSinceMs, int64_t nowMs, int64_t intervalMs, int64_t timeoutMs,
                        Status* why);
  // When a probe to `to` last completed without error (0: none yet): the peer took it.
  int64_t probeDeliveredMs(fi_addr_t to) const;
  // How long this endpoint's NIC has been seen down (0: up), from sysfs read at most every 100 ms
  // (FabricDevice::linkSource: a network interface's operstate, or the port state of the RDMA device the domain
  // is on, EFA's included); a device sysfs does not know counts as up.
  int64_t linkDownForMs(int64_t nowMs, bool fresh = false);  // fresh: read sysfs now
  // A comm reports this endpoint's NIC down (up false) or back (true): true for the first report of that state
  // since the other was reported (the one that warns; the rest log at INFO).
  bool noteLinkReport(bool up) {
    if (reportedDown_ == !up) return false;
    reportedDown_ = !up;
    return true;
  }

  // Tagged receives of NCCL data posted here and not completed yet, against a budget. shm (libfabric 1.17) keeps
  // posted receives and messages that arrive before their receive in one fixed set of rx_size entries, and a
  // message that finds no entry stops every later one from the same peer: with its entries all taken by posted
  // receives whose messages are queued behind it, nothing moves again. Posting stops at the budget (half of what
  // the endpoint's own receives leave), so messages that come first always find room; a receive over the budget
  // is posted only to claim a message that is already there (FabricDataComm::postPending). Other providers
  // buffer early messages apart from posted receives: no budget.
  bool dataRecvRoom() const { return dataRecvs_ < recvBudget_; }
  void dataRecvPosted() { ++dataRecvs_; }
  void dataRecvDone() { --dataRecvs_; }
  int64_t dataRecvs() const { return dataRecvs_; }

  // Buffer offers (rdma protocol) to every send comm of the endpoint: `n` receives for any comm's offers, each
  // handed to the comm its tag names (DataSink::onOffer) and posted again. Opened by the first send comm; a
  // later call changes nothing.
  Status ensureOfferPool(int n);

  // Connector side: up to kConnectSlots connections in progress at once per endpoint, each with its own request
  // buffer and reply receive, tagged with the connecting comm's id (a reply names whom it answers). A version-3
  // listener answers under id 0: one receive for those, matched by token. *slot: where this connect waits, or -1
  // when every slot is busy (call again later: nothing was sent).
  Status startConnect(uint32_t commId, fi_addr_t to, uint64_t token, uint32_t listenId, uint32_t flags,
                      uint32_t eagerMax, const RailAddrs& rails, int* slot);
  bool takeReply(int slot, ConnectReply* out);
  Status repostReplyRecv(int slot);  // after a reply that did not answer this connection
  Status connectError(int slot) const { return connects_[static_cast<size_t>(slot)].error; }
  // The connect is over (connected, failed or abandoned): the slot is reused once nothing of it is in flight.
  void endConnect(int slot);
  // The handshake's state in one line (connect slots, reply slots, control sends waiting), for a warning when a
  // connect or accept has waited long.
  std::string handshakeState() const;

 private:
  explicit Endpoint(FabricDevice& dev) : dev_(dev) {}
  static void applyProviderOptions(FabricDevice& dev, fid_ep* ep);
  void handleControl(OpContext* ctx, bool ok, Status st);
  void onRequest(int slot);
  void onReply(int slot, bool ok, Status st);
  void tryFreeConnect(int slot);
  Status postRequestRecv(int slot);
  void flushControl();
  Status postControlRecv(void* buf, size_t len, uint64_t tag, OpContext& ctx, OpKind kind, const char* what);

  static constexpr int kReplySlots = 8;
  static constexpr int kRequestSlots = 4;
  static constexpr int kConnectSlots = 4;
  static constexpr size_t kInboxMax = 16;  // requests queued per listen (a flood beyond is dropped)
  struct Control {
    std::array<ConnectRequest, kRequestSlots> requestIn;  // any version's request fits (wire::kRequestBufBytes)
    std::array<ConnectRequest, kConnectSlots> requestOut;
    std::array<ConnectReply, kConnectSlots> replyIn;
    ConnectReply replyAny;  // a version-3 listener's reply (id 0)
    std::array<ConnectReply, kReplySlots> replyOut;
    uint64_t probeOut[2];
    uint64_t probeIn[2];
    uint64_t noticeOut[2];
    uint64_t ackOut[2];
    uint64_t flushSink;  // where read-back flushes put the byte they read (its value is never looked at)
  };
  struct Liveness {
    enum : uint8_t { kIdle, kQueued, kInFlight } state = kIdle;
    int64_t sentMs = 0;   // when the last probe was queued (0: never)
    int64_t errorMs = 0;  // when `error` was seen
    int64_t deliveredMs = 0;  // when a probe last completed without error (the peer took it)
    Status error = Status::kOk;
    OpContext ctx;  // kind kProbeSend, owner: this
  };
  void trySendProbe(fi_addr_t to, Liveness& l, int64_t nowMs);
  void onProbe(size_t len);  // a probe, or a close notice or ack for the comm its body names

  FabricDevice& dev_;
  CommTable* table_ = nullptr;  // the group's: where the comms' completions go
  // Acquisition order; destroyed in reverse (endpoint before its queues and control registration).
  std::unique_ptr<Control> ctl_;
  int64_t dataRecvs_ = 0;
  int64_t recvBudget_ = INT64_MAX;
  MrPtr ctlMr_;
  CqPtr cq_;
  AvPtr av_;
  EpPtr ep_;
  void* ctlDesc_ = nullptr;
  std::vector<uint8_t> name_;
  std::unordered_map<std::string, fi_addr_t> peers_;  // addresses inserted into av_
  std::unordered_map<fi_addr_t, uint64_t> resetGens_;  // resetPeer, per peer address
  fi_addr_t self_ = FI_ADDR_UNSPEC;                    // this endpoint in its own AV (read-back flushes)
  numa::ArrayPtr<wire::OfferMsg> offerPool_;
  numa::ArrayPtr<OpContext> offerPoolCtx_;
  MrPtr offerPoolMr_;
  void* offerPoolDesc_ = nullptr;
  int offerPoolSize_ = 0;
  Status postOfferPoolRecv(int i);

  std::array<OpContext, kRequestSlots> requestRecvCtx_;
  bool requestsPosted_ = false;
  struct Inbox {
    std::deque<ConnectRequest> queue;
    bool accepted = false;
  };
  std::unordered_map<uint32_t, Inbox> listens_;
  std::array<OpContext, kReplySlots> replySendCtx_;
  enum class SlotState : uint8_t { kFree, kQueued, kInFlight };
  std::array<SlotState, kReplySlots> replySlot_{};
  std::array<uint32_t, kReplySlots> replyGen_{};  // bumped when the slot's reply has left
  std::array<fi_addr_t, kReplySlots> replyTo_{};
  std::array<uint32_t, kReplySlots> replyComm_{};
  std::array<size_t, kReplySlots> replyLen_{};
  struct ConnectSlot {
    uint32_t commId = 0;  // 0: free
    bool ended = false;   // endConnect was called; freed once nothing is in flight
    SlotState request = SlotState::kFree;
    bool replyPosted = false;
    bool replyPending = false;  // a reply arrived, waiting for takeReply
    bool cancelling = false;    // the reply receive is being canceled
    fi_addr_t to = FI_ADDR_UNSPEC;
    uint64_t token = 0;
    Status error = Status::kOk;
    OpContext sendCtx, recvCtx;
  };
  std::array<ConnectSlot, kConnectSlots> connects_;
  OpContext replyAnyCtx_;
  bool replyAnyPosted_ = false;
  bool controlQueued_ = false;  // a control send is waiting for the provider to accept it
  // A control send refused for no route (the NIC's link is down: a flap) waits, tried again every 100 ms from
  // then, within the connect's own deadline (WEFT_CONNECT_TIMEOUT), instead of failing the connect at once.
  int64_t controlRetryMs_ = 0;
  OpContext probeRecvCtx_;
  std::unordered_map<fi_addr_t, std::unique_ptr<Liveness>> liveness_;  // by peer address, kept with the AV
  int64_t linkCheckMs_ = 0, linkDownSinceMs_ = 0;
  bool reportedDown_ = false;
  int refusals_ = 0;
  bool counted_ = false;  // in openCount()
};

}  // namespace weft::fabric
