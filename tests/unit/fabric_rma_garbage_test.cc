// SPDX-License-Identifier: Apache-2.0
// The libfabric RMA comm's endpoint address is in its handle, so anyone may send to it: a stranger's messages (of
// any size, with weft's tag, random bytes or weft's layout with the wrong check word) are dropped without harm, and
// puts with signals between the ranks go on landing whole, with no error on either comm.
#include <catch2/catch.hpp>

#include <rdma/fi_tagged.h>

#include <array>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "fabric/fabric_rma.h"
#include "fabric_test_env.h"
#include "rma/provider_comm.h"
#include "raw_peer.h"
#include "weft/transport/handle.h"

using namespace weft;

namespace {

constexpr size_t kWin = 1 << 16;

// Runs f(rank) for ranks 0 and 1 at once (the collective calls), returning both statuses.
template <typename F>
std::array<Status, 2> both(F&& f) {
  std::array<Status, 2> st{};
  std::thread t([&] { st[1] = f(1); });
  st[0] = f(0);
  t.join();
  return st;
}

// Waits for request `req` of comm `c`, moving the other comm too (one thread plays both proxies); false after 10 s.
bool wait(rma::RmaComm* c, rma::RmaComm* other, void* req) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool done = false;
  while (!done && std::chrono::steady_clock::now() < until) {
    if (c->test(req, &done) != Status::kOk) return false;
    other->progress();
  }
  return done;
}

}  // namespace

TEST_CASE("libfabric RMA: a stranger's messages to a comm's endpoint are dropped, and puts go on", "[rma][fabric]") {
  testing::FabricTestEnv env;
  WEFT_REQUIRE_FABRIC(env);
  std::string why;
  auto tr = fabric::FabricRmaTransport::discover(&why);
  if (tr == nullptr) WEFT_SKIP_UNLESS_CI("no libfabric RMA device here (" << why << ")");
  std::array<std::array<uint8_t, 128>, 2> handles{};
  std::array<rma::RmaListen*, 2> listens{};
  for (int r = 0; r < 2; ++r) REQUIRE(tr->listen(0, handles[r].data(), &listens[r]) == Status::kOk);
  void* hp[2] = {handles[0].data(), handles[1].data()};
  std::array<rma::RmaComm*, 2> comms{};
  REQUIRE(both([&](int r) { return tr->connect(hp, 2, r, listens[r], 0x1234, &comms[r]); }) ==
          std::array<Status, 2>{Status::kOk, Status::kOk});
  std::array<std::vector<uint64_t>, 2> mem{std::vector<uint64_t>(kWin / 8), std::vector<uint64_t>(kWin / 8)};
  std::array<rma::Window*, 2> win{};
  REQUIRE(both([&](int r) { return comms[r]->regMrSym(mem[r].data(), kWin, rma::kPtrHost, 0, -1, &win[r]); }) ==
          std::array<Status, 2>{Status::kOk, Status::kOk});
  std::array<rma::Context*, 2> ctx{};
  for (int r = 0; r < 2; ++r) REQUIRE(comms[r]->createContext(1, {}, &ctx[r]) == Status::kOk);

  // The stranger: a raw endpoint of the same provider, rank 1's address from its handle.
  WireHandle h;
  REQUIRE(WireHandle::decode(handles[1].data(), &h, &why) == Status::kOk);
  testing::RawPeer raw;
  REQUIRE(raw.open());
  fi_addr_t to = FI_ADDR_UNSPEC;
  REQUIRE(fi_av_insert(raw.av, h.addr.data(), 1, &to, 0, nullptr) == 1);
  std::mt19937_64 rng(7);
  std::vector<std::vector<uint8_t>> junk;
  // weft's layout with every field right but the check word: a signal of 1 to rank 1's counting slot, from rank 0.
  // Applied, it would make the count below 17.
  rma::RingMsg forged{};
  forged.check = 0xdeadbeef;
  forged.type = rma::RingMsg::kSignal;
  forged.signalOp = static_cast<uint8_t>(rma::SignalOp::kInc);
  forged.origin = 0;
  forged.window = win[1]->id;
  forged.a = kWin - 8;
  forged.b = 1;
  const auto* fp = reinterpret_cast<const uint8_t*>(&forged);
  junk.emplace_back(fp, fp + sizeof(forged));
  // Random bytes of every size round weft's 64; a message longer than the receive truncates, and 1.17's tcp then
  // drops the stranger's connection (what follows from it is lost, which is right): the longest go last.
  for (size_t n : {size_t{0}, size_t{1}, size_t{8}, size_t{63}, size_t{64}, size_t{64}, size_t{65}, size_t{4096}}) {
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    junk.push_back(std::move(b));
  }
  int sent = 0;
  for (auto& b : junk) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    ssize_t rc;
    do {
      rc = fi_tinject(raw.ep, b.data(), b.size(), to, fabric::kRmaMsgTag);
      fi_cq_tagged_entry e[4];
      fi_cq_read(raw.cq, e, 4);
      comms[1]->progress();
    } while (rc == -FI_EAGAIN && std::chrono::steady_clock::now() < until);
    if (rc == 0) ++sent;
  }
  CHECK(sent >= 8);  // the provider may refuse to inject the largest
  // Let them arrive and be dropped (the stranger's provider moves its sends only when it is progressed too).
  for (const auto t = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t < std::chrono::seconds(1);) {
    comms[1]->progress();
    comms[0]->progress();
    fi_cq_tagged_entry e[4];
    if (fi_cq_read(raw.cq, e, 4) == -FI_EAVAIL) {
      fi_cq_err_entry ee{};
      fi_cq_readerr(raw.cq, &ee, 0);  // the stranger's own failures (its connection dropped): not the comm's
    }
  }

  // Puts with signals from rank 0 to rank 1 still land whole, and the signal counts exactly them.
  for (uint64_t i = 0; i < 16; ++i) {
    mem[0][i] = 0x1111000000000000ull + i;
    // Windows are named by this rank's handle of them; `rank` picks whose part.
    rma::Signal sig{win[0], kWin - 8, 1, rma::SignalOp::kInc, true};
    void* req = nullptr;
    REQUIRE(comms[0]->iput(ctx[0], 0, win[0], 8 * i, 8, win[0], 8 * i, 1, &sig, 0, &req) == Status::kOk);
    REQUIRE(wait(comms[0], comms[1], req));
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (__atomic_load_n(&mem[1][kWin / 8 - 1], __ATOMIC_ACQUIRE) < 16 && std::chrono::steady_clock::now() < until) {
    comms[1]->progress();
    comms[0]->progress();
  }
  CHECK(__atomic_load_n(&mem[1][kWin / 8 - 1], __ATOMIC_ACQUIRE) == 16);
  for (uint64_t i = 0; i < 16; ++i) CHECK(mem[1][i] == 0x1111000000000000ull + i);
  std::string err;
  CHECK_FALSE(comms[0]->hasError(&err));
  CHECK_FALSE(comms[1]->hasError(&err));
  INFO(err);

  for (int r = 0; r < 2; ++r) REQUIRE(comms[r]->destroyContext(ctx[r]) == Status::kOk);
  REQUIRE(both([&](int r) { return comms[r]->deregMrSym(win[r]); }) ==
          std::array<Status, 2>{Status::kOk, Status::kOk});
  for (int r = 0; r < 2; ++r) {
    comms[r]->close();
    delete listens[r];
  }
}
