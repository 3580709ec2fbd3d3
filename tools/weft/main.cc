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
               "      [--only NAME[,NAME]]      checks to run (names or prefixes; see --list)\n"
               "      [--skip NAME]             report a check as skipped instead of running it (repeatable)\n"
               "      [--list] [--quick] [--verbose] [--timeout SEC] [--dev N]\n"
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
  o.self = selfPath();
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto need = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "weft conformance: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](const std::string& v, int64_t lo, int64_t hi) {
      int64_t x = 0;
      std::string err;
      if (!weft::params::parseInt(v, lo, hi, &x, &err)) {
        std::fprintf(stderr, "weft conformance: %s %s\n", a.c_str(), err.c_str());
        std::exit(2);
      }
      return static_cast<int>(x);
    };
    if (a == "--plugin") o.plugin = need();
    else if (a == "--table") o.version = number(need(), 6, 12);
    else if (a == "--only") {
      std::string v = need();
      size_t start = 0;
      while (start <= v.size()) {
        size_t c = v.find(',', start);
        std::string item = v.substr(start, c == std::string::npos ? std::string::npos : c - start);
        if (!item.empty()) o.only.push_back(item);
        if (c == std::string::npos) break;
        start = c + 1;
      }
    } else if (a == "--skip") {
      o.skip.push_back(need());
    } else if (a == "--list") return weft::harness::listChecks();
    else if (a == "--quick") o.quick = true;
    else if (a == "--verbose") o.verbose = true;
    else if (a == "--timeout") o.timeoutSec = number(need(), 1, 3600);
    else if (a == "--dev") o.dev = number(need(), 0, 1023);
    else if (a == "--env") o.env.push_back(need());
    else if (a == "--recv-env") o.recvEnv.push_back(need());
    else if (a == "--send-env") o.sendEnv.push_back(need());
    else if (a == "--recv-netns") o.recvNetns = need();
    else if (a == "--send-netns") o.sendNetns = need();
    else {
      std::fprintf(stderr, "weft conformance: unknown option %s\n", a.c_str());
      usage();
      return 2;
    }
  }
  if (o.plugin.empty()) {
    std::fprintf(stderr, "weft conformance: --plugin FILE is required\n");
    return 2;
  }
  for (const auto& kv : o.env) {
    if (kv.find('=') == std::string::npos) {
      std::fprintf(stderr, "weft conformance: --env wants KEY=VALUE, got '%s'\n", kv.c_str());
      return 2;
    }
  }
  return weft::harness::runConformance(o);
}

int bench(int argc, char** argv) {
  weft::harness::BenchOptions o;
  o.pair.self = selfPath();
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto need = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "weft bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](const std::string& v, int64_t lo, int64_t hi) {
      int64_t x = 0;
      std::string err;
      if (!weft::params::parseInt(v, lo, hi, &x, &err)) {
        std::fprintf(stderr, "weft bench: %s %s\n", a.c_str(), err.c_str());
        std::exit(2);
      }
      return static_cast<int>(x);
    };
    if (a == "--plugin") o.plugin = need();
    else if (a == "--table") o.version = number(need(), 6, 12);
    else if (a == "--dev") o.dev = number(need(), 0, 1023);
    else if (a == "--quick") o.quick = true;
    else if (a == "--json") o.json = true;
    else if (a == "--env") o.pair.env.push_back(need());
    else if (a == "--recv-env") o.pair.recvEnv.push_back(need());
    else if (a == "--send-env") o.pair.sendEnv.push_back(need());
    else if (a == "--recv-netns") o.pair.recvNetns = need();
    else if (a == "--send-netns") o.pair.sendNetns = need();
    else {
      std::fprintf(stderr, "weft bench: unknown option %s\n", a.c_str());
      usage();
      return 2;
    }
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
