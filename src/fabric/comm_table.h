// SPDX-License-Identifier: Apache-2.0
// The comms one endpoint group serves, and the one place their completions are routed (shared endpoints).
//
// A completion of a comm's own operation (a tagged send or receive, an offer, an RMA write) carries the OpContext
// it was posted with, which names the comm's id; a remote write into one of our buffers names the receiving comm
// in its completion data (fabric/wire.h):
//   - 8-byte form (WriteImm): the id sits in [63:46], so the upper 32 bits are never 0 (ids start at 1);
//   - 4-byte form with the id (WriteImmId, where the provider reports the write's length): upper 32 bits 0;
//   - 4-byte form carrying the length (WriteImm32): no id. A comm whose writes arrive in that form must be the
//     only comm of its group (attach refuses a second one beside it), and every 4-byte write goes to it.
// A completion naming an id that is not (or no longer) in the table is counted and dropped: it never reaches
// another comm's buffers, and the comms in the table are undisturbed. One naming a comm detached within the last
// `closedHold` (the peer's offers for receives that went eagerly, still on their way when NCCL closed it) is
// expected at teardown: counted, said once at INFO. Any other is warned about (the first, then every 1024th).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric/op_context.h"
#include "weft/common/status.h"

namespace weft::fabric {

class CommTable {
 public:
  using Clock = std::chrono::steady_clock;
  explicit CommTable(std::string where = {}, std::chrono::milliseconds closedHold = std::chrono::seconds(10))
      : where_(std::move(where)), closedHold_(closedHold) {}

  // legacy32: the comm's remote writes come in the 4-byte form that names no comm. Refused (with a warning)
  // where the id is already in the table, or a legacy32 comm would share the table with another comm.
  Status attach(uint32_t id, DataSink* sink, bool legacy32);
  // Removes the id (no-op when absent). Completions naming it from now on are strays.
  void detach(uint32_t id, Clock::time_point now = Clock::now());
  DataSink* find(uint32_t id) const;
  size_t size() const { return comms_.size(); }
  // Whether another comm may join: false while a legacy32 comm is in the table.
  bool shareable() const { return legacy_ == 0; }

  // Where a completion goes; nullptr (counted as a stray, warned) when its comm is not in the table.
  // what: the completion's kind, for the warning.
  DataSink* forId(uint32_t id, const char* what) {
    if (id == lastId_ && last_ != nullptr) return last_;
    return lookup(id, what);
  }
  DataSink* forContext(const OpContext* ctx) { return forId(ctx->comm, "an operation's completion"); }
  // Comms that asked to be called once the batch of completions being read is over (DataSink::afterBatch): what
  // they gathered over the batch (delivery acknowledgements) leaves as one message. Run by the endpoint after each
  // batch; a comm leaving the table leaves the list.
  void defer(DataSink* s) { deferred_.push_back(s); }
  void runDeferred();
  DataSink* forRemoteData(uint64_t data) { return forId(remoteDataComm(data), "a remote write"); }
  // The id a remote write's completion data names under this table's forms (0: none).
  uint32_t remoteDataComm(uint64_t data) const;

  uint64_t strays() const { return strays_ + lateStrays_; }
  uint64_t lateStrays() const { return lateStrays_; }  // of them, for comms detached within closedHold
  size_t closedRemembered() const { return closed_.size(); }

 private:
  DataSink* lookup(uint32_t id, const char* what);

  std::string where_;  // the device, for warnings
  std::unordered_map<uint32_t, DataSink*> comms_;
  uint32_t lastId_ = 0;        // the last id found, and its comm: most completions in a row are one comm's
  DataSink* last_ = nullptr;
  uint32_t legacy_ = 0;        // the comm whose writes carry no id (0: none)
  uint64_t strays_ = 0;
  uint64_t lateStrays_ = 0;
  std::chrono::milliseconds closedHold_;
  std::unordered_map<uint32_t, Clock::time_point> closed_;  // detached id -> when (pruned as it grows)
  size_t pruneAt_ = 64;
  std::vector<DataSink*> deferred_;
};

}  // namespace weft::fabric
