// SPDX-License-Identifier: Apache-2.0
// The device API's comms in the dumps (telemetry/sink.h, LedgerSource): their registration and the "conn" lines of
// their peers, in the net connections' schema (docs/hangs.md).
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "telemetry/sink.h"

namespace weft::telemetry {

uint32_t registerLedger(LedgerSource s) { return Sink::instance().addLedger(std::move(s)); }
void unregisterLedger(uint32_t id) { Sink::instance().removeLedger(id); }

uint32_t Sink::addLedger(LedgerSource s) {
  std::lock_guard<std::mutex> lock(mu_);
  startLocked();
  const uint32_t id = nextConnId_++;
  ledgers_.emplace(id, std::move(s));
  return id;
}

void Sink::removeLedger(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);  // a dump reading it holds this: the comm stays until the dump is done
  // A comm that closes in trouble (a peer lost just before: NCCL tears down at once) writes the dump it asked for
  // first, with its own lines in it.
  if (started_) stallDumpLocked();
  ledgers_.erase(id);
}

std::string Sink::ledgerLinesLocked(int64_t nowMs, size_t* lines) {
  std::string out;
  for (const auto& [id, src] : ledgers_) {
    std::vector<PeerLedger> peers;
    if (!src.read || !src.read(&peers)) {
      out += fmt::format(R"j({{"type":"error","what":"the device API's comm {} (rank {} of {} on {}) could not be read now (its set-up holds it)"}})j",
                         id, src.rank, src.nranks, jsonEscape(src.device)) + "\n";
      continue;
    }
    for (const PeerLedger& p : peers) {
      std::string ops;
      for (const LedgerOp& op : p.ops) {
        ops += fmt::format(R"({}{{"op":"{}","bytes":{},"done":{},"age_s":{:.3f}}})", ops.empty() ? "" : ",", op.kind,
                           op.bytes, op.done, static_cast<double>(std::max<int64_t>(nowMs - op.postMs, 0)) / 1e3);
      }
      const double oldest =
          p.ops.empty() ? 0.0 : static_cast<double>(std::max<int64_t>(nowMs - p.ops.front().postMs, 0)) / 1e3;
      out += fmt::format(
          R"({{"type":"conn","conn":{},"dir":"rma","peer":"{}","local":"{}","device":"{}","rank":{},"nranks":{},"peer_rank":{},"peer_name":"{}","msgs":0,"bytes":{},"lat_p50_us":0,"stalls":{},"stalled_s":{:.3f},"stall_kind":"{}","inflight":{},"oldest_s":{:.3f},"unledgered":{},"ops":[{}]}})",
          id, jsonEscape(p.peer), jsonEscape(p.local), jsonEscape(src.device), src.rank, src.nranks, p.rank,
          jsonEscape(p.name), p.moved, p.stalls,
          p.stalledSinceMs > 0 ? static_cast<double>(std::max<int64_t>(nowMs - p.stalledSinceMs, 0)) / 1e3 : 0.0,
          stallKindName(p.kind), p.inflight, oldest, p.inflight > p.ops.size() ? p.inflight - p.ops.size() : 0, ops) +
             "\n";
      ++*lines;
    }
  }
  return out;
}

}  // namespace weft::telemetry
