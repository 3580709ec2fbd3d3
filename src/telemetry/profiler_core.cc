// SPDX-License-Identifier: Apache-2.0
#include "telemetry/profiler_core.h"

#include <time.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <thread>

#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/nccl/profiler.h"

namespace weft::telemetry {
namespace {

constexpr uint32_t kCtxMagic = 0x57504358;  // "WPCX"
constexpr int kMaxContexts = 1024;
constexpr uint32_t kOpSlots = 8192;      // collectives + p2p in flight (started, not yet written out)
constexpr uint32_t kSmallSlots = 32768;  // their children in flight
// When an operation is written out. The CPU often enqueues seconds ahead of the GPU, and an operation's kernel
// channels and proxy progress come when the GPU gets to it, so no window is measured from the CPU side alone:
// - with kernel channels expected (KernelCh with GPU timers, v4+): when every channel reported;
// - without (v1-v3): kQuietNs after its last news, once it has had news of the GPU (a kernel channel or proxy op of
//   its own, or of a later operation of its communicator: a communicator's kernels run in order) or its
//   communicator never sends any (only Coll/P2p events: CPU timing is all there is);
// - missing events (a graph capture, events NCCL did not send): kQuietNs after a later operation of the same
//   communicator made progress, flagged partial when kernel channels were expected;
// - in any case after kHoldNs without news (nothing later progressed: the job went quiet), or at finalize.
// Graph-captured operations (known from v5's CollApi) may get no kernel events at capture time: kQuietNs, partial.
constexpr uint64_t kQuietNs = 200'000'000;
constexpr uint64_t kHoldNs = 60'000'000'000;

enum SlotState : uint32_t { kFree = 0, kActive = 1, kStopped = 2, kEmitting = 3 };

// Bounded MPMC queue of free slot indices (D. Vyukov's design): FIFO, so a freed slot is reused as late as
// possible, which keeps late events of an old operation from landing in a new one. Sized at twice the number of
// indices, so pushes never fail. One caveat of the design: a thread preempted inside its claim-then-publish window
// (a few instructions) holds up the one thread that needs that very cell; that thread yields until it is
// published rather than report a full or empty queue that is neither (both happened under load on 2 cores).
class IndexQueue {
 public:
  explicit IndexQueue(uint32_t capacity) : mask_(capacity - 1), cells_(new Cell[capacity]) {
    for (uint32_t i = 0; i < capacity; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  bool push(uint32_t v) noexcept {
    uint64_t pos = enq_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      uint64_t seq = c.seq.load(std::memory_order_acquire);
      int64_t dif = static_cast<int64_t>(seq) - static_cast<int64_t>(pos);
      if (dif == 0) {
        if (enq_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.val = v;
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        // The cell's previous value is still being taken by a consumer that claimed it and was preempted
        // before releasing it (the queue itself is never full: it has room for twice the indices there are).
        // Wait for it: dropping the index would lose a slot for good.
        std::this_thread::yield();
        pos = enq_.load(std::memory_order_relaxed);
      } else {
        pos = enq_.load(std::memory_order_relaxed);
      }
    }
  }
  bool pop(uint32_t* v) noexcept {
    uint64_t pos = deq_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      uint64_t seq = c.seq.load(std::memory_order_acquire);
      int64_t dif = static_cast<int64_t>(seq) - static_cast<int64_t>(pos + 1);
      if (dif == 0) {
        if (deq_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          *v = c.val;
          c.seq.store(pos + mask_ + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        // Empty, or the producer that claimed this very cell was preempted before publishing it (later cells
        // may be full: the queue is FIFO). Only the first means no index.
        if (enq_.load(std::memory_order_acquire) <= pos) return false;
        std::this_thread::yield();
        pos = deq_.load(std::memory_order_relaxed);
      } else {
        pos = deq_.load(std::memory_order_relaxed);
      }
    }
  }

 private:
  struct Cell {
    std::atomic<uint64_t> seq;
    uint32_t val;
  };
  const uint64_t mask_;
  std::unique_ptr<Cell[]> cells_;
  alignas(64) std::atomic<uint64_t> enq_{0};
  alignas(64) std::atomic<uint64_t> deq_{0};
};

struct alignas(64) OpSlot {
  std::atomic<uint32_t> state{kFree};
  // Read by other threads before they own the slot (and then discarded if they lose the race): atomics.
  std::atomic<Context*> ctx{nullptr};
  std::atomic<int32_t> kernelsExpected{0};
  CollRecord rec;
  std::atomic<int32_t> inflight{0};
  std::atomic<int32_t> kernelsDone{0};
  std::atomic<uint32_t> gpuTimed{0};
  std::atomic<uint32_t> proxyOps{0};
  std::atomic<uint64_t> maxGpuNs{0};
  std::atomic<uint64_t> maxKernelCpuNs{0};
  std::atomic<uint64_t> firstChildNs{UINT64_MAX};
  std::atomic<uint64_t> lastChildNs{0};
  std::atomic<uint64_t> lastActivityNs{0};
  std::atomic<uint64_t> seq{0};  // Context::opSeq at its start
  std::atomic<uint64_t> maxPhaseNs[kNumKernelPhases] = {};  // v7 kernel phases: the longest channel's
  std::atomic<uint32_t> channelsPhased{0};
};

struct alignas(64) SmallSlot {
  std::atomic<uint32_t> state{kFree};
  EvType type = EvType::kUnknown;
  uint8_t isSend = 0;
  std::atomic<Context*> ctx{nullptr};  // read by finalize's sweep of other threads' slots
  OpSlot* op = nullptr;       // KernelCh, ProxyOp: the operation they belong to (null when not ours)
  SmallSlot* up = nullptr;    // ProxyStep -> its ProxyOp, NetPlugin -> its ProxyStep, KernelPhase -> its KernelCh
  uint8_t phase = 0;          // KernelCh: 1 once a phase of it was timed
  // KernelCh (v7): its barrier phases. A phase event's handle is &phaseTag[id] of its channel's slot (checked by
  // address, as every handle): phases cost no slot of their own, only the start timer kept here.
  char phaseTag[kNumKernelPhases] = {};
  uint64_t phaseStart[kNumKernelPhases] = {};
  PeerStats* peer = nullptr;  // ProxyOp, ProxyStep, NetPlugin
  uint64_t startNs = 0;
  uint64_t startPTimer = 0;
  uint64_t stopPTimer = 0;
  uint64_t bytes = 0;
};

struct Pools {
  std::unique_ptr<OpSlot[]> ops{new OpSlot[kOpSlots]};
  std::unique_ptr<SmallSlot[]> small{new SmallSlot[kSmallSlots]};
  IndexQueue opFree{2 * kOpSlots};  // twice the indices: a push never meets a full queue
  IndexQueue smallFree{2 * kSmallSlots};
  Pools() {
    for (uint32_t i = 0; i < kOpSlots; ++i) opFree.push(i);
    for (uint32_t i = 0; i < kSmallSlots; ++i) smallFree.push(i);
  }
};

std::atomic<Pools*> gPools{nullptr};
std::once_flag gPoolsOnce;
Context gContexts[kMaxContexts];
std::mutex gContextMutex;  // init/finalize only

// Handles for events weft does not time: valid, non-NULL (so NCCL still sends their children), and ignored.
char gSentinels[4];
void* const kSentinelGeneric = &gSentinels[0];
void* const kSentinelApiCaptured = &gSentinels[1];
void* const kSentinelApiLive = &gSentinels[2];

std::atomic<uint64_t> gBadHandles{0}, gDoubleStops{0}, gNullContexts{0}, gForeignParents{0}, gUnknownTypes{0};

bool isSentinel(void* h) noexcept {
  auto* p = static_cast<char*>(h);
  return p >= gSentinels && p < gSentinels + sizeof(gSentinels);
}

Context* asContext(void* p) noexcept {
  auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(&gContexts[0]);
  if (a < base || a >= base + sizeof(gContexts) || (a - base) % sizeof(Context) != 0) return nullptr;
  auto* c = static_cast<Context*>(p);
  return c->live.load(std::memory_order_acquire) == 1 && c->magic == kCtxMagic ? c : nullptr;
}

// A kernel phase's handle: its channel's slot and the phase id, or null when the pointer is not one.
SmallSlot* asPhase(Pools* pools, void* p, int* phase) noexcept {
  auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(pools->small.get());
  if (a < base || a >= base + kSmallSlots * sizeof(SmallSlot)) return nullptr;
  const size_t off = (a - base) % sizeof(SmallSlot), tags = offsetof(SmallSlot, phaseTag);
  if (off < tags || off >= tags + kNumKernelPhases) return nullptr;
  *phase = static_cast<int>(off - tags);
  return reinterpret_cast<SmallSlot*>(a - off);
}

OpSlot* asOp(Pools* pools, void* p) noexcept {
  auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(pools->ops.get());
  if (a < base || a >= base + kOpSlots * sizeof(OpSlot) || (a - base) % sizeof(OpSlot) != 0) return nullptr;
  return static_cast<OpSlot*>(p);
}

SmallSlot* asSmall(Pools* pools, void* p) noexcept {
  auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(pools->small.get());
  if (a < base || a >= base + kSmallSlots * sizeof(SmallSlot) || (a - base) % sizeof(SmallSlot) != 0) return nullptr;
  return static_cast<SmallSlot*>(p);
}

void atomicMax(std::atomic<uint64_t>& a, uint64_t v) noexcept {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}
void atomicMin(std::atomic<uint64_t>& a, uint64_t v) noexcept {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// Attaches a child to its operation: counted in flight first, then the operation's state is checked, so the
// writer (which flips Stopped -> Emitting, then checks in-flight) and the child never both proceed.
OpSlot* attach(Pools* pools, Context* c, void* parent) noexcept {
  OpSlot* op = asOp(pools, parent);
  if (op == nullptr || op->ctx.load(std::memory_order_relaxed) != c) return nullptr;
  op->inflight.fetch_add(1, std::memory_order_seq_cst);
  uint32_t st = op->state.load(std::memory_order_seq_cst);
  if ((st != kActive && st != kStopped) || op->ctx.load(std::memory_order_relaxed) != c) {
    op->inflight.fetch_sub(1, std::memory_order_release);
    return nullptr;
  }
  if (!c->anyChild.load(std::memory_order_relaxed)) c->anyChild.store(true, std::memory_order_relaxed);
  return op;
}

// A child finished: the GPU (or the proxy following it) has got to this operation.
void detach(OpSlot* op, uint64_t now) noexcept {
  op->lastActivityNs.store(now, std::memory_order_relaxed);
  if (Context* c = op->ctx.load(std::memory_order_relaxed)) atomicMax(c->progressSeq, op->seq.load(std::memory_order_relaxed));
  op->inflight.fetch_sub(1, std::memory_order_release);
}

PeerStats* peerOf(Context* c, int peer) noexcept {
  if (c->peers == nullptr) return nullptr;
  for (int i = 0; i < kMaxPeersPerComm - 1; ++i) {
    PeerStats& p = c->peers[i];
    int32_t cur = p.peer.load(std::memory_order_acquire);
    if (cur == peer) return &p;
    if (cur == -1) {
      int32_t expect = -1;
      if (p.peer.compare_exchange_strong(expect, peer, std::memory_order_acq_rel) || expect == peer) return &p;
    }
  }
  PeerStats& other = c->peers[kMaxPeersPerComm - 1];
  other.peer.store(-2, std::memory_order_relaxed);
  return &other;
}

SmallSlot* allocSmall(Pools* pools, Context* c, EvType t, uint64_t now) noexcept {
  uint32_t idx;
  if (!pools->smallFree.pop(&idx)) {
    c->dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  SmallSlot& s = pools->small[idx];
  s.type = t;
  s.isSend = 0;
  s.ctx.store(c, std::memory_order_relaxed);
  s.op = nullptr;
  s.up = nullptr;
  s.peer = nullptr;
  s.startNs = now;
  s.startPTimer = 0;
  s.stopPTimer = 0;
  s.bytes = 0;
  s.phase = 0;
  for (auto& t : s.phaseStart) t = 0;
  s.state.store(kActive, std::memory_order_release);
  return &s;
}

void freeSmall(Pools* pools, SmallSlot* s) noexcept {
  s->state.store(kFree, std::memory_order_release);
  pools->smallFree.push(static_cast<uint32_t>(s - pools->small.get()));
}

// Length of a net-plugin event from the descriptors we know (NCCL's IB and Socket v1, weft's own v1); 0 otherwise.
uint64_t netLength(int64_t id, const void* data) noexcept {
  if (data == nullptr) return 0;
  uint32_t type = static_cast<uint32_t>(id) & NCCL_PROFILER_NET_TYPE_MASK;
  uint32_t ver = static_cast<uint32_t>(id) & NCCL_PROFILER_NET_VER_MASK;
  if (ver != 1) return 0;
  if (type == NCCL_PROFILER_NET_TYPE_IB) return static_cast<const ncclProfilerNetIbDescr_v1_t*>(data)->qp.length;
  if (type == NCCL_PROFILER_NET_TYPE_SOCK) return static_cast<const ncclProfilerNetSockDescr_v1_t*>(data)->sock.length;
  if (type == WEFT_PROFILER_NET_TYPE) return static_cast<const weftProfilerNetDescr_v1_t*>(data)->length;
  return 0;
}

void* startOp(Pools* pools, Context* c, const EventDesc& d, uint64_t now) noexcept {
  uint32_t idx;
  if (!pools->opFree.pop(&idx)) {
    c->dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  OpSlot& s = pools->ops[idx];
  if (d.hasCommHash && !c->hasComm) {
    uint64_t zero = 0;
    c->commHash.compare_exchange_strong(zero, d.commHash, std::memory_order_relaxed);
  }
  if (d.rank >= 0 && c->rank.load(std::memory_order_relaxed) < 0) c->rank.store(d.rank, std::memory_order_relaxed);
  CollRecord& r = s.rec;
  r = CollRecord{};
  r.commHash = d.hasCommHash ? d.commHash : c->commHash.load(std::memory_order_relaxed);
  r.seq = d.seq;
  r.func = d.func;
  r.dtype = d.dtype;
  r.count = d.count;
  r.bytes = d.count * typeSize(d.dtype);
  r.root = d.root;
  r.peer = d.peer;
  r.algo = d.algo;
  r.proto = d.proto;
  r.nChannels = d.nChannels;
  r.nWarps = d.nWarps;
  r.rank = d.rank >= 0 ? d.rank : c->rank.load(std::memory_order_relaxed);
  r.nRanks = c->nRanks;
  r.nNodes = c->nNodes;
  r.startNs = now;
  r.userTag = d.userTag;
  r.flags = static_cast<uint8_t>((d.type == EvType::kP2p ? kRecP2p : 0) |
                                 (d.parent == kSentinelApiCaptured ? kRecGraphCaptured : 0));
  s.ctx.store(c, std::memory_order_relaxed);
  // With KernelCh on (v4+: GPU timers), NCCL sends one kernel-channel event per channel the operation uses.
  s.kernelsExpected.store(c->version >= 4 ? d.nChannels : 0, std::memory_order_relaxed);
  s.inflight.store(0, std::memory_order_relaxed);
  s.kernelsDone.store(0, std::memory_order_relaxed);
  s.gpuTimed.store(0, std::memory_order_relaxed);
  s.proxyOps.store(0, std::memory_order_relaxed);
  s.maxGpuNs.store(0, std::memory_order_relaxed);
  s.maxKernelCpuNs.store(0, std::memory_order_relaxed);
  s.firstChildNs.store(UINT64_MAX, std::memory_order_relaxed);
  s.lastChildNs.store(0, std::memory_order_relaxed);
  s.lastActivityNs.store(now, std::memory_order_relaxed);
  for (auto& p : s.maxPhaseNs) p.store(0, std::memory_order_relaxed);
  s.channelsPhased.store(0, std::memory_order_relaxed);
  s.seq.store(c->opSeq.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  c->started.fetch_add(1, std::memory_order_relaxed);
  s.state.store(kActive, std::memory_order_release);
  return &s;
}

// Writes out a stopped operation when it is complete: every expected kernel channel reported (or, without
// kernel events, nothing happened for kQuietNs), no child in flight. force: also when children are missing.
// The state flip Stopped -> Emitting makes exactly one caller win; the slot is free again on return.
bool tryFinish(Pools* pools, OpSlot& s, bool force, uint64_t now, CollRecord* out, Context** owner) noexcept {
  if (s.state.load(std::memory_order_acquire) != kStopped) return false;
  int32_t done = s.kernelsDone.load(std::memory_order_relaxed);
  int32_t expected = s.kernelsExpected.load(std::memory_order_relaxed);
  uint64_t idle = now - std::min(now, s.lastActivityNs.load(std::memory_order_relaxed));
  const Context* c = s.ctx.load(std::memory_order_relaxed);
  const bool quiet = idle >= kQuietNs;
  // A later operation of the communicator made progress on the GPU: whatever this one still misses is not coming.
  const bool overtaken = c != nullptr && c->progressSeq.load(std::memory_order_relaxed) > s.seq.load(std::memory_order_relaxed);
  const bool captured = (s.rec.flags & kRecGraphCaptured) != 0;
  bool complete;
  if (expected > 0) {
    complete = done >= expected;
  } else {
    const bool hadNews = s.proxyOps.load(std::memory_order_relaxed) > 0 ||
                         s.maxKernelCpuNs.load(std::memory_order_relaxed) > 0 || s.kernelsDone.load(std::memory_order_relaxed) > 0;
    const bool noneComing = captured || c == nullptr || !c->anyChild.load(std::memory_order_relaxed);
    complete = quiet && (hadNews || noneComing || overtaken || idle >= kHoldNs);
  }
  bool partial = false;
  if (!complete) {
    if (!force && !((overtaken || captured) && quiet) && idle < kHoldNs) return false;
    partial = expected > 0;
  }
  if (s.inflight.load(std::memory_order_seq_cst) != 0 && !force) return false;
  uint32_t expect = kStopped;
  if (!s.state.compare_exchange_strong(expect, kEmitting, std::memory_order_seq_cst)) return false;
  if (s.inflight.load(std::memory_order_seq_cst) != 0 && !force) {
    s.state.store(kStopped, std::memory_order_release);
    return false;
  }
  CollRecord& r = *out;
  r = s.rec;
  uint64_t lastChild = s.lastChildNs.load(std::memory_order_relaxed);
  r.endNs = std::max(r.enqueuedNs, lastChild);
  r.channelsTimed = static_cast<uint8_t>(std::min<uint32_t>(255, s.gpuTimed.load(std::memory_order_relaxed)));
  uint64_t kcpu = s.maxKernelCpuNs.load(std::memory_order_relaxed);
  uint64_t first = s.firstChildNs.load(std::memory_order_relaxed);
  if (r.channelsTimed > 0) {
    r.gpuNs = s.maxGpuNs.load(std::memory_order_relaxed);
    r.execNs = r.gpuNs;
    r.timing = TimingSource::kKernelGpu;
  } else if (kcpu > 0) {
    r.execNs = kcpu;
    r.timing = TimingSource::kKernelCpu;
  } else if (s.proxyOps.load(std::memory_order_relaxed) > 0 && first != UINT64_MAX && lastChild > first) {
    r.execNs = lastChild - first;
    r.timing = TimingSource::kProxyCpu;
  } else {
    r.execNs = r.enqueuedNs > r.startNs ? r.enqueuedNs - r.startNs : 0;
    r.timing = TimingSource::kCollectiveCpu;
  }
  r.channelsPhased = static_cast<uint8_t>(std::min<uint32_t>(255, s.channelsPhased.load(std::memory_order_relaxed)));
  for (int p = 0; p < kNumKernelPhases; ++p) r.phaseNs[p] = s.maxPhaseNs[p].load(std::memory_order_relaxed);
  if (partial) r.flags |= kRecPartial;
  *owner = s.ctx.load(std::memory_order_relaxed);
  s.state.store(kFree, std::memory_order_release);
  pools->opFree.push(static_cast<uint32_t>(&s - pools->ops.get()));
  return true;
}

// Per-thread record rings: the thread that completes an operation (normally NCCL's proxy thread, on the last
// kernel-channel stop) moves its record here at once, so slots are free again without waiting for the writer.
// Single producer (the owning thread), single consumer (the writer, under its lock). A ring outlives its thread
// and is handed to the next thread once drained.
struct RecordRing {
  static constexpr uint32_t kCap = 4096;
  std::unique_ptr<CollRecord[]> recs{new CollRecord[kCap]};
  std::unique_ptr<Context*[]> ctxs{new Context*[kCap]};
  alignas(64) std::atomic<uint64_t> head{0};
  alignas(64) std::atomic<uint64_t> tail{0};
  std::atomic<int> owner{0};  // 0 free, 1 owned by a live thread, 2 its thread exited
};
constexpr int kMaxRings = 512;
std::atomic<RecordRing*> gRings[kMaxRings];
std::atomic<int> gRingCount{0};
std::mutex gRingMutex;
std::atomic<uint64_t> gRingFull{0};

struct RingHolder {
  RecordRing* ring = nullptr;
  ~RingHolder() {
    if (ring != nullptr) ring->owner.store(2, std::memory_order_release);
  }
};
thread_local RingHolder tRing;

RecordRing* myRing() noexcept {
  if (tRing.ring != nullptr) return tRing.ring;
  try {
    std::lock_guard<std::mutex> lock(gRingMutex);
    int n = gRingCount.load(std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
      RecordRing* r = gRings[i].load(std::memory_order_relaxed);
      int expect = 0;
      if (r->owner.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) return tRing.ring = r;
    }
    if (n == kMaxRings) return nullptr;
    auto* r = new RecordRing;  // once per thread, never per event
    r->owner.store(1, std::memory_order_relaxed);
    gRings[n].store(r, std::memory_order_release);
    gRingCount.store(n + 1, std::memory_order_release);
    return tRing.ring = r;
  } catch (...) {
    return nullptr;
  }
}

std::atomic<const WriterHooks*> gWriter{nullptr};

void wakeWriter() noexcept {
  if (const WriterHooks* w = gWriter.load(std::memory_order_acquire)) w->wake();
}

// The caller (the ring's only producer) has checked there is room.
void ringPush(RecordRing* ring, const CollRecord& r, Context* c) noexcept {
  uint64_t h = ring->head.load(std::memory_order_relaxed);
  ring->recs[h % RecordRing::kCap] = r;
  ring->ctxs[h % RecordRing::kCap] = c;
  ring->head.store(h + 1, std::memory_order_release);
  // Filling up: ask the writer for a round now (at a quarter, half and three quarters, in case one is missed).
  uint64_t pending = h + 1 - ring->tail.load(std::memory_order_relaxed);
  if (pending % (RecordRing::kCap / 4) == 0) wakeWriter();
}

size_t drainRings(void (*fn)(void*, const CollRecord&, Context*), void* arg) {
  size_t n = 0;
  int count = gRingCount.load(std::memory_order_acquire);
  for (int i = 0; i < count; ++i) {
    RecordRing* ring = gRings[i].load(std::memory_order_acquire);
    uint64_t t = ring->tail.load(std::memory_order_relaxed);
    uint64_t h = ring->head.load(std::memory_order_acquire);
    for (; t < h; ++t, ++n) fn(arg, ring->recs[t % RecordRing::kCap], ring->ctxs[t % RecordRing::kCap]);
    ring->tail.store(t, std::memory_order_release);
    int orphan = 2;
    if (ring->head.load(std::memory_order_acquire) == t)
      ring->owner.compare_exchange_strong(orphan, 0, std::memory_order_acq_rel);
  }
  return n;
}

// Called after a child stopped or the operation itself stopped: writes the operation out from this thread when
// that completed it.
// When this thread's ring is full (the writer is behind), the operation stays in its slot, complete, and the
// writer's own scan writes it out: nothing is lost while there are slots.
void finishIfComplete(Pools* pools, OpSlot* op, uint64_t now) noexcept {
  int32_t expected = op->kernelsExpected.load(std::memory_order_relaxed);
  if (expected <= 0 || op->kernelsDone.load(std::memory_order_relaxed) < expected) return;
  RecordRing* ring = myRing();
  if (ring == nullptr ||
      ring->head.load(std::memory_order_relaxed) - ring->tail.load(std::memory_order_acquire) >= RecordRing::kCap) {
    gRingFull.fetch_add(1, std::memory_order_relaxed);
    wakeWriter();
    return;
  }
  CollRecord r;
  Context* owner = nullptr;
  if (tryFinish(pools, *op, false, now, &r, &owner)) ringPush(ring, r, owner);
}

}  // namespace

uint64_t wallNs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

Level levelFromParams() {
  const std::string& v = params::getString("WEFT_TIMING");
  if (v == "0") return Level::kOff;
  if (v == "proxy") return Level::kProxy;
  if (v == "net") return Level::kNet;
  return Level::kColl;  // "1", "coll"
}

const char* levelName(Level l) noexcept {
  switch (l) {
    case Level::kOff: return "off";
    case Level::kColl: return "coll";
    case Level::kProxy: return "proxy";
    case Level::kNet: return "net";
  }
  return "?";
}

int maskFor(Level l, int version) noexcept {
  if (l == Level::kOff) return 0;
  int m = ncclProfileColl | ncclProfileP2p;
  if (version >= 3) m |= ncclProfileKernelCh;
  if (l >= Level::kProxy) m |= ncclProfileProxyOp | ncclProfileProxyStep;
  if (l >= Level::kNet && version >= 3) m |= ncclProfileNetPlugin;
  if (version >= 7) m |= ncclProfileKernelPhase;  // NCCL sends them for kernels that time their barriers
  return m;
}

EvType evTypeFromBit(uint64_t t) noexcept {
  switch (t) {
    case ncclProfileGroup: return EvType::kGroup;
    case ncclProfileColl: return EvType::kColl;
    case ncclProfileP2p: return EvType::kP2p;
    case ncclProfileProxyOp: return EvType::kProxyOp;
    case ncclProfileProxyStep: return EvType::kProxyStep;
    case ncclProfileProxyCtrl: return EvType::kProxyCtrl;
    case ncclProfileKernelCh: return EvType::kKernelCh;
    case ncclProfileNetPlugin: return EvType::kNetPlugin;
    case ncclProfileGroupApi: return EvType::kGroupApi;
    case ncclProfileCollApi: return EvType::kCollApi;
    case ncclProfileP2pApi: return EvType::kP2pApi;
    case ncclProfileKernelLaunch: return EvType::kKernelLaunch;
    case ncclProfileCeColl: return EvType::kCeColl;
    case ncclProfileCeSync: return EvType::kCeSync;
    case ncclProfileCeBatch: return EvType::kCeBatch;
    case ncclProfileKernelPhase: return EvType::kKernelPhase;
    default: return EvType::kUnknown;
  }
}

void setWriterHooks(const WriterHooks* hooks) noexcept { gWriter.store(hooks, std::memory_order_release); }

ncclResult_t initContext(void** context, int* eActivationMask, const InitArgs& a) noexcept {
  try {
    if (context == nullptr) return ncclInvalidArgument;
    *context = nullptr;
    if (a.logger != nullptr) log::setLogger(a.logger);
    Level level = levelFromParams();
    if (eActivationMask != nullptr) *eActivationMask = maskFor(level, a.version);
    if (level == Level::kOff) {
      // Succeed with no context: NCCL keeps the plugin and hands us NULL contexts, which start nothing.
      WEFT_INFO(NCCL_INIT, "timing: off (WEFT_TIMING=0)");
      return ncclSuccess;
    }
    std::call_once(gPoolsOnce, [] { gPools.store(new Pools, std::memory_order_release); });
    Context* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(gContextMutex);
      for (auto& cand : gContexts) {
        if (cand.live.load(std::memory_order_relaxed) == 0) {
          c = &cand;
          break;
        }
      }
      if (c == nullptr) {
        WEFT_WARN("timing: more than {} communicators at once; this one is not timed", kMaxContexts);
        return ncclSuccess;
      }
      c->magic = kCtxMagic;
      c->index = static_cast<uint32_t>(c - gContexts);
      c->version = a.version;
      c->level = level;
      c->hasComm = a.hasComm;
      c->commHash.store(a.commHash, std::memory_order_relaxed);
      c->name = a.commName != nullptr ? a.commName : "";
      c->nNodes = a.nNodes;
      c->nRanks = a.nRanks;
      c->rank.store(a.hasComm ? a.rank : -1, std::memory_order_relaxed);
      c->pid = getpid();
      c->initNs = wallNs();
      c->dropped.store(0, std::memory_order_relaxed);
      c->started.store(0, std::memory_order_relaxed);
      if (c->peers == nullptr) c->peers = new PeerStats[kMaxPeersPerComm];
      for (int i = 0; i < kMaxPeersPerComm; ++i) {
        PeerStats& p = c->peers[i];
        p.peer.store(-1);
        p.sendBytes = 0, p.recvBytes = 0, p.sendSteps = 0, p.recvSteps = 0, p.ops = 0, p.netBytes = 0, p.netMsgs = 0;
        p.stepLatency.reset();
        p.netLatency.reset();
      }
      c->live.store(1, std::memory_order_release);
    }
    if (const WriterHooks* w = gWriter.load(std::memory_order_acquire)) w->contextStarted(c);
    *context = c;
    return ncclSuccess;
  } catch (...) {
    // Never fail init for a telemetry problem: on 2.23-2.27 that turns profiling off process-wide.
    WEFT_WARN("timing: init failed; this communicator is not timed");
    return ncclSuccess;
  }
}

void* startEvent(void* context, const EventDesc& d) noexcept {
  Context* c = asContext(context);
  if (c == nullptr) {
    if (context != nullptr) gBadHandles.fetch_add(1, std::memory_order_relaxed);
    else gNullContexts.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  Pools* pools = gPools.load(std::memory_order_acquire);
  bool timed = d.type == EvType::kColl || d.type == EvType::kP2p || d.type == EvType::kKernelCh ||
               d.type == EvType::kProxyOp || d.type == EvType::kProxyStep || d.type == EvType::kNetPlugin;
  uint64_t now = timed ? wallNs() : 0;
  switch (d.type) {
    case EvType::kColl:
    case EvType::kP2p:
      return startOp(pools, c, d, now);
    case EvType::kCollApi:
    case EvType::kP2pApi:
      return d.graphCaptured ? kSentinelApiCaptured : kSentinelApiLive;
    case EvType::kKernelCh: {
      SmallSlot* s = allocSmall(pools, c, EvType::kKernelCh, now);
      if (s == nullptr) return nullptr;
      s->op = attach(pools, c, d.parent);
      s->startPTimer = d.pTimer;
      return s;
    }
    case EvType::kKernelPhase: {
      // A channel's barrier phase, reported just before its KernelCh stops (parent: that KernelCh event). A phase
      // of anything else (garbage, a channel that stopped, another communicator's) is an event weft does not time.
      SmallSlot* ch = asSmall(pools, d.parent);
      if (ch == nullptr || ch->type != EvType::kKernelCh || ch->ctx.load(std::memory_order_relaxed) != c ||
          ch->state.load(std::memory_order_acquire) != kActive || d.phaseId >= kNumKernelPhases)
        return kSentinelGeneric;
      ch->phaseStart[d.phaseId] = d.pTimer;
      return &ch->phaseTag[d.phaseId];
    }
    case EvType::kProxyOp: {
      SmallSlot* s = allocSmall(pools, c, EvType::kProxyOp, now);
      if (s == nullptr) return nullptr;
      // PXN: an op generated by another process's proxy carries a parent from that address space.
      if (d.pid == c->pid) {
        s->op = attach(pools, c, d.parent);
        if (s->op != nullptr) {
          s->op->proxyOps.fetch_add(1, std::memory_order_relaxed);
          atomicMin(s->op->firstChildNs, now);
        }
      } else {
        gForeignParents.fetch_add(1, std::memory_order_relaxed);
      }
      s->isSend = d.isSend != 0;
      s->peer = peerOf(c, d.peer);
      if (s->peer != nullptr) s->peer->ops.fetch_add(1, std::memory_order_relaxed);
      return s;
    }
    case EvType::kProxyStep: {
      SmallSlot* s = allocSmall(pools, c, EvType::kProxyStep, now);
      if (s == nullptr) return nullptr;
      SmallSlot* up = asSmall(pools, d.parent);
      if (up != nullptr && up->type == EvType::kProxyOp && up->ctx.load(std::memory_order_relaxed) == c &&
          up->state.load(std::memory_order_acquire) == kActive) {
        s->up = up;
        s->peer = up->peer;
        s->isSend = up->isSend;
      }
      return s;
    }
    case EvType::kNetPlugin: {
      SmallSlot* s = allocSmall(pools, c, EvType::kNetPlugin, now);
      if (s == nullptr) return nullptr;
      SmallSlot* up = asSmall(pools, d.parent);
      if (up != nullptr && up->type == EvType::kProxyStep && up->ctx.load(std::memory_order_relaxed) == c) s->peer = up->peer;
      s->bytes = netLength(d.netId, d.netData);
      return s;
    }
    case EvType::kGroup:
    case EvType::kGroupApi:
    case EvType::kKernelLaunch:
    case EvType::kProxyCtrl:
    case EvType::kCeColl:
    case EvType::kCeSync:
    case EvType::kCeBatch:
      return kSentinelGeneric;
    case EvType::kUnknown:
      break;
  }
  gUnknownTypes.fetch_add(1, std::memory_order_relaxed);
  return kSentinelGeneric;  // unknown future events: keep NCCL sending their children
}

void stopEvent(void* handle) noexcept {
  if (handle == nullptr || isSentinel(handle)) return;  // NCCL forwards stopEvent(NULL) from net plugins (§4)
  Pools* pools = gPools.load(std::memory_order_acquire);
  if (pools == nullptr) {
    gBadHandles.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  int phase = 0;
  if (asPhase(pools, handle, &phase) != nullptr) return;  // a kernel phase: its stop time came with its state
  uint64_t now = wallNs();
  if (OpSlot* op = asOp(pools, handle)) {
    uint32_t expect = kActive;
    if (!op->state.compare_exchange_strong(expect, kActive, std::memory_order_acquire)) {
      gDoubleStops.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    op->rec.enqueuedNs = now;
    op->lastActivityNs.store(now, std::memory_order_relaxed);
    op->state.store(kStopped, std::memory_order_seq_cst);
    finishIfComplete(pools, op, now);
    return;
  }
  SmallSlot* s = asSmall(pools, handle);
  if (s == nullptr) {
    gBadHandles.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  uint32_t expect = kActive;
  if (!s->state.compare_exchange_strong(expect, kStopped, std::memory_order_acq_rel)) {
    gDoubleStops.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  uint64_t dur = now > s->startNs ? now - s->startNs : 0;
  switch (s->type) {
    case EvType::kKernelCh:
      if (OpSlot* op = s->op) {
        if (s->startPTimer != 0 && s->stopPTimer >= s->startPTimer) {
          atomicMax(op->maxGpuNs, s->stopPTimer - s->startPTimer);
          op->gpuTimed.fetch_add(1, std::memory_order_relaxed);
        }
        atomicMax(op->maxKernelCpuNs, dur);
        atomicMax(op->lastChildNs, now);
        if (s->phase != 0) op->channelsPhased.fetch_add(1, std::memory_order_relaxed);
        op->kernelsDone.fetch_add(1, std::memory_order_relaxed);
        detach(op, now);
        finishIfComplete(pools, op, now);
      }
      break;
    case EvType::kProxyOp:
      if (PeerStats* p = s->peer) {  // v1-v3 report bytes on the op (transSize)
        if (s->bytes != 0) (s->isSend ? p->sendBytes : p->recvBytes).fetch_add(s->bytes, std::memory_order_relaxed);
      }
      if (OpSlot* op = s->op) {
        atomicMax(op->lastChildNs, now);
        detach(op, now);
      }
      break;
    case EvType::kProxyStep:
      if (PeerStats* p = s->peer) {
        (s->isSend ? p->sendSteps : p->recvSteps).fetch_add(1, std::memory_order_relaxed);
        if (s->bytes != 0) (s->isSend ? p->sendBytes : p->recvBytes).fetch_add(s->bytes, std::memory_order_relaxed);
        p->stepLatency.add(dur);
      }
      break;
    case EvType::kNetPlugin:
      if (PeerStats* p = s->peer) {
        p->netMsgs.fetch_add(1, std::memory_order_relaxed);
        p->netBytes.fetch_add(s->bytes, std::memory_order_relaxed);
        p->netLatency.add(dur);
      }
      break;
    default:
      break;
  }
  freeSmall(pools, s);
}

void recordState(void* handle, int state, uint64_t arg, bool hasArg) noexcept {
  if (handle == nullptr || isSentinel(handle)) return;
  Pools* pools = gPools.load(std::memory_order_acquire);
  if (pools == nullptr) {
    gBadHandles.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (asOp(pools, handle) != nullptr) return;  // NCCL records no states on Coll/P2p
  int phase = 0;
  if (SmallSlot* ch = asPhase(pools, handle, &phase)) {
    // A kernel phase's end: counted only while its channel still runs (NCCL stops the phases first), with both
    // GPU timers, as the longest of the operation's channels for that phase.
    const uint64_t start = ch->phaseStart[phase];
    if (state == ncclProfilerKernelPhaseStop && hasArg && ch->state.load(std::memory_order_acquire) == kActive &&
        ch->type == EvType::kKernelCh && ch->op != nullptr && start != 0 && arg >= start) {
      atomicMax(ch->op->maxPhaseNs[phase], arg - start);
      ch->phase = 1;
    }
    return;
  }
  SmallSlot* s = asSmall(pools, handle);
  if (s == nullptr) {
    gBadHandles.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (s->state.load(std::memory_order_acquire) != kActive || !hasArg) return;
  switch (s->type) {
    case EvType::kKernelCh:
      if (state == ncclProfilerKernelChStop) s->stopPTimer = arg;
      break;
    case EvType::kProxyOp:
    case EvType::kProxyStep:
      if (arg > s->bytes) s->bytes = arg;  // transSize: the bytes this step (v4+) / op (v1-v3) moved
      break;
    default:
      break;
  }
}

void finalizeContext(void* context) noexcept {
  Context* c = asContext(context);
  if (c == nullptr) {
    if (context != nullptr) gBadHandles.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (const WriterHooks* w = gWriter.load(std::memory_order_acquire)) w->contextEnding(c);
  // Children of this communicator still in the pool (never stopped) are returned to it.
  Pools* pools = gPools.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < kSmallSlots; ++i) {
    SmallSlot& s = pools->small[i];
    if (s.ctx.load(std::memory_order_relaxed) == c && s.state.load(std::memory_order_acquire) == kActive) {
      uint32_t expect = kActive;
      if (s.state.compare_exchange_strong(expect, kStopped, std::memory_order_acq_rel)) freeSmall(pools, &s);
    }
  }
  std::lock_guard<std::mutex> lock(gContextMutex);
  c->live.store(0, std::memory_order_release);
}

Anomalies anomalies() noexcept {
  return Anomalies{gBadHandles.load(), gDoubleStops.load(), gNullContexts.load(), gForeignParents.load(),
                   gUnknownTypes.load(), gRingFull.load()};
}

size_t drainOpsImpl(Context* ctx, bool force, void (*fn)(void*, const CollRecord&, Context*), void* arg) {
  Pools* pools = gPools.load(std::memory_order_acquire);
  if (pools == nullptr) return 0;
  size_t emitted = drainRings(fn, arg);
  uint64_t now = wallNs();
  for (uint32_t i = 0; i < kOpSlots; ++i) {
    OpSlot& s = pools->ops[i];
    uint32_t st = s.state.load(std::memory_order_acquire);
    Context* owner0 = s.ctx.load(std::memory_order_relaxed);
    if (st == kActive && force && ctx != nullptr && owner0 == ctx) {
      // Started and never stopped by the time the communicator is finalized: nothing to report.
      uint32_t expect = kActive;
      if (s.state.compare_exchange_strong(expect, kFree, std::memory_order_acq_rel)) {
        ctx->dropped.fetch_add(1, std::memory_order_relaxed);
        pools->opFree.push(i);
      }
      continue;
    }
    if (st != kStopped || (ctx != nullptr && owner0 != ctx)) continue;
    CollRecord r;
    Context* owner = nullptr;
    if (tryFinish(pools, s, force, now, &r, &owner)) {
      fn(arg, r, owner);
      ++emitted;
    }
  }
  return emitted;
}


}  // namespace weft::telemetry
