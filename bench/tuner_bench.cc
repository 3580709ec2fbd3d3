// SPDX-License-Identifier: Apache-2.0
// The cost of weft's tuner on NCCL's enqueue path: one getCollInfo call through the exported v6 table of
// libnccl-tuner-weft.so, as NCCL's enqueue.cc makes it (a float[7][3] cost table copied fresh for each call,
// nChannels starting at 0), for a 16-rank, 2-node communicator, message sizes around 1 MiB.
// By default the tuner decides from a profile (a simulated sweep of AllReduce, AllGather and ReduceScatter for 16
// ranks on 2 nodes, 64 KiB to 256 MiB, written to a temporary file before the library loads); with --no-profile
// it has none and passes NCCL's choices through.
// Target (docs/tuning.md): under 100 ns a call on this machine kind. A timed unit test of this flaked on a busy
// CI machine (108 ns measured against 50 idle), so the figure lives here.
// Run: build/bin/weft_tuner_bench [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tuner/nccl_model.h"
#include "tuner/profile.h"
#include "tuner/sim.h"
#include "weft/nccl/tuner.h"

using namespace weft::tuner;

namespace {

void quietLog(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...) {}

const ncclTuner_v6_t* table() {
  static const ncclTuner_v6_t* t = [] {
    void* lib = dlopen(WEFT_TUNER_LIB_PATH, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      std::fprintf(stderr, "cannot load %s: %s\n", WEFT_TUNER_LIB_PATH, dlerror());
      return static_cast<const ncclTuner_v6_t*>(nullptr);
    }
    return static_cast<const ncclTuner_v6_t*>(dlsym(lib, "ncclTunerPlugin_v6"));
  }();
  return t;
}

void BM_GetCollInfo(benchmark::State& state) {
  const ncclTuner_v6_t* t = table();
  if (t == nullptr) {
    state.SkipWithError("the tuner library or its v6 table is missing");
    return;
  }
  model::Topology topo;
  topo.nRanks = 16;
  topo.nNodes = 2;
  ncclNvlDomainInfo_v5_t nvl{2, 8, 8};
  ncclTunerConstants_v5_t constants{};
  void* ctx = nullptr;
  if (t->init(&ctx, 0x5eed, 16, 2, quietLog, &nvl, &constants) != ncclSuccess) {
    state.SkipWithError("init failed");
    return;
  }
  model::Table m = model::costTable(topo, 4, 1 << 20, 1);
  float base[21];
  std::memcpy(base, m.flat(), sizeof(base));
  uint64_t i = 0;
  for (auto _ : state) {
    float cost[21];
    std::memcpy(cost, base, sizeof(cost));
    int nch = 0;
    t->getCollInfo(ctx, static_cast<ncclFunc_t>(4), (size_t{1} << 20) + (i++ & 7) * 4096, 1,
                   reinterpret_cast<float**>(cost), 7, 3, 0, &nch);
    benchmark::DoNotOptimize(cost);
    benchmark::DoNotOptimize(nch);
  }
  t->finalize(ctx);
}
BENCHMARK(BM_GetCollInfo);

}  // namespace

int main(int argc, char** argv) {
  bool profile = true;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-profile") == 0) {
      profile = false;
    } else {
      args.push_back(argv[i]);
    }
  }
  std::string path;
  if (profile) {
    char tmpl[] = "/tmp/weft-tuner-bench-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) return 2;
    close(fd);
    path = tmpl;
    model::Topology topo;
    topo.nRanks = 16;
    topo.nNodes = 2;
    sim::World w(topo, sim::WorldOptions{});
    std::vector<uint64_t> sizes;
    for (uint64_t n = 64 << 10; n <= (256u << 20); n *= 2) sizes.push_back(n);
    std::ofstream(path) << writeProfile(sim::sweep(w, {2, 3, 4}, sizes, 10, 7));
    setenv("WEFT_TUNER_PROFILE", path.c_str(), 1);  // before the library loads
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!path.empty()) unlink(path.c_str());
  return 0;
}
