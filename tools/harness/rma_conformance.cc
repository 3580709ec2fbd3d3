// SPDX-License-Identifier: Apache-2.0
#include "rma_conformance.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "crash_report.h"
#include "device_memory.h"
#include "netns.h"
#include "rma_api.h"
#include "verdict.h"

namespace weft::harness {
namespace {

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
constexpr int kFenceSlot = kMaxRanks + 5;
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

uint8_t pattern(int sender, uint64_t salt, size_t i) {
  return static_cast<uint8_t>(sender * 31 + salt * 7 + i * 13 + (i >> 8));
}
std::vector<uint8_t> fill(int sender, uint64_t salt, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(sender, salt, i);
  return v;
}
std::string compare(Rank& k, const Buf& b, size_t off, const std::vector<uint8_t>& want, const char* what) {
  std::vector<uint8_t> got(want.size());
  k.read(b, off, got.data(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      char msg[256];
      std::snprintf(msg, sizeof(msg), "%s: byte %zu of %zu is %u, expected %u", what, i, want.size(), got[i], want[i]);
      return msg;
    }
  }
  return "";
}
std::string callFailed(const char* what, int r) { return std::string(what) + " returned " + std::to_string(r); }

// --mem cuda with a device that does not say it reaches GPU memory (ptrSupport without NCCL_PTR_CUDA): NCCL would not
// give it GPU windows, so there is nothing to check (each check says so; none passes).
std::string noGpu(const Rank& k) {
  if (k.o->mem != "cuda" || !k.connected || (k.info.ptrSupport & 2) != 0) return "";
  return "the device does not reach GPU memory (ptrSupport " + std::to_string(k.info.ptrSupport) + ")";
}
std::string needConnected(Rank& k) {
  if (std::string s = noGpu(k); !s.empty()) return s;
  return k.connected && k.registered ? "" : "set-up failed";
}

// ---- the checks ------------------------------------------------------------------------------------------------------

std::string setupConnect(Rank& k) {
  int r = k.api->init(&k.initCtx, 0x57454654u);
  if (r != 0) return callFailed("init", r);
  int n = 0;
  if ((r = k.api->devices(&n)) != 0) return callFailed("devices", r);
  if (n <= k.o->dev) return "the plugin reports " + std::to_string(n) + " devices (weft: see WEFT_RMA, WEFT_IFACE)";
  if ((r = k.api->getProperties(k.o->dev, &k.info)) != 0) return callFailed("getProperties", r);
  // NCCL 2.30.7's RMA loader refuses a plugin whose device is not of the GIN proxy type; 2.28's GIN picks proxy mode
  // by it.
  if (k.info.netDeviceType != 2) return "netDeviceType is " + std::to_string(k.info.netDeviceType) + ", not GIN_PROXY (2)";
  if (k.info.maxRecvs < 1) return "maxRecvs is " + std::to_string(k.info.maxRecvs);
  char handle[128] = {};
  if ((r = k.api->listen(k.initCtx, k.o->dev, handle, &k.listen)) != 0) return callFailed("listen", r);
  std::memcpy(k.sh->handles[k.rank], handle, 128);
  if (!k.barrier()) return "a rank did not reach connect";
  // NCCL all-gathers the handles into memory of each process's own, and a plugin may keep its connect state in them
  // (NCCL's IB does: the stage and its buffer): a copy per rank, never the shared pages the other ranks also use.
  char local[kMaxRanks][128];
  void* handles[kMaxRanks];
  for (int i = 0; i < k.nranks; ++i) {
    std::memcpy(local[i], k.sh->handles[i], 128);
    handles[i] = local[i];
  }
  if ((r = k.api->connect(k.initCtx, handles, k.nranks, k.rank, k.listen, &k.comm)) != 0) return callFailed("connect", r);
  if ((r = k.api->createContext(k.comm, 4, &k.ctx)) != 0) return callFailed("createContext", r);
  bool flushes = false;
  if ((r = k.api->getRmaProperties(k.comm, &flushes)) != 0) return callFailed("getRmaProperties", r);
  k.connected = true;
  return "";
}

std::string setupRegister(Rank& k) {
  if (!k.connected) return "not connected";
  const bool cuda = k.o->mem == "cuda";
  k.src = k.alloc(kSlot, cuda);
  k.dst = k.alloc(kSlot * static_cast<size_t>(k.nranks), cuda);
  // Signals as NCCL's GIN proxy makes them: device memory, strongly ordered, never reset (host memory here with
  // --mem host).
  k.sig = k.alloc(kSignalSlots * 8, cuda);
  int r = k.regSym(k.src, 0);
  if (r != 0) return callFailed("regMrSym(source)", r);
  if ((r = k.regSym(k.dst, 0)) != 0) {
    return callFailed("regMrSym(destination)", r);
  }
  if ((r = k.regSym(k.sig, kForceSo | kNeverReset)) != 0) {
    return callFailed("regMrSym(signals)", r);
  }
  k.registered = true;
  return "";
}

// Puts of every size class to the next rank, each followed by a signal; the target checks the bytes on the signal.
std::string putSizes(Rank& k) {
  static const size_t kSizes[] = {1, 8, 100, 4096, 65537, 1 << 20, kSlot};
  for (size_t size : kSizes) {
    const auto data = fill(k.rank, size, size);
    k.write(k.src, 0, data.data(), size);
    void* req = nullptr;
    int r = k.api->iput(k.ctx, 0, 0, k.src.mh, size, kSlot * k.rank, k.dst.mh, k.next(), 0, &req);
    if (r != 0) return callFailed("iput", r);
    std::string e = k.wait(req, "iput");
    if (!e.empty()) return e;
    void* sreq = nullptr;
    r = k.api->iputSignal(k.ctx, 0, 0, nullptr, 0, 0, nullptr, k.next(), 8 * k.rank, k.sig.mh, 1, 1 /*INC*/, true, 0,
                          &sreq);
    if (r != 0) return callFailed("iputSignal(size 0)", r);
    if (!(e = k.wait(sreq, "iputSignal")).empty()) return e;
    // As target: the previous rank's put of this size, visible once its signal is.
    const int from = k.prev();
    const uint64_t want = ++k.sigExpected[from];
    if (!k.until([&] { return k.signal(from) >= want; }, 60)) {
      return "the signal after a put of " + std::to_string(size) + " bytes never came";
    }
    if (k.signal(from) != want) return "signal slot holds " + std::to_string(k.signal(from)) + ", not " + std::to_string(want);
    e = compare(k, k.dst, kSlot * from, fill(from, size, size), ("a put of " + std::to_string(size) + " bytes").c_str());
    if (!e.empty()) return e;
    if (!k.barrier()) return "a rank did not finish the round";
  }
  return "";
}

std::string getSizes(Rank& k) {
  static const size_t kSizes[] = {1, 8, 4096, 65537, 1 << 20, kSlot};
  for (size_t size : kSizes) {
    const auto mine = fill(k.rank, size + 1, size);
    k.write(k.src, 0, mine.data(), size);
    if (!k.barrier()) return "a rank did not fill its source";
    void* req = nullptr;
    const int from = k.next();
    int r = k.api->iget(k.ctx, 1, 0, k.src.mh, size, kSlot * from, k.dst.mh, from, &req);
    if (r != 0) return callFailed("iget", r);
    std::string e = k.wait(req, "iget");
    if (!e.empty()) return e;
    void* freq = nullptr;
    if ((r = k.api->iflush(k.ctx, 1, k.dst.mh, from, &freq)) != 0) return callFailed("iflush", r);
    if (freq != nullptr && !(e = k.wait(freq, "iflush")).empty()) return e;
    e = compare(k, k.dst, kSlot * from, fill(from, size + 1, size), ("a get of " + std::to_string(size) + " bytes").c_str());
    if (!e.empty()) return e;
    if (!k.barrier()) return "a rank did not finish the round";
  }
  return "";
}

// Bundled put + signal, 8 rounds into 8 regions: whenever the target sees the signal reach k, regions 0..k-1 are whole.
std::string signalAfterPut(Rank& k) {
  constexpr int kRounds = 8;
  constexpr size_t kPiece = kSlot / kRounds;
  std::vector<void*> reqs;
  for (int i = 0; i < kRounds; ++i) {
    const auto data = fill(k.rank, 100 + i, kPiece);
    k.write(k.src, kPiece * i, data.data(), kPiece);
  }
  for (int i = 0; i < kRounds; ++i) {
    void* req = nullptr;
    int r = k.api->iputSignal(k.ctx, 0, kPiece * i, k.src.mh, kPiece, kSlot * k.rank + kPiece * i, k.dst.mh, k.next(),
                              8 * k.rank, k.sig.mh, 1, 2 /*ADD*/, true, 0, &req);
    if (r != 0) return callFailed("iputSignal", r);
    reqs.push_back(req);
  }
  const int from = k.prev();
  const uint64_t base = k.sigExpected[from];
  int checked = 0;
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (checked < kRounds) {
    const uint64_t seen = k.signal(from) - base;
    for (; checked < static_cast<int>(std::min<uint64_t>(seen, kRounds)); ++checked) {
      std::string e = compare(k, k.dst, kSlot * from + kPiece * checked, fill(from, 100 + checked, kPiece),
                              ("round " + std::to_string(checked) + "'s put, seen through its signal").c_str());
      if (!e.empty()) return e;
    }
    k.api->progress(k.ctx);
    if (Clock::now() > end) return "only " + std::to_string(checked) + " of 8 signals came";
  }
  k.sigExpected[from] = base + kRounds;
  for (void* req : reqs) {
    std::string e = k.wait(req, "iputSignal");
    if (!e.empty()) return e;
  }
  if (k.signal(from) != k.sigExpected[from]) return "the signal went past its 8 additions";
  return k.barrier() ? "" : "a rank did not finish";
}

// Every rank adds to every rank's one slot at once; the sum must be exact.
std::string concurrentSum(Rank& k) {
  const int kEach = 200;
  std::vector<void*> pending;
  for (int i = 0; i < kEach; ++i) {
    for (int t = 0; t < k.nranks; ++t) {
      void* req = nullptr;
      int r = k.api->iputSignal(k.ctx, i % 4, 0, nullptr, 0, 0, nullptr, t, 8 * kSumSlot, k.sig.mh,
                                uint64_t(k.rank) * 1000 + i + 1, 2, true, 0, &req);
      if (r != 0) return callFailed("iputSignal", r);
      pending.push_back(req);
    }
    if (pending.size() >= 64) {
      for (void* q : pending) {
        std::string e = k.wait(q, "iputSignal");
        if (!e.empty()) return e;
      }
      pending.clear();
    }
  }
  for (void* q : pending) {
    std::string e = k.wait(q, "iputSignal");
    if (!e.empty()) return e;
  }
  uint64_t want = 0;
  for (int s = 0; s < k.nranks; ++s) {
    for (int i = 0; i < kEach; ++i) want += uint64_t(s) * 1000 + i + 1;
  }
  if (!k.until([&] { return k.signal(kSumSlot) >= want; }, 60)) {
    return "the sum stopped at " + std::to_string(k.signal(kSumSlot)) + " of " + std::to_string(want);
  }
  if (!k.barrier()) return "a rank did not finish";
  const uint64_t got = k.signal(kSumSlot);
  return got == want ? "" : "the sum is " + std::to_string(got) + ", not " + std::to_string(want);
}

// A plain put, then a signal with no data: strong, it shows the put. A weak signal shows its own put (v14+).
std::string strongWeak(Rank& k) {
  constexpr size_t kPiece = 256 << 10;
  const int from = k.prev();
  for (int round = 0; round < 4; ++round) {
    const auto a = fill(k.rank, 300 + round, kPiece);
    k.write(k.src, 0, a.data(), kPiece);
    void* q1 = nullptr;
    void* q2 = nullptr;
    int r = k.api->iput(k.ctx, 2, 0, k.src.mh, kPiece, kSlot * k.rank, k.dst.mh, k.next(), 0, &q1);
    if (r != 0) return callFailed("iput", r);
    r = k.api->iputSignal(k.ctx, 2, 0, nullptr, 0, 0, nullptr, k.next(), 8 * kStrongSlot, k.sig.mh, 1, 1, true, 0, &q2);
    if (r != 0) return callFailed("iputSignal(strong)", r);
    const uint64_t want = ++k.sigExpected[kStrongSlot];
    if (!k.until([&] { return k.signal(kStrongSlot) >= want; }, 60)) return "a strong signal never came";
    std::string e = compare(k, k.dst, kSlot * from, fill(from, 300 + round, kPiece), "the put before a strong signal");
    if (!e.empty()) return e;
    if (!(e = k.wait(q1, "iput")).empty() || !(e = k.wait(q2, "iputSignal")).empty()) return e;
    if (k.api->weakSignals()) {
      const auto b = fill(k.rank, 400 + round, kPiece);
      k.write(k.src, kPiece, b.data(), kPiece);
      void* q3 = nullptr;
      r = k.api->iputSignal(k.ctx, 3, kPiece, k.src.mh, kPiece, kSlot * k.rank + kPiece, k.dst.mh, k.next(),
                            8 * kWeakSlot, k.sig.mh, 1, 1, false, 0, &q3);
      if (r != 0) return callFailed("iputSignal(weak)", r);
      const uint64_t w = ++k.sigExpected[kWeakSlot];
      if (!k.until([&] { return k.signal(kWeakSlot) >= w; }, 60)) return "a weak signal never came";
      e = compare(k, k.dst, kSlot * from + kPiece, fill(from, 400 + round, kPiece), "the put bundled with a weak signal");
      if (!e.empty()) return e;
      if (!(e = k.wait(q3, "iputSignal(weak)")).empty()) return e;
    }
    if (!k.barrier()) return "a rank did not finish the round";
  }
  return "";
}

// Many small puts with signals to random peers, up to NCCL's queue bound in flight; every signal must add up
// exactly and each slot's last write must be there.
std::string soak(Rank& k) {
  const int64_t total = std::max<int64_t>(k.o->soakOps / k.nranks, 1);
  constexpr size_t kPut = 64;
  constexpr size_t kSlots = kSlot / kPut;
  const size_t inflight = std::min<size_t>(static_cast<size_t>(32 * std::max(k.info.maxRecvs, 1)), 256);
  std::mt19937_64 rng(0x5eed + k.rank);
  std::vector<uint64_t> sentTo(static_cast<size_t>(k.nranks), 0), sumTo(static_cast<size_t>(k.nranks), 0);
  std::vector<void*> q;
  q.reserve(inflight);
  // Sources: 4096 distinct 64-byte pieces, piece j filled for op j's content.
  std::vector<uint8_t> srcBytes(kSlot);
  for (size_t i = 0; i < kSlot; ++i) srcBytes[i] = pattern(k.rank, i / kPut, i % kPut);
  k.write(k.src, 0, srcBytes.data(), kSlot);
  const auto start = Clock::now();
  size_t head = 0;
  for (int64_t i = 0; i < total; ++i) {
    const int t = static_cast<int>(rng() % static_cast<uint64_t>(k.nranks));
    const uint64_t n = sentTo[t]++;
    const size_t slot = n % kSlots;
    const size_t piece = (n * 2654435761u) % kSlots;  // what op n to t carries
    void* req = nullptr;
    int r;
    if (rng() % 16 == 0) {
      const uint64_t v = 1 + rng() % 1000;
      sumTo[t] += v;
      r = k.api->iputSignal(k.ctx, 0, piece * kPut, k.src.mh, kPut, kSlot * k.rank + slot * kPut, k.dst.mh, t,
                            8 * kSoakSlot, k.sig.mh, v, 2, true, i % 7 == 0 ? 0u : 1u, &req);
    } else {
      r = k.api->iput(k.ctx, 0, piece * kPut, k.src.mh, kPut, kSlot * k.rank + slot * kPut, k.dst.mh, t,
                      i % 7 == 0 ? 0u : 1u, &req);
    }
    if (r != 0) return callFailed("iput", r) + " at operation " + std::to_string(i);
    if (q.size() < inflight) {
      q.push_back(req);
    } else {
      std::string e = k.wait(q[head], "a soak operation");
      if (!e.empty()) return e + " at operation " + std::to_string(i);
      q[head] = req;
      head = (head + 1) % inflight;
    }
  }
  for (size_t j = 0; j < q.size(); ++j) {
    std::string e = k.wait(q[(head + j) % q.size()], "a soak operation");
    if (!e.empty()) return e;
  }
  for (int t = 0; t < k.nranks; ++t) k.sh->words[k.rank][t] = sumTo[t];
  if (!k.barrier()) return "a rank did not finish its operations";
  uint64_t want = 0;
  for (int s = 0; s < k.nranks; ++s) want += k.sh->words[s][k.rank];
  if (!k.until([&] { return k.signal(kSoakSlot) >= want; }, 120)) {
    return "soak signals stopped at " + std::to_string(k.signal(kSoakSlot)) + " of " + std::to_string(want);
  }
  if (k.signal(kSoakSlot) != want) return "soak signals add up to " + std::to_string(k.signal(kSoakSlot)) + ", not " + std::to_string(want);
  // The plain puts after each sender's last signal: shown by a fence from every rank.
  std::vector<int> everyone;
  for (int t = 0; t < k.nranks; ++t) everyone.push_back(t);
  if (std::string e = k.fence(everyone, k.nranks); !e.empty()) return e;
  for (int t = 0; t < k.nranks; ++t) k.sh->words[k.rank][t] = sentTo[t];
  if (!k.barrier()) return "a rank did not publish its counts";
  // Each sender's last write to every slot of its part here: op n carried piece (n * 2654435761) % kSlots.
  std::vector<uint8_t> got(kSlot);
  for (int s = 0; s < k.nranks; ++s) {
    const uint64_t n = k.sh->words[s][k.rank];
    if (n == 0) continue;
    k.read(k.dst, kSlot * s, got.data(), kSlot);
    for (size_t slot = 0; slot < std::min<uint64_t>(n, kSlots); ++slot) {
      const uint64_t last = (n - 1) - ((n - 1 - slot) % kSlots);
      const size_t piece = (last * 2654435761u) % kSlots;
      for (size_t b = 0; b < kPut; ++b) {
        if (got[slot * kPut + b] != pattern(s, piece, b)) {
          return "rank " + std::to_string(s) + "'s last write to slot " + std::to_string(slot) + " is not there";
        }
      }
    }
  }
  const double sec = std::chrono::duration<double>(Clock::now() - start).count();
  if (k.o->verbose) std::fprintf(stderr, "  rank %d: %lld operations in %.1f s\n", k.rank, (long long)total, sec);
  return k.barrier() ? "" : "a rank did not finish";
}

// A window deregistered right after a put from it was issued: refused, or made safe (the put completes or fails,
// the memory is freed afterwards and nothing touches it). A put that fails is that second outcome, not a failure of
// the check: NCCL's GIN IB proxy over soft-RoCE has the device refuse the write once its region is gone when the
// put is still queued (test returns ncclRemoteError; seen with the guest's emulation slow). Its bytes are then not
// expected anywhere, and its connection may be in error: when any rank's put failed, no rank fences or compares.
std::string deregInflight(Rank& k) {
  Buf w = k.alloc(kSlot, k.o->mem == "cuda");
  const auto data = fill(k.rank, 77, kSlot);
  k.write(w, 0, data.data(), kSlot);
  int r = k.regSym(w, 0);
  if (r != 0) return callFailed("regMrSym", r);
  void* req = nullptr;
  if ((r = k.api->iput(k.ctx, 0, 0, w.mh, kSlot, kSlot * k.rank, k.dst.mh, k.next(), 0, &req)) != 0) {
    return callFailed("iput", r);
  }
  const int d = k.api->deregMrSym(k.comm, w.mh);
  const std::string what = "the put from a window being deregistered";
  std::string e = k.wait(req, what.c_str());
  const bool putFailed = e.rfind(what + ": test returned ", 0) == 0;
  if (!e.empty() && !putFailed) return e;  // no request, or not complete in time
  if (d != 0 && (r = k.api->deregMrSym(k.comm, w.mh)) != 0) {
    return "deregMrSym refused while the put was in flight, and again after it ended (" + std::to_string(r) + ")";
  }
  k.free(w);  // under the mock, a later device access faults; host memory goes back to the allocator
  k.sh->words[k.rank][0] = putFailed ? 1 : 0;
  if (!k.barrier()) return "a rank did not finish";
  bool anyFailed = false;
  for (int s = 0; s < k.nranks; ++s) anyFailed |= k.live(s) && k.sh->words[s][0] != 0;
  if (anyFailed) {
    if (putFailed) std::fprintf(stderr, "  rank %d: %s (a safe outcome: nothing of it is compared)\n", k.rank, e.c_str());
    return k.barrier() ? "" : "a rank did not finish";  // every rank has read the words before the next check
  }
  if (std::string f = k.fence({k.next()}, 1); !f.empty()) return f;
  if (!k.barrier()) return "a rank did not finish";
  return compare(k, k.dst, kSlot * k.prev(), fill(k.prev(), 77, kSlot), "the put from a deregistered window");
}

// weft's promise: what is not a live object of the plugin is refused with an error, never dereferenced blindly.
std::string garbage(Rank& k) {
  alignas(64) unsigned char junk[256];
  std::memset(junk, 0xab, sizeof(junk));
  int done = 0;
  if (k.api->test(k.comm, junk, &done) == 0) return "test accepted a request that is 256 bytes of 0xab";
  void* req = nullptr;
  if (k.api->iput(k.ctx, 0, 0, junk, 8, 0, k.dst.mh, k.next(), 0, &req) == 0) return "iput accepted a garbage source handle";
  if (k.api->iput(k.ctx, 0, 0, k.src.mh, 8, k.dst.size, k.dst.mh, k.next(), 0, &req) == 0) {
    return "iput accepted a destination past the end of the window";
  }
  if (k.api->iput(k.ctx, 9999, 0, k.src.mh, 8, 0, k.dst.mh, k.next(), 0, &req) == 0 && !k.api->gin()) {
    return "iput accepted context 9999 of a block of 4";
  }
  if (k.api->iput(k.ctx, 0, 0, k.src.mh, 8, 0, k.dst.mh, 1000, 0, &req) == 0) return "iput accepted rank 1000";
  if (k.api->iputSignal(k.ctx, 0, 0, nullptr, 0, 0, nullptr, k.next(), 8, k.sig.mh, 1, 9, true, 0, &req) == 0) {
    return "iputSignal accepted signal operation 9";
  }
  if (k.api->iputSignal(k.ctx, 0, 0, nullptr, 0, 0, nullptr, k.next(), 3, k.sig.mh, 1, 1, true, 0, &req) == 0) {
    return "iputSignal accepted a signal at a misaligned offset";
  }
  if (k.api->deregMrSym(k.comm, junk) == 0) return "deregMrSym accepted a garbage handle";
  if (k.api->closeColl(junk) == 0) return "closeColl accepted a garbage comm";
  bool err = false;
  if (k.api->queryLastError(k.ctx, &err) != 0 || err) return "misuse refused at the call set the comm's error";
  return k.barrier() ? "" : "a rank did not finish";
}

// Puts of 64 KiB to `peer` (as NCCL's proxy keeps issuing them) until one fails, or queryLastError reports an
// error, within `boundSec`: "" (and *sec, how long it took) or why not.
std::string failsWithin(Rank& k, int peer, int boundSec, double* sec) {
  const auto start = Clock::now();
  const auto end = start + std::chrono::seconds(boundSec);
  for (;;) {
    void* req = nullptr;
    int r = k.api->iput(k.ctx, 0, 0, k.src.mh, 65536, kSlot * k.rank, k.dst.mh, peer, 0, &req);
    bool failed = r != 0;
    while (!failed && req != nullptr) {
      int done = 0;
      r = k.api->test(k.comm, req, &done);
      if (r != 0) {
        failed = true;
        break;
      }
      if (done) break;
      k.api->progress(k.ctx);
      if (Clock::now() > end) break;
    }
    bool has = false;
    k.api->queryLastError(k.ctx, &has);
    if (failed || has) {
      *sec = std::chrono::duration<double>(Clock::now() - start).count();
      // A table without queryLastError (NCCL 2.28's IB proxy) reports errors through test alone.
      if (!has && k.api->hasQueryLastError()) return "test failed but queryLastError reports no error";
      return "";
    }
    if (Clock::now() > end) {
      return "requests to rank " + std::to_string(peer) + " still did not fail after " + std::to_string(boundSec) +
             " s";
    }
  }
}

// The last rank dies; every other rank's request to it fails within the bound, and queryLastError says so.
std::string deadRank(Rank& k) {
  const int victim = k.nranks - 1;
  if (!k.barrier()) return "a rank did not arrive";
  if (k.rank == victim) {
    k.sh->dead.fetch_or(1u << k.rank);
    ::kill(::getpid(), SIGKILL);
  }
  double sec = 0;
  if (std::string e = failsWithin(k, victim, k.o->deadBoundSec, &sec); !e.empty()) return e;
  if (k.o->verbose) std::fprintf(stderr, "  rank %d: the dead rank failed a request after %.2f s\n", k.rank, sec);
  k.deadDone = true;
  return "";
}

// The link between the ranks' two network namespaces goes down (--netns A,B puts even ranks in A, odd in B; rank 0
// takes A's links down; in the soft-RoCE guest, the guest's one link): every rank's requests to the next rank, across
// the link, fail within the bound and queryLastError says so; nobody hangs or crashes. The link comes back before
// teardown, which must end too.
std::string linkDown(Rank& k) {
  if (!k.barrier()) return "a rank did not arrive";
  if (k.rank == 0) {
    if (std::string e = setNetnsLinks(false); !e.empty()) return e;
  }
  if (!k.barrier()) return "a rank did not arrive after the link went down";
  double sec = 0;
  std::string e = failsWithin(k, k.next(), k.o->deadBoundSec, &sec);
  if (e.empty()) {
    std::printf("INFO rank %d: requests across the link failed after %.2f s\n", k.rank, sec);
    std::fflush(stdout);
  }
  // Every rank looks while the link is down; it comes back only when all have.
  if (!k.barrier()) return "a rank did not finish";
  if (k.rank == 0) {
    if (std::string up = setNetnsLinks(true); !up.empty() && e.empty()) e = up;
  }
  if (!k.barrier()) return "a rank did not arrive after the link came back";
  k.deadDone = true;
  return e;
}

std::string teardown(Rank& k) {
  int r;
  if (!k.api->gin() && (r = k.api->destroyContext(k.ctx)) != 0) return callFailed("destroyContext", r);
  for (Buf* b : {&k.src, &k.dst, &k.sig}) {
    if (b->mh != nullptr && (r = k.api->deregMrSym(k.comm, b->mh)) != 0) return callFailed("deregMrSym", r);
    b->mh = nullptr;
  }
  if ((r = k.api->closeColl(k.comm)) != 0) return callFailed("closeColl", r);
  if ((r = k.api->closeListen(k.listen)) != 0) return callFailed("closeListen", r);
  if ((r = k.api->finalize(k.initCtx)) != 0) return callFailed("finalize", r);
  k.free(k.src);
  k.free(k.dst);
  k.free(k.sig);
  return "";
}

std::vector<Check> checks() {
  auto none = [](Rank&) { return std::string(); };
  auto needGet = [](Rank& k) {
    std::string s = needConnected(k);
    if (!s.empty()) return s;
    return k.api->hasGet() ? std::string() : std::string("GIN v11/v12 tables have no get");
  };
  return {
      {"setup.connect", "listen on every rank, exchange handles, collective connect, a block of 4 contexts", none,
       setupConnect},
      {"setup.register", "symmetric registration: source, destination and signal windows on every rank",
       [](Rank& k) { return k.connected ? noGpu(k) : std::string("not connected"); }, setupRegister},
      {"put.sizes", "puts of 1 B to 4 MiB to the next rank, each shown by a later signal", needConnected, putSizes},
      {"get.sizes", "gets of 1 B to 4 MiB from the next rank, then a flush", needGet, getSizes},
      {"signal.after_put", "put+signal: whenever a signal is seen, its put and all before it are whole", needConnected,
       signalAfterPut},
      {"signal.concurrent_sum", "every rank adds 200 values to every rank's one slot: the sum is exact",
       needConnected, concurrentSum},
      {"signal.strong_weak", "a strong signal shows the put before it; a weak one its own put (v14+)", needConnected,
       strongWeak},
      {"soak.million", "a million puts (1 in 16 with a signal) to random peers, NCCL's queue bound in flight",
       needConnected, soak},
      {"dereg.inflight", "a window deregistered with a put from it in flight: refused or safe", needConnected,
       deregInflight},
      {"weft.garbage_handles", "garbage requests, handles, offsets, ranks and signal ops are refused", needConnected,
       garbage},
      {"faults.dead_rank", "the last rank dies: requests to it fail within the bound, queryLastError (if any) says so",
       [](Rank& k) {
         std::string s = needConnected(k);
         if (!s.empty()) return s;
         return k.nranks >= 2 ? std::string() : std::string("needs 2 ranks");
       },
       deadRank},
      {"faults.link_down", "the link between two network namespaces goes down: requests across it fail within the "
                           "bound, queryLastError says so",
       [](Rank& k) {
         std::string s = needConnected(k);
         if (!s.empty()) return s;
         // Two namespaces with even ranks (every rank's next is across the link), or one machine of its own (the
         // soft-RoCE guest: its one link down cuts every rank off).
         if (std::getenv("CONFORMANCE_LINK_DOWN_OK") == nullptr || (!k.o->netns.empty() && k.o->netns.size() != 2) ||
             k.nranks % 2 != 0) {
           return std::string("takes a link down: only under tests/conformance/rma_netns.sh (--netns A,B, even ranks)"
                              " or in the soft-RoCE guest");
         }
         return privateNetns() ? std::string() : std::string("refusing to take links down outside a private namespace");
       },
       linkDown},
      {"teardown", "destroyContext, deregMrSym, closeColl, closeListen, finalize",
       [](Rank& k) { return k.connected && (k.registered || !noGpu(k).empty()) ? "" : std::string("set-up failed"); },
       teardown},
  };
}


// ---- weft bench --rma ----------------------------------------------------------------------------------------------

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

bool selected(const RmaOptions& o, const std::string& name) {
  auto match = [&](const std::vector<std::string>& v) {
    for (const auto& p : v) {
      if (name.compare(0, p.size(), p) == 0) return true;
    }
    return false;
  };
  if (name.rfind("setup.", 0) == 0 || name == "teardown") return true;
  if (!o.only.empty() && !match(o.only)) return false;
  return !match(o.skip);
}

[[noreturn]] void rankMain(const RmaOptions& o, Shared* sh, int rank) {
  installCrashReport(("rank " + std::to_string(rank)).c_str());
  Rank k;
  k.o = &o;
  k.sh = sh;
  k.rank = rank;
  k.nranks = o.ranks;
  std::string why;
  if (!o.netns.empty()) {
    if (std::string e = joinNetns(o.netns[static_cast<size_t>(rank) % o.netns.size()]); !e.empty()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.c_str());
      _exit(5);
    }
  }
  k.api = RmaApi::load(o.plugin, o.symbol, o.table, &why);
  if (k.api == nullptr) _exit(3);
  if (o.mem == "cuda") {
    k.cu = CudaDriver::get(&why);
    if (k.cu == nullptr) _exit(4);
    installDeviceFaultReport();
  }
  const auto all = checks();
  for (size_t i = 0; i < all.size(); ++i) {
    const Check& c = all[i];
    sh->current[rank].store(static_cast<int>(i));
    auto& v = sh->verdicts[i][rank];
    std::string msg;
    int state;
    if (!selected(o, c.name)) {
      state = 3;
      msg = "not selected";
    } else if (std::string s = c.skip(k); !s.empty()) {
      state = 3;
      msg = s;
    } else {
      if (!k.barrier()) {
        state = 2;
        msg = "a rank did not reach the check";
      } else {
        msg = c.run(k);
        state = msg.empty() ? 1 : 2;
      }
    }
    std::snprintf(v.msg, sizeof(v.msg), "%s", msg.c_str());
    v.state.store(state);
    if (k.deadDone && std::strcmp(c.name, "faults.dead_rank") == 0) {
      // The survivors' comm has lost a rank: tearing it down is checked by closing it, nothing else.
      continue;
    }
  }
  std::fflush(stderr);
  _exit(0);
}

// The ranks: shared memory made before they fork (their bootstrap), one process each running `body(rank)`, which
// never returns. nullptr when the shared memory cannot be had.
Shared* forkRanks(int n, std::vector<pid_t>* pids, const std::function<void(Shared*, int)>& body) {
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) return nullptr;
  new (sh) Shared();
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      body(sh, r);
      _exit(0);
    }
    pids->push_back(pid);
  }
  return sh;
}

}  // namespace

int listRmaChecks() {
  for (const auto& c : checks()) std::printf("%-24s %s\n", c.name, c.what);
  return 0;
}

int runRmaConformance(const RmaOptions& o) {
  setRmaVerbose(o.verbose);
  if (o.ranks < 1 || o.ranks > kMaxRanks) {
    std::fprintf(stderr, "weft conformance --rma: --ranks wants 1 to %d\n", kMaxRanks);
    return 2;
  }
  std::string why;
  RmaApi* probe = RmaApi::load(o.plugin, o.symbol, o.table, &why);
  if (probe == nullptr) {
    std::fprintf(stderr, "weft conformance --rma: %s: %s\n", o.plugin.c_str(), why.c_str());
    return 2;
  }
  std::printf("# %s: %s (table v%d, \"%s\"), %d ranks, %s memory\n", o.plugin.c_str(), probe->symbol().c_str(),
              probe->version(), probe->name(), o.ranks, o.mem.c_str());
  std::fflush(stdout);
  std::vector<pid_t> pids;
  Shared* sh = forkRanks(o.ranks, &pids, [&](Shared* s, int r) { rankMain(o, s, r); });
  if (sh == nullptr) return 2;
  auto end = Clock::now() + std::chrono::seconds(o.timeoutSec);
  int alive = o.ranks;
  std::vector<int> exitCode(static_cast<size_t>(o.ranks), -1);
  bool hung = false;
  int crashed = -1;  // the first rank that a signal other than SIGKILL (the dead-rank victim's own) ended
  while (alive > 0) {
    int status = 0;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < o.ranks; ++r) {
        if (pids[r] == p) {
          sh->dead.fetch_or(1u << r);
          exitCode[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          --alive;
          if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL && crashed < 0) {
            // A crash: the others may wait on it forever inside the plugin (a connect with no deadline). They get a
            // short grace to say what they saw, then the run ends instead of waiting out --timeout.
            crashed = r;
            end = std::min(end, Clock::now() + std::chrono::seconds(kCrashGraceSec));
          }
        }
      }
      continue;
    }
    if (Clock::now() > end) {
      hung = true;
      for (int r = 0; r < o.ranks; ++r) {
        if (exitCode[r] < 0) kill(pids[r], SIGKILL);
      }
      while (waitpid(-1, nullptr, 0) > 0) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto all = checks();
  int failed = 0, passed = 0, skipped = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    int state = 0;
    std::string msg;
    bool allSkip = true;
    for (int r = 0; r < o.ranks; ++r) {
      const auto& v = sh->verdicts[i][r];
      const int s = v.state.load();
      if (s == 0) {
        // A rank with no verdict: it died before (the dead-rank check's victim is expected to), or it hung here.
        const bool victim = std::strcmp(all[i].name, "faults.dead_rank") == 0 && r == o.ranks - 1;
        if (victim || (i > 0 && std::strcmp(all[i - 1].name, "faults.dead_rank") == 0 && r == o.ranks - 1) ||
            (std::strcmp(all[i].name, "teardown") == 0 && r == o.ranks - 1 && sh->verdicts[i - 1][r].state == 0)) {
          continue;
        }
        if (sh->current[r].load() == static_cast<int>(i)) {
          // Every rank that stopped here is named: the one that crashed first, then those that hung after it.
          std::string m;
          if (exitCode[r] >= 0) {
            m = "rank " + std::to_string(r) + " ended here (exit " + std::to_string(exitCode[r]) + ")";
          } else if (crashed >= 0) {
            m = "rank " + std::to_string(r) + " hung here after rank " + std::to_string(crashed) + " crashed (signal " +
                std::to_string(exitCode[crashed] - 128) + ")";
          } else {
            m = "rank " + std::to_string(r) + " hung here (no verdict within --timeout)";
          }
          msg = state == 2 && !msg.empty() ? msg + "; " + m : m;
          state = 2;
        }
        continue;
      }
      if (s != 3) allSkip = false;
      if (s == 2 && state != 2) {
        state = 2;
        msg = "rank " + std::to_string(r) + ": " + v.msg;
      } else if (s == 3 && msg.empty()) {
        msg = v.msg;
      }
    }
    if (state == 0) state = allSkip ? 3 : 1;
    const char* word = state == 1 ? "PASS" : state == 2 ? "FAIL" : "SKIP";
    std::printf("%-4s %-24s %s%s\n", word, all[i].name, state == 1 ? "" : "", state == 1 ? all[i].what : msg.c_str());
    if (state == 1) ++passed;
    if (state == 2) ++failed;
    if (state == 3) ++skipped;
  }
  for (int r = 0; r < o.ranks; ++r) {
    if (exitCode[r] == 3 || exitCode[r] == 4) {
      std::printf("FAIL rank %d could not load the plugin or the CUDA driver\n", r);
      ++failed;
    }
    if (exitCode[r] == 5) {
      std::printf("FAIL rank %d could not join its network namespace (--netns)\n", r);
      ++failed;
    }
  }
  std::printf("# %d passed, %d failed, %d skipped%s\n", passed, failed, skipped, hung ? " (the run hung)" : "");
  munmap(sh, sizeof(Shared));
  return hung ? 1 : verdictExitCode(passed, failed);
}

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
