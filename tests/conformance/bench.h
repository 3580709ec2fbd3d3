// `weft bench`: moves data through any NCCL net plugin file from two processes, as NCCL's proxy would, and
// reports ping-pong latency (half round trip, median and p99) and streaming bandwidth with NCCL_STEPS (8)
// messages in flight. Every message's contents are verified on arrival outside the timed window.
#pragma once

#include <string>
#include <vector>

#include "process_pair.h"

namespace weft::harness {

struct BenchOptions {
  std::string plugin;
  int version = 0;
  int dev = 0;
  bool quick = false;  // fewer iterations and sizes (the README's first command uses the full set)
  bool json = false;
  PairOptions pair;
};

int runBench(const BenchOptions& o);
int runBenchWorker(int argc, char** argv);

}  // namespace weft::harness
