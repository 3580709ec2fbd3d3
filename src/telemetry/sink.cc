// SPDX-License-Identifier: Apache-2.0
#include "telemetry/sink.h"

#include "telemetry/inspect.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "weft/common/clock.h"
#include "weft/common/log.h"
#include "weft/common/numa.h"
#include "weft/common/params.h"
#include "weft/telemetry/record_reader.h"

namespace weft::telemetry {
namespace {

constexpr size_t kMaxSamples = 100000;  // per aggregate; a deterministic reservoir beyond
constexpr auto kRound = std::chrono::milliseconds(100);
constexpr auto kBusyRound = std::chrono::milliseconds(5);

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  size_t k = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

void addSample(std::vector<double>& v, double x, uint64_t n) {
  if (v.size() < kMaxSamples) {
    v.push_back(x);
    return;
  }
  uint64_t j = (n * 6364136223846793005ull + 1442695040888963407ull) % n;  // deterministic reservoir index
  if (j < kMaxSamples) v[j] = x;
}

std::string hex(uint64_t v) { return fmt::format("0x{:016x}", v); }

std::string hostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

std::string jsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (ch < 0x20) out += fmt::format("\\u{:04x}", ch);
        else out += static_cast<char>(ch);
    }
  }
  return out;
}

namespace {
std::string promEscape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}
}  // namespace

void attachWriter() noexcept {
  static const WriterHooks hooks{[]() noexcept { Sink::instance().wake(); },
                                 [](Context* c) { Sink::instance().onInit(c); },
                                 [](Context* c) { Sink::instance().onFinalize(c); }};
  setWriterHooks(&hooks);
}

Sink& Sink::instance() {
  static Sink* s = new Sink;  // lives until exit; its flush runs from the exit hook below
  return *s;
}

namespace {
// At process exit (NCCL jobs often never finalize their communicators), write out what is left.
struct ExitFlush {
  ~ExitFlush() { Sink::instance().shutdown(); }
};
}  // namespace

void Sink::shutdown() {
  // A forked child (a data-loader worker) has neither the writer thread nor, perhaps, a usable lock: leave it.
  if (ownerPid_ != getpid()) return;
  inspect_.reset();  // its thread may wait for mu_: stopped before it is taken
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_) return;
  stop_ = true;
  lock.unlock();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  lock.lock();
  roundLocked(true, nullptr);
  writePromLocked();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  started_ = false;
}

void Sink::startLocked() {
  if (started_) return;
  started_ = true;
  host_ = hostName();
  promPath_ = params::getString("WEFT_PROM_FILE");
  // %p: this process's pid (the ranks of a node each write their own file for one collector folder).
  for (size_t at = promPath_.find("%p"); at != std::string::npos; at = promPath_.find("%p", at)) {
    promPath_.replace(at, 2, std::to_string(getpid()));
  }
  promIntervalS_ = static_cast<int>(params::getInt("WEFT_PROM_INTERVAL"));
  promTags_ = static_cast<size_t>(params::getInt("WEFT_PROM_TAGS"));
  std::string bad;
  tagNames_ = parseTagNames(params::getString("WEFT_TAG_NAMES"), &bad);
  if (!bad.empty()) WEFT_WARN("timing: WEFT_TAG_NAMES: ignored {} (expected NUMBER=NAME, comma-separated)", bad);
  ownerPid_ = getpid();
  static ExitFlush exitFlush;  // destroyed at exit, after everything constructed before it
  (void)exitFlush;
  thread_ = std::thread([this] { run(); });
  // The dump takes mu_ (held here): the server's thread asks for it only once a client comes.
  inspect_ = InspectServer::start(
      [this] {
        std::lock_guard<std::mutex> l(mu_);
        return inspectDumpLocked();
      },
      [this] {
        // SIGTERM: the thread it interrupted may hold mu_; the handler waits for this at most kTermWaitMs.
        std::unique_lock<std::mutex> l(mu_, std::defer_lock);
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(InspectServer::kTermWaitMs);
        while (!l.try_lock()) {
          if (std::chrono::steady_clock::now() >= until) return;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        writeDumpLocked("sigterm");
      });
}

namespace {
bool makeDirs(const std::string& dir);  // below

// The clock of the ledger's post times (plugin/conn_timing.cc): CLOCK_MONOTONIC.
uint64_t monoNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
double ageS(uint64_t nowNs, uint64_t thenNs) { return nowNs > thenNs ? static_cast<double>(nowNs - thenNs) / 1e9 : 0.0; }
}  // namespace

void Sink::stallDumpLocked() {
  uint64_t stalls = 0;
  for (const auto& [id, src] : ledgers_) stalls += src.stallEvents ? src.stallEvents() : 0;
  for (const ConnStats* c : conns_) {
    // A peer lost is worth a dump too: the report names the dead rank from the survivors' dumps.
    if (c->stall != nullptr) {
      stalls += c->stall->stalls.load(std::memory_order_relaxed) + c->stall->peerLost.load(std::memory_order_relaxed);
    }
  }
  if (stalls <= stallsSeen_) {
    stallsSeen_ = std::min(stallsSeen_, stalls);  // connections closed: their stalls left the sum
    return;
  }
  stallsSeen_ = stalls;
  if (stallDumps_ >= kMaxStallDumps) return;
  writeDumpLocked("stall");
}

void Sink::writeDumpLocked(const char* reason) {
  const std::string& dir = params::getString("WEFT_TELEMETRY_DIR");
  if (dir.empty()) return;
  const std::string hangs = dir + "/hangs";
  if (!makeDirs(hangs)) return;
  const std::string path = fmt::format("{}/weft-{}-{}-{}.json", hangs, host_, getpid(), ++stallDumps_);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0664);
  if (fd < 0) {
    WEFT_WARN("timing: cannot write the stall dump {}: {}", path, std::strerror(errno));
    return;
  }
  const std::string out = inspectDumpLocked(reason);
  const ssize_t w = ::write(fd, out.data(), out.size());
  ::close(fd);
  if (w == static_cast<ssize_t>(out.size())) WEFT_INFO(NCCL_NET, "{}: this process's connections are in {}", reason, path);
}

// One line for the process, one per NCCL communicator the profiler knows, one per weft connection open now: what
// it moved, its latency, its stalls and how long it has been stalled now (docs/hangs.md).
std::string Sink::inspectDumpLocked(const char* reason) {
  const int64_t nowMs = coarseNowMs();
  const uint64_t nowNs = monoNowNs();
  size_t rmaLines = 0;
  const std::string rma = ledgerLinesLocked(nowMs, &rmaLines);
  std::string out =
      fmt::format(R"({{"type":"process","host":"{}","pid":{},"conns":{},"comms":{},"time_ns":{},"reason":"{}"}})",
                  jsonEscape(host_), getpid(), conns_.size() + rmaLines, comms_.size(), wallNs(), reason) + "\n";
  for (const auto& [ctx, m] : comms_) {
    out += fmt::format(R"({{"type":"comm","comm":"{}","comm_name":"{}","rank":{},"nranks":{},"nnodes":{}}})",
                       hex(m.commHash), jsonEscape(m.name), m.rank, m.nRanks, m.nNodes) + "\n";
  }
  for (const ConnStats* c : conns_) {
    const int64_t since = c->stall != nullptr ? c->stall->sinceMs.load(std::memory_order_relaxed) : 0;
    const auto kind =
        static_cast<StallKind>(c->stall != nullptr ? c->stall->kind.load(std::memory_order_relaxed) : 0);
    // The ledger: every operation in flight, oldest first (tag, bytes posted, buffers, age).
    const std::vector<ConnStats::Op> ops = c->inFlight();
    std::string opsJson;
    for (const ConnStats::Op& op : ops) {
      opsJson += fmt::format(R"({}{{"tag":{},"bytes":{},"bufs":{},"age_s":{:.3f}}})", opsJson.empty() ? "" : ",",
                             op.tag, op.bytes, op.bufs, ageS(nowNs, op.postNs));
    }
    out += fmt::format(
        R"({{"type":"conn","conn":{},"dir":"{}","peer":"{}","local":"{}","device":"{}","msgs":{},"bytes":{},"lat_p50_us":{:.3f},"stalls":{},"stalled_s":{:.3f},"stall_kind":"{}","inflight":{},"oldest_s":{:.3f},"unledgered":{},"ops":[{}]}})",
        c->id, c->isSend ? "send" : "recv", jsonEscape(c->peer), jsonEscape(c->local), jsonEscape(c->device),
        c->msgs.load(), c->bytes.load(), c->latency.quantileNs(0.5) / 1e3,
        c->stall != nullptr ? c->stall->stalls.load(std::memory_order_relaxed) : 0,
        since > 0 ? static_cast<double>(std::max<int64_t>(nowMs - since, 0)) / 1e3 : 0.0, stallKindName(kind),
        ops.size(), ops.empty() ? 0.0 : ageS(nowNs, ops.front().postNs),
        c->unledgered.load(std::memory_order_relaxed), opsJson) +
           "\n";
  }
  return out + rma;
}


namespace {

// mkdir -p: a job's output tree (WEFT_TELEMETRY_DIR=$OUT/run/weft) rarely exists before the first rank writes.
// Ranks create it concurrently: EEXIST at any level is success.
bool makeDirs(const std::string& dir) {
  for (size_t slash = dir.find('/', 1); ; slash = dir.find('/', slash + 1)) {
    const std::string part = dir.substr(0, slash);
    if (!part.empty() && mkdir(part.c_str(), 0775) != 0 && errno != EEXIST) return false;
    if (slash == std::string::npos) return true;
  }
}

}  // namespace

void Sink::writeLineLocked(const std::string& line) {
  if (!jsonlTried_) {
    jsonlTried_ = true;
    const std::string& dir = params::getString("WEFT_TELEMETRY_DIR");
    if (!dir.empty()) {
      if (!makeDirs(dir)) {
        WEFT_WARN("timing: cannot create WEFT_TELEMETRY_DIR {}: {}; no JSON records will be written", dir,
                  std::strerror(errno));
      } else {
        jsonlPath_ = fmt::format("{}/weft-{}-{}.jsonl", dir, host_, getpid());
        fd_ = ::open(jsonlPath_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0664);
        if (fd_ < 0) {
          WEFT_WARN("timing: cannot open {}: {}; no JSON records will be written", jsonlPath_, std::strerror(errno));
          jsonlPath_.clear();
        } else {
          WEFT_INFO(NCCL_INIT, "timing: records go to {}", jsonlPath_);
        }
      }
    }
  }
  if (fd_ < 0) return;
  pending_ += line;
  pending_ += '\n';
}

void Sink::flushLocked() {
  size_t off = 0;
  while (fd_ >= 0 && off < pending_.size()) {
    ssize_t n = ::write(fd_, pending_.data() + off, pending_.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      WEFT_WARN("timing: cannot write {}: {}; records from now on are dropped", jsonlPath_, std::strerror(errno));
      ::close(fd_);
      fd_ = -1;
      break;
    }
    off += static_cast<size_t>(n);
  }
  pending_.clear();
}

void Sink::onInit(Context* c) {
  std::lock_guard<std::mutex> lock(mu_);
  startLocked();
  Comm& m = comms_[c];
  m = Comm{};
  m.commHash = c->commHash.load();
  m.name = c->name;
  m.rank = c->rank.load();
  m.nRanks = c->nRanks;
  m.nNodes = c->nNodes;
  m.version = c->version;
  m.level = c->level;
  writeLineLocked(fmt::format(
      R"({{"v":{},"type":"comm","host":"{}","pid":{},"comm":"{}","comm_name":"{}","rank":{},"nranks":{},"nnodes":{},"profiler":{},"level":"{}","time_ns":{}}})",
      kRecordSchema, jsonEscape(host_), getpid(), hex(m.commHash), jsonEscape(m.name), m.rank, m.nRanks, m.nNodes, m.version,
      levelName(m.level), c->initNs));
  flushLocked();
  WEFT_INFO(NCCL_INIT, "timing: communicator {} rank {} of {} on profiler v{}, level {}", hex(m.commHash), m.rank,
            m.nRanks, m.version, levelName(m.level));
}

std::map<uint64_t, std::string> parseTagNames(const std::string& spec, std::string* bad) {
  std::map<uint64_t, std::string> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    uint64_t tag = 0;
    bool ok = eq != std::string::npos && eq > 0 && eq + 1 < item.size();
    if (ok) {
      const std::string num = item.substr(0, eq);
      char* end = nullptr;
      errno = 0;
      tag = std::strtoull(num.c_str(), &end, 0);
      ok = errno == 0 && end != nullptr && *end == 0 && num[0] != '-' && tag != 0;
    }
    if (!ok) {
      if (!bad->empty()) *bad += ",";
      *bad += "'" + item + "'";
      continue;
    }
    out[tag] = item.substr(eq + 1);
  }
  return out;
}

std::string Sink::tagLabel(uint64_t tag) const {
  if (tag == kOtherTag) return "other";
  auto it = tagNames_.find(tag);
  return it != tagNames_.end() ? it->second : std::to_string(tag);
}

void Sink::takeRecordLocked(const CollRecord& r, Context* c) {
  auto tagNameField = [&](uint64_t tag) -> std::string {
    auto it = tag != 0 ? tagNames_.find(tag) : tagNames_.end();
    return it == tagNames_.end() ? std::string() : fmt::format(R"(,"tag_name":"{}")", jsonEscape(it->second));
  };
  auto phasesField = [](const CollRecord& x) -> std::string {
    if (x.channelsPhased == 0) return std::string();
    return fmt::format(R"(,"phases_ns":[{},{},{}],"channels_phased":{})", x.phaseNs[0], x.phaseNs[1], x.phaseNs[2],
                       x.channelsPhased);
  };
  auto it = comms_.find(c);
  if (it == comms_.end()) return;
  Comm& m = it->second;
  if (m.commHash == 0 && r.commHash != 0) m.commHash = r.commHash;  // v1-v3: learnt from the events
  if (m.rank < 0 && r.rank >= 0) m.rank = r.rank;
  ++m.records;
  if (r.flags & kRecPartial) ++m.partial;
  double alg = algBwGBs(r.func, r.bytes, r.nRanks, r.execNs);
  double bus = busBwGBs(r.func, r.bytes, r.nRanks, r.execNs);
  bool p2p = (r.flags & kRecP2p) != 0;
  writeLineLocked(fmt::format(
      R"({{"v":{},"type":"{}","host":"{}","pid":{},"comm":"{}","rank":{},"nranks":{},"nnodes":{},"seq":{},"func":"{}","dtype":"{}","count":{},"bytes":{},"root":{},"peer":{},"algo":"{}","proto":"{}","channels":{},"warps":{},"start_ns":{},"enqueued_ns":{},"end_ns":{},"gpu_ns":{},"exec_ns":{},"timing":"{}","channels_timed":{},"algbw_gbs":{:.4f},"busbw_gbs":{:.4f},"graph":{},"partial":{},"tag":{}{}{}}})",
      kRecordSchema, p2p ? "p2p" : "coll", jsonEscape(host_), getpid(), hex(r.commHash), r.rank, r.nRanks, r.nNodes, r.seq,
      funcName(r.func), typeName(r.dtype), r.count, r.bytes, r.root, r.peer, p2p ? "" : algoName(r.algo),
      p2p ? "" : protoName(r.proto), r.nChannels, r.nWarps, r.startNs, r.enqueuedNs, r.endNs, r.gpuNs, r.execNs,
      timingSourceName(r.timing), r.channelsTimed, alg, bus, (r.flags & kRecGraphCaptured) ? "true" : "false",
      (r.flags & kRecPartial) ? "true" : "false", r.userTag, tagNameField(r.userTag), phasesField(r)));
  if (r.userTag != 0) {
    uint64_t key = r.userTag;
    if (m.tags.find(key) == m.tags.end() && m.tags.size() >= kMaxTagsTracked) key = kOtherTag;
    TagAgg& t = m.tags[key];
    ++t.count;
    t.bytes += r.bytes;
    t.execNs += r.execNs;
    if (r.channelsPhased > 0) {
      ++t.phased;
      t.syncNs += syncWaitNs(r);
    }
  }
  Agg& a = m.aggs[AggKey{static_cast<int>(r.func), p2p ? 1 : 0, octaveBucket(r.bytes), p2p ? 255 : r.algo,
                         p2p ? 255 : r.proto}];
  ++a.count;
  a.bytes += r.bytes;
  a.execNs += r.execNs;
  addSample(a.execUs, static_cast<double>(r.execNs) / 1e3, a.count);
  addSample(a.busBw, bus, a.count);
}

size_t Sink::roundLocked(bool force, Context* only) {
  size_t n = drainOps(only, force, [&](const CollRecord& r, Context* c) { takeRecordLocked(r, c); });
  flushLocked();
  return n;
}

void Sink::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  roundLocked(false, nullptr);
  writePromLocked();
}

void Sink::run() {
  // Near the first NIC weft offers NCCL, on cores no other thread of the process is pinned to (docs/topology.md):
  // once that NIC is known (the profiler may start this thread before the net plugin found its devices).
  bool placed = false;
  auto place = [&placed] {
    const int node = numa::homeNode();
    if (placed || node < 0) return;
    placed = true;
    std::string what;
    const bool bound = numa::bindThisThreadNear(node, &what);
    WEFT_INFO(NCCL_INIT, "timing: the record writer thread {}{}", bound ? "runs on " : "stays where it is: ", what);
  };
  place();
  std::unique_lock<std::mutex> lock(mu_);
  size_t last = 0;
  while (!stop_) {
    if (!placed) place();
    // Asleep between rounds; while records are streaming in, rounds come every few milliseconds.
    auto interval = last > 256 ? kBusyRound : kRound;
    cv_.wait_for(lock, interval, [&] { return stop_ || wakeRequested_.load(std::memory_order_acquire); });
    wakeRequested_.store(false, std::memory_order_release);
    if (stop_) break;
    last = roundLocked(false, nullptr);
    stallDumpLocked();
    uint64_t now = wallNs();
    if (!promPath_.empty() && now - lastPromNs_ >= static_cast<uint64_t>(promIntervalS_) * 1000000000ull) {
      writePromLocked();
    }
  }
}

void Sink::peerLinesLocked(const Comm& m, Context* c) {
  if (c->peers == nullptr) return;
  for (int i = 0; i < kMaxPeersPerComm; ++i) {
    const PeerStats& p = c->peers[i];
    int peer = p.peer.load();
    if (peer == -1) continue;
    writeLineLocked(fmt::format(
        R"({{"v":{},"type":"peer","host":"{}","pid":{},"comm":"{}","rank":{},"peer":{},"ops":{},"send_bytes":{},"recv_bytes":{},"send_steps":{},"recv_steps":{},"step_p50_us":{:.3f},"step_p99_us":{:.3f},"net_msgs":{},"net_bytes":{},"net_p50_us":{:.3f},"net_p99_us":{:.3f}}})",
        kRecordSchema, jsonEscape(host_), getpid(), hex(m.commHash), m.rank, peer, p.ops.load(), p.sendBytes.load(),
        p.recvBytes.load(), p.sendSteps.load(), p.recvSteps.load(), p.stepLatency.quantileNs(0.5) / 1e3,
        p.stepLatency.quantileNs(0.99) / 1e3, p.netMsgs.load(), p.netBytes.load(), p.netLatency.quantileNs(0.5) / 1e3,
        p.netLatency.quantileNs(0.99) / 1e3));
  }
}

void Sink::summaryLocked(const Comm& m, Context* c) {
  uint64_t colls = 0, p2ps = 0;
  // (func, p2p, bucket) -> everything across algo/proto
  struct Row {
    uint64_t count = 0;
    std::vector<double> execUs, busBw;
    std::map<std::pair<int, int>, uint64_t> mix;
  };
  std::map<std::tuple<int, int, int>, Row> rows;
  for (const auto& [k, a] : m.aggs) {
    auto [func, p2p, bucket, algo, proto] = k;
    (p2p ? p2ps : colls) += a.count;
    Row& r = rows[{func, p2p, bucket}];
    r.count += a.count;
    r.execUs.insert(r.execUs.end(), a.execUs.begin(), a.execUs.end());
    r.busBw.insert(r.busBw.end(), a.busBw.begin(), a.busBw.end());
    r.mix[{algo, proto}] += a.count;
  }
  WEFT_INFO(NCCL_INIT, "timing summary: comm {} \"{}\" rank {}/{} ({} nodes): {} collectives, {} p2p, {} partial, {} not recorded",
            hex(m.commHash), m.name, m.rank, m.nRanks, m.nNodes, colls, p2ps, m.partial, c->dropped.load());
  if (rows.empty()) return;
  WEFT_INFO(NCCL_INIT, "timing summary:   {:<14} {:>6} {:>8} {:>11} {:>11} {:>10}  {}", "operation", "size", "count",
            "median_us", "p99_us", "busbw_GB/s", "algorithm/protocol");
  for (const auto& [k, r] : rows) {
    auto [func, p2p, bucket] = k;
    std::string mix;
    for (const auto& [ap, n] : r.mix) {
      if (!mix.empty()) mix += ", ";
      if (ap.first == 255) mix += "p2p";
      else mix += fmt::format("{}/{}", algoName(static_cast<uint8_t>(ap.first)), protoName(static_cast<uint8_t>(ap.second)));
      mix += fmt::format(" {:.0f}%", 100.0 * static_cast<double>(n) / static_cast<double>(r.count));
    }
    WEFT_INFO(NCCL_INIT, "timing summary:   {:<14} {:>6} {:>8} {:>11.1f} {:>11.1f} {:>10.2f}  {}",
              funcName(static_cast<Func>(func)), octaveBucketLabel(bucket), r.count, quantile(r.execUs, 0.5),
              quantile(r.execUs, 0.99), quantile(r.busBw, 0.5), mix);
  }
}

void Sink::onFinalize(Context* c) {
  std::lock_guard<std::mutex> lock(mu_);
  roundLocked(true, c);
  auto it = comms_.find(c);
  if (it == comms_.end()) return;
  peerLinesLocked(it->second, c);
  writeLineLocked(fmt::format(R"({{"v":{},"type":"comm_end","host":"{}","pid":{},"comm":"{}","rank":{},"records":{},"partial":{},"dropped":{},"time_ns":{}}})",
                              kRecordSchema, jsonEscape(host_), getpid(), hex(it->second.commHash), it->second.rank,
                              it->second.records, it->second.partial, c->dropped.load(), wallNs()));
  flushLocked();
  summaryLocked(it->second, c);
  writePromLocked();  // with this communicator's final numbers; the next rewrite leaves it out
  comms_.erase(it);
}

// ---- transport connections ----------------------------------------------------------------------------------

std::vector<ConnStats::Op> ConnStats::inFlight() const {
  std::vector<Op> ops;
  for (const InFlight& f : inflight) {
    const uint64_t t = f.postNs.load(std::memory_order_acquire);
    if (t == 0) continue;
    Op op{t, f.bytes.load(std::memory_order_relaxed), f.tag.load(std::memory_order_relaxed),
          f.bufs.load(std::memory_order_relaxed)};
    std::atomic_thread_fence(std::memory_order_acquire);
    if (f.postNs.load(std::memory_order_relaxed) != t) continue;  // completed or reused while read
    ops.push_back(op);
  }
  std::sort(ops.begin(), ops.end(), [](const Op& a, const Op& b) { return a.postNs < b.postNs; });
  return ops;
}

ConnStats* registerConn(bool isSend, std::string peer, std::string device, const RailHealth* rails, int nRails,
                        const StallState* stall, std::string local) {
  Sink& s = Sink::instance();
  auto* c = new ConnStats;
  c->isSend = isSend;
  c->peer = std::move(peer);
  c->local = std::move(local);
  c->device = std::move(device);
  c->rails = nRails > 0 ? rails : nullptr;
  c->nRails = c->rails != nullptr ? nRails : 0;
  c->stall = stall;
  s.connRecord(c, false);
  return c;
}

void unregisterConn(ConnStats* c) {
  if (c == nullptr) return;
  Sink::instance().connRecord(c, true);
  delete c;
}

namespace {
// A connection's rails' downs, recoveries and failovers, added to per-device totals.
void addRailTotals(const ConnStats& c, std::map<std::string, RailTotals>* totals) {
  for (int k = 0; k < c.nRails; ++k) {
    RailTotals& t = (*totals)[c.rails[k].device];
    t.downs += c.rails[k].downs.load(std::memory_order_relaxed);
    t.recoveries += c.rails[k].recoveries.load(std::memory_order_relaxed);
    t.failovers += c.rails[k].failovers.load(std::memory_order_relaxed);
    t.readmits += c.rails[k].readmits.load(std::memory_order_relaxed);
  }
}
}  // namespace

void Sink::connRecord(ConnStats* c, bool final) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!final) {
    startLocked();
    c->id = nextConnId_++;
    conns_.push_back(c);
    return;
  }
  // A connection closing in trouble (its peer lost, or stalled now): the dump its trouble asked for, while it is
  // still listed (the writer's round may not have come since; a failed comm is often closed at once).
  if (c->stall != nullptr && (c->stall->peerLost.load(std::memory_order_relaxed) != 0 ||
                              c->stall->sinceMs.load(std::memory_order_relaxed) != 0)) {
    stallDumpLocked();
  }
  conns_.erase(std::remove(conns_.begin(), conns_.end(), c), conns_.end());
  // A multi-rail comm: each rail's state, how often it went down and came back, why it last went down, and what
  // this end sent on it.
  std::string rails;
  for (int k = 0; k < c->nRails; ++k) {
    const RailHealth& h = c->rails[k];
    rails += fmt::format(
        R"({}{{"rail":{},"device":"{}","up":{},"downs":{},"recoveries":{},"last_down":"{}","msgs":{},"bytes":{},"failovers":{},"moved":{},"readmits":{},"msgs_since_readmit":{}}})",
        k == 0 ? ",\"rails\":[" : ",", k, jsonEscape(h.device), h.up.load(std::memory_order_relaxed) != 0,
        h.downs.load(std::memory_order_relaxed), h.recoveries.load(std::memory_order_relaxed),
        railEventName(h.lastDownEvent()), h.msgs.load(std::memory_order_relaxed),
        h.bytes.load(std::memory_order_relaxed), h.failovers.load(std::memory_order_relaxed),
        h.moved.load(std::memory_order_relaxed), h.readmits.load(std::memory_order_relaxed), h.msgsSinceReadmit());
  }
  if (!rails.empty()) rails += "]";
  std::string where;
  if (c->numa >= 0) where += fmt::format(R"(,"numa":{})", c->numa);
  if (!c->gpu.empty()) {
    where += fmt::format(R"(,"gpu":"{}")", jsonEscape(c->gpu));
    if (!c->gpuPath.empty()) where += fmt::format(R"(,"gpu_path":"{}")", jsonEscape(c->gpuPath));
  }
  if (c->stall != nullptr) where += fmt::format(R"(,"stalls":{})", c->stall->stalls.load(std::memory_order_relaxed));
  addRailTotals(*c, &railsClosed_);
  writeLineLocked(fmt::format(
      R"({{"v":{},"type":"conn","host":"{}","pid":{},"conn":{},"dir":"{}","peer":"{}","device":"{}","msgs":{},"bytes":{},"lat_p50_us":{:.3f},"lat_p99_us":{:.3f}{}{},"time_ns":{}}})",
      kRecordSchema, jsonEscape(host_), getpid(), c->id, c->isSend ? "send" : "recv", jsonEscape(c->peer), jsonEscape(c->device),
      c->msgs.load(), c->bytes.load(), c->latency.quantileNs(0.5) / 1e3, c->latency.quantileNs(0.99) / 1e3, where,
      rails, wallNs()));
  flushLocked();
}

// ---- Prometheus textfile ------------------------------------------------------------------------------------

std::string Sink::TagLines::text() const {
  if (!any) return std::string();
  return "# HELP weft_tag_operations_total Operations completed per user tag (NCCL 2.32+: the tag of the call); the "
         "WEFT_PROM_TAGS tags that took the most time, the rest as tag=\"other\".\n"
         "# TYPE weft_tag_operations_total counter\n" + ops +
         "# HELP weft_tag_bytes_total Message bytes of those operations.\n# TYPE weft_tag_bytes_total counter\n" +
         bytes +
         "# HELP weft_tag_exec_seconds_total Execution time of those operations (GPU time where NCCL gives it).\n"
         "# TYPE weft_tag_exec_seconds_total counter\n" + exec +
         "# HELP weft_tag_sync_wait_seconds_total Time their kernels spent in the sync phases, waiting for the other "
         "ranks (operations whose kernels report phases).\n# TYPE weft_tag_sync_wait_seconds_total counter\n" + sync;
}

// The tags of one communicator: the promTags_ that took the most execution time so far get a label each, the rest
// one "other" line (so a job with thousands of tags still writes promTags_ + 1 series per communicator).
void Sink::tagLinesLocked(const Comm& m, const std::string& base, TagLines* out) const {
  if (m.tags.empty()) return;
  std::vector<std::pair<uint64_t, uint64_t>> byTime;  // (execNs, tag)
  for (const auto& [tag, t] : m.tags)
    if (tag != kOtherTag) byTime.emplace_back(t.execNs, tag);
  std::sort(byTime.begin(), byTime.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  TagAgg other;
  bool anyOther = false;
  auto fold = [&](const TagAgg& t) {
    other.count += t.count, other.bytes += t.bytes, other.execNs += t.execNs, other.syncNs += t.syncNs;
    other.phased += t.phased;
    anyOther = true;
  };
  auto emit = [&](const std::string& label, const TagAgg& t) {
    std::string l = fmt::format("{},tag=\"{}\"", base, promEscape(label));
    out->ops += fmt::format("weft_tag_operations_total{{{}}} {}\n", l, t.count);
    out->bytes += fmt::format("weft_tag_bytes_total{{{}}} {}\n", l, t.bytes);
    out->exec += fmt::format("weft_tag_exec_seconds_total{{{}}} {:.9f}\n", l, static_cast<double>(t.execNs) / 1e9);
    if (t.phased > 0)
      out->sync += fmt::format("weft_tag_sync_wait_seconds_total{{{}}} {:.9f}\n", l, static_cast<double>(t.syncNs) / 1e9);
  };
  for (size_t i = 0; i < byTime.size(); ++i) {
    const TagAgg& t = m.tags.at(byTime[i].second);
    if (i < promTags_) emit(tagLabel(byTime[i].second), t);
    else fold(t);
  }
  if (auto it = m.tags.find(kOtherTag); it != m.tags.end()) fold(it->second);
  if (anyOther) emit("other", other);
  out->any = true;
}

void Sink::writePromLocked() {
  if (promPath_.empty()) return;
  lastPromNs_ = wallNs();
  std::string out;
  out += "# HELP weft_collective_total Operations completed, per communicator, operation, size bucket and algorithm/protocol.\n"
         "# TYPE weft_collective_total counter\n";
  std::string bytes = "# HELP weft_collective_bytes_total Message bytes of those operations.\n# TYPE weft_collective_bytes_total counter\n";
  std::string secs = "# HELP weft_collective_exec_seconds_total Execution time of those operations (GPU time where NCCL gives it).\n# TYPE weft_collective_exec_seconds_total counter\n";
  std::string q = "# HELP weft_collective_exec_seconds Execution time quantiles.\n# TYPE weft_collective_exec_seconds gauge\n";
  std::string bw = "# HELP weft_collective_busbw_gbs Median bus bandwidth (nccl-tests definition), GB/s.\n# TYPE weft_collective_busbw_gbs gauge\n";
  std::string peers = "# HELP weft_peer_bytes_total Bytes moved by NCCL's proxy to and from each peer rank.\n# TYPE weft_peer_bytes_total counter\n";
  std::string peerLat = "# HELP weft_peer_step_latency_seconds Proxy step time quantiles per peer rank.\n# TYPE weft_peer_step_latency_seconds gauge\n";
  TagLines tagOut;
  std::string dropped = "# HELP weft_timing_not_recorded_total Operations not recorded (event pools full).\n# TYPE weft_timing_not_recorded_total counter\n";
  for (const auto& [ctx, m] : comms_) {
    std::string base = fmt::format("comm=\"{}\",comm_name=\"{}\",rank=\"{}\",nranks=\"{}\",nnodes=\"{}\"",
                                   hex(m.commHash), promEscape(m.name), m.rank, m.nRanks, m.nNodes);
    for (const auto& [k, a] : m.aggs) {
      auto [func, p2p, bucket, algo, proto] = k;
      std::string ap = p2p ? "p2p" : fmt::format("{}_{}", algoName(static_cast<uint8_t>(algo)), protoName(static_cast<uint8_t>(proto)));
      std::string l = fmt::format("{},collective=\"{}\",size=\"{}\",algo_proto=\"{}\"", base,
                                  funcName(static_cast<Func>(func)), octaveBucketLabel(bucket), ap);
      out += fmt::format("weft_collective_total{{{}}} {}\n", l, a.count);
      bytes += fmt::format("weft_collective_bytes_total{{{}}} {}\n", l, a.bytes);
      secs += fmt::format("weft_collective_exec_seconds_total{{{}}} {:.9f}\n", l, static_cast<double>(a.execNs) / 1e9);
      q += fmt::format("weft_collective_exec_seconds{{{},quantile=\"0.5\"}} {:.9f}\n", l, quantile(a.execUs, 0.5) / 1e6);
      q += fmt::format("weft_collective_exec_seconds{{{},quantile=\"0.99\"}} {:.9f}\n", l, quantile(a.execUs, 0.99) / 1e6);
      bw += fmt::format("weft_collective_busbw_gbs{{{}}} {:.4f}\n", l, quantile(a.busBw, 0.5));
    }
    if (ctx->peers != nullptr) {
      for (int i = 0; i < kMaxPeersPerComm; ++i) {
        const PeerStats& p = ctx->peers[i];
        int peer = p.peer.load();
        if (peer == -1) continue;
        std::string l = fmt::format("{},peer=\"{}\"", base, peer == -2 ? std::string("other") : std::to_string(peer));
        peers += fmt::format("weft_peer_bytes_total{{{},direction=\"send\"}} {}\n", l, p.sendBytes.load());
        peers += fmt::format("weft_peer_bytes_total{{{},direction=\"recv\"}} {}\n", l, p.recvBytes.load());
        if (p.stepLatency.count() > 0) {
          peerLat += fmt::format("weft_peer_step_latency_seconds{{{},quantile=\"0.5\"}} {:.9f}\n", l, p.stepLatency.quantileNs(0.5) / 1e9);
          peerLat += fmt::format("weft_peer_step_latency_seconds{{{},quantile=\"0.99\"}} {:.9f}\n", l, p.stepLatency.quantileNs(0.99) / 1e9);
        }
      }
    }
    dropped += fmt::format("weft_timing_not_recorded_total{{{}}} {}\n", base, ctx->dropped.load());
    tagLinesLocked(m, base, &tagOut);
  }
  std::string conns = "# HELP weft_conn_bytes_total Bytes through each weft connection.\n# TYPE weft_conn_bytes_total counter\n";
  std::string connLat = "# HELP weft_conn_latency_seconds Post-to-completion time quantiles per weft connection.\n# TYPE weft_conn_latency_seconds gauge\n";
  std::string railUp = "# HELP weft_conn_rail_up Whether a rail (NIC) of a multi-rail weft connection is up (1) or seen down (0).\n# TYPE weft_conn_rail_up gauge\n";
  std::string railDowns = "# HELP weft_conn_rail_down_total Times a rail of a weft connection went down (why: its connection record, and the log).\n# TYPE weft_conn_rail_down_total counter\n";
  std::string railRec = "# HELP weft_conn_rail_recoveries_total Times a rail of a weft connection came back up.\n# TYPE weft_conn_rail_recoveries_total counter\n";
  std::string railBytes = "# HELP weft_conn_rail_bytes_total Bytes a weft connection sent on each rail.\n# TYPE weft_conn_rail_bytes_total counter\n";
  std::string railFo = "# HELP weft_conn_rail_failovers_total Times a weft connection moved its traffic off a rail (WEFT_RAIL_FAILOVER).\n# TYPE weft_conn_rail_failovers_total counter\n";
  std::string railMoved = "# HELP weft_conn_rail_moved_total Messages a weft connection moved off a failed rail (sent again, or posted again, elsewhere).\n# TYPE weft_conn_rail_moved_total counter\n";
  std::string railRe = "# HELP weft_conn_rail_readmits_total Times a weft connection took a failed-over rail back (WEFT_RAIL_READMIT).\n# TYPE weft_conn_rail_readmits_total counter\n";
  std::string stalls = "# HELP weft_conn_stalls_total Stalls a weft connection reported: requests outstanding with nothing moving for WEFT_STALL_S (docs/hangs.md).\n# TYPE weft_conn_stalls_total counter\n";
  std::string stalled = "# HELP weft_conn_stalled_seconds How long a weft connection has been stalled now (0: not stalled).\n# TYPE weft_conn_stalled_seconds gauge\n";
  std::string inflight = "# HELP weft_conn_inflight Operations a weft connection has in flight now (posted, not yet complete).\n# TYPE weft_conn_inflight gauge\n";
  std::string oldest = "# HELP weft_conn_oldest_op_seconds Age of the oldest operation a weft connection has in flight (0: none).\n# TYPE weft_conn_oldest_op_seconds gauge\n";
  bool anyStall = false;
  const int64_t nowMs = coarseNowMs();
  const uint64_t nowNs = monoNowNs();
  bool anyRails = false;
  for (ConnStats* c : conns_) {
    std::string l = fmt::format("conn=\"{}\",dir=\"{}\",peer=\"{}\",device=\"{}\"", c->id, c->isSend ? "send" : "recv",
                                promEscape(c->peer), promEscape(c->device));
    conns += fmt::format("weft_conn_bytes_total{{{}}} {}\n", l, c->bytes.load());
    {
      const std::vector<ConnStats::Op> ops = c->inFlight();
      inflight += fmt::format("weft_conn_inflight{{{}}} {}\n", l, ops.size());
      oldest += fmt::format("weft_conn_oldest_op_seconds{{{}}} {:.3f}\n", l,
                            ops.empty() ? 0.0 : ageS(nowNs, ops.front().postNs));
    }
    if (c->latency.count() > 0) {
      connLat += fmt::format("weft_conn_latency_seconds{{{},quantile=\"0.5\"}} {:.9f}\n", l, c->latency.quantileNs(0.5) / 1e9);
      connLat += fmt::format("weft_conn_latency_seconds{{{},quantile=\"0.99\"}} {:.9f}\n", l, c->latency.quantileNs(0.99) / 1e9);
    }
    if (c->stall != nullptr) {
      const int64_t since = c->stall->sinceMs.load(std::memory_order_relaxed);
      stalls += fmt::format("weft_conn_stalls_total{{{}}} {}\n", l, c->stall->stalls.load(std::memory_order_relaxed));
      stalled += fmt::format("weft_conn_stalled_seconds{{{}}} {:.3f}\n", l,
                             since > 0 ? static_cast<double>(std::max<int64_t>(nowMs - since, 0)) / 1e3 : 0.0);
      anyStall = true;
    }
    for (int k = 0; k < c->nRails; ++k) {
      const RailHealth& h = c->rails[k];
      std::string rl = fmt::format("{},rail=\"{}\",rail_device=\"{}\"", l, k, promEscape(h.device));
      railUp += fmt::format("weft_conn_rail_up{{{}}} {}\n", rl, h.up.load(std::memory_order_relaxed) != 0 ? 1 : 0);
      railDowns += fmt::format("weft_conn_rail_down_total{{{}}} {}\n", rl, h.downs.load(std::memory_order_relaxed));
      railRec += fmt::format("weft_conn_rail_recoveries_total{{{}}} {}\n", rl, h.recoveries.load(std::memory_order_relaxed));
      railBytes += fmt::format("weft_conn_rail_bytes_total{{{}}} {}\n", rl, h.bytes.load(std::memory_order_relaxed));
      railFo += fmt::format("weft_conn_rail_failovers_total{{{}}} {}\n", rl, h.failovers.load(std::memory_order_relaxed));
      railMoved += fmt::format("weft_conn_rail_moved_total{{{}}} {}\n", rl, h.moved.load(std::memory_order_relaxed));
      railRe += fmt::format("weft_conn_rail_readmits_total{{{}}} {}\n", rl, h.readmits.load(std::memory_order_relaxed));
      anyRails = true;
    }
  }
  if (anyRails) connLat += railUp + railDowns + railRec + railBytes + railFo + railMoved + railRe;
  if (anyStall) connLat += stalls + stalled;
  if (!conns_.empty()) connLat += inflight + oldest;
  // The device API's comms (docs/hangs.md): per comm, operations in flight, the oldest's age and stalls; per peer
  // that something waits on or that stalled, the same (an idle peer has no series: a comm has thousands).
  if (!ledgers_.empty()) {
    std::string rIn = "# HELP weft_rma_inflight Device-API operations in flight on a comm (or to one peer rank).\n# TYPE weft_rma_inflight gauge\n";
    std::string rOld = "# HELP weft_rma_oldest_op_seconds Age of the oldest device-API operation in flight (0: none).\n# TYPE weft_rma_oldest_op_seconds gauge\n";
    std::string rSt = "# HELP weft_rma_stalls_total Stalls a device-API comm reported (WEFT_STALL_S), per comm or peer rank.\n# TYPE weft_rma_stalls_total counter\n";
    std::string rNow = "# HELP weft_rma_stalled_seconds How long a device-API peer has been stalled now (0: not stalled).\n# TYPE weft_rma_stalled_seconds gauge\n";
    for (const auto& [id, src] : ledgers_) {
      std::vector<PeerLedger> peers;
      if (!src.read || !src.read(&peers)) continue;
      const std::string l =
          fmt::format("comm=\"{}\",rank=\"{}\",nranks=\"{}\",device=\"{}\"", id, src.rank, src.nranks, promEscape(src.device));
      uint64_t n = 0, st = 0;
      int64_t oldestMs = 0;
      for (const PeerLedger& p : peers) {
        n += p.inflight;
        st += p.stalls;
        const int64_t po = p.ops.empty() ? 0 : p.ops.front().postMs;
        if (po > 0 && (oldestMs == 0 || po < oldestMs)) oldestMs = po;
        if (p.inflight == 0 && p.stalls == 0 && p.stalledSinceMs == 0) continue;
        const std::string pl = fmt::format("{},peer_rank=\"{}\"", l, p.rank);
        rIn += fmt::format("weft_rma_inflight{{{}}} {}\n", pl, p.inflight);
        rOld += fmt::format("weft_rma_oldest_op_seconds{{{}}} {:.3f}\n", pl,
                            po > 0 ? static_cast<double>(std::max<int64_t>(nowMs - po, 0)) / 1e3 : 0.0);
        rSt += fmt::format("weft_rma_stalls_total{{{}}} {}\n", pl, p.stalls);
        rNow += fmt::format("weft_rma_stalled_seconds{{{}}} {:.3f}\n", pl,
                            p.stalledSinceMs > 0 ? static_cast<double>(std::max<int64_t>(nowMs - p.stalledSinceMs, 0)) / 1e3 : 0.0);
      }
      rIn += fmt::format("weft_rma_inflight{{{}}} {}\n", l, n);
      rOld += fmt::format("weft_rma_oldest_op_seconds{{{}}} {:.3f}\n", l,
                          oldestMs > 0 ? static_cast<double>(std::max<int64_t>(nowMs - oldestMs, 0)) / 1e3 : 0.0);
      rSt += fmt::format("weft_rma_stalls_total{{{}}} {}\n", l, st);
    }
    connLat += rIn + rOld + rSt + rNow;
  }
  // Per NIC, every connection of this process together, closed ones included: what an alert watches.
  std::map<std::string, RailTotals> railTotals = railsClosed_;
  for (ConnStats* c : conns_) addRailTotals(*c, &railTotals);
  if (!railTotals.empty()) {
    static constexpr struct {
      const char* name;
      const char* help;
      uint64_t RailTotals::*field;
    } kTotals[] = {
        {"weft_rail_down_total", "Times a connection saw this NIC (rail) go down, every connection of the process.",
         &RailTotals::downs},
        {"weft_rail_recoveries_total", "Times a connection saw this NIC (rail) come back up.", &RailTotals::recoveries},
        {"weft_rail_failovers_total",
         "Times a connection moved its traffic off this NIC (rail), every connection of the process.",
         &RailTotals::failovers},
        {"weft_rail_readmits_total",
         "Times a connection took this NIC (rail) back after a failover, every connection of the process.",
         &RailTotals::readmits},
    };
    for (const auto& m : kTotals) {
      connLat += fmt::format("# HELP {} {}\n# TYPE {} counter\n", m.name, m.help, m.name);
      for (const auto& [dev, t] : railTotals) {
        connLat += fmt::format("{}{{device=\"{}\"}} {}\n", m.name, promEscape(dev), t.*m.field);
      }
    }
  }
  // What NCCL (or a profiler driver) sent that could not be right: counted, never fatal.
  const Anomalies an = anomalies();
  std::string bad = "# HELP weft_timing_anomalies_total Profiler calls weft ignored, by kind (bad handles, double "
                    "stops, NULL contexts, PXN parents of another process, unknown event types, records left to the "
                    "writer's scan).\n# TYPE weft_timing_anomalies_total counter\n";
  for (auto [kind, n] : {std::pair<const char*, uint64_t>{"bad_handle", an.badHandles}, {"double_stop", an.doubleStops},
                         {"null_context", an.nullContexts}, {"foreign_parent", an.foreignParents},
                         {"unknown_type", an.unknownTypes}, {"ring_full", an.ringFull}})
    bad += fmt::format("weft_timing_anomalies_total{{kind=\"{}\"}} {}\n", kind, n);
  out += bytes + secs + q + bw + peers + peerLat + dropped + tagOut.text() + conns + connLat + bad;
  std::string tmp = promPath_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    static bool warned = false;
    if (!warned) WEFT_WARN("timing: cannot write {}: {}", tmp, std::strerror(errno));
    warned = true;
    return;
  }
  std::fwrite(out.data(), 1, out.size(), f);
  std::fclose(f);
  if (std::rename(tmp.c_str(), promPath_.c_str()) != 0) WEFT_WARN("timing: cannot rename {} to {}: {}", tmp, promPath_, std::strerror(errno));
}

}  // namespace weft::telemetry
