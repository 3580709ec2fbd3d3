// SPDX-License-Identifier: Apache-2.0
// The out-of-band set-up helper (weft/transport/oob.h) on its own: the listener and its handle, the token-checked
// hello, bounded moves, and the ring with its allgather and barrier; peers that send garbage, go silent or close
// early are errors that say so, or strays waited past, never a hang.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <thread>
#include <vector>

#include "weft/transport/oob.h"

using namespace weft;
using namespace std::chrono_literals;

namespace {

oob::Listener loopbackListener() {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sockaddr_storage sa{};
  std::memcpy(&sa, &a, sizeof(a));
  oob::Listener l;
  REQUIRE(oob::Listener::open(sa, sizeof(a), 16, nullptr, "lo", "test listen", &l) == Status::kOk);
  return l;
}

// Each rank's listener and handle, as NCCL's bootstrap would hand them around.
struct RingWorld {
  std::vector<oob::Listener> listeners;
  std::vector<std::array<char, 128>> handles;
  explicit RingWorld(int n) : handles(static_cast<size_t>(n)) {
    for (int r = 0; r < n; ++r) {
      listeners.push_back(loopbackListener());
      listeners.back().handle(BackendId::kTcp, 77, handles[r].data());
    }
  }
  // Rank r's ring, opened and used: its record is r repeated; "" or why not.
  std::string run(int r, int n, uint64_t commId, oob::Deadline deadline, std::vector<char>* all) {
    WireHandle nh;
    std::string why;
    if (WireHandle::decode(handles[(r + 1) % n].data(), &nh, &why) != Status::kOk) return why;
    sockaddr_storage next{};
    socklen_t len = 0;
    if (!oob::handleAddress(nh, &next, &len)) return "no address in the handle";
    oob::Ring ring;
    if (!ring.open(listeners[r], next, len, nh.token, r, n, commId, deadline, &why)) return "open: " + why;
    std::vector<char> mine(40, static_cast<char>('a' + r));
    if (!ring.allgather(mine.data(), mine.size(), all, deadline, &why)) return "allgather: " + why;
    if (!ring.barrier(deadline, &why)) return "barrier: " + why;
    return "";
  }
};

oob::Socket connectTo(const oob::Listener& l) {
  oob::Socket s = oob::startConnect(l.addr, l.len);
  REQUIRE(s.open());
  return s;
}

}  // namespace

TEST_CASE("an out-of-band listener's handle names its address and a fresh token", "[oob]") {
  oob::Listener a = loopbackListener(), b = loopbackListener();
  char ha[128], hb[128];
  a.handle(BackendId::kVerbs, 0x1234, ha);
  b.handle(BackendId::kVerbs, 0x1234, hb);
  WireHandle h;
  std::string why;
  REQUIRE(WireHandle::decode(ha, &h, &why) == Status::kOk);
  CHECK(h.backend == BackendId::kVerbs);
  CHECK(h.providerHash == 0x1234);
  CHECK(h.token == a.token);
  CHECK(a.token != b.token);
  sockaddr_storage sa{};
  socklen_t len = 0;
  REQUIRE(oob::handleAddress(h, &sa, &len));
  CHECK(len == sizeof(sockaddr_in));
  CHECK(reinterpret_cast<sockaddr_in*>(&sa)->sin_port == reinterpret_cast<sockaddr_in*>(&a.addr)->sin_port);
  CHECK(reinterpret_cast<sockaddr_in*>(&sa)->sin_port != 0);
  WireHandle bad = h;
  bad.addrLen = 3;
  CHECK_FALSE(oob::handleAddress(bad, &sa, &len));
  bad.addrLen = sizeof(sockaddr_in);
  bad.addr[0] = 0xee;  // a family that is neither IPv4 nor IPv6
  bad.addr[1] = 0xee;
  CHECK_FALSE(oob::handleAddress(bad, &sa, &len));
}

TEST_CASE("a hello is accepted only with the listener's token, communicator and an expected rank", "[oob]") {
  auto any = [](uint32_t) { return true; };
  const oob::Hello ok = oob::Hello::request(42, 7, 1, 4);
  CHECK(ok.verdict(42, 7, 4, any) == oob::Hello::kAccepted);
  CHECK(ok.verdict(43, 7, 4, any) == oob::Hello::kWrongToken);
  CHECK(oob::Hello::request(0, 7, 1, 4).verdict(0, 7, 4, any) == oob::Hello::kWrongToken);  // no token is no proof
  CHECK(ok.verdict(42, 8, 4, any) == oob::Hello::kWrongComm);
  CHECK(ok.verdict(42, 7, 5, any) == oob::Hello::kWrongComm);
  CHECK(ok.verdict(42, 7, 4, [](uint32_t r) { return r == 2; }) == oob::Hello::kBadRank);
  CHECK(oob::Hello::request(42, 7, 9, 4).verdict(42, 7, 4, any) == oob::Hello::kBadRank);
  oob::Hello garbage = ok;
  garbage.magic ^= 1;
  CHECK(garbage.verdict(42, 7, 4, any) == oob::Hello::kWrongToken);
  const oob::Hello answered = oob::Hello::answer(oob::Hello::kAccepted, 7, 0, 4);
  CHECK(answered.accepted());
  CHECK(answered.verdict(42, 7, 4, any) == oob::Hello::kWrongToken);  // an answer is no request
  CHECK_FALSE(oob::Hello::answer(oob::Hello::kBadRank, 7, 0, 4).accepted());
  CHECK(std::string(oob::Hello::verdictName(999)) == "an unknown answer");
}

TEST_CASE("a bounded move fails with a reason when the peer closes early or stays silent", "[oob]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  oob::Socket a(sv[0]), b(sv[1]);
  char msg[64] = "twelve bytes";
  std::string why;
  REQUIRE(oob::moveAll(a.fd(), true, msg, 12, oob::Clock::now() + 5s, &why));
  char got[64] = {};
  REQUIRE(oob::moveAll(b.fd(), false, got, 12, oob::Clock::now() + 5s, &why));
  CHECK(std::string(got) == "twelve bytes");
  // Silent: nothing comes, and the deadline ends the wait.
  CHECK_FALSE(oob::moveAll(b.fd(), false, got, 8, oob::Clock::now() + 100ms, &why));
  CHECK(why == "WEFT_CONNECT_TIMEOUT passed");
  // Early close: half a message, then the end.
  REQUIRE(oob::moveAll(a.fd(), true, msg, 4, oob::Clock::now() + 5s, &why));
  a.reset();
  CHECK_FALSE(oob::moveAll(b.fd(), false, got, 8, oob::Clock::now() + 5s, &why));
  CHECK(why == "the peer closed its socket");
}

TEST_CASE("a ring of ranks gathers every rank's record and meets at its barrier", "[oob]") {
  for (int n : {2, 3, 5}) {
    RingWorld w(n);
    std::vector<std::string> errs(static_cast<size_t>(n));
    std::vector<std::vector<char>> all(static_cast<size_t>(n));
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] { errs[r] = w.run(r, n, 0xc0ffee, oob::Clock::now() + 60s, &all[r]); });
    }
    for (auto& t : ts) t.join();
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << " of " << n);
      CHECK(errs[r].empty());
      REQUIRE(all[r].size() == 40u * n);
      for (int o = 0; o < n; ++o) CHECK(all[r][40 * o + 39] == static_cast<char>('a' + o));
    }
  }
}

TEST_CASE("a ring refuses strays with garbage or the wrong token, and a silent one holds nobody up", "[oob]") {
  RingWorld w(2);
  // Before the ranks start: one connection that sends garbage, one with a stale token, one that never speaks.
  oob::Socket garbage = connectTo(w.listeners[1]);
  char junk[32];
  std::memset(junk, 0x5a, sizeof(junk));
  std::string why;
  REQUIRE(oob::moveAll(garbage.fd(), true, junk, sizeof(junk), oob::Clock::now() + 5s, &why));
  oob::Socket stale = connectTo(w.listeners[1]);
  oob::Hello h = oob::Hello::request(w.listeners[1].token + 1, 0xc0ffee, 0, 2);
  REQUIRE(oob::moveAll(stale.fd(), true, &h, sizeof(h), oob::Clock::now() + 5s, &why));
  oob::Socket silent = connectTo(w.listeners[1]);
  std::vector<std::string> errs(2);
  std::vector<std::vector<char>> all(2);
  std::thread t0([&] { errs[0] = w.run(0, 2, 0xc0ffee, oob::Clock::now() + 60s, &all[0]); });
  std::thread t1([&] { errs[1] = w.run(1, 2, 0xc0ffee, oob::Clock::now() + 60s, &all[1]); });
  t0.join();
  t1.join();
  CHECK(errs[0].empty());
  CHECK(errs[1].empty());
  REQUIRE(all[1].size() == 80u);
  CHECK(all[1][0] == 'a');
  // The refused strays were closed: their read ends.
  char c;
  CHECK(oob::moveAll(garbage.fd(), false, &c, 1, oob::Clock::now() + 5s, &why) == false);
  CHECK(why != "WEFT_CONNECT_TIMEOUT passed");
}

TEST_CASE("a ring whose previous rank never comes, or leaves mid-allgather, fails within its deadline", "[oob]") {
  SECTION("never comes") {
    RingWorld w(2);
    std::vector<char> all;
    // Rank 1 alone: its hello reaches rank 0's listener (nobody answers there), and rank 0 never connects to it.
    const std::string e = w.run(1, 2, 1, oob::Clock::now() + 300ms, &all);
    CHECK(e.find("WEFT_CONNECT_TIMEOUT passed") != std::string::npos);
  }
  SECTION("leaves") {
    RingWorld w(2);
    std::string e1;
    std::thread t1([&] {
      std::vector<char> all;
      e1 = w.run(1, 2, 1, oob::Clock::now() + 60s, &all);
    });
    // Rank 0 by hand: connects and says its hello, takes rank 1's, then closes before the allgather.
    WireHandle nh;
    std::string why;
    REQUIRE(WireHandle::decode(w.handles[1].data(), &nh, &why) == Status::kOk);
    {
      oob::Socket toNext = connectTo(w.listeners[1]);
      oob::Hello h = oob::Hello::request(nh.token, 1, 0, 2);
      REQUIRE(oob::moveAll(toNext.fd(), true, &h, sizeof(h), oob::Clock::now() + 30s, &why));
      bool failed = false;
      oob::Socket fromPrev;
      const auto until = oob::Clock::now() + 30s;
      while (!fromPrev.open() && oob::Clock::now() < until) {
        fromPrev = w.listeners[0].accept(&failed);
        std::this_thread::sleep_for(1ms);
      }
      REQUIRE(fromPrev.open());
      oob::Hello in{};
      REQUIRE(oob::moveAll(fromPrev.fd(), false, &in, sizeof(in), oob::Clock::now() + 30s, &why));
      CHECK(in.rank == 1u);
    }
    t1.join();
    CHECK(e1.find("allgather") != std::string::npos);
    CHECK(e1.find("WEFT_CONNECT_TIMEOUT") == std::string::npos);
  }
}
