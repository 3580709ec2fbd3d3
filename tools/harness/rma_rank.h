// SPDX-License-Identifier: Apache-2.0
// What the files of weft conformance --rma share: the ranks' shared memory (NCCL's bootstrap), one rank's state and
// the helpers every check uses. The checks are rma_checks.cc, the runner rma_conformance.cc, the bench rma_bench.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

#include "device_memory.h"
#include "rma_api.h"
#include "rma_conformance.h"

namespace weft::harness::rmacheck {

using Clock = std::chrono::steady_clock;
constexpr int kMaxRanks = 8;
constexpr int kMaxChecks = 32;
constexpr int kCrashGraceSec = 10;   // how long the other ranks may go on once one has crashed
constexpr size_t kSlot = 4 << 20;      // each sender's part of a target's destination window
constexpr int kSignalSlots = 64;       // signal slots per rank: [0, nranks) per sender, then named ones below
constexpr int kSumSlot = kMaxRanks;    // signal.concurrent_sum
constexpr int kSoakSlot = kMaxRanks + 1;
constexpr int kFaultSlot = kMaxRanks + 2;
constexpr int kStrongSlot = kMaxRanks + 3;
constexpr int kWeakSlot = kMaxRanks + 4;
constexpr int kFenceSlot = kMaxRanks + 5;  // (and the bench's round trip: the slot after it)
constexpr int kStallSlot = kMaxRanks + 7;  // weft.stall_line
constexpr int kFlowsSlot = kMaxRanks + 8;  // weft.rma_flows
constexpr int kHangSlot = kMaxRanks + 9;   // weft.rma_hang_report
constexpr int kFlagHost = 1, kFlagCuda = 2;  // NCCL_PTR_*
constexpr uint64_t kForceSo = 1, kNeverReset = 2;

// What the ranks share: NCCL's bootstrap, the driver's view of who is alive, and the verdicts.
struct Shared {
  std::atomic<uint64_t> round[kMaxRanks];
  std::atomic<uint32_t> dead;  // ranks that ended (the driver sets them as it reaps; a rank dying on purpose first)
  std::atomic<int> current[kMaxRanks];
  char handles[kMaxRanks][128];
  uint64_t words[kMaxRanks][kMaxRanks];
  struct Verdict {
    std::atomic<int> state;  // 0 none, 1 pass, 2 fail, 3 skip
    char msg[480];
  } verdicts[kMaxChecks][kMaxRanks];
};

struct Rank;
struct Check {
  const char* name;
  const char* what;
  // "" runs; otherwise why it is skipped.
  std::function<std::string(Rank&)> skip;
  std::function<std::string(Rank&)> run;  // "" passes; otherwise why it failed
};

// One window: this rank's part, in host or device memory.
struct Buf {
  uint8_t* p = nullptr;
  size_t size = 0;
  bool cuda = false;
  void* mh = nullptr;
};

struct Rank {
  const RmaOptions* o = nullptr;
  Shared* sh = nullptr;
  RmaApi* api = nullptr;
  CudaDriver* cu = nullptr;
  int rank = 0, nranks = 0;
  void* initCtx = nullptr;
  void* listen = nullptr;
  void* comm = nullptr;
  void* ctx = nullptr;  // a block of 4 contexts (v13+), the comm before
  RmaDeviceInfo info;
  bool connected = false, registered = false;
  Buf src, dst, sig;
  uint64_t sigExpected[kSignalSlots] = {};  // what this rank expects in its own signal slots so far
  bool deadDone = false;

  bool live(int r) const { return !(sh->dead.load() & (1u << r)); }
  // Every live rank reaches this point; false on timeout.
  bool barrier() {
    const uint64_t mine = sh->round[rank].fetch_add(1) + 1;
    const auto until = Clock::now() + std::chrono::seconds(o->timeoutSec);
    for (;;) {
      bool all = true;
      for (int r = 0; r < nranks; ++r) all &= !live(r) || sh->round[r].load() >= mine;
      if (all) return true;
      if (Clock::now() > until) return false;
      // NCCL's proxy thread never stops progressing: a rank waiting here still answers its peers' gets. It sleeps
      // between calls so that ranks waiting here leave the CPUs to those working (8 ranks on 2 cores).
      if (ctx != nullptr) api->progress(ctx);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  int next(int k = 1) const { return (rank + k) % nranks; }
  int prev(int k = 1) const { return (rank - k % nranks + nranks) % nranks; }

  Buf alloc(size_t size, bool cuda) {
    Buf b;
    b.size = size;
    b.cuda = cuda;
    if (cuda) {
      b.p = cu->alloc(size);
      cu->set(b.p, 0, size);
    } else {
      b.p = static_cast<uint8_t*>(std::aligned_alloc(4096, (size + 4095) / 4096 * 4096));
      std::memset(b.p, 0, size);
    }
    return b;
  }
  // regMrSym of a buffer, GPU memory with the mock driver's registration window open (a NIC pins device pages the
  // way nvidia-peermem does: through a mapping only the registration sees).
  int regSym(Buf& b, uint64_t flags) {
    if (b.cuda) cu->cpuWindow(b.p, b.size, true);
    const int r = api->regMrSym(comm, b.p, b.size, b.cuda ? kFlagCuda : kFlagHost, flags, &b.mh);
    if (b.cuda) cu->cpuWindow(b.p, b.size, false);
    return r;
  }
  void free(Buf& b) {
    if (b.p == nullptr) return;
    if (b.cuda) {
      cu->free(b.p);
    } else {
      std::free(b.p);
    }
    b.p = nullptr;
  }
  void write(Buf& b, size_t off, const void* data, size_t n) {
    if (b.cuda) {
      cu->toDevice(b.p + off, data, n);
    } else {
      std::memcpy(b.p + off, data, n);
    }
  }
  void read(const Buf& b, size_t off, void* out, size_t n) {
    if (b.cuda) {
      cu->toHost(out, b.p + off, n);
    } else {
      std::memcpy(out, b.p + off, n);
    }
  }
  uint64_t signal(int slot) {
    if (sig.cuda) {
      uint64_t v = 0;
      cu->toHost(&v, sig.p + slot * 8, 8);
      return v;
    }
    return __atomic_load_n(reinterpret_cast<uint64_t*>(sig.p + slot * 8), __ATOMIC_ACQUIRE);
  }
  // Drives progress until pred holds; false after `sec` seconds.
  bool until(const std::function<bool()>& pred, int sec) {
    const auto end = Clock::now() + std::chrono::seconds(sec);
    while (!pred()) {
      api->progress(ctx);
      if (Clock::now() > end) return false;
    }
    return true;
  }
  // Every put this rank issued to `targets` is visible there once they see this: a strong signal (no data) to each,
  // then waiting until every rank that fenced to this one did so.
  std::string fence(const std::vector<int>& targets, int fromCount) {
    for (int t : targets) {
      void* req = nullptr;
      int r = api->iputSignal(ctx, 0, 0, nullptr, 0, 0, nullptr, t, 8 * kFenceSlot, sig.mh, 1, 1, true, 0, &req);
      if (r != 0) return "iputSignal(fence) returned " + std::to_string(r);
      std::string e = wait(req, "iputSignal(fence)");
      if (!e.empty()) return e;
    }
    const uint64_t want = sigExpected[kFenceSlot] += static_cast<uint64_t>(fromCount);
    if (!until([&] { return signal(kFenceSlot) >= want; }, 60)) return "a fence signal never came";
    return "";
  }
  // Tests a request to completion as NCCL's proxy does (test, then progress); an error or a timeout is the result.
  std::string wait(void* req, const char* what, int sec = 60) {
    if (req == nullptr) return std::string(what) + ": the plugin returned no request";
    const auto end = Clock::now() + std::chrono::seconds(sec);
    for (;;) {
      int done = 0;
      int r = api->test(comm, req, &done);
      if (r != 0) return std::string(what) + ": test returned " + std::to_string(r);
      if (done) return "";
      api->progress(ctx);
      if (Clock::now() > end) return std::string(what) + ": not complete after " + std::to_string(sec) + " s";
    }
  }
};

// The checks in the order every rank runs them.
std::vector<Check> checks();
// The steps the bench shares with the checks.
std::string setupConnect(Rank& k);
std::string setupRegister(Rank& k);
std::string teardown(Rank& k);
std::string callFailed(const char* what, int r);
// The ranks: shared memory made before they fork (their bootstrap), one process each running `body(rank)`, which
// never returns. nullptr when the shared memory cannot be had.
Shared* forkRanks(int n, std::vector<pid_t>* pids, const std::function<void(Shared*, int)>& body);

}  // namespace weft::harness::rmacheck
