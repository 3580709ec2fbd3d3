// SPDX-License-Identifier: Apache-2.0
// weft bench --rma --procs P: one collective comm of N ranks, N / P a process (threads), the way a node's proxy serves
// several GPUs: what set-up costs per peer. Every rank listens, connects, registers two windows (data and signals),
// puts 8 bytes with a signal to the next rank and waits for its own, then tears down. Each process reports its
// resident memory before the plugin was loaded, after connect and after registration, and how long each collective
// step took (the slowest rank); one line of figures (rank 0's process prints it).
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "rma_api.h"
#include "rma_conformance.h"

namespace weft::harness {
namespace {

constexpr int kMaxScaleRanks = 4096;
constexpr size_t kHandle = 128;
constexpr int kPtrHost = 1;

struct ScaleShared {
  std::atomic<int> arrived[8];  // barrier counters, one per step
  std::atomic<int> failed;
  std::atomic<int64_t> stepNs[4];  // the slowest rank's connect, register, first put+signal, teardown
  std::atomic<int64_t> rssKb[3];   // summed over processes: before, after connect, after registration
  char handles[kMaxScaleRanks][kHandle];
  char why[256];
};

int64_t rssKb() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void maxInto(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load();
  while (v > cur && !a.compare_exchange_weak(cur, v)) {
  }
}

// Every rank of every process arrives at step `step`; false once any rank failed or after a minute and a half.
bool barrier(ScaleShared* sh, int step, int nranks) {
  sh->arrived[step].fetch_add(1);
  const int64_t until = nowNs() + int64_t{90} * 1000000000;
  while (sh->arrived[step].load() < nranks) {
    if (sh->failed.load() != 0 || nowNs() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return sh->failed.load() == 0;
}

void failWith(ScaleShared* sh, const std::string& why) {
  if (sh->failed.exchange(1) == 0) std::snprintf(sh->why, sizeof(sh->why), "%s", why.c_str());
}

// One rank (a thread of its process).
void rankBody(RmaApi* api, ScaleShared* sh, int rank, int nranks, int procs, int dev) {
  auto bad = [&](const std::string& what, int r) {
    failWith(sh, "rank " + std::to_string(rank) + ": " + what + " returned " + std::to_string(r));
  };
  void *init = nullptr, *listen = nullptr, *comm = nullptr, *ctx = nullptr;
  int r = api->init(&init, 0x5343414cu);
  if (r != 0) return bad("init", r);
  char handle[kHandle] = {};
  if ((r = api->listen(init, dev, handle, &listen)) != 0) return bad("listen", r);
  std::memcpy(sh->handles[rank], handle, kHandle);
  if (!barrier(sh, 0, nranks)) return;
  // This rank's own copy, as NCCL's all-gather gives each process (a plugin may keep its connect state in them).
  std::vector<char> local(static_cast<size_t>(nranks) * kHandle);
  std::vector<void*> handles(static_cast<size_t>(nranks));
  for (int i = 0; i < nranks; ++i) {
    std::memcpy(&local[static_cast<size_t>(i) * kHandle], sh->handles[i], kHandle);
    handles[static_cast<size_t>(i)] = &local[static_cast<size_t>(i) * kHandle];
  }
  int64_t t0 = nowNs();
  if ((r = api->connect(init, handles.data(), nranks, rank, listen, &comm)) != 0) return bad("connect", r);
  maxInto(sh->stepNs[0], nowNs() - t0);
  if ((r = api->createContext(comm, 1, &ctx)) != 0) return bad("createContext", r);
  if (!barrier(sh, 1, nranks)) return;
  std::vector<uint64_t> data(512, static_cast<uint64_t>(rank)), sig(8, 0);
  void *dataMh = nullptr, *sigMh = nullptr;
  t0 = nowNs();
  if ((r = api->regMrSym(comm, data.data(), data.size() * 8, kPtrHost, 0, &dataMh)) != 0) return bad("regMrSym", r);
  if ((r = api->regMrSym(comm, sig.data(), sig.size() * 8, kPtrHost, 1, &sigMh)) != 0) return bad("regMrSym", r);
  maxInto(sh->stepNs[1], (nowNs() - t0) / 2);
  if (!barrier(sh, 2, nranks)) return;
  // 8 bytes and a signal to the next rank; this rank's own signal from the previous one, with its bytes.
  t0 = nowNs();
  void* req = nullptr;
  const uint32_t next = static_cast<uint32_t>((rank + 1) % nranks);
  if ((r = api->iputSignal(api->gin() ? comm : ctx, 0, 0, dataMh, 8, 8, dataMh, next, 0, sigMh, 1, 1, true, 0,
                           &req)) != 0) {
    return bad("iputSignal", r);
  }
  int done = 0;
  const int64_t until = nowNs() + int64_t{60} * 1000000000;
  while (!done || __atomic_load_n(&sig[0], __ATOMIC_ACQUIRE) == 0) {
    if (!done && (r = api->test(comm, req, &done)) != 0) return bad("test", r);
    api->progress(api->gin() ? comm : ctx);
    if (nowNs() > until) return failWith(sh, "rank " + std::to_string(rank) + ": its signal never came");
  }
  const uint64_t prev = static_cast<uint64_t>((rank - 1 + nranks) % nranks);
  if (__atomic_load_n(&data[1], __ATOMIC_ACQUIRE) != prev) {
    return failWith(sh, "rank " + std::to_string(rank) + ": the signal came before its put's bytes");
  }
  maxInto(sh->stepNs[2], nowNs() - t0);
  if (!barrier(sh, 3, nranks)) return;
  // Everyone stays connected until every process's main thread read its memory (and arrived at step 4 too).
  if (!barrier(sh, 4, nranks + procs)) return;
  t0 = nowNs();
  if (!api->gin() && (r = api->destroyContext(ctx)) != 0) return bad("destroyContext", r);
  if ((r = api->deregMrSym(comm, dataMh)) != 0 || (r = api->deregMrSym(comm, sigMh)) != 0) return bad("deregMrSym", r);
  if ((r = api->closeColl(comm)) != 0) return bad("closeColl", r);
  if ((r = api->closeListen(listen)) != 0) return bad("closeListen", r);
  api->finalize(init);
  maxInto(sh->stepNs[3], nowNs() - t0);
}

}  // namespace

int runRmaScale(const RmaOptions& o) {
  const int n = o.ranks, procs = o.procs;
  if (n < 2 || n > kMaxScaleRanks || procs < 1 || n % procs != 0) {
    std::fprintf(stderr, "weft bench --rma --procs: %d ranks in %d processes (2 to %d ranks, a whole number a process)\n",
                 n, procs, kMaxScaleRanks);
    return 2;
  }
  auto* sh = static_cast<ScaleShared*>(
      mmap(nullptr, sizeof(ScaleShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) return 2;
  new (sh) ScaleShared();
  const int per = n / procs;
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      const int64_t before = rssKb();
      std::string why;
      RmaApi* api = RmaApi::load(o.plugin, o.symbol, o.table, &why);
      if (api == nullptr) {
        failWith(sh, "cannot load the table: " + why);
        _exit(1);
      }
      sh->rssKb[0].fetch_add(before);
      std::vector<std::thread> threads;
      for (int t = 0; t < per; ++t) threads.emplace_back(rankBody, api, sh, p * per + t, n, procs, o.dev);
      // The process's memory once its ranks connected, and once they registered (before anyone tears down).
      auto waitStep = [&](int step) {
        while (sh->arrived[step].load() < n && sh->failed.load() == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      };
      waitStep(1);
      sh->rssKb[1].fetch_add(rssKb());
      waitStep(3);
      sh->rssKb[2].fetch_add(rssKb());
      sh->arrived[4].fetch_add(1);
      for (auto& th : threads) th.join();
      _exit(sh->failed.load() != 0 ? 1 : 0);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  if (sh->failed.load() != 0 || rc != 0) {
    std::printf("rma-scale FAILED ranks=%d procs=%d: %s\n", n, procs, sh->why[0] ? sh->why : "a process died");
    return 1;
  }
  const double ranksPer = per;
  auto perRankKb = [&](int i) { return double(sh->rssKb[i].load() - sh->rssKb[0].load()) / n; };
  std::printf("rma-scale ranks=%d procs=%d connect_ms=%.1f register_ms=%.1f first_signal_ms=%.1f teardown_ms=%.1f "
              "rss_per_rank_connected_kb=%.0f rss_per_rank_registered_kb=%.0f ranks_per_proc=%.0f\n",
              n, procs, sh->stepNs[0].load() / 1e6, sh->stepNs[1].load() / 1e6, sh->stepNs[2].load() / 1e6,
              sh->stepNs[3].load() / 1e6, perRankKb(1), perRankKb(2), ranksPer);
  munmap(sh, sizeof(ScaleShared));
  return 0;
}

}  // namespace weft::harness
