// SPDX-License-Identifier: Apache-2.0
// Listen, send and receive comms of the native TCP backend (WEFT_BACKEND=tcp): one non-blocking TCP_NODELAY
// socket per comm, progressed inline from isend, irecv and test (no poll, no wake-up fds, no lock on the data path:
// NCCL calls a comm's data path from one thread, docs/nccl-semantics.md §threads). With WEFT_TCP_THREADS the
// sockets of flows 1 and up move on a device's helper threads instead (tcp_helpers.h); every decision stays here.
//
// Connection: the handle names the listen socket's address and a random token. connect() opens a non-blocking
// TCP connection and sends a hello (token, the tuner's digest); the listener checks it and answers; the connector
// hands out its send comm once the answer says accepted. Every step is a non-blocking call NCCL polls; the same
// socket then carries the data, receiver-bound only.
//
// Data: each message is a 16-byte header (size, tag, a check word with the message's sequence number) followed by
// the payload, written with one sendmsg (queued messages go out together, several per call). A send completes when
// its last byte is in the kernel's socket buffer, as NCCL's Socket transport does. The receiver reads into a small
// staging buffer (a header with a small payload, often several, arrive in one recv); the rest of a large payload
// is read straight into the posted buffer. A header goes to the first posted receive buffer, in posting order,
// with its tag that has no message yet (grouped receives: any order within a group); one that matches none waits
// in the staging buffer, unread further, until NCCL posts its receive (TCP's window holds the sender back).
//
// Flows: a connection may have several TCP flows (a cloud NIC caps each flow far below the link, and hashes flows
// onto paths): WEFT_TCP_FLOWS, or a count from the interface's NIC (tcp_backend.cc), times the interfaces of a
// device NCCL fused (makeVDevice); flow k leaves by interface k % interfaces and meets the listener's socket on the
// same interface. Flow 0 carries every message header, in order, and every message below WEFT_STRIPE_MIN bytes
// whole. A larger message's header says "in pieces" and carries no payload: its bytes are cut into chunks of
// WEFT_TCP_CHUNK bytes that the flows pull as they have room (a flow that falls behind, on a slow path, takes
// less), each behind a piece header (offset, length, the message's sequence number). The receiver places a piece
// by its offset once flow 0 has matched its message; a flow whose next piece is for a message not matched yet
// waits (each flow's pieces are in message order).
//
// Failures: the peer's process dying closes its socket (EOF or reset: requests fail at once); a peer host or link
// that goes silent is found by TCP itself (TCP_USER_TIMEOUT on unacknowledged data, keepalive probes on an idle
// connection, both WEFT_PEER_TIMEOUT), no probe of ours. A header whose check word is wrong (a corrupted or
// desynchronised stream) or whose size exceeds its receive buffer fails the comm.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/common/numa.h"
#include "weft/transport/comm_adaptor.h"
#include "weft/transport/mr_cache.h"
#include "weft/transport/net.h"
#include "weft/transport/request_pool.h"

namespace weft::tcp {

constexpr int kMaxFlows = 64;  // TCP flows a connection may have (NCCL's Socket transport: 64 sockets at most)

// Both directions of the connection handshake (40 bytes), on every flow's socket.
struct Hello {
  static constexpr uint32_t kMagic = 0x57465443;  // "WFTC"
  static constexpr uint16_t kVersion = 2;          // 2: flows and pieces
  enum : uint16_t { kRequest = 0xffff, kAccepted = 0, kWrongToken = 1, kBadRequest = 2, kUsed = 3, kTunerMismatch = 4 };
  uint32_t magic;
  uint16_t version;
  uint16_t status;  // kRequest from the connector; the listener's verdict in its answer
  uint64_t token;
  uint64_t tunerDigest;
  uint64_t nonce;   // the connector's, the same on all its flows: which sockets form one connection
  uint8_t flow;     // this socket's flow
  uint8_t flows;    // the connection's flow count
  uint8_t ifaces;   // interfaces the flows are spread over (flow k: interface k % ifaces)
  uint8_t pad[5];
};
static_assert(sizeof(Hello) == 40);
// A connector's hello for flow `flow` of a connection of `flows` over `ifaces` interfaces.
Hello helloRequest(uint64_t token, uint64_t nonce, int flow, int flows, int ifaces);

// Every header's check word: its kind in the top byte, the message's sequence number (24 bits) below: a stream
// out of step or corrupt fails the check.
constexpr uint32_t kSeqMask = 0xffffff;
constexpr uint32_t msgCheck(uint32_t seq) { return 0x4d000000u | (seq & kSeqMask); }    // 'M'
constexpr uint32_t pieceCheck(uint32_t seq) { return 0x50000000u | (seq & kSeqMask); }  // 'P'
constexpr bool isPiece(uint32_t check) { return (check >> 24) == 0x50; }

struct MsgHeader {
  static constexpr uint64_t kInPieces = uint64_t{1} << 63;  // in size: the payload travels as pieces
  static constexpr uint64_t kJoining = uint64_t{1} << 62;   // in size: the sender is opening more flows
  static constexpr uint64_t kSizeMask = kJoining - 1;
  uint64_t size;
  int32_t tag;
  uint32_t check;
};
static_assert(sizeof(MsgHeader) == 16);

struct PieceHeader {
  uint64_t offset;  // in the message
  uint32_t len;
  uint32_t check;
};
static_assert(sizeof(PieceHeader) == 16);

// Process-wide counters (weftNetStat "tcp.*"): system calls and bytes of the data path.
struct Counters {
  std::atomic<int64_t> sendCalls{0}, recvCalls{0}, bytesSent{0}, bytesReceived{0}, commsOpen{0}, flowsOpen{0};
  std::atomic<int64_t> helperThreads{0}, helperBytes{0};  // helper threads running; bytes they sent or received
  std::atomic<int64_t> stalls{0};  // stall episodes reported (WEFT_STALL_S)
  std::atomic<int64_t> flowBytesSent[kMaxFlows] = {};  // by flow index, every comm's together
  std::atomic<int64_t> rmaFlowBytesSent[kMaxFlows] = {};  // the device API's: flow 0 the control flows
};
Counters& counters();

// What every comm of one device shares: its props (for names) and the registration cache. Registration is
// bookkeeping only (TCP needs none), kept so handles behave as on the other backends.
constexpr int kMaxRails = kMaxDevsPerNic;  // interfaces a device may have; per table: weft::maxDevsPerNic()

class Acceptor;
class HelperPool;
struct FlowTask;

struct RailAddr {
  std::string ifname;
  sockaddr_storage addr{};
  socklen_t len = 0;
};

struct TcpDevice {
  DeviceProps props;
  std::shared_ptr<Acceptor> acceptor;  // its listening sockets
  std::vector<RailAddr> rails;  // one for an interface; several for a device NCCL fused
  int flows = 1;                // flows a connection opens (all interfaces together); growing: at most
  bool grow = false;            // a NIC weft does not know: flows added while they add bandwidth
  // Growing: the flows a connection of this device last found worth having (0: none has grown yet). A new
  // connection's first bulk data starts on this many and grows on from there: the flow cap is the NIC's, so one
  // connection's finding spares the next ones (NCCL opens many on a device) the windows of growth.
  std::atomic<int> learnedFlows{0};
  std::unique_ptr<Registrar> registrar;
  std::unique_ptr<MrCache> cache;
  std::shared_ptr<HelperPool> helpers;  // WEFT_TCP_THREADS > 0: threads that move piece flows (tcp_helpers.h)
};

// The socket settings of a data connection (TCP_NODELAY, liveness, buffer sizes), from the WEFT_* parameters.
struct SocketOptions {
  int peerTimeoutSec = 10;
  int keepIdleSec = 1;
  int sockBuf = 0;  // SO_SNDBUF/SO_RCVBUF; 0: the kernel's autotuning
  int busyPollUs = 0;  // SO_BUSY_POLL; 0: off
  size_t writeMax = 512 << 10;
  uint64_t stripeMin = 256 << 10;  // WEFT_STRIPE_MIN: from this size a message travels in pieces over the flows
  uint32_t chunk = 128 << 10;      // WEFT_TCP_CHUNK: a piece's size
  int notsentLowat = 256 << 10;    // WEFT_TCP_NOTSENT_LOWAT: on the flows of a connection of several; 0 off
  // On a send flow of a connection with several flows.
  void applyFlow(int fd) const;
  static SocketOptions fromParams();
  // Before connect or listen (buffer sizes decide the window scale at the SYN).
  void applyEarly(int fd) const;
  // On a connected socket.
  void applyConnected(int fd) const;
};

class TcpDataComm;
class TcpRequest;

// Flows that joined an accepted connection, for its receive comm to adopt (filled under the acceptor's mutex).
struct JoinBox {
  std::atomic<int> waiting{0};
  std::vector<std::pair<int, int>> fds;  // (flow, fd)
  uint64_t nonce = 0;
  int flows = 1;
};

// What a send comm needs to open its connection's further flows: the listener's address on each interface, the
// handle's token and the connection's nonce.
struct JoinPlan {
  uint64_t token = 0, nonce = 0;
  std::vector<sockaddr_storage> peers;
};

// A message whose receive was not posted when its header came (a PXN sub ahead of the others in its group), held
// aside in memory of its own until a receive matches it; from then on its remaining bytes go to that receive.
struct Unexpected {
  int32_t tag = 0;
  uint64_t size = 0, got = 0;
  int helperPieces = 0;  // pieces helpers read into `data` now: it stays until they are in, even once matched
  std::unique_ptr<uint8_t[]> data;
  TcpRequest* r = nullptr;  // the receive it was matched to, and which buffer
  int buf = 0;
  Unexpected* next = nullptr;
  uint8_t* base() const;
};

// A run of bytes queued on one flow: a 16-byte header (a message's or a piece's) and its payload.
struct Item {
  alignas(8) uint8_t hdr[16] = {};
  const uint8_t* src = nullptr;
  uint64_t len = 0;   // payload bytes
  uint64_t sent = 0;  // header and payload
  TcpRequest* r = nullptr;
  Item* next = nullptr;
  uint64_t total() const { return sizeof(hdr) + len; }
};

class TcpRequest final : public Request {
 public:
  Status test(bool* done, int* sizes) override;
  TcpDataComm* comm = nullptr;
  TcpRequest* next = nullptr;  // receives: the comm's queue of posted requests; sends: the queue of messages
                               // whose pieces are not all handed to flows yet
  uint16_t poolIndex = 0;
  bool inUse = false;
  bool complete = false;
  uint8_t n = 0;  // receive buffers; 0 for a send
  int64_t postedMs = 0;  // isend/irecv (coarse clock): its age in a stall's warning
  // send: its header on flow 0 (with the payload when whole), the pieces not handed to a flow yet, items unsent
  Item head;
  uint64_t size = 0;
  uint64_t assigned = 0;  // payload bytes handed to flows as pieces
  TcpRequest* hdrNext = nullptr;  // send: the queue of messages whose header is held back
  uint32_t seq = 0;
  uint32_t itemsLeft = 0;
  // recv: per buffer, its place, capacity and tag, the message's size and how much of it has arrived
  uint8_t matched = 0, filled = 0;
  uint8_t* dst[kMaxRecvs] = {};
  uint64_t cap[kMaxRecvs] = {};
  uint64_t got[kMaxRecvs] = {};
  uint64_t want[kMaxRecvs] = {};
  int32_t tags[kMaxRecvs] = {};
  bool bufMatched[kMaxRecvs] = {};
};

// One TCP flow of a comm.
struct Flow {
  int fd = -1;        // -1: not open (yet)
  bool ready = false;  // send: open and accepted by the peer; recv: adopted
  uint8_t iface = 0;  // the device's interface it leaves by (its health)
  // send: its queue of items and their unsent bytes
  Item* head = nullptr;
  Item* tail = nullptr;
  uint64_t queued = 0;
  // recv: the piece header being read (flows 1+) and the piece being placed
  PieceHeader hdrIn{};
  size_t hdrGot = 0;
  bool inPiece = false;
  bool ended = false;  // the peer closed it at a message boundary (the other flows may still bring pieces)
  int slot = -1;
  uint64_t off = 0, left = 0;
  // A helper thread moves this flow's socket (tcp_helpers.h): its task, what the comm posted and retired of it.
  FlowTask* task = nullptr;
  uint32_t postedItems = 0, retired = 0;
  uint64_t seenWritten = 0;
  Unexpected* aside = nullptr;  // receive: the piece at the helper lands in this message's own memory
};

// A comm, its requests and its staging buffer live on the NUMA node of its interface (numa::make, docs/topology.md).
class TcpDataComm : public numa::Placed {
 public:
  // fds: the flows open now (flow 0 first); `flows` in all, the rest joining later.
  TcpDataComm(TcpDevice& dev, std::vector<int> fds, int flows, int ifaces, std::string peerName);
  virtual ~TcpDataComm();
  TcpDataComm(const TcpDataComm&) = delete;
  TcpDataComm& operator=(const TcpDataComm&) = delete;
  Status testRequest(TcpRequest* r, bool* done, int* sizes);
  virtual void progress() = 0;
  // Host memory only (bookkeeping: TCP needs no registration); DMA-BUF (fd >= 0) is refused.
  Status registerMr(void* data, size_t size, int type, int fd, uint64_t offset, MemHandle** out);
  Status deregisterMr(MemHandle* mh);
  std::string commDeviceName() const { return dev_.props.name; }
  const DeviceProps& commDeviceProps() const { return dev_.props; }
  void refreshRailHealth() {}  // a socket's failure is recorded when it happens
  int railCount() const { return nIfaces_; }
  const RailHealth* railHealth(int* n) const {
    *n = nIfaces_ > 1 ? nIfaces_ : 0;
    return nIfaces_ > 1 ? health_ : nullptr;
  }

 protected:
  TcpRequest* acquire();
  void release(TcpRequest* r);
  virtual void forget(TcpRequest* r) = 0;  // a failed request leaves the comm's queues
  void fail(Status st, const std::string& why);
  // A system call's error on flow k, as the comm's failure (kRemote for what a dead or silent peer causes).
  void failErrno(int err, const char* call, int k);
  void flowDown(int k, RailEvent why);
  std::string flowName(int k) const;  // " (flow k)" on a comm with several, else empty
  Status checkMh(const MemHandle* mh, const void* data, size_t size, const char* op) const;
  // Flow k (1 and up) is open: a device with helper threads gives it to one.
  void helpFlow(int k, bool send);
  // No helper touches the comm's flows, or the memory they named, once this returns (close, failure).
  void detachHelpers();
  // Stalls (docs/hangs.md): bytes moving on any flow count (++moved_ where a system call or a helper moved some);
  // a comm whose outstanding requests see none for WEFT_STALL_S warns once per episode, with what stallCause says.
  void watchStall(TcpRequest* r);
  // What the comm waits for and why, for the warning: the oldest request, its bytes, and the case (the peer has
  // not posted its side; the bytes stopped mid-message; ...), from the comm's state and the kernel's TCP_INFO.
  virtual std::string stallCause(int64_t nowMs, StallKind* kind) = 0;
  uint64_t movedSignature() const;  // moved_ and what helpers are moving now
  uint64_t moved_ = 0;

  TcpDevice& dev_;
  numa::ArrayPtr<Flow> flows_;
  int nFlows_ = 1;
  int ready_ = 1;  // flows open and usable
  int nIfaces_ = 1;
  RailHealth health_[kMaxRails];  // comms over several interfaces: each interface's (messages and bytes sent,
                                  // why it failed)
  std::string peerName_;
  std::string localName_;  // flow 0's own address: the peer's peerName_ of this connection
  Status fatal_ = Status::kOk;
  uint32_t seq_ = 0;  // messages started (send) or matched (recv) on this comm
  std::unique_ptr<FlowTask[]> tasks_;  // by flow, once a helper moves one

 public:
  StallState stall_;  // what watchStall found (Comm::stallState)

 private:
  int64_t stallMs_ = 0;  // 0: no watch
  uint64_t movedSeen_ = 0;
  int64_t quietSinceMs_ = 0;
  uint32_t stallTick_ = 0;
  // Requests (weft/transport/request_pool.h), up to kMaxPool in flight.
  static constexpr int kMaxPool = 512;
  using Pool = RequestPool<numa::ArrayPtr<TcpRequest>>;
  Pool pool_;
};

template <typename Iface>
using TcpComm = CommAdaptor<Iface, TcpDataComm>;

class TcpSendComm final : public TcpComm<SendComm> {
 public:
  TcpSendComm(TcpDevice& dev, std::vector<int> fds, int flows, int ifaces, std::string peerName,
              const SocketOptions& opts, JoinPlan plan);
  ~TcpSendComm() override;
  Status isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) override;
  void progress() override;

 private:
  void forget(TcpRequest* r) override;
  std::string stallCause(int64_t nowMs, StallKind* kind) override;
  bool progressFlow(int k);  // one sendmsg on flow k: true when it took all and more is queued or to hand out
  void progressHelped(int k);  // flow k's helper: what it wrote retired, pieces handed to it
  void enqueue(Flow& f, Item* it);
  bool pullPiece(int k);  // hands flow k the next piece of the oldest message in pieces: false when none
  void itemDone(Item* it);
  // Further flows: connected once the connection carries a message in pieces' size, each with its hello; a flow
  // that cannot join (refused, no answer within the hello timeout) is left out.
  void openFlows(int upTo);  // connects flows [opened_, upTo)
  void pollJoins();
  void bulkStarted();
  int growStart() const;
  void bulkDone(uint64_t size);
  struct Joining {
    size_t helloSent = 0, answerGot = 0;
    Hello answer{};
    bool connected = false;
  };
  JoinPlan plan_;
  std::unique_ptr<Joining[]> joining_;
  int joiningLeft_ = 0;
  int opened_ = 1;  // flows [0, opened_) were opened (or tried)
  int active_ = kMaxFlows;  // flows [0, active_) take pieces
  bool joinsStarted_ = false;
  // growing the flow count while it adds bandwidth (TcpDevice::grow)
  bool grow_ = false;
  int bulkOut_ = 0;
  uint64_t winBytes_ = 0;
  std::chrono::steady_clock::time_point busyFrom_;
  std::chrono::steady_clock::duration busy_{};
  double lastGbps_ = 0;
  int lastFlows_ = 0;
  bool settle_ = false;  // the count just changed: the window that ends next is not measured
  static constexpr uint64_t kGrowWindowBytes = uint64_t{8} << 20;
  static constexpr std::chrono::milliseconds kGrowWindowTime{10};
  std::chrono::steady_clock::time_point joinStart_;
  static constexpr std::chrono::milliseconds kJoinWait{200};  // a large message waits this long for them at most
  size_t writeMax_;  // bytes one sendmsg offers at most (WEFT_TCP_WRITE_MAX)
  uint64_t stripeMin_;
  uint32_t chunk_;
  SocketOptions opts_;
  uint32_t turn_ = 0;               // which flow writes first in a round
  TcpRequest* bulkHead_ = nullptr;  // messages whose pieces are not all handed out, in order
  TcpRequest* bulkTail_ = nullptr;
  TcpRequest* heldHead_ = nullptr;  // messages whose header waits for an earlier message's pieces, in order
  TcpRequest* heldTail_ = nullptr;
  void releaseHeaders();
  // piece items (several flows only): a free list over one array
  numa::ArrayPtr<Item> items_;
  Item* freeItems_ = nullptr;
  static constexpr int kItemsPerFlow = 8;
};

class TcpRecvComm final : public TcpComm<RecvComm> {
 public:
  TcpRecvComm(TcpDevice& dev, std::vector<int> fds, int flows, int ifaces, std::string peerName,
              std::shared_ptr<Acceptor> acceptor, uint64_t token, uint64_t nonce);
  ~TcpRecvComm() override;
  Status irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs, bool optional,
               Request** request) override;
  Status iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) override;
  void progress() override;

  static constexpr size_t kStage = 8192;  // the staging buffer
  static constexpr size_t kDirectMin = kStage / 2;  // payload left to read from which recv goes to the buffer

 private:
  void forget(TcpRequest* r) override;
  std::string stallCause(int64_t nowMs, StallKind* kind) override;
  void progressFlow0();
  void progressPieces(int k);  // flows 1+
  void progressHelped(int k);  // flows 1+ that a helper moves: piece headers to their messages, bytes counted in
  bool fillStage();  // one recv into the staging buffer: true when bytes came
  bool matchHeader();  // the header at the front of the staging buffer found its receive buffer
  // A piece header's message (its slot) once flow 0 matched it: -1 and *wait while it has not, -1 and the comm
  // failed for a piece no message in flight can take.
  int pieceSlot(const PieceHeader& h, int k, bool* wait);
  void pieceIn(int slot, uint64_t n);  // n bytes of a piece into its message
  void bytesIn(TcpRequest* r, int buf, uint64_t n);  // completes the buffer, and the request, when all are in
  // read into [p, p + len) on flow k: bytes read, 0 for "nothing now" (or failed: fatal_ set). The end of the
  // stream where `mayEnd` (flow k is between messages or pieces) only marks the flow ended.
  size_t readSome(int k, uint8_t* p, size_t len, bool mayEnd = false);
  void flowEnded(int k);  // fails the comm when what it still waits for can no longer come
  bool piecesOpen() const { return openSlots_ > 0; }
  int openSlots_ = 0;
  // Flows joining later: the acceptor hands them over in box_; polled while the sender says it opens flows.
  void adoptFlows();
  std::shared_ptr<Acceptor> acceptor_;
  uint64_t token_ = 0;
  JoinBox box_;
  bool joinHint_ = false;
  uint32_t joinPolls_ = 0;
  int64_t lastJoinPollMs_ = 0;
  TcpRequest* head_ = nullptr;  // posted receives, in order; completed ones leave from anywhere
  TcpRequest* tail_ = nullptr;
  int unmatched_ = 0;  // posted buffers whose message's header has not come yet
  numa::ArrayPtr<uint8_t> stage_;
  size_t begin_ = 0, end_ = 0;  // unread bytes of the staging buffer
  // flow 0's payload in progress: request, buffer, where it goes, bytes left; or a piece (its slot)
  TcpRequest* cur_ = nullptr;
  Unexpected* curU_ = nullptr;  // or the message held aside it goes to
  int curBuf_ = 0;
  int curSlot_ = -1;
  uint64_t curOff_ = 0, curLeft_ = 0;
  // Messages in pieces that flow 0 matched and whose bytes are not all in, by sequence number (several flows only):
  // flow 0 matches no further message in pieces while the one kWindow before it is still open.
  struct Slot {
    TcpRequest* r = nullptr;
    Unexpected* u = nullptr;
    uint8_t buf = 0;
    bool open = false;
    uint32_t seq = 0;
    uint64_t size = 0, left = 0;
  };
  static constexpr int kWindow = 128;
  numa::ArrayPtr<Slot> slots_;
  // Messages held aside, in arrival order, and their bytes (at most kUnexpectedMax: beyond, flow 0 waits as TCP
  // holds the sender back).
  Unexpected* unexpHead_ = nullptr;
  Unexpected* unexpTail_ = nullptr;
  uint64_t unexpBytes_ = 0;
  static constexpr uint64_t kUnexpectedMax = uint64_t{64} << 20;
  void unexpectedIn(Unexpected* u, uint64_t n);  // n bytes of u arrived
  void dropUnexpected(Unexpected* u);
  // Matches buffer i of a just-posted receive to the oldest message held aside with its tag: false when none.
  bool matchUnexpected(TcpRequest* r, int i);
  void copyAside(Unexpected* u, uint8_t* dst);
};

// A listen: its token, registered with the device's acceptor (tcp_acceptor.h), whose sockets the handle names.
class TcpListenComm final : public ListenComm {
 public:
  TcpListenComm(TcpDevice& dev, uint64_t token, SocketOptions opts);
  ~TcpListenComm() override;
  Status accept(RecvComm** recvComm) override;

 private:
  TcpDevice& dev_;
  uint64_t token_;
  SocketOptions opts_;
};

}  // namespace weft::tcp
