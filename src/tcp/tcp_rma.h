// SPDX-License-Identifier: Apache-2.0
// The device API's RMA over weft's own TCP sockets (WEFT_RMA, docs/device-api.md).
//
// A collective comm holds one socket per peer (rank i connects to every j > i and accepts from every j < i; itself
// it reaches by local copies), carrying frames both ways: puts (the frame, then the payload, then the signal is
// applied), get requests and their answers, the registration exchange, and errors. One ordered stream per pair:
// every operation between two ranks lands in issue order, across contexts, which is more than a context needs
// (and makes every signal strong).
//
// Progress is inline, from NCCL's calls: iput queues the frame and, unless NCCL allows it to aggregate, writes what
// the peer's queue holds at once; test moves its peer's socket (both ways); rmaProgress moves every socket, which is
// how a target applies what arrives. No helper thread, no poll. A put is done when its last byte is in the
// kernel's socket buffer (its source may be reused); a get when its answer is in the local window.
//
// Memory: host windows are written and read in place (a large payload is received straight into the window); GPU
// windows through the driver's copies on the calling thread's context, staged through a buffer of the peer's.
//
// Locking: one mutex per comm (mu_) guards everything in it. The data path takes it as NCCL's proxy thread is the
// only one calling there (uncontended: no system call); registration and context set-up come from NCCL's service
// thread and release it between progress passes while they wait for peers. test and rmaProgress only try it: when
// set-up holds it they report "not yet" and NCCL calls again.
//
// Failures: a peer whose socket ends or resets (its process died) or stays unacknowledged past WEFT_PEER_TIMEOUT
// (TCP_USER_TIMEOUT and keepalives, as the net comms) is lost: every operation queued or waiting on it fails with
// ncclRemoteError, later ones to it fail at once, and queryLastError reports it. A frame the target refuses (a
// window it does not have, a range outside its part) comes back as an error frame: the get it answers fails, and
// the comm's error is set. A comm that closes says so first (a bye frame): its peers then take the end of its socket
// as the orderly close it is, unless they still wait on it.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "weft/common/rail_health.h"
#include "rma/comm_base.h"
#include "rma/op_pool.h"
#include "rma/rma.h"
#include "tcp/tcp_backend.h"
#include "weft/transport/oob.h"

namespace weft::tcp {

// Every frame on an RMA socket: 64 bytes, then the payload (puts, get answers).
struct RmaFrame {
  static constexpr uint32_t kCheck = 0x5746524d;  // "WFRM", xor the frame's sequence number on its socket
  enum : uint8_t { kPut = 1, kGetRequest = 2, kGetAnswer = 3, kRegister = 4, kError = 5, kBye = 6, kPiece = 7 };
  static constexpr uint64_t kPieced = 1;  // in a put's aux: its payload comes as pieces on the data flows
  uint32_t check;
  uint8_t type;
  uint8_t signalOp;  // rma::SignalOp of a put
  uint16_t context;
  uint32_t window;     // put: the target's window; get request: the window read; register: the window's id
  uint32_t sigWindow;  // put with a signal: the signal's window
  uint64_t off;        // put: destination offset; get request: source offset
  uint64_t size;       // payload bytes that follow (put, get answer); get request: bytes asked; register: its size
  uint64_t sigOff;
  uint64_t value;      // the signal's value; get request, answer and error: the initiator's token
  uint64_t aux;        // error: status << 8 | the refused frame's type; register: cuda << 1 | flags; put: kPieced
  uint64_t putId;      // a pieced put and its pieces: the put's number among the pieced ones to this peer
  // A piece (on a data flow): window, off (in the target's window) and size of its bytes; putId its put's.
};
static_assert(sizeof(RmaFrame) == 64);

constexpr size_t kRmaGpuStage = 256 << 10;   // a GPU payload's chunks, each way; the largest piece
constexpr size_t kRmaRecvBudget = 4 << 20;   // bytes one pump reads from a peer before moving on

// connect() says and answers oob::Hello on each new socket (weft/transport/oob.h), the connector's followed by
// which of the pair's flows the socket is (0: the control flow) and how many the pair has.
struct FlowHello {
  oob::Hello hello;
  uint32_t flow;
  uint32_t flows;
};
static_assert(sizeof(FlowHello) == 40);

// Sockets a pair of ranks of an `nranks` comm has on this device: 1 (one ordered stream), or a control flow and
// data flows. WEFT_TCP_RMA_FLOWS, else from the NIC as the net connections' flows (tcp_backend.cc), at most
// kRmaSocketBudget sockets a comm.
constexpr int kRmaSocketBudget = 2048;
int rmaFlowsFor(const TcpDevice& d, int nranks, const char** why);

class TcpRmaTransport final : public rma::RmaTransport {
 public:
  // Over the interfaces WEFT_IFACE selects; nullptr and `why` when there is none.
  static std::unique_ptr<TcpRmaTransport> discover(std::string* why);
  const char* name() const override { return "tcp"; }
  int deviceCount() const override { return backend_->deviceCount(); }
  const DeviceProps& props(int dev) const override { return props_.at(static_cast<size_t>(dev)); }
  Status listen(int dev, void* handle, rma::RmaListen** out) override;
  Status connect(void* const* handles, int nranks, int rank, rma::RmaListen* listen, uint64_t commId,
                 rma::RmaComm** out) override;

 private:
  std::unique_ptr<TcpBackend> backend_;
  std::vector<DeviceProps> props_;  // the backend's, with GPU memory
};

class TcpRmaComm;

// One data flow of a pair (flows 1 and up): pieces of large puts, both ways.
struct DataFlow {
  int fd = -1;
  uint32_t sendSeq = 0, recvSeq = 0;  // pieces sent and read: the check words' sequence
  // Sending: the piece on its way out (its frame, then its bytes at `off` of the put's payload).
  struct RmaOp* op = nullptr;
  RmaFrame out{};
  size_t outSent = 0;
  uint64_t off = 0, len = 0, sent = 0;
  bool staged = false;        // a GPU source's piece is in `stage`
  std::vector<char> stage;    // a GPU source's piece
  // Receiving: the piece frame being read, then where its bytes go (dst nullptr: discarded).
  RmaFrame in{};
  size_t inGot = 0;
  bool inPiece = false;
  rma::Window* dst = nullptr;
  uint64_t dstOff = 0, left = 0;
  std::vector<char> inStage;  // a GPU destination's bytes, or discarded ones
};

// One peer's socket and both directions' state. Operations to it wait in `queue` in issue order.
struct PeerSocket {
  int fd = -1;
  bool lost = false;
  bool bye = false;  // the peer closed its comm in order: its socket's end is no failure unless we still wait on it
  std::string name;  // "rank 3 (10.0.0.2:4711)"
  uint32_t sendSeq = 0, recvSeq = 0;
  // Sending: requests in order; the head's frame and payload go out first.
  struct RmaOp* head = nullptr;
  struct RmaOp* tail = nullptr;
  size_t queued = 0;
  std::vector<char> sendStage;  // a GPU source's bytes on their way out
  size_t stageLen = 0, stageSent = 0;
  // Receiving: the staging buffer, the frame being read and where its payload goes.
  std::vector<char> in;
  size_t inLen = 0, inPos = 0;
  RmaFrame cur{};
  bool inPayload = false;
  uint64_t payloadLeft = 0, payloadOff = 0;
  rma::Window* dst = nullptr;  // nullptr: discard (a refused put, a cancelled get)
  struct RmaOp* getOp = nullptr;  // the get this answer completes
  std::vector<char> recvStage;  // a GPU destination's bytes on their way in
  std::string refusal;        // why the current put is refused (sent back once its payload is read)
  // The stall watch (TcpRmaComm::watchStalls): bytes moved either way, what the last look saw, since when nothing
  // moved while something waited on this peer, and whether this episode was reported.
  uint64_t moved = 0, watchedMoved = 0;
  int64_t quietSinceMs = 0;
  bool stallReported = false;
  // The ledger (TcpRmaComm::ledger): the control flow's two ends' addresses, stalls reported, the current stall's
  // kind or why the peer was lost (kNone: not stalled, or closed in order).
  std::string peerAddr, localAddr;
  uint64_t stalls = 0;
  StallKind stallKind = StallKind::kNone;
  // Data flows (none: everything on fd). Sending: pieced puts with bytes not handed to a flow yet, in issue order.
  std::vector<DataFlow> data;
  struct RmaOp* pieceHead = nullptr;
  struct RmaOp* pieceTail = nullptr;
  uint64_t nextPutId = 1;
  uint32_t turn = 0;  // which data flow writes first in the next round
  // Receiving: the control flow waits on the pieced put in `cur`; pieces in so far, by put, and why one is refused.
  bool waitingPieces = false;
  struct Tally {
    uint64_t bytes = 0;
    std::string refusal;
  };
  std::unordered_map<uint64_t, Tally> tallies;
};

// What a stalled peer's socket says (tcp_stall.cc, from the kernel's TCP_INFO): `sending`, operations of ours wait
// to leave on it; `midPayload`, a put from it stopped half way in; else gets of ours wait for its answer.
std::string rmaStallCause(int fd, bool sending, bool midPayload, StallKind* kind);

// A queued or pending operation (put, get, flush, or a frame of weft's own: registration, error).
struct RmaOp {
  uint32_t magic = 0;  // rma::kRequestMagic while NCCL holds it
  uint32_t index = 0, gen = 0;
  enum : uint8_t { kFree, kQueued, kWaiting, kDone, kFailed } state = kFree;
  bool internal = false;  // a frame of weft's own, freed once sent
  Status status = Status::kOk;
  uint32_t peer = 0;
  rma::Context* ctx = nullptr;
  RmaFrame frame{};
  size_t frameSent = 0;
  rma::Window* src = nullptr;  // put: the source; get: the local destination
  uint64_t srcOff = 0;
  uint64_t payloadSent = 0;
  int64_t postMs = 0;     // coarse clock at iput/iget (the ledger's age)
  bool pieced = false;    // a put whose payload goes as pieces on the data flows
  uint64_t assigned = 0;  // pieced: payload bytes handed to flows
  RmaOp* next = nullptr;
  RmaOp* nextPiece = nullptr;  // pieced: in PeerSocket::pieceHead's list
  TcpRmaComm* comm = nullptr;
};

class TcpRmaComm final : public rma::CommBase {
 public:
  TcpRmaComm(int rank, int nranks, std::vector<PeerSocket> peers, const DeviceProps& props, const SocketOptions& opts);
  ~TcpRmaComm() override;
  Status regMrSym(void* data, size_t size, int type, uint64_t flags, int dmabufFd, rma::Window** out) override;
  Status deregMrSym(rma::Window* w) override;
  Status destroyContext(rma::Context* ctx) override;
  Status iput(rma::Context* ctx, int context, rma::Window* src, uint64_t srcOff, size_t size, rma::Window* dst,
              uint64_t dstOff, uint32_t rank, const rma::Signal* signal, uint32_t optFlags, void** request) override;
  Status iget(rma::Context* ctx, int context, rma::Window* remote, uint64_t remoteOff, size_t size,
              rma::Window* local, uint64_t localOff, uint32_t rank, uint32_t optFlags, void** request) override;
  Status iflush(rma::Context* ctx, int context, rma::Window* w, uint32_t rank, void** request) override;
  Status test(void* request, bool* done) override;
  bool flushesAllPutsOnAnySignal() const override { return true; }
  void close() override;
  bool ledger(std::vector<PeerLedger>* out) override;
  uint64_t stallEvents() const override { return stallEvents_.load(std::memory_order_relaxed); }

 private:
  RmaOp* takeOp();
  void freeOp(RmaOp* op);
  void enqueue(PeerSocket& p, RmaOp* op);
  // Moves one peer's socket both ways; a lost peer fails what waits on it.
  void pump(uint32_t peer);
  void pumpAll() override {
    for (uint32_t p = 0; p < peers_.size(); ++p) pump(p);
    watchStalls();
  }
  // Stalls (docs/hangs.md): a peer that something of ours waits on (operations queued to it, gets waiting for its
  // answer, a put from it half in) and with which no byte moved either way for WEFT_STALL_S warns once per episode,
  // with what its socket says. At most every 100 ms.
  void watchStalls();
  bool pumpSend(PeerSocket& p);
  bool pumpRecv(uint32_t peer);
  // One recv from the peer's control flow: bytes read (> 0), 0 when it has nothing now, -1 once the peer is lost.
  ssize_t recvSome(uint32_t peer, void* into, size_t want);
  // The data flows: pieces out (each flow takes the next piece as it has room), pieces in.
  bool pumpPiecesOut(uint32_t peer);
  bool pumpPiecesIn(uint32_t peer);
  int sendPiece(uint32_t peer, DataFlow& f, size_t k);
  bool pieceFrame(uint32_t peer, DataFlow& f);
  // A pieced put whose frame and pieces are all in: its signal, or the error its refusal sends back.
  void finishPieced(uint32_t peer);
  // A put whose frame and payload are all in the kernel is done (its source may be reused).
  void putSent(RmaOp* op);
  void unlinkPiece(PeerSocket& p, RmaOp* op);
  bool handleFrame(uint32_t peer);
  bool payloadDone(uint32_t peer);
  // A put whose bytes are all in (or refused): its signal is applied now, or its refusal sent back.
  void putArrived(uint32_t peer, const RmaFrame& f, const std::string& refusal);
  void sendError(uint32_t peer, const RmaFrame& refused, Status st, uint64_t token);
  void lose(uint32_t peer, const std::string& why);
  Status putLocal(rma::Window* src, uint64_t srcOff, size_t size, rma::Window* dst, uint64_t dstOff,
                  const rma::Signal* signal);

  const size_t writeMax_;
  const uint64_t stripeMin_;  // WEFT_STRIPE_MIN: puts from this size go in pieces where a pair has data flows
  const uint64_t chunk_;      // WEFT_TCP_CHUNK: a piece's size
  const int64_t stallMs_;  // WEFT_STALL_S in ms; 0: no watch
  // Guarded by mu_ (CommBase).
  std::vector<PeerSocket> peers_;  // indexed by rank; our own entry has no socket
  rma::OpPool<RmaOp> pool_;
  // Registrations peers announced before this rank made its own: id -> (rank -> size).
  std::unordered_map<uint32_t, std::vector<int64_t>> announced_;
  int64_t stallCheckMs_ = 0;
  std::atomic<uint64_t> stallEvents_{0};  // stalls reported and peers lost (stallEvents)
};

}  // namespace weft::tcp
