// SPDX-License-Identifier: Apache-2.0
// Reading weft's timing records back (the JSON lines src/telemetry/sink.cc writes under WEFT_TELEMETRY_DIR): the
// one place the tools parse them (weft report, weft profile merge), beside the writer, at the schema version the
// writer stamps on every line (kRecordSchema).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::telemetry {

// The "v" of every line the writer emits.
constexpr int kRecordSchema = 1;

// A collective or p2p operation's record ("type": "coll" or "p2p"), the fields the tools use.
struct OpRecord {
  std::string type, comm, host, func, algo, proto, timing;
  int pid = 0, rank = -1, nRanks = 0, nNodes = 0, peer = -1;
  uint64_t seq = 0, bytes = 0, startNs = 0, endNs = 0, execNs = 0;
  bool partial = false;
  uint64_t tag = 0;          // the user's tag (NCCL 2.32+; 0 untagged or an older record)
  std::string tagName;       // WEFT_TAG_NAMES's name for it, where the writer had one
  uint64_t phaseNs[3] = {};  // kernel phases (initial sync, compute, final sync), longest channel's
  int channelsPhased = 0;    // 0: no phases recorded
};

// A weft connection's closing record ("type": "conn"): what the tools use, with its rails where it had several.
struct RailRecord {
  std::string device, lastDown;
  bool up = true;
  uint64_t downs = 0, recoveries = 0, msgs = 0, bytes = 0;
  uint64_t failovers = 0, moved = 0;  // rail failover (absent from older records: 0)
  uint64_t readmits = 0, msgsSinceReadmit = 0;  // re-admission after a failover (likewise)
};
struct ConnRecord {
  std::string host, dir, peer, device;
  int pid = 0;
  int numa = -1;                // the NIC's NUMA node (-1: not recorded)
  std::string gpu, gpuPath;     // the GPU's bus id and its path to the NIC ("PIX" ... "SYS"), where recorded
  uint64_t msgs = 0, bytes = 0;
  uint64_t stalls = 0;          // stalls it reported (WEFT_STALL_S, docs/hangs.md)
  std::vector<RailRecord> rails;
};

enum class LineKind {
  kOp,           // an operation: *op is set
  kConn,         // a connection's record: *conn is set (only when the caller passed one)
  kComm,         // a communicator's opening record: *commName set (may be empty)
  kOther,        // another record type (peer, conn, comm_end): nothing to take
  kEmpty,        // a blank line
  kMalformed,    // not a JSON object, or an operation without its required fields: *error says which
  kOtherSchema,  // another schema version: *error names it
};

// One line. `comm` is set for kComm (the communicator's id) together with commName. A connection record is kConn
// where `conn` is given, kOther otherwise.
LineKind parseRecordLine(const std::string& line, OpRecord* op, std::string* comm, std::string* commName,
                         std::string* error, ConnRecord* conn = nullptr);

// The record files of a WEFT_TELEMETRY_DIR (every *.jsonl in it, by name; none in an empty one), or `path` itself
// when it is a file; empty with `error` set when it cannot be read.
std::vector<std::string> recordFiles(const std::string& path, std::string* error);

}  // namespace weft::telemetry
