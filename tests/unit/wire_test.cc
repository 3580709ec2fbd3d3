// SPDX-License-Identifier: Apache-2.0
// The libfabric wire format (src/fabric/wire.h): every field of a tag round-trips at its limits, data and control
// tags never collide, and the handshake keeps the fields a peer of another version reads; comm ids come back
// only after their quarantine, and running out of them is a clean answer.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <set>

#include "fabric/wire.h"
#include "weft/transport/comm_ids.h"

using namespace weft;
using namespace weft::fabric::wire;

TEST_CASE("a data tag carries comm id, NCCL tag and sequence at their limits", "[wire]") {
  for (uint32_t comm : {1u, 2u, 0x1234u, kMaxCommId}) {
    for (int tag : {0, 1, 7, 100, kMaxNcclTag}) {
      for (uint32_t seq : {0u, 1u, 255u, kSeqMask}) {
        uint64_t t = dataTag(comm, tag, seq);
        CHECK_FALSE(isCtrlTag(t));
        CHECK(dataTagComm(t) == comm);
        CHECK(dataTagNccl(t) == tag);
        CHECK(dataTagSeq(t) == seq);
      }
    }
  }
  // The sequence wraps within its field without touching the tag or the comm.
  uint64_t t = dataTag(5, 9, kSeqMask + 3);
  CHECK(dataTagSeq(t) == 2);
  CHECK(dataTagNccl(t) == 9);
  CHECK(dataTagComm(t) == 5);
}

TEST_CASE("an acknowledgement key names a message among its comm's, and gives back its data tag", "[wire]") {
  for (uint32_t comm : {1u, 0x1234u, kMaxCommId}) {
    for (int tag : {0, 7, kMaxNcclTag}) {
      for (uint32_t seq : {0u, 255u, kSeqMask}) {
        const uint64_t t = dataTag(comm, tag, seq);
        const uint64_t key = ackKey(t);
        CHECK(key == ackKey(dataTag(comm == 1 ? 2 : 1, tag, seq)));  // the comm is not part of it
        CHECK(dataTagOfKey(comm, key) == t);                           // a send sent again keeps its tag
      }
    }
  }
  CHECK(ackKey(dataTag(3, 1, 0)) != ackKey(dataTag(3, 0, 1)));
  CHECK(ackKey(dataTag(3, 1, 2)) != ackKey(dataTag(3, 1, 3)));
  // An acknowledgement lands in an offer receive buffer and names its comm where an offer does.
  CHECK(sizeof(AckMsg) <= sizeof(OfferMsg));
  CHECK(offsetof(AckMsg, toComm) == offsetof(OfferMsg, toComm));
  CHECK(offsetof(AckMsg, magic) == offsetof(OfferMsg, magic));
  CHECK(AckMsg::bytes(0) == offsetof(AckMsg, key));
  CHECK(AckMsg::bytes(AckMsg::kMaxKeys, true) == sizeof(AckMsg));  // a re-admission's threshold after the keys
  CHECK(AckMsg::bytes(1, true) == AckMsg::bytes(2));
  for (uint64_t body : {kRailDown, kRailUp, kWritesOver}) {
    CHECK(body != kCloseNotice);
    CHECK(body != kCloseAck);
    CHECK(body != kProbeBody);
  }
  CHECK(kRailDown != kRailUp);
  CHECK(kWritesOver != kRailDown);
  CHECK(kWritesOver != kRailUp);
}

TEST_CASE("an acknowledgement from a peer before rail failover reads as epoch 0, re-admitting nothing", "[wire]") {
  // That peer wrote a 16-bit count and two zero bytes where the epoch and the re-admission are now.
  unsigned char bytes[sizeof(AckMsg)] = {};
  const uint32_t magic = AckMsg::kMagic;
  const uint16_t count = 64;
  std::memcpy(bytes, &magic, 4);
  std::memcpy(bytes + 4, &count, 2);
  AckMsg m;
  std::memcpy(static_cast<void*>(&m), bytes, sizeof(m));
  CHECK(m.count == 64);
  CHECK(m.epoch == 0);
  CHECK(m.fenced == 0);
  CHECK(m.readmit == 0);
  CHECK(offsetof(AckMsg, toComm) == 8);
}

TEST_CASE("a rail re-admission note names the comm, the rail, the step and the try", "[wire]") {
  for (uint32_t comm : {1u, 0x1234u, kMaxCommId}) {
    for (int rail : {1, 3}) {
      for (RailUpStep step : {kRailHello, kRailHelloAck, kRailReady}) {
        for (uint16_t attempt : {uint16_t{0}, uint16_t{1}, uint16_t{0xffff}}) {
          const uint64_t w = railUpWord(comm, rail, step, attempt);
          CHECK(railUpComm(w) == comm);
          CHECK(railUpRail(w) == rail);
          CHECK(railUpStep(w) == step);
          CHECK(railUpAttempt(w) == attempt);
        }
      }
    }
  }
  static_assert(kMaxCommId <= 0xffffff, "a comm id fits the note's 24 bits");
}

TEST_CASE("NCCL tags outside the field are refused, not folded", "[wire]") {
  CHECK(validNcclTag(0));
  CHECK(validNcclTag(kMaxNcclTag));
  CHECK_FALSE(validNcclTag(kMaxNcclTag + 1));
  CHECK_FALSE(validNcclTag(-1));
  CHECK_FALSE(validNcclTag(0x7fffffff));
}

TEST_CASE("fields are wide enough for what NCCL can have in flight", "[wire]") {
  CHECK(kMaxCommId + 1 >= (1u << 16));                              // at least 2^16 comms per endpoint
  CHECK(kSeqMask + 1 >= 16u * kMaxRequests * kMaxRecvs);             // a tag's messages in flight, with margin
  CHECK(kCommIdBits + kNcclTagBits + kSeqBits == 63);                // bit 63 is the control bit
}

TEST_CASE("control tags name their kind and comm and never look like data", "[wire]") {
  std::set<uint64_t> seen;
  for (auto kind : {CtrlKind::kConnRequest, CtrlKind::kConnReply, CtrlKind::kProbe, CtrlKind::kOffer}) {
    for (uint32_t comm : {0u, 1u, kMaxCommId}) {
      uint64_t t = ctrlTag(kind, comm);
      CHECK(isCtrlTag(t));
      CHECK(ctrlTagKind(t) == static_cast<uint8_t>(kind));
      CHECK(ctrlTagComm(t) == comm);
      CHECK(seen.insert(t).second);
    }
  }
  // Handshake version 3 used exactly these tags for requests and replies: a peer of that version still meets
  // ours and gets a refusal instead of a timeout.
  CHECK(ctrlTag(CtrlKind::kConnRequest) == ((uint64_t{1} << 63) | 1));
  CHECK(ctrlTag(CtrlKind::kConnReply) == ((uint64_t{1} << 63) | 2));
}

TEST_CASE("the handshake keeps the fields a peer of another version reads", "[wire]") {
  // magic and version open every request; a version-3 request's address is found with its own layout.
  CHECK(offsetof(ConnectRequest, magic) == offsetof(ConnectRequestV3, magic));
  CHECK(offsetof(ConnectRequest, version) == offsetof(ConnectRequestV3, version));
  CHECK(offsetof(ConnectRequest, addrLen) == offsetof(ConnectRequestV3, addrLen));
  CHECK(kRequestBufBytes >= sizeof(ConnectRequestV3));
  CHECK(kRequestBufBytes >= sizeof(ConnectRequest));
  // The reply's layout is version 3's, the comm id where v3 had a reserved 0: a v3 connector reads the status.
  CHECK(offsetof(ConnectReply, status) == 6);
  CHECK(offsetof(ConnectReply, token) == 8);
  CHECK(offsetof(ConnectReply, commId) == 20);
  CHECK(offsetof(ConnectReply, rails) == 24);
  CHECK(ConnectRequest::kVersion == 6);
  // An older request's address and comm id are found where its own layout has them, so the refusal reaches it
  // under the tag it waits on; an older connector gets the reply in its own, shorter layout.
  ConnectRequest r{};
  r.version = ConnectRequest::kVersion;
  CHECK(requestAddr(r) == r.addr);
  r.version = 4;
  CHECK(requestAddr(r) == reinterpret_cast<const uint8_t*>(&r) + offsetof(ConnectRequestV4, addr));
  CHECK(offsetof(ConnectRequest, commId) == offsetof(ConnectRequestV4, commId));
  r.commId = 77;
  CHECK(requestComm(r) == 77);
  r.version = 5;  // four rails: its address sits earlier
  CHECK(requestAddr(r) == reinterpret_cast<const uint8_t*>(&r) + offsetof(ConnectRequestV5, addr));
  CHECK(offsetof(ConnectRequestV5, addr) < offsetof(ConnectRequest, addr));
  CHECK(requestComm(r) == 77);
  r.version = 3;
  CHECK(requestAddr(r) == reinterpret_cast<const uint8_t*>(&r) + offsetof(ConnectRequestV3, addr));
  CHECK(requestComm(r) == 0);
  CHECK(kRequestBufBytes >= sizeof(ConnectRequestV4));
  CHECK(kRequestBufBytes >= sizeof(ConnectRequestV5));
  CHECK(kReplyBytesV4 == offsetof(ConnectReply, rails) + sizeof(RailAddrsV5));  // version 4's whole reply
  CHECK(kReplyBytesV5 == kReplyBytesV4 + 8);                                     // version 5's: and its digest
  CHECK(replyBytesFor(3) == kReplyBytesV4);
  CHECK(replyBytesFor(4) == kReplyBytesV4);
  CHECK(replyBytesFor(5) == kReplyBytesV5);
  CHECK(replyBytesFor(ConnectRequest::kVersion) == sizeof(ConnectReply));
  // Version 6: eight rails (NCCL 2.30's v12 devices)
  CHECK(sizeof(RailAddrs::len) == 8);
  CHECK(sizeof(OfferEntry::addr) / sizeof(OfferEntry::addr[0]) == 8);
  CHECK(offsetof(ConnectReply, tunerDigest) % 8 == 0);
}

TEST_CASE("offers and notes name their comm in the body, never in the tag", "[wire]") {
  // Version 5: every receive matches its tag exactly (see wire.h: an ignore mask is unsafe on shm before 1.19).
  CHECK(offsetof(OfferMsg, toComm) == 8);
  CHECK(offsetof(OfferMsg, entry) == 16);
  CHECK(OfferMsg::bytes(1) == 16 + sizeof(OfferEntry));
  CHECK(ctrlTagComm(ctrlTag(CtrlKind::kOffer)) == 0);
  CHECK(ctrlTagComm(ctrlTag(CtrlKind::kProbe)) == 0);
}

TEST_CASE("a released comm id comes back only after its quarantine", "[wire][comm_ids]") {
  using namespace std::chrono_literals;
  CommIds ids(4, 1000ms);
  auto t0 = CommIds::Clock::time_point{} + 1h;
  uint32_t a = ids.acquire(t0);
  REQUIRE(a != 0);
  ids.release(a, t0);
  CHECK(ids.quarantined() == 1);
  std::set<uint32_t> got;
  for (int i = 0; i < 3; ++i) got.insert(ids.acquire(t0 + 10ms));
  CHECK(got.count(a) == 0);
  CHECK(got.count(0) == 0);
  CHECK(ids.acquire(t0 + 999ms) == 0);   // a is still quarantined, the other three are live
  CHECK(ids.acquire(t0 + 1000ms) == a);  // and free again once the hold has passed
  CHECK(ids.live() == 4);
}

TEST_CASE("running out of comm ids is a clean answer, and releasing makes room", "[wire][comm_ids]") {
  using namespace std::chrono_literals;
  CommIds ids(3, 0ms);
  auto t = CommIds::Clock::now();
  uint32_t x = ids.acquire(t), y = ids.acquire(t), z = ids.acquire(t);
  CHECK(std::set<uint32_t>{x, y, z} == std::set<uint32_t>{1, 2, 3});
  CHECK(ids.acquire(t) == 0);
  ids.release(y, t);
  ids.release(y, t);  // twice: ignored
  ids.release(77, t);  // never given: ignored
  CHECK(ids.acquire(t) == y);
  {
    CommId owned(&ids, 0);
    CHECK_FALSE(owned);
  }
  {
    ids.release(x, t);
    CommId owned(&ids, ids.acquire(t));
    CHECK(owned.get() == x);
    CommId moved = std::move(owned);
    CHECK(moved.get() == x);
    CHECK(owned.get() == 0);
  }
  CHECK(ids.live() == 2);  // the owner released x when it went out of scope
}

TEST_CASE("a retired comm id is never given out again", "[wire][comm_ids]") {
  using namespace std::chrono_literals;
  CommIds ids(2, 0ms);
  auto t = CommIds::Clock::now();
  uint32_t kept = 0;
  {
    CommId owned(&ids, ids.acquire(t));
    kept = owned.get();
    REQUIRE(kept != 0);
    owned.retire();  // a failed-over receive comm's (fabric_failover.cc): traffic for it may wait where nothing ends it
    CHECK(owned.get() == 0);
  }
  CHECK(ids.quarantined() == 0);
  for (int i = 0; i < 4; ++i) {
    uint32_t other = ids.acquire(t);
    CHECK(other != kept);
    ids.release(other, t);
  }
  CHECK(ids.live() == 1);  // the retired one stays taken
}
