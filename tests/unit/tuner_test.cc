// SPDX-License-Identifier: Apache-2.0
// The tuner's logic in-process: NCCL's reference cost model against the worked example, profile parsing (and a
// mutation fuzz of it), the decision rules (IGNORE, margin, interpolation, extrapolation limit, rules, force,
// exploration), and the simulated worlds' targets.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include <nlohmann/json.hpp>

#include "tuner/nccl_model.h"
#include "tuner/nccl_env.h"
#include "tuner/policy.h"
#include "tuner/profile.h"
#include "tuner/sim.h"

using namespace weft::tuner;

namespace {
model::Topology hopper(int nodes) {
  model::Topology t;
  t.nNodes = nodes;
  t.nRanks = 8 * nodes;
  t.cc = 2;
  return t;
}
}  // namespace

TEST_CASE("reference model: the latency terms of the worked example (AllReduce, Hopper, 8 GPUs/node, Intel)",
          "[tuner][model]") {
  struct Row {
    int nodes;
    double ring[3], tree[3], nvls;
  };
  const Row rows[] = {{1, {15.0, 40.6, 56.0}, {15.2, 31.5, 64.4}, 25},
                      {2, {40.0, 75.2, 131.6}, {25.2, 48.5, 92.4}, 66.8},
                      {16, {311.6, 559.6, 1190}, {55.2, 99.5, 176.4}, 192.2}};
  for (const Row& r : rows) {
    model::Topology t = hopper(r.nodes);
    t.nvls = true;
    INFO(r.nodes << " nodes");
    for (int p = 0; p < 3; ++p) {
      CHECK(model::latencyUs(t, 4, 1, p) == Approx(r.ring[p]).epsilon(1e-6));
      CHECK(model::latencyUs(t, 4, 0, p) == Approx(r.tree[p]).epsilon(1e-6));
    }
    CHECK(model::latencyUs(t, 4, r.nodes == 1 ? 4 : 5, 2) == Approx(r.nvls).epsilon(1e-6));
  }
}

TEST_CASE("reference model: the table NCCL hands the tuner and NCCL's pick", "[tuner][model]") {
  model::Topology t = hopper(2);
  model::Table small = model::costTable(t, 4, 4096, 1);
  model::Table large = model::costTable(t, 4, 256u << 20, 1);
  // AllReduce: Tree and Ring valid; CollNet, NVLS (not enabled), PAT never
  CHECK(small.t[0][0] >= 0);
  CHECK(small.t[1][2] >= 0);
  CHECK(small.t[2][2] == -1.0f);
  CHECK(small.t[4][2] == -1.0f);
  CHECK(small.t[6][2] == -1.0f);
  // Broadcast: Ring only; one rank: only Ring/Simple at 0
  model::Table bc = model::costTable(t, 0, 4096, 1);
  CHECK(bc.t[0][0] == -1.0f);
  CHECK(bc.t[1][0] >= 0);
  model::Topology one = t;
  one.nRanks = one.nNodes = 1;
  CHECK(model::pick(model::costTable(one, 4, 1 << 20, 1)).algo == 1);
  // small messages: a latency-bound protocol; large: a bandwidth one, all channels
  model::Pick ps = model::pick(small), pl = model::pick(large);
  CHECK(ps.proto == 0);  // LL
  CHECK(pl.proto != 0);
  CHECK(pl.channels == t.nChannels);
  CHECK(ps.channels < t.nChannels);  // topoGetAlgoInfo drops channels for small messages
  // no LL128 where it is not verified
  t.ll128 = false;
  model::Table nol = model::costTable(t, 4, 1 << 20, 1);
  CHECK(nol.t[1][1] == -1.0f);
  CHECK(nol.t[0][1] == -1.0f);
}

namespace {
Profile tinyProfile() {
  Profile p;
  p.sig.nRanks = 16;
  p.sig.nNodes = 2;
  auto add = [&](int coll, uint64_t bytes, int algo, int proto, int ch, double us) {
    Measurement m;
    m.coll = coll;
    m.bytes = bytes;
    m.arm.algo = static_cast<int8_t>(algo);
    m.arm.proto = static_cast<int8_t>(proto);
    m.arm.channels = static_cast<int16_t>(ch);
    m.timeUs = us;
    m.samples = 10;
    m.spread = 0.01;
    p.measurements.push_back(m);
  };
  // AllReduce at 1 MiB and 4 MiB: Ring/Simple clearly beats Tree/Simple; Tree/LL128 measured at 1 MiB only
  add(4, 1 << 20, 0, 2, 0, 100.0);
  add(4, 1 << 20, 1, 2, 0, 70.0);
  add(4, 1 << 20, 0, 1, 0, 69.0);  // marginally faster than Ring: not by the margin
  add(4, 4 << 20, 0, 2, 0, 300.0);
  add(4, 4 << 20, 1, 2, 0, 200.0);
  add(4, 4 << 20, 1, 2, 8, 150.0);  // with an 8-channel cap, even faster
  return p;
}

// A table in NCCL's layout: [7][3], -1 = IGNORE.
struct Tbl {
  float v[21];
  Tbl() {
    for (float& x : v) x = -1.0f;
  }
  float& at(int a, int p) { return v[a * 3 + p]; }
  int pickAlgo() const { return pick().first; }
  std::pair<int, int> pick() const {
    int ba = -1, bp = -1;
    float best = 0;
    for (int a = 0; a < 7; ++a)
      for (int p = 0; p < 3; ++p) {
        float x = v[a * 3 + p];
        if (x >= 0 && (ba < 0 || x < best)) ba = a, bp = p, best = x;
      }
    return {ba, bp};
  }
};
}  // namespace

TEST_CASE("decisions: a measured winner replaces NCCL's pick only by the margin, never an IGNORE entry",
          "[tuner][policy]") {
  auto pol = Policy::build(tinyProfile(), PolicyOptions{});
  Tbl t;
  t.at(0, 2) = 50.0f;  // NCCL's model likes Tree/Simple
  t.at(1, 2) = 60.0f;
  t.at(0, 1) = 55.0f;
  Decision d = pol->decide(4, 1 << 20, 1, t.v, 7, 3, 0);
  CHECK(d.outcome == Outcome::kMeasured);
  // Tree/LL128 (69) is only 1.4% better than Ring/Simple (70): the fastest measured is Tree/LL128 -> applies
  // against NCCL's pick Tree/Simple (100)
  CHECK(t.pick() == std::make_pair(0, 1));
  CHECK(t.at(0, 1) == std::nextafter(50.0f, 0.0f));  // the cost keeps its meaning: just below NCCL's best
  CHECK(t.at(0, 2) == 50.0f);                          // nothing else touched
  CHECK(t.at(1, 2) == 60.0f);
  // Tree/LL128 IGNORE now (e.g. NCCL_PROTO=^LL128): Ring/Simple wins instead, LL128 stays IGNORE
  Tbl t2;
  t2.at(0, 2) = 50.0f;
  t2.at(1, 2) = 60.0f;
  d = pol->decide(4, 1 << 20, 1, t2.v, 7, 3, 0);
  CHECK(t2.pick() == std::make_pair(1, 2));
  CHECK(t2.at(0, 1) == -1.0f);
  // NCCL already picks the best: untouched
  Tbl t3;
  t3.at(1, 1) = -1.0f;
  t3.at(1, 2) = 10.0f;
  t3.at(0, 2) = 20.0f;
  d = pol->decide(4, 1 << 20, 1, t3.v, 7, 3, 0);
  CHECK(d.outcome == Outcome::kKeptNccl);
  CHECK(t3.at(1, 2) == 10.0f);
  // channels: at 4 MiB the 8-channel Ring/Simple is fastest
  Tbl t4;
  t4.at(0, 2) = 50.0f;
  t4.at(1, 2) = 60.0f;
  d = pol->decide(4, 4 << 20, 1, t4.v, 7, 3, 0);
  CHECK(d.outcome == Outcome::kMeasured);
  CHECK(d.channels == 8);
  CHECK(t4.pick() == std::make_pair(1, 2));
}

TEST_CASE("decisions: interpolation between sizes, at most half an octave of extrapolation, no data -> pass-through",
          "[tuner][policy]") {
  auto pol = Policy::build(tinyProfile(), PolicyOptions{});
  auto fresh = [] {
    Tbl t;
    t.at(0, 2) = 50.0f;
    t.at(1, 2) = 60.0f;
    return t;
  };
  for (uint64_t n : {uint64_t{2} << 20, uint64_t{3} << 20, uint64_t{6} << 20, uint64_t{768} << 10}) {
    Tbl t = fresh();
    INFO(n);
    CHECK(pol->decide(4, n, 1, t.v, 7, 3, 0).outcome == Outcome::kMeasured);
    CHECK(t.pickAlgo() == 1);
  }
  for (uint64_t n : {uint64_t{8} << 20, uint64_t{512} << 10, uint64_t{64} << 10}) {  // more than half an octave
    Tbl t = fresh();
    CHECK(pol->decide(4, n, 1, t.v, 7, 3, 0).outcome == Outcome::kNotMeasured);
    CHECK(t.at(0, 2) == 50.0f);
  }
  Tbl t = fresh();
  CHECK(pol->decide(2, 1 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kNotMeasured);  // AllGather: nothing measured
  Tbl none;
  CHECK(pol->decide(4, 1 << 20, 1, none.v, 7, 3, 0).outcome == Outcome::kNoValidEntry);
  CHECK(pol->decide(4, 1 << 20, 1, nullptr, 7, 3, 0).outcome == Outcome::kNoValidEntry);
  CHECK(pol->decide(9, 1 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kNotMeasured);  // not a tuner collective
}

TEST_CASE("decisions: NCCL's model carries the shape between measured sizes; a narrow spike stays where it was seen",
          "[tuner][policy]") {
  // Tree/Simple is NCCL's pick and measures as modelled; Ring/Simple measures 10% under its model. At 1 and 4 MiB the
  // model has Ring ahead, at 2 MiB behind (a crossover interpolated times cannot see).
  Profile p;
  p.sig.nRanks = 16;
  p.sig.nNodes = 2;
  auto add = [&](uint64_t bytes, int algo, double modelUs, double factor) {
    Measurement m;
    m.coll = 4;
    m.bytes = bytes;
    m.arm.algo = static_cast<int8_t>(algo);
    m.arm.proto = 2;
    m.timeUs = modelUs * factor;
    m.samples = 10;
    m.spread = 0.01;
    p.measurements.push_back(m);
    ModelPoint mp;
    mp.coll = 4;
    mp.bytes = bytes;
    mp.algo = static_cast<int8_t>(algo);
    mp.proto = 2;
    mp.us = modelUs;
    p.model.push_back(mp);
  };
  add(1 << 20, 0, 50.0, 1.0);
  add(1 << 20, 1, 40.0, 0.9);
  add(4 << 20, 0, 200.0, 1.0);
  add(4 << 20, 1, 150.0, 0.9);
  auto table = [](float tree, float ring) {
    Tbl t;
    t.at(0, 2) = tree;
    t.at(1, 2) = ring;
    return t;
  };
  auto withModel = Policy::build(p, PolicyOptions{});
  PolicyOptions noModel;
  noModel.model = false;
  auto without = Policy::build(p, noModel);
  Tbl t = table(80.0f, 100.0f);  // at 2 MiB: Ring 100 x 0.9 = 90 against Tree's 80
  CHECK(withModel->decide(4, 2 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kKeptNccl);
  t = table(80.0f, 100.0f);
  CHECK(without->decide(4, 2 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kMeasured);  // interpolated times: 70 vs 100
  t = table(100.0f, 80.0f);  // where the model has them the other way, the ratio wins it for Ring
  CHECK(withModel->decide(4, 2 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kKeptNccl);  // NCCL already picks Ring
  t = table(100.0f, 105.0f);  // Ring 94.5 against 100: by the margin
  CHECK(withModel->decide(4, 2 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kMeasured);
  CHECK(t.pickAlgo() == 1);
  t = table(50.0f, 40.0f);  // exactly a measured size: the measurements decide, whatever the table says
  CHECK(withModel->decide(4, 1 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kKeptNccl);  // NCCL picks Ring itself

  // A spike: Tree/Simple slower at 4 MiB only (1, 4, 16 MiB measured: 170 against a chord of 141); Ring faster
  // than the spike, slower than the chord, 5% faster at 16 MiB.
  Profile q;
  q.sig = p.sig;
  auto meas = [&](uint64_t bytes, int algo, double us) {
    Measurement m;
    m.coll = 4;
    m.bytes = bytes;
    m.arm.algo = static_cast<int8_t>(algo);
    m.arm.proto = 2;
    m.timeUs = us;
    m.samples = 10;
    m.spread = 0.01;
    q.measurements.push_back(m);
  };
  meas(1 << 20, 0, 50.0), meas(1 << 20, 1, 52.5);
  meas(4 << 20, 0, 170.0), meas(4 << 20, 1, 150.0);
  meas(16 << 20, 0, 400.0), meas(16 << 20, 1, 380.0);
  auto spiky = Policy::build(q, noModel);
  t = table(100.0f, 110.0f);
  CHECK(spiky->decide(4, 4 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kMeasured);  // at 4 MiB itself
  for (uint64_t n : {uint64_t{3} << 20, uint64_t{5} << 20, uint64_t{6} << 20, uint64_t{4200000}}) {
    INFO(n);
    t = table(100.0f, 110.0f);
    CHECK(spiky->decide(4, n, 1, t.v, 7, 3, 0).outcome == Outcome::kKeptNccl);
  }
  PolicyOptions noSpike = noModel;
  noSpike.spike = 0;
  t = table(100.0f, 110.0f);
  CHECK(Policy::build(q, noSpike)->decide(4, 5 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kMeasured);
}

TEST_CASE("decisions: a signature mask that differs from NCCL's table means pass-through", "[tuner][policy]") {
  Profile p = tinyProfile();
  p.sig.masks[4] = (1u << (0 * 3 + 2)) | (1u << (1 * 3 + 2)) | (1u << (0 * 3 + 1));
  auto pol = Policy::build(p, PolicyOptions{});
  Tbl t;
  t.at(0, 2) = 50.0f;
  t.at(1, 2) = 60.0f;
  t.at(0, 1) = 55.0f;
  CHECK(pol->decide(4, 1 << 20, 1, t.v, 7, 3, 0).outcome == Outcome::kMeasured);
  Tbl t2;  // NCCL now offers Ring/LL too (another NCCL, or NCCL_PROTO changed)
  t2.at(0, 2) = 50.0f;
  t2.at(1, 2) = 60.0f;
  t2.at(0, 1) = 55.0f;
  t2.at(1, 0) = 80.0f;
  CHECK(pol->decide(4, 1 << 20, 1, t2.v, 7, 3, 0).outcome == Outcome::kSignatureMismatch);
  CHECK(t2.at(0, 2) == 50.0f);
}

TEST_CASE("decisions: NCCL CSV rules (first match, IGNORE skipped, -1 channels = NCCL's own), force, explore",
          "[tuner][policy]") {
  std::string err;
  auto p = parseNcclCsv("# comment\nallreduce,0,65536,tree,ll,-1,2,16\nallreduce,0,65536,ring,simple,4,-1,-1\n"
                        "allgather,0,-1,ring,ll128,2,4,32\n",
                        16, 2, &err);
  REQUIRE(p);
  CHECK(p->rules.size() == 2);  // the 4-node row is for another topology
  auto pol = Policy::build(*p, PolicyOptions{});
  Tbl t;
  t.at(0, 0) = 9.0f;
  t.at(1, 2) = 5.0f;
  Decision d = pol->decide(4, 4096, 1, t.v, 7, 3, 0);
  CHECK(d.outcome == Outcome::kRule);
  CHECK(t.pick() == std::make_pair(0, 0));
  CHECK(d.channels == 0);  // -1 in the CSV: NCCL's channels, not one channel
  Tbl t2;  // Tree/LL IGNORE: the second rule applies
  t2.at(1, 2) = 5.0f;
  d = pol->decide(4, 4096, 1, t2.v, 7, 3, 0);
  CHECK(d.outcome == Outcome::kRule);
  CHECK(d.channels == 4);
  CHECK(pol->decide(4, 1 << 20, 1, t2.v, 7, 3, 0).outcome != Outcome::kRule);  // out of range
  CHECK_FALSE(parseNcclCsv("allreduce,0,65536,tree,ll\n", 16, 2, &err));
  CHECK(err.find("line 1") != std::string::npos);
  CHECK_FALSE(parseNcclCsv("allreduce,x,65536,tree,ll,-1,2,16\n", 16, 2, &err));
  CHECK_FALSE(parseNcclCsv("bogus,0,65536,tree,ll,-1,2,16\n", 16, 2, &err));

  PolicyOptions fo;
  fo.force = true;
  fo.forced.algo = 1;
  fo.forced.proto = 1;
  auto forced = Policy::build(Profile{}, fo);
  Tbl t3;
  t3.at(0, 2) = 5.0f;
  t3.at(1, 1) = 9.0f;
  CHECK(forced->decide(4, 1 << 20, 1, t3.v, 7, 3, 0).outcome == Outcome::kForced);
  CHECK(t3.pick() == std::make_pair(1, 1));
  Tbl t4;
  t4.at(0, 2) = 5.0f;  // Ring/LL128 IGNORE: never forced into it
  CHECK(forced->decide(4, 1 << 20, 1, t4.v, 7, 3, 0).outcome == Outcome::kForcedUnavailable);
  CHECK(t4.at(1, 1) == -1.0f);

  PolicyOptions eo;
  eo.explore = true;
  eo.exploreRepeats = 2;
  auto ex = Policy::build(Profile{}, eo);
  std::vector<std::pair<int, int>> seen;
  for (uint32_t i = 0; i < 8; ++i) {
    Tbl e;
    e.at(0, 2) = 10.0f;
    e.at(1, 2) = 20.0f;
    e.at(1, 0) = 100.0f;  // more than 3x NCCL's best: pruned
    Decision x = ex->decide(4, 1 << 20, 1, e.v, 7, 3, i);
    seen.push_back(e.pick());
    if (i < 4) CHECK(x.outcome == Outcome::kExplored);
    else CHECK(x.outcome != Outcome::kExplored);  // budget spent: 2 candidates x 2 repeats
  }
  CHECK(seen[0] == std::make_pair(0, 2));
  CHECK(seen[1] == std::make_pair(0, 2));
  CHECK(seen[2] == std::make_pair(1, 2));
  CHECK(seen[3] == std::make_pair(1, 2));
}

TEST_CASE("profiles round-trip, and malformed ones are refused with a reason (mutation fuzz)", "[tuner][profile]") {
  Profile p = tinyProfile();
  p.sig.masks[4] = 0x1ff;
  p.source["command"] = "all_reduce_perf -b 8 -e 1G";
  std::string text = writeProfile(p);
  std::string err;
  auto back = parseProfile(text, &err);
  REQUIRE(back);
  CHECK(back->measurements.size() == p.measurements.size());
  CHECK(back->sig.masks[4] == 0x1ff);
  CHECK(back->source["command"] == "all_reduce_perf -b 8 -e 1G");
  CHECK(writeProfile(*back) == text);
  ModelPoint mp;
  mp.coll = 4;
  mp.bytes = 1 << 20;
  mp.algo = 1;
  mp.proto = 2;
  mp.us = 61.25;
  p.model.push_back(mp);
  text = writeProfile(p);
  back = parseProfile(text, &err);
  REQUIRE(back);
  REQUIRE(back->model.size() == 1);
  CHECK(back->model[0].bytes == (1u << 20));
  CHECK(back->model[0].algo == 1);
  CHECK(back->model[0].proto == 2);
  CHECK(back->model[0].us == 61.25);
  CHECK(writeProfile(*back) == text);
  for (const char* bad : {"", "{", "[]", "{\"format\":\"weft-tuner-profile\"}",
                          "{\"format\":\"weft-tuner-profile\",\"version\":2,\"signature\":{}}",
                          "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signature\":{\"nranks\":0,\"nnodes\":1}}",
                          "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signature\":{\"nranks\":4,\"nnodes\":1},"
                          "\"measurements\":[{\"coll\":\"AllReduce\",\"bytes\":-5,\"algo\":\"RING\",\"proto\":\"LL\","
                          "\"time_us\":1}]}",
                          "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signature\":{\"nranks\":4,\"nnodes\":1},"
                          "\"measurements\":[{\"coll\":\"AllReduce\",\"bytes\":5,\"algo\":\"WARP\",\"proto\":\"LL\","
                          "\"time_us\":1}]}",
                          "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signature\":{\"nranks\":4,\"nnodes\":1},"
                          "\"model\":{}}",
                          "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signature\":{\"nranks\":4,\"nnodes\":1},"
                          "\"model\":[{\"coll\":\"AllReduce\",\"bytes\":5,\"algo\":\"RING\",\"proto\":\"LL\",\"us\":-1}]}",
                          "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signature\":{\"nranks\":4,\"nnodes\":1},"
                          "\"model\":[{\"coll\":\"AllReduce\",\"bytes\":5,\"algo\":\"RING\",\"proto\":\"LL\"}]}",
                          // An integer beyond the field's type (found by fuzz.short: converting it was undefined).
                          "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signature\":{\"nranks\":4,\"nnodes\":1},"
                          "\"measurements\":[{\"coll\":\"AllReduce\",\"bytes\":5,\"algo\":\"RING\",\"proto\":\"LL\","
                          "\"channels\":12222200000000,\"time_us\":1}]}",
                          "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signature\":{\"nranks\":4,\"nnodes\":1},"
                          "\"measurements\":[{\"coll\":\"AllReduce\",\"bytes\":5,\"algo\":\"RING\",\"proto\":\"LL\","
                          "\"chunk\":-1,\"time_us\":1}]}",
                          "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signature\":{\"nranks\":4,\"nnodes\":1},"
                          "\"measurements\":[{\"coll\":\"AllReduce\",\"bytes\":5,\"algo\":\"RING\",\"proto\":\"LL\","
                          "\"chunk\":4294967296,\"time_us\":1}]}"}) {
    err.clear();
    INFO(bad);
    CHECK_FALSE(parseProfile(bad, &err));
    CHECK_FALSE(err.empty());
  }
  // Mutation fuzz: random byte edits, insertions, deletions and truncations of a valid profile must parse or be
  // refused with a reason — never crash, never produce a profile a policy cannot be built from.
  std::mt19937_64 rng(12345);
  size_t accepted = 0;
  const int kIters = 20000;
  for (int i = 0; i < kIters; ++i) {
    std::string m = text;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !m.empty(); ++e) {
      size_t pos = rng() % m.size();
      switch (rng() % 4) {
        case 0: m[pos] = static_cast<char>(rng() % 256); break;
        case 1: m.insert(pos, 1, "{}[]\",:0123456789-e."[rng() % 20]); break;
        case 2: m.erase(pos, 1 + rng() % 8); break;
        case 3: m.resize(pos); break;
      }
    }
    err.clear();
    auto q = parseProfile(m, &err);
    if (q) {
      ++accepted;
      auto pol = Policy::build(*q, PolicyOptions{});
      Tbl t;
      t.at(1, 2) = 1.0f;
      pol->decide(4, 1 << 20, 1, t.v, 7, 3, 0);
      CHECK(t.at(1, 2) >= 0.0f);
    } else {
      CHECK_FALSE(err.empty());
    }
  }
  WARN("profile mutation fuzz: " << kIters << " inputs, " << accepted << " still valid profiles");
}

TEST_CASE("simulated worlds: the targets (speedup, never worse, planted points, regret)", "[tuner][sim]") {
  model::Topology topo = hopper(2);
  std::vector<int> colls = {2, 3, 4};
  std::vector<uint64_t> sizes;
  for (uint64_t n = 64 << 10; n <= (256u << 20); n *= 2) sizes.push_back(n);
  double logSp = 0, logPl = 0, logReg = 0, minSp = 1e9;
  const int kSeeds = 10;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    sim::WorldOptions wo;
    wo.seed = static_cast<uint64_t>(seed);
    sim::World w(topo, wo);
    auto pol = Policy::build(sim::sweep(w, colls, sizes, 10, seed * 7919 + 1), PolicyOptions{});
    sim::Score s = sim::evaluate(w, *pol, colls, sizes);
    logSp += std::log(s.geoSpeedup);
    logPl += std::log(s.plantedGeoSpeedup);
    logReg += std::log1p(s.geoRegret);
    minSp = std::min(minSp, s.minSpeedup);
  }
  double sp = std::exp(logSp / kSeeds), pl = std::exp(logPl / kSeeds), reg = std::exp(logReg / kSeeds) - 1;
  WARN("simulated 16 ranks / 2 nodes, 10 seeds: geomean speedup " << sp << ", planted " << pl << ", min " << minSp
                                                                 << ", regret " << reg);
  CHECK(sp >= 1.10);
  CHECK(pl >= 1.25);
  CHECK(minSp >= 0.99);
  CHECK(reg <= 0.02);
}

TEST_CASE("NCCL_ALGO / NCCL_PROTO read as NCCL reads them", "[tuner][nccl_env]") {
  NcclEnables e;
  std::string why;
  REQUIRE(parseNcclEnables(nullptr, "", &e, &why));
  CHECK(e.allows(4, 1, 1));
  // NCCL's own examples (src/graph/tuning.cc, v2.28.9).
  REQUIRE(parseNcclEnables("ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring", nullptr, &e, &why));
  CHECK(e.allows(2, 1, 2));        // AllGather: Ring
  CHECK_FALSE(e.allows(2, 0, 2));  // AllGather: not Tree
  CHECK(e.allows(4, 0, 2));        // AllReduce: Tree
  CHECK_FALSE(e.allows(4, 1, 2));  // AllReduce: not Ring
  CHECK(e.allows(4, 2, 2));        // AllReduce: CollNetDirect
  CHECK(e.allows(0, 1, 2));        // Broadcast: Ring
  CHECK_FALSE(e.allows(0, 2, 2));  // Broadcast: only Ring
  REQUIRE(parseNcclEnables(nullptr, "LL,Simple;allreduce:^LL", &e, &why));
  CHECK(e.allows(2, 1, 0));
  CHECK_FALSE(e.allows(2, 1, 1));
  CHECK_FALSE(e.allows(4, 1, 0));
  CHECK(e.allows(4, 1, 1));
  CHECK(e.allows(4, 1, 2));
  REQUIRE(parseNcclEnables("RING", "^ll128", &e, &why));  // case does not matter
  CHECK(e.allows(4, 1, 2));
  CHECK_FALSE(e.allows(4, 0, 2));
  CHECK_FALSE(e.allows(4, 1, 1));
  // What NCCL refuses (its init fails): said, not guessed.
  CHECK_FALSE(parseNcclEnables("ring;tree", nullptr, &e, &why));
  CHECK(why.find("must name its collective") != std::string::npos);
  CHECK_FALSE(parseNcclEnables("rnig", nullptr, &e, &why));
  CHECK(why.find("unknown name \"rnig\"") != std::string::npos);
  CHECK_FALSE(parseNcclEnables(nullptr, "allredcue:LL", &e, &why));
  CHECK(why.find("unknown collective") != std::string::npos);
}

TEST_CASE("the tuner says which of its choices NCCL_ALGO / NCCL_PROTO take away", "[tuner][nccl_env]") {
  // AllReduce: Tree/LL128 measured fastest at 1 MiB (by less than the margin), Ring/Simple at 4 MiB.
  Profile p = tinyProfile();
  auto pol = Policy::build(p, PolicyOptions{});
  NcclEnables e;
  std::string why;
  REQUIRE(parseNcclEnables(nullptr, "^LL", &e, &why));
  CHECK(blockedChoices(*pol, e).empty());  // LL is nowhere fastest
  REQUIRE(parseNcclEnables(nullptr, "^LL128", &e, &why));
  std::vector<std::string> b = blockedChoices(*pol, e);
  REQUIRE_FALSE(b.empty());
  for (const std::string& line : b) {
    CHECK(line.find("AllReduce ") == 0);
    CHECK(line.find("TREE/LL128") != std::string::npos);
  }
  REQUIRE(parseNcclEnables("tree", nullptr, &e, &why));
  b = blockedChoices(*pol, e);
  REQUIRE_FALSE(b.empty());
  bool ring = false;
  for (const std::string& line : b) ring = ring || line.find("RING/SIMPLE") != std::string::npos;
  CHECK(ring);
  // A profile measured with NCCL offering LL128: with it disabled NCCL's table no longer matches the signature.
  p.sig.masks[4] = 0x1ff;
  auto pol2 = Policy::build(p, PolicyOptions{});
  REQUIRE(parseNcclEnables(nullptr, "^LL128", &e, &why));
  b = blockedChoices(*pol2, e);
  REQUIRE(b.size() == 1);
  CHECK(b[0].find("leaves AllReduce to NCCL") != std::string::npos);
  // Forcing: the forced choice where it is disabled.
  PolicyOptions fo;
  fo.force = true;
  fo.forced.algo = 1;
  fo.forced.proto = 1;
  auto forced = Policy::build(Profile{}, fo);
  b = blockedChoices(*forced, e);
  CHECK(b.size() == static_cast<size_t>(kNumColls));
}

// Held-out evaluation (issue 16): the sweep measures every other octave, the score is taken at the sizes between
// and beyond, in worlds whose error has a structure the tuner does not assume. What is checked: in the worlds that
// are as the tuner assumes (smooth error between measured sizes, with or without narrow anomalies at measured
// sizes, light or heavy-tailed noise) no held-out point is below 0.99x; in every world each rule of the policy
// loses no more points than the policy without it. docs/tuning.md gives the figures, the losing worlds included.
TEST_CASE("held-out sizes: never below 0.99x where the world is as assumed; each rule earns its place",
          "[tuner][sim][heldout]") {
  model::Topology topo = hopper(2);
  const std::vector<int> colls = {2, 3, 4};
  const std::vector<uint64_t> seeds = {1, 2, 3, 4, 5};
  for (sim::Structure st : {sim::Structure::kSmooth, sim::Structure::kSignFlip, sim::Structure::kDrift,
                            sim::Structure::kHeavyTail, sim::Structure::kOffPick}) {
    sim::WorldOptions wo;
    wo.structure = st;
    sim::HeldOut a = sim::heldOut(topo, wo, seeds, 3, 10, PolicyOptions{}, colls);
    INFO(sim::structureName(st) << ": below 0.99x " << a.below99 << ", min " << a.minSpeedup << ", geomean "
                                << a.geoSpeedup);
    CHECK(a.geoSpeedup >= 0.95);
    // A narrow slowdown of NCCL's pick at one measured size counts there only (PolicyOptions::spike).
    PolicyOptions noSpike;
    noSpike.spike = 0;
    sim::HeldOut c = sim::heldOut(topo, wo, seeds, 3, 10, noSpike, colls);
    INFO("without the spike rule: below 0.99x " << c.below99 << ", geomean " << c.geoSpeedup);
    CHECK(a.below99 <= c.below99);
    CHECK(a.geoSpeedup >= c.geoSpeedup - 0.005);
    // NCCL's model carries the shape between measured sizes (Profile::model), where the error is smooth.
    if (st != sim::Structure::kSignFlip && st != sim::Structure::kDrift) {
      PolicyOptions noModel;
      noModel.model = false;
      sim::HeldOut d = sim::heldOut(topo, wo, seeds, 3, 10, noModel, colls);
      INFO("without the model: below 0.99x " << d.below99 << ", geomean " << d.geoSpeedup);
      CHECK(a.below99 <= d.below99);
      CHECK(a.geoSpeedup >= d.geoSpeedup - 0.005);
    }
    // Without the model (a profile that has none), a change between measured sizes needs the winner to have won
    // at both.
    PolicyOptions raw, rawNoBracket;
    raw.model = rawNoBracket.model = false;
    rawNoBracket.bracket = false;
    sim::HeldOut e = sim::heldOut(topo, wo, seeds, 3, 10, raw, colls);
    sim::HeldOut f = sim::heldOut(topo, wo, seeds, 3, 10, rawNoBracket, colls);
    INFO("no model: below 0.99x " << e.below99 << " with the bracket rule, " << f.below99 << " without");
    CHECK(e.below99 <= f.below99);
    CHECK(e.minSpeedup >= f.minSpeedup - 1e-9);
  }
  for (sim::Structure st : {sim::Structure::kSmooth, sim::Structure::kHeavyTail})
    for (int planted : {2, 0}) {
      sim::WorldOptions wo;
      wo.structure = st;
      wo.plantedPerColl = planted;
      sim::HeldOut h = sim::heldOut(topo, wo, seeds, 3, 10, PolicyOptions{}, colls);
      INFO(sim::structureName(st) << ", " << planted << " planted points per collective: geomean " << h.geoSpeedup
                                  << ", min " << h.minSpeedup << ", below 0.99x " << h.below99 << " of "
                                  << h.speedups.size());
      CHECK(h.below99 == 0);
      CHECK(h.geoSpeedup >= 1.04);
    }
}

TEST_CASE("reference model: five compute capabilities (tuner v7), NCCL's constants in place of the defaults",
          "[tuner][model]") {
  // NCCL 2.30.7's defaults, as src/graph/tuning.cc has them.
  const model::Constants& d = model::ncclDefaults();
  CHECK(d.compCaps == model::kNumCompCaps);
  CHECK(d.llMaxBws[3][0] == 282.0);
  CHECK(d.perChMaxTreeBws[1][1] == 23.6);
  CHECK(d.perChMaxNvlsTreeBws[3][2] == 80.0);
  CHECK(d.hwLat[1][6][2] == 4.0);  // PCI, PAT, Simple
  CHECK(std::string(model::compCapName(4)) == "rubin");
  CHECK(model::compCapFromName("rubin") == 4);
  CHECK(model::compCapFromName("4") == 4);
  CHECK(model::compCapFromName("5") == -1);
  CHECK(model::compCapFromName("pascal") == -1);
  // Rubin (4) is modelled like the others: every entry NCCL would offer has a cost, the same as Blackwell's until
  // NCCL's own Rubin numbers come in through a profile.
  for (int nodes : {1, 2, 4}) {
    model::Topology rubin = hopper(nodes), blackwell = hopper(nodes);
    rubin.cc = 4;
    blackwell.cc = 3;
    for (uint64_t n : {uint64_t{4096}, uint64_t{1} << 20, uint64_t{1} << 28}) {
      model::Table a = model::costTable(rubin, 4, n), b = model::costTable(blackwell, 4, n);
      for (int i = 0; i < 21; ++i) CHECK(a.flat()[i] == b.flat()[i]);
      CHECK(model::pick(a).algo >= 0);
    }
  }
  // Constants given to the topology replace the defaults: a lower tree cap for Hopper lowers tree bandwidth.
  model::Constants k = d;
  k.perChMaxTreeBws[2][1] = 1.0;
  model::Topology t = hopper(2);
  double before = model::busBwGBs(t, 4, 0, 2, 1u << 28);
  t.constants = &k;
  double after = model::busBwGBs(t, 4, 0, 2, 1u << 28);
  CHECK(after < before);
  CHECK(after == Approx(1.0 * t.nChannels * 0.9).epsilon(0.2));  // the cap times channels, times the correction
}

TEST_CASE("profiles carry NCCL's constants (4 or 5 compute capabilities) and the compute capability", "[tuner][profile]") {
  Profile p;
  p.sig.nRanks = 16;
  p.sig.nNodes = 2;
  p.sig.cc = 4;
  model::Constants k = model::ncclDefaults();
  k.llMaxBws[4][0] = 512.5;  // what a v7 tuner was given for Rubin
  k.hwLat[2][1][2] = 9.25;
  p.constants = k;
  std::string err;
  auto back = parseProfile(writeProfile(p), &err);
  REQUIRE(back);
  CHECK(back->sig.cc == 4);
  REQUIRE(back->constants);
  CHECK(back->constants->compCaps == 5);
  CHECK(back->constants->llMaxBws[4][0] == 512.5);
  CHECK(back->constants->hwLat[2][1][2] == 9.25);
  // From a v5/v6 tuner: four rows; the fifth keeps the default.
  k = model::ncclDefaults();
  k.compCaps = 4;
  k.perChMaxTreeBws[3][0] = 71.5;
  p.constants = k;
  const std::string four = writeProfile(p);
  back = parseProfile(four, &err);
  REQUIRE(back);
  CHECK(back->constants->compCaps == 4);
  CHECK(back->constants->perChMaxTreeBws[3][0] == 71.5);
  CHECK(back->constants->perChMaxTreeBws[4][0] == model::ncclDefaults().perChMaxTreeBws[4][0]);
  // Malformed: each refused with a reason naming the field.
  using nlohmann::json;
  const json base = json::parse(four);
  auto refused = [&](const char* what, auto&& mutate, const char* named) {
    json j = base;
    mutate(j);
    std::string e;
    INFO(what);
    CHECK_FALSE(parseProfile(j.dump(), &e));
    INFO(e);
    CHECK(e.find(named) != std::string::npos);
  };
  refused("six compute capabilities", [](json& j) { j["nccl_constants"]["compcaps"] = 6; }, "compcaps");
  refused("compute capability 5", [](json& j) { j["signature"]["cc"] = 5; }, "signature.cc");
  refused("a negative cap", [](json& j) { j["nccl_constants"]["per_ch_max_tree_bws"][3][0] = -71.5; },
          "per_ch_max_tree_bws[3][0]");
  refused("a string", [](json& j) { j["nccl_constants"]["ll_max_bws"][0][1] = "fast"; }, "ll_max_bws[0][1]");
  refused("a row missing", [](json& j) { j["nccl_constants"]["ll_max_bws"].erase(3); }, "ll_max_bws");
  refused("a short row", [](json& j) { j["nccl_constants"]["hw_latencies"][20].erase(2); }, "hw_latencies[20]");
  refused("not an object", [](json& j) { j["nccl_constants"] = 3; }, "nccl_constants");
}
