// SPDX-License-Identifier: Apache-2.0
#include "plugin/conn_timing.h"

#include <time.h>

#include <atomic>

#include "rma/rma.h"
#include "telemetry/profiler_core.h"
#include "telemetry/sink.h"
#include "weft/common/cuda_shim.h"
#include "weft/common/topology.h"
#include "weft/nccl/net.h"
#include "weft/nccl/profiler.h"

namespace weft {
namespace {

// What is noted about a request, in its Request::timingSlot (set at post, used when test() says done).
struct RequestTiming {
  telemetry::ConnStats* conn;  // the comm's record; nullptr: timing off, or already reported
  uint64_t postNs;             // monotonic clock at isend/irecv
  uint64_t bytes;              // posted bytes (sends)
  uint8_t nBufs;               // buffers of the request (receives: how many sizes test() reports)
  uint8_t nEvents;
  uint8_t slot;                // its entry in the comm's ledger of operations in flight (ConnStats::kLedger: none)
  void* events[kMaxRecvs];     // net-plugin profiler events opened for this request
};
static_assert(sizeof(RequestTiming) <= sizeof(Request::timingSlot) && alignof(RequestTiming) <= alignof(Request),
              "Request::timingSlot must hold a RequestTiming");

// The storage is the request's own, zeroed at construction (conn == nullptr) and reused with it; RequestTiming is
// an implicit-lifetime type, so the bytes hold one.
RequestTiming& timingOf(Request* r) { return *reinterpret_cast<RequestTiming*>(r->timingSlot); }

std::atomic<ncclProfilerCallback_t> gProfCallback{nullptr};

telemetry::Level timingLevel() {
  static const telemetry::Level level = telemetry::levelFromParams();
  return level;
}

uint64_t monoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void locate(telemetry::ConnStats* s, const Comm* c, const std::string& gpu) {
  const DeviceProps* p = c->deviceProps();
  if (p == nullptr) return;
  const topo::Locality l = topo::localityOf(topo::Topology::host(), p->name, p->pciPath, p->numaNode, gpu);
  s->numa = l.numa;
  s->gpu = l.gpu;
  s->gpuPath = l.path == topo::Path::kUnknown ? "" : topo::pathName(l.path);
}

}  // namespace

void timingRegMr(Comm* c, const void* data, int type) {
  auto* s = static_cast<telemetry::ConnStats*>(c->timingRecord);
  if (s == nullptr || type != NCCL_PTR_CUDA || !s->gpu.empty()) return;
  try {
    locate(s, c, cuda::busIdOf(data));  // no current context at connect: the GPU its buffers are on
  } catch (...) {
  }
}

void setProfilerCallback(ncclProfilerCallback_t cb) { gProfCallback.store(cb, std::memory_order_relaxed); }

void timingOpen(Comm* c, bool isSend) {
  if (timingLevel() == telemetry::Level::kOff || c->timingRecord != nullptr) return;
  try {
    int nRails = 0;
    const RailHealth* rails = c->rails(&nRails);
    auto* s = telemetry::registerConn(isSend, c->peerName(), c->deviceName(), rails, nRails, c->stallState(),
                                      c->localName());
    c->timingRecord = s;
    // Where it runs: its NIC's NUMA node, and the GPU of the thread that made it (NCCL's proxy threads have their
    // rank's GPU current) with the path between them.
    locate(s, c, cuda::busIdOf(nullptr));
  } catch (...) {
    c->timingRecord = nullptr;  // no record for this comm; the data path is unaffected
  }
}

void timingClose(Comm* c) {
  auto* s = static_cast<telemetry::ConnStats*>(c->timingRecord);
  c->timingRecord = nullptr;
  if (s == nullptr) return;
  if (s->nRails > 0) c->refreshRails();
  telemetry::unregisterConn(s);
}

void timingPost(Comm* c, Request* r, uint64_t bytes, int tag, bool isSend, int n, void* const* phandles) {
  RequestTiming& t = timingOf(r);
  // A request of this comm reused without a completion seen (a failed one): its ledger entry goes first.
  if (t.conn != nullptr && t.conn == c->timingRecord) t.conn->ledgerDone(t.slot);
  t.conn = static_cast<telemetry::ConnStats*>(c->timingRecord);
  t.nEvents = 0;
  t.nBufs = static_cast<uint8_t>(n);
  if (t.conn == nullptr) return;
  t.postNs = monoNs();
  t.bytes = bytes;
  t.slot = static_cast<uint8_t>(t.conn->ledgerPost(t.postNs, bytes, tag, n));
  ncclProfilerCallback_t cb = gProfCallback.load(std::memory_order_relaxed);
  if (cb == nullptr || phandles == nullptr || timingLevel() < telemetry::Level::kNet) return;
  telemetry::ConnStats* stats = t.conn;
  for (int i = 0; i < n && i < kMaxRecvs; ++i) {
    if (phandles[i] == nullptr) continue;
    weftProfilerNetDescr_v1_t d{};
    d.type = 1;
    d.isSend = isSend ? 1 : 0;
    d.peerId = stats->id;
    d.seq = stats->msgs.load(std::memory_order_relaxed);
    d.length = bytes;
    void* eh = nullptr;  // NCCL leaves it untouched when its mask does not ask for net events
    cb(&eh, ncclProfilerNetEventStart, phandles[i], static_cast<int64_t>(WEFT_PROFILER_NET_TYPE | WEFT_PROFILER_NET_VER), &d);
    if (eh != nullptr) t.events[t.nEvents++] = eh;
  }
}

bool timingPending(Request* r) { return timingOf(r).conn != nullptr; }

void timingDone(Request* r, const int* sizes) {
  RequestTiming& t = timingOf(r);
  telemetry::ConnStats* stats = t.conn;
  if (stats == nullptr) return;
  t.conn = nullptr;
  stats->ledgerDone(t.slot);
  uint64_t bytes = t.bytes;
  if (!stats->isSend && sizes != nullptr) {
    bytes = 0;
    for (int i = 0; i < t.nBufs; ++i) bytes += sizes[i] > 0 ? static_cast<uint64_t>(sizes[i]) : 0;
  }
  stats->bytes.fetch_add(bytes, std::memory_order_relaxed);
  stats->msgs.fetch_add(1, std::memory_order_relaxed);
  uint64_t now = monoNs();
  stats->latency.add(now > t.postNs ? now - t.postNs : 0);
  if (t.nEvents != 0) {
    ncclProfilerCallback_t cb = gProfCallback.load(std::memory_order_relaxed);
    for (int i = 0; i < t.nEvents; ++i) {
      void* eh = t.events[i];
      if (cb != nullptr) cb(&eh, ncclProfilerNetEventStop, nullptr, 0, nullptr);
    }
    t.nEvents = 0;
  }
}

uint32_t timingRmaOpen(rma::RmaComm* c, const std::string& device) {
  if (timingLevel() == telemetry::Level::kOff || c == nullptr) return 0;
  try {
    telemetry::LedgerSource src;
    src.device = device;
    src.rank = c->rank();
    src.nranks = c->nranks();
    src.read = [c](std::vector<PeerLedger>* out) { return c->ledger(out); };
    src.stallEvents = [c] { return c->stallEvents(); };
    return telemetry::registerLedger(std::move(src));
  } catch (...) {
    return 0;  // no ledger in the dumps for this comm; the data path is unaffected
  }
}

void timingRmaClose(uint32_t id) {
  if (id != 0) telemetry::unregisterLedger(id);
}

}  // namespace weft
