// SPDX-License-Identifier: Apache-2.0
#include "weft/telemetry/record_reader.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace weft::telemetry {

LineKind parseRecordLine(const std::string& line, OpRecord* op, std::string* comm, std::string* commName,
                         std::string* error, ConnRecord* conn) {
  if (line.empty()) return LineKind::kEmpty;
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    *error = "not a JSON object";
    return LineKind::kMalformed;
  }
  if (j.value("v", 0) != kRecordSchema) {
    *error = "record schema version " + (j.contains("v") ? j["v"].dump() : std::string("missing")) +
             " (this weft reads " + std::to_string(kRecordSchema) + ")";
    return LineKind::kOtherSchema;
  }
  try {
    const std::string type = j.value("type", "");
    if (type == "comm") {
      *comm = j.value("comm", "");
      *commName = j.value("comm_name", "");
      return LineKind::kComm;
    }
    if (type == "conn" && conn != nullptr) {
      ConnRecord c;
      c.host = j.value("host", "?");
      c.pid = j.value("pid", 0);
      c.dir = j.value("dir", "");
      c.peer = j.value("peer", "");
      c.device = j.value("device", "");
      c.msgs = j.value("msgs", uint64_t{0});
      c.bytes = j.value("bytes", uint64_t{0});
      c.stalls = j.value("stalls", uint64_t{0});
      c.numa = j.value("numa", -1);
      c.gpu = j.value("gpu", "");
      c.gpuPath = j.value("gpu_path", "");
      if (j.contains("rails")) {
        for (const auto& x : j.at("rails")) {
          RailRecord r;
          r.device = x.at("device").get<std::string>();
          r.up = x.value("up", true);
          r.downs = x.value("downs", uint64_t{0});
          r.recoveries = x.value("recoveries", uint64_t{0});
          r.lastDown = x.value("last_down", "none");
          r.msgs = x.value("msgs", uint64_t{0});
          r.bytes = x.value("bytes", uint64_t{0});
          r.failovers = x.value("failovers", uint64_t{0});
          r.moved = x.value("moved", uint64_t{0});
          r.readmits = x.value("readmits", uint64_t{0});
          r.msgsSinceReadmit = x.value("msgs_since_readmit", uint64_t{0});
          c.rails.push_back(std::move(r));
        }
      }
      *conn = std::move(c);
      return LineKind::kConn;
    }
    if (type != "coll" && type != "p2p") return LineKind::kOther;
    OpRecord r;
    r.type = type;
    r.comm = j.at("comm").get<std::string>();
    r.host = j.value("host", "?");
    r.pid = j.value("pid", 0);
    r.rank = j.at("rank").get<int>();
    r.nRanks = j.value("nranks", 0);
    r.nNodes = j.value("nnodes", 0);
    r.peer = j.value("peer", -1);
    r.seq = j.value("seq", uint64_t{0});
    r.func = j.at("func").get<std::string>();
    r.algo = j.value("algo", "");
    r.proto = j.value("proto", "");
    r.timing = j.value("timing", "");
    r.bytes = j.at("bytes").get<uint64_t>();
    r.startNs = j.value("start_ns", uint64_t{0});
    r.endNs = j.value("end_ns", uint64_t{0});
    r.execNs = j.at("exec_ns").get<uint64_t>();
    r.partial = j.value("partial", false);
    r.tag = j.value("tag", uint64_t{0});
    r.tagName = j.value("tag_name", "");
    r.channelsPhased = j.value("channels_phased", 0);
    if (r.channelsPhased > 0) {
      const auto& ph = j.at("phases_ns");
      if (!ph.is_array() || ph.size() != 3) throw std::runtime_error("phases_ns is not an array of 3");
      for (int i = 0; i < 3; ++i) r.phaseNs[i] = ph.at(i).get<uint64_t>();
    }
    *op = std::move(r);
    return LineKind::kOp;
  } catch (const std::exception& e) {
    *error = e.what();
    return LineKind::kMalformed;
  }
}

std::vector<std::string> recordFiles(const std::string& path, std::string* error) {
  std::vector<std::string> out;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    *error = path + ": no such file or directory";
    return out;
  }
  if (!S_ISDIR(st.st_mode)) {
    out.push_back(path);
    return out;
  }
  DIR* d = opendir(path.c_str());
  if (d == nullptr) {
    *error = path + ": cannot open the directory";
    return out;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 6 && n.compare(n.size() - 6, 6, ".jsonl") == 0) names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) out.push_back(path + "/" + n);
  return out;
}

}  // namespace weft::telemetry
