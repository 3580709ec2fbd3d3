// Listen, send and receive comms over one libfabric endpoint per rail (NIC of the device) each, and their pooled
// requests.
// Data path (isend/irecv/iflush/test): no allocation, no lock, no syscall of ours; one bounded batch of
// completions per call.
//
// Two protocols (agreed per connection at connect, see Protocol):
// - sendrecv: every message is a tagged send matched by tag = (NCCL tag, per-tag sequence number).
// - rdma: each irecv sends the sender one offer (address, key, size, slot of every buffer; one message for a
//   grouped receive). The sender RMA-writes the payload straight into the offered buffer with 8 bytes of remote
//   completion data: [63:48] slot (request index * 8 + buffer), [47:44] flags, [43:40] pieces, [39:0] bytes.
//   Providers with 4 bytes of completion data (EFA, verbs) use the compact form (WriteImm32); there a length is
//   m * 2^e, and a message whose length is not of that form goes as up to 3 pieces, each its own write.
//   The receiver completes the buffer when that data arrives. An isend whose offer has not come yet returns a
//   NULL request (NCCL retries), like NCCL's own IB transport.
// - eager (with rdma): messages up to Protocol::eagerMax go at once as tagged sends without waiting for the
//   offer, into a tagged receive the receiver posted beside the offer; the offer, when it comes, is dropped.
//   A buffer filled by RMA cancels its tagged receive (the request goes back to the pool when the cancel
//   completes; NCCL already has its answer).
//
// Rails (a device of several NICs, see rails.h): every comm has one endpoint per rail, rail 0 also carrying the
// handshake, offers and probes. A tagged message travels on rail (sequence % rails), which both ends compute
// alike; an RMA write of at least WEFT_STRIPE_MIN bytes is split into one segment per rail (the completion
// data says how many segments make the buffer), smaller ones go round-robin like tagged messages.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "fabric/fabric_endpoint.h"
#include "weft/transport/offer_table.h"
#include "weft/transport/tag_seq.h"

namespace weft::fabric {

class FabricDataComm;

// One receive buffer as the receiver offers it.
struct OfferEntry {
  uint64_t addr[kMaxRails];  // per rail, as the sender must name it (virtual address or offset into the registration)
  uint64_t key[kMaxRails];   // per rail: remote key of the registration on that NIC
  uint64_t len;     // buffer size
  uint64_t tagSeq;  // dataTag(NCCL tag, sequence)
  uint16_t slot;    // returned in the completion data
  uint16_t flags;   // kOfferTaggedOnly: no key (unregistered buffer): send tagged whatever the size
  uint32_t reserved;
};
constexpr uint16_t kOfferTaggedOnly = 1;

struct OfferMsg {
  static constexpr uint32_t kMagic = 0x57464f46;  // "WFOF"
  uint32_t magic;
  uint16_t count;
  uint16_t reserved;
  OfferEntry entry[kMaxRecvs];
  static size_t bytes(int count) { return offsetof(OfferMsg, entry) + sizeof(OfferEntry) * count; }
};

// Remote completion data of an RMA write (rdma protocol), 8-byte form.
struct WriteImm {
  static constexpr uint64_t kTruncated = 1;  // flag: the message was larger than the offered buffer
  static uint64_t encode(uint16_t slot, uint64_t flags, uint64_t segments, uint64_t bytes) {
    return (static_cast<uint64_t>(slot) << 48) | ((flags & 0xf) << 44) | ((segments & 0xf) << 40) |
           (bytes & ((uint64_t{1} << 40) - 1));
  }
  static uint16_t slot(uint64_t d) { return static_cast<uint16_t>(d >> 48); }
  static uint64_t flags(uint64_t d) { return (d >> 44) & 0xf; }
  static uint64_t segments(uint64_t d) { return (d >> 40) & 0xf; }
  static uint64_t bytes(uint64_t d) { return d & ((uint64_t{1} << 40) - 1); }
};

// The 4-byte form: [31:23] slot, [22:20] pieces - 1, [19] truncated, [18:4] m, [3:0] e; the piece holds m * 2^e
// bytes. Slots fit 9 bits (64 receive requests x 8 buffers).
struct WriteImm32 {
  static constexpr uint64_t kMaxM = (1u << 15) - 1;
  static constexpr int kMaxE = 15;
  static constexpr int kMaxPieces = 8;
  // The largest length of the form m * 2^e that is <= len (len > 0), and its encoding.
  static uint64_t largestPiece(uint64_t len, uint32_t* field) {
    int e = 0;
    while ((len >> e) > kMaxM && e < kMaxE) ++e;
    uint64_t m = std::min<uint64_t>(len >> e, kMaxM);
    *field = static_cast<uint32_t>((m << 4) | static_cast<uint64_t>(e));
    return m << e;
  }
  static uint64_t encode(uint16_t slot, uint64_t flags, uint64_t pieces, uint32_t lenField) {
    return (static_cast<uint64_t>(slot & 0x1ff) << 23) | (((pieces - 1) & 7) << 20) | ((flags & 1) << 19) |
           (lenField & 0x7ffff);
  }
  static uint16_t slot(uint64_t d) { return static_cast<uint16_t>((d >> 23) & 0x1ff); }
  static uint64_t flags(uint64_t d) { return (d >> 19) & 1; }
  static uint64_t pieces(uint64_t d) { return ((d >> 20) & 7) + 1; }
  static uint64_t bytes(uint64_t d) { return ((d >> 4) & kMaxM) << (d & 0xf); }
};

class FabricRequest final : public Request {
 public:
  Status test(bool* done, int* sizes) override;

  // Per receive buffer.
  enum BufFlags : uint8_t {
    kNeedPost = 1,   // a tagged receive must still be handed to the provider (it pushed back)
    kPosted = 2,     // a tagged receive is in the provider's hands
    kOffered = 4,    // offered for RMA: completion data may fill it
    kDone = 8,       // data arrived
    kCanceled = 16,  // its tagged receive is being canceled
  };

  FabricDataComm* comm = nullptr;
  uint16_t poolIndex = 0;
  uint8_t n = 0;        // buffers (1 for sends)
  uint8_t doneBufs = 0;  // buffers whose data arrived (or, for a send, 1 when it completed)
  int ops = 0;          // operations in the provider's hands (the request is reusable only at 0)
  bool recv = false;
  bool reported = false;   // test() said done (or failed): the request is NCCL's no more
  bool optional = false;   // NCCL_NET_OPTIONAL_RECV_COMPLETION: done once the offer has left
  bool offerSent = false;  // the offer's send completed
  Status error = Status::kOk;
  int sizes[kMaxRecvs] = {};
  void* data[kMaxRecvs] = {};
  size_t len[kMaxRecvs] = {};
  uint64_t tag[kMaxRecvs] = {};
  void* desc[kMaxRecvs] = {};
  uint8_t flags[kMaxRecvs] = {};
  uint64_t rmaBytes[kMaxRecvs] = {};
  uint8_t rmaSegs[kMaxRecvs] = {};  // pieces landed
  uint8_t rail[kMaxRecvs] = {};  // the rail each tagged receive is posted on
  OpContext ctx[kMaxRecvs];
  OpContext offerCtx;

  // Sends: an RMA write as pieces (one per rail when striped; more where the compact completion data cannot
  // say a length in one), posted piece by piece (a piece the provider pushed back on is posted from test()).
  uint8_t nSeg = 1;      // pieces of this send
  uint8_t nextSeg = 1;   // the next piece to post
  uint8_t segsLeft = 1;  // pieces whose completion has not come yet
  uint8_t immFlags = 0;  // WriteImm flags every piece carries
  const char* src = nullptr;
  const MemHandle* mh = nullptr;
  uint64_t pieceOff[kMaxRecvs] = {};
  uint64_t pieceLen[kMaxRecvs] = {};
  uint32_t pieceField[kMaxRecvs] = {};  // compact form: the m/e field of each piece
  uint8_t pieceRail[kMaxRecvs] = {};
  OfferEntry offer;
};

// One NIC of a comm: its endpoint, the peer's address on it, and what crossed it.
struct Rail {
  std::unique_ptr<Endpoint> ep;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  uint64_t txMsgs = 0, txBytes = 0;
};

// What send and receive comms share: the endpoint, the peer, the request pool, progress and completion.
class FabricDataComm : public DataSink {
 public:
  FabricDataComm(std::vector<Rail> rails, std::string peerName, int poolSize, Protocol proto);
  ~FabricDataComm() override;

  Status testRequest(FabricRequest* r, bool* done, int* sizes);
  void onComplete(OpContext* ctx, size_t len) noexcept override;
  void onError(OpContext* ctx, int fiErr, Status st) noexcept override;
  void onRemoteData(uint64_t data) noexcept override;

 protected:
  FabricRequest* acquire();
  void release(FabricRequest* r);
  void opDone(FabricRequest* r);  // one provider operation of r finished
  Status progress();
  Status postPending(FabricRequest* r);  // receives only: tagged receives the provider pushed back on
  // Registers on every rail's NIC (fd >= 0: a DMA-BUF); the handle chains the per-rail ones.
  Status regOnDevice(void* data, size_t size, int type, int fd, uint64_t offset, MemHandle** out);
  Status deregOnDevice(MemHandle* mh);
  Status checkHandle(const MemHandle* mh, const char* op) const;
  int railOf(uint32_t seq) const { return nRails_ == 1 ? 0 : static_cast<int>(seq % nRails_); }
  Endpoint& ctl() const { return *rails_[0].ep; }  // handshake, offers, probes
  Status openOffers(int count);  // registered array of `count` offer messages
  virtual void onOfferRecv(int index) noexcept { (void)index; }
  virtual void flushOffers() {}
  virtual void resumeSend(FabricRequest* r) { (void)r; }  // sends: post what the provider pushed back on

  FabricDevice& dev_;  // rail 0's NIC (names in messages; registration of weft's own buffers)
  std::vector<Rail> rails_;
  int nRails_;
  std::string peerName_;
  Protocol proto_;
  int poolSize_;
  std::unique_ptr<FabricRequest[]> pool_;
  std::vector<uint16_t> free_;  // capacity reserved up front: push/pop never allocate
  TagSequence seqs_;
  Status fatal_ = Status::kOk;  // once set, every call on this comm fails with it
  std::unique_ptr<OfferMsg[]> offers_;  // rdma: sent (receiver) or received (sender) offers
  MrPtr offersMr_;
  void* offersDesc_ = nullptr;

  // Liveness (see checkPeer), looked at once per 1024 progress calls while requests are outstanding.
  void checkPeer();
  int outstanding_ = 0;
  bool waitingOffer_ = false;  // isend is waiting for the receiver's offer
  uint32_t completions_ = 0;      // every completion, success or error
  uint32_t completionsSeen_ = 0;  // completions_ at checkPeer's last look
  uint32_t polls_ = 0;
  int64_t lastActivityMs_ = 0;
  int64_t probeSentMs_ = 0;
  int64_t probeIntervalMs_;
  int64_t peerTimeoutMs_;
  int64_t linkDownSinceMs_ = 0;  // when a rail's link was first seen down while stalled (0: all up)
  int64_t lastLinkCheckMs_ = 0;
};

class FabricSendComm final : public SendComm, public FabricDataComm {
 public:
  FabricSendComm(std::vector<Rail> rails, std::string peerName, int maxRecvs, Protocol proto);
  Status start();  // rdma: posts the offer receives
  Status isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) override;
  std::string peerName() const override { return peerName_; }
  std::string deviceName() const override;
  Status regMr(void* data, size_t size, int type, MemHandle** out) override {
    return regOnDevice(data, size, type, -1, 0, out);
  }
  Status regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out) override {
    return regOnDevice(data, size, type, fd, offset, out);
  }
  Status deregMr(MemHandle* mh) override { return deregOnDevice(mh); }

  static constexpr int kOfferRecvs = 2 * kMaxRequests;

 private:
  void onOfferRecv(int index) noexcept override;
  void resumeSend(FabricRequest* r) override {
    bool again;
    postSegments(r, &again);
  }
  Status postOfferRecv(int index);
  // *again: the provider pushed back; nothing was posted.
  Status sendTagged(FabricRequest* r, void* data, size_t size, MemHandle* mh, uint64_t ftag, bool* again);
  Status write(FabricRequest* r, void* data, size_t size, MemHandle* mh, const OfferEntry& o, uint32_t seq,
               bool* again);
  Status postSegments(FabricRequest* r, bool* again);  // the pieces from r->nextSeg on

  bool inject_;
  size_t stripeMin_;
  OfferTable<OfferEntry> table_;
  std::unique_ptr<OpContext[]> offerRecvCtx_;
};

class FabricRecvComm final : public RecvComm, public FabricDataComm {
 public:
  FabricRecvComm(std::vector<Rail> rails, std::string peerName, int maxRecvs, Protocol proto);
  Status start();  // rdma: opens the offer array
  std::string peerName() const override { return peerName_; }
  std::string deviceName() const override;
  Status irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs, bool optional,
               Request** request) override;
  Status iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) override;
  Status regMr(void* data, size_t size, int type, MemHandle** out) override {
    return regOnDevice(data, size, type, -1, 0, out);
  }
  Status regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out) override {
    return regOnDevice(data, size, type, fd, offset, out);
  }
  Status deregMr(MemHandle* mh) override { return deregOnDevice(mh); }

 private:
  void flushOffers() override;
  bool sendOffer(FabricRequest* r);  // false: the provider pushed back (queued)

  int maxRecvs_;
  std::vector<uint16_t> offerQueue_;  // requests whose offer waits for the provider (capacity reserved)
};

class FabricListenComm final : public ListenComm {
 public:
  // eps: one endpoint per rail of the device; eps[0] is the one the handle names.
  FabricListenComm(std::vector<std::unique_ptr<Endpoint>> eps, uint64_t token, int maxRecvs);
  Status accept(RecvComm** recvComm) override;

 private:
  FabricDevice& dev_;
  std::vector<std::unique_ptr<Endpoint>> eps_;  // handed to the recv comm on accept
  std::vector<fi_addr_t> peers_;                 // the connector's address on each rail
  uint64_t token_;
  int maxRecvs_;
  bool accepted_ = false;
  bool replying_ = false;  // accepted; waiting for the reply to leave before handing out the recv comm
  std::string peerName_;
  Protocol proto_;
};

// This side's further rail addresses, for the handshake.
RailAddrs railAddrsOf(const std::vector<std::unique_ptr<Endpoint>>& eps);

// How an RMA write of `size` bytes goes out: from `stripeMin` bytes one segment per rail (4 KiB aligned), else
// all on `singleRail`; with the compact completion data (imm4) each segment as pieces of the form m * 2^e.
// Fills off/len/field/rail (kMaxRecvs entries) and returns the piece count, or -1 past WriteImm32::kMaxPieces.
int planWrite(uint64_t size, int nRails, uint64_t stripeMin, bool imm4, int singleRail, uint64_t* off, uint64_t* len,
              uint32_t* field, uint8_t* rail);

// What this process offers for a new connection (device capability and WEFT_EAGER_MAX).
uint32_t localProtocolFlags(const FabricDevice& dev);

}  // namespace weft::fabric
