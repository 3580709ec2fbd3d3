// SPDX-License-Identifier: Apache-2.0
// weft replay: drives a profiler plugin file (weft's, or any other) with the events of a small multi-rank job,
// one process per rank, the way NCCL would: what a job of data-parallel all-reduces, tensor-parallel small
// collectives, pipeline sends and an all-to-all produces. Optionally one rank is made a straggler: it enters every
// collective late, so (as on real GPUs) the others' kernels wait for it. With --tags the operations carry user tags
// as NCCL 2.32 passes them (1 forward: the tensor-parallel all-gather and reduce-scatter, 2 backward: the gradient
// all-reduce, 3 pipeline: the all-to-all and the send), and --straggler-tag N makes the straggler late only in that
// part of the step. Table v7 also gets each channel's barrier phases: the ranks that arrive first spend the wait in
// the initial sync. (The cost per call is measured by bench/telemetry_bench.cc.)
// With weft's profiler and WEFT_TELEMETRY_DIR set (--out), the records it leaves are a job `weft report` can read.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "replay.h"

namespace weft::tool {

namespace {

struct Options {
  std::string profiler;
  int table = 0;
  int ranks = 4;
  int nodes = 2;
  int colls = 40;
  int straggler = -1;
  int stragglerTag = 0;  // 0: late in every operation
  bool tags = false;
  int delayUs = 2000;
  int gpuLagMs = 0;
  std::string out;
  uint64_t commBase = 0x5eed0000;
  std::chrono::system_clock::time_point t0;
  int64_t periodUs = 0;
};

// The operations of one step of a training-like job, sized so the mix is visible.
constexpr uint64_t kTagForward = 1, kTagBackward = 2, kTagPipeline = 3;

// Whether the straggler is late for an operation of this tag.
bool lateFor(const Options& o, uint64_t tag) { return o.straggler >= 0 && (o.stragglerTag == 0 || tag == static_cast<uint64_t>(o.stragglerTag)); }

std::vector<replay::Op> jobOps(const Options& o, int rank, uint64_t step) {
  std::vector<replay::Op> ops;
  auto coll = [&](const char* func, uint64_t count, const char* algo, const char* proto, uint64_t baseNs, uint64_t tag) {
    replay::Op op;
    op.func = func;
    op.dtype = "ncclBfloat16";
    op.count = count;
    op.algo = algo;
    op.proto = proto;
    op.nChannels = 2;
    op.seq = step;
    op.userTag = o.tags ? tag : 0;
    // Everyone finishes together, when the last rank has arrived: a rank that arrives `delay` early spends
    // `delay` longer in the kernel, in its initial sync. GPU timers are in ns.
    bool others = lateFor(o, tag) && rank != o.straggler;
    uint64_t wait = others ? static_cast<uint64_t>(o.delayUs) * 1000 : 0;
    uint64_t t0 = 1000000 + step * 100000000ull;
    op.pStart = {t0, t0 + 10};
    op.pStop = {t0 + baseNs + wait, t0 + baseNs + wait - 100};
    // Barrier phases per channel (v7): a short sync when everyone is there, the compute, a short final sync.
    for (int ch = 0; ch < 2; ++ch) {
      uint64_t b0 = op.pStart[ch], b3 = op.pStop[ch];
      uint64_t b1 = b0 + 1000 + wait, b2 = b3 - 800;
      op.phases.push_back({b0, b1, b2, b3});
    }
    op.proxyPeers = {(rank + 1) % o.ranks};
    return op;
  };
  // data-parallel gradient all-reduce: 64 MiB, ~1.4 ms at ~90 GB/s busbw
  ops.push_back(coll("AllReduce", 32u << 20, "RING", "SIMPLE", 1400000 + 10000 * (step % 7), kTagBackward));
  // tensor-parallel small collectives
  ops.push_back(coll("AllGather", 16384, "RING", "LL", 25000 + 500 * (step % 5), kTagForward));
  ops.push_back(coll("ReduceScatter", 65536, "RING", "LL128", 40000 + 700 * (step % 3), kTagForward));
  // MoE-style all-to-all
  ops.push_back(coll("AlltoAll", 1u << 20, "RING", "SIMPLE", 300000, kTagPipeline));
  // pipeline send to the next stage
  replay::Op send;
  send.p2p = true;
  send.func = "Send";
  send.dtype = "ncclBfloat16";
  send.count = 4u << 20;
  send.peer = (rank + 1) % o.ranks;
  send.nChannels = 1;
  send.pStart = {5000};
  send.pStop = {5000 + 150000};
  send.userTag = o.tags ? kTagPipeline : 0;
  ops.push_back(send);
  return ops;
}

int runRank(const Options& o, int rank) {
  if (!o.out.empty()) setenv("WEFT_TELEMETRY_DIR", o.out.c_str(), 1);
  if (o.tags) setenv("WEFT_TAG_NAMES", "1=forward,2=backward,3=pipeline", 0);  // unless the caller named them
  std::unique_ptr<replay::Profiler> p;
  try {
    p = replay::Profiler::load(o.profiler, o.table);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft replay: %s\n", e.what());
    return 1;
  }
  p->setGpuLagMs(o.gpuLagMs);
  replay::Comm c;
  c.commHash = o.commBase;
  c.name = "replay";
  c.nNodes = o.nodes;
  c.nRanks = o.ranks;
  c.rank = rank;
  if (p->init(c) != 0) {
    std::fprintf(stderr, "weft replay: rank %d: init returned %d\n", rank, c.initResult);
    return 1;
  }
  bool late = rank == o.straggler;
  uint64_t events = 0;
  for (int s = 0; s < o.colls; ++s) {
    // Every rank starts step s at the same wall-clock time (as ranks kept in step by their collectives do); the
    // straggler enters each step late (its host is slow), or with --straggler-tag each operation of that tag,
    // which shows in the records' start times.
    bool wholeStep = late && o.stragglerTag == 0;
    auto at = o.t0 + std::chrono::microseconds(static_cast<int64_t>(s) * o.periodUs + (wholeStep ? o.delayUs : 0));
    std::this_thread::sleep_until(at);
    auto ops = jobOps(o, rank, static_cast<uint64_t>(s));
    if (!late || wholeStep) {
      events += p->run(c, ops);
      continue;
    }
    std::vector<replay::Op> batch;
    for (const auto& op : ops) {
      if (op.userTag == static_cast<uint64_t>(o.stragglerTag)) {
        if (!batch.empty()) events += p->run(c, batch);
        batch.clear();
        std::this_thread::sleep_for(std::chrono::microseconds(o.delayUs));
        events += p->run(c, {op});
      } else {
        batch.push_back(op);
      }
    }
    if (!batch.empty()) events += p->run(c, batch);
  }
  int rc = p->finalize(c);
  if (rank == 0) {
    std::printf("replay: %s (ncclProfiler_v%d), %d ranks, %d steps, %llu events per rank, finalize %s\n", p->name(),
                p->version(), o.ranks, o.colls, static_cast<unsigned long long>(events), rc == 0 ? "ok" : "failed");
  }
  return rc == 0 ? 0 : 1;
}

}  // namespace

int replayCommand(int argc, char** argv, const std::string& defaultProfiler) {
  Options o;
  o.profiler = defaultProfiler;
  std::fflush(stdout);
  harness::Args a("weft replay", argc, argv, 2);
  while (a.next()) {
    const std::string& f = a.flag();
    if (f == "--profiler") o.profiler = a.value();
    else if (f == "--table") o.table = a.number(1, 7);
    else if (f == "--ranks") o.ranks = a.number(1, 64);
    else if (f == "--nodes") o.nodes = a.number(1, 64);
    else if (f == "--steps") o.colls = a.number(1, 1000000);
    else if (f == "--straggler") o.straggler = a.number(0, 63);
    else if (f == "--tags") o.tags = true;
    else if (f == "--straggler-tag") o.stragglerTag = a.number(1, 3);
    else if (f == "--delay-us") o.delayUs = a.number(1, 10000000);
    else if (f == "--gpu-lag-ms") o.gpuLagMs = a.number(0, 600000);
    else if (f == "--out") o.out = a.value();
    else a.unknown();
  }
  if (o.stragglerTag != 0 && (!o.tags || o.straggler < 0)) {
    std::fprintf(stderr, "weft replay: --straggler-tag needs --tags and --straggler\n");
    return 2;
  }
  if (o.straggler >= o.ranks) {
    std::fprintf(stderr, "weft replay: --straggler %d is not a rank of %d\n", o.straggler, o.ranks);
    return 2;
  }
  o.periodUs = o.delayUs + 3000;
  o.t0 = std::chrono::system_clock::now() + std::chrono::milliseconds(200);
  std::vector<pid_t> kids;
  for (int r = 0; r < o.ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("weft replay: fork");
      return 1;
    }
    if (pid == 0) {
      int rc = runRank(o, r);
      std::fflush(stdout);
      _exit(rc);
    }
    kids.push_back(pid);
  }
  int failed = 0;
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
  }
  if (failed) std::fprintf(stderr, "weft replay: %d rank(s) failed\n", failed);
  return failed ? 1 : 0;
}

}  // namespace weft::tool
