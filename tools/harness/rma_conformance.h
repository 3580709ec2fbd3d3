// SPDX-License-Identifier: Apache-2.0
// weft conformance --rma: drives any plugin file's device-API proxy table (GIN v11-v13, RMA v13-v17, or a named data
// symbol such as NCCL's own ncclGinIbProxy) the way NCCL's proxy does, with 2-8 ranks as processes forked from the
// driver and joined through shared memory (NCCL's bootstrap). Every rank runs the same checks in lockstep; a check
// passes when it passes on every live rank. Checks whose names start with "weft." test weft's own promises
// (garbage handles refused, for one), not NCCL's contract: another plugin may fail them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::harness {

struct RmaOptions {
  std::string plugin;
  std::string symbol;  // empty: the newest table the file exports
  int table = 0;       // the version of `symbol` when its name does not say
  int ranks = 2;
  int dev = 0;
  std::string mem = "host";  // host | cuda (windows in device memory from the CUDA driver the loader finds)
  std::vector<std::string> only, skip;
  int64_t soakOps = 1000000;  // soak.million: operations in all ranks together
  int timeoutSec = 300;       // the whole run; a check still running then is reported as hung
  int deadBoundSec = 30;      // faults.dead_rank: a dead rank must fail requests within this
  bool verbose = false;
  std::vector<std::string> netns;  // --netns A,B: rank r runs in namespace r % 2 (faults.link_down)
  int procs = 0;  // weft bench --rma --procs P: the scale run, ranks / P a process as threads
};

// 0 all passed (skips allowed), 1 a check failed or hung, 2 the plugin could not be used.
int runRmaConformance(const RmaOptions& o);
int listRmaChecks();
// weft bench --rma: put+signal round trip (ranks 0 and 1), put bandwidth (each rank to the next, 1 MiB puts, 32 in
// flight) and signal rate (size-0 signals, 128 in flight), one line of figures.
int runRmaBench(const RmaOptions& o);
// weft bench --rma --procs P (tools/harness/rma_scale.cc): one comm of --ranks N (up to 4096), N / P ranks a process
// as threads; set-up time per step and resident memory per rank, one line.
int runRmaScale(const RmaOptions& o);

}  // namespace weft::harness
