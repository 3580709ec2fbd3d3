// SPDX-License-Identifier: Apache-2.0
// The sender's table of buffer offers (rdma protocol): offers, eager markers, deletion under collisions, limits.
#include <catch2/catch.hpp>

#include <map>
#include <random>

#include "weft/transport/offer_table.h"

using namespace weft;

TEST_CASE("offers are found by key and consumed once", "[offers]") {
  OfferTable<int, 64> t;
  bool dropped = true;
  REQUIRE(t.addOffer(7, 70, &dropped));
  CHECK_FALSE(dropped);
  REQUIRE(t.findOffer(7) != nullptr);
  CHECK(*t.findOffer(7) == 70);
  CHECK(t.findOffer(8) == nullptr);
  CHECK_FALSE(t.addOffer(7, 71, &dropped));  // the same buffer offered twice is a protocol violation
  t.eraseOffer(7);
  CHECK(t.findOffer(7) == nullptr);
  CHECK(t.size() == 0);
}

TEST_CASE("an eager send before its offer leaves a marker that drops the offer", "[offers]") {
  OfferTable<int, 64> t;
  REQUIRE(t.markEager(5));
  CHECK(t.eagerMarks() == 1);
  CHECK(t.findOffer(5) == nullptr);
  bool dropped = false;
  REQUIRE(t.addOffer(5, 50, &dropped));
  CHECK(dropped);
  CHECK(t.findOffer(5) == nullptr);
  CHECK(t.eagerMarks() == 0);
  CHECK(t.size() == 0);
  // Offer first, then the eager send: the offer is consumed, no marker stays.
  REQUIRE(t.addOffer(6, 60, &dropped));
  REQUIRE(t.markEager(6));
  CHECK(t.size() == 0);
}

TEST_CASE("an offer made again replaces the first; a marker whose offer can no longer come is dropped", "[offers]") {
  OfferTable<int, 64> t;
  bool dropped = false;
  REQUIRE(t.addOffer(9, 90, &dropped));
  *t.findOffer(9) = 91;  // rail failover: the buffer offered again under a new slot
  CHECK(*t.findOffer(9) == 91);
  CHECK_FALSE(t.dropEagerMark(9));  // an offer, not a marker: left alone
  CHECK(t.findOffer(9) != nullptr);
  REQUIRE(t.markEager(4));
  CHECK(t.eagerMarks() == 1);
  CHECK(t.dropEagerMark(4));
  CHECK(t.eagerMarks() == 0);
  CHECK_FALSE(t.dropEagerMark(4));
  REQUIRE(t.addOffer(4, 40, &dropped));  // a later offer of the key is an offer again
  CHECK_FALSE(dropped);
  CHECK(t.size() == 2);
}

TEST_CASE("eager markers are bounded to half the table", "[offers]") {
  OfferTable<int, 16> t;
  for (uint64_t k = 0; k < 8; ++k) REQUIRE(t.markEager(k));
  CHECK_FALSE(t.eagerRoom());
  CHECK_FALSE(t.markEager(100));
  bool dropped = false;
  REQUIRE(t.addOffer(3, 1, &dropped));  // an offer for a marked key frees room
  CHECK(dropped);
  CHECK(t.eagerRoom());
}

TEST_CASE("random inserts and deletes match a reference map", "[offers]") {
  OfferTable<uint64_t, 256> t;
  std::map<uint64_t, uint64_t> ref;
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 200000; ++i) {
    // Keys shaped like data tags: NCCL tag in the high half, a small sequence number in the low half.
    uint64_t key = ((rng() % 8) << 32) | (rng() % 40);
    bool dropped = false;
    if (rng() % 2 == 0 && ref.size() < 200) {
      bool ok = t.addOffer(key, key * 3, &dropped);
      CHECK(ok == (ref.count(key) == 0));
      if (ok) ref[key] = key * 3;
    } else {
      t.eraseOffer(key);
      ref.erase(key);
    }
    if (i % 1000 == 0) {
      REQUIRE(t.size() == ref.size());
      for (const auto& [k, v] : ref) {
        REQUIRE(t.findOffer(k) != nullptr);
        REQUIRE(*t.findOffer(k) == v);
      }
    }
  }
}

TEST_CASE("the table starts small and doubles when half full, keeping every entry", "[offers]") {
  OfferTable<uint64_t, 2048> t;
  CHECK(t.slots() == 32);  // a quiet connection pays for 32 slots, not 2,048
  bool dropped = false;
  for (uint64_t k = 0; k < 16; ++k) REQUIRE(t.addOffer(k << 32 | 1, k, &dropped));
  CHECK(t.slots() == 32);
  REQUIRE(t.markEager(99));  // the 17th entry: half full, the table doubles
  CHECK(t.slots() == 64);
  for (uint64_t k = 16; k < 1500; ++k) REQUIRE(t.addOffer(k << 32 | 1, k, &dropped));
  CHECK(t.slots() == 2048);
  for (uint64_t k = 0; k < 1500; ++k) {
    REQUIRE(t.findOffer(k << 32 | 1) != nullptr);
    REQUIRE(*t.findOffer(k << 32 | 1) == k);
  }
  CHECK(t.findOffer(99) == nullptr);
  REQUIRE(t.addOffer(99, 7, &dropped));  // the marker survived the rehashes
  CHECK(dropped);
  // Up to the last hole of the largest table, then full.
  uint64_t k = 1500;
  while (t.size() < 2047) REQUIRE(t.addOffer(k++ << 32 | 1, 0, &dropped));
  CHECK(t.slots() == 2048);
  CHECK_FALSE(t.addOffer(k << 32 | 1, 0, &dropped));
}
