// SPDX-License-Identifier: Apache-2.0
#include "args.h"

#include <sstream>

#include <cstdio>
#include <cstdlib>

#include "weft/common/params.h"

namespace weft::harness {

bool Args::next() {
  if (++i_ >= argc_) return false;
  flag_ = argv_[i_];
  return true;
}

std::string Args::value() {
  if (i_ + 1 >= argc_) {
    std::fprintf(stderr, "%s: %s needs a value\n", prog_, flag_.c_str());
    std::exit(2);
  }
  return argv_[++i_];
}

int Args::number(int64_t lo, int64_t hi) {
  std::string v = value();
  int64_t x = 0;
  std::string err;
  if (!params::parseInt(v, lo, hi, &x, &err)) {
    std::fprintf(stderr, "%s: %s %s\n", prog_, flag_.c_str(), err.c_str());
    std::exit(2);
  }
  return static_cast<int>(x);
}

void Args::unknown() const {
  std::fprintf(stderr, "%s: unknown option %s (see weft --help)\n", prog_, flag_.c_str());
  std::exit(2);
}

bool parsePairOption(Args& a, PairOptions& pair) {
  const std::string& f = a.flag();
  auto keyValue = [&] {
    std::string kv = a.value();
    if (kv.find('=') == std::string::npos || kv[0] == '=') {
      std::fprintf(stderr, "weft: %s wants KEY=VALUE, got '%s'\n", f.c_str(), kv.c_str());
      std::exit(2);
    }
    return kv;
  };
  if (f == "--env") pair.env.push_back(keyValue());
  else if (f == "--recv-env") pair.recvEnv.push_back(keyValue());
  else if (f == "--send-env") pair.sendEnv.push_back(keyValue());
  else if (f == "--recv-netns") pair.recvNetns = a.value();
  else if (f == "--send-netns") pair.sendNetns = a.value();
  else if (f == "--dump-dir") pair.dumpDir = a.value();
  else if (f == "--pid-ns") pair.pidNs = true;
  else return false;
  return true;
}

WorkerArgs parseWorkerArgs(int argc, char** argv) {
  WorkerArgs w;
  Args a("weft worker", argc, argv, 2);
  while (a.next()) {
    const std::string& f = a.flag();
    if (f == "--plugin") w.plugin = a.value();
    else if (f == "--table") w.table = a.number(0, 12);
    else if (f == "--role") w.role = a.value();
    else if (f == "--oob-fd") w.oobFd = a.number(0, 1 << 20);
    else if (f == "--dev") w.dev = a.number(0, 1023);
    else if (f == "--fuse") w.fuse = a.value();
    else if (f == "--timeout") w.timeoutSec = a.number(1, 86400);
    else if (f == "--checks") w.checks = a.value();
    else if (f == "--call-limit") w.callLimitMs = a.number(1, 3600000);
    else if (f == "--quick") w.quick = true;
    else if (f == "--mem") w.mem = a.value();
    else if (f == "--no-dmabuf") w.noDmabuf = true;
    else if (f == "--cuda-context") w.cudaContext = true;
    else if (f == "--soak") w.soakMessages = a.number(1, 2000000000);
    else if (f == "--cycles") w.cycles = a.number(1, 10000000);
    else if (f == "--conns") w.conns = a.number(1, 1000000);
    else if (f == "--min-flows") w.minFlows = a.number(1, 64);
    else if (f == "--max-endpoints") w.maxEndpoints = a.number(0, 1000000);
    else if (f == "--trace-dir") w.traceDir = a.value();
    else if (f == "--max-recvs") w.maxRecvs = a.number(1, 8);
    else if (f == "--verbose") w.verbose = true;
    else if (f == "--isolate") w.isolate = true;
    else if (f == "--raw-provider") w.rawProvider = a.value();
    else if (f == "--raw-iface") w.rawIface = a.value();
    else if (f == "--rounds") w.rounds = a.number(1, 100);
    else if (f == "--patterns") w.patterns = a.value();
    else if (f == "--lat-sizes") w.latSizes = a.value();
    else if (f == "--raw-modes") w.rawModes = a.value();
    else if (f == "--conns-list") w.connsList = a.value();
    else if (f == "--raw-max-conns") w.rawMaxConns = a.number(1, 100000);
    else if (f == "--conns-size") w.connsSize = static_cast<size_t>(a.number(4096, 1 << 30));
    else a.unknown();
  }
  return w;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace weft::harness
