// SPDX-License-Identifier: Apache-2.0
// The device API's TCP comm on its wire (tcp/tcp_rma.h), against a peer this test plays byte by byte over socket
// pairs: a control flow and one data flow. A signal behind a pieced put waits for every piece of it; garbage on a
// data flow, a data flow that closes mid-piece, and a pieced put where the pair has no data flows lose the peer with
// a reason and nothing else; pieces for a window the target does not have are read, dropped and refused once.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tcp/tcp_rma.h"

using namespace weft;
using weft::tcp::RmaFrame;

namespace {

constexpr size_t kPut = 512 << 10;  // in pieces (WEFT_STRIPE_MIN is 256 KiB)
constexpr size_t kPiece = 128 << 10;

// Rank 1 of 2, its peer rank 0 played by the test: `ctl` and `data` are the test's ends of the pair's flows.
struct Wire {
  int ctl = -1, data = -1;
  tcp::TcpRmaComm* comm = nullptr;
  uint32_t ctlSeq = 0, dataSeq = 0;

  explicit Wire(bool dataFlow = true) {
    int c[2], d[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, c) == 0);
    std::vector<tcp::PeerSocket> peers(2);
    peers[0].fd = c[0];
    peers[0].name = "rank 0 (the test)";
    ctl = c[1];
    if (dataFlow) {
      REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, d) == 0);
      peers[0].data.resize(1);
      peers[0].data[0].fd = d[0];
      data = d[1];
    }
    DeviceProps props;
    props.name = "test";
    tcp::SocketOptions opts;
    comm = new tcp::TcpRmaComm(1, 2, std::move(peers), props, opts);
  }
  ~Wire() {
    comm->close();
    ::close(ctl);
    if (data >= 0) ::close(data);
  }
  // Writes all of it, moving the comm while its socket is full (a socket pair buffers less than a piece or two).
  void put(int fd, const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    for (int spins = 0; n > 0 && spins < 1000000; ++spins) {
      const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0) {
        REQUIRE((errno == EAGAIN || errno == EWOULDBLOCK));
        comm->progress();
        continue;
      }
      c += k;
      n -= static_cast<size_t>(k);
    }
    REQUIRE(n == 0);
  }
  void frame(RmaFrame f) {
    f.check = RmaFrame::kCheck ^ ctlSeq++;
    put(ctl, &f, sizeof(f));
  }
  void piece(uint32_t window, uint64_t off, const std::vector<char>& bytes, uint64_t putId) {
    RmaFrame f{};
    f.check = RmaFrame::kCheck ^ dataSeq++;
    f.type = RmaFrame::kPiece;
    f.window = window;
    f.off = off;
    f.size = bytes.size();
    f.putId = putId;
    put(data, &f, sizeof(f));
    put(data, bytes.data(), bytes.size());
  }
  void progress(int n = 50) {
    for (int i = 0; i < n; ++i) comm->progress();
  }
  // Frames the comm sent back so far (registration answers, errors), read without waiting.
  std::vector<RmaFrame> sent() {
    std::vector<RmaFrame> out;
    RmaFrame f;
    while (::recv(ctl, &f, sizeof(f), MSG_DONTWAIT | MSG_WAITALL) == static_cast<ssize_t>(sizeof(f))) out.push_back(f);
    return out;
  }
  std::string error() {
    std::string why;
    return comm->hasError(&why) ? why : std::string();
  }
};

RmaFrame pieced(uint32_t window, uint64_t off, uint64_t size, uint64_t putId) {
  RmaFrame f{};
  f.type = RmaFrame::kPut;
  f.window = window;
  f.off = off;
  f.size = size;
  f.aux = RmaFrame::kPieced;
  f.putId = putId;
  return f;
}

}  // namespace

TEST_CASE("tcp RMA: a signal behind a pieced put is applied once every piece of it is in", "[rma][tcp]") {
  Wire w;
  // The peer's registration of window 1 comes first (announced), then this rank registers its own.
  std::vector<char> mem(kPut + 64, 0);
  RmaFrame reg{};
  reg.type = RmaFrame::kRegister;
  reg.window = 1;
  reg.size = mem.size();
  w.frame(reg);
  rma::Window* win = nullptr;
  REQUIRE(w.comm->regMrSym(mem.data(), mem.size(), rma::kPtrHost, 0, -1, &win) == Status::kOk);
  // A pieced put with a signal (+5 at kPut), then a small put with a signal (+7 at kPut) on the control flow.
  RmaFrame big = pieced(1, 0, kPut, 1);
  big.signalOp = static_cast<uint8_t>(rma::SignalOp::kAdd);
  big.sigWindow = 1;
  big.sigOff = kPut;
  big.value = 5;
  w.frame(big);
  RmaFrame small{};
  small.type = RmaFrame::kPut;
  small.window = 1;
  small.off = kPut + 8;
  small.size = 8;
  small.signalOp = static_cast<uint8_t>(rma::SignalOp::kAdd);
  small.sigWindow = 1;
  small.sigOff = kPut;
  small.value = 7;
  w.frame(small);
  const char eight[8] = {'s', 'm', 'a', 'l', 'l', 'p', 'u', 't'};
  w.put(w.ctl, eight, sizeof(eight));
  auto signal = [&] {
    uint64_t v;
    std::memcpy(&v, mem.data() + kPut, 8);
    return v;
  };
  w.progress();
  CHECK(signal() == 0);  // neither: the small put waits behind the pieced one
  CHECK(std::memcmp(mem.data() + kPut + 8, eight, 8) != 0);
  // Three of its four pieces, out of order: still nothing applied.
  std::vector<std::vector<char>> pieces;
  for (size_t k = 0; k < kPut / kPiece; ++k) pieces.emplace_back(kPiece, static_cast<char>('a' + k));
  w.piece(1, 3 * kPiece, pieces[3], 1);
  w.piece(1, 0, pieces[0], 1);
  w.piece(1, 2 * kPiece, pieces[2], 1);
  w.progress();
  CHECK(signal() == 0);
  w.piece(1, kPiece, pieces[1], 1);
  w.progress();
  CHECK(signal() == 12);
  CHECK(std::memcmp(mem.data() + kPut + 8, eight, 8) == 0);
  for (size_t k = 0; k < pieces.size(); ++k) CHECK(std::memcmp(mem.data() + k * kPiece, pieces[k].data(), kPiece) == 0);
  CHECK(w.error().empty());
  REQUIRE(w.comm->deregMrSym(win) == Status::kOk);
}

TEST_CASE("tcp RMA: pieces for a window the target does not have are dropped and the put refused once",
          "[rma][tcp]") {
  Wire w;
  w.frame(pieced(9, 0, kPut, 1));
  for (size_t k = 0; k < kPut / kPiece; ++k) w.piece(9, k * kPiece, std::vector<char>(kPiece, 'x'), 1);
  w.progress();
  const auto back = w.sent();
  int errors = 0;
  for (const auto& f : back) errors += f.type == RmaFrame::kError && (f.aux & 0xff) == RmaFrame::kPut ? 1 : 0;
  CHECK(errors == 1);
  // The pair goes on: a bye is an orderly close, not a loss.
  RmaFrame bye{};
  bye.type = RmaFrame::kBye;
  w.frame(bye);
  w.progress();
  CHECK(w.error().empty());
}

TEST_CASE("tcp RMA: garbage on a data flow loses the peer, with the reason", "[rma][tcp]") {
  Wire w;
  w.frame(pieced(1, 0, kPut, 1));
  std::vector<char> junk(sizeof(RmaFrame), static_cast<char>(0xab));
  w.put(w.data, junk.data(), junk.size());
  w.progress();
  CHECK_THAT(w.error(), Catch::Contains("rank 0 (the test) is lost") && Catch::Contains("wrong check word"));
}

TEST_CASE("tcp RMA: a data flow that closes in the middle of a piece loses the peer", "[rma][tcp]") {
  Wire w;
  w.frame(pieced(1, 0, kPut, 1));
  RmaFrame f{};
  f.check = RmaFrame::kCheck;
  f.type = RmaFrame::kPiece;
  f.window = 1;
  f.size = kPiece;
  f.putId = 1;
  w.put(w.data, &f, sizeof(f));
  std::vector<char> part(1000, 'p');
  w.put(w.data, part.data(), part.size());
  ::shutdown(w.data, SHUT_WR);
  w.progress();
  CHECK_THAT(w.error(), Catch::Contains("closed in the middle of a piece"));
}

TEST_CASE("tcp RMA: a pieced put on a pair without data flows loses the peer", "[rma][tcp]") {
  Wire w(false);
  w.frame(pieced(1, 0, kPut, 1));
  w.progress();
  CHECK_THAT(w.error(), Catch::Contains("a pieced put on a pair without data flows"));
}
