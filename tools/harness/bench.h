// SPDX-License-Identifier: Apache-2.0
// `weft bench`: moves data through any NCCL net plugin file from two processes, as NCCL's proxy would, and
// reports ping-pong latency (half round trip, median and p99), streaming bandwidth with NCCL_STEPS (8)
// messages in flight, N parallel connections, and NCCL's bidirectional step pattern. In the same run, the same
// patterns go through raw libfabric (tagged and RMA) on the same provider, and every figure gets its ratio to
// the better of the two. Every message's contents are verified outside the timed window.
#pragma once

#include <string>
#include <vector>

#include "process_pair.h"

namespace weft::harness {

struct BenchOptions {
  std::string plugin;
  int version = 0;
  int dev = 0;
  std::string fuse;  // as RunOptions::fuse
  bool quick = false;  // fewer iterations and sizes (the README's first command uses the full set)
  bool json = false;
  int rounds = 3;                                 // each point: median over this many alternating runs
  std::string patterns = "lat,bw,conns,steps";
  std::string latSizes;                           // comma-separated bytes (empty: the built-in list)
  std::string rawModes;                           // subset of raw-tagged,raw-rma,raw-tagged-1ep (empty: all)
  std::string connsList;                          // conns pattern: connection counts (empty: 1,2,4,8,16)
  size_t connsSize = 1 << 20;                     // conns pattern: message size
  int rawMaxConns = 16;                           // raw references open at most this many links (memory)
  std::string rawProvider, rawIface;              // the raw reference (empty provider: none)
  int busy = 0;                                   // busy-loop processes beside the workers (a host whose cores
                                                  // are all taken: data loaders on every core)
  PairOptions pair;
};

int runBench(const BenchOptions& o);
int runBenchWorker(int argc, char** argv);

}  // namespace weft::harness
