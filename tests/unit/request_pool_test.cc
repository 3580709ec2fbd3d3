// SPDX-License-Identifier: Apache-2.0
// The request pool every backend's data comm keeps (weft/transport/request_pool.h) and the device slots of the
// native backends (weft/transport/device_slots.h).
#include <catch2/catch.hpp>

#include <memory>
#include <set>
#include <vector>

#include "weft/transport/device_slots.h"
#include "weft/transport/request_pool.h"

namespace weft {
namespace {

struct Req {
  size_t index = 0;
  int made = 0;
};
using Pool = RequestPool<std::unique_ptr<Req[]>>;

}  // namespace

TEST_CASE("the request pool grows a chunk at a time, up to its capacity, and never moves a request", "[pool]") {
  Pool pool(10);
  std::vector<Req*> taken;
  int chunksMade = 0;
  auto init = [&](Req& r, size_t i) {
    r.index = i;
    ++r.made;
    if (i % Pool::kChunk == 0) ++chunksMade;
  };
  CHECK(pool.allocated() == 0);  // an idle comm holds none
  for (int n = 0; n < 10; ++n) {
    Req* r = pool.takeRequest(init);
    REQUIRE(r != nullptr);
    taken.push_back(r);
  }
  CHECK(pool.takeRequest(init) == nullptr);  // all in use: back-pressure, not growth past the capacity
  CHECK(pool.allocated() == 10);
  CHECK(chunksMade == 3);
  std::set<size_t> indexes;
  for (Req* r : taken) {
    CHECK(r->made == 1);
    indexes.insert(r->index);
    CHECK(&pool.chunkOf(r->index)[Pool::slotOf(r->index)] == r);  // index i names the same request for good
  }
  CHECK(indexes.size() == 10);
}

TEST_CASE("a request given back is taken again before the pool grows", "[pool]") {
  Pool pool(64);
  auto init = [](Req& r, size_t i) { r.index = i; };
  Req* a = pool.takeRequest(init);
  Req* b = pool.takeRequest(init);
  REQUIRE((a != nullptr && b != nullptr));
  pool.giveBack(static_cast<uint16_t>(a->index));
  CHECK(pool.takeRequest(init) == a);
  CHECK(pool.allocated() == static_cast<size_t>(Pool::kChunk));
}

TEST_CASE("a chunk that cannot be made is back-pressure, and the pool stays as it was", "[pool]") {
  RequestPool<std::unique_ptr<Req[]>> pool(8);
  int calls = 0;
  auto refuse = [&](std::unique_ptr<Req[]>&, size_t) {
    ++calls;
    return false;
  };
  CHECK(pool.take(refuse) == -1);
  CHECK(calls == 1);
  CHECK(pool.allocated() == 0);
  CHECK(pool.takeRequest([](Req&, size_t) {}) != nullptr);  // and grows once it can
}

TEST_CASE("device slots publish each device once, views share the device another slot owns", "[pool]") {
  struct Dev {
    int id;
  };
  DeviceSlots<Dev> slots;
  DeviceProps p;
  p.name = "eth0";
  CHECK(slots.add(std::make_unique<Dev>(Dev{7}), p) == 0);
  p.name = "eth0 again";
  p.vdevCount = 1;
  CHECK(slots.addView(0, p) == 1);
  CHECK(slots.count() == 2);
  CHECK(slots.owned() == 1);
  CHECK(&slots.device(1) == &slots.device(0));
  CHECK(slots.props(1).name == "eth0 again");
  for (int i = 2; i < DeviceSlots<Dev>::kMaxDevices; ++i) REQUIRE(slots.addView(0, p) == i);
  CHECK(slots.addView(0, p) == -1);  // full: refused, nothing overwritten
  CHECK(slots.count() == DeviceSlots<Dev>::kMaxDevices);
}

}  // namespace weft
