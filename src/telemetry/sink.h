// SPDX-License-Identifier: Apache-2.0
// The writer side of weft's timing: a background thread (asleep between rounds, never spinning) that collects
// finished operations from the profiler's slots, appends them as JSON lines under WEFT_TELEMETRY_DIR, keeps
// per-communicator aggregates, rewrites the Prometheus textfile (WEFT_PROM_FILE) every WEFT_PROM_INTERVAL
// seconds, and at communicator finalize prints the summary table into NCCL's log.
#pragma once

#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "weft/common/ledger.h"
#include "weft/common/rail_health.h"
#include "telemetry/profiler_core.h"

namespace weft::telemetry {

class InspectServer;

// Connection counters registered by weft's own transport (one per send or receive comm).
struct ConnStats {
  uint32_t id = 0;
  bool isSend = false;
  std::string peer;     // the peer's address as the provider names it
  std::string local;    // this end's address as the peer names it ("" where the backend gives none)
  std::string device;   // weft device name
  std::atomic<uint64_t> bytes{0}, msgs{0};
  LatencyHistogram latency;  // post (isend/irecv) -> completion seen in test
  // A multi-rail comm's rails (the comm's, valid while the connection is registered; NULL for one rail).
  const RailHealth* rails = nullptr;
  int nRails = 0;
  const StallState* stall = nullptr;  // the comm's (valid while registered; NULL where its backend watches none)
  // Where it runs (docs/topology.md): its NIC's NUMA node (-1 unknown), its GPU's bus id ("" unknown) and the path
  // between them ("PIX" ... "SYS", "" unknown). Set by the plugin layer before the first message, read at close.
  int numa = -1;
  std::string gpu, gpuPath;

  // The ledger of operations in flight (docs/hangs.md): a slot per posted request, written by the comm's thread
  // (NCCL's proxy thread: one per comm) at post and at completion, read by anyone (the dumps, the Prometheus file).
  // postNs (monotonic) is stored last with release and is 0 for a free slot; a reader checks it again after the
  // other fields and drops a slot that changed meanwhile. NCCL has at most NCCL_NET_MAX_REQUESTS (32) requests in
  // flight per comm; one beyond the ledger is counted in `unledgered`, not shown.
  struct InFlight {
    std::atomic<uint64_t> postNs{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<int32_t> tag{0};
    std::atomic<uint32_t> bufs{0};
  };
  static constexpr int kLedger = 32;
  InFlight inflight[kLedger];
  uint32_t ledgerUsed = 0;  // the comm's thread only: a bit per slot in use
  std::atomic<uint64_t> unledgered{0};
  // The comm's thread: a slot for a request posted now (kLedger: none free).
  int ledgerPost(uint64_t postNs, uint64_t bytes, int tag, int bufs) {
    const uint32_t free = ~ledgerUsed;
    if (free == 0) {
      unledgered.fetch_add(1, std::memory_order_relaxed);
      return kLedger;
    }
    const int i = __builtin_ctz(free);
    ledgerUsed |= 1u << i;
    inflight[i].bytes.store(bytes, std::memory_order_relaxed);
    inflight[i].tag.store(tag, std::memory_order_relaxed);
    inflight[i].bufs.store(static_cast<uint32_t>(bufs), std::memory_order_relaxed);
    inflight[i].postNs.store(postNs != 0 ? postNs : 1, std::memory_order_release);
    return i;
  }
  void ledgerDone(int i) {
    if (i < 0 || i >= kLedger) return;
    inflight[i].postNs.store(0, std::memory_order_release);
    ledgerUsed &= ~(1u << i);
  }
  struct Op {
    uint64_t postNs, bytes;
    int32_t tag;
    uint32_t bufs;
  };
  // Anyone: the operations in flight now, oldest first.
  std::vector<Op> inFlight() const;
};
ConnStats* registerConn(bool isSend, std::string peer, std::string device, const RailHealth* rails = nullptr,
                        int nRails = 0, const StallState* stall = nullptr, std::string local = {});  // never null
void unregisterConn(ConnStats* s);  // writes its final record; s is freed

// The device API's comms (plugin/rma_plugin.cc): each keeps its own ledger of its peers (weft/common/ledger.h),
// asked at every dump, where it gives one "conn" line per peer that something waits on, stalled or was lost (dir
// "rma", the net connections' fields, and the ranks). `read` runs on the dump's thread under the writer's lock and
// may answer false (the comm cannot tell now: a line says so); `stallEvents` is lock-free. Both stay valid until
// unregisterLedger returns.
struct LedgerSource {
  std::string device;
  int rank = -1, nranks = 0;
  std::function<bool(std::vector<PeerLedger>*)> read;
  std::function<uint64_t()> stallEvents;
};
uint32_t registerLedger(LedgerSource s);  // its id: the "conn" of its lines
void unregisterLedger(uint32_t id);

// Makes the Sink the profiler core's writer (WriterHooks); idempotent. Every user of the core's tables calls it
// before the first initContext.
void attachWriter() noexcept;

// One NIC's rail events over connections (the Prometheus file's weft_rail_*_total).
struct RailTotals {
  uint64_t downs = 0, recoveries = 0, failovers = 0, readmits = 0;
};

class Sink {
 public:
  static Sink& instance();
  void onInit(Context* c);
  void onFinalize(Context* c);
  void flush();  // one writer round now (tests, tools)
  // A record ring is filling up: the writer runs a round now. Lock-free for the caller (a notify that races with
  // the writer going to sleep can be lost; the flag and the writer's short sleep while busy bound the damage).
  void wake() noexcept {
    if (!wakeRequested_.exchange(true, std::memory_order_acq_rel)) cv_.notify_one();
  }
  void shutdown();  // stop the writer, write out everything (process exit)

  struct Agg {
    uint64_t count = 0, bytes = 0, execNs = 0;
    std::vector<double> execUs;   // samples (reservoir beyond kMaxSamples)
    std::vector<double> busBw;
  };
  // (func, p2p, size bucket, algo, proto)
  using AggKey = std::tuple<int, int, int, int, int>;
  // Per user tag (v7): what the tag's operations took. syncNs: time in the kernels' sync phases (waiting for the
  // other ranks) where NCCL reported phases; phased: how many operations did.
  struct TagAgg {
    uint64_t count = 0, bytes = 0, execNs = 0, syncNs = 0, phased = 0;
  };
  static constexpr size_t kMaxTagsTracked = 1024;  // per communicator; later tags are counted as "other"
  static constexpr uint64_t kOtherTag = UINT64_MAX;  // the tags beyond kMaxTagsTracked
  struct Comm {
    uint64_t commHash = 0;
    std::string name;
    int rank = -1, nRanks = 0, nNodes = 0, version = 0;
    Level level = Level::kOff;
    uint64_t records = 0, partial = 0;
    std::map<AggKey, Agg> aggs;
    std::map<uint64_t, TagAgg> tags;  // tagged operations only (tag 0 is untagged)
  };
  // The Prometheus label of a tag: its WEFT_TAG_NAMES name, else the number.
  std::string tagLabel(uint64_t tag) const;

  void connRecord(ConnStats* s, bool final);
  uint32_t addLedger(LedgerSource s);
  void removeLedger(uint32_t id);

 private:
  Sink() = default;
  void startLocked();
  void run();
  size_t roundLocked(bool force, Context* only);  // records written
  void takeRecordLocked(const CollRecord& r, Context* c);
  void writeLineLocked(const std::string& line);
  void flushLocked();
  void writePromLocked();
  void summaryLocked(const Comm& m, Context* c);
  void peerLinesLocked(const Comm& m, Context* c);
  struct TagLines {
    std::string ops, bytes, exec, sync;
    bool any = false;
    std::string text() const;
  };
  void tagLinesLocked(const Comm& m, const std::string& base, TagLines* out) const;
  // What `weft inspect` prints of this process (JSON lines); `reason` goes in its process line: live (a client
  // asked), stall (a connection stalled or lost its peer), sigterm.
  std::string inspectDumpLocked(const char* reason = "live");
  // The dump into WEFT_TELEMETRY_DIR/hangs/weft-<host>-<pid>-<n>.json.
  void writeDumpLocked(const char* reason);
  // A connection reported a stall since the last look: the inspect dump into WEFT_TELEMETRY_DIR/hangs (at most
  // kMaxStallDumps a process), for `weft report --hangs` and a post-mortem.
  void stallDumpLocked();
  static constexpr int kMaxStallDumps = 16;
  uint64_t stallsSeen_ = 0;
  int stallDumps_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  pid_t ownerPid_ = 0;
  bool stop_ = false;
  std::atomic<bool> wakeRequested_{false};
  bool started_ = false;
  std::map<Context*, Comm> comms_;
  std::vector<ConnStats*> conns_;
  std::map<uint32_t, LedgerSource> ledgers_;  // the device API's comms, by id
  // The dump's lines of the device API's comms: one per peer of each; `lines` counts them.
  std::string ledgerLinesLocked(int64_t nowMs, size_t* lines);
  // Rails (NICs) of closed connections: times they went down, came back and were failed over, by device (the
  // Prometheus file's weft_rail_*_total count these and the open connections' own).
  std::map<std::string, RailTotals> railsClosed_;
  int fd_ = -1;
  std::string pending_;
  std::string jsonlPath_;
  bool jsonlTried_ = false;
  std::string promPath_;
  int promIntervalS_ = 30;
  size_t promTags_ = 8;                      // WEFT_PROM_TAGS
  std::map<uint64_t, std::string> tagNames_;  // WEFT_TAG_NAMES
  uint64_t lastPromNs_ = 0;
  std::string host_;
  uint32_t nextConnId_ = 1;
  std::unique_ptr<InspectServer> inspect_;  // its dump takes mu_: made and reset without holding it
};

// JSON string escaping (names come from users).
std::string jsonEscape(const std::string& s);

// WEFT_TAG_NAMES ("1=forward,2=backward,0x10=optimizer"): tag numbers to names. Entries that do not parse are
// named in *bad (comma-separated) and left out; the rest are kept.
std::map<uint64_t, std::string> parseTagNames(const std::string& spec, std::string* bad);

}  // namespace weft::telemetry
