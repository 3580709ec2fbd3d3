// SPDX-License-Identifier: Apache-2.0
// The conformance driver and its worker processes. The driver loads the plugin once to report clearly when the
// file is not a usable net plugin, then starts two workers (receiving rank and sending rank), optionally each
// inside its own network namespace and with its own environment, joined by a socketpair that plays NCCL's
// bootstrap. Every check's verdict is printed as one line; the last line counts them.
#pragma once

#include <string>
#include <vector>

#include "process_pair.h"

namespace weft::harness {

struct RunOptions {
  std::string plugin;
  int version = 0;  // 0: newest exported
  std::vector<std::string> only;  // check names (or prefixes); empty: all
  std::vector<std::string> skip;  // check names (or prefixes) reported as skipped without running
  bool quick = false;
  bool verbose = false;
  int64_t soakMessages = 0;  // soak.random: how many messages (0: 20,000; 2,000 with --quick)
  int cycles = 0;            // hygiene.*: cycles (0: 2,000 connect and 10,000 register cycles; fewer with --quick)
  int conns = 0;             // comms.scale: connections held at once (0: 64; 16 with --quick)
  int minFlows = 0;          // weft.tcp_flows: flows a large transfer must spread over (0: from WEFT_TCP_FLOWS)
  int maxEndpoints = -1;     // comms.scale: libfabric endpoints a worker may hold open (plugin-reported; -1: any)
  std::string traceDir;      // diff.stream: each role writes DIR/recv.trace, DIR/send.trace
  int maxRecvs = 0;          // diff.stream: buffers per grouped receive at most (0: the receiver's maxRecvs)
  int dev = -1;     // -1: device 0
  std::string fuse;  // "0,1": the workers fuse these devices with makeVDevice and test the fused one
  int timeoutSec = 60;
  int callLimitMs = 10000;  // backstop: a connect/accept/listen call taking longer has blocked
  std::string mem = "host";  // "cuda": the data checks run between device buffers (Check::device), others left out
  bool noDmabuf = false;     // --mem cuda: register with regMr even where NCCL_PTR_DMABUF is advertised
  bool cudaContext = false;  // the workers make device 0's context current first, as NCCL's threads have (host buffers)
  PairOptions pair;  // this executable, namespaces and environments of the two workers
};

// Exit status: 0 all passed (skips allowed), 1 some check failed, 2 the plugin could not be used at all.
int runConformance(const RunOptions& opts);
// Runs diff.stream on each of two plugin files (the same seeded stream; grouped receives no larger than either
// offers) and compares what their receivers observed: 0 identical, 1 different (printed), 2 a run failed.
int runDiff(const RunOptions& a, const RunOptions& b);
int runWorker(int argc, char** argv);
int listChecks();

}  // namespace weft::harness
