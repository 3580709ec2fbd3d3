// weft: the command line around the plugin. Subcommands:
//   info                      what weft would use here: providers, devices, every WEFT_* variable
//   conformance --plugin F    drive any NCCL net plugin file the way NCCL does, check by check
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "args.h"
#include "bench.h"
#include "runner.h"
#include "weft/common/log.h"
#include "weft/common/params.h"

namespace weft::tool {
int info(int argc, char** argv);
}

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: weft <command> [options]\n"
               "  info [--plugin FILE]          providers, devices and WEFT_* variables (or a plugin file's tables)\n"
               "  conformance --plugin FILE     run the NCCL-faithful conformance checks against FILE\n"
               "      [--table N]               table version to drive (default: the newest exported)\n"
               "      [--only NAME]             run only this check (name or prefix; repeatable; see --list)\n"
               "      [--skip NAME]             report a check as skipped instead of running it (repeatable)\n"
               "      [--list] [--quick] [--verbose] [--timeout SEC] [--dev N]\n"
               "      [--call-limit MS]         longest connect/accept/listen call before it counts as blocking (500)\n"
               "      [--env K=V] [--recv-env K=V] [--send-env K=V]   environment for both / one worker\n"
               "      [--recv-netns NS] [--send-netns NS]           run a worker inside a network namespace\n"
               "  bench --plugin FILE           latency and bandwidth through FILE's table, two processes\n"
               "      [--table N] [--dev N] [--quick] [--json] and the --env/--netns options above\n");
}

std::string selfPath() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "weft";
  buf[n] = 0;
  return buf;
}

int conformance(int argc, char** argv) {
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
    else if (f == "--verbose") o.verbose = true;
    else if (f == "--timeout") o.timeoutSec = a.number(1, 3600);
    else if (f == "--call-limit") o.callLimitMs = a.number(1, 3600000);
    else if (f == "--dev") o.dev = a.number(0, 1023);
    else a.unknown();
  }
  if (o.plugin.empty()) {
    std::fprintf(stderr, "weft conformance: --plugin FILE is required\n");
    return 2;
  }
  return weft::harness::runConformance(o);
}

int bench(int argc, char** argv) {
  weft::harness::BenchOptions o;
  o.pair.self = selfPath();
  weft::harness::Args a("weft bench", argc, argv, 2);
  while (a.next()) {
    const std::string& f = a.flag();
    if (weft::harness::parsePairOption(a, o.pair)) continue;
    if (f == "--plugin") o.plugin = a.value();
    else if (f == "--table") o.version = a.number(6, 12);
    else if (f == "--dev") o.dev = a.number(0, 1023);
    else if (f == "--quick") o.quick = true;
    else if (f == "--json") o.json = true;
    else a.unknown();
  }
  if (o.plugin.empty()) {
    std::fprintf(stderr, "weft bench: --plugin FILE is required\n");
    return 2;
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
  if (cmd == "bench-worker") return weft::harness::runBenchWorker(argc, argv);
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage();
    return 0;
  }
  std::fprintf(stderr, "weft: unknown command '%s'\n", cmd.c_str());
  usage();
  return 2;
}
