// SPDX-License-Identifier: Apache-2.0
// weft tune nccl-sim: NCCL's tuner calls through the real plugin file in a simulated world.
#include "tune_common.h"

namespace weft::tool::tune {

// An NCCL stand-in for tests and demos: for each size, NCCL's table from the reference model goes through the
// real tuner plugin file (getCollInfo as enqueue.cc calls it), NCCL's argmin picks, and the simulated world
// times the pick; printed as nccl-tests prints it.
// NCCL's logger as the simulated NCCL's: WARN always, INFO with NCCL_DEBUG=INFO, in NCCL's line format
// ("host:pid:tid [dev] NCCL INFO ...", src/debug.cc) on standard error.
void simLogger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  static const bool info = [] {
    const char* d = std::getenv("NCCL_DEBUG");
    return d != nullptr && strcasecmp(d, "INFO") == 0;
  }();
  if (level != NCCL_LOG_WARN && !(level == NCCL_LOG_INFO && info)) return;
  char host[64] = "localhost";
  gethostname(host, sizeof(host) - 1);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "%s:%d:%d [0] NCCL %s %s\n", host, static_cast<int>(getpid()), static_cast<int>(getpid()),
               level == NCCL_LOG_WARN ? "WARN" : "INFO", msg);
}

int ncclSimCommand(int argc, char** argv) {
  model::Topology topo;
  std::string tunerPath;
  int coll = 4, seed = 1;
  uint64_t lo = 64 << 10, hi = 256u << 20;
  harness::Args a("weft tune nccl-sim", argc, argv, 3);
  while (a.next()) {
    if (topoOption(a, topo)) continue;
    const std::string& f = a.flag();
    if (f == "--tuner") tunerPath = a.value();
    else if (f == "--coll") coll = collFromName(a.value());
    else if (f == "--seed") seed = a.number(0, 1 << 30);
    else if (f == "--min") lo = static_cast<uint64_t>(a.number(1, 1 << 30));
    else if (f == "--max") hi = static_cast<uint64_t>(a.number(1, 1 << 30)) * 4;
    else a.unknown();
  }
  if (tunerPath.empty() || coll < 0) {
    std::fprintf(stderr, "usage: weft tune nccl-sim --tuner libnccl-tuner-weft.so [--coll AllReduce] [--seed N] [topology]\n");
    return 2;
  }
  void* lib = dlopen(tunerPath.c_str(), RTLD_NOW | RTLD_LOCAL);
  // As NCCL 2.32 does: the v7 table where the file has one (constants for five compute capabilities), else v5.
  // v5, v6 and v7 share getCollInfo's and finalize's places; only init's constants differ.
  auto* tuner7 = lib ? static_cast<const ncclTuner_v7_t*>(dlsym(lib, "ncclTunerPlugin_v7")) : nullptr;
  auto* tuner = lib ? static_cast<const ncclTuner_v5_t*>(dlsym(lib, "ncclTunerPlugin_v5")) : nullptr;
  if (tuner == nullptr && tuner7 == nullptr) {
    std::fprintf(stderr, "weft tune nccl-sim: %s has neither ncclTunerPlugin_v7 nor _v5\n", tunerPath.c_str());
    return 1;
  }
  void* ctx = nullptr;
  ncclNvlDomainInfo_v5_t nvl{topo.nNodes, topo.ppn(), topo.ppn()};
  // The constants NCCL would pass: the model's (NCCL's defaults unless a profile gave others).
  const model::Constants& mk = topo.constants ? *topo.constants : model::ncclDefaults();
  ncclTunerConstants_v7_t consts7{};
  static_assert(sizeof(consts7) == sizeof(mk.baseLat) + sizeof(mk.hwLat) + 5 * sizeof(mk.llMaxBws),
                "the model's constants have tuner v7's shape");
  std::memcpy(&consts7, &mk, sizeof(consts7));
  ncclTunerConstants_v5_t consts5{};
  std::memcpy(consts5.baseLatencies, mk.baseLat, sizeof(mk.baseLat));
  std::memcpy(consts5.hwLatencies, mk.hwLat, sizeof(mk.hwLat));
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 3; ++s) {
      consts5.llMaxBws[r][s] = mk.llMaxBws[r][s];
      consts5.perChMaxRingLL128Bws[r][s] = mk.perChMaxRingLL128Bws[r][s];
      consts5.perChMaxTreeLL128Bws[r][s] = mk.perChMaxTreeLL128Bws[r][s];
      consts5.perChMaxTreeBws[r][s] = mk.perChMaxTreeBws[r][s];
      consts5.perChMaxNVLSTreeBws[r][s] = mk.perChMaxNvlsTreeBws[r][s];
    }
  ncclTunerGetCollInfoV4_t getCollInfo = tuner7 ? tuner7->getCollInfo : tuner->getCollInfo;
  auto finalize = tuner7 ? tuner7->finalize : tuner->finalize;
  if (tuner7 != nullptr) tuner7->init(&ctx, 0x51111, topo.nRanks, topo.nNodes, simLogger, &nvl, &consts7);
  else tuner->init(&ctx, 0x51111, topo.nRanks, topo.nNodes, simLogger, &nvl, &consts5);
  sim::WorldOptions wo;
  wo.seed = static_cast<uint64_t>(seed);
  sim::World w(topo, wo);
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 31 + static_cast<uint64_t>(getpid()));
  std::printf("# weft tune nccl-sim (simulated NCCL; nccl-tests output format): %s, %d ranks, %d nodes\n",
              collName(coll), topo.nRanks, topo.nNodes);
  std::printf("#\n#                                                              out-of-place                       in-place\n");
  std::printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
  std::printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n");
  for (uint64_t n = lo; n <= hi; n *= 2) {
    model::Table after = model::costTable(topo, coll, n, 1);  // the tuner changes the costs in place
    int nch = 0;
    getCollInfo(ctx, static_cast<ncclFunc_t>(coll), n, 1, reinterpret_cast<float**>(after.flat()), 7, 3, 0,
                       &nch);
    model::Pick pk = model::pick(after);
    Arm arm;
    arm.algo = static_cast<int8_t>(pk.algo);
    arm.proto = static_cast<int8_t>(pk.proto);
    arm.channels = static_cast<int16_t>(nch);
    double us = w.measureUs(coll, arm, n, rng), us2 = w.measureUs(coll, arm, n, rng);
    double alg = n / 1000.0 / us;
    std::printf("%12llu  %12llu     float     sum      -1  %7.2f %7.2f %7.2f      0  %7.2f %7.2f %7.2f      0\n",
                static_cast<unsigned long long>(n), static_cast<unsigned long long>(n / 4), us, alg, alg, us2,
                n / 1000.0 / us2, n / 1000.0 / us2);
  }
  finalize(ctx);
  std::printf("# Out of bounds values : 0 OK\n");
  return 0;
}

}  // namespace weft::tool::tune
