// SPDX-License-Identifier: Apache-2.0
#include "bench.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <sstream>

#include "args.h"
#include "check_support.h"
#include "checks.h"
#include "raw_fabric.h"
#include "weft/common/params.h"

namespace weft::harness {
namespace {

using Clock = std::chrono::steady_clock;

double usSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// A plugin connection pair (one send comm and one receive comm to the same peer) seen as a Link.
class PluginLink final : public Link {
 public:
  PluginLink(CheckEnv& env, Conn out, Conn in) : env_(env), out_(out), in_(in) {}
  ~PluginLink() override {
    try {
      closeConn(env_, out_);
      closeConn(env_, in_);
    } catch (const std::exception& e) {
      std::printf("ERROR\t%s\n", e.what());
    }
  }
  void* reg(void* buf, size_t size, bool forSend) override {
    void* mh = nullptr;
    expectOk(env_.net.regMr(forSend ? out_.sendComm : in_.recvComm, buf, size, NCCL_PTR_HOST, &mh), "regMr");
    return mh;
  }
  void dereg(void* mh, bool forSend) override {
    expectOk(env_.net.deregMr(forSend ? out_.sendComm : in_.recvComm, mh), "deregMr");
  }
  void* postSend(void* data, size_t size, void* mh) override {
    void* req = nullptr;
    expectOk(env_.net.isend(out_.sendComm, data, size, 0, mh, &req), "isend");
    return req;
  }
  void* postRecv(void* data, size_t size, void* mh) override {
    void* req = nullptr;
    int tag = 0;
    expectOk(env_.net.irecv(in_.recvComm, 1, &data, &size, &tag, &mh, &req), "irecv");
    return req;
  }
  bool test(void* req, int* size) override {
    int done = 0, sizes[NCCL_PROXY_MAX_SUBS] = {};
    expectOk(env_.net.test(req, &done, sizes), "test");
    *size = sizes[0];
    return done != 0;
  }

 private:
  CheckEnv& env_;
  Conn out_, in_;
};

// `count` bidirectional plugin links: two connections each (one per direction), set up the way NCCL's proxy
// polls connect and accept.
std::vector<std::unique_ptr<Link>> openPluginLinks(CheckEnv& env, int count) {
  std::vector<std::unique_ptr<Link>> links;
  const bool first = env.recv();
  for (int i = 0; i < count; ++i) {
    Conn fwd = establish(env, "fwd" + std::to_string(i));
    env.role = env.recv() ? Role::kSend : Role::kRecv;
    Conn bwd = establish(env, "bwd" + std::to_string(i));
    env.role = env.recv() ? Role::kSend : Role::kRecv;
    // The first rank receives on fwd and sends on bwd (where it connected); the other the opposite.
    links.push_back(first ? std::make_unique<PluginLink>(env, bwd, fwd) : std::make_unique<PluginLink>(env, fwd, bwd));
  }
  return links;
}

// Buffers for one link and direction, registered for as long as they live.
class Slots {
 public:
  Slots(Link& l, size_t slotSize, int slots, bool forSend)
      : link_(l), buf_(slotSize * slots), size_(slotSize), forSend_(forSend) {
    mh_ = l.reg(buf_.data(), buf_.size(), forSend);
  }
  ~Slots() { link_.dereg(mh_, forSend_); }
  uint8_t* slot(int k) const { return buf_.data() + static_cast<size_t>(k) * size_; }
  void* mh() const { return mh_; }

 private:
  Link& link_;
  Buffer buf_;
  size_t size_;
  bool forSend_;
  void* mh_;
};

template <typename F>
void* retry(F post, const char* what) {
  Deadline d(std::chrono::seconds(60));
  for (;;) {
    if (void* r = post(); r != nullptr) return r;
    if (d.expired()) fail(std::string(what) + " was refused (NULL request) for 60 s");
  }
}

int spin(Link& l, void* req) {
  int size = 0;
  Deadline d(std::chrono::seconds(60));
  while (!l.test(req, &size)) {
    if (d.expired()) fail("a request did not complete within 60 s");
  }
  return size;
}

struct LatResult {
  double median = 0, p99 = 0;
};

// Ping-pong: the first rank sends and waits for the echo; half the round trip, receives pre-posted as NCCL's
// proxy posts them.
LatResult latency(CheckEnv& env, Link& l, size_t size, int iters) {
  const size_t cap = std::max<size_t>(size, 1);
  Slots s(l, cap, 1, true), r(l, cap, 1, false);
  fillPattern(s.slot(0), size, size);
  const int warmup = std::max(10, iters / 10);
  std::vector<double> half;
  half.reserve(iters);
  env.oob.barrier("lat");
  for (int i = 0; i < warmup + iters; ++i) {
    void* rr = retry([&] { return l.postRecv(r.slot(0), size, r.mh()); }, "irecv");
    if (env.recv()) {
      auto t0 = Clock::now();
      spin(l, retry([&] { return l.postSend(s.slot(0), size, s.mh()); }, "isend"));
      int got = spin(l, rr);
      double us = usSince(t0);
      if (static_cast<size_t>(got) != size) fail("echo of " + std::to_string(size) + " B came back as " + std::to_string(got));
      if (i >= warmup) half.push_back(us / 2);
    } else {
      spin(l, rr);
      spin(l, retry([&] { return l.postSend(s.slot(0), size, s.mh()); }, "isend"));
    }
  }
  if (env.recv() && findMismatch(r.slot(0), size, size) != SIZE_MAX) fail("latency echo corrupted");
  LatResult out;
  if (!half.empty()) {
    std::sort(half.begin(), half.end());
    out.median = half[half.size() / 2];
    out.p99 = half[std::min(half.size() - 1, half.size() * 99 / 100)];
  }
  return out;
}

// Streams `count` messages of `size` on every link, 8 in flight per link and direction, all links progressed
// round-robin from one thread (NCCL's proxy: one test per pending operation per pass). One-way: the second rank
// sends, the first receives. Bidirectional: both send and receive on every link at once (a ring's step pattern).
// Returns the first rank's received Gb/s over all links; contents verified after the timed window.
double stream(CheckEnv& env, std::vector<Link*>& links, size_t size, int count, bool bidirectional) {
  constexpr int kInflight = 8;
  struct Dir {
    Link* link;
    bool send;
    std::unique_ptr<Slots> slots;
    std::deque<void*> q;
    int posted = 0, done = 0;
  };
  std::vector<Dir> dirs;
  for (Link* l : links) {
    if (bidirectional || !env.recv()) dirs.push_back({l, true, nullptr, {}, 0, 0});
    if (bidirectional || env.recv()) dirs.push_back({l, false, nullptr, {}, 0, 0});
  }
  for (auto& d : dirs) {
    d.slots = std::make_unique<Slots>(*d.link, size, kInflight, d.send);
    if (d.send) {
      for (int k = 0; k < kInflight; ++k) fillPattern(d.slots->slot(k), size, 7000 + k);
    }
  }
  env.oob.barrier("stream");
  auto t0 = Clock::now();
  Deadline deadline(std::chrono::seconds(300));
  size_t finished = 0;
  while (finished < dirs.size()) {
    for (auto& d : dirs) {
      if (d.done == count) continue;
      if (d.posted < count && static_cast<int>(d.q.size()) < kInflight) {
        uint8_t* slot = d.slots->slot(d.posted % kInflight);
        void* req = d.send ? d.link->postSend(slot, size, d.slots->mh()) : d.link->postRecv(slot, size, d.slots->mh());
        if (req != nullptr) {
          d.q.push_back(req);
          ++d.posted;
        }
      }
      int got = 0;
      if (!d.q.empty() && d.link->test(d.q.front(), &got)) {
        if (static_cast<size_t>(got) != size) fail("a " + fmtSize(size) + " message reported " + std::to_string(got) + " B");
        d.q.pop_front();
        if (++d.done == count) ++finished;
      }
    }
    if (deadline.expired()) fail("a bandwidth stream did not finish within 300 s");
  }
  double us = usSince(t0);
  size_t recvDirs = 0;
  for (auto& d : dirs) {
    if (d.send) continue;
    ++recvDirs;
    for (int k = 0; k < kInflight && k < count; ++k) {
      if (findMismatch(d.slots->slot(k), size, 7000 + k) != SIZE_MAX) fail("bandwidth stream corrupted");
    }
  }
  env.oob.barrier("stream-end");
  return static_cast<double>(size) * count * recvDirs * 8 / (us * 1e3);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int runBenchWorker(int argc, char** argv) {
  WorkerArgs wa = parseWorkerArgs(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* debug = params::foreign("NCCL_DEBUG");  // show the plugin's INFO lines as NCCL would
  setVerbose(debug != nullptr && (std::string(debug) == "INFO" || std::string(debug) == "TRACE"));
  WorkerSession session;
  std::string error;
  if (!session.open(wa, &error)) {
    std::printf("ERROR\t%s\n", error.c_str());
    return 2;
  }
  CheckEnv& env = session.env();
  const bool quick = wa.quick;
  const auto patterns = split(wa.patterns, ',');
  auto want = [&](const char* p) { return std::find(patterns.begin(), patterns.end(), p) != patterns.end(); };
  const auto rawModes = split(wa.rawModes, ',');
  auto wantRaw = [&](const std::string& m) {
    return rawModes.empty() || std::find(rawModes.begin(), rawModes.end(), m) != rawModes.end();
  };
  try {
    std::printf("INFO\t%s\t%d\n", env.props.name.c_str(), env.props.speed);
    std::vector<int> connsList = quick ? std::vector<int>{1, 8} : std::vector<int>{1, 2, 4, 8, 16};
    if (!wa.connsList.empty()) {
      connsList.clear();
      for (const auto& t : split(wa.connsList, ',')) connsList.push_back(std::stoi(t));
    }
    int maxConns = want("steps") ? 8 : 1;
    if (want("conns")) maxConns = std::max(maxConns, *std::max_element(connsList.begin(), connsList.end()));
    const int rawConns = std::min(maxConns, wa.rawMaxConns);
    // Implementations side by side: the plugin, then the raw references on the same provider.
    std::vector<std::pair<std::string, std::vector<std::unique_ptr<Link>>>> impls;
    impls.emplace_back("plugin", openPluginLinks(env, maxConns));
    if (!wa.rawProvider.empty()) {
      // Same layout as a plugin with one endpoint per comm: one endpoint per direction.
      for (RawMode m : {RawMode::kTagged, RawMode::kRma}) {
        if (!wantRaw(rawModeName(m))) continue;
        impls.emplace_back(rawModeName(m), openRawLinks(env.oob, wa.rawProvider, wa.rawIface, m, rawConns, true,
                                                        rawModeName(m)));
      }
      // For latency only, and never in the ratio: one endpoint for both directions (one queue to poll).
      if (want("lat") && wantRaw("raw-tagged-1ep")) {
        impls.emplace_back("raw-tagged-1ep",
                           openRawLinks(env.oob, wa.rawProvider, wa.rawIface, RawMode::kTagged, 1, false, "1ep"));
      }
    }
    const size_t streamImpls = impls.size() - (impls.back().first == "raw-tagged-1ep" ? 1 : 0);
    const int rounds = wa.rounds;
    // Every point runs each implementation in turn, `rounds` times, and reports the median per implementation:
    // alternating keeps slow drifts of the machine out of the ratios.
    auto report = [&](const char* pattern, size_t param, const std::vector<std::vector<double>>& a,
                      const std::vector<std::vector<double>>& b) {
      if (!env.recv()) return;
      for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].empty()) continue;  // a raw reference with fewer links than the point
        std::printf("R\t%s\t%zu\t%s\t%.3f\t%.3f\n", pattern, param, impls[i].first.c_str(), median(a[i]),
                    b.empty() ? 0.0 : median(b[i]));
      }
    };
    if (want("lat")) {
      std::vector<size_t> sizes = quick ? std::vector<size_t>{8, 65536, 1 << 20}
                                        : std::vector<size_t>{8, 64, 1024, 8192, 65536, 1 << 20};
      if (!wa.latSizes.empty()) {
        sizes.clear();
        for (const auto& t : split(wa.latSizes, ',')) sizes.push_back(std::stoull(t));
      }
      for (size_t s : sizes) {
        std::vector<std::vector<double>> med(impls.size()), p99(impls.size());
        int iters = s <= 65536 ? (quick ? 500 : 2000) : (quick ? 50 : 200);
        for (int r = 0; r < rounds; ++r) {
          for (size_t k = 0; k < impls.size(); ++k) {
            size_t i = (k + r) % impls.size();  // rotate who goes first
            LatResult lr = latency(env, *impls[i].second[0], s, iters);
            med[i].push_back(lr.median);
            p99[i].push_back(lr.p99);
          }
        }
        report("lat", s, med, p99);
      }
    }
    auto streamPoint = [&](const char* pattern, size_t param, size_t size, int nlinks, bool bidir, size_t total) {
      int count = static_cast<int>(std::max<size_t>(32, total / size / nlinks));
      std::vector<std::vector<double>> gbps(streamImpls);
      for (int r = 0; r < rounds; ++r) {
        for (size_t k = 0; k < streamImpls; ++k) {
          size_t i = (k + r) % streamImpls;  // rotate who goes first
          if (impls[i].second.size() < static_cast<size_t>(nlinks)) continue;
          std::vector<Link*> ls;
          for (int k = 0; k < nlinks; ++k) ls.push_back(impls[i].second[k].get());
          gbps[i].push_back(stream(env, ls, size, count, bidir));
        }
      }
      report(pattern, param, gbps, {});
    };
    const size_t total = quick ? (size_t{128} << 20) : (size_t{512} << 20);
    if (want("bw")) {
      std::vector<size_t> sizes = quick ? std::vector<size_t>{64 << 10, 1 << 20, 16 << 20}
                                        : std::vector<size_t>{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
      for (size_t s : sizes) streamPoint("bw", s, s, 1, false, std::max(total, 16 * s));
    }
    if (want("conns")) {
      for (int n : connsList) {
        streamPoint("conns", static_cast<size_t>(n), wa.connsSize, n, false, std::max(total, 16 * wa.connsSize));
      }
    }
    if (want("steps")) {
      std::vector<int> ns = quick ? std::vector<int>{8} : std::vector<int>{2, 8};
      for (int n : ns) streamPoint("steps", static_cast<size_t>(n), 1 << 20, n, true, total);
    }
    impls.clear();  // closes every connection
  } catch (const std::exception& e) {
    std::printf("ERROR\t%s\n", e.what());
    return 1;
  }
  return 0;
}

namespace {

struct Row {
  std::string pattern;
  size_t param;
  std::map<std::string, std::pair<double, double>> values;  // implementation -> (value, p99 for latency)
};

std::string patternTitle(const std::string& p, size_t connsSize) {
  if (p == "lat") return "ping-pong latency, half round trip in us (median; p99 in brackets), pre-posted receives";
  if (p == "bw") return "streaming bandwidth, one connection, 8 messages in flight, Gb/s";
  if (p == "conns") {
    return "parallel connections (NCCL channels), " +
           (connsSize % (1 << 20) == 0 ? std::to_string(connsSize >> 20) + " MiB"
                                       : std::to_string(connsSize) + " B") +
           " messages, 8 in flight each, Gb/s in total";
  }
  return "NCCL step pattern, both directions at once, 1 MiB slices, 8 in flight per connection, Gb/s received";
}

}  // namespace

int runBench(const BenchOptions& o) {
  std::string error;
  auto plugin = LoadedPlugin::open(o.plugin, o.version, &error);
  if (!plugin) {
    std::fprintf(stderr, "weft bench: %s\n", error.c_str());
    return 2;
  }
  int version = plugin->api().version();
  std::string name = plugin->api().name();
  plugin.reset();
  std::vector<std::string> args = {"bench-worker", "--plugin", o.plugin, "--table", std::to_string(version), "--dev",
                                   std::to_string(o.dev), "--rounds", std::to_string(o.rounds), "--patterns",
                                   o.patterns, "--call-limit", "10000"};  // timing, not conformance
  if (!o.rawProvider.empty()) {
    args.insert(args.end(), {"--raw-provider", o.rawProvider, "--raw-iface", o.rawIface});
  }
  if (!o.latSizes.empty()) args.insert(args.end(), {"--lat-sizes", o.latSizes});
  if (!o.rawModes.empty()) args.insert(args.end(), {"--raw-modes", o.rawModes});
  if (!o.connsList.empty()) args.insert(args.end(), {"--conns-list", o.connsList});
  args.insert(args.end(), {"--conns-size", std::to_string(o.connsSize)});
  args.insert(args.end(), {"--raw-max-conns", std::to_string(o.rawMaxConns)});
  if (o.quick) args.push_back("--quick");
  if (!o.fuse.empty()) args.insert(args.end(), {"--fuse", o.fuse});
  // Busy loops first, so the workers start on a host whose cores are taken; they die with this process.
  std::vector<pid_t> busy;
  for (int i = 0; i < o.busy; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (volatile uint64_t n = 0;; n = n + 1) {
      }
    }
    if (pid > 0) busy.push_back(pid);
  }
  struct BusyReaper {
    std::vector<pid_t>& pids;
    ~BusyReaper() {
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
    }
  } reaper{busy};
  WorkerProcess procs[2];
  spawnPair(o.pair, args, procs);
  std::vector<Row> rows;
  std::vector<std::string> errors, implOrder;
  std::string device;
  auto field = [](const std::string& line, int k) {
    std::stringstream ss(line);
    std::string f;
    for (int i = 0; i <= k; ++i) std::getline(ss, f, '\t');
    return f;
  };
  bool inTime = collectPair(procs, Clock::now() + std::chrono::minutes(30), [&](int i, const std::string& line) {
    if (line.rfind("R\t", 0) == 0) {
      std::string pattern = field(line, 1), impl = field(line, 3);
      size_t param = std::stoull(field(line, 2));
      if (rows.empty() || rows.back().pattern != pattern || rows.back().param != param) rows.push_back({pattern, param, {}});
      rows.back().values[impl] = {std::stod(field(line, 4)), std::stod(field(line, 5))};
      if (std::find(implOrder.begin(), implOrder.end(), impl) == implOrder.end()) implOrder.push_back(impl);
    } else if (line.rfind("ERROR\t", 0) == 0) {
      errors.push_back(std::string(i == 0 ? "[recv] " : "[send] ") + line.substr(6));
    } else if (line.rfind("INFO\t", 0) == 0 && i == 0) {
      device = line.substr(5);
    }
  });
  if (!inTime) errors.push_back("the benchmark exceeded 30 minutes and was stopped");
  for (int i = 0; i < 2; ++i) {
    if (procs[i].exited && procs[i].status != 0 && errors.empty()) errors.push_back("worker " + procs[i].describeExit());
  }
  std::string dev = field("x\t" + device, 1);
  // Ratio against the best raw reference: latency plugin/raw (lower is better), bandwidth plugin/raw.
  auto ratio = [](const Row& r) -> double {
    auto p = r.values.find("plugin");
    if (p == r.values.end()) return 0;
    double best = 0;
    for (const auto& [impl, v] : r.values) {
      if (impl != "raw-tagged" && impl != "raw-rma") continue;  // same endpoint layout as the plugin
      if (v.first <= 0) continue;
      if (best == 0 || (r.pattern == "lat" ? v.first < best : v.first > best)) best = v.first;
    }
    return best > 0 ? p->second.first / best : 0;
  };
  if (o.json) {
    std::printf("{\"plugin\":\"%s\",\"name\":\"%s\",\"table\":%d,\"device\":\"%s\",\"reference\":\"%s\",\"rounds\":%d,"
                "\"busy\":%d,\"results\":[",
                o.plugin.c_str(), name.c_str(), version, dev.c_str(), o.rawProvider.c_str(), o.rounds, o.busy);
    for (size_t k = 0; k < rows.size(); ++k) {
      const Row& r = rows[k];
      std::printf("%s{\"pattern\":\"%s\",\"%s\":%zu", k ? "," : "", r.pattern.c_str(),
                  r.pattern == "lat" || r.pattern == "bw" ? "bytes" : "connections", r.param);
      if (r.pattern == "conns") std::printf(",\"message_bytes\":%zu", o.connsSize);
      for (const auto& [impl, v] : r.values) {
        if (r.pattern == "lat") {
          std::printf(",\"%s\":{\"median_us\":%.3f,\"p99_us\":%.3f}", impl.c_str(), v.first, v.second);
        } else {
          std::printf(",\"%s\":{\"gbps\":%.3f}", impl.c_str(), v.first);
        }
      }
      std::printf(",\"ratio_to_raw\":%.3f}", ratio(r));
    }
    std::printf("],\"errors\":%zu}\n", errors.size());
  } else {
    std::printf("plugin %s ('%s', table v%d), device %s; reference: %s; median of %d rounds%s\n", o.plugin.c_str(),
                name.c_str(), version, dev.c_str(),
                o.rawProvider.empty() ? "none" : ("raw libfabric on " + o.rawProvider).c_str(), o.rounds,
                o.busy > 0 ? (", beside " + std::to_string(o.busy) + " busy loops").c_str() : "");
    std::string last;
    for (const Row& r : rows) {
      if (r.pattern != last) {
        last = r.pattern;
        std::printf("\n%s\n  %10s", patternTitle(r.pattern, o.connsSize).c_str(), r.pattern == "lat" || r.pattern == "bw" ? "size" : "conns");
        for (const auto& impl : implOrder) std::printf(" %20s", impl.c_str());
        if (implOrder.size() > 1) std::printf(" %8s", "ratio");
        std::printf("\n");
      }
      std::printf("  %10s", r.pattern == "lat" || r.pattern == "bw" ? fmtSize(r.param).c_str()
                                                                     : std::to_string(r.param).c_str());
      for (const auto& impl : implOrder) {
        auto it = r.values.find(impl);
        char cell[64] = "-";
        if (it != r.values.end()) {
          if (r.pattern == "lat") {
            std::snprintf(cell, sizeof(cell), "%.2f [%.2f]", it->second.first, it->second.second);
          } else {
            std::snprintf(cell, sizeof(cell), "%.2f", it->second.first);
          }
        }
        std::printf(" %20s", cell);
      }
      if (implOrder.size() > 1) std::printf(" %7.3fx", ratio(r));
      std::printf("\n");
    }
    if (implOrder.size() > 1) {
      std::printf("\nratio: plugin / the better of raw-tagged and raw-rma, which like the plugin use one endpoint per "
                  "direction\n(targets: latency <= 1.10, bandwidth >= 0.95); raw-tagged-1ep: one endpoint for both "
                  "directions, for reference\n");
    }
  }
  for (const auto& e : errors) std::fprintf(stderr, "weft bench: %s\n", e.c_str());
  return errors.empty() ? 0 : 1;
}

}  // namespace weft::harness
