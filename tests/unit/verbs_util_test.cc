// SPDX-License-Identifier: Apache-2.0
// The verbs backend's pure parts: WEFT_IB_HCA selection (NCCL_IB_HCA syntax), port speeds, RoCE GID choice,
// immediate data and message striping. The rest of the backend needs a device: tests/rxe runs it on soft-RoCE.
#include <catch2/catch.hpp>

#include <cstring>

#include "verbs/verbs_util.h"

using namespace weft::verbs;

namespace {
bool sel(const std::string& spec, const std::string& dev, int port) {
  HcaSpec s;
  std::string err;
  REQUIRE(parseHcaSpec(spec, &s, &err));
  return hcaSelected(s, dev, port);
}
GidEntry gid(int index, const char* type, std::initializer_list<uint8_t> tail) {
  GidEntry e;
  e.index = index;
  e.type = type;
  int i = 16 - static_cast<int>(tail.size());
  for (uint8_t b : tail) e.gid[i++] = b;
  return e;
}
}  // namespace

TEST_CASE("WEFT_IB_HCA selects ports as NCCL_IB_HCA does", "[verbs]") {
  CHECK(sel("", "mlx5_0", 1));
  CHECK(sel("mlx5", "mlx5_3", 1));                      // prefixes
  CHECK_FALSE(sel("=mlx5", "mlx5_3", 1));               // '=': exact names
  CHECK(sel("=mlx5_3", "mlx5_3", 2));
  CHECK(sel("mlx5_0:1,mlx5_1", "mlx5_0", 1));
  CHECK_FALSE(sel("mlx5_0:1,mlx5_1", "mlx5_0", 2));     // a port given: only that port
  CHECK(sel("mlx5_0:1,mlx5_1", "mlx5_1", 2));
  CHECK_FALSE(sel("^mlx5_0", "mlx5_0", 1));             // '^': everything but
  CHECK(sel("^mlx5_0", "mlx5_1", 1));
  CHECK_FALSE(sel("^=mlx5_0:1", "mlx5_0", 1));
  CHECK(sel("^=mlx5_0:1", "mlx5_0", 2));
  HcaSpec s;
  std::string err;
  CHECK_FALSE(parseHcaSpec("mlx5_0:x", &s, &err));
  CHECK(err.find("port") != std::string::npos);
  CHECK_FALSE(parseHcaSpec("mlx5_0:0", &s, &err));
  CHECK_FALSE(parseHcaSpec(":1", &s, &err));
  CHECK(sel("mlx5_0:", "mlx5_0", 2));  // an empty port is any port (NCCL 2.30)
}

TEST_CASE("WEFT_IB_HCA carries NCCL 2.30's rail and plane (name:port:rail:plane, empty = undefined)", "[verbs]") {
  HcaSpec s;
  std::string err;
  REQUIRE(parseHcaSpec("mlx5_0:1:0:1,mlx5_1:1:1,mlx5_2::,mlx5_3:1::2", &s, &err));
  const HcaSpec::Item* a = hcaItem(s, "mlx5_0", 1);
  REQUIRE(a != nullptr);
  CHECK(a->rail == 0);
  CHECK(a->plane == 1);
  CHECK(hcaItem(s, "mlx5_0", 2) == nullptr);  // not selected
  CHECK(hcaItem(s, "mlx5_1", 1)->rail == 1);
  CHECK(hcaItem(s, "mlx5_1", 1)->plane == -1);
  CHECK(hcaItem(s, "mlx5_2", 2)->port == -1);  // empty port: any (as NCCL), rail and plane undefined
  CHECK(hcaItem(s, "mlx5_2", 2)->rail == -1);
  CHECK(hcaItem(s, "mlx5_3", 1)->rail == -1);
  CHECK(hcaItem(s, "mlx5_3", 1)->plane == 2);
  REQUIRE(parseHcaSpec("^mlx5_0:1:0:0", &s, &err));
  CHECK(hcaItem(s, "mlx5_1", 1) == nullptr);  // an exclusion names no rails
  CHECK_FALSE(parseHcaSpec("mlx5_0:1:x", &s, &err));
  CHECK(err.find("rail") != std::string::npos);
  CHECK_FALSE(parseHcaSpec("mlx5_0:1:0:40000", &s, &err));
  CHECK(err.find("plane") != std::string::npos);
  CHECK_FALSE(parseHcaSpec("mlx5_0:1:0:0:0", &s, &err));
}

TEST_CASE("port speed from the active speed and width codes", "[verbs]") {
  CHECK(portSpeedMbps(64, 2) == 200000);   // HDR 4x
  CHECK(portSpeedMbps(128, 2) == 400000);  // NDR 4x
  CHECK(portSpeedMbps(32, 2) == 100000);   // EDR 4x
  CHECK(portSpeedMbps(1, 1) == 2500);      // SDR 1x (what rxe reports)
  CHECK(portSpeedMbps(3, 2) == 0);         // unknown codes
  CHECK(portSpeedMbps(64, 3) == 0);
}

TEST_CASE("RoCE GID choice: IPv4-mapped RoCEv2 first, a forced index only if valid", "[verbs]") {
  std::vector<GidEntry> t = {
      gid(0, "IB/RoCE v1", {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),
      gid(1, "RoCE v2", {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),
      gid(2, "IB/RoCE v1", {0xff, 0xff, 10, 0, 0, 1}),
      gid(3, "RoCE v2", {0xff, 0xff, 10, 0, 0, 1}),
  };
  CHECK(chooseGid(t, -1) == 3);
  CHECK(chooseGid(t, 2) == 2);
  CHECK(chooseGid(t, 9) == -1);
  std::vector<GidEntry> v6 = {gid(0, "IB/RoCE v1", {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),
                              gid(1, "RoCE v2", {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),
                              gid(2, "RoCE v2", {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5})};
  CHECK(chooseGid(v6, -1) == 2);  // a global IPv6 RoCEv2 GID before a link-local one
  std::vector<GidEntry> v1only = {gid(0, "IB/RoCE v1", {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})};
  CHECK(chooseGid(v1only, -1) == 0);
  CHECK(chooseGid({}, -1) == -1);
  CHECK(gidIsIpv4Mapped(t[3].gid));
  CHECK_FALSE(gidIsIpv4Mapped(t[1].gid));
}

TEST_CASE("immediate data round-trips slot, pieces and the truncation flag", "[verbs]") {
  for (uint32_t slot : {0u, 1u, 255u, 256u * 8 - 1, (1u << 24) - 1})
    for (uint32_t pieces = 1; pieces <= 8; ++pieces)
      for (bool t : {false, true}) {
        uint32_t imm = Imm::encode(slot, pieces, t);
        CHECK(Imm::slot(imm) == slot);
        CHECK(Imm::pieces(imm) == pieces);
        CHECK(Imm::truncated(imm) == t);
      }
}

TEST_CASE("messages are striped over QPs from WEFT_STRIPE_MIN, covering every byte once", "[verbs]") {
  uint64_t chunk = 0;
  CHECK(splitMessage(1000, 4, 65536, &chunk) == 1);
  CHECK(chunk == 1000);
  CHECK(splitMessage(0, 4, 0, &chunk) == 1);
  CHECK(splitMessage(1 << 20, 1, 65536, &chunk) == 1);
  for (uint64_t size : {65536ull, 65537ull, 1000003ull, 1ull << 30})
    for (int q = 2; q <= 8; ++q) {
      int n = splitMessage(size, q, 65536, &chunk);
      CHECK(n >= 1);
      CHECK(n <= q);
      CHECK(chunk % 128 == 0);
      CHECK(chunk * (n - 1) < size);
      CHECK(chunk * n >= size);
    }
}
