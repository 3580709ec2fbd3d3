// SPDX-License-Identifier: Apache-2.0
// The RMA core: what NCCL's device API drives through its CPU proxy (the GIN v11-v13 and RMA v14-v17 tables;
// plugin/rma_plugin.cc adapts each table's signatures to this one interface).
//
// A collective comm (RmaComm) joins every rank of an NCCL communicator: connect() is collective, as are window
// registrations (regMrSym: every rank registers its part of a symmetric window, in the same order). A window is a
// local region (host or GPU memory) plus every rank's size of it, so a put or get to a peer is checked against the
// peer's part before it leaves. Contexts (createContext) are blocks of independent ordering domains; a transport may
// order more than a context asks (the TCP transport orders everything between two ranks).
//
// The contract, per NCCL (docs/nccl-semantics.md §device API):
// - a put request is done when its source may be reused, not when its bytes are visible at the target;
// - a get request is done when its bytes are in the local window;
// - a signal (iputSignal) is applied at the target only after the bytes of its own put are visible there; a strong
//   signal also after every earlier put and signal of the same context to that target;
// - a flush makes the bytes of every get completed before it visible to the GPU;
// - a failed operation fails its request (test returns the error) and sets the comm's error (queryLastError).
//
// Threads: NCCL's proxy progress thread issues, tests and progresses; its service thread registers windows and
// creates contexts. Each comm's lock is declared by the transport.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/common/ledger.h"
#include "weft/transport/net.h"
#include "weft/transport/oob.h"

namespace weft::rma {

constexpr uint32_t kListenMagic = 0x57464c52;   // "WFLR"
constexpr uint32_t kCommMagic = 0x5746434c;     // "WFCL"
constexpr uint32_t kContextMagic = 0x57465843;  // "WFXC"
constexpr uint32_t kWindowMagic = 0x5746574e;   // "WFWN"
constexpr uint32_t kRequestMagic = 0x57465252;  // "WFRR"

// NCCL's registration flags and signal operations (weft/nccl/rma.h has the ABI's names).
constexpr uint64_t kFlagForceSo = 1u << 0;
constexpr uint64_t kFlagSignalNeverReset = 1u << 1;
enum class SignalOp : uint8_t { kNone = 0, kInc = 1, kAdd = 2 };
// NCCL's memory types (NCCL_PTR_HOST, NCCL_PTR_CUDA).
constexpr int kPtrHost = 1;
constexpr int kPtrCuda = 2;

// One rank's part of a symmetric window.
struct Window : Object {
  Window() : Object(kWindowMagic) {}
  uint32_t id = 0;           // the same on every rank: registrations come in the same order everywhere
  char* base = nullptr;
  size_t size = 0;
  bool cuda = false;         // GPU memory: reached through the driver's copies only
  uint64_t flags = 0;        // kFlag*
  const void* owner = nullptr;  // the comm that registered it
  std::vector<uint64_t> peerSize;  // every rank's size of this window (from the registration exchange)
  // GPU signal regions registered SIGNAL_NEVER_RESET: the value of every 8-byte slot as weft last wrote it. Only the
  // plugin writes such a region, so a signal is one 8-byte copy of shadow + value, never a read back.
  std::vector<uint64_t> shadow;
  int inflight = 0;  // local operations still reading or writing it (the transport's lock guards it)
};

bool inRange(uint64_t size, uint64_t off, uint64_t n);
// A signal's slot: 8 bytes at an aligned offset inside a window (part) of `size` bytes.
inline bool isSignalSlot(uint64_t size, uint64_t off) { return off % 8 == 0 && inRange(size, off, 8); }
// A signal operation weft applies (NCCL's INC and ADD), as it travels in a message.
inline bool isSignalOp(uint8_t op) {
  return op == static_cast<uint8_t>(SignalOp::kInc) || op == static_cast<uint8_t>(SignalOp::kAdd);
}

// Moves bytes into and out of a window: memcpy for host memory, the driver's copies for GPU memory. false and
// `err` when the driver refuses.
bool writeWindow(Window& w, uint64_t off, const void* src, size_t n, std::string* err);
bool readWindow(void* dst, const Window& w, uint64_t off, size_t n, std::string* err);
// Adds to the 8-byte signal at `off` (INC: 1; ADD: value). Host memory: an atomic add (release: the put's bytes,
// written before, are visible first). GPU memory: the new value written with one 8-byte copy, ordered after the
// put's copies (the same context's stream), from the shadow when the region was registered SIGNAL_NEVER_RESET,
// else read back first.
bool applySignal(Window& w, uint64_t off, SignalOp op, uint64_t value, std::string* err);

// A block of contexts (createContext).
struct Context : Object {
  Context() : Object(kContextMagic) {}
  void* comm = nullptr;  // the RmaComm it belongs to
  int nContexts = 1;
  std::vector<int> peers;  // the ranks NCCL said it will talk to (v17 peerArray; stride before); empty: all
};

struct Signal {
  Window* window = nullptr;
  uint64_t off = 0;
  uint64_t value = 0;
  SignalOp op = SignalOp::kNone;
  bool strong = true;
};

class RmaRequest;

class RmaComm : public Object {
 public:
  RmaComm() : Object(kCommMagic) {}
  virtual ~RmaComm() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;

  // Collective: every rank registers its part. type: NCCL_PTR_HOST or NCCL_PTR_CUDA. dmabufFd >= 0: the region
  // came as a DMA-BUF as well (a transport that cannot use one reaches the memory through the driver anyway).
  virtual Status regMrSym(void* data, size_t size, int type, uint64_t flags, int dmabufFd, Window** out) = 0;
  virtual Status deregMrSym(Window* w) = 0;
  virtual Status createContext(int nContexts, std::vector<int> peers, Context** out) = 0;
  virtual Status destroyContext(Context* ctx) = 0;

  // optFlags: NCCL's ncclRmaOptFlagsAggregateRequests (1) lets the transport hold the operation back until a later
  // one without it, or the next test or progress call. signal: nullptr for a plain put; size 0 puts signal only.
  virtual Status iput(Context* ctx, int context, Window* src, uint64_t srcOff, size_t size, Window* dst,
                      uint64_t dstOff, uint32_t rank, const Signal* signal, uint32_t optFlags, void** request) = 0;
  virtual Status iget(Context* ctx, int context, Window* remote, uint64_t remoteOff, size_t size, Window* local,
                      uint64_t localOff, uint32_t rank, uint32_t optFlags, void** request) = 0;
  virtual Status iflush(Context* ctx, int context, Window* w, uint32_t rank, void** request) = 0;
  // *done, and the request returns to its pool, once it completed; an error fails it (and returns it as well).
  virtual Status test(void* request, bool* done) = 0;
  virtual Status progress() = 0;
  // True once any operation of the comm failed or a peer was lost; `why` the first such error.
  virtual bool hasError(std::string* why) const = 0;
  // A signal arriving from any peer makes every put already received from any peer visible.
  virtual bool flushesAllPutsOnAnySignal() const = 0;
  // NCCL's maxRecvs for the device: its proxy keeps at most 32 x maxRecvs operations a context and rank in flight.
  virtual int maxRecvs() const = 0;
  // closeColl: NCCL is done with the comm (contexts destroyed, windows deregistered first).
  virtual void close() = 0;
  // The ledger (docs/hangs.md), from any thread: every peer it has a connection to (idle ones too: the report pairs
  // the two ends by address), and those lost in trouble.
  // false when the comm cannot tell now (set-up holds it) or keeps none (the transport's watch is not built yet).
  virtual bool ledger(std::vector<PeerLedger>* out) {
    (void)out;
    return false;
  }
  // Stalls reported and peers lost so far (a stall dump is written when it grows); lock-free.
  virtual uint64_t stallEvents() const { return 0; }
};

class RmaListen : public Object {
 public:
  RmaListen() : Object(kListenMagic) {}
  virtual ~RmaListen() = default;
  virtual int dev() const = 0;
};

// A listen comm whose connectors come over an out-of-band TCP listener (the TCP and verbs transports).
class SocketListen final : public RmaListen {
 public:
  SocketListen(int dev, oob::Listener l) : dev_(dev), listener_(std::move(l)) {}
  // listen's end: the listener's handle written for NCCL to all-gather, the INFO line, the listen comm.
  static RmaListen* publish(int dev, oob::Listener l, BackendId backend, uint32_t providerHash,
                            const std::string& devName, void* handle);
  // connect's arguments checked: the listen comm as a socket transport's own, or nullptr with a warning for what
  // NCCL never passes (no handles, no output, a rank outside the comm, another transport's listen comm).
  static SocketListen* forConnect(void* const* handles, int nranks, int rank, RmaListen* listen, RmaComm** out);
  int dev() const override { return dev_; }
  const oob::Listener& listener() const { return listener_; }

 private:
  int dev_;
  oob::Listener listener_;
};

// What a transport offers the device API: its devices and how to join a collective comm over them.
class RmaTransport {
 public:
  virtual ~RmaTransport() = default;
  virtual const char* name() const = 0;
  virtual int deviceCount() const = 0;
  virtual const DeviceProps& props(int dev) const = 0;
  virtual Status listen(int dev, void* handle, RmaListen** out) = 0;
  // Collective and blocking (bounded by WEFT_CONNECT_TIMEOUT): every rank calls it with every rank's handle.
  virtual Status connect(void* const* handles, int nranks, int rank, RmaListen* listen, uint64_t commId,
                         RmaComm** out) = 0;
};

// A transport whose devices are the backend's own device objects (libfabric's, verbs'), each with props().
template <typename Dev>
class DeviceTransport : public RmaTransport {
 public:
  int deviceCount() const override { return static_cast<int>(devices_.size()); }
  const DeviceProps& props(int dev) const override { return devices_.at(static_cast<size_t>(dev))->props(); }

 protected:
  std::vector<std::unique_ptr<Dev>> devices_;
};

}  // namespace weft::rma
