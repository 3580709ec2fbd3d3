// SPDX-License-Identifier: Apache-2.0
// The comm table of an endpoint group (src/fabric/comm_table.h): every completion reaches the comm it names and
// no other; one naming a comm that is not (or no longer) there is counted and dropped; the 4-byte completion
// form that carries no comm id is allowed only for a comm alone in its group.
#include <catch2/catch.hpp>

#include "fabric/comm_table.h"
#include "fabric/wire.h"

using namespace weft;
using namespace weft::fabric;

namespace {

struct Sink final : DataSink {
  int completions = 0, errors = 0, writes = 0;
  uint64_t lastData = 0;
  void onComplete(OpContext*, size_t) noexcept override { ++completions; }
  void onError(Endpoint*, OpContext*, int, Status) noexcept override { ++errors; }
  void onRemoteData(uint64_t d, size_t) noexcept override {
    ++writes;
    lastData = d;
  }
};

OpContext ctxOf(uint32_t comm) {
  OpContext c;
  c.comm = comm;
  return c;
}

}  // namespace

TEST_CASE("completions go to the comm their context names, among several", "[comm_table]") {
  CommTable t("test0");
  Sink a, b, c;
  REQUIRE(t.attach(1, &a, false) == Status::kOk);
  REQUIRE(t.attach(7, &b, false) == Status::kOk);
  REQUIRE(t.attach(wire::kMaxCommId, &c, false) == Status::kOk);
  CHECK(t.size() == 3);
  for (uint32_t id : {7u, 1u, 7u, 7u, wire::kMaxCommId, 1u}) {
    OpContext x = ctxOf(id);
    DataSink* s = t.forContext(&x);
    REQUIRE(s != nullptr);
    s->onComplete(&x, 0);
  }
  CHECK(a.completions == 2);
  CHECK(b.completions == 3);
  CHECK(c.completions == 1);
  CHECK(t.strays() == 0);
}

TEST_CASE("remote writes go to the comm their completion data names, in both forms that carry an id", "[comm_table]") {
  CommTable t("test0");
  Sink a, b;
  REQUIRE(t.attach(3, &a, false) == Status::kOk);
  REQUIRE(t.attach(0x2abcd, &b, false) == Status::kOk);
  // 8-byte form: the id in the upper bits.
  const uint64_t w8 = wire::WriteImm::encode(0x2abcd, 17, 0, 1, 4096);
  CHECK(t.remoteDataComm(w8) == 0x2abcd);
  CHECK(t.forRemoteData(w8) == &b);
  // An 8-byte form's upper 32 bits are never 0, whatever the sequence, flags, pieces and length.
  CHECK((wire::WriteImm::encode(1, 0, 0, 1, 0) >> 32) != 0);
  // 4-byte form with the id (the length comes from the completion entry).
  const uint64_t w4 = wire::WriteImmId::encode(3, 1023, 1, 8);
  CHECK(t.remoteDataComm(w4) == 3);
  CHECK(t.forRemoteData(w4) == &a);
  CHECK(t.forRemoteData(wire::WriteImmId::encode(0x2abcd, 0, 0, 1)) == &b);
  CHECK(t.strays() == 0);
}

TEST_CASE("a completion for a comm not in the table is counted and dropped, the others undisturbed", "[comm_table]") {
  CommTable t("test0");
  Sink a;
  REQUIRE(t.attach(5, &a, false) == Status::kOk);
  OpContext mine = ctxOf(5), other = ctxOf(6);
  CHECK(t.forContext(&mine) == &a);
  CHECK(t.forContext(&other) == nullptr);
  CHECK(t.forRemoteData(wire::WriteImm::encode(9, 0, 0, 1, 8)) == nullptr);
  CHECK(t.forRemoteData(wire::WriteImmId::encode(9, 0, 0, 1)) == nullptr);
  CHECK(t.strays() == 3);
  CHECK(t.forContext(&mine) == &a);
  // A comm that left: its late completions are strays, even right after it was the last one found.
  t.detach(5);
  CHECK(t.forContext(&mine) == nullptr);
  CHECK(t.forRemoteData(wire::WriteImm::encode(5, 0, 0, 1, 8)) == nullptr);
  CHECK(t.strays() == 5);
  CHECK(t.size() == 0);
  // Its id may come back (CommIds decides when): the new comm gets what names it, never the old one's sink.
  Sink b;
  REQUIRE(t.attach(5, &b, false) == Status::kOk);
  CHECK(t.forContext(&mine) == &b);
}

TEST_CASE("the comm table refuses duplicate and out-of-range ids", "[comm_table]") {
  CommTable t("test0");
  Sink a, b;
  CHECK(t.attach(0, &a, false) != Status::kOk);
  CHECK(t.attach(wire::kMaxCommId + 1, &a, false) != Status::kOk);
  CHECK(t.attach(4, nullptr, false) != Status::kOk);
  REQUIRE(t.attach(4, &a, false) == Status::kOk);
  CHECK(t.attach(4, &b, false) != Status::kOk);
  OpContext x = ctxOf(4);
  CHECK(t.forContext(&x) == &a);  // the refused attach changed nothing
  CHECK(t.size() == 1);
}

TEST_CASE("a comm whose writes carry no id is alone in its table and gets every 4-byte write", "[comm_table]") {
  CommTable t("test0");
  Sink legacy, other;
  REQUIRE(t.attach(2, &legacy, true) == Status::kOk);
  CHECK_FALSE(t.shareable());
  CHECK(t.attach(3, &other, false) != Status::kOk);
  CHECK(t.attach(3, &other, true) != Status::kOk);
  // The length-carrying form: sequence 5, one piece, 4,096 = 1 * 2^12 bytes. No id in it.
  uint32_t field = 0;
  wire::WriteImm32::largestPiece(4096, &field);
  const uint64_t w = wire::WriteImm32::encode(5, 0, 1, field);
  CHECK(t.forRemoteData(w) == &legacy);
  // An 8-byte write still names its comm: one for another id is a stray.
  CHECK(t.forRemoteData(wire::WriteImm::encode(3, 0, 0, 1, 8)) == nullptr);
  t.detach(2);
  CHECK(t.shareable());
  CHECK(t.forRemoteData(w) == nullptr);  // no id, no legacy comm: nobody's
  // Nor may a legacy comm join a table that has a comm.
  REQUIRE(t.attach(3, &other, false) == Status::kOk);
  CHECK(t.attach(2, &legacy, true) != Status::kOk);
}

TEST_CASE("traffic for a comm closed moments ago is dropped quietly, for others with a count of strays", "[comm_table]") {
  using namespace std::chrono_literals;
  CommTable t("test0", 5s);  // long enough for a loaded machine; "long ago" is a minute back
  Sink a, b;
  REQUIRE(t.attach(5, &a, false) == Status::kOk);
  REQUIRE(t.attach(6, &b, false) == Status::kOk);
  const auto now = CommTable::Clock::now();
  t.detach(5, now);
  OpContext gone = ctxOf(5), never = ctxOf(7), live = ctxOf(6);
  CHECK(t.forContext(&gone) == nullptr);  // the peer's offers still on their way at close
  CHECK(t.forContext(&gone) == nullptr);
  CHECK(t.lateStrays() == 2);
  CHECK(t.forContext(&never) == nullptr);  // a comm this group never served: a stray to warn about
  CHECK(t.strays() == 3);
  CHECK(t.lateStrays() == 2);
  CHECK(t.forContext(&live) == &b);
  // Past the hold, the closed comm's id is a stray like any other.
  t.detach(6, now - 1min);
  CHECK(t.forContext(&live) == nullptr);
  CHECK(t.lateStrays() == 2);
  CHECK(t.strays() == 4);
  // Many comms closing: the record of closed ids is pruned of those past the hold as it grows, not kept forever.
  for (uint32_t id = 100; id < 400; ++id) REQUIRE(t.attach(id, &a, false) == Status::kOk);
  for (uint32_t id = 100; id < 400; ++id) t.detach(id, now - 1min);  // closed long ago
  for (uint32_t id = 1000; id < 1300; ++id) REQUIRE(t.attach(id, &a, false) == Status::kOk);
  for (uint32_t id = 1000; id < 1300; ++id) t.detach(id, CommTable::Clock::now());
  OpContext recent = ctxOf(1299);
  CHECK(t.forContext(&recent) == nullptr);
  CHECK(t.lateStrays() == 3);
  CHECK(t.closedRemembered() <= 302);  // the 300 closed long ago are gone
}
