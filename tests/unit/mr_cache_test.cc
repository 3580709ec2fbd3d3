// SPDX-License-Identifier: Apache-2.0
// The registration cache: one registration serves every handle on a covered range, each regMr gets its own
// handle, and the registration goes when its last handle does.
#include <catch2/catch.hpp>

#include <vector>

#include "weft/transport/mr_cache.h"
#include "weft/nccl/net.h"

using namespace weft;

namespace {
struct CountingRegistrar : Registrar {
  int regs = 0, deregs = 0;
  bool failNext = false;
  std::vector<std::pair<uintptr_t, size_t>> ranges;
  Status registerRange(uintptr_t base, size_t len, int, int, uint64_t, MrEntry* e) override {
    if (failNext) {
      failNext = false;
      return Status::kSystem;
    }
    ++regs;
    ranges.emplace_back(base, len);
    e->desc = reinterpret_cast<void*>(base);
    return Status::kOk;
  }
  void deregisterRange(MrEntry*) noexcept override { ++deregs; }
};
}  // namespace

TEST_CASE("the same range registered twice gets two handles and one registration", "[mr]") {
  CountingRegistrar r;
  MrCache cache(&r);
  std::vector<char> buf(1 << 20);
  MemHandle *a = nullptr, *b = nullptr;
  REQUIRE(cache.reg(buf.data(), buf.size(), NCCL_PTR_HOST, &a) == Status::kOk);
  REQUIRE(cache.reg(buf.data(), buf.size(), NCCL_PTR_HOST, &b) == Status::kOk);
  CHECK(a != b);
  CHECK(r.regs == 1);
  CHECK(cache.stats().hits == 1);
  CHECK(cache.dereg(a) == Status::kOk);
  CHECK(r.deregs == 0);  // b still uses it
  CHECK(cache.dereg(b) == Status::kOk);
  CHECK(r.deregs == 1);
  CHECK(cache.stats().live == 0);
  CHECK(cache.stats().handles == 0);
}

TEST_CASE("sub-ranges hit the cache; registrations cover whole pages", "[mr]") {
  CountingRegistrar r;
  MrCache cache(&r);
  std::vector<char> buf(1 << 20);
  MemHandle *whole = nullptr, *sub = nullptr;
  REQUIRE(cache.reg(buf.data() + 100, 500000, NCCL_PTR_HOST, &whole) == Status::kOk);
  REQUIRE(r.ranges.size() == 1);
  CHECK(r.ranges[0].first % 4096 == 0);
  CHECK(r.ranges[0].second % 4096 == 0);
  REQUIRE(cache.reg(buf.data() + 4096, 8192, NCCL_PTR_HOST, &sub) == Status::kOk);
  CHECK(r.regs == 1);
  CHECK(sub->addr == reinterpret_cast<uintptr_t>(buf.data() + 4096));
  CHECK(sub->desc() == whole->desc());
  CHECK(cache.dereg(whole) == Status::kOk);
  CHECK(cache.dereg(sub) == Status::kOk);
  CHECK(r.deregs == 1);
}

TEST_CASE("host and GPU registrations of one address are kept apart", "[mr]") {
  CountingRegistrar r;
  MrCache cache(&r);
  std::vector<char> buf(8192);
  MemHandle *h = nullptr, *g = nullptr;
  REQUIRE(cache.reg(buf.data(), 4096, NCCL_PTR_HOST, &h) == Status::kOk);
  REQUIRE(cache.reg(buf.data(), 4096, NCCL_PTR_CUDA, &g) == Status::kOk);
  CHECK(r.regs == 2);
  cache.dereg(h);
  cache.dereg(g);
}

TEST_CASE("a failed registration returns its error and leaves nothing behind", "[mr]") {
  CountingRegistrar r;
  MrCache cache(&r);
  std::vector<char> buf(8192);
  r.failNext = true;
  MemHandle* h = nullptr;
  CHECK(cache.reg(buf.data(), 4096, NCCL_PTR_HOST, &h) == Status::kSystem);
  CHECK(h == nullptr);
  CHECK(cache.stats().live == 0);
  REQUIRE(cache.reg(buf.data(), 4096, NCCL_PTR_HOST, &h) == Status::kOk);
  cache.dereg(h);
}

TEST_CASE("deregistering a handle twice or a foreign pointer is refused, not a crash", "[mr]") {
  CountingRegistrar r;
  MrCache cache(&r);
  std::vector<char> buf(4096);
  MemHandle* h = nullptr;
  REQUIRE(cache.reg(buf.data(), 4096, NCCL_PTR_HOST, &h) == Status::kOk);
  MemHandle fake;
  fake.magic_ = 0;
  CHECK(cache.dereg(&fake) == Status::kInternal);
  CHECK(cache.dereg(nullptr) == Status::kInternal);
  CHECK(cache.dereg(h) == Status::kOk);
}

TEST_CASE("10,000 register/deregister cycles leave no live registration", "[mr]") {
  CountingRegistrar r;
  MrCache cache(&r);
  std::vector<char> buf(1 << 20);
  for (int i = 0; i < 10000; ++i) {
    MemHandle* h = nullptr;
    REQUIRE(cache.reg(buf.data() + (i % 200) * 4096, 4096 * (1 + i % 7), NCCL_PTR_HOST, &h) == Status::kOk);
    REQUIRE(cache.dereg(h) == Status::kOk);
  }
  CHECK(cache.stats().live == 0);
  CHECK(cache.stats().handles == 0);
  CHECK(r.regs == r.deregs);
}
