#include "bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "args.h"
#include "check_support.h"
#include "checks.h"
#include "weft/common/params.h"

namespace weft::harness {
namespace {

using Clock = std::chrono::steady_clock;

double usSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Posts until the plugin takes the request (a NULL request is back-pressure), then tests it to completion.
void* postSend(CheckEnv& env, void* comm, void* data, size_t size, void* mh) {
  void* req = nullptr;
  while (req == nullptr) expectOk(env.net.isend(comm, data, size, 0, mh, &req), "isend");
  return req;
}

void* postRecv(CheckEnv& env, void* comm, void* data, size_t size, void* mh) {
  void* req = nullptr;
  int tag = 0;
  while (req == nullptr) expectOk(env.net.irecv(comm, 1, &data, &size, &tag, &mh, &req), "irecv");
  return req;
}

int spin(CheckEnv& env, void* req) {
  int done = 0, sizes[NCCL_PROXY_MAX_SUBS] = {};
  while (!done) expectOk(env.net.test(req, &done, sizes), "test");
  return sizes[0];
}

// Rank "recv" is the ping side: it sends first and measures; the other echoes.
void latency(CheckEnv& env, Conn& out, Conn& in, size_t size, int iters) {
  Buffer sb(std::max<size_t>(size, 1)), rb(std::max<size_t>(size, 1));
  Registration sreg(env.net, out.sendComm, sb.data(), sb.size()), rreg(env.net, in.recvComm, rb.data(), rb.size());
  fillPattern(sb.data(), size, size);
  const int warmup = std::max(10, iters / 10);
  std::vector<double> halfRtt;
  halfRtt.reserve(iters);
  env.oob.barrier("lat" + std::to_string(size));
  for (int i = 0; i < warmup + iters; ++i) {
    if (env.recv()) {
      void* r = postRecv(env, in.recvComm, rb.data(), size, rreg.mh());  // pre-posted, as NCCL's proxy does
      auto t0 = Clock::now();
      spin(env, postSend(env, out.sendComm, sb.data(), size, sreg.mh()));
      int got = spin(env, r);
      double us = usSince(t0);
      if (static_cast<size_t>(got) != size) fail("echo of " + std::to_string(size) + " B came back as " + std::to_string(got));
      if (i >= warmup) halfRtt.push_back(us / 2);
    } else {
      void* r = postRecv(env, in.recvComm, rb.data(), size, rreg.mh());
      spin(env, r);
      spin(env, postSend(env, out.sendComm, sb.data(), size, sreg.mh()));  // same pattern as the ping
    }
  }
  if (env.recv() && findMismatch(rb.data(), size, size) != SIZE_MAX) fail("latency echo corrupted");
  if (env.recv()) {
    std::sort(halfRtt.begin(), halfRtt.end());
    double med = halfRtt[halfRtt.size() / 2], p99 = halfRtt[std::min(halfRtt.size() - 1, halfRtt.size() * 99 / 100)];
    std::printf("LAT\t%zu\t%.2f\t%.2f\t%d\n", size, med, p99, iters);
  }
  sreg.release();
  rreg.release();
}

// Streams `count` messages of `size` from the sending rank, 8 in flight; the receiver times first post to last
// completion and verifies every message afterwards (verification is outside the timed window).
void bandwidth(CheckEnv& env, Conn& c, size_t size, int count) {
  const int inflight = 8;
  Buffer buf(size * inflight);
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  if (!env.recv()) {
    for (int k = 0; k < inflight; ++k) fillPattern(buf.data() + k * size, size, 7000 + k);
  }
  env.oob.barrier("bw" + std::to_string(size));
  std::deque<std::pair<int, void*>> q;
  int posted = 0, done = 0;
  auto t0 = Clock::now();
  while (done < count) {
    while (posted < count && static_cast<int>(q.size()) < inflight) {
      uint8_t* slot = buf.data() + (posted % inflight) * size;
      void* req = env.recv() ? postRecv(env, c.recvComm, slot, size, reg.mh())
                             : postSend(env, c.sendComm, slot, size, reg.mh());
      q.emplace_back(posted++, req);
    }
    int d = 0, sizes[NCCL_PROXY_MAX_SUBS] = {};
    expectOk(env.net.test(q.front().second, &d, sizes), "test");
    if (d) {
      if (static_cast<size_t>(sizes[0]) != size) fail("a " + fmtSize(size) + " message reported " + std::to_string(sizes[0]) + " B");
      q.pop_front();
      ++done;
    }
  }
  double us = usSince(t0);
  if (env.recv()) {
    for (int k = 0; k < inflight && k < count; ++k) {
      // Slot k last held message (count-1) - ((count-1-k) % inflight); all messages in a slot carry its pattern.
      if (findMismatch(buf.data() + k * size, size, 7000 + k) != SIZE_MAX) fail("bandwidth stream corrupted");
    }
    double gbps = static_cast<double>(size) * count * 8 / (us * 1e3);
    std::printf("BW\t%zu\t%.2f\t%d\n", size, gbps, count);
  }
  reg.release();
}

}  // namespace

int runBenchWorker(int argc, char** argv) {
  WorkerArgs wa = parseWorkerArgs(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* debug = params::foreign("NCCL_DEBUG");  // show the plugin's INFO lines as NCCL would
  setVerbose(debug != nullptr && (std::string(debug) == "INFO" || std::string(debug) == "TRACE"));
  WorkerSession session;
  std::string error;
  if (!session.open(wa, &error)) {
    std::printf("ERROR\t%s\n", error.c_str());
    return 2;
  }
  CheckEnv& env = session.env();
  const bool quick = wa.quick;
  try {
    std::printf("INFO\t%s\t%d\n", env.props.name.c_str(), env.props.speed);
    // One connection each way: the recv rank's "out" is the send rank's "in".
    Conn fwd = establish(env, "fwd");
    env.role = env.recv() ? Role::kSend : Role::kRecv;
    Conn bwd = establish(env, "bwd");
    env.role = env.recv() ? Role::kSend : Role::kRecv;
    Conn& out = env.recv() ? bwd : fwd;  // recv rank sends on bwd (where it connected)
    Conn& in = env.recv() ? fwd : bwd;
    std::vector<size_t> latSizes = {8, 1024, 65536, 1 << 20};
    std::vector<size_t> bwSizes = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
    if (quick) bwSizes = {64 << 10, 1 << 20, 16 << 20};
    for (size_t s : latSizes) latency(env, out, in, s, s <= 65536 ? (quick ? 300 : 2000) : (quick ? 50 : 200));
    for (size_t s : bwSizes) {
      size_t total = quick ? (size_t{128} << 20) : (size_t{1} << 30);
      int count = static_cast<int>(std::max<size_t>(32, total / s));
      // The sending rank's outgoing connection toward the receiver is `fwd` (it connected there).
      bandwidth(env, fwd, s, count);
    }
    closeConn(env, fwd);
    closeConn(env, bwd);
  } catch (const std::exception& e) {
    std::printf("ERROR\t%s\n", e.what());
    return 1;
  }
  return 0;
}

int runBench(const BenchOptions& o) {
  std::string error;
  auto plugin = LoadedPlugin::open(o.plugin, o.version, &error);
  if (!plugin) {
    std::fprintf(stderr, "weft bench: %s\n", error.c_str());
    return 2;
  }
  int version = plugin->api().version();
  std::string name = plugin->api().name();
  plugin.reset();
  std::vector<std::string> args = {"bench-worker", "--plugin", o.plugin, "--table", std::to_string(version), "--dev",
                                   std::to_string(o.dev)};
  if (o.quick) args.push_back("--quick");
  WorkerProcess procs[2];
  spawnPair(o.pair, args, procs);
  std::vector<std::string> lat, bw, errors;
  std::string device;
  bool inTime = collectPair(procs, Clock::now() + std::chrono::minutes(10), [&](int i, const std::string& line) {
    if (line.rfind("LAT\t", 0) == 0) lat.push_back(line);
    else if (line.rfind("BW\t", 0) == 0) bw.push_back(line);
    else if (line.rfind("ERROR\t", 0) == 0) errors.push_back(std::string(i == 0 ? "[recv] " : "[send] ") + line.substr(6));
    else if (line.rfind("INFO\t", 0) == 0 && i == 0) device = line.substr(5);
  });
  if (!inTime) errors.push_back("the benchmark exceeded 10 minutes and was stopped");
  for (int i = 0; i < 2; ++i) {
    if (procs[i].exited && procs[i].status != 0 && errors.empty()) errors.push_back("worker " + procs[i].describeExit());
  }
  auto field = [](const std::string& line, int k) {
    std::stringstream ss(line);
    std::string f;
    for (int i = 0; i <= k; ++i) std::getline(ss, f, '\t');
    return f;
  };
  std::string dev = field("x\t" + device, 1);
  if (o.json) {
    std::printf("{\"plugin\":\"%s\",\"name\":\"%s\",\"table\":%d,\"device\":\"%s\",\"latency\":[", o.plugin.c_str(),
                name.c_str(), version, dev.c_str());
    for (size_t i = 0; i < lat.size(); ++i) {
      std::printf("%s{\"bytes\":%s,\"median_us\":%s,\"p99_us\":%s}", i ? "," : "", field(lat[i], 1).c_str(),
                  field(lat[i], 2).c_str(), field(lat[i], 3).c_str());
    }
    std::printf("],\"bandwidth\":[");
    for (size_t i = 0; i < bw.size(); ++i) {
      std::printf("%s{\"bytes\":%s,\"gbps\":%s,\"messages\":%s}", i ? "," : "", field(bw[i], 1).c_str(),
                  field(bw[i], 2).c_str(), field(bw[i], 3).c_str());
    }
    std::printf("],\"errors\":%zu}\n", errors.size());
  } else {
    std::printf("plugin %s ('%s', table v%d), device %s\n", o.plugin.c_str(), name.c_str(), version, dev.c_str());
    std::printf("\nping-pong latency (half round trip, pre-posted receives)\n  %10s %12s %12s %8s\n", "size",
                "median us", "p99 us", "iters");
    for (const auto& l : lat) {
      std::printf("  %10s %12s %12s %8s\n", fmtSize(std::stoul(field(l, 1))).c_str(), field(l, 2).c_str(),
                  field(l, 3).c_str(), field(l, 4).c_str());
    }
    std::printf("\nstreaming bandwidth, one connection, 8 messages in flight\n  %10s %12s %10s\n", "size", "Gb/s",
                "messages");
    for (const auto& l : bw) {
      std::printf("  %10s %12s %10s\n", fmtSize(std::stoul(field(l, 1))).c_str(), field(l, 2).c_str(),
                  field(l, 3).c_str());
    }
  }
  for (const auto& e : errors) std::fprintf(stderr, "weft bench: %s\n", e.c_str());
  return errors.empty() ? 0 : 1;
}

}  // namespace weft::harness
