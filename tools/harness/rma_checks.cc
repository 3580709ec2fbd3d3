// SPDX-License-Identifier: Apache-2.0
// weft conformance --rma's checks, in the order every rank runs them (the table is checks() at the end).
#include <dirent.h>
#include <linux/tcp.h>  // tcpi_bytes_acked (glibc's <netinet/tcp.h> lacks it; the two do not mix)
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "netns.h"
#include "rma_rank.h"
#include "self_exec.h"

namespace weft::harness::rmacheck {
namespace {

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
}  // namespace

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

// Rank 0's 16 puts of kSlot bytes to rank 1 (its source's first kSlot bytes to the start of rank 1's window), then
// a size-0 strong signal to `slot`: the requests, or why they could not be posted.
std::string putsToRank1(Rank& k, int slot, std::vector<void*>* reqs) {
  for (int i = 0; i < 16; ++i) {
    void* req = nullptr;
    int r = k.api->iput(k.ctx, 0, 0, k.src.mh, kSlot, 0, k.dst.mh, 1, 0, &req);
    if (r != 0) return callFailed("iput", r);
    reqs->push_back(req);
  }
  void* sreq = nullptr;
  int r = k.api->iputSignal(k.ctx, 0, 0, nullptr, 0, 0, nullptr, 1, 8 * slot, k.sig.mh, 1, 1, true, 0, &sreq);
  if (r != 0) return callFailed("iputSignal(size 0)", r);
  reqs->push_back(sreq);
  return "";
}

// weft's promise (docs/hangs.md): an operation that waits on a rank whose proxy stops progressing is named in a stall
// line once WEFT_STALL_S passes, and nothing is lost: rank 1 makes no call for 3.5 s while rank 0 puts 64 MiB to it,
// then a signal; every byte of the last put is there when the signal is. The line itself is checked by the suite's
// entry (rma.stall_line.*) in rank 0's output.
std::string stallLine(Rank& k) {
  if (k.rank == 0) {
    const auto data = fill(0, 99, kSlot);
    k.write(k.src, 0, data.data(), kSlot);
  }
  if (!k.barrier()) return "a rank did not fill its source";
  if (k.rank == 0) {
    std::vector<void*> reqs;
    if (std::string e = putsToRank1(k, kStallSlot, &reqs); !e.empty()) return e;
    for (void* q : reqs) {
      if (std::string e = k.wait(q, "a put to the rank that holds off"); !e.empty()) return e;
    }
  } else if (k.rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // NCCL's proxy here calls nothing meanwhile
    const uint64_t want = ++k.sigExpected[kStallSlot];
    if (!k.until([&] { return k.signal(kStallSlot) >= want; }, 60)) return "the signal after the held-off puts never came";
    if (std::string e = compare(k, k.dst, 0, fill(0, 99, kSlot), "the last held-off put"); !e.empty()) return e;
  }
  return k.barrier() ? "" : "a rank did not finish";
}

// Bytes each TCP socket of this process has had acknowledged (the kernel's count, TCP_INFO), by descriptor.
std::vector<std::pair<int, uint64_t>> tcpBytesAcked() {
  std::vector<std::pair<int, uint64_t>> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == ::dirfd(d)) continue;
    tcp_info ti{};
    socklen_t len = sizeof(ti);
    if (::getsockopt(fd, 6 /* IPPROTO_TCP */, TCP_INFO, &ti, &len) != 0) continue;
    if (len < offsetof(tcp_info, tcpi_bytes_acked) + sizeof(ti.tcpi_bytes_acked)) continue;
    out.emplace_back(fd, ti.tcpi_bytes_acked);
  }
  ::closedir(d);
  return out;
}

// Data flows a pair of this comm has: WEFT_TCP_RMA_FLOWS where it says N > 1; where it leaves the count to the NIC
// (unset or 0), what this rank's established TCP sockets say (a control flow and the data flows to each peer).
int rmaDataFlows(const Rank& k) {
  const char* v = std::getenv("WEFT_TCP_RMA_FLOWS");
  if (v != nullptr && std::atoi(v) != 0) return std::atoi(v) > 1 ? std::atoi(v) : 0;
  int established = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == ::dirfd(d)) continue;
    tcp_info ti{};
    socklen_t len = sizeof(ti);
    if (::getsockopt(fd, 6 /* IPPROTO_TCP */, TCP_INFO, &ti, &len) == 0 && ti.tcpi_state == 1 /* ESTABLISHED */) {
      ++established;
    }
  }
  ::closedir(d);
  const int perPeer = k.nranks > 1 ? established / (k.nranks - 1) : 0;
  return perPeer > 1 ? perPeer - 1 : 0;
}

// weft's TCP sockets with data flows (WEFT_TCP_RMA_FLOWS=N > 1, or the NIC's count, docs/device-api.md): rank 0's 64 MiB of 4 MiB puts to
// rank 1 travel on the pair's data flows, not its control flow, and over several of them: at least min(N, 4)
// sockets each carry a fair part (10%, or half an even share where N > 5), and the control flow under 1%. Counted
// by the kernel, outside the plugin: the bytes each of rank 0's TCP sockets had acknowledged, before and after. The
// bytes land whole, shown by a signal after them (the data flows' order, docs/device-api.md).
std::string rmaFlows(Rank& k) {
  const int flows = rmaDataFlows(k);
  if (k.rank == 0) {
    const auto data = fill(0, 123, kSlot);
    k.write(k.src, 0, data.data(), kSlot);
  }
  if (!k.barrier()) return "a rank did not fill its source";
  std::vector<std::pair<int, uint64_t>> before;
  if (k.rank == 0) {
    before = tcpBytesAcked();
    std::vector<void*> reqs;
    if (std::string e = putsToRank1(k, kFlowsSlot, &reqs); !e.empty()) return e;
    for (void* q : reqs) {
      if (std::string e = k.wait(q, "a put of the 64 MiB"); !e.empty()) return e;
    }
  } else if (k.rank == 1) {
    const uint64_t want = ++k.sigExpected[kFlowsSlot];
    if (!k.until([&] { return k.signal(kFlowsSlot) >= want; }, 60)) return "the signal after the puts never came";
    if (std::string e = compare(k, k.dst, 0, fill(0, 123, kSlot), "the last of the 64 MiB's puts"); !e.empty()) return e;
  }
  if (!k.barrier()) return "a rank did not finish";  // rank 1 has every byte: rank 0's sockets have them acknowledged
  if (k.rank == 0) {
    const auto after = tcpBytesAcked();
    std::vector<uint64_t> moved;
    uint64_t total = 0;
    for (const auto& [fd, bytes] : after) {
      for (const auto& [fd0, bytes0] : before) {
        if (fd0 == fd && bytes > bytes0) moved.push_back(bytes - bytes0);
      }
    }
    for (uint64_t m : moved) total += m;
    std::sort(moved.rbegin(), moved.rend());
    std::string shares;
    for (uint64_t m : moved) shares += fmt::format("{}{:.1f}%", shares.empty() ? "" : " ", 100.0 * m / total);
    std::fprintf(stderr, "  rank 0: %zu sockets moved %.1f MiB: %s\n", moved.size(), total / 1048576.0, shares.c_str());
    const uint64_t payload = uint64_t{16} * kSlot;  // putsToRank1's
    if (total < payload) {
      return fmt::format("rank 0's TCP sockets had {} bytes acknowledged, fewer than the {} put", total, payload);
    }
    const int want = std::min(flows, 4);
    const double fair = flows > 5 ? 0.5 / flows : 0.10;
    int carrying = 0;
    for (uint64_t m : moved) carrying += static_cast<double>(m) >= fair * static_cast<double>(total) ? 1 : 0;
    if (carrying < want) {
      return fmt::format("with {} data flows a pair the 64 MiB went over {} socket(s) with {:.1f}% or more each "
                         "({}; {} expected)", flows, carrying, 100 * fair, shares, want);
    }
    if (moved.size() <= static_cast<size_t>(flows) || moved.back() * 100 > total) {
      // Every socket a pair has carried part of it (pieces on each data flow, the frames on the control flow):
      // the least must be the control flow's few frames.
      return fmt::format("no socket carried under 1% (the control flow's frames alone): the payload did not leave "
                         "the control flow ({})", shares);
    }
  }
  return k.barrier() ? "" : "a rank did not finish";
}

// weft's promise (docs/hangs.md) for the device API: rank 1 stops progressing (its application in compute) while
// rank 0's 64 MiB of puts wait on it. Rank 0's stall dump is written (WEFT_TELEMETRY_DIR/hangs), rank 1's ledger is
// read live (`weft inspect --json --pid`, saved beside it: its inspect thread answers while its proxy makes no
// call), and `weft report --hangs` over the two must name rank 1's process as where every chain of waits ends and
// show rank 0's puts as the device API's ("--rma"). Then rank 1 progresses and the last put lands whole.
std::string rmaHangReport(Rank& k) {
  const std::string dir = std::getenv("WEFT_TELEMETRY_DIR");
  volatile uint64_t* word = &k.sh->words[1][kMaxRanks - 1];  // rank 1's pid, then 0 once rank 0 is done
  if (k.rank == 1) *word = static_cast<uint64_t>(::getpid());
  if (k.rank == 0) {
    const auto data = fill(0, 131, kSlot);
    k.write(k.src, 0, data.data(), kSlot);
  }
  if (!k.barrier()) return "a rank did not fill its source";
  if (k.rank == 0) {
    const uint64_t peer = *word;
    std::vector<void*> reqs;
    if (std::string e = putsToRank1(k, kHangSlot, &reqs); !e.empty()) return e;
    // The stall line, then the record writer's round (100 ms) writes this process's dump.
    if (!k.until([&] { return hasDump(dir, ::getpid()); }, 30)) {
      *word = 0;
      return "no stall dump of rank 0 in " + dir + "/hangs while its puts waited on rank 1";
    }
    // With WEFT_PROM_FILE (one a process: %p), this process's file shows the stalled peer too.
    std::string promMissing;
    if (const char* pf = std::getenv("WEFT_PROM_FILE"); pf != nullptr && std::strstr(pf, "%p") != nullptr) {
      std::string path = pf;
      path.replace(path.find("%p"), 2, std::to_string(::getpid()));
      const std::string want = "peer_rank=\"1\"}";
      bool stalled = false, counted = false;
      k.until([&] {
        FILE* f = std::fopen(path.c_str(), "r");
        if (f == nullptr) return false;
        char line[512];
        while (std::fgets(line, sizeof(line), f) != nullptr) {
          const std::string l = line;
          const size_t sp = l.rfind(' ');
          const double v = sp == std::string::npos ? 0 : std::atof(l.c_str() + sp + 1);
          if (l.find(want) == std::string::npos) continue;
          stalled |= l.rfind("weft_rma_stalled_seconds{", 0) == 0 && v > 0;
          counted |= l.rfind("weft_rma_stalls_total{", 0) == 0 && v >= 1;
        }
        std::fclose(f);
        return stalled && counted;
      }, 10);
      if (!stalled || !counted) promMissing = path + " did not show rank 1 stalled (weft_rma_stalled_seconds, weft_rma_stalls_total) within 10 s";
    }
    const std::string live = runWeft("inspect --json --pid " + std::to_string(peer));
    {
      FILE* f = std::fopen((dir + "/hangs/inspect-" + std::to_string(peer) + ".json").c_str(), "w");
      if (f != nullptr) {
        std::fwrite(live.data(), 1, live.size(), f);
        std::fclose(f);
      }
    }
    const std::string report = reportHangs(dir);
    *word = 0;  // rank 1 goes on
    for (void* q : reqs) {
      if (std::string e = k.wait(q, "a put to the rank that held off"); !e.empty()) return e;
    }
    const std::string first = report.substr(0, report.find('\n'));
    std::fprintf(stderr, "  rank 0: %s\n", first.c_str());
    if (first.find("every chain of waits ends at ") == std::string::npos ||
        first.find(" pid " + std::to_string(peer)) == std::string::npos) {
      return "weft report --hangs did not name rank 1 (pid " + std::to_string(peer) + ") as where the waits end: " +
             report;
    }
    if (report.find("--rma on ") == std::string::npos) {
      return "weft report --hangs did not show rank 0's wait as the device API's: " + report;
    }
    if (!promMissing.empty()) return promMissing;
  } else if (k.rank == 1) {
    // In compute: no call to the plugin until rank 0 has its report (at most 60 s).
    const auto end = Clock::now() + std::chrono::seconds(60);
    while (*word != 0 && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const uint64_t want = ++k.sigExpected[kHangSlot];
    if (!k.until([&] { return k.signal(kHangSlot) >= want; }, 60)) return "the signal after the held-off puts never came";
    if (std::string e = compare(k, k.dst, 0, fill(0, 131, kSlot), "the last held-off put"); !e.empty()) return e;
  }
  return k.barrier() ? "" : "a rank did not finish";
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
      {"weft.stall_line", "a rank that holds off for 3.5 s while 64 MiB of puts wait on it: named in a stall line, "
                          "nothing lost",
       [](Rank& k) {
         std::string s = needConnected(k);
         if (!s.empty()) return s;
         const char* v = std::getenv("WEFT_STALL_S");
         if (k.nranks < 2 || v == nullptr || std::atoi(v) < 1 || std::atoi(v) > 2) {
           return std::string("needs 2 ranks and WEFT_STALL_S of 1 or 2 (its line is what the suite checks)");
         }
         return std::string();
       },
       stallLine},
      {"weft.rma_flows", "weft's TCP sockets with data flows: 64 MiB of puts travel on several, not the control "
                         "flow, and land whole",
       [](Rank& k) {
         std::string s = needConnected(k);
         if (!s.empty()) return s;
         if (k.nranks < 2) return std::string("needs 2 ranks");
         if (rmaDataFlows(k) < 2) {
           return std::string("the pairs have no data flows (WEFT_TCP_RMA_FLOWS=1, one flow on this NIC, or not "
                              "weft's TCP sockets)");
         }
         return std::string();
       },
       rmaFlows},
      {"weft.rma_hang_report", "a rank that stops progressing while 64 MiB of puts wait on it: weft report --hangs "
                               "over the stall dump and its live ledger names it",
       [](Rank& k) {
         std::string s = needConnected(k);
         if (!s.empty()) return s;
         const char* stall = std::getenv("WEFT_STALL_S");
         const char* dir = std::getenv("WEFT_TELEMETRY_DIR");
         if (k.nranks != 2 || stall == nullptr || std::atoi(stall) < 1 || std::atoi(stall) > 2 || dir == nullptr ||
             *dir == '\0') {
           return std::string("needs 2 ranks, WEFT_STALL_S of 1 or 2 and WEFT_TELEMETRY_DIR");
         }
         return std::string();
       },
       rmaHangReport},
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

}  // namespace weft::harness::rmacheck
