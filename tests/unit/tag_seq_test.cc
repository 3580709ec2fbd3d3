// SPDX-License-Identifier: Apache-2.0
// Per-tag sequence numbers reproduce NCCL's matching: in posting order, tags choosing within a group.
#include <catch2/catch.hpp>

#include "weft/transport/tag_seq.h"

using namespace weft;

TEST_CASE("each tag counts its own sequence", "[tags]") {
  TagSequence s;
  uint32_t seq = 99;
  REQUIRE(s.peek(5, 0, &seq));
  CHECK(seq == 0);
  s.consume(5);
  s.consume(5);
  REQUIRE(s.peek(5, 0, &seq));
  CHECK(seq == 2);
  REQUIRE(s.peek(6, 0, &seq));
  CHECK(seq == 0);
  REQUIRE(s.peek(5, 3, &seq));
  CHECK(seq == 5);
  REQUIRE(s.peek(-1, 0, &seq));  // negative tags are tags too
  CHECK(seq == 0);
}

TEST_CASE("the table refuses more distinct tags than it holds, and keeps the ones it has", "[tags]") {
  TagSequence s;
  uint32_t seq;
  for (int t = 0; t < TagSequence::kCapacity; ++t) REQUIRE(s.peek(t * 7919, 0, &seq));
  CHECK_FALSE(s.peek(-12345, 0, &seq));
  s.consume(7919);
  REQUIRE(s.peek(7919, 0, &seq));
  CHECK(seq == 1);
}

TEST_CASE("counts never wrap, and the highest next count bounds every tag's", "[tags]") {
  TagSequence s;
  CHECK(s.maxNext() == 0);
  uint64_t count = 99;
  REQUIRE(s.peek(3, 0, &count));
  CHECK(count == 0);
  for (int i = 0; i < 5; ++i) s.consume(3);
  s.consume(4);
  REQUIRE(s.peek(3, 2, &count));
  CHECK(count == 7);
  CHECK(s.maxNext() == 5);  // tag 3 next takes 5, tag 4 takes 1
  uint32_t seq = 0;
  REQUIRE(s.peek(4, 0, &seq));
  CHECK(seq == 1);
}
