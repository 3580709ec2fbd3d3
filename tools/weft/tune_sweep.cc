// SPDX-License-Identifier: Apache-2.0
// weft tune sweep: a command (nccl-tests) run once per candidate through the tuner, parsed into a profile.
#include "tune_common.h"

namespace weft::tool::tune {

// ---- nccl-tests output ------------------------------------------------------------------------------------

struct TestRow {
  uint64_t bytes;
  double timeUs;
};

// Rows of an nccl-tests table (both layouts: with and without the root column). The out-of-place time is taken,
// as nccl-tests' own busbw column is. Lines that are not table rows are skipped.
std::vector<TestRow> parseNcclTests(const std::string& out, std::string* error) {
  std::vector<TestRow> rows;
  int timeCol = -1;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<std::string> tok;
    std::string t;
    while (ls >> t) tok.push_back(t);
    if (tok.empty()) continue;
    if (tok[0] == "#") {
      if (tok.size() > 4 && tok[1] == "size" && tok[2] == "count") {
        for (size_t i = 1; i < tok.size(); ++i)
          if (tok[i] == "time") {
            timeCol = static_cast<int>(i) - 1;  // data rows have no leading '#'
            break;
          }
      }
      continue;
    }
    if (timeCol < 0 || static_cast<int>(tok.size()) <= timeCol + 2) continue;
    char* end = nullptr;
    unsigned long long bytes = std::strtoull(tok[0].c_str(), &end, 10);
    if (*end != 0) continue;
    double us = std::strtod(tok[timeCol].c_str(), &end);
    if (*end != 0 || !(us > 0) || bytes == 0) continue;
    rows.push_back({bytes, us});
  }
  if (rows.empty() && error) *error = timeCol < 0 ? "no nccl-tests table header (# size count ... time ...)" : "no rows";
  return rows;
}

int collOfCommand(const std::string& cmd) {
  if (cmd.find("all_reduce") != std::string::npos) return 4;
  if (cmd.find("all_gather") != std::string::npos) return 2;
  if (cmd.find("reduce_scatter") != std::string::npos) return 3;
  if (cmd.find("broadcast") != std::string::npos) return 0;
  if (cmd.find("reduce_perf") != std::string::npos) return 1;
  return -1;
}

bool runCapture(const std::string& cmd, const std::vector<std::pair<std::string, std::string>>& env, std::string* out,
                int* status) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return false;
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    close(pipefd[1]);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) out->append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  waitpid(pid, status, 0);
  return true;
}

// Candidates x channel caps; false (said on stderr) for an entry that is not ALGO/PROTO.
bool parseArms(const std::string& candidates, const std::string& channels, std::vector<Arm>* arms) {
  for (const auto& c : harness::split(candidates, ',')) {
    auto slash = c.find('/');
    int al = algoFromName(c.substr(0, slash)), pr = slash == std::string::npos ? -1 : protoFromName(c.substr(slash + 1));
    if (al < 0 || pr < 0) {
      std::fprintf(stderr, "weft tune sweep: '%s' is not ALGO/PROTO\n", c.c_str());
      return false;
    }
    for (const auto& ch : harness::split(channels, ',')) {
      Arm arm;
      arm.algo = static_cast<int8_t>(al);
      arm.proto = static_cast<int8_t>(pr);
      arm.channels = static_cast<int16_t>(std::stoi(ch));
      arms->push_back(arm);
    }
  }
  return true;
}

// The profile being swept: resumed where one is there (its measurements kept, its done candidates listed), with
// where it comes from; false (said on stderr) when the file there is not a profile.
bool openSweepProfile(const std::string& outPath, const std::string& command, const std::string& via, Profile* prof,
                      std::set<std::string>* done) {
  // Resume: a profile already there keeps its measurements and says which candidates are done.
  std::string err;
  if (std::ifstream(outPath).good()) {
    auto old = loadProfile(outPath, 0, 0, &err);
    if (!old) {
      std::fprintf(stderr, "weft tune sweep: %s exists but is not a profile (%s); not overwriting it\n", outPath.c_str(),
                   err.c_str());
      return false;
    }
    *prof = *old;
    for (const auto& d : harness::split(prof->source["done"], ' ')) done->insert(d);
  }
  prof->source["tool"] = "weft tune sweep";
  prof->source["command"] = command;
  prof->source["via"] = via;
  std::string envList;
  for (const char* k : {"NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_ALGO", "NCCL_PROTO", "NCCL_IB_HCA",
                        "NCCL_SOCKET_IFNAME", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "WEFT_PROVIDER"})
    if (const char* v = std::getenv(k)) envList += fmt::format("{}{}={}", envList.empty() ? "" : " ", k, v);
  prof->source["env"] = envList;
  return true;
}

// The environment that forces one candidate: through weft's tuner (WEFT_TUNER_FORCE) or NCCL's own variables.
std::vector<std::pair<std::string, std::string>> armEnv(const Arm& arm, const std::string& via,
                                                        const std::string& recordPath) {
  std::vector<std::pair<std::string, std::string>> env = {{"WEFT_TUNER_RECORD", recordPath}};
  if (via == "tuner") {
    env.push_back({"WEFT_TUNER_FORCE", arm.channels > 0 ? fmt::format("{}/{}/{}", algoName(arm.algo), protoName(arm.proto), arm.channels)
                                                        : fmt::format("{}/{}", algoName(arm.algo), protoName(arm.proto))});
  } else {
    std::string algo = arm.algo == 0 ? "Tree" : arm.algo == 1 ? "Ring" : algoName(arm.algo);
    env.push_back({"NCCL_ALGO", algo});
    env.push_back({"NCCL_PROTO", arm.proto == 2 ? "Simple" : protoName(arm.proto)});
    if (arm.channels > 0) {
      env.push_back({"NCCL_MIN_NCHANNELS", std::to_string(arm.channels)});
      env.push_back({"NCCL_MAX_NCHANNELS", std::to_string(arm.channels)});
    }
  }
  return env;
}

// What the tuner recorded in one run (WEFT_TUNER_RECORD): the topology and masks, NCCL's model at the swept sizes
// (the first run that saw an entry gives it), and the sizes where the forced entry was not available.
void foldRecord(const std::string& recordPath, int coll, const std::map<uint64_t, std::vector<double>>& times,
                Profile* prof, std::set<std::tuple<uint64_t, int, int>>* modelSeen, std::set<uint64_t>* unavailable) {
  std::string rerr;
  if (auto rec = loadProfile(recordPath, 0, 0, &rerr)) {
    if (prof->sig.nRanks == 0) prof->sig = rec->sig;
    if (rec->constants && !prof->constants) prof->constants = rec->constants;  // NCCL's, as its init gave them
    for (int c = 0; c < kNumColls; ++c)
      if (rec->sig.masks[c] && !prof->sig.masks[c]) prof->sig.masks[c] = rec->sig.masks[c];
    // NCCL's model at the swept sizes (the first run that saw an entry gives it).
    for (const ModelPoint& m : rec->model)
      if (m.coll == coll && times.count(m.bytes) && modelSeen->insert({m.bytes, m.algo, m.proto}).second)
        prof->model.push_back(m);
    for (const auto& item : harness::split(rec->source["forced_unavailable"], ',')) {
      auto colon = item.find(':');
      if (colon != std::string::npos && std::stoi(item.substr(0, colon)) == coll)
        for (const auto& [b, v] : times)
          if (sizeBucket(b) == std::stoi(item.substr(colon + 1))) unavailable->insert(b);
    }
  }
}

int sweepCommand(int argc, char** argv) {
  std::string command, outPath, candidates = "TREE/LL,TREE/LL128,TREE/SIMPLE,RING/LL,RING/LL128,RING/SIMPLE";
  std::string channels = "0", via = "tuner";
  int coll = -1, repeat = 5, ranks = 0, nodes = 0;
  harness::Args a("weft tune sweep", argc, argv, 3);
  while (a.next()) {
    const std::string& f = a.flag();
    if (f == "--command") command = a.value();
    else if (f == "--out") outPath = a.value();
    else if (f == "--coll") coll = collFromName(a.value());
    else if (f == "--candidates") candidates = a.value();
    else if (f == "--channels") channels = a.value();
    else if (f == "--repeat") repeat = a.number(1, 100);
    else if (f == "--via") via = a.value();
    else if (f == "--ranks") ranks = a.number(1, 1 << 20);
    else if (f == "--nodes") nodes = a.number(1, 1 << 20);
    else a.unknown();
  }
  if (coll < 0) coll = collOfCommand(command);
  if (command.empty() || outPath.empty() || coll < 0 || (via != "tuner" && via != "env")) {
    std::fprintf(stderr, "usage: weft tune sweep --command 'CMD' --out PROFILE [--coll NAME (else from the command: "
                         "all_reduce_perf ...)] [--candidates ALGO/PROTO,...] [--channels 0,8] [--repeat N] "
                         "[--via tuner|env] [--ranks N --nodes M]\n"
                         "(--repeat: runs per candidate, default 5; with noisy runs use 7 or more: see docs/tuning.md)\n");
    return 2;
  }
  std::vector<Arm> arms;
  if (!parseArms(candidates, channels, &arms)) return 2;
  Profile prof;
  std::set<std::string> done;
  std::string err;
  if (!openSweepProfile(outPath, command, via, &prof, &done)) return 1;
  std::string recordPath = outPath + ".record.json";
  std::set<std::tuple<uint64_t, int, int>> modelSeen;  // (bytes, algo, proto) of prof.model
  for (const ModelPoint& m : prof.model)
    if (m.coll == coll) modelSeen.insert({m.bytes, m.algo, m.proto});
  size_t total = arms.size(), idx = 0;
  const bool tty = isatty(2) != 0;
  for (const Arm& arm : arms) {
    ++idx;
    std::string name = armName(arm);
    std::string key = fmt::format("{}:{}", collName(coll), name);
    if (done.count(key)) {
      std::fprintf(stderr, "[%zu/%zu] %s: done before, skipped\n", idx, total, name.c_str());
      continue;
    }
    std::map<uint64_t, std::vector<double>> times;
    std::set<uint64_t> unavailable;
    for (int r = 0; r < repeat; ++r) {
      int bar = static_cast<int>(30.0 * ((idx - 1) * repeat + r) / (total * repeat));
      if (tty) {
        std::fprintf(stderr, "\r[%s%s] %zu/%zu %-20s run %d/%d ", std::string(bar, '#').c_str(),
                     std::string(30 - bar, '.').c_str(), idx, total, name.c_str(), r + 1, repeat);
      } else if (r == 0) {
        std::fprintf(stderr, "[%zu/%zu] %s x %d\n", idx, total, name.c_str(), repeat);
      }
      auto env = armEnv(arm, via, recordPath);
      std::remove(recordPath.c_str());
      std::string out;
      int status = 0;
      if (!runCapture(command, env, &out, &status) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "\nweft tune sweep: the command failed for %s (exit %d); the profile keeps what is done\n",
                     name.c_str(), WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return 1;
      }
      auto rows = parseNcclTests(out, &err);
      if (rows.empty()) {
        std::fprintf(stderr, "\nweft tune sweep: %s: %s\n", name.c_str(), err.c_str());
        return 1;
      }
      for (const auto& row : rows) times[row.bytes].push_back(row.timeUs);
      foldRecord(recordPath, coll, times, &prof, &modelSeen, &unavailable);
    }
    for (auto& [bytes, v] : times) {
      if (unavailable.count(bytes) || bytes == 0) continue;  // NCCL ran its own pick there, not this candidate
      prof.measurements.push_back(summarize(coll, bytes, arm, v, 0.02));  // nccl-tests prints averages: >= 2%
    }
    done.insert(key);
    std::string d;
    for (const auto& x : done) d += (d.empty() ? "" : " ") + x;
    prof.source["done"] = d;
    if (ranks > 0) prof.sig.nRanks = ranks;
    if (nodes > 0) prof.sig.nNodes = nodes;
    if (prof.sig.nRanks == 0) {
      std::fprintf(stderr, "\nweft tune sweep: no WEFT_TUNER_RECORD came back (is weft's tuner loaded?); give --ranks "
                           "and --nodes\n");
      return 1;
    }
    std::string tmp = outPath + ".tmp";
    if (!svg::writeFile(tmp, writeProfile(prof), &err) || std::rename(tmp.c_str(), outPath.c_str()) != 0) {
      std::fprintf(stderr, "\nweft tune sweep: cannot write %s: %s\n", outPath.c_str(), err.c_str());
      return 1;
    }
  }
  std::remove(recordPath.c_str());
  if (tty) std::fprintf(stderr, "\r[%s] %zu/%zu done%30s\n", std::string(30, '#').c_str(), total, total, "");
  std::printf("profile %s: %zu measurements for %d ranks on %d nodes\n", outPath.c_str(), prof.measurements.size(),
              prof.sig.nRanks, prof.sig.nNodes);
  return 0;
}

}  // namespace weft::tool::tune
