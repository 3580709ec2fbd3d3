// SPDX-License-Identifier: Apache-2.0
// Strict command-line parsing for the weft tool and its worker processes: a missing value or a number out of
// range is a clear error (exit 2), never a silent default.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "process_pair.h"

namespace weft::harness {

class Args {
 public:
  Args(const char* prog, int argc, char** argv, int first) : prog_(prog), argc_(argc), argv_(argv), i_(first - 1) {}
  bool next();                              // moves to the next flag; false at the end
  const std::string& flag() const { return flag_; }
  std::string value();                      // the current flag's value
  int number(int64_t lo, int64_t hi);       // the current flag's value as an integer in [lo, hi]
  [[noreturn]] void unknown() const;

 private:
  const char* prog_;
  int argc_;
  char** argv_;
  int i_;
  std::string flag_;
};

// --env, --recv-env, --send-env (KEY=VALUE), --recv-netns, --send-netns. True when the flag was one of them.
bool parsePairOption(Args& a, PairOptions& pair);

// What the driver passes to every worker it spawns.
struct WorkerArgs {
  std::string plugin, role, checks;
  int table = 0, oobFd = -1, dev = 0, timeoutSec = 60, callLimitMs = 10000;
  std::string fuse;  // devices to fuse with makeVDevice (as NCCL does at topology detection); the result is used
  bool quick = false, verbose = false;
  // Stop after the first check either worker fails (the runner starts a fresh pair for the rest), so that what a
  // failing check leaves in the plugin or the provider cannot fail the checks after it.
  bool isolate = false;
  std::string mem = "host";  // host | cuda (device buffers from the CUDA driver the loader finds)
  bool noDmabuf = false;     // as NCCL_DMABUF_ENABLE=0
  bool cudaContext = false;  // as in NCCL's process: the CUDA driver initialised, device 0's context current
  int64_t soakMessages = 0;  // soak.random: messages in all (0: the check's default)
  int cycles = 0;            // hygiene.*: cycles (0: the checks' defaults)
  int conns = 0;             // comms.scale: connections held at once (0: the check's default)
  int minFlows = 0;          // weft.tcp_flows: flows a large transfer must spread over (0: from WEFT_TCP_FLOWS)
  int maxEndpoints = -1;     // comms.scale: endpoints the plugin may report open per process (-1: not checked)
  std::string traceDir;      // diff.stream: trace files written here
  int maxRecvs = 0;          // diff.stream: grouped receives of at most this many buffers (0: the receiver's)
  // weft bench only: the raw libfabric reference (empty provider: none), rounds per point, which patterns.
  std::string rawProvider, rawIface, patterns = "lat,bw,conns,steps", latSizes, rawModes, connsList;
  int rawMaxConns = 16;
  size_t connsSize = 1 << 20;
  int rounds = 3;
};
WorkerArgs parseWorkerArgs(int argc, char** argv);

// `s` cut at every `sep`, empty pieces dropped.
std::vector<std::string> split(const std::string& s, char sep);

}  // namespace weft::harness
