// SPDX-License-Identifier: Apache-2.0
// weft bench --rma: put+signal round trip, put bandwidth and signal rate through any plugin file's device-API table,
// ranks forked as the conformance run forks them.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "rma_rank.h"

namespace weft::harness {
namespace rmacheck {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Figures each rank 0 reports through the shared words (as doubles).
void publish(Rank& k, int i, double v) { std::memcpy(&k.sh->words[k.rank][i], &v, sizeof(v)); }

std::string benchRank(Rank& k) {
  const int iters = 2000;
  // 1. Put+signal round trip, 8 bytes: rank 0 and rank 1 answer each other (the others wait). The slot is read
  // before the barrier: after it, rank 0's first signal may already have come.
  uint64_t seen = k.signal(kFenceSlot + 1);
  if (!k.barrier()) return "barrier";
  if (k.rank < 2 && k.nranks >= 2) {
    const int peer = 1 - k.rank;
    std::vector<double> rtt;
    for (int i = 0; i < iters + 100; ++i) {
      const auto t0 = Clock::now();
      if (k.rank == 0) {
        void* req = nullptr;
        k.api->iputSignal(k.ctx, 0, 0, k.src.mh, 8, kSlot * k.rank, k.dst.mh, peer, 8 * (kFenceSlot + 1), k.sig.mh, 1,
                          1, true, 0, &req);
        if (std::string e = k.wait(req, "put+signal"); !e.empty()) return e;
      }
      if (!k.until([&] { return k.signal(kFenceSlot + 1) > seen; }, 30)) return "no answer";
      seen = k.signal(kFenceSlot + 1);
      if (k.rank == 1) {
        void* req = nullptr;
        k.api->iputSignal(k.ctx, 0, 0, k.src.mh, 8, kSlot * k.rank, k.dst.mh, peer, 8 * (kFenceSlot + 1), k.sig.mh, 1,
                          1, true, 0, &req);
        if (std::string e = k.wait(req, "put+signal"); !e.empty()) return e;
      }
      if (i >= 100) rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    if (k.rank == 0) {
      std::sort(rtt.begin(), rtt.end());
      publish(k, 0, rtt[rtt.size() / 2] / 2);
      publish(k, 1, rtt[rtt.size() * 99 / 100] / 2);
    }
  }
  if (!k.barrier()) return "barrier";
  // 2. Bandwidth: 1 MiB puts, 32 in flight, timed from the first put to the fence that shows them all at the target.
  // pass 0: rank 0 to rank 1 alone (one direction, as weft bench's net stream); pass 1 (3+ ranks): every rank to the
  // next at once (the ring's aggregate).
  for (int pass = 0; pass < (k.nranks > 2 ? 2 : 1); ++pass) {
    if (!k.barrier()) return "barrier";
    const bool sender = pass == 1 || k.rank == 0;
    const bool target = pass == 1 || k.rank == 1;
    if (!sender && !target) continue;
    constexpr size_t kPiece = 1 << 20;
    const int total = 512;
    std::vector<void*> q;
    const auto t0 = Clock::now();
    size_t head = 0;
    for (int i = 0; i < (sender ? total : 0); ++i) {
      void* req = nullptr;
      int r = k.api->iput(k.ctx, 0, 0, k.src.mh, kPiece, kSlot * k.rank + (i % 4) * kPiece, k.dst.mh, k.next(), 0,
                          &req);
      if (r != 0) return callFailed("iput", r);
      if (q.size() < 32) {
        q.push_back(req);
      } else {
        if (std::string e = k.wait(q[head], "iput"); !e.empty()) return e;
        q[head] = req;
        head = (head + 1) % q.size();
      }
    }
    for (void* req : q) {
      if (std::string e = k.wait(req, "iput"); !e.empty()) return e;
    }
    if (sender) {
      void* req = nullptr;
      int r = k.api->iputSignal(k.ctx, 0, 0, nullptr, 0, 0, nullptr, k.next(), 8 * kFenceSlot, k.sig.mh, 1, 1, true, 0,
                                &req);
      if (r != 0) return callFailed("iputSignal(fence)", r);
      if (std::string e = k.wait(req, "fence"); !e.empty()) return e;
    }
    if (target) {
      const uint64_t want = ++k.sigExpected[kFenceSlot];
      if (!k.until([&] { return k.signal(kFenceSlot) >= want; }, 60)) return "the bandwidth fence never came";
      const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      publish(k, 2 + pass * 2, total * double(kPiece) * 8 / sec / 1e9);  // Gb/s received, as weft bench reports
    }
  }
  if (!k.barrier()) return "barrier";
  // 3. Signal rate: size-0 signals to the next rank, 128 in flight (NCCL 2.28's own IB proxy refuses a signal past
  // about that many to one peer: its queue pair's depth).
  {
    constexpr size_t kSignalsInFlight = 128;
    const int total = 100000;
    std::vector<void*> q;
    size_t head = 0;
    const auto t0 = Clock::now();
    for (int i = 0; i < total; ++i) {
      void* req = nullptr;
      int r = k.api->iputSignal(k.ctx, 0, 0, nullptr, 0, 0, nullptr, k.next(), 8 * kSumSlot, k.sig.mh, 1, 1, true,
                                (i % 16) == 15 ? 0u : 1u, &req);
      if (r != 0) return callFailed("iputSignal", r);
      if (q.size() < kSignalsInFlight) {
        q.push_back(req);
      } else {
        if (std::string e = k.wait(q[head], "signal"); !e.empty()) return e;
        q[head] = req;
        head = (head + 1) % q.size();
      }
    }
    for (void* req : q) {
      if (std::string e = k.wait(req, "signal"); !e.empty()) return e;
    }
    const uint64_t want = k.sigExpected[kSumSlot] += total;
    if (!k.until([&] { return k.signal(kSumSlot) >= want; }, 60)) return "signals missing";
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    publish(k, 3, total / sec / 1e6);  // signals a second this rank sent and its target applied
  }
  return k.barrier() ? "" : "barrier";
}

}  // namespace
}  // namespace rmacheck

using namespace rmacheck;

int runRmaBench(const RmaOptions& o) {
  std::string why;
  RmaApi* probe = RmaApi::load(o.plugin, o.symbol, o.table, &why);
  if (probe == nullptr || o.ranks < 2 || o.ranks > kMaxRanks) {
    std::fprintf(stderr, "weft bench --rma: %s\n", probe == nullptr ? why.c_str() : "--ranks wants 2 to 8");
    return 2;
  }
  std::vector<pid_t> pids;
  Shared* sh = forkRanks(o.ranks, &pids, [&](Shared* s, int r) {
    Rank k;
    k.o = &o;
    k.sh = s;
    k.rank = r;
    k.nranks = o.ranks;
    std::string w;
    k.api = RmaApi::load(o.plugin, o.symbol, o.table, &w);
    std::string e = k.api == nullptr ? w : setupConnect(k);
    if (e.empty()) e = setupRegister(k);
    if (e.empty()) e = benchRank(k);
    std::snprintf(s->verdicts[0][r].msg, sizeof(s->verdicts[0][r].msg), "%s", e.c_str());
    s->verdicts[0][r].state.store(e.empty() ? 1 : 2);
    if (!e.empty()) {
      std::fprintf(stderr, "weft bench --rma: rank %d: %s\n", r, e.c_str());
      s->dead.fetch_or(1u << r);  // the others stop waiting for it at their barriers
    }
    if (e.empty()) teardown(k);
    std::fflush(stderr);
    _exit(e.empty() ? 0 : 1);
  });
  if (sh == nullptr) return 2;
  int bad = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++bad;
  }
  auto word = [&](int r, int i) {
    double v;
    std::memcpy(&v, &sh->words[r][i], sizeof(v));
    return v;
  };
  if (bad > 0) {
    for (int r = 0; r < o.ranks; ++r) {
      if (sh->verdicts[0][r].state.load() != 1) std::printf("rank %d: %s\n", r, sh->verdicts[0][r].msg);
    }
    munmap(sh, sizeof(Shared));
    return 1;
  }
  std::vector<double> rate;
  double ring = 0, rateSum = 0;
  for (int r = 0; r < o.ranks; ++r) {
    rate.push_back(word(r, 3));
    rateSum += word(r, 3);
    if (o.ranks > 2) ring += word(r, 4);
  }
  std::printf("rma %s v%d ranks=%d put_signal_halfrtt_us=%.2f p99_us=%.2f put_bw_gbps=%.3f ring_bw_gbps_total=%.3f "
              "signal_rate_Mps_per_rank=%.3f signal_rate_Mps_total=%.3f\n",
              probe->symbol().c_str(), probe->version(), o.ranks, word(0, 0), word(0, 1), word(1, 2), ring,
              median(rate), rateSum);
  munmap(sh, sizeof(Shared));
  return 0;
}

}  // namespace weft::harness
