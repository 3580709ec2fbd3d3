// SPDX-License-Identifier: Apache-2.0
// The profiler tables of a plugin file, driven by the replay driver exactly as NCCL drives them, checked record by
// record against values computed by hand here. Runs against libnccl-profiler-weft.so (and the tables inside
// libnccl-net-weft.so). WEFT_TIMING decides which checks apply (ctest runs this binary once per level).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "replay.h"
#include "tests/support/catch_run.h"
#include "weft/nccl/profiler.h"

using nlohmann::json;
using weft::replay::Comm;
using weft::replay::Op;
using weft::replay::Profiler;

namespace {

std::string gDir;

std::string level() {
  const char* v = std::getenv("WEFT_TIMING");
  std::string s = v != nullptr ? v : "coll";
  return s == "1" ? "coll" : s;
}

// ctest selects the cases by level (tests/CMakeLists.txt): the [.off] case alone with WEFT_TIMING=0, every other
// case at every other level. A case run at a level it cannot check fails, saying so, rather than pass unchecked.
#define REQUIRE_TIMING_ON()                                                                        \
  do {                                                                                             \
    INFO("timing is off (WEFT_TIMING=0): this case needs it on; at level 0 run only [.off]");      \
    REQUIRE(level() != "0");                                                                       \
  } while (0)
#define REQUIRE_TIMING_OFF()                                                                       \
  do {                                                                                             \
    INFO("this case checks WEFT_TIMING=0; run it with that");                                      \
    REQUIRE(level() == "0");                                                                       \
  } while (0)

std::string hex(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Every JSON line of every file in the telemetry directory (each must parse).
std::vector<json> allLines() {
  std::vector<json> out;
  DIR* d = opendir(gDir.c_str());
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() < 6 || n.substr(n.size() - 6) != ".jsonl") continue;
    std::ifstream in(gDir + "/" + n);
    std::string line;
    while (std::getline(in, line)) {
      INFO(line);
      out.push_back(json::parse(line));
    }
  }
  closedir(d);
  return out;
}

std::vector<json> linesOf(uint64_t comm, const std::string& type) {
  std::vector<json> out;
  for (auto& j : allLines())
    if (j.value("comm", "") == hex(comm) && j.value("type", "") == type) out.push_back(j);
  return out;
}

std::unique_ptr<Profiler> load(int version, const char* path = WEFT_PROFILER_PATH) {
  return Profiler::load(path, version);
}

// A communicator of 4 ranks on 2 nodes.
Comm comm4x2(uint64_t hash, const std::string& name, int rank) {
  Comm c;
  c.commHash = hash;
  c.name = name;
  c.nNodes = 2;
  c.nRanks = 4;
  c.rank = rank;
  return c;
}

// A collective with two kernel channels: GPU time is the longer channel (60 us).
Op allReduce1M(uint64_t seq) {
  Op op;
  op.func = "AllReduce";
  op.dtype = "ncclFloat32";
  op.count = 262144;  // 1 MiB
  op.algo = "RING";
  op.proto = "SIMPLE";
  op.nChannels = 2;
  op.nWarps = 16;
  op.seq = seq;
  op.pStart = {1000, 1100};
  op.pStop = {51000, 61100};
  op.proxyPeers = {1, 3};
  op.nSteps = 4;
  op.stepBytes = 131072;
  return op;
}

}  // namespace

TEST_CASE("every table version: records carry every field, GPU time and nccl-tests bandwidths", "[replay]") {
  REQUIRE_TIMING_ON();
  for (int v = 1; v <= 7; ++v) {
    DYNAMIC_SECTION("v" << v) {
      auto p = load(v);
      REQUIRE(p->version() == v);
      REQUIRE(std::string(p->name()) == "weft");
      Comm c = comm4x2(0xabc000 + v, "replay-v" + std::to_string(v), 1);
      REQUIRE(p->init(c) == 0);
      REQUIRE(c.ctx != nullptr);
      REQUIRE((c.mask & ncclProfileColl) != 0);
      REQUIRE((c.mask & ncclProfileP2p) != 0);
      CHECK(((c.mask & ncclProfileKernelCh) != 0) == (v >= 3));
      CHECK(((c.mask & ncclProfileProxyOp) != 0) == (level() == "proxy" || level() == "net"));
      CHECK(((c.mask & ncclProfileNetPlugin) != 0) == (level() == "net" && v >= 3));
      CHECK(((c.mask & ncclProfileKernelPhase) != 0) == (v >= 7));

      std::vector<Op> ops;
      ops.push_back(allReduce1M(0));
      Op ag;  // AllGather of 1024 bf16 per rank: 2 KiB; traffic ×4 ranks
      ag.func = "AllGather";
      ag.dtype = "ncclBfloat16";
      ag.count = 1024;
      ag.algo = "RING";
      ag.proto = "LL";
      ag.nChannels = 1;
      ag.nWarps = 8;
      ag.seq = 0;
      ag.pStart = {5000};
      ag.pStop = {13192};  // 8192 ns
      ops.push_back(ag);
      Op bc;  // Broadcast from root 2, factor 1
      bc.func = "Broadcast";
      bc.dtype = "ncclInt8";
      bc.count = 4096;
      bc.root = 2;
      bc.algo = "TREE";
      bc.proto = "LL128";
      bc.nChannels = 1;
      bc.seq = 0;
      bc.pStart = {100};
      bc.pStop = {4196};  // 4096 ns
      bc.graphCaptured = true;
      ops.push_back(bc);
      Op send;  // p2p send of 100 int64 to rank 3
      send.p2p = true;
      send.func = "Send";
      send.dtype = "ncclInt64";
      send.count = 100;
      send.peer = 3;
      send.nChannels = 1;
      send.pStart = {10};
      send.pStop = {810};
      send.proxyPeers = {3};
      ops.push_back(send);
      ops.push_back(allReduce1M(1));

      p->run(c, ops);
      REQUIRE(p->finalize(c) == 0);

      auto colls = linesOf(c.commHash, "coll");
      auto p2ps = linesOf(c.commHash, "p2p");
      REQUIRE(colls.size() == 4);
      REQUIRE(p2ps.size() == 1);
      std::map<std::pair<std::string, uint64_t>, json> byKey;
      for (auto& j : colls) byKey[{j["func"].get<std::string>(), j["seq"].get<uint64_t>()}] = j;
      REQUIRE(byKey.size() == 4);

      bool commAtInit = v >= 4;  // v1-v3 know neither nRanks nor nNodes
      int n = commAtInit ? 4 : 0;
      for (auto& [k, j] : byKey) {
        INFO(j.dump());
        bool proxied = k.first == "AllReduce";  // the operations with proxy ops (network peers)
        CHECK(j["rank"] == 1);
        CHECK(j["nranks"] == n);
        CHECK(j["nnodes"] == (commAtInit ? 2 : 0));
        CHECK(j["partial"] == false);
        CHECK(j["end_ns"].get<uint64_t>() >= j["enqueued_ns"].get<uint64_t>());
        CHECK(j["enqueued_ns"].get<uint64_t>() >= j["start_ns"].get<uint64_t>());
        if (v >= 4) {
          CHECK(j["timing"] == "kernel_gpu");
          CHECK(j["gpu_ns"] == j["exec_ns"]);
        } else if (v == 3) {
          CHECK(j["timing"] == "kernel_cpu");  // 2.26: kernel channels without GPU timers
          CHECK(j["gpu_ns"] == 0);
        } else {
          CHECK(j["timing"] == (level() != "coll" && proxied ? "proxy_cpu" : "collective_cpu"));
        }
      }
      // AllReduce 1 MiB: GPU 60000 ns (max of 50000 and 60000); algBw = 1048576 / 60000 GB/s, busBw × 2·3/4.
      for (uint64_t seq : {0, 1}) {
        json j = byKey[{"AllReduce", seq}];
        INFO(j.dump());
        CHECK(j["dtype"] == "ncclFloat32");
        CHECK(j["count"] == 262144);
        CHECK(j["bytes"] == 1048576);
        CHECK(j["algo"] == "RING");
        CHECK(j["proto"] == "SIMPLE");
        CHECK(j["channels"] == 2);
        CHECK(j["warps"] == 16);
        CHECK(j["root"] == -1);
        CHECK(j["graph"] == false);
        if (v >= 4) {
          CHECK(j["gpu_ns"] == 60000);
          CHECK(j["channels_timed"] == 2);
          CHECK(j["algbw_gbs"].get<double>() == Approx(1048576.0 / 60000).epsilon(1e-3));
          CHECK(j["busbw_gbs"].get<double>() == Approx(1048576.0 / 60000 * 1.5).epsilon(1e-3));
        } else {
          double t = j["exec_ns"].get<double>();
          if (t > 0) CHECK(j["busbw_gbs"].get<double>() == Approx(1048576.0 / t).epsilon(1e-3));  // n unknown: factor 1
        }
      }
      {
        json j = byKey[{"AllGather", 0}];
        INFO(j.dump());
        CHECK(j["dtype"] == "ncclBfloat16");
        CHECK(j["bytes"] == 2048);
        CHECK(j["proto"] == "LL");
        CHECK(j["warps"] == 8);
        if (v >= 4) {
          CHECK(j["gpu_ns"] == 8192);
          CHECK(j["algbw_gbs"].get<double>() == Approx(2048.0 * 4 / 8192).epsilon(1e-3));
          CHECK(j["busbw_gbs"].get<double>() == Approx(2048.0 * 4 / 8192 * 0.75).epsilon(1e-3));
        }
      }
      {
        json j = byKey[{"Broadcast", 0}];
        INFO(j.dump());
        CHECK(j["root"] == 2);
        CHECK(j["algo"] == "TREE");
        CHECK(j["proto"] == "LL128");
        CHECK(j["dtype"] == "ncclInt8");
        CHECK(j["graph"] == (v >= 5));  // graph capture is known from the CollApi event (v5+)
        if (v >= 4) CHECK(j["busbw_gbs"].get<double>() == Approx(4096.0 / 4096).epsilon(1e-3));
      }
      {
        json j = p2ps[0];
        INFO(j.dump());
        CHECK(j["func"] == "Send");
        CHECK(j["peer"] == 3);
        CHECK(j["bytes"] == 800);
        CHECK(j["dtype"] == "ncclInt64");
        if (v >= 4) {
          CHECK(j["gpu_ns"] == 800);
          CHECK(j["busbw_gbs"].get<double>() == Approx(1.0).epsilon(1e-3));
        }
      }
      // Per-peer proxy counters: 2 AllReduce × 4 steps × 128 KiB to each of peers 1 and 3, plus the send to 3
      // (2 steps × 64 KiB).
      auto peers = linesOf(c.commHash, "peer");
      if (level() == "coll") {
        CHECK(peers.empty());
      } else {
        std::map<int, json> byPeer;
        for (auto& j : peers) byPeer[j["peer"].get<int>()] = j;
        REQUIRE(byPeer.count(1) == 1);
        REQUIRE(byPeer.count(3) == 1);
        CHECK(byPeer[1]["send_bytes"] == 2 * 4 * 131072);
        CHECK(byPeer[3]["send_bytes"] == 2 * 4 * 131072 + 2 * 65536);
        CHECK(byPeer[1]["ops"] == 2);
        CHECK(byPeer[3]["ops"] == 3);
        if (v >= 4) CHECK(byPeer[1]["send_steps"] == 8);
        if (level() == "net" && v >= 3) {
          CHECK(byPeer[1]["net_msgs"] == 8);
          CHECK(byPeer[1]["net_bytes"] == 8 * 131072);
        } else {
          CHECK(byPeer[1]["net_msgs"] == 0);
        }
      }
      auto ends = linesOf(c.commHash, "comm_end");
      REQUIRE(ends.size() == 1);
      CHECK(ends[0]["records"] == 5);
      CHECK(ends[0]["dropped"] == 0);
      if (v >= 4) {
        // The summary table went to NCCL's log (the logger init received).
        bool header = false, row = false;
        for (auto& l : weft::replay::logLines()) {
          if (l.find(hex(c.commHash)) != std::string::npos && l.find("5 collectives") == std::string::npos &&
              l.find("4 collectives, 1 p2p") != std::string::npos)
            header = true;
          if (l.find("AllReduce") != std::string::npos && l.find("RING/SIMPLE 100%") != std::string::npos &&
              l.find("1M") != std::string::npos)
            row = true;
        }
        CHECK(header);
        CHECK(row);
      }
    }
  }
}

// In real jobs the CPU often enqueues seconds ahead of the GPU: the kernel channels and the proxy's steps of an
// operation come long after NCCL stopped its Coll/P2p event. Records must wait for them (complete, with their GPU
// times), not be closed by a window measured from the CPU side (200 ms, 2 s before).
TEST_CASE("the GPU 5 s behind the CPU: every record complete, with its GPU time", "[replay][lag]") {
  REQUIRE_TIMING_ON();
  for (int v : {3, 4, 6}) {
    DYNAMIC_SECTION("v" << v) {
      auto p = load(v);
      p->setGpuLagMs(5000);
      Comm c = comm4x2(0x1a9000 + v, "lag-v" + std::to_string(v), 0);
      REQUIRE(p->init(c) == 0);
      std::vector<Op> ops;
      ops.push_back(allReduce1M(0));  // with proxy ops (network peers)
      for (uint64_t seq = 0; seq < 3; ++seq) {  // intra-node: kernel channels only
        Op ag;
        ag.func = "AllGather";
        ag.dtype = "ncclBfloat16";
        ag.count = 1024;
        ag.nChannels = 1;
        ag.seq = seq;
        ag.pStart = {5000};
        ag.pStop = {13192};  // 8192 ns
        ops.push_back(ag);
      }
      ops.push_back(allReduce1M(1));
      auto t0 = std::chrono::steady_clock::now();
      p->run(c, ops);
      CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(5000));
      // The records are written before finalize (which writes out whatever is left, complete or not): wait for the
      // writer, then look.
      std::vector<json> colls;
      for (int i = 0; i < 100 && colls.size() < ops.size(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        colls = linesOf(c.commHash, "coll");
      }
      CHECK(colls.size() == ops.size());  // written while the job runs, not only at finalize
      REQUIRE(p->finalize(c) == 0);
      colls = linesOf(c.commHash, "coll");
      REQUIRE(colls.size() == ops.size());
      for (auto& j : colls) {
        INFO(j.dump());
        CHECK(j["partial"] == false);
        if (v >= 4) {
          CHECK(j["timing"] == "kernel_gpu");
          CHECK(j["gpu_ns"] == (j["func"] == "AllGather" ? 8192 : 60000));
        } else {
          CHECK(j["timing"] == "kernel_cpu");
        }
      }
      auto ends = linesOf(c.commHash, "comm_end");
      REQUIRE(ends.size() == 1);
      CHECK(ends[0]["partial"] == 0);
      CHECK(ends[0]["dropped"] == 0);
    }
  }
}

TEST_CASE("several communicators on several threads at once: nothing lost, nothing mixed up", "[replay]") {
  REQUIRE_TIMING_ON();
  auto p = load(5);
  // 4 x 5000 operations cycle every slot of weft's event pools several times over (a lost slot would show as
  // operations not recorded).
  constexpr int kComms = 4, kOps = 5000;
  std::vector<Comm> comms(kComms);
  for (int i = 0; i < kComms; ++i) {
    comms[i].commHash = 0xc0ffee00 + i;
    comms[i].nRanks = 8;
    comms[i].rank = i;
    REQUIRE(p->init(comms[i]) == 0);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kComms; ++i) {
    threads.emplace_back([&, i] {
      std::vector<Op> ops;
      for (int s = 0; s < kOps; ++s) {
        Op op = allReduce1M(static_cast<uint64_t>(s));
        op.count = 256u * (1u + static_cast<unsigned>(i));
        op.pStop = {1000 + 1000u * static_cast<uint64_t>(i + 1), 1100};
        ops.push_back(op);
      }
      p->run(comms[i], ops);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& c : comms) REQUIRE(p->finalize(c) == 0);
  for (int i = 0; i < kComms; ++i) {
    auto recs = linesOf(comms[i].commHash, "coll");
    REQUIRE(recs.size() == kOps);
    std::set<uint64_t> seqs;
    for (auto& j : recs) {
      seqs.insert(j["seq"].get<uint64_t>());
      CHECK(j["rank"] == i);
      CHECK(j["count"] == 256 * (1 + i));
      CHECK(j["gpu_ns"] == 1000 * (i + 1));
      CHECK(j["partial"] == false);
    }
    CHECK(seqs.size() == kOps);
    CHECK(*seqs.rbegin() == kOps - 1);
    auto ends = linesOf(comms[i].commHash, "comm_end");
    REQUIRE(ends.size() == 1);
    CHECK(ends[0]["dropped"] == 0);
    CHECK(ends[0]["partial"] == 0);
  }
}

TEST_CASE("hostile input: unknown types, NULL and garbage pointers, stop without start, double stop", "[replay]") {
  REQUIRE_TIMING_ON();
  for (int v : {1, 4, 5, 6, 7}) {
    DYNAMIC_SECTION("v" << v) {
      auto p = load(v);
      Comm c;
      c.commHash = 0xbad000 + v;
      c.nRanks = 2;
      REQUIRE(p->init(c) == 0);
      void* h = reinterpret_cast<void*>(0x1);
      // unknown event type: a handle (non-NULL so that NCCL would keep sending its children), no crash
      CHECK(p->startRaw(c.ctx, &h, 1ull << 20, nullptr, false) == 0);
      CHECK(p->stop(h) == 0);
      CHECK(p->record(h, 99, 5, false) == 0);
      // a NULL descriptor, a NULL context, a garbage context
      h = reinterpret_cast<void*>(0x1);
      CHECK(p->startRaw(c.ctx, &h, ncclProfileColl, nullptr, true) == 0);
      CHECK(h == nullptr);
      CHECK(p->startRaw(nullptr, &h, ncclProfileColl, nullptr, false) == 0);
      CHECK(h == nullptr);
      int junk[64] = {0};
      CHECK(p->startRaw(junk, &h, ncclProfileColl, nullptr, false) == 0);
      CHECK(h == nullptr);
      // stops and records on NULL (NCCL forwards stopEvent(NULL) from net plugins) and on garbage
      CHECK(p->stop(nullptr) == 0);
      CHECK(p->stop(junk) == 0);
      CHECK(p->stop(reinterpret_cast<void*>(0x10)) == 0);
      CHECK(p->record(nullptr, ncclProfilerKernelChStop, 1, false) == 0);
      CHECK(p->record(junk, ncclProfilerKernelChStop, 1, false) == 0);
      // children whose parent is garbage; a kernel channel that is stopped twice; a record after its stop
      void* k = nullptr;
      CHECK(p->startRaw(c.ctx, &k, ncclProfileKernelCh, junk, false) == 0);
      CHECK(p->record(k, ncclProfilerKernelChStop, 100, true) == 0);
      CHECK(p->stop(k) == 0);
      CHECK(p->stop(k) == 0);
      CHECK(p->record(k, ncclProfilerKernelChStop, 100, false) == 0);
      void* s = nullptr;
      CHECK(p->startRaw(c.ctx, &s, ncclProfileProxyStep, junk, false) == 0);
      CHECK(p->stop(s) == 0);
      // a collective stopped twice counts once
      void* coll = nullptr;
      CHECK(p->startRaw(c.ctx, &coll, ncclProfileColl, nullptr, false) == 0);
      CHECK(coll != nullptr);
      CHECK(p->stop(coll) == 0);
      CHECK(p->stop(coll) == 0);
      // a PXN proxy op from another process: its parent is another address space's pointer, never touched
      std::vector<Op> ops{allReduce1M(7)};
      ops[0].proxyPid = getpid() + 100000;
      ops[0].proxyParent = reinterpret_cast<void*>(0xdead0000);
      p->run(c, ops);
      // and a normal operation after all that is recorded correctly
      p->run(c, {allReduce1M(8)});
      CHECK(p->finalize(c) == 0);
      // finalize of garbage / twice
      void* dead = c.ctx;
      CHECK(p->finalize(c) == 0);
      c.ctx = junk;
      CHECK(p->finalize(c) == 0);
      c.ctx = dead;
      auto recs = linesOf(c.commHash, "coll");
      std::map<uint64_t, json> bySeq;
      for (auto& j : recs) bySeq[j["seq"].get<uint64_t>()] = j;
      REQUIRE(bySeq.count(8) == 1);
      REQUIRE(bySeq.count(7) == 1);
      // the raw collective (seq 0; v1-v3 descriptors carry their own comm hash, 0 in the raw one), 7 and 8
      CHECK(recs.size() == (v >= 4 ? 3u : 2u));
      if (v >= 4) {
        CHECK(bySeq[8]["gpu_ns"] == 60000);
        CHECK(bySeq[7]["gpu_ns"] == 60000);  // kernel channels still attach; only the PXN proxy op does not
      }
    }
  }
}

TEST_CASE("the tables inside libnccl-net-weft.so are the same profiler (NCCL 2.28.3+ finds them there)", "[replay]") {
  REQUIRE_TIMING_ON();
  auto p = load(6, WEFT_NET_PLUGIN_PATH);
  Comm c;
  c.commHash = 0x6e6e7401;
  c.nRanks = 4;
  REQUIRE(p->init(c) == 0);
  p->run(c, {allReduce1M(0)});
  REQUIRE(p->finalize(c) == 0);
  auto recs = linesOf(c.commHash, "coll");
  REQUIRE(recs.size() == 1);
  CHECK(recs[0]["gpu_ns"] == 60000);
}

TEST_CASE("WEFT_TIMING=0 turns timing off: mask 0, no context, no records", "[.off]") {
  REQUIRE_TIMING_OFF();
  for (int v = 1; v <= 7; ++v) {
    auto p = load(v);
    Comm c;
    c.commHash = 0x0ff000 + v;
    c.mask = -1;
    REQUIRE(p->init(c) == 0);
    CHECK(c.mask == 0);
    CHECK(c.ctx == nullptr);
    void* h = reinterpret_cast<void*>(0x1);
    CHECK(p->startRaw(c.ctx, &h, ncclProfileColl, nullptr, false) == 0);
    CHECK(h == nullptr);
    CHECK(p->finalize(c) == 0);
    CHECK(linesOf(c.commHash, "coll").empty());
  }
}

TEST_CASE("the Prometheus textfile holds the aggregates", "[replay]") {
  REQUIRE_TIMING_ON();
  auto p = load(5);
  Comm c;
  c.commHash = 0x9e0e0e01;
  c.name = "prom\"test";
  c.nRanks = 4;
  REQUIRE(p->init(c) == 0);
  std::vector<Op> ops;
  for (int i = 0; i < 10; ++i) ops.push_back(allReduce1M(static_cast<uint64_t>(i)));
  p->run(c, ops);
  REQUIRE(p->finalize(c) == 0);
  std::ifstream in(gDir + "/weft.prom");
  REQUIRE(in.good());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string labels = "comm=\"" + hex(c.commHash) +
                       "\",comm_name=\"prom\\\"test\",rank=\"0\",nranks=\"4\",nnodes=\"1\",collective=\"AllReduce\","
                       "size=\"1M\",algo_proto=\"RING_SIMPLE\"";
  INFO(text);
  CHECK(text.find("weft_collective_total{" + labels + "} 10\n") != std::string::npos);
  CHECK(text.find("weft_collective_bytes_total{" + labels + "} 10485760\n") != std::string::npos);
  CHECK(text.find("weft_collective_exec_seconds_total{" + labels + "} 0.000600000\n") != std::string::npos);
  CHECK(text.find("weft_collective_busbw_gbs{" + labels + "} 26.2144\n") != std::string::npos);
  CHECK(text.find("# TYPE weft_collective_total counter") != std::string::npos);
  // The anomaly counters of the process (the hostile-input test before this one made some).
  CHECK(text.find("# TYPE weft_timing_anomalies_total counter") != std::string::npos);
  CHECK(text.find("weft_timing_anomalies_total{kind=\"double_stop\"} ") != std::string::npos);
}

// NCCL 2.32 (v7): the user's tag of each call reaches its record, and the kernel barrier phases of each channel
// (children of the channel's KernelCh, fired just before it stops) become the longest channel's time per phase.
TEST_CASE("v7: user tags and kernel phases in every record", "[replay][v7]") {
  REQUIRE_TIMING_ON();
  auto p = load(7);
  REQUIRE(p->version() == 7);
  Comm c = comm4x2(0x7a6000, "tags", 2);
  REQUIRE(p->init(c) == 0);
  REQUIRE((c.mask & ncclProfileKernelPhase) != 0);
  std::vector<Op> ops;
  Op a = allReduce1M(0);  // channels 10000..61100 and 1100..51000: phases per channel
  a.userTag = 1;
  a.phases = {{1000, 21000, 41000, 51000}, {1100, 6100, 56100, 61100}};
  ops.push_back(a);
  Op b = allReduce1M(1);  // tagged, phases with a missing boundary and a zero-length one: those are not sent
  b.userTag = 0x7000000000000001ull;  // tags are 64-bit
  b.phases = {{1000, 1000, 41000, 51000}, {0, 6100, 56100, 0}};
  ops.push_back(b);
  Op u = allReduce1M(2);  // untagged, no phases (a kernel that does not time its barriers)
  ops.push_back(u);
  Op send;
  send.p2p = true;
  send.func = "Send";
  send.dtype = "ncclInt8";
  send.count = 4096;
  send.peer = 3;
  send.nChannels = 1;
  send.pStart = {10};
  send.pStop = {1010};
  send.userTag = 3;
  send.phases = {{10, 110, 910, 1010}};
  ops.push_back(send);
  p->run(c, ops);
  REQUIRE(p->finalize(c) == 0);
  std::map<uint64_t, json> bySeq;
  for (auto& j : linesOf(c.commHash, "coll")) bySeq[j["seq"].get<uint64_t>()] = j;
  REQUIRE(bySeq.size() == 3);
  {
    json j = bySeq[0];
    INFO(j.dump());
    CHECK(j["tag"] == 1);
    CHECK(j["channels_phased"] == 2);
    // initial sync: max(20000, 5000); compute: max(20000, 50000); final sync: max(10000, 5000)
    CHECK(j["phases_ns"] == json::array({20000, 50000, 10000}));
    CHECK(j["gpu_ns"] == 60000);  // the channels' own times are unchanged by their phases
  }
  {
    json j = bySeq[1];
    INFO(j.dump());
    CHECK(j["tag"].get<uint64_t>() == 0x7000000000000001ull);
    // channel 0: initial sync has no length (not sent); channel 1: only compute has both boundaries
    CHECK(j["channels_phased"] == 2);
    CHECK(j["phases_ns"] == json::array({0, 50000, 10000}));
  }
  {
    json j = bySeq[2];
    INFO(j.dump());
    CHECK(j["tag"] == 0);
    CHECK(j.contains("phases_ns") == false);
    CHECK(j.contains("channels_phased") == false);
    CHECK(j.contains("tag_name") == false);
  }
  auto p2ps = linesOf(c.commHash, "p2p");
  REQUIRE(p2ps.size() == 1);
  CHECK(p2ps[0]["tag"] == 3);
  CHECK(p2ps[0]["phases_ns"] == json::array({100, 800, 100}));
}

TEST_CASE("v7 hostile input: phases of garbage or finished channels, phase stops on other events", "[replay][v7]") {
  REQUIRE_TIMING_ON();
  auto p = load(7);
  Comm c;
  c.commHash = 0xbad7a5;
  c.nRanks = 2;
  REQUIRE(p->init(c) == 0);
  int junk[64] = {0};
  // a phase whose parent is garbage, NULL, or a collective (not a channel): a handle, counted nowhere
  for (void* parent : {static_cast<void*>(junk), static_cast<void*>(nullptr)}) {
    void* ph = nullptr;
    CHECK(p->startRaw(c.ctx, &ph, ncclProfileKernelPhase, parent, false) == 0);
    CHECK(p->record(ph, ncclProfilerKernelPhaseStop, 500, false) == 0);
    CHECK(p->stop(ph) == 0);
    CHECK(p->stop(ph) == 0);
  }
  void* coll = nullptr;
  CHECK(p->startRaw(c.ctx, &coll, ncclProfileColl, nullptr, false) == 0);
  void* ph = nullptr;
  CHECK(p->startRaw(c.ctx, &ph, ncclProfileKernelPhase, coll, false) == 0);
  CHECK(p->record(ph, ncclProfilerKernelPhaseStop, 500, false) == 0);
  CHECK(p->stop(ph) == 0);
  // a phase stop recorded on a kernel channel and on a collective: ignored, as any state that does not apply
  void* k = nullptr;
  CHECK(p->startRaw(c.ctx, &k, ncclProfileKernelCh, coll, false) == 0);
  CHECK(p->record(k, ncclProfilerKernelPhaseStop, 7, false) == 0);
  CHECK(p->record(coll, ncclProfilerKernelPhaseStop, 7, false) == 0);
  // a phase of a channel that already stopped (out of NCCL's order): not counted
  CHECK(p->stop(k) == 0);
  void* late = nullptr;
  CHECK(p->startRaw(c.ctx, &late, ncclProfileKernelPhase, k, false) == 0);
  CHECK(p->stop(late) == 0);
  CHECK(p->stop(coll) == 0);
  // and a normal tagged operation afterwards is recorded in full
  Op a = allReduce1M(9);
  a.userTag = 42;
  a.phases = {{1000, 2000, 50000, 51000}, {1100, 1200, 61000, 61100}};
  p->run(c, {a});
  CHECK(p->finalize(c) == 0);
  std::map<uint64_t, json> bySeq;
  for (auto& j : linesOf(c.commHash, "coll")) bySeq[j["seq"].get<uint64_t>()] = j;
  REQUIRE(bySeq.count(9) == 1);
  CHECK(bySeq[9]["tag"] == 42);
  CHECK(bySeq[9]["phases_ns"] == json::array({1000, 59800, 1000}));
  REQUIRE(bySeq.count(0) == 1);  // the raw collective: its channel had no timers and its phases did not count
  CHECK(bySeq[0].contains("phases_ns") == false);
}

TEST_CASE("v7: the Prometheus file has the top WEFT_PROM_TAGS tags by time, the rest as other, with names", "[replay][v7]") {
  REQUIRE_TIMING_ON();
  auto p = load(7);
  Comm c;
  c.commHash = 0x7a6e0e01;
  c.name = "tagprom";
  c.nRanks = 4;
  REQUIRE(p->init(c) == 0);
  std::vector<Op> ops;
  // tag 1 (named "forward"): 5 x 60 us; tag 2 ("backward"): 3 x 60 us; tags 5 and 6: 1 each; untagged: 2
  uint64_t seq = 0;
  auto add = [&](uint64_t tag, int n) {
    for (int i = 0; i < n; ++i) {
      Op o = allReduce1M(seq++);
      o.userTag = tag;
      o.phases = {{1000, 11000, 41000, 51000}, {1100, 3100, 59100, 61100}};  // sync 10000 + 10000 (channel 0)
      ops.push_back(o);
    }
  };
  add(1, 5);
  add(2, 3);
  add(5, 1);
  add(6, 1);
  add(0, 2);
  p->run(c, ops);
  REQUIRE(p->finalize(c) == 0);
  std::ifstream in(gDir + "/weft.prom");
  REQUIRE(in.good());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(text);
  std::string base = "comm=\"" + hex(c.commHash) + "\",comm_name=\"tagprom\",rank=\"0\",nranks=\"4\",nnodes=\"1\"";
  // WEFT_PROM_TAGS=2 and WEFT_TAG_NAMES=1=forward,2=backward (main() sets them)
  CHECK(text.find("weft_tag_operations_total{" + base + ",tag=\"forward\"} 5\n") != std::string::npos);
  CHECK(text.find("weft_tag_operations_total{" + base + ",tag=\"backward\"} 3\n") != std::string::npos);
  CHECK(text.find("weft_tag_operations_total{" + base + ",tag=\"other\"} 2\n") != std::string::npos);
  CHECK(text.find(",tag=\"5\"") == std::string::npos);
  CHECK(text.find("weft_tag_exec_seconds_total{" + base + ",tag=\"forward\"} 0.000300000\n") != std::string::npos);
  CHECK(text.find("weft_tag_bytes_total{" + base + ",tag=\"backward\"} 3145728\n") != std::string::npos);
  // sync wait per operation: the longest channel's initial sync (10000) + final sync (10000) = 20 us
  CHECK(text.find("weft_tag_sync_wait_seconds_total{" + base + ",tag=\"forward\"} 0.000100000\n") != std::string::npos);
  CHECK(text.find("# TYPE weft_tag_operations_total counter") != std::string::npos);
  // the records carry the names too
  std::map<uint64_t, json> bySeq;
  for (auto& j : linesOf(c.commHash, "coll")) bySeq[j["seq"].get<uint64_t>()] = j;
  CHECK(bySeq[0]["tag_name"] == "forward");
  CHECK(bySeq[5]["tag_name"] == "backward");
  CHECK(bySeq[8].contains("tag_name") == false);
}

int main(int argc, char** argv) {
  // The plugin reads its environment at first use: point it at a fresh directory before anything loads it.
  char tmpl[] = "/tmp/weft-profiler-test-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 2;
  gDir = tmpl;
  setenv("WEFT_TELEMETRY_DIR", gDir.c_str(), 1);
  setenv("WEFT_PROM_FILE", (gDir + "/weft.prom").c_str(), 1);
  setenv("WEFT_PROM_TAGS", "2", 1);
  setenv("WEFT_TAG_NAMES", "1=forward,2=backward,junk,0=zero", 1);  // the bad entries: a warning, ignored
  int rc = weft::testing::runCatch(argc, argv);
  if (rc == 0 && std::getenv("WEFT_KEEP_TELEMETRY") == nullptr) {
    std::string cmd = "rm -rf '" + gDir + "'";
    if (std::system(cmd.c_str()) != 0) return 3;
  }
  return rc;
}
