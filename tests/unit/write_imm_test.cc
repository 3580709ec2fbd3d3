// SPDX-License-Identifier: Apache-2.0
// The remote completion data of the rdma protocol: both forms round-trip, and the compact (4-byte) form splits
// any length up to NCCL's 1 GiB limit into at most two pieces that add up exactly.
#include <catch2/catch.hpp>

#include <bit>
#include <algorithm>
#include <random>

#include "fabric/fabric_comm.h"

using namespace weft::fabric;

namespace {
// How the sender splits one segment (fabric_send.cc FabricSendComm::write), checked through the decoder.
int pieces(uint64_t len, uint64_t* sum) {
  int n = 0;
  *sum = 0;
  do {
    uint32_t field = 0;
    uint64_t p = WriteImm32::largestPiece(len, &field);
    uint64_t d = WriteImm32::encode(511, 0, 1, field);
    REQUIRE(WriteImm32::bytes(d) == p);
    *sum += p;
    len -= p;
    ++n;
  } while (len > 0);
  return n;
}
}  // namespace

TEST_CASE("8-byte completion data round-trips comm id, sequence, flags, pieces and 32-bit piece lengths", "[imm]") {
  for (uint32_t comm : {1u, 77u, wire::kMaxCommId}) {
    for (uint32_t seq : {0u, 1u, WriteImm::kSeqs - 1}) {
      for (uint64_t np : {1, 4, 8}) {
        for (uint64_t bytes : {uint64_t{0}, uint64_t{1}, WriteImm::kMaxPiece, uint64_t{0xffffffff}}) {
          uint64_t d = WriteImm::encode(comm, seq, WriteImm::kTruncated, np, bytes);
          CHECK(WriteImm::comm(d) == comm);
          CHECK(WriteImm::seq(d) == seq);
          CHECK(WriteImm::flags(d) == WriteImm::kTruncated);
          CHECK(WriteImm::pieces(d) == np);
          CHECK(WriteImm::bytes(d) == bytes);
          CHECK(WriteImm::flags(WriteImm::encode(comm, seq, 0, np, bytes)) == 0);
        }
      }
    }
  }
  // Every buffer a comm can have offered at once has a sequence, with room for the cursor to move on.
  CHECK(WriteImm::kSeqs >= 2u * 2 * weft::kMaxRequests * weft::kMaxRecvs);
}

TEST_CASE("4-byte completion data with the comm id round-trips comm, sequence, flags and pieces", "[imm]") {
  for (uint32_t comm : {1u, 12345u, wire::kMaxCommId}) {
    for (uint32_t seq : {0u, 513u, WriteImmId::kSeqs - 1}) {
      for (uint64_t np : {1, 3, 8}) {
        for (uint64_t fl : {uint64_t{0}, WriteImmId::kTruncated}) {
          uint64_t d = WriteImmId::encode(comm, seq, fl, np);
          CHECK(d <= 0xffffffffu);
          CHECK(WriteImmId::comm(d) == comm);
          CHECK(WriteImmId::seq(d) == seq);
          CHECK(WriteImmId::pieces(d) == np);
          CHECK(WriteImmId::flags(d) == fl);
        }
      }
    }
  }
}

TEST_CASE("4-byte completion data round-trips sequence, flags and piece count", "[imm]") {
  for (uint16_t slot : {0, 1, 255, 511}) {
    for (uint64_t np : {1, 2, 5, 8}) {
      uint32_t field = 0;
      WriteImm32::largestPiece(12345, &field);
      uint64_t d = WriteImm32::encode(slot, WriteImm::kTruncated, np, field);
      CHECK(d <= 0xffffffffu);
      CHECK(WriteImm32::seq(d) == slot);
      CHECK(WriteImm32::pieces(d) == np);
      CHECK(WriteImm32::flags(d) == WriteImm::kTruncated);
      CHECK(WriteImm32::bytes(d) == 12345);
    }
  }
  // 64 receive requests x 8 buffers: as many sequences as a comm can have offered.
  CHECK(2 * weft::kMaxRequests * weft::kMaxRecvs <= static_cast<int>(WriteImm32::kSeqs));
}

TEST_CASE("4-byte form: any length up to 1 GiB in at most two pieces, summing exactly", "[imm]") {
  uint64_t sum = 0;
  for (uint64_t len = 0; len < 70000; ++len) {
    REQUIRE(pieces(len, &sum) <= (len <= WriteImm32::kMaxM ? 1 : 2));
    REQUIRE(sum == len);
  }
  for (uint64_t len : {uint64_t{1} << 20, (uint64_t{1} << 20) + 1, (uint64_t{1} << 30) - 1, uint64_t{1} << 30}) {
    CHECK(pieces(len, &sum) <= 2);
    CHECK(sum == len);
  }
  CHECK(pieces(uint64_t{1} << 19, &sum) == 1);  // power-of-two sizes (NCCL's usual) are one piece
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    uint64_t len = rng() % ((uint64_t{1} << 30) + 1);
    REQUIRE(pieces(len, &sum) <= 2);
    REQUIRE(sum == len);
  }
}

TEST_CASE("planWrite covers every byte once, never uses more rails than there are, and fits the piece limit",
          "[imm]") {
  std::mt19937_64 rng(11);
  uint64_t off[8], len[8];
  uint32_t field[8];
  uint8_t rail[8];
  for (int i = 0; i < 300000; ++i) {
    const int nRails = 1 + static_cast<int>(rng() % kMaxRails);
    const bool imm4 = (rng() & 1) != 0;
    const uint64_t stripeMin = 4096u << (rng() % 8);
    const uint64_t size = (rng() & 3) == 0 ? rng() % 70000 : rng() % ((uint64_t{1} << 30) + 1);
    const int single = static_cast<int>(rng() % nRails);
    const int n = planWrite(size, nRails, stripeMin, imm4, single, off, len, field, rail);
    INFO("size " << size << " rails " << nRails << " imm4 " << imm4 << " stripeMin " << stripeMin);
    REQUIRE(n >= 1);
    REQUIRE(n <= wire::kMaxPieces);
    uint64_t at = 0;
    bool striped = nRails > 1 && size >= stripeMin;
    for (int p = 0; p < n; ++p) {
      REQUIRE(off[p] == at);  // contiguous, in order
      REQUIRE(rail[p] < nRails);
      if (!striped) REQUIRE(rail[p] == single);
      if (imm4) REQUIRE(WriteImm32::bytes(WriteImm32::encode(0, 0, n, field[p])) == len[p]);
      if (!imm4) REQUIRE(len[p] <= WriteImm::kMaxPiece);
      at += len[p];
    }
    REQUIRE(at == size);
    // Large writes use every rail; with the compact completion data at most 7 (its 8 pieces: 7 stripes, the last
    // possibly in two).
    const int used = imm4 ? std::min(nRails, wire::kMaxPieces - 1) : nRails;
    if (striped && size >= uint64_t{1} << 20) REQUIRE(rail[n - 1] == used - 1);
  }
}

TEST_CASE("planWrite with rails failed over stripes over the rails left, one segment each", "[imm]") {
  std::mt19937_64 rng(12);
  uint64_t off[8], len[8];
  uint32_t field[8];
  uint8_t rail[8];
  for (int i = 0; i < 100000; ++i) {
    const int nRails = 2 + static_cast<int>(rng() % (kMaxRails - 1));
    const auto failed = static_cast<unsigned>(1 + rng() % ((1u << nRails) - 2));  // some, never all
    uint8_t live[kMaxRails];
    int nLive = 0;
    for (int k = 0; k < nRails; ++k) {
      if ((failed & (1u << k)) == 0) live[nLive++] = static_cast<uint8_t>(k);
    }
    const bool imm4 = (rng() & 1) != 0;
    const uint64_t size = rng() % ((uint64_t{1} << 30) + 1);
    const int single = live[rng() % nLive];
    const int n = planWrite(size, nLive, 4096, imm4, single, off, len, field, rail, live);
    INFO("size " << size << " rails " << nRails << " failed " << failed << " imm4 " << imm4);
    REQUIRE(n >= 1);
    unsigned used = 0;
    uint64_t at = 0;
    for (int p = 0; p < n; ++p) {
      REQUIRE(off[p] == at);
      REQUIRE((failed & (1u << rail[p])) == 0);  // never a failed rail
      REQUIRE(rail[p] < nRails);
      used |= 1u << rail[p];
      at += len[p];
    }
    REQUIRE(at == size);
    if (nLive == 1) REQUIRE(used == (1u << single));
    if (size >= uint64_t{1} << 20) REQUIRE(std::popcount(used) == nLive);  // every rail left carries a segment
  }
}

TEST_CASE("8-byte form: a write larger than one piece's 32 bits is cut into pieces, and past 8 refused", "[imm]") {
  uint64_t off[8], len[8];
  uint32_t field[8];
  uint8_t rail[8];
  const uint64_t big = 5 * (uint64_t{1} << 30);  // 5 GiB on one rail: two pieces
  int n = planWrite(big, 1, uint64_t{1} << 40, false, 0, off, len, field, rail);
  REQUIRE(n == 2);
  CHECK(len[0] == WriteImm::kMaxPiece);
  CHECK(len[0] + len[1] == big);
  CHECK(planWrite(8 * WriteImm::kMaxPiece, 1, uint64_t{1} << 40, false, 0, off, len, field, rail) == 8);
  CHECK(planWrite(8 * WriteImm::kMaxPiece + 1, 1, uint64_t{1} << 40, false, 0, off, len, field, rail) == -1);
}
