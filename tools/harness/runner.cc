// SPDX-License-Identifier: Apache-2.0
#include "runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "check_support.h"
#include "args.h"
#include "checks.h"
#include "crash_report.h"
#include "process_pair.h"
#include "verdict.h"

namespace weft::harness {
namespace {

bool selected(const std::string& name, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  for (const auto& o : only) {
    if (name == o || name.rfind(o, 0) == 0) return true;
  }
  return false;
}

std::string oneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  return s;
}

}  // namespace

int listChecks() {
  for (const auto& c : allChecks()) std::printf("%-30s %s\n", c.name.c_str(), c.what.c_str());
  return 0;
}

namespace {

// The device's maxRecvs as the plugin reports it, asked in this process (with the workers' common environment).
int probeMaxRecvs(const RunOptions& o, std::string* error) {
  std::vector<std::pair<std::string, std::string>> saved;
  for (const auto& kv : o.pair.env) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = kv.substr(0, eq);
    const char* old = std::getenv(k.c_str());
    saved.emplace_back(k, old != nullptr ? std::string("=") + old : std::string());
    setenv(k.c_str(), kv.c_str() + eq + 1, 1);
  }
  int maxRecvs = 0;
  {
    auto plugin = LoadedPlugin::open(o.plugin, o.version, error);
    if (plugin) {
      void* ctx = nullptr;
      int n = 0;
      Props props;
      if (plugin->api().init(&ctx, 0xD1FF) == ncclSuccess && plugin->api().devices(&n) == ncclSuccess && n > 0 &&
          plugin->api().getProperties(o.dev < 0 ? 0 : o.dev, &props) == ncclSuccess) {
        maxRecvs = props.maxRecvs;
      } else {
        *error = "init/devices/getProperties failed";
      }
      plugin->api().finalize(ctx);
    }
  }
  for (const auto& [k, v] : saved) {
    if (v.empty()) unsetenv(k.c_str());
    else setenv(k.c_str(), v.c_str() + 1, 1);
  }
  return maxRecvs;
}

std::vector<std::string> readLines(const std::string& path) {
  std::vector<std::string> out;
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return out;
  char line[4096];
  while (std::fgets(line, sizeof(line), f)) {
    std::string l(line);
    while (!l.empty() && l.back() == '\n') l.pop_back();
    if (!l.empty() && l[0] != '#') out.push_back(l);
  }
  std::fclose(f);
  return out;
}

}  // namespace

int runDiff(const RunOptions& a, const RunOptions& b) {
  std::string why;
  const int ma = probeMaxRecvs(a, &why);
  if (ma <= 0) {
    std::fprintf(stderr, "weft diff: %s: %s\n", a.plugin.c_str(), why.c_str());
    return 2;
  }
  const int mb = probeMaxRecvs(b, &why);
  if (mb <= 0) {
    std::fprintf(stderr, "weft diff: %s: %s\n", b.plugin.c_str(), why.c_str());
    return 2;
  }
  const int m = std::min({ma, mb, 8});
  char tmpl[] = "/tmp/weft-diff-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 2;
  const std::string dir = tmpl;
  std::vector<std::string> traces[2];
  const RunOptions* runs[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    RunOptions o = *runs[i];
    o.only = {"diff.stream"};
    o.traceDir = dir + (i == 0 ? "/a" : "/b");
    o.maxRecvs = m;
    mkdir(o.traceDir.c_str(), 0700);
    std::printf("== %s (maxRecvs %d; the stream uses %d)\n", o.plugin.c_str(), i == 0 ? ma : mb, m);
    std::fflush(stdout);
    if (runConformance(o) != 0) {
      std::printf("weft diff: the stream failed on %s: nothing to compare\n", o.plugin.c_str());
      std::filesystem::remove_all(dir);
      return 2;
    }
    traces[i] = readLines(o.traceDir + "/recv.trace");
    if (traces[i].empty()) {  // a missing trace must not compare equal to another missing one
      std::printf("weft diff: %s left no trace in %s\n", o.plugin.c_str(), o.traceDir.c_str());
      return 2;
    }
  }
  size_t differ = 0;
  const size_t n = std::max(traces[0].size(), traces[1].size());
  for (size_t i = 0; i < n; ++i) {
    const std::string& x = i < traces[0].size() ? traces[0][i] : std::string("(none)");
    const std::string& y = i < traces[1].size() ? traces[1][i] : std::string("(none)");
    if (x == y) continue;
    if (++differ <= 10) std::printf("differ: %s\n    vs: %s\n", x.c_str(), y.c_str());
  }
  if (differ > 0) {
    std::printf("weft diff: %zu of %zu grouped receives differ (sizes reported, or bytes up to 64 past a message); "
                "traces kept in %s\n", differ, n, dir.c_str());
    return 1;
  }
  std::printf("weft diff: the same %zu grouped receives on both: sizes reported and bytes up to 64 past every "
              "message\n", n);
  std::filesystem::remove_all(dir);  // kept only where they differ, for reading
  return 0;
}

int runConformance(const RunOptions& o) {
  std::string error;
  if (o.pair.pidNs && !pidNamespacesWork(&error)) {
    std::printf("SKIP: --pid-ns: %s\n", error.c_str());
    return 77;
  }
  auto plugin = LoadedPlugin::open(o.plugin, o.version, &error);
  if (!plugin) {
    std::fprintf(stderr, "weft conformance: %s\n", error.c_str());
    return 2;
  }
  std::string versions;
  for (int v : plugin->exported()) versions += (versions.empty() ? "v" : ", v") + std::to_string(v);
  std::printf("plugin  %s\nname    %s\ntables  %s; testing v%d\n", o.plugin.c_str(), plugin->api().name(),
              versions.c_str(), plugin->api().version());
  RunOptions opts = o;
  opts.version = plugin->api().version();
  plugin.reset();

  std::vector<std::string> checks, excluded;
  int hostOnly = 0;
  for (const auto& c : allChecks()) {
    if (!selected(c.name, o.only)) continue;
    if (o.mem == "cuda" && !c.device) {  // moves no data through buffers of the kind asked for
      ++hostOnly;
      continue;
    }
    // Fault checks end a worker: they run only when asked for by name (--only faults.X), one per run.
    if (c.name.rfind("faults.", 0) == 0 && o.only.empty()) continue;
    if (!o.skip.empty() && selected(c.name, o.skip)) {
      excluded.push_back(c.name);
    } else {
      checks.push_back(c.name);
    }
  }
  if (checks.empty()) {
    std::fprintf(stderr, "weft conformance: no check matches the selection%s\n",
                 hostOnly > 0 ? " (--mem cuda runs only the checks that move data between buffers)" : "");
    return 2;
  }
  if (hostOnly > 0)
    std::printf("memory  device buffers (--mem cuda): %d checks that use host memory only are left out\n", hostOnly);
  std::vector<std::string> args = {"conformance-worker", "--plugin", o.plugin, "--table", std::to_string(opts.version),
                                   "--dev", std::to_string(o.dev < 0 ? 0 : o.dev), "--timeout",
                                   std::to_string(o.timeoutSec), "--call-limit", std::to_string(o.callLimitMs)};
  if (o.quick) args.push_back("--quick");
  if (o.mem != "host") args.insert(args.end(), {"--mem", o.mem});
  if (o.noDmabuf) args.push_back("--no-dmabuf");
  if (o.cudaContext) args.push_back("--cuda-context");
  if (o.soakMessages > 0) args.insert(args.end(), {"--soak", std::to_string(o.soakMessages)});
  if (o.cycles > 0) args.insert(args.end(), {"--cycles", std::to_string(o.cycles)});
  if (o.conns > 0) args.insert(args.end(), {"--conns", std::to_string(o.conns)});
  if (o.minFlows > 0) args.insert(args.end(), {"--min-flows", std::to_string(o.minFlows)});
  if (o.maxEndpoints >= 0) args.insert(args.end(), {"--max-endpoints", std::to_string(o.maxEndpoints)});
  if (!o.traceDir.empty()) args.insert(args.end(), {"--trace-dir", o.traceDir});
  if (o.maxRecvs > 0) args.insert(args.end(), {"--max-recvs", std::to_string(o.maxRecvs)});
  if (o.verbose) args.push_back("--verbose");
  if (!o.fuse.empty()) args.insert(args.end(), {"--fuse", o.fuse});
  std::map<std::string, std::pair<std::string, std::string>> results[2];  // check -> (verdict, message)
  std::vector<std::string> info[2];
  // One pair of workers runs the checks in order and stops after the first failure (--isolate); the checks after it
  // run in a fresh pair, so that a check that fails (a transfer a provider never ends, a worker that dies) cannot
  // fail the ones after it. A check a worker ended inside (it began and gave no verdict) fails with the cause.
  std::vector<std::string> remaining = checks;
  int pairs = 0;
  while (!remaining.empty()) {
    std::string names;
    for (const auto& c : remaining) names += (names.empty() ? "" : ",") + c;
    std::vector<std::string> pairArgs = args;
    pairArgs.insert(pairArgs.end(), {"--checks", names});
    if (remaining.size() > 1) pairArgs.push_back("--isolate");
    WorkerProcess procs[2];
    spawnPair(o.pair, pairArgs, procs);
    ++pairs;
    std::set<std::string> begun;
    // Each check is bounded inside the workers; this bound catches a worker stuck inside a plugin call.
    auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60 + remaining.size() * (o.timeoutSec + 15));
    bool inTime = collectPair(procs, deadline, [&](int i, const std::string& line) {
      auto f = split(line, '\t');
      if (f.size() >= 3 && f[0] == "RESULT") {
        results[i][f[1]] = {f[2], f.size() > 3 ? f[3] : ""};
      } else if (f.size() >= 2 && f[0] == "BEGIN") {
        begun.insert(f[1]);
      } else if (f.size() >= 2 && f[0] == "INFO") {
        info[i].push_back(line.substr(5));
      }
    });
    if (!inTime) std::printf("the workers exceeded the overall time limit and were killed (a plugin call hung)\n");
    size_t k = 0;
    while (k < remaining.size() && results[0].count(remaining[k]) && results[1].count(remaining[k])) ++k;
    if (k == remaining.size()) break;
    const std::string stuck = remaining[k];
    const bool started = begun.count(stuck) != 0;
    if (!started && k == 0) {  // the pair ran nothing: a fresh one would not either
      for (const auto& name : remaining)
        for (int i = 0; i < 2; ++i)
          if (!results[i].count(name)) results[i][name] = {"FAIL", "no verdict: worker " + procs[i].describeExit()};
      break;
    }
    if (started) {  // a worker ended inside it (or the pair was killed at the deadline)
      for (int i = 0; i < 2; ++i)
        if (!results[i].count(stuck)) results[i][stuck] = {"FAIL", "no verdict: worker " + procs[i].describeExit()};
      ++k;
    }
    remaining.erase(remaining.begin(), remaining.begin() + static_cast<std::ptrdiff_t>(k));
  }
  if (pairs > 1) std::printf("(%d pairs of workers: each failing check ended its pair, the checks after it ran in a fresh one)\n", pairs);
  for (const auto& line : info[0]) std::printf("recv    %s\n", line.c_str());
  for (const auto& line : info[1]) std::printf("send    %s\n", line.c_str());

  int passed = 0, failed = 0, skipped = 0;
  const char* roles[2] = {"recv", "send"};
  for (const auto& name : checks) {
    std::string verdict = "PASS", detail;
    bool anySkip = false;
    for (int i = 0; i < 2; ++i) {
      auto it = results[i].find(name);
      if (it == results[i].end()) {
        verdict = "FAIL";
        detail += std::string(detail.empty() ? "" : "; ") + "[" + roles[i] + "] no verdict";
        continue;
      }
      if (it->second.first == "FAIL") {
        verdict = "FAIL";
        detail += std::string(detail.empty() ? "" : "; ") + "[" + roles[i] + "] " + it->second.second;
      } else if (it->second.first == "SKIP") {
        anySkip = true;
        if (verdict == "PASS" && detail.empty()) detail = it->second.second;
      }
    }
    if (verdict == "PASS" && anySkip) verdict = "SKIP";
    if (verdict == "PASS") detail.clear();
    std::printf("[%s] %-30s %s\n", verdict.c_str(), name.c_str(), detail.c_str());
    (verdict == "PASS" ? passed : verdict == "FAIL" ? failed : skipped)++;
  }
  for (const auto& name : excluded) {
    std::printf("[SKIP] %-30s excluded on the command line\n", name.c_str());
    ++skipped;
  }
  std::printf("conformance: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
  std::fflush(stdout);
  return verdictExitCode(passed, failed);
}

int runWorker(int argc, char** argv) {
  WorkerArgs wa = parseWorkerArgs(argc, argv);
  installCrashReport(wa.role.c_str());
  setVerbose(wa.verbose);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto report = [](const std::string& name, const char* verdict, const std::string& msg) {
    std::printf("RESULT\t%s\t%s\t%s\n", name.c_str(), verdict, oneLine(msg).c_str());
    std::fflush(stdout);
  };
  std::vector<std::string> names = split(wa.checks, ',');
  WorkerSession session;
  std::string error;
  if (!session.open(wa, &error)) {
    for (const auto& n : names) report(n, "FAIL", error);
    return 2;
  }
  CheckEnv& env = session.env();
  Oob& oob = env.oob;
  const int timeoutSec = wa.timeoutSec;
  std::printf("INFO\tdevice %d of %d: %s (speed %d Mb/s, maxRecvs %d, ptrSupport %#x%s%s)\n", env.dev,
              session.deviceCount(), env.props.name.c_str(), env.props.speed, env.props.maxRecvs,
              env.props.ptrSupport, env.props.pciPath.empty() ? "" : ", pci ", env.props.pciPath.c_str());
  if (wa.cudaContext) {  // what the plugin sees in NCCL's threads (the connection's GPU, docs/topology.md)
    std::string why;
    if (CudaDriver::get(&why) == nullptr) std::printf("INFO\t--cuda-context: %s\n", why.c_str());
  }
  std::string noDevice;  // --mem cuda: why device buffers cannot be used (every check is then skipped)
  if (wa.mem == "cuda") {
    CudaDriver* cuda = CudaDriver::get(&noDevice);
    if (cuda != nullptr) installDeviceFaultReport();
    if (cuda != nullptr && (env.props.ptrSupport & NCCL_PTR_CUDA) == 0) {
      char ptr[16];
      std::snprintf(ptr, sizeof(ptr), "%#x", env.props.ptrSupport);
      noDevice = "device " + env.props.name + " does not advertise NCCL_PTR_CUDA (ptrSupport " + ptr +
                 "): NCCL would stage through host memory" + (warningCount() ? " (" + lastWarning() + ")" : "");
    }
    env.mem = MemKind::kCuda;
    env.dmabuf = (env.props.ptrSupport & NCCL_PTR_DMABUF) != 0 && env.net.hasRegMrDmaBuf() && !wa.noDmabuf;
    if (noDevice.empty()) {
      std::printf("INFO\tdevice buffers from %s; registered through %s\n",
                  cuda->mock() ? "the mock CUDA driver (a CPU access to them faults)" : "the CUDA driver",
                  env.dmabuf ? "regMrDmaBuf (NCCL_PTR_DMABUF)" : "regMr (NCCL_PTR_CUDA)");
    }
  }
  for (const auto& name : names) {
    const Check* check = nullptr;
    for (const auto& c : allChecks()) {
      if (c.name == name) check = &c;
    }
    if (check == nullptr) continue;
    if (!noDevice.empty()) {
      report(name, "SKIP", noDevice);
      continue;
    }
    try {
      oob.barrier("begin:" + name, std::chrono::seconds(timeoutSec + 30));
    } catch (const std::exception& e) {
      report(name, "FAIL", std::string("could not start in step with the peer: ") + e.what());
      return 1;
    }
    std::printf("BEGIN\t%s\n", name.c_str());
    std::fflush(stdout);
    std::string verdict = "PASS", msg;
    env.slowestCall = {};
    try {
      check->run(env);
    } catch (const CheckSkip& e) {
      verdict = "SKIP";
      msg = e.what();
    } catch (const PeerAborted& e) {
      verdict = "FAIL";
      msg = e.what();
    } catch (const std::exception& e) {
      verdict = "FAIL";
      msg = e.what();
    }
    if (env.slowestCall.ms > 0) {
      std::printf("INFO\t%s: slowest listen/connect/accept call: %s, %.1f ms (backstop %lld ms)\n", name.c_str(),
                  env.slowestCall.what.c_str(), env.slowestCall.ms, static_cast<long long>(env.callLimit.count()));
    }
    if (env.peerGone) {  // the peer process ended itself on purpose: nothing to exchange, nothing after
      report(name, verdict.c_str(), msg);
      return 0;
    }
    // Exchange verdicts so a side still waiting inside the check stops (it sees the verdict and aborts).
    try {
      oob.send("verdict:" + name + ":" + verdict);
      while (oob.lastVerdict().rfind("verdict:" + name + ":", 0) != 0) {
        oob.recvString(std::chrono::seconds(timeoutSec + 30));  // anything else is left over from this check
      }
      oob.discardPending();
    } catch (const std::exception& e) {
      report(name, verdict == "PASS" ? "FAIL" : verdict.c_str(), msg + (msg.empty() ? "" : "; ") + e.what());
      return 1;
    }
    report(name, verdict.c_str(), msg);
    // Both sides know both verdicts now: with --isolate both stop after a failure, in step.
    if (wa.isolate && (verdict == "FAIL" || oob.lastVerdict() == "verdict:" + name + ":FAIL")) return 0;
  }
  return 0;
}

}  // namespace weft::harness
