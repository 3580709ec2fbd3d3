// SPDX-License-Identifier: Apache-2.0
// The native TCP backend's data comms (src/tcp/tcp_comm.h) between two ends of socket pairs, one pair per rail,
// through a relay that can change what one end sends: framing, the header check, messages held aside until their
// receive is posted, a message cut over rails and assembled, and malformed input from a peer (a wrong check word,
// a message larger than its receive, a stream cut short), which must fail the comm cleanly and touch no buffer.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "tcp/tcp_comm.h"

namespace weft::tcp {
namespace {

// Sender and receiver joined per rail by two socket pairs and a relay in between (the relay copies what the sender
// wrote on rail k to the receiver's socket, through mutate(k, offset, bytes) when set; cut(k) closes the rail).
struct Link {
  TcpDevice dev;
  std::unique_ptr<TcpSendComm> send;
  std::unique_ptr<TcpRecvComm> recv;
  std::vector<int> senderPeer, receiverPeer;  // the relay's ends
  std::vector<uint64_t> relayed;               // bytes relayed so far, per rail
  std::function<void(int, uint64_t, uint8_t*, size_t)> mutate;

  explicit Link(int rails, uint64_t stripeMin = 256 << 10) {
    dev.props.name = "test";
    SocketOptions opts;
    opts.stripeMin = stripeMin;
    std::vector<int> sendFds, recvFds;
    for (int k = 0; k < rails; ++k) {
      int a[2], b[2];
      REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, a) == 0);
      REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, b) == 0);
      sendFds.push_back(a[0]);
      senderPeer.push_back(a[1]);
      recvFds.push_back(b[0]);
      receiverPeer.push_back(b[1]);
      relayed.push_back(0);
      pending.emplace_back();
      limit.push_back(UINT64_MAX);
    }
    send = std::make_unique<TcpSendComm>(dev, sendFds, "peer", opts);
    recv = std::make_unique<TcpRecvComm>(dev, recvFds, "peer", opts);
  }
  ~Link() {
    for (int fd : senderPeer) ::close(fd);
    for (int fd : receiverPeer) ::close(fd);
  }
  // Moves what the sender wrote on each rail on to the receiver, as far as the receiver's socket takes it now.
  void relay() {
    for (size_t k = 0; k < senderPeer.size(); ++k) {
      Pending& q = pending[k];
      if (q.off == q.bytes.size()) {
        q.bytes.resize(4096);
        q.off = 0;
        ssize_t n = ::read(senderPeer[k], q.bytes.data(), q.bytes.size());
        q.bytes.resize(n > 0 ? static_cast<size_t>(n) : 0);
        if (n <= 0) continue;
        if (mutate) mutate(static_cast<int>(k), relayed[k], q.bytes.data(), q.bytes.size());
        if (relayed[k] + q.bytes.size() > limit[k]) q.bytes.resize(limit[k] - relayed[k]);
        relayed[k] += q.bytes.size();
      }
      while (q.off < q.bytes.size()) {
        ssize_t w = ::send(receiverPeer[k], q.bytes.data() + q.off, q.bytes.size() - q.off, MSG_NOSIGNAL);
        if (w <= 0) break;
        q.off += static_cast<size_t>(w);
      }
      if (relayed[k] >= limit[k] && q.off == q.bytes.size()) ::shutdown(receiverPeer[k], SHUT_WR);  // the peer is gone
    }
  }
  struct Pending {
    std::vector<uint8_t> bytes;
    size_t off = 0;
  };
  std::vector<Pending> pending;
  std::vector<uint64_t> limit;  // per rail: bytes relayed before the receiver sees the stream end
};

// Tests every request until each is done or one fails; returns the first failure (kOk when all are done). Bounded:
// a request that neither completes nor fails within 20 s fails the test (the comm hung).
Status drive(Link& l, std::vector<Request*> reqs, std::vector<int>* recvSizes = nullptr) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::vector<bool> done(reqs.size(), false);
  size_t left = reqs.size();
  while (left > 0) {
    l.relay();
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (done[i]) continue;
      bool d = false;
      int sizes[kMaxRecvs] = {};
      Status st = reqs[i]->test(&d, sizes);
      if (st != Status::kOk) return st;
      if (d) {
        done[i] = true;
        --left;
        if (recvSizes != nullptr) recvSizes->push_back(sizes[0]);
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("requests neither completed nor failed within 20 s");
    }
  }
  return Status::kOk;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 131 + (i >> 9));
  return v;
}

Request* isend(Link& l, std::vector<uint8_t>& data, int tag) {
  Request* r = nullptr;
  REQUIRE(l.send->isend(data.data(), data.size(), tag, nullptr, &r) == Status::kOk);
  REQUIRE(r != nullptr);
  return r;
}

Request* irecv(Link& l, std::vector<uint8_t>& buf, int tag) {
  Request* r = nullptr;
  void* data[1] = {buf.data()};
  size_t sizes[1] = {buf.size()};
  int tags[1] = {tag};
  REQUIRE(l.recv->irecv(1, data, sizes, tags, nullptr, false, &r) == Status::kOk);
  REQUIRE(r != nullptr);
  return r;
}

}  // namespace

TEST_CASE("TCP: messages of every size arrive whole and in order over one socket", "[tcp]") {
  Link l(1);
  const size_t sizes[] = {0, 1, 15, 16, 17, 4095, 8192, 8193, 100000, 1 << 20};
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<Request*> reqs;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    out.push_back(pattern(sizes[i], static_cast<uint8_t>(i)));
    in.emplace_back(sizes[i] + 64, 0xee);  // room to spare: the message says its own size
  }
  for (size_t i = 0; i < std::size(sizes); ++i) reqs.push_back(irecv(l, in[i], static_cast<int>(i)));
  for (size_t i = 0; i < std::size(sizes); ++i) reqs.push_back(isend(l, out[i], static_cast<int>(i)));
  std::vector<int> got;
  REQUIRE(drive(l, reqs, &got) == Status::kOk);
  for (size_t i = 0; i < std::size(sizes); ++i) {
    INFO("message " << i << ", " << sizes[i] << " bytes");
    CHECK(std::memcmp(in[i].data(), out[i].data(), sizes[i]) == 0);
    CHECK(in[i][sizes[i]] == 0xee);  // nothing past the message
  }
}

TEST_CASE("TCP: a message whose receive is not posted yet is held aside and delivered once it is", "[tcp]") {
  Link l(1);
  auto early = pattern(20000, 3), later = pattern(500, 9);
  std::vector<uint8_t> bufEarly(20000), bufLater(500);
  // Tag 7 comes first but only tag 8's receive is posted: tag 7 must wait aside, tag 8 must not wait behind it.
  Request* rl = irecv(l, bufLater, 8);
  Request* s1 = isend(l, early, 7);
  Request* s2 = isend(l, later, 8);
  REQUIRE(drive(l, {rl, s1, s2}) == Status::kOk);
  CHECK(bufLater == later);
  Request* re = irecv(l, bufEarly, 7);
  REQUIRE(drive(l, {re}) == Status::kOk);
  CHECK(bufEarly == early);
}

TEST_CASE("TCP: a message cut over two rails is assembled in order", "[tcp]") {
  Link l(2, /*stripeMin=*/4096);
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<Request*> reqs;
  const size_t sizes[] = {100, 4096, 65537, 1 << 20, 3000, (1 << 20) + 3};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    out.push_back(pattern(sizes[i], static_cast<uint8_t>(40 + i)));
    in.emplace_back(sizes[i], 0);
  }
  for (size_t i = 0; i < std::size(sizes); ++i) reqs.push_back(irecv(l, in[i], 5));  // one tag: order decides
  for (size_t i = 0; i < std::size(sizes); ++i) reqs.push_back(isend(l, out[i], 5));
  REQUIRE(drive(l, reqs) == Status::kOk);
  for (size_t i = 0; i < std::size(sizes); ++i) {
    INFO("message " << i);
    CHECK(in[i] == out[i]);
  }
  CHECK(l.relayed[1] > 0);  // rail 1 carried pieces
}

TEST_CASE("TCP: a header whose check word is wrong fails the comm and touches no buffer", "[tcp]") {
  Link l(1);
  l.mutate = [](int k, uint64_t off, uint8_t* p, size_t n) {
    if (k == 0 && off == 0 && n >= 16) p[12] ^= 0x01;  // the first header's check word
  };
  auto out = pattern(1000, 1);
  std::vector<uint8_t> in(1000, 0xab);
  Request* r = irecv(l, in, 1);
  Request* s = isend(l, out, 1);
  (void)s;
  CHECK(drive(l, {r}) == Status::kRemote);
  CHECK(std::count(in.begin(), in.end(), 0xab) == 1000);
  // The comm stays failed: a later receive is refused with the same error.
  std::vector<uint8_t> again(10);
  Request* r2 = nullptr;
  void* data[1] = {again.data()};
  size_t sz[1] = {again.size()};
  int tags[1] = {1};
  CHECK(l.recv->irecv(1, data, sz, tags, nullptr, false, &r2) == Status::kRemote);
  CHECK(r2 == nullptr);
}

TEST_CASE("TCP: a message larger than its receive fails the comm and writes nothing past the buffer", "[tcp]") {
  Link l(1);
  auto out = pattern(4000, 2);
  std::vector<uint8_t> in(1000 + 16, 0xcd);
  Request* r = nullptr;
  void* data[1] = {in.data()};
  size_t sz[1] = {1000};
  int tags[1] = {3};
  REQUIRE(l.recv->irecv(1, data, sz, tags, nullptr, false, &r) == Status::kOk);
  isend(l, out, 3);
  CHECK(drive(l, {r}) == Status::kInvalidUsage);
  CHECK(std::count(in.begin(), in.end(), 0xcd) == static_cast<long>(in.size()));
}

TEST_CASE("TCP: a piece header on rail 1 with a wrong check word fails the comm", "[tcp]") {
  Link l(2, /*stripeMin=*/4096);
  l.mutate = [](int k, uint64_t off, uint8_t* p, size_t n) {
    if (k == 1 && off == 0 && n >= 16) p[13] ^= 0x40;  // rail 1's first piece header
  };
  auto out = pattern(1 << 16, 4);
  std::vector<uint8_t> in(1 << 16, 0);
  Request* r = irecv(l, in, 2);
  isend(l, out, 2);
  CHECK(drive(l, {r}) == Status::kRemote);
}

TEST_CASE("TCP: a stream cut short in the middle of a message fails the receive, never completes it", "[tcp]") {
  Link l(1);
  auto out = pattern(200000, 6);
  std::vector<uint8_t> in(200000, 0);
  l.limit[0] = 16 + 5000;  // the header and part of the payload reach the receiver, then the stream ends
  Request* r = irecv(l, in, 4);
  isend(l, out, 4);
  CHECK(drive(l, {r}) == Status::kRemote);
}

}  // namespace weft::tcp
