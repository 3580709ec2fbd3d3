// SPDX-License-Identifier: Apache-2.0
// The device API's ledger (docs/hangs.md): what an RMA comm tells the dumps (weft inspect, stall dumps, weft report
// --hangs) of each of its peers: what waits on it, its stalls, whether it was lost. The RMA transport fills it under its comm's
// lock; the telemetry writer formats it as the dumps' "conn" lines, the net connections' schema.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weft/common/rail_health.h"

namespace weft {

struct LedgerOp {
  const char* kind = "";  // put, get, signal (a put of no bytes), flush
  uint64_t bytes = 0;     // the operation's size
  uint64_t done = 0;      // bytes of it that left (a put) or arrived (a get) so far
  int64_t postMs = 0;     // coarse clock (weft/common/clock.h) at iput/iget
};

struct PeerLedger {
  int rank = -1;        // the peer's rank in the comm
  std::string name;     // as the transport's warnings name it
  std::string peer;     // the pair's far end as this end names it, and this end as the far end names it ("" unknown)
  std::string local;
  uint64_t moved = 0;   // bytes moved with the peer, both ways
  uint64_t stalls = 0;  // stall episodes reported (WEFT_STALL_S)
  int64_t stalledSinceMs = 0;  // 0: not stalled now
  StallKind kind = StallKind::kNone;  // the current stall's, or why the peer was lost
  uint32_t inflight = 0;              // operations of ours waiting on the peer
  std::vector<LedgerOp> ops;          // the oldest of them first, at most kMaxOps
  static constexpr size_t kMaxOps = 16;
};

}  // namespace weft
