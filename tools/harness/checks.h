// SPDX-License-Identifier: Apache-2.0
// The conformance checks: each semantic point NCCL relies on (docs/nccl-semantics.md) as its own named check.
// Every check runs in both worker processes at once, one as the receiving rank and one as the sending rank, talking through the
// plugin and through the out-of-band channel (NCCL's bootstrap).
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_memory.h"
#include "oob.h"
#include "plugin_loader.h"

namespace weft::harness {

enum class Role { kRecv, kSend };

struct CheckEnv {
  Role role;
  NetApi& net;
  Oob& oob;
  void* ctx = nullptr;  // v11+ per-communicator context
  int dev = 0;
  Props props;
  bool isWeft = false;   // the plugin under test is weft (enables checks of weft's own guarantees)
  bool quick = false;    // skip the 1 GiB and other long checks
  int64_t soakMessages = 0;  // soak.random: messages in all (0: default)
  int cycles = 0;            // hygiene.*: cycles (0: default)
  int conns = 0;             // comms.scale: connections (0: default)
  int minFlows = 0;          // weft.tcp_flows: flows a large transfer must spread over (0: from WEFT_TCP_FLOWS)
  int maxEndpoints = -1;     // comms.scale: plugin-reported endpoints allowed open (-1: not checked)
  std::string traceDir;      // diff.stream: where each role writes what it observed (weft diff compares them)
  int maxRecvs = 0;          // diff.stream: buffers per grouped receive at most (0: what the receiver offers)
  const LoadedPlugin* plugin = nullptr;  // the file under test (its optional self-reported figures)
  // --mem cuda: the checks that move data do it between device buffers (Check::device); dmabuf: registered
  // through regMrDmaBuf, as NCCL does where the device advertises NCCL_PTR_DMABUF.
  MemKind mem = MemKind::kHost;
  bool dmabuf = false;
  std::chrono::seconds timeout{60};
  // A backstop, not the test of non-blocking (connect.nonblocking withholds the peer for that): a single
  // listen/connect/accept call on a live peer that takes longer than this has blocked by any measure. Below it, a
  // slow call (endpoint set-up on a loaded machine) is only reported, as the slowest of its check.
  std::chrono::milliseconds callLimit{10000};
  struct SlowestCall {
    double ms = 0;
    std::string what;
  } slowestCall;  // of the current check
  bool peerGone = false;  // set by a check that ends the peer process: no verdict exchange, no further checks
  std::string verdictOverride;  // a check whose own process is about to die reports through this
  bool recv() const { return role == Role::kRecv; }
};

struct CheckFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct CheckSkip : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct PeerAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Check {
  std::string name;
  std::string what;  // one line: the behaviour it proves
  void (*run)(CheckEnv&);
  bool device = false;  // moves its data through env.mem buffers (runs under --mem cuda; others are skipped)
};

const std::vector<Check>& allChecks();
const char* resultName(ncclResult_t r);

}  // namespace weft::harness
