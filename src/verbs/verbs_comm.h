// SPDX-License-Identifier: Apache-2.0
// Listen, send and receive comms of the verbs backend.
//
// Connection: the handle names a TCP address of the listening device's interface and a random token. connect()
// opens a non-blocking TCP connection and sends its QP numbers, PSN, LID/GID and token; the listener checks the
// token, creates its QPs, moves them to RTR/RTS and answers with its own; the connector moves its QPs to RTR/RTS
// and sends one byte ("ready"), after which accept() hands out the receive comm. Every step is a non-blocking
// call NCCL polls; the socket closes once the QPs are connected.
//
// Data (the rdma protocol of the libfabric backend, on reliable-connected QPs): each irecv sends the sender one
// offer (address, rkey, size, slot of every buffer; one SEND, inline when small); the sender RDMA-writes the
// payload straight into the offered buffer with immediate data naming the slot (verbs_util.h Imm). The receiver
// keeps zero-length receives posted on every QP to take the immediates; the written length comes with each
// completion. Messages of WEFT_STRIPE_MIN bytes or more are split across the connection's QPs. An isend whose
// offer has not arrived returns a NULL request (NCCL retries), as NCCL's own IB transport does.
// One completion queue per comm, polled from test(): no progress thread.
//
// Failures: a completion error (the verbs status name and the peer logged) or an asynchronous QP/port/device
// error fails every request of the comm. A comm with requests outstanding and nothing completing for
// WEFT_PROBE_INTERVAL ms writes 8 bytes into its peer's probe word: a live peer's NIC acknowledges it, a dead
// process's QP is gone and the write fails after the QP's retries (WEFT_IB_TIMEOUT, WEFT_IB_RETRY_CNT), or
// after WEFT_PEER_TIMEOUT at the latest.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "verbs/verbs_device.h"
#include "weft/common/netif.h"
#include "weft/common/numa.h"
#include "weft/transport/comm_adaptor.h"
#include "weft/transport/offer_table.h"
#include "weft/transport/oob.h"
#include "weft/transport/request_pool.h"
#include "weft/transport/silence.h"
#include "weft/transport/tag_seq.h"

namespace weft::verbs {

constexpr int kMaxQps = 8;

// What each side tells the other over the handshake socket. Version 2 added the tuner's digest
// (weft/transport/agreement.h) at the end: a side reads version 1's bytes first, and the rest only from a peer of
// its own version, so another version is refused cleanly rather than waited for.
struct QpInfo {
  static constexpr uint32_t kMagic = 0x57464942;  // "WFIB"
  static constexpr uint16_t kVersion = 2;
  enum : uint32_t { kAccepted = 0, kWrongToken = 1, kBadRequest = 2, kNoResources = 3, kTunerMismatch = 4 };
  uint32_t magic;
  uint16_t version;
  uint16_t nQps;
  uint64_t token;
  uint32_t qpn[kMaxQps];
  uint32_t psn;
  uint32_t status;
  uint16_t lid;
  uint8_t roce;
  uint8_t mtu;
  uint8_t gid[16];
  uint64_t probeAddr;
  uint32_t probeRkey;
  uint32_t trafficClass;  // connector's request: traffic class + 1 (0: none given)
  uint64_t tunerDigest;   // version 2: the sender's tuner decision state (0: not checked)
  static constexpr size_t kBytesV1 = 96;  // version 1's whole message: magic and version first, as ever
};
static_assert(offsetof(QpInfo, tunerDigest) == QpInfo::kBytesV1, "version 2 only appends");

// One buffer as the receiver offers it.
struct VerbsOffer {
  uint64_t addr;
  uint64_t tagSeq;  // (NCCL tag, per-tag sequence number)
  uint32_t rkey;
  uint32_t len;     // NCCL buffers are < 2 GiB (sizes are int)
  uint32_t slot;    // returned in the immediate data
  uint32_t flags;   // kOfferNoKey: the buffer has no registration (0-byte receives only)
};
constexpr uint32_t kOfferNoKey = 1;
// VerbsOffer::tagSeq of a receive: the NCCL tag high, its per-tag sequence number low.
inline uint64_t tagSeqKey(int tag, uint32_t seq) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 32) | seq;
}

struct VerbsOfferMsg {
  static constexpr uint32_t kMagic = 0x57464f56;  // "WFOV"
  uint32_t magic;
  uint32_t count;
  VerbsOffer entry[kMaxRecvs];
  static size_t bytes(int count) { return offsetof(VerbsOfferMsg, entry) + sizeof(VerbsOffer) * count; }
};

// A non-blocking TCP socket carrying the handshake: whole messages out, exact byte counts in.
class HandshakeSocket {
 public:
  explicit HandshakeSocket(int fd = -1) : fd_(fd) {}
  ~HandshakeSocket();
  HandshakeSocket(const HandshakeSocket&) = delete;
  HandshakeSocket& operator=(const HandshakeSocket&) = delete;
  int fd() const { return fd_; }
  void queue(const void* data, size_t len);
  // Sends what is queued: kOk (check sent()), or an error when the connection failed.
  Status flush(std::string* why);
  bool sent() const { return out_.empty(); }
  // Reads until `want` bytes are in: true when they are (taken with take()), false for "not yet"; *why set on
  // failure (the peer closed or reset).
  bool fill(size_t want, std::string* why);
  // Moves the first n bytes read (fill(n) returned true) into `out`, or drops them when out is nullptr.
  void take(void* out, size_t n);
  // A QpInfo of any version: true once it is in (*out zero-filled past what its version sends), false for "not
  // yet" (*why set on failure).
  bool readQpInfo(QpInfo* out, std::string* why);

 private:
  int fd_;
  std::string out_;
  std::string in_;
};

// The QPs and completion queue of one connection.
class QpSet : public QpOwner {
 public:
  QpSet(VerbsDevice& dev, int nQps, int sendWr, int recvWr);
  ~QpSet();
  QpSet(const QpSet&) = delete;
  QpSet& operator=(const QpSet&) = delete;
  Status create(std::string* why);
  // Fills the QP part of `info` (QP numbers, PSN, LID/GID, probe word).
  void describe(QpInfo* info) const;
  // INIT -> RTR -> RTS against the peer's description.
  Status connect(const QpInfo& peer, int trafficClass, std::string* why);
  VerbsDevice& dev;
  const int nQps;
  const int sendWr;
  const int recvWr;
  ibv_cq* cq = nullptr;  // set before create() to share another set's queue (not destroyed then)
  bool ownCq = false;
  ibv_qp* qps[kMaxQps] = {};
  uint32_t maxInline = 0;
  uint64_t peerProbeAddr = 0;
  uint32_t peerProbeRkey = 0;
  uint32_t psn = 0;
  // The word a peer's liveness probe writes (8 bytes, registered for remote write), and the source of ours.
  uint64_t probeWord[2] = {};
  ibv_mr* probeMr = nullptr;
};

class VerbsDataComm;

class VerbsRequest final : public Request {
 public:
  Status test(bool* done, int* sizes) override;
  VerbsDataComm* comm = nullptr;
  uint16_t poolIndex = 0;
  bool inUse = false;
  bool recv = false;
  bool reported = false;
  uint8_t n = 0;
  Status error = Status::kOk;
  // send
  uint32_t size = 0;
  uint16_t writesLeft = 0;
  // recv
  bool offerPending = false;  // the offer's SEND has not completed yet
  uint8_t doneBufs = 0;
  uint8_t piecesSeen[kMaxRecvs] = {};
  uint8_t piecesWant[kMaxRecvs] = {};
  bool bufDone[kMaxRecvs] = {};
  uint64_t bytes[kMaxRecvs] = {};
  uint32_t cap[kMaxRecvs] = {};
  int ops = 0;  // work requests of this request still owned by the NIC (writes, the offer, a flush read)
};

// A comm, its requests and its offer buffers live on the NUMA node of its NIC (numa::make, docs/topology.md).
// Stall warnings of this process's verbs comms (weftNetStat verbs.stalls).
std::atomic<int64_t>& stallCount();

class VerbsDataComm : public numa::Placed {
 public:
  VerbsDataComm(std::unique_ptr<QpSet> qps, std::string peerName, int poolSize);
  virtual ~VerbsDataComm();
  Status testRequest(VerbsRequest* r, bool* done, int* sizes);
  Status registerMr(void* data, size_t size, int type, int fd, uint64_t offset, MemHandle** out);
  Status deregisterMr(MemHandle* mh);
  std::string commDeviceName() const;
  const DeviceProps& commDeviceProps() const { return dev_.props(); }
  // One QP set per connection: no rails to report (CommAdaptor).
  const RailHealth* railHealth(int* n) const {
    *n = 0;
    return nullptr;
  }
  void refreshRailHealth() {}
  const std::string& peer() const { return peerName_; }
  void setLocalName(std::string name) { localName_ = std::move(name); }
  int qpCount() const { return q_->nQps; }
  // For fault-injection tests (weft_verbs_fault_tests): the connection's QPs.
  ibv_qp* qpForTest(int i) const { return i >= 0 && i < q_->nQps ? q_->qps[i] : nullptr; }

 protected:
  enum Kind : uint64_t { kWrite = 1, kOfferSend = 2, kOfferRecv = 3, kImmRecv = 4, kProbe = 5, kFlush = 6 };
  static uint64_t wrId(Kind k, uint32_t index) { return (static_cast<uint64_t>(k) << 32) | index; }
  static const char* kindName(uint64_t kind);
  VerbsRequest* acquire();
  void release(VerbsRequest* r);
  void progress();
  virtual void onCompletion(const ibv_wc& wc) = 0;
  void onError(const ibv_wc& wc);
  // Registers one of the comm's own buffers for local access (offers, the flush target); warns on failure.
  ibv_mr* registerLocal(void* p, size_t n, const char* what);
  void opDone(VerbsRequest* r);
  void probeDone(const ibv_wc& wc);  // a liveness probe's work request came back (either way)
  int qpIndex(uint32_t qpNum) const;
  void checkPeer();
  // Stall warnings (WEFT_STALL_S, docs/hangs.md): requests outstanding with no data completion (probes do not count)
  // for that long, while the peer's NIC acknowledges probes: once per stall, from checkPeer.
  void watchStall(int64_t nowMs);
  virtual std::string stallWhat() const = 0;  // what the comm's requests wait for (send or receive side)
  int64_t stallMs_ = 0;
  uint64_t dataDone_ = 0, stallSeenDone_ = 0;  // completions other than probes
  uint32_t busyEpoch_ = 0, stallEpoch_ = 0;  // times the comm went from nothing outstanding to something
  int64_t stallFromMs_ = 0, probeOkMs_ = 0;

 public:
  StallState stall_;  // what watchStall found (Comm::stallState)

 protected:
  void countPosted() {
    if (outstanding_++ == 0) ++busyEpoch_;
  }
  Status checkMh(const MemHandle* mh, const void* data, size_t size, const char* op) const;
  void postProbe();
  void fail(Status st) {
    if (fatal_ != Status::kOk) return;
    fatal_ = st;
    if (st == Status::kRemote) stall_.lostPeer();  // the peer's QP, NIC or process (the dumps' peer_gone)
    // This host's port went down (its event may only now be read): the link, whatever the completion said.
    dev_.pollAsync();
    if (!dev_.usable()) stall_.lostPeer(StallKind::kLink);
  }

  std::unique_ptr<QpSet> q_;
  VerbsDevice& dev_;
  std::string peerName_;
  // This end's out-of-band socket address at set-up (the peer's peerName_: weft report --hangs pairs the two ends).
  std::string localName_;
  // Requests (weft/transport/request_pool.h): request i is reqAt(i), which stays where it is.
  using Pool = RequestPool<numa::ArrayPtr<VerbsRequest>>;
  Pool pool_;
  VerbsRequest* reqAt(size_t i) const {
    return i < pool_.allocated() ? &pool_.chunkOf(i)[Pool::slotOf(i)] : nullptr;
  }
  Status fatal_ = Status::kOk;
  int sendQueued_[kMaxQps] = {};  // work requests posted and not yet completed, per QP
  int outstanding_ = 0;           // requests handed to NCCL and not reported
  Silence silence_;  // how long nothing completed, as checkPeer sees it
  uint32_t polls_ = 0;
  int64_t probeSentMs_ = 0;
  int probesInFlight_ = 0;
  int64_t probeDeadlineMs_ = 0;  // WEFT_PEER_TIMEOUT, plus time for the bytes queued ahead of the probe
  uint64_t bytesInFlight_ = 0;    // posted RDMA-write bytes not yet completed (sends)
  uint64_t floorBytesPerMs_ = 1;  // 1% of the port speed: the slowest a live link is assumed to drain
  int flushQueued_ = 0;
  bool waitingOffer_ = false;
  int probeIntervalMs_ = 0;
  int64_t peerTimeoutMs_ = 0;
  uint64_t stripeMin_ = 0;
};

// The Comm interface of a verbs send or receive comm, forwarded to VerbsDataComm.
template <typename Iface>
using VerbsComm = CommAdaptor<Iface, VerbsDataComm>;

class VerbsSendComm final : public VerbsComm<SendComm> {
 public:
  std::string stallWhat() const override;
  // QPs sized for a sender: RDMA writes of up to kMaxRequests x maxRecvs sends and probes out, offers in.
  static std::unique_ptr<QpSet> makeQps(VerbsDevice& dev, int nQps) {
    return std::make_unique<QpSet>(dev, nQps, kMaxRequests * kMaxRecvs + 16, kOfferRecvs + 16);
  }
  VerbsSendComm(std::unique_ptr<QpSet> qps, std::string peerName, int maxRecvs);
  ~VerbsSendComm() override;
  Status start();
  Status isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) override;

 private:
  static constexpr int kOfferRecvs = 64;
  void onCompletion(const ibv_wc& wc) override;
  bool postOfferRecv(int i);
  numa::ArrayPtr<VerbsOfferMsg> offers_;
  ibv_mr* offersMr_ = nullptr;
  OfferTable<VerbsOffer> table_;
  TagSequence seqs_;
};

class VerbsRecvComm final : public VerbsComm<RecvComm> {
 public:
  std::string stallWhat() const override;
  // QPs sized for a receiver: offers (one per receive) and probes out, an immediate per offered buffer in.
  static std::unique_ptr<QpSet> makeQps(VerbsDevice& dev, int nQps) {
    return std::make_unique<QpSet>(dev, nQps, kMaxRequests + 16, kMaxRequests * kMaxRecvs + 16);
  }
  VerbsRecvComm(std::unique_ptr<QpSet> qps, std::string peerName);
  ~VerbsRecvComm() override;
  Status start();
  Status irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs, bool optional,
               Request** request) override;
  Status iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) override;
  // Read-back flush reads completed in this process, every comm together (weftNetStat "flush_reads").
  static int64_t flushReads();

 private:
  void onCompletion(const ibv_wc& wc) override;
  bool postImmRecv(int qp);
  Status ensureFlushQp();
  numa::ArrayPtr<VerbsOfferMsg> offers_;
  ibv_mr* offersMr_ = nullptr;
  TagSequence seqs_;
  // GPU buffers: an RDMA read of one byte over a QP connected to itself makes the NIC's earlier writes visible
  // to the GPU before NCCL's kernel reads them (NCCL's IB transport does the same).
  std::unique_ptr<QpSet> flushQp_;
  uint64_t flushWord_ = 0;
  ibv_mr* flushMr_ = nullptr;
};

class VerbsListenComm final : public ListenComm {
 public:
  VerbsListenComm(VerbsDevice& dev, oob::Socket listen, uint64_t token);
  Status accept(RecvComm** recvComm) override;

 private:
  VerbsDevice& dev_;
  oob::Socket listen_;  // the listening socket (weft/transport/oob.h), closed with the comm
  uint64_t token_;
  static constexpr std::chrono::seconds kHandshakeTimeout{30};  // for one connector to finish its part
  std::unique_ptr<HandshakeSocket> sock_;  // the connection being accepted
  std::string peerName_;
  std::unique_ptr<QpSet> qps_;
  bool replied_ = false;
  std::chrono::steady_clock::time_point started_;
};

using weft::bindTcpSocket;  // weft/common/netif.h
using weft::sockaddrString;

}  // namespace weft::verbs
