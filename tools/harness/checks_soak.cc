// SPDX-License-Identifier: Apache-2.0
// The soak, the differential stream, and the net plugin's profiler events.
#include "checks_internal.h"

namespace weft::harness::checks {

// ---- profiler events of the net plugin (v10+) ----------------------------------------------------------------

// From table v10 NCCL hands isend and irecv a profiler handle per step (src/transport/net.cc v2.28.9: line 1319
// for sends, the phandles of line 1482 for receives), through which the plugin reports its own events.
void profilerNetEvents(CheckEnv& env) {
  if (env.net.version() < 10) throw CheckSkip("net-plugin profiler events exist from table v10 (NCCL 2.26)");
  resetNetEventStats();
  Conn c = establish(env);
  StreamSpec s;
  s.sizes = {0, 8, 4096, 65536, 1 << 20};
  s.inflight = 4;
  s.slotSize = 1 << 20;
  s.recvSize = 1 << 20;
  s.seed = 31;
  stream(env, c, s);
  closeConn(env, c);
  NetEventStats st = netEventStats();
  if (st.nullPhandleStarts != 0)
    fail(std::to_string(st.nullPhandleStarts) + " event starts with a NULL pHandle (NCCL dereferences it)");
  if (st.badStops != 0) fail(std::to_string(st.badStops) + " stops of events never started or already stopped");
  if (st.open != 0) fail(std::to_string(st.open) + " events started and never stopped");
  const char* timing = std::getenv("WEFT_TIMING");
  if (env.isWeft && timing != nullptr && std::string(timing) == "net") {
    if (st.started == 0) fail("WEFT_TIMING=net, yet weft opened no net-plugin events");
    if (st.weftBytes == 0) fail("weft's event descriptors carry no lengths");
  }
}

// ---- soak ------------------------------------------------------------------------------------------------------

// 16 connections progressed round-robin from one thread (as NCCL's proxy does), each a stream of groups: a
// grouped receive of 1..maxRecvs buffers matched by as many sends with distinct tags, posted in a shuffled order,
// sizes log-uniform from 0 to 128 KiB, up to 4 groups in flight per connection. Every byte of every message is
// checked. Both processes derive the same groups from a per-connection seed.
struct SoakGroup {
  std::vector<size_t> sizes;
  std::vector<int> tags, order;
};

SoakGroup soakGroup(uint64_t seed, int maxRecvs) {
  std::mt19937_64 rng(seed);
  SoakGroup g;
  int n = 1 + static_cast<int>(rng() % static_cast<uint64_t>(maxRecvs));
  for (int k = 0; k < n; ++k) {
    double l = std::uniform_real_distribution<double>(0.0, 17.0)(rng);  // 2^0 .. 2^17 bytes
    size_t sz = rng() % 50 == 0 ? 0 : static_cast<size_t>(std::pow(2.0, l)) - 1;
    g.sizes.push_back(std::min<size_t>(sz, 128 << 10));
    g.tags.push_back(static_cast<int>(1 + k * 7 + (rng() % 5) * 100));
    g.order.push_back(k);
  }
  std::shuffle(g.order.begin(), g.order.end(), rng);
  return g;
}

class SoakConn {
 public:
  static constexpr int kWindow = 4;
  static constexpr size_t kSlot = 128 << 10;
  // trace (receiver): record what each grouped receive observed there instead of judging it (diff.stream).
  SoakConn(CheckEnv& env, Conn& c, int id, int maxRecvs, int64_t groups, std::vector<std::string>* trace = nullptr)
      : env_(env), c_(c), id_(id), maxRecvs_(maxRecvs), groups_(groups), buf_(kSlot * maxRecvs * kWindow, env.mem),
        reg_(env, c.comm(), buf_), trace_(trace) {}
  uint64_t messages = 0, bytes = 0;
  bool done() const { return next_ == groups_ && inflight_.empty(); }

  void step() {
    // post: a new group while the window allows; a sender also finishes posting a group the provider pushed back on
    bool room = next_ < groups_ && static_cast<int>(inflight_.size()) < kWindow;
    if (env_.recv()) {
      if (room) postRecv();
    } else {
      bool partial = !inflight_.empty() && inflight_.back().posted < inflight_.back().g.sizes.size();
      if (room || partial) postSends();
    }
    // test the oldest group
    if (inflight_.empty()) return;
    Pending& p = inflight_.front();
    if (p.reqs.empty() || (!env_.recv() && p.posted < p.g.sizes.size())) return;
    int n = static_cast<int>(p.g.sizes.size());
    while (p.tested < p.reqs.size()) {
      int sizes[NCCL_PROXY_MAX_SUBS] = {};
      int d = 0;
      expectOk(env_.net.test(p.reqs[p.tested], &d, sizes), "test");
      if (!d) return;
      if (env_.recv() && trace_ != nullptr) {
        record(p, sizes);
        messages += static_cast<uint64_t>(n);
      } else if (env_.recv()) {
        for (int k = 0; k < n; ++k) {
          if (static_cast<size_t>(sizes[k]) != p.g.sizes[k])
            fail(where(p.index, k) + " reported " + std::to_string(sizes[k]) + " bytes, sent " + std::to_string(p.g.sizes[k]));
          size_t bad = buf_.mismatch(slotOffset(p.index, k), p.g.sizes[k], patternSeed(p.index, k));
          if (bad != SIZE_MAX) fail(where(p.index, k) + " (" + fmtSize(p.g.sizes[k]) + ") corrupted at byte " + std::to_string(bad));
          ++messages;
          bytes += p.g.sizes[k];
        }
      } else {
        ++messages;
        bytes += p.g.sizes[p.g.order[p.tested]];
      }
      ++p.tested;
    }
    inflight_.pop_front();
  }

 private:
  struct Pending {
    int64_t index;
    SoakGroup g;
    std::vector<void*> reqs;
    size_t posted = 0, tested = 0;
  };
  uint64_t patternSeed(int64_t g, int k) const { return (static_cast<uint64_t>(id_) << 48) ^ (static_cast<uint64_t>(g) << 8) ^ k; }
  // The sizes reported, and a digest of each buffer up to 64 bytes past its message (receive buffers start filled
  // with 0xEE in this mode, so bytes a transport writes past a message show).
  void record(const Pending& p, const int* sizes) {
    std::string line = "conn " + std::to_string(id_) + " group " + std::to_string(p.index) + " sizes";
    for (size_t k = 0; k < p.g.sizes.size(); ++k) line += " " + std::to_string(sizes[k]);
    line += " digests";
    std::string bytes;
    for (size_t k = 0; k < p.g.sizes.size(); ++k) {
      bytes.resize(std::min(kSlot, p.g.sizes[k] + 64));
      buf_.read(slotOffset(p.index, static_cast<int>(k)), bytes.size(), bytes.data());
      const uint64_t h = fnv1a64(bytes);
      char hex[20];
      std::snprintf(hex, sizeof(hex), " %016llx", static_cast<unsigned long long>(h));
      line += hex;
    }
    trace_->push_back(line);
  }
  size_t slotOffset(int64_t g, int k) const { return ((g % kWindow) * maxRecvs_ + k) * kSlot; }
  uint8_t* slot(int64_t g, int k) { return buf_.data() + slotOffset(g, k); }
  std::string where(int64_t g, int k) const {
    return "connection " + std::to_string(id_) + " group " + std::to_string(g) + " buffer " + std::to_string(k);
  }
  void postRecv() {
    SoakGroup g = soakGroup(seed(next_), maxRecvs_);
    int n = static_cast<int>(g.sizes.size());
    std::vector<void*> data(n), mhs(n, reg_.mh());
    std::vector<size_t> want(n, kSlot);
    for (int k = 0; k < n; ++k) {
      data[k] = slot(next_, k);
      if (trace_ != nullptr) buf_.set(slotOffset(next_, k), kSlot, 0xEE);
    }
    void* req = nullptr;
    expectOk(env_.net.irecv(c_.recvComm, n, data.data(), want.data(), g.tags.data(), mhs.data(), &req), "irecv");
    if (req == nullptr) return;  // back-pressure: again next time
    Pending p{next_, std::move(g), {req}, 1, 0};
    inflight_.push_back(std::move(p));
    ++next_;
  }
  void postSends() {
    bool partial = !inflight_.empty() && inflight_.back().posted < inflight_.back().g.sizes.size();
    if (!partial) {
      if (next_ >= groups_ || static_cast<int>(inflight_.size()) >= kWindow) return;
      Pending p{next_, soakGroup(seed(next_), maxRecvs_), {}, 0, 0};
      p.reqs.assign(p.g.sizes.size(), nullptr);
      for (size_t k = 0; k < p.g.sizes.size(); ++k)
        buf_.fill(slotOffset(next_, static_cast<int>(k)), p.g.sizes[k], patternSeed(next_, static_cast<int>(k)));
      inflight_.push_back(std::move(p));
      ++next_;
    }
    Pending& p = inflight_.back();
    while (p.posted < p.g.sizes.size()) {
      int k = p.g.order[p.posted];
      void* req = nullptr;
      expectOk(env_.net.isend(c_.sendComm, slot(p.index, k), p.g.sizes[k], p.g.tags[k], reg_.mh(), &req), "isend");
      if (req == nullptr) return;
      p.reqs[p.posted++] = req;
    }
  }
  uint64_t seed(int64_t g) const { return 0x50a50a50ull * (id_ + 1) + static_cast<uint64_t>(g) * 1000003ull; }

  CheckEnv& env_;
  Conn& c_;
  int id_, maxRecvs_;
  int64_t groups_, next_ = 0;
  Buffer buf_;
  Registration reg_;
  std::vector<std::string>* trace_;
  std::deque<Pending> inflight_;
};

// Drives connections round-robin from one thread, as NCCL's proxy does, until every one is done; bounded by
// progress (a long soak may run for hours, but never sits still). Returns the messages completed.
uint64_t driveAll(CheckEnv& env, std::vector<std::unique_ptr<SoakConn>>& s) {
  auto lastProgress = std::chrono::steady_clock::now();
  uint64_t lastCount = 0;
  for (uint64_t it = 0;; ++it) {
    bool all = true;
    uint64_t count = 0;
    for (auto& c : s) {
      if (!c->done()) c->step();
      all = all && c->done();
      count += c->messages;
    }
    if (all) return count;
    if (count != lastCount) {
      lastCount = count;
      lastProgress = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - lastProgress > env.timeout) {
      fail("no message completed for " + std::to_string(env.timeout.count()) + " s (" + std::to_string(count) + " done)");
    }
    if (it % 4096 == 0) checkPeer(env);
  }
}

// NCCL groups the receives of sub-connections that share a receive comm into one irecv of up to maxRecvs buffers
// (src/transport/net.cc v2.28.9, recvProxyProgress lines 1374-1392 and the irecv of line 1482), each buffer tagged
// with its sender's rank (line 1468), larger than what is sent into it (line 1467 caps it at the op's bytes).
void soakRandom(CheckEnv& env) {
  int maxRecvs = std::max(1, std::min(agreedMaxRecvs(env), 8));
  // 16 connections (4 with --quick, to keep the quick runs short)
  const int kConns = env.quick && env.soakMessages == 0 ? 4 : 16;
  int64_t target = env.soakMessages > 0 ? env.soakMessages : (env.quick ? 2000 : 20000);
  // groups average (maxRecvs + 1) / 2 messages
  int64_t groupsPerConn = std::max<int64_t>(1, target * 2 / ((maxRecvs + 1) * kConns));
  std::vector<Conn> conns;
  for (int i = 0; i < kConns; ++i) conns.push_back(establish(env, "soak" + std::to_string(i)));
  uint64_t messages = 0, bytes = 0;
  auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::unique_ptr<SoakConn>> s;
    for (int i = 0; i < kConns; ++i) s.push_back(std::make_unique<SoakConn>(env, conns[i], i, maxRecvs, groupsPerConn));
    driveAll(env, s);
    for (auto& c : s) messages += c->messages, bytes += c->bytes;
  }
  for (auto& c : conns) closeConn(env, c);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("INFO\tsoak: %llu messages (%s) %s over %d connections in %.1f s, grouped receives of up to %d\n",
              static_cast<unsigned long long>(messages), fmtSize(bytes).c_str(), env.recv() ? "received and checked" : "sent",
              kConns, secs, maxRecvs);
}

// ---- differential stream ----------------------------------------------------------------------------------------

// The soak's seeded groups on 8 interleaved connections (4 with --quick), recording what NCCL leaves to the
// transport instead of asserting it: per completed grouped receive, the sizes reported and a digest of each buffer
// up to 64 bytes past the message (receive buffers start filled with 0xEE, so bytes a transport writes past a
// message show). Both processes derive the same groups (soakGroup). With --trace-dir each role writes what it saw,
// in connection and group order; `weft diff` runs two plugin files through it and compares. The check itself
// fails only on errors and stalls: judging the observations is the comparison's job (soak.random asserts them).
void diffStream(CheckEnv& env) {
  int maxRecvs = std::max(1, std::min(agreedMaxRecvs(env), 8));
  if (env.maxRecvs > 0) maxRecvs = std::min(maxRecvs, env.maxRecvs);
  const int kConns = env.quick ? 4 : 8;
  const int64_t groups = env.soakMessages > 0 ? std::max<int64_t>(1, env.soakMessages / kConns) : (env.quick ? 100 : 400);
  std::vector<Conn> conns;
  for (int i = 0; i < kConns; ++i) conns.push_back(establish(env, "diff" + std::to_string(i)));
  std::vector<std::vector<std::string>> traces(kConns);
  {
    std::vector<std::unique_ptr<SoakConn>> d;
    for (int i = 0; i < kConns; ++i) {
      d.push_back(std::make_unique<SoakConn>(env, conns[i], i, maxRecvs, groups, &traces[i]));
    }
    driveAll(env, d);
  }
  std::vector<std::string> all;
  for (auto& t : traces) all.insert(all.end(), t.begin(), t.end());
  for (auto& c : conns) closeConn(env, c);
  if (env.recv()) {
    std::printf("INFO\tdiff.stream: %zu grouped receives over %d connections, up to %d buffers each\n", all.size(),
                kConns, maxRecvs);
  }
  if (!env.traceDir.empty() && env.recv()) {
    const std::string path = env.traceDir + "/recv.trace";
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) fail("cannot write " + path);
    std::fprintf(f, "# diff.stream: %d connections x %lld groups, up to %d buffers per receive\n", kConns,
                 static_cast<long long>(groups), maxRecvs);
    for (const auto& l : all) std::fprintf(f, "%s\n", l.c_str());
    std::fclose(f);
  }
}

}  // namespace weft::harness::checks
