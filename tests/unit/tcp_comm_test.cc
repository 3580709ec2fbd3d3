// SPDX-License-Identifier: Apache-2.0
// The native TCP backend's data comms (src/tcp/tcp_comm.h) between two ends of socket pairs, one pair per flow,
// through a relay that can change what one end sends or slow one flow down: framing, the header check, messages
// held aside until their receive is posted, messages cut into pieces over 2-16 flows and assembled, pieces
// balanced away from a slow flow, and malformed input from a peer (a wrong check word, a piece no message in
// flight can take, a message larger than its receive, a stream cut short), which must fail the comm cleanly and
// touch no buffer.
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
#include <thread>
#include <vector>

#include "tcp/tcp_backend.h"
#include "tcp/tcp_comm.h"
#include "tcp/tcp_helpers.h"

namespace weft::tcp {
namespace {

// Sender and receiver joined per flow by two socket pairs and a relay in between (the relay copies what the sender
// wrote on flow k to the receiver's socket, through mutate(k, offset, bytes) when set; limit[k] ends the flow's
// stream after that many bytes; every[k] relays flow k on one relay() call in that many only: a slow path).
struct Link {
  TcpDevice dev;
  std::unique_ptr<TcpSendComm> send;
  std::unique_ptr<TcpRecvComm> recv;
  std::vector<int> senderPeer, receiverPeer;  // the relay's ends
  std::vector<uint64_t> relayed;               // bytes relayed so far, per rail
  std::function<void(int, uint64_t, uint8_t*, size_t)> mutate;

  // threads: helper threads that move flows 1 and up (WEFT_TCP_THREADS, tcp_helpers.h); 0: all inline
  // open: flows open from the start (the rest would join later; here none does); grow: the device's NIC is one weft
  // does not know (TcpDevice::grow)
  explicit Link(int flows, uint64_t stripeMin = 256 << 10, uint32_t chunk = 128 << 10, int threads = 0,
                int open = 0, bool grow = false) {
    dev.props.name = "test";
    dev.grow = grow;
    const int opened = open > 0 ? open : flows;
    if (threads > 0) dev.helpers = std::make_shared<HelperPool>(threads, -1, "test");
    SocketOptions opts;
    opts.stripeMin = stripeMin;
    opts.chunk = chunk;
    std::vector<int> sendFds, recvFds;
    for (int k = 0; k < opened; ++k) {
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
      every.push_back(1);
    }
    send = std::make_unique<TcpSendComm>(dev, sendFds, flows, 1, "peer", opts, JoinPlan{});
    recv = std::make_unique<TcpRecvComm>(dev, recvFds, flows, 1, "peer", nullptr, 0, 0);
  }
  ~Link() {
    for (int fd : senderPeer) ::close(fd);
    for (int fd : receiverPeer) ::close(fd);
  }
  // Moves what the sender wrote on each flow on to the receiver, as far as the receiver's socket takes it now.
  void relay() {
    ++calls;
    for (size_t k = 0; k < senderPeer.size(); ++k) {
      if (calls % every[k] != 0) continue;
      Pending& q = pending[k];
      if (q.off == q.bytes.size()) {
        q.bytes.resize(4096);
        q.off = 0;
        ssize_t n = ::read(senderPeer[k], q.bytes.data(), q.bytes.size());
        q.bytes.resize(n > 0 ? static_cast<size_t>(n) : 0);
        if (n == 0) ::shutdown(receiverPeer[k], SHUT_WR);  // the sender closed: so does the receiver's stream
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
  std::vector<uint64_t> limit;  // per flow: bytes relayed before the receiver sees the stream end
  std::vector<uint64_t> every;  // per flow: relayed on one call in this many
  uint64_t calls = 0;
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

// Tag 7 comes first but only tag 8's receive is posted: tag 7 must wait aside, tag 8 must not wait behind it; tag 7
// is delivered whole once its receive is posted.
void heldAside(Link& l, size_t earlySize, size_t laterSize) {
  auto early = pattern(earlySize, 3), later = pattern(laterSize, 9);
  std::vector<uint8_t> bufEarly(earlySize), bufLater(laterSize);
  Request* rl = irecv(l, bufLater, 8);
  Request* s1 = isend(l, early, 7);
  Request* s2 = isend(l, later, 8);
  REQUIRE(drive(l, {rl, s1, s2}) == Status::kOk);
  CHECK(bufLater == later);
  Request* re = irecv(l, bufEarly, 7);
  REQUIRE(drive(l, {re}) == Status::kOk);
  CHECK(bufEarly == early);
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
  heldAside(l, 20000, 500);
}

// Messages of every size, small ones whole and large ones in pieces, over `flows` flows: each arrives whole, in
// order, and every flow carried some of them.
void piecesRoundTrip(int flows, uint32_t chunk, int threads = 0) {
  Link l(flows, /*stripeMin=*/4096, chunk, threads);
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<Request*> reqs;
  const size_t sizes[] = {100, 4096, 65537, 1 << 20, 3000, (1 << 20) + 3, 0, 4 << 20, 5000, 300000};
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
  for (int k = 0; k < flows; ++k) {
    INFO("flow " << k);
    CHECK(l.relayed[k] > 0);
  }
}

// A connection that grows its flows (a NIC weft does not know) sends its bulk messages in pieces from the first one
// on, on flow 0 while it is alone: a message queued whole on flow 0 would stay there when more flows join, at one
// flow's pace. The receiver, a comm of several flows with one open, assembles them from flow 0.
TEST_CASE("TCP: a growing connection on its first flow alone sends bulk messages in pieces", "[tcp]") {
  for (bool grow : {true, false}) {
    INFO((grow ? "growing" : "flows to join, not growing"));
    Link l(4, /*stripeMin=*/64 << 10, /*chunk=*/16 << 10, 0, /*open=*/1, grow);
    const size_t sizes[] = {100, 1 << 20, 3000, (256 << 10) + 5};
    std::vector<std::vector<uint8_t>> out, in;
    std::vector<Request*> reqs;
    uint64_t payload = 0;
    for (size_t i = 0; i < std::size(sizes); ++i) {
      out.push_back(pattern(sizes[i], static_cast<uint8_t>(70 + i)));
      in.emplace_back(sizes[i], 0);
      payload += sizes[i];
    }
    for (size_t i = 0; i < std::size(sizes); ++i) reqs.push_back(irecv(l, in[i], 9));
    for (size_t i = 0; i < std::size(sizes); ++i) reqs.push_back(isend(l, out[i], 9));
    REQUIRE(drive(l, reqs) == Status::kOk);
    for (size_t i = 0; i < std::size(sizes); ++i) {
      INFO("message " << i);
      CHECK(in[i] == out[i]);
    }
    // every message's 16-byte header, and where in pieces one 16-byte piece header a 16 KiB chunk
    const uint64_t pieceHeaders = ((1 << 20) / (16 << 10)) + ((256 << 10) / (16 << 10) + 1);
    const uint64_t whole = payload + 16 * std::size(sizes);
    CHECK(l.relayed[0] == (grow ? whole + 16 * pieceHeaders : whole));
  }
}

TEST_CASE("TCP: messages cut into pieces over 2, 4 and 16 flows are assembled in order", "[tcp]") {
  piecesRoundTrip(2, 4096);
  piecesRoundTrip(4, 65536);
  piecesRoundTrip(16, 16384);
}

void slowFlow(int threads) {
  Link l(4, /*stripeMin=*/65536, /*chunk=*/32768, threads);
  l.every[2] = 8;  // flow 2 moves an eighth as often as the others
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<Request*> reqs;
  for (int i = 0; i < 8; ++i) {
    out.push_back(pattern(4 << 20, static_cast<uint8_t>(i)));
    in.emplace_back(4 << 20, 0);
  }
  for (int i = 0; i < 8; ++i) reqs.push_back(irecv(l, in[i], i));
  for (int i = 0; i < 8; ++i) reqs.push_back(isend(l, out[i], i));
  REQUIRE(drive(l, reqs) == Status::kOk);
  for (int i = 0; i < 8; ++i) CHECK(in[i] == out[i]);
  const uint64_t slowest = std::min({l.relayed[0], l.relayed[1], l.relayed[3]});
  INFO("bytes per flow: " << l.relayed[0] << " " << l.relayed[1] << " " << l.relayed[2] << " " << l.relayed[3]);
  CHECK(l.relayed[2] * 2 < slowest);  // the slow flow took less than half of a healthy one's share
  // The healthy ones shared evenly: all three inline; with helpers flows 1 and 3 (flow 0, on the comm's own thread,
  // takes its next piece without a hand-over and so may carry more).
  const uint64_t fastest = threads > 0 ? std::max(l.relayed[1], l.relayed[3])
                                       : std::max({l.relayed[0], l.relayed[1], l.relayed[3]});
  const uint64_t slowHealthy = threads > 0 ? std::min(l.relayed[1], l.relayed[3]) : slowest;
  CHECK(slowHealthy * 2 > fastest);
}

TEST_CASE("TCP: a flow on a slow path carries fewer pieces, and every message still arrives whole", "[tcp]") {
  slowFlow(0);
}

TEST_CASE("TCP: a message in pieces whose receive is not posted yet is held aside, and grouped receives match "
          "any order", "[tcp]") {
  Link l(4, /*stripeMin=*/4096, /*chunk=*/8192);
  heldAside(l, 300000, 200000);  // in pieces: held aside, its pieces too
  auto a = pattern(70000, 1), b = pattern(90000, 2);
  std::vector<uint8_t> bufA(70000), bufB(90000);
  // one grouped receive for tags 11 and 12; the sends come in the other order
  Request* g = nullptr;
  void* data[2] = {bufA.data(), bufB.data()};
  size_t sz[2] = {bufA.size(), bufB.size()};
  int tags[2] = {11, 12};
  REQUIRE(l.recv->irecv(2, data, sz, tags, nullptr, false, &g) == Status::kOk);
  REQUIRE(g != nullptr);
  Request* sb = isend(l, b, 12);
  Request* sa = isend(l, a, 11);
  REQUIRE(drive(l, {g, sa, sb}) == Status::kOk);
  CHECK(bufA == a);
  CHECK(bufB == b);
}

void senderCloses(int threads) {
  Link l(4, /*stripeMin=*/4096, /*chunk=*/8192, threads);
  auto out = pattern(256 << 10, 5);
  std::vector<uint8_t> in(256 << 10, 0);
  Request* s = isend(l, out, 3);
  // the send completes into the socket buffers (nothing is posted to take it yet), then the sender closes
  bool done = false;
  for (int i = 0; i < 1000000 && !done; ++i) {
    REQUIRE(s->test(&done, nullptr) == Status::kOk);
    if (!done) l.relay();
  }
  REQUIRE(done);
  l.send.reset();
  Request* r = irecv(l, in, 3);
  REQUIRE(drive(l, {r}) == Status::kOk);
  CHECK(in == out);
}

TEST_CASE("TCP: a sender that closes after its last message in pieces still delivers every piece", "[tcp]") {
  senderCloses(0);
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

TEST_CASE("TCP: a piece header that names no message in flight fails the comm", "[tcp]") {
  for (int field : {15, 3}) {  // its kind (the check word's top byte); its offset (far past the message)
    INFO("byte " << field << " of flow 1's first piece header changed");
    Link l(2, /*stripeMin=*/4096, /*chunk=*/8192);
    l.mutate = [field](int k, uint64_t off, uint8_t* p, size_t n) {
      if (k == 1 && off == 0 && n >= 16) p[field] ^= 0x40;
    };
    auto out = pattern(1 << 16, 4);
    std::vector<uint8_t> in(1 << 16, 0);
    Request* r = irecv(l, in, 2);
    isend(l, out, 2);
    CHECK(drive(l, {r}) == Status::kRemote);
  }
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

TEST_CASE("TCP: flows a connection opens follow the NIC's vendor: clouds that cap flows get several", "[tcp]") {
  const char* why = nullptr;
  CHECK(TcpBackend::flowsForNic(0x1d0f, &why) == 16);  // AWS ENA: NCCL Socket's 2 threads x 8 sockets
  CHECK(std::string(why) == "AWS ENA");
  CHECK(TcpBackend::flowsForNic(0x1ae0, &why) == 4);   // Google gVNIC: NCCL's 4 x 1
  CHECK(TcpBackend::flowsForNic(0x1414, &why) == 8);   // Azure MANA
  CHECK(TcpBackend::flowsForNic(0x1af4, &why) == 4);   // virtio-net
  CHECK(TcpBackend::flowsForNic(0x15b3, &why) == 1);   // ConnectX: no cap known
  CHECK(TcpBackend::flowsForNic(0, &why) == 1);        // loopback, veth
  for (unsigned v : {0x1d0fu, 0x1ae0u, 0x1414u, 0x1af4u}) CHECK(TcpBackend::flowsForNic(v, &why) <= kMaxFlows);
}

// ---- helper threads (WEFT_TCP_THREADS): flows 1 and up move on them, the same meaning as inline ----------------

namespace {
int64_t helperBytes() { return counters().helperBytes.load(); }
}  // namespace

TEST_CASE("TCP: with helper threads, messages in pieces over 2, 4 and 16 flows are assembled in order, and the "
          "helpers moved the pieces of flows 1 and up", "[tcp]") {
  for (int threads : {1, 2, 3}) {
    INFO(threads << " helper threads");
    const int64_t before = helperBytes();
    piecesRoundTrip(2, 4096, threads);
    piecesRoundTrip(4, 65536, threads);
    piecesRoundTrip(16, 16384, threads);
    // both sides of flows 1+ (about 3/4 of 2 x 3 x 6.6 MB) went through helpers' system calls
    CHECK(helperBytes() - before > 3 * (6 << 20) / 2);
  }
}

TEST_CASE("TCP: with helper threads, a flow on a slow path carries fewer pieces", "[tcp]") { slowFlow(2); }

TEST_CASE("TCP: with helper threads, a message held aside while its pieces are read is delivered whole once its "
          "receive is posted, wherever its pieces were then", "[tcp]") {
  Link l(4, /*stripeMin=*/4096, /*chunk=*/8192, 2);
  heldAside(l, 300000, 200000);
  // The receive comes while pieces are on their way: some in the memory held aside, some at a helper, the rest
  // still in the sockets. Each round posts it after a different number of relay passes.
  for (int round = 0; round < 24; ++round) {
    INFO("round " << round);
    auto out = pattern(1 << 20, static_cast<uint8_t>(round));
    std::vector<uint8_t> in(1 << 20, 0);
    auto other = pattern(100, 1);
    std::vector<uint8_t> otherIn(100);
    Request* ro = irecv(l, otherIn, 99);  // something posted, so that the first message is read and held aside
    Request* s = isend(l, out, 20 + round);
    Request* so = isend(l, other, 99);
    for (int i = 0; i < round * 3; ++i) {
      l.relay();
      bool d = false;
      REQUIRE(ro->test(&d, nullptr) == Status::kOk);
      if (d) break;
    }
    Request* r = irecv(l, in, 20 + round);
    REQUIRE(drive(l, {r, s, so}) == Status::kOk);
    CHECK(in == out);
  }
}

TEST_CASE("TCP: with helper threads, a sender that closes after its last message in pieces still delivers every "
          "piece", "[tcp]") {
  senderCloses(2);
}

TEST_CASE("TCP: with helper threads, a stream cut short inside a piece fails the comm, never completes it",
          "[tcp]") {
  Link l(2, /*stripeMin=*/4096, /*chunk=*/65536, 1);
  l.limit[1] = 16 + 3000;  // flow 1's first piece header and part of its bytes, then the stream ends
  auto out = pattern(1 << 20, 6);
  std::vector<uint8_t> in(1 << 20, 0);
  Request* r = irecv(l, in, 4);
  isend(l, out, 4);
  CHECK(drive(l, {r}) == Status::kRemote);
}

TEST_CASE("TCP: with helper threads, a piece header that names no message in flight fails the comm", "[tcp]") {
  Link l(2, /*stripeMin=*/4096, /*chunk=*/8192, 1);
  l.mutate = [](int k, uint64_t off, uint8_t* p, size_t n) {
    if (k == 1 && off == 0 && n >= 16) p[3] ^= 0x40;  // its offset, far past the message
  };
  auto out = pattern(1 << 16, 4);
  std::vector<uint8_t> in(1 << 16, 0);
  Request* r = irecv(l, in, 2);
  isend(l, out, 2);
  CHECK(drive(l, {r}) == Status::kRemote);
}

TEST_CASE("TCP: a helper pool starts threads only as flows attach, at most its count, and detached flows are "
          "never touched again", "[tcp]") {
  const int64_t threads0 = counters().helperThreads.load();
  {
    HelperPool pool(2, -1, "test");
    CHECK(counters().helperThreads.load() == threads0);  // none yet
    int a[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, a) == 0);
    std::vector<FlowTask> tasks(5);
    for (auto& t : tasks) {
      t.fd = a[0];
      t.send = false;
      REQUIRE(pool.attach(&t));
    }
    // threads start asynchronously: wait (bounded) until both count themselves
    for (int i = 0; i < 2000 && counters().helperThreads.load() - threads0 < 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(counters().helperThreads.load() - threads0 == 2);
    for (auto& t : tasks) pool.detach(&t);
    // a byte written now is read by nobody: every task is detached
    REQUIRE(::write(a[1], "x", 1) == 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    char c = 0;
    CHECK(::recv(a[0], &c, 1, MSG_DONTWAIT) == 1);
    for (auto& t : tasks) CHECK(t.state.load() == FlowTask::kHeader);
    ::close(a[0]);
    ::close(a[1]);
  }
  CHECK(counters().helperThreads.load() == threads0);  // joined with the pool
}

}  // namespace weft::tcp
