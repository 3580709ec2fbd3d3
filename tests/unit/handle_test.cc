// SPDX-License-Identifier: Apache-2.0
// The connection handle is plain bytes that survive a trip to another process, and anything else is refused.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "weft/transport/handle.h"

using namespace weft;

namespace {
WireHandle sample() {
  WireHandle h;
  h.providerHash = 0xabcdef01;
  h.token = 0x1122334455667788ull;
  h.listenId = 0x3a5c7;
  h.addrLen = 16;
  for (int i = 0; i < 16; ++i) h.addr[i] = static_cast<uint8_t>(i * 3);
  return h;
}
}  // namespace

TEST_CASE("a handle round-trips through its 128 bytes", "[handle]") {
  uint8_t buf[kHandleSize];
  sample().encode(buf);
  WireHandle out;
  std::string why;
  REQUIRE(WireHandle::decode(buf, &out, &why) == Status::kOk);
  CHECK(out.token == sample().token);
  CHECK(out.providerHash == sample().providerHash);
  CHECK(out.listenId == sample().listenId);
  CHECK(out.addrLen == 16);
  CHECK(std::memcmp(out.addr.data(), sample().addr.data(), 16) == 0);
}

TEST_CASE("every single-bit corruption of a handle is refused", "[handle]") {
  uint8_t buf[kHandleSize];
  sample().encode(buf);
  for (size_t byte = 0; byte < kHandleSize; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t copy[kHandleSize];
      std::memcpy(copy, buf, sizeof(copy));
      copy[byte] ^= static_cast<uint8_t>(1u << bit);
      WireHandle out;
      std::string why;
      INFO("byte " << byte << " bit " << bit);
      CHECK(WireHandle::decode(copy, &out, &why) != Status::kOk);
      CHECK_FALSE(why.empty());
    }
  }
}

TEST_CASE("random and zero handles are refused as invalid usage with a reason", "[handle]") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    uint8_t buf[kHandleSize];
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    if (i == 0) std::memset(buf, 0, sizeof(buf));
    WireHandle out;
    std::string why;
    CHECK(WireHandle::decode(buf, &out, &why) == Status::kInvalidUsage);
  }
  WireHandle out;
  std::string why;
  CHECK(WireHandle::decode(nullptr, &out, &why) == Status::kInternal);
}

TEST_CASE("tokens differ between listens", "[handle]") {
  CHECK(randomToken() != randomToken());
}
