// SPDX-License-Identifier: Apache-2.0
// The cost of weft's timing on NCCL's threads: what one profiler call costs, measured through the same
// version-independent entry points every exported table calls (the table adapters add a descriptor copy).
//   BM_CollectiveLifecycle: one collective as NCCL 2.27+ reports it with WEFT_TIMING=coll: Coll start/stop and
//     two kernel channels (start, KernelChStop state, stop), the record handed to the writer's ring.
//   BM_CollectiveTagged: the same collective carrying a user tag (NCCL 2.32, profiler v7).
//   BM_CollectiveTaggedPhases: ... and each channel's three barrier phases (start, KernelPhaseStop state, stop)
//     before the channel stops, as NCCL 2.32 reports kernels that time their barriers: 25 calls.
//   BM_ProxyStep: one proxy step (start, state with transSize, stop) with WEFT_TIMING=proxy.
//   BM_StartStopSentinel: an event weft does not time (group, API events).
// Run: build/bin/weft_telemetry_bench [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "telemetry/profiler_core.h"
#include "telemetry/sink.h"
#include "weft/nccl/profiler.h"

using namespace weft::telemetry;

namespace {

void* context(int version) {
  static void* ctx = [version] {
    setenv("WEFT_TIMING", "proxy", 1);
    void* c = nullptr;
    int mask = 0;
    InitArgs a;
    a.version = version;
    a.hasComm = true;
    a.commHash = 0xbe0c4;
    a.commName = "bench";
    a.nRanks = 8;
    a.nNodes = 2;
    a.rank = 0;
    attachWriter();  // as the profiler plugin does: the writer drains the rings while the benchmark runs
    initContext(&c, &mask, a);
    return c;
  }();
  return ctx;
}

EventDesc collDesc() {
  EventDesc d;
  d.type = EvType::kColl;
  d.func = Func::kAllReduce;
  d.dtype = 7;
  d.count = 1 << 20;
  d.algo = 1;
  d.proto = 2;
  d.nChannels = 2;
  d.nWarps = 16;
  return d;
}

// One collective: Coll start/stop, two kernel channels (start, [three phases,] KernelChStop state, stop).
void collective(benchmark::State& state, bool tagged, bool phases) {
  void* ctx = context(5);
  EventDesc coll = collDesc();
  EventDesc kch;
  kch.type = EvType::kKernelCh;
  EventDesc ph;
  ph.type = EvType::kKernelPhase;
  uint64_t seq = 0;
  for (auto _ : state) {
    coll.seq = seq++;
    coll.userTag = tagged ? 1 + (seq & 3) : 0;
    void* h = startEvent(ctx, coll);
    stopEvent(h);
    for (int ch = 0; ch < 2; ++ch) {
      kch.parent = h;
      kch.pTimer = 1000;
      void* k = startEvent(ctx, kch);
      if (phases) {
        static const uint64_t kBounds[4] = {1000, 3000, 48000, 50000};
        for (int p = 0; p < 3; ++p) {
          ph.parent = k;
          ph.phaseId = static_cast<uint8_t>(p);
          ph.pTimer = kBounds[p];
          void* x = startEvent(ctx, ph);
          recordState(x, ncclProfilerKernelPhaseStop, kBounds[p + 1], true);
          stopEvent(x);
        }
      }
      recordState(k, ncclProfilerKernelChStop, 50000, true);
      stopEvent(k);
    }
    benchmark::DoNotOptimize(h);
    if ((seq & 1023) == 0) {
      state.PauseTiming();
      Sink::instance().flush();
      state.ResumeTiming();
    }
  }
  state.counters["events_per_op"] = phases ? 25 : 7;  // 1 Coll (start+stop) + 2 channels (+3 phases each)
}
void BM_CollectiveLifecycle(benchmark::State& state) { collective(state, false, false); }
void BM_CollectiveTagged(benchmark::State& state) { collective(state, true, false); }
void BM_CollectiveTaggedPhases(benchmark::State& state) { collective(state, true, true); }
BENCHMARK(BM_CollectiveLifecycle);
BENCHMARK(BM_CollectiveTagged);
BENCHMARK(BM_CollectiveTaggedPhases);

void BM_ProxyStep(benchmark::State& state) {
  void* ctx = context(5);
  EventDesc op;
  op.type = EvType::kProxyOp;
  op.pid = getpid();
  op.peer = 1;
  op.isSend = 1;
  void* opH = startEvent(ctx, op);
  EventDesc step;
  step.type = EvType::kProxyStep;
  step.parent = opH;
  for (auto _ : state) {
    void* s = startEvent(ctx, step);
    recordState(s, ncclProfilerProxyStepSendWait, 65536, true);
    stopEvent(s);
    benchmark::DoNotOptimize(s);
  }
  stopEvent(opH);
}
BENCHMARK(BM_ProxyStep);

void BM_StartStopSentinel(benchmark::State& state) {
  void* ctx = context(5);
  EventDesc g;
  g.type = EvType::kGroupApi;
  for (auto _ : state) {
    void* h = startEvent(ctx, g);
    stopEvent(h);
    benchmark::DoNotOptimize(h);
  }
}
BENCHMARK(BM_StartStopSentinel);

void BM_WallClock(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(wallNs());
}
BENCHMARK(BM_WallClock);

// The ledger of operations in flight (docs/hangs.md): what each isend/irecv and its completion add on NCCL's thread
// with timing on (the post time is the one the latency histogram already takes), with 8 others in flight.
void BM_LedgerPostDone(benchmark::State& state) {
  weft::telemetry::ConnStats c;
  for (int i = 0; i < 8; ++i) c.ledgerPost(1 + static_cast<uint64_t>(i), 8, i, 1);
  uint64_t t = 100;
  for (auto _ : state) {
    const int slot = c.ledgerPost(++t, 8, 7, 1);
    benchmark::DoNotOptimize(slot);
    c.ledgerDone(slot);
  }
}
BENCHMARK(BM_LedgerPostDone);

}  // namespace

BENCHMARK_MAIN();
