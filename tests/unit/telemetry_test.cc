// SPDX-License-Identifier: Apache-2.0
// The arithmetic every exporter and `weft report` share: size buckets, nccl-tests bandwidth factors, names,
// the latency histogram's quantiles; a rail's health and connection records read back.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>

#include "weft/common/rail_health.h"
#include "weft/telemetry/histogram.h"
#include "weft/telemetry/record.h"
#include "weft/telemetry/record_reader.h"

using namespace weft::telemetry;

TEST_CASE("size buckets are powers of two, labelled by their upper bound", "[telemetry]") {
  CHECK(octaveBucket(0) == 0);
  CHECK(octaveBucket(1) == 0);
  CHECK(octaveBucket(2) == 1);
  CHECK(octaveBucket(3) == 2);
  CHECK(octaveBucket(4096) == 12);
  CHECK(octaveBucket(4097) == 13);
  CHECK(std::string(octaveBucketLabel(12)) == "4K");
  CHECK(std::string(octaveBucketLabel(20)) == "1M");
  CHECK(std::string(octaveBucketLabel(9)) == "512");
  CHECK(std::string(octaveBucketLabel(33)) == "8G");
}

TEST_CASE("bandwidths follow nccl-tests: traffic and bus factor per collective", "[telemetry]") {
  // AllReduce 1 GB in 10 ms on 8 ranks: algBw 100 GB/s, busBw × 2·7/8
  CHECK(algBwGBs(Func::kAllReduce, 1000000000, 8, 10000000) == Approx(100.0));
  CHECK(busBwGBs(Func::kAllReduce, 1000000000, 8, 10000000) == Approx(175.0));
  // AllGather: bytes is the per-rank part; traffic × n, factor (n−1)/n
  CHECK(algBwGBs(Func::kAllGather, 1000000, 4, 1000000) == Approx(4.0));
  CHECK(busBwGBs(Func::kAllGather, 1000000, 4, 1000000) == Approx(3.0));
  CHECK(busBwGBs(Func::kReduceScatter, 1000000, 4, 1000000) == Approx(3.0));
  CHECK(busBwGBs(Func::kAllToAll, 1000000, 4, 1000000) == Approx(3.0));
  CHECK(busBwGBs(Func::kBroadcast, 1000000, 4, 1000000) == Approx(1.0));
  CHECK(busBwGBs(Func::kSend, 1000000, 4, 1000000) == Approx(1.0));
  CHECK(busBwGBs(Func::kAllReduce, 1000000, 4, 0) == 0.0);  // no time, no bandwidth
  CHECK(busFactor(Func::kAllReduce, 0) == 1.0);               // ranks unknown (NCCL < 2.27)
}

TEST_CASE("names round-trip and unknown text maps to unknown", "[telemetry]") {
  for (int f = 0; f < kNumFuncs - 1; ++f) CHECK(funcFromName(funcName(static_cast<Func>(f))) == static_cast<Func>(f));
  CHECK(funcFromName("AllToAll") == Func::kAllToAll);
  CHECK(funcFromName("Bogus") == Func::kUnknown);
  CHECK(funcFromNumber(4) == Func::kAllReduce);
  CHECK(funcFromNumber(99) == Func::kUnknown);
  CHECK(typeFromName("ncclFloat32") == 7);
  CHECK(typeFromName("float32") == 7);
  CHECK(typeFromName("ncclHalf") == 6);
  CHECK(typeSize(typeFromName("ncclBfloat16")) == 2);
  CHECK(typeSize(kUnknownType) == 0);
  CHECK(algoFromName("NVLS_TREE") == 5);
  CHECK(std::string(algoName(6)) == "PAT");
  CHECK(protoFromName("simple") == 2);
  CHECK(protoFromName("LL256") == kUnknownAlgo);
}

TEST_CASE("the latency histogram's quantiles are within its bucket width", "[telemetry]") {
  LatencyHistogram h;
  CHECK(h.quantileNs(0.5) == 0.0);
  for (uint64_t i = 1; i <= 10000; ++i) h.add(i * 1000);  // 1 us .. 10 ms, uniform
  CHECK(h.count() == 10000);
  CHECK(h.quantileNs(0.5) == Approx(5.0e6).epsilon(0.10));
  CHECK(h.quantileNs(0.99) == Approx(9.9e6).epsilon(0.10));
  CHECK(h.quantileNs(0.0) == Approx(1000).epsilon(0.10));
  h.add(0);
  h.add(UINT64_MAX);  // clamps into the last bucket, no overflow
  CHECK(h.count() == 10002);
  h.reset();
  CHECK(h.count() == 0);
}

TEST_CASE("a rail's health: each transition counted once, what was sent kept", "[telemetry][rails]") {
  weft::RailHealth h;
  h.setDevice("a-name-longer-than-the-field-holds-0123456789");
  CHECK(std::strlen(h.device) == sizeof(h.device) - 1);
  CHECK(h.up.load() == 1);
  CHECK_FALSE(h.markUp());  // already up: nothing to count
  CHECK(h.markDown(weft::RailEvent::kLinkDown));
  CHECK_FALSE(h.markDown(weft::RailEvent::kPeerGone));  // down already: the first reason stays
  CHECK(h.lastDownEvent() == weft::RailEvent::kLinkDown);
  CHECK(h.markUp());
  CHECK(h.markDown(weft::RailEvent::kErrorCompletion));
  CHECK(h.downs.load() == 2);
  CHECK(h.recoveries.load() == 1);
  CHECK(std::string(weft::railEventName(h.lastDownEvent())) == "error_completion");
  h.countSend(100);
  h.countSend(28);
  CHECK(h.msgs.load() == 2);
  CHECK(h.bytes.load() == 128);
}

TEST_CASE("connection records are read back with their rails, and skipped by readers that want none",
          "[telemetry][rails]") {
  const std::string line =
      R"({"v":1,"type":"conn","host":"h","pid":7,"conn":1,"dir":"send","peer":"p","device":"e0+e1","msgs":3,)"
      R"("bytes":300,"lat_p50_us":1.0,"lat_p99_us":2.0,"rails":[{"rail":0,"device":"e0","up":true,"downs":0,)"
      R"("recoveries":0,"last_down":"none","msgs":2,"bytes":200},{"rail":1,"device":"e1","up":false,"downs":2,)"
      R"("recoveries":1,"last_down":"link_down","msgs":1,"bytes":100,"failovers":1,"moved":3,"readmits":1,)"
      R"("msgs_since_readmit":7}],"time_ns":5})";
  OpRecord op;
  std::string comm, name, err;
  ConnRecord c;
  REQUIRE(parseRecordLine(line, &op, &comm, &name, &err, &c) == LineKind::kConn);
  CHECK(c.host == "h");
  CHECK(c.device == "e0+e1");
  REQUIRE(c.rails.size() == 2);
  CHECK(c.rails[1].device == "e1");
  CHECK_FALSE(c.rails[1].up);
  CHECK(c.rails[1].downs == 2);
  CHECK(c.rails[1].recoveries == 1);
  CHECK(c.rails[1].lastDown == "link_down");
  CHECK(c.rails[0].bytes == 200);
  CHECK(c.rails[1].failovers == 1);  // rail failover; absent (older records, rail 0 here): 0
  CHECK(c.rails[1].moved == 3);
  CHECK(c.rails[0].failovers == 0);
  CHECK(c.rails[1].readmits == 1);
  CHECK(c.rails[1].msgsSinceReadmit == 7);
  CHECK(c.rails[0].readmits == 0);
  CHECK(parseRecordLine(line, &op, &comm, &name, &err) == LineKind::kOther);
  CHECK(c.numa == -1);  // written before weft recorded locality
  CHECK(c.gpu.empty());
  // Where the connection ran: the NIC's NUMA node, the GPU and the path between them.
  REQUIRE(parseRecordLine(R"({"v":1,"type":"conn","host":"h","pid":7,"device":"mlx5_0","numa":1,)"
                          R"("gpu":"0000:01:00.0","gpu_path":"SYS","msgs":1})",
                          &op, &comm, &name, &err, &c) == LineKind::kConn);
  CHECK(c.numa == 1);
  CHECK(c.gpu == "0000:01:00.0");
  CHECK(c.gpuPath == "SYS");
  // A single-rail connection has no rails; a malformed rail is a malformed line.
  CHECK(parseRecordLine(R"({"v":1,"type":"conn","host":"h","msgs":1})", &op, &comm, &name, &err, &c) ==
        LineKind::kConn);
  CHECK(c.rails.empty());
  CHECK(parseRecordLine(R"({"v":1,"type":"conn","rails":[{"up":true}]})", &op, &comm, &name, &err, &c) ==
        LineKind::kMalformed);
}
