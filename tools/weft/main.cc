// SPDX-License-Identifier: Apache-2.0
// weft: the command line around the plugin. Subcommands (usage() below has their options):
//   info          what weft would use here: providers, devices, every WEFT_* variable (or a plugin file's tables)
//   conformance   drive any NCCL net plugin file the way NCCL does, check by check
//   diff          one seeded stream of NCCL-like operations through two plugin files, compared
//   bench         latency, bandwidth and connection figures of a plugin file against raw libfabric
//   report        a job's timing records: per collective, per rank, stragglers
//   replay        drive a profiler plugin file with a small multi-rank job's events
//   tune          the tuner: simulated worlds, profiles (show, sweep, eval), log agreement (check)
//   profile       merge a job's timing records into a tuner profile
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "args.h"
#include "bench.h"
#include "rma_conformance.h"
#include "runner.h"
#include "weft/common/log.h"
#include "weft/common/params.h"

namespace weft::tool {
int info(int argc, char** argv);
int replayCommand(int argc, char** argv, const std::string& defaultProfiler);
int reportCommand(int argc, char** argv);
int inspectCommand(int argc, char** argv);
int tuneCommand(int argc, char** argv);
int profileCommand(int argc, char** argv);
}

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: weft <command> [options]\n"
               "  info [--plugin FILE]          providers, devices and WEFT_* variables (or a plugin file's tables)\n"
               "  info --markdown               every WEFT_* variable as a Markdown table (docs/variables.md)\n"
               "  diff --plugin A --plugin B    one seeded stream of NCCL-like operations (diff.stream) through both\n"
               "                                files; the receivers' observations compared (exit 1: they differ)\n"
               "      [--table N [--table M]] [--quick] [--groups N] [--a-env K=V] [--b-env K=V] and the --env\n"
               "      options below (--a-env/--b-env: for one plugin's run only)\n"
               "  conformance [--plugin FILE]   run the NCCL-faithful conformance checks against FILE (default:\n"
               "                                NCCL_NET_PLUGIN as NCCL resolves it, else weft's own)\n"
               "  conformance --rma --plugin FILE [--ranks N] [--mem host|cuda] [--symbol S --rma-table V]\n"
               "                                drive FILE's device-API proxy table (GIN/RMA) as NCCL's proxy does\n"
               "      [--netns A,B]             rank r in network namespace A or B by r %% 2 (faults.link_down)\n"
               "      [--table N]               table version to drive (default: the newest exported)\n"
               "      [--only NAME]             run only this check (name or prefix; repeatable; see --list)\n"
               "      [--skip NAME]             report a check as skipped instead of running it (repeatable)\n"
               "      [--list] [--quick] [--verbose] [--timeout SEC] [--dev N] [--fuse 0,1]\n"
               "      [--soak N]                messages for soak.random (default 20,000; 2,000 with --quick)\n"
               "      [--mem cuda] [--no-dmabuf] the data checks between GPU buffers from libcuda.so.1 (a GPU, or the\n"
               "                                mock: LD_LIBRARY_PATH=build/mock-cuda); DMA-BUF where advertised\n"
               "      [--cuda-context]          host buffers, with device 0's CUDA context current in the workers\n"
               "      [--cycles N]              cycles for hygiene.* (default 2,000 connects, 10,000 registrations)\n"
               "      [--conns N]               connections held at once by comms.scale (default 1,024; 256 with --quick)\n"
               "      [--min-flows N]           weft.tcp_flows: flows a large transfer must spread over (default:\n"
               "                                WEFT_TCP_FLOWS where it is 4 or more, else the check skips)\n"
               "      [--max-endpoints N]       comms.scale fails if a worker holds more libfabric endpoints open\n"
               "                                (as the plugin reports them through weftNetStat; others: not checked)\n"
               "      [--call-limit MS]         backstop: a listen/connect/accept call longer than this has blocked (10000)\n"
               "      [--env K=V] [--recv-env K=V] [--send-env K=V]   environment for both / one worker\n"
               "      [--recv-netns NS] [--send-netns NS]           run a worker inside a network namespace\n"
               "      [--pid-ns]                each worker in a PID namespace of its own (as two containers that share\n"
               "                                /dev/shm: their process ids can be equal); needs root, else SKIP (77)\n"
               "      [--dump-dir DIR]          the workers' directories, DIR/recv and DIR/send, where a crash leaves\n"
               "                                its core dump (default: build/dumps beside this weft)\n"
               "  bench [--plugin FILE]         latency, bandwidth, parallel connections and NCCL's step pattern\n"
               "                                through FILE's table (default: this weft's plugin), two processes,\n"
               "                                beside raw libfabric doing the same on the same provider\n"
               "      [--raw PROVIDER] [--raw-iface IF] [--no-raw]  the reference (default: WEFT_PROVIDER/IFACE)\n"
               "      [--patterns lat,bw,conns,steps] [--rounds N] (median of N alternating runs, default 3)\n"
               "      [--lat-sizes 8,4096,...]  latency message sizes in bytes\n"
               "      [--conns-list 1,16,64]    connection counts of the conns pattern (default 1,2,4,8,16)\n"
               "      [--conns-size BYTES]      message size of the conns pattern (default 1 MiB)\n"
               "      [--busy N]                N busy-loop processes beside the workers (a host whose cores are\n"
               "                                all taken, as data loaders take them)\n"
               "      [--raw-max-conns N]       raw references run conns points up to N only (default 16: each raw\n"
               "                                link is its own endpoints, tens of MiB each over rxm)\n"
               "      [--raw-modes raw-tagged,raw-rma,raw-tagged-1ep]  which references to run (default: all)\n"
               "      [--table N] [--dev N] [--fuse 0,1] [--quick] [--json] and the --env/--netns options above\n"
               "  inspect [--json] [--pid N]    the weft processes of this user on this host, live: their\n"
               "                                connections, what they moved, which are stalled now (docs/hangs.md)\n"
               "      [--dir D]                 where their sockets are (default WEFT_INSPECT_DIR, /tmp/weft-<uid>)\n"
               "  report DIR                    read the timing records of a job (WEFT_TELEMETRY_DIR of every rank):\n"
               "                                busbw per operation and size, stragglers, traffic mix, and per user\n"
               "                                tag (NCCL 2.32+): time share, bandwidth, sync wait, stragglers\n"
               "      [--plot OUTDIR]           also write busbw_vs_size.svg and timeline.svg\n"
               "      [--straggler-min-us N]    smallest wait that can make a straggler (default 20)\n"
               "  report DIR --hangs [--json]   the stall dumps of every rank (WEFT_TELEMETRY_DIR/hangs) joined into\n"
               "                                who waits on whom; first line the cause: a rank that died, a link\n"
               "                                where bytes stopped, the rank every chain of waits ends at, a cycle\n"
               "  replay [--profiler FILE]      drive a profiler plugin file (default: weft's) with a small multi-rank\n"
               "                                job's events, one process per rank, as NCCL would; cost per event\n"
               "      [--table N] [--ranks N] [--nodes N] [--steps N] [--straggler RANK] [--delay-us N]\n"
               "      [--gpu-lag-ms N]          the GPU N ms behind the CPU: kernel and proxy events come that late\n"
               "      [--tags] [--straggler-tag 1|2|3]  user tags on the operations (1 forward, 2 backward,\n"
               "                                3 pipeline); the straggler late in that part of the step only\n"
               "      [--out DIR]               WEFT_TELEMETRY_DIR for the ranks (a job for `weft report`)\n"
               "  tune sim                      simulated worlds: sweep, decide, score vs NCCL's default and the oracle\n"
               "      [--held-out]              sweep every other octave, score the sizes between and beyond, in five\n"
               "                                worlds (smooth, sign-flip, drift, heavy-tail, off-pick) [--reps N]\n"
               "      [--seeds 1,2] [--samples N] [--arm-error PCT] [--noise PCT] [--planted N] [--no-bracket] [topology]\n"
               "  tune show --profile F --ranks N --nodes M [--plot OUT.svg]   decision table vs NCCL's default\n"
               "  tune sweep --command CMD --out F [--coll C] [--candidates A/P,...] [--channels 0,8] [--repeat N]\n"
               "                                run CMD (nccl-tests) once per candidate forced through the tuner\n"
               "                                (--via env: NCCL_ALGO/NCCL_PROTO), parse it, write a profile (resumable)\n"
               "  tune nccl-sim --tuner SO      a simulated NCCL calling the tuner file, printing nccl-tests output\n"
               "  tune eval --profile F         score a profile in a simulated world\n"
               "  tune check LOG... [--expect N]  the tuner decision state every rank logged (NCCL_DEBUG=INFO): one\n"
               "                                state, or which processes differ (exit 1)\n"
               "  profile merge DIR --out F     a profile from the timing records of every rank (WEFT_TELEMETRY_DIR)\n"
               "  [topology] of the tune commands: --ranks N --nodes M --channels N --bw-intra GBs --bw-inter GBs\n"
               "      --cc volta|ampere|hopper|blackwell|rubin (or 0-4) --amd --nvls --no-ll128 --pci; a profile's\n"
               "      recorded NCCL constants and compute capability are used where it has them\n");
}


std::string selfPath() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "weft";
  buf[n] = 0;
  return buf;
}

// The plugin built beside this tool: <prefix>/bin/weft -> <prefix>/lib/libnccl-net-weft.so.
// The plugin when no --plugin names one: NCCL_NET_PLUGIN as NCCL would take it (a path, a file name or a name such as
// "weft"); else the build tree's beside this binary; else weft's, by name from the loader's path (installed).
std::string defaultPlugin() {
  if (const char* env = weft::params::foreign("NCCL_NET_PLUGIN"); env != nullptr && *env != '\0') return env;
  std::string self = selfPath();
  size_t slash = self.rfind('/');
  std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
  if (::access((dir + "/../lib/libnccl-net-weft.so").c_str(), R_OK) == 0) return dir + "/../lib/libnccl-net-weft.so";
  return "libnccl-net-weft.so";
}

// The options of weft conformance --rma and weft bench --rma (tools/harness/rma_conformance.h); the bench takes the
// first five and --procs only. -1: go on; else the exit code.
int parseRmaOptions(const char* cmd, bool bench, int argc, char** argv, weft::harness::RmaOptions* o) {
  weft::harness::Args a(cmd, argc, argv, 2);
  while (a.next()) {
    const std::string& f = a.flag();
    if (f == "--rma") continue;
    if (f == "--plugin") o->plugin = a.value();
    else if (f == "--symbol") o->symbol = a.value();
    else if (f == "--rma-table") o->table = a.number(11, 17);
    else if (f == "--ranks") o->ranks = a.number(bench ? 2 : 1, bench ? 4096 : 8);
    else if (f == "--dev") o->dev = a.number(0, 1023);
    else if (bench && f == "--procs") o->procs = a.number(1, 512);
    else if (bench) a.unknown();
    else if (f == "--mem") o->mem = a.value();
    else if (f == "--only") o->only.push_back(a.value());
    else if (f == "--skip") o->skip.push_back(a.value());
    else if (f == "--soak") o->soakOps = a.number(1, 2000000000);
    else if (f == "--timeout") o->timeoutSec = a.number(1, 86400);
    else if (f == "--dead-bound") o->deadBoundSec = a.number(1, 3600);
    else if (!bench && f == "--netns") o->netns = weft::harness::split(a.value(), ',');
    else if (f == "--verbose") o->verbose = true;
    else if (f == "--list") return weft::harness::listRmaChecks();
    else a.unknown();
  }
  return -1;
}

// weft conformance --rma: the device API's proxy table.
int rmaConformance(int argc, char** argv) {
  weft::harness::RmaOptions o;
  if (int rc = parseRmaOptions("weft conformance --rma", false, argc, argv, &o); rc >= 0) return rc;
  if (o.plugin.empty()) {
    std::fprintf(stderr, "weft conformance --rma: --plugin FILE is required\n");
    return 2;
  }
  if (o.mem != "host" && o.mem != "cuda") {
    std::fprintf(stderr, "weft conformance --rma: --mem wants host or cuda, got '%s'\n", o.mem.c_str());
    return 2;
  }
  return weft::harness::runRmaConformance(o);
}

int conformance(int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rma") == 0) return rmaConformance(argc, argv);
  }
  weft::harness::RunOptions o;
  o.pair.self = selfPath();
  weft::harness::Args a("weft conformance", argc, argv, 2);
  while (a.next()) {
    const std::string& f = a.flag();
    if (weft::harness::parsePairOption(a, o.pair)) continue;
    if (f == "--plugin") o.plugin = a.value();
    else if (f == "--table") o.version = a.number(6, 12);
    else if (f == "--only") o.only.push_back(a.value());
    else if (f == "--skip") o.skip.push_back(a.value());
    else if (f == "--list") return weft::harness::listChecks();
    else if (f == "--quick") o.quick = true;
    else if (f == "--soak") o.soakMessages = a.number(1, 2000000000);
    else if (f == "--cycles") o.cycles = a.number(1, 10000000);
    else if (f == "--conns") o.conns = a.number(1, 1000000);
    else if (f == "--min-flows") o.minFlows = a.number(1, 64);
    else if (f == "--max-endpoints") o.maxEndpoints = a.number(0, 1000000);
    else if (f == "--verbose") o.verbose = true;
    else if (f == "--timeout") o.timeoutSec = a.number(1, 3600);
    else if (f == "--call-limit") o.callLimitMs = a.number(1, 3600000);
    else if (f == "--dev") o.dev = a.number(0, 1023);
    else if (f == "--fuse") o.fuse = a.value();
    else if (f == "--mem") o.mem = a.value();
    else if (f == "--no-dmabuf") o.noDmabuf = true;
    else if (f == "--cuda-context") o.cudaContext = true;
    else a.unknown();
  }
  if (o.plugin.empty()) o.plugin = defaultPlugin();
  if (o.mem != "host" && o.mem != "cuda") {
    std::fprintf(stderr, "weft conformance: --mem wants host or cuda, got '%s'\n", o.mem.c_str());
    return 2;
  }
  return weft::harness::runConformance(o);
}

int diff(int argc, char** argv) {
  weft::harness::RunOptions o;
  o.pair.self = selfPath();
  std::vector<std::string> plugins;
  std::vector<int> tables;
  std::vector<std::string> envA, envB;  // settings of one plugin's run only
  weft::harness::Args a("weft diff", argc, argv, 2);
  while (a.next()) {
    const std::string& f = a.flag();
    if (weft::harness::parsePairOption(a, o.pair)) continue;
    if (f == "--plugin") plugins.push_back(a.value());
    else if (f == "--table") tables.push_back(a.number(6, 12));
    else if (f == "--a-env") envA.push_back(a.value());
    else if (f == "--b-env") envB.push_back(a.value());
    else if (f == "--quick") o.quick = true;
    else if (f == "--groups") o.soakMessages = a.number(1, 100000000);
    else if (f == "--timeout") o.timeoutSec = a.number(1, 3600);
    else if (f == "--verbose") o.verbose = true;
    else a.unknown();
  }
  if (plugins.size() != 2 || tables.size() > 2) {
    std::fprintf(stderr, "usage: weft diff --plugin A --plugin B [--table N [--table M]] [--quick] [--groups N] "
                         "[--env K=V ...]\n");
    return 2;
  }
  weft::harness::RunOptions b = o;
  o.plugin = plugins[0];
  b.plugin = plugins[1];
  if (!tables.empty()) o.version = b.version = tables[0];
  if (tables.size() == 2) b.version = tables[1];
  o.pair.env.insert(o.pair.env.end(), envA.begin(), envA.end());
  b.pair.env.insert(b.pair.env.end(), envB.begin(), envB.end());
  return weft::harness::runDiff(o, b);
}

int rmaBench(int argc, char** argv) {
  weft::harness::RmaOptions o;
  if (int rc = parseRmaOptions("weft bench --rma", true, argc, argv, &o); rc >= 0) return rc;
  if (o.plugin.empty()) o.plugin = defaultPlugin();
  if (o.procs > 0) return weft::harness::runRmaScale(o);
  if (o.ranks > 8) {
    std::fprintf(stderr, "weft bench --rma: more than 8 ranks only with --procs (the scale run)\n");
    return 2;
  }
  return weft::harness::runRmaBench(o);
}

int bench(int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rma") == 0) return rmaBench(argc, argv);
  }
  weft::harness::BenchOptions o;
  bool noRaw = false;
  o.pair.self = selfPath();
  weft::harness::Args a("weft bench", argc, argv, 2);
  while (a.next()) {
    const std::string& f = a.flag();
    if (weft::harness::parsePairOption(a, o.pair)) continue;
    if (f == "--plugin") o.plugin = a.value();
    else if (f == "--table") o.version = a.number(6, 12);
    else if (f == "--dev") o.dev = a.number(0, 1023);
    else if (f == "--fuse") o.fuse = a.value();
    else if (f == "--quick") o.quick = true;
    else if (f == "--json") o.json = true;
    else if (f == "--rounds") o.rounds = a.number(1, 100);
    else if (f == "--patterns") o.patterns = a.value();
    else if (f == "--lat-sizes") {
      o.latSizes = a.value();
      for (const auto& t : weft::harness::split(o.latSizes, ',')) {
        if (t.find_first_not_of("0123456789") != std::string::npos || t.size() > 10) {
          std::fprintf(stderr, "weft bench: --lat-sizes wants byte counts separated by commas, got '%s'\n", t.c_str());
          return 2;
        }
      }
    }
    else if (f == "--busy") o.busy = a.number(0, 1024);
    else if (f == "--raw") o.rawProvider = a.value();
    else if (f == "--raw-iface") o.rawIface = a.value();
    else if (f == "--raw-modes") o.rawModes = a.value();
    else if (f == "--conns-list") {
      o.connsList = a.value();
      for (const auto& t : weft::harness::split(o.connsList, ',')) {
        if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos || t.size() > 5 || std::stoi(t) < 1) {
          std::fprintf(stderr, "weft bench: --conns-list wants connection counts separated by commas, got '%s'\n",
                       t.c_str());
          return 2;
        }
      }
    }
    else if (f == "--raw-max-conns") o.rawMaxConns = a.number(1, 100000);
    else if (f == "--conns-size") o.connsSize = static_cast<size_t>(a.number(4096, 1 << 30));
    else if (f == "--no-raw") noRaw = true;
    else a.unknown();
  }
  if (o.plugin.empty()) o.plugin = defaultPlugin();
  for (const auto& p : weft::harness::split(o.patterns, ',')) {
    if (p != "lat" && p != "bw" && p != "conns" && p != "steps") {
      std::fprintf(stderr, "weft bench: unknown pattern '%s' in --patterns (lat, bw, conns, steps)\n", p.c_str());
      return 2;
    }
  }
  // The raw reference runs on the provider and interface the plugin is told to use (--env WEFT_PROVIDER=...,
  // WEFT_IFACE=...), unless --raw/--raw-iface say otherwise.
  auto fromEnv = [&](const std::string& key) {
    std::string v;
    for (const auto& kv : o.pair.env) {
      if (kv.rfind(key + "=", 0) == 0) v = kv.substr(key.size() + 1);
    }
    if (v.empty() && std::getenv(key.c_str()) != nullptr) v = std::getenv(key.c_str());
    return v;
  };
  if (noRaw) {
    o.rawProvider.clear();
  } else {
    if (o.rawProvider.empty()) o.rawProvider = fromEnv("WEFT_PROVIDER");
    if (o.rawIface.empty()) o.rawIface = fromEnv("WEFT_IFACE");
    if (o.rawProvider.empty()) {
      std::fprintf(stderr, "weft bench: no raw libfabric reference (name its provider with --raw or --env "
                           "WEFT_PROVIDER=...; --no-raw to run without)\n");
    }
  }
  return weft::harness::runBench(o);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  std::string cmd = argv[1];
  const char* debug = weft::params::foreign("NCCL_DEBUG");
  weft::log::setStderrVerbose(debug != nullptr && (std::strcmp(debug, "INFO") == 0 || std::strcmp(debug, "TRACE") == 0));
  if (cmd == "info") return weft::tool::info(argc, argv);
  if (cmd == "conformance") return conformance(argc, argv);
  if (cmd == "conformance-worker") return weft::harness::runWorker(argc, argv);
  if (cmd == "bench") return bench(argc, argv);
  if (cmd == "diff") return diff(argc, argv);
  if (cmd == "bench-worker") return weft::harness::runBenchWorker(argc, argv);
  if (cmd == "report") return weft::tool::reportCommand(argc, argv);
  if (cmd == "inspect") return weft::tool::inspectCommand(argc, argv);
  if (cmd == "tune") return weft::tool::tuneCommand(argc, argv);
  if (cmd == "profile") return weft::tool::profileCommand(argc, argv);
  if (cmd == "replay") {
    std::string self = selfPath();
    size_t slash = self.rfind('/');
    // The build tree's profiler beside this binary, else the installed one by name (the multiarch library folder).
    std::string profiler = (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) +
                           "/../lib/libnccl-profiler-weft.so";
    if (::access(profiler.c_str(), R_OK) != 0) profiler = "libnccl-profiler-weft.so";
    return weft::tool::replayCommand(argc, argv, profiler);
  }
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage();
    return 0;
  }
  std::fprintf(stderr, "weft: unknown command '%s'\n", cmd.c_str());
  usage();
  return 2;
}
