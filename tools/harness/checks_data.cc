// SPDX-License-Identifier: Apache-2.0
// Data: sizes, NCCL step patterns, grouped receives, outstanding requests; registration and flush.
#include "checks_internal.h"

namespace weft::harness::checks {

// ---- data ------------------------------------------------------------------------------------------------------

// NCCL sends what a step holds: from 0 bytes (an empty step of a p2p operation) up to the step size, and receives
// into buffers at least that large; the size test reports is the sender's (src/transport/net.cc v2.28.9: isend of
// `size` line 1322, the receive sizes of lines 1445-1467).
void dataSizes(CheckEnv& env) {
  Conn c = establish(env);
  const std::vector<size_t> sizes = {0, 1, 7, 8, 63, 4096, 65536, 614400, 1 << 20, (4 << 20) + 3};
  for (size_t k = 0; k < sizes.size(); ++k) {
    StreamSpec s;
    s.sizes = {sizes[k]};
    s.inflight = 1;
    s.slotSize = std::max<size_t>(sizes[k], 1);
    s.recvSize = sizes[k];  // exactly the size, 0 included
    s.seed = 100 + k;
    stream(env, c, s);
  }
  closeConn(env, c);
}

// NCCL posts each receive for a whole slot (or the rest of the message) and takes the real size from test: what
// it then hands on is sizes[i] (net.cc v2.28.9 lines 1459-1467 post, 1520 `sub->transSize = sizes[i]`).
void dataRecvLarger(CheckEnv& env) {
  Conn c = establish(env);
  StreamSpec s;
  s.sizes = {0, 1, 100, 65536, 1 << 20, 12345, 0};
  s.inflight = 4;
  s.slotSize = 1 << 20;
  s.recvSize = 1 << 20;  // every receive posts 1 MiB; the real size must be reported
  s.seed = 7;
  stream(env, c, s);
  closeConn(env, c);
}

// NCCL keeps up to NCCL_STEPS receives and sends in flight per connection and tests only the oldest: the receive
// of step % NCCL_STEPS (net.cc v2.28.9 line 1508, recvProxyProgress), the send of its buffer slot (line 1339,
// sendProxyProgress); each receive is posted for a whole slot, stepSize * sliceSteps bytes, or fewer for the last
// piece of a message (lines 1459-1467).
void dataNcclSteps(CheckEnv& env) {
  Conn c = establish(env);
  struct Pattern {
    const char* proto;
    size_t step;
    int inflight;
    int messages;
  };
  // Step sizes NCCL puts on the wire (docs/nccl-semantics.md §sizes): ring SIMPLE slices of 1 MiB with 4 slices in
  // flight, other SIMPLE 512 KiB, LL 64 KiB, LL128 600 KiB, p2p 128 KiB chunks; 8 slots (NCCL_STEPS).
  const std::vector<Pattern> patterns = {
      {"SIMPLE ring", 1 << 20, 4, 48}, {"SIMPLE tree", 512 << 10, 8, 64}, {"LL", 64 << 10, 8, 128},
      {"LL128", 614400, 8, 48},       {"P2P", 128 << 10, 8, 128},
  };
  uint64_t seed = 1000;
  for (const auto& p : patterns) {
    StreamSpec s;
    for (int i = 0; i < p.messages; ++i) s.sizes.push_back(i == p.messages - 1 ? p.step / 3 + 1 : p.step);
    s.inflight = p.inflight;
    s.slotSize = p.step;
    s.seed = seed++;
    s.tag = 3;
    stream(env, c, s);
  }
  closeConn(env, c);
}

// For LL and LL128 receives of one buffer NCCL presets *request to NCCL_NET_OPTIONAL_RECV_COMPLETION before irecv
// (net.cc v2.28.9 lines 1479-1482; plugin/nccl_net.h line 18): the plugin must overwrite it with a real request
// (or NULL to be asked again), and may complete that request early.
void dataRequestHint(CheckEnv& env) {
  if (env.net.version() < 9) throw CheckSkip("NCCL's v6-v8 shims clear the optional-completion hint");
  Conn c = establish(env);
  StreamSpec s;
  for (int i = 0; i < 32; ++i) s.sizes.push_back(64 << 10);
  s.inflight = 8;
  s.slotSize = 64 << 10;
  s.requestHint = true;
  s.seed = 555;
  stream(env, c, s);
  closeConn(env, c);
}

int agreedMaxRecvs(CheckEnv& env) {
  // The receiver's maxRecvs decides how many buffers one irecv may carry.
  if (env.recv()) {
    env.oob.send("maxRecvs:" + std::to_string(env.props.maxRecvs));
    return env.props.maxRecvs;
  }
  std::string m = env.oob.recvString(env.timeout);
  if (m.rfind("maxRecvs:", 0) != 0) fail("bad maxRecvs message");
  return std::stoi(m.substr(9));
}

// NCCL groups up to maxRecvs receives of one peer (one per channel sub) into one irecv with n buffers, each with
// its own tag and size (net.cc v2.28.9 lines 1377-1408 build the groups, 1482 posts them); test reports one size
// per buffer into an array NCCL zeroes first (line 1507).
void dataGroupedReceives(CheckEnv& env) {
  int maxRecvs = agreedMaxRecvs(env);
  if (maxRecvs <= 1) throw CheckSkip("the device reports maxRecvs=1 (grouped receives not offered)");
  Conn c = establish(env);
  const int rounds = 24;
  const size_t slot = 64 << 10;
  Buffer buf(slot * maxRecvs, env.mem);
  Registration reg(env, c.comm(), buf);
  std::mt19937 rng(42);  // same sequence in both processes
  for (int r = 0; r < rounds; ++r) {
    int n = 1 + r % maxRecvs;
    std::vector<int> tags(n);
    std::vector<size_t> sizes(n);
    for (int k = 0; k < n; ++k) {
      tags[k] = 100 + k;
      sizes[k] = (k * 7919 + r * 131) % slot;  // includes 0 now and then
    }
    std::vector<int> order(n);
    for (int k = 0; k < n; ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);
    if (env.recv()) {
      std::vector<void*> data(n), mhs(n, reg.mh());
      std::vector<size_t> want(n, slot);
      for (int k = 0; k < n; ++k) data[k] = buf.data() + k * slot;
      void* req = nullptr;
      Deadline d(env.timeout);
      while (req == nullptr) {
        expectOk(env.net.irecv(c.recvComm, n, data.data(), want.data(), tags.data(), mhs.data(), &req),
                 "irecv of " + std::to_string(n) + " buffers");
        if (d.expired()) fail("grouped irecv never accepted");
      }
      std::vector<int> got = waitRequest(env, req, n, "grouped receive");
      for (int k = 0; k < n; ++k) {
        if (static_cast<size_t>(got[k]) != sizes[k]) {
          fail("round " + std::to_string(r) + ": buffer with tag " + std::to_string(tags[k]) + " reported " +
               std::to_string(got[k]) + " bytes, expected " + std::to_string(sizes[k]));
        }
        if (buf.mismatch(k * slot, sizes[k], r * 100 + k) != SIZE_MAX) {
          fail("round " + std::to_string(r) + ": buffer with tag " + std::to_string(tags[k]) + " holds the wrong data");
        }
      }
    } else {
      std::vector<void*> reqs;
      for (int k : order) {  // sends of one group arrive in any tag order (PXN)
        uint8_t* p = buf.data() + k * slot;
        buf.fill(k * slot, sizes[k], r * 100 + k);
        void* req = nullptr;
        Deadline d(env.timeout);
        while (req == nullptr) {
          expectOk(env.net.isend(c.sendComm, p, sizes[k], tags[k], reg.mh(), &req), "isend");
          if (d.expired()) fail("isend never accepted");
        }
        reqs.push_back(req);
      }
      for (void* req : reqs) waitRequest(env, req, 1, "send");
    }
  }
  reg.release();
  closeConn(env, c);
}

// A plugin must take NCCL_NET_MAX_REQUESTS (32) requests outstanding per comm (plugin/nccl_net.h line 33 in
// v2.28.9; 8 before table v7, net_v6.h).
void dataMaxRequests(CheckEnv& env) {
  // NCCL_NET_MAX_REQUESTS (32) receives outstanding on one comm (shared comms), each of maxRecvs buffers when
  // the device groups receives, matched by 32 x maxRecvs sends in flight on one send comm
  // (docs/nccl-semantics.md §data-path).
  int group = agreedMaxRecvs(env);
  Conn c = establish(env);
  const int kReq = NCCL_NET_MAX_REQUESTS;
  const int kMsgs = kReq * group;
  const size_t slot = 8192;
  Buffer buf(slot * kMsgs, env.mem);
  Registration reg(env, c.comm(), buf);
  auto at = [&](int m) { return buf.data() + m * slot; };
  auto len = [&](int m) { return slot - m % 4096; };
  std::vector<void*> reqs;
  if (env.recv()) {
    for (int i = 0; i < kReq; ++i) {
      std::vector<void*> data(group), mhs(group, reg.mh());
      std::vector<size_t> sz(group, slot);
      std::vector<int> tags(group);
      for (int k = 0; k < group; ++k) {
        data[k] = at(i * group + k);
        tags[k] = 10 + k;
      }
      void* req = nullptr;
      expectOk(env.net.irecv(c.recvComm, group, data.data(), sz.data(), tags.data(), mhs.data(), &req), "irecv");
      if (req == nullptr) fail("irecv " + std::to_string(i) + " refused: a comm must hold 32 outstanding requests");
      reqs.push_back(req);
    }
    env.oob.barrier("posted", env.timeout);
    for (int i = 0; i < kReq; ++i) {
      auto got = waitRequest(env, reqs[i], group, "receive " + std::to_string(i));
      for (int k = 0; k < group; ++k) {
        int m = i * group + k;
        if (static_cast<size_t>(got[k]) != len(m) || buf.mismatch(m * slot, len(m), 9000 + m) != SIZE_MAX) {
          fail("receive " + std::to_string(i) + " buffer " + std::to_string(k) + " wrong");
        }
      }
    }
  } else {
    env.oob.barrier("posted", env.timeout);
    for (int m = 0; m < kMsgs; ++m) {  // all posted before any is tested
      buf.fill(m * slot, len(m), 9000 + m);
      void* req = nullptr;
      Deadline d(env.timeout);
      while (req == nullptr) {  // a NULL request is legal back-pressure: NCCL retries
        expectOk(env.net.isend(c.sendComm, at(m), len(m), 10 + m % group, reg.mh(), &req), "isend");
        if (d.expired()) fail("isend " + std::to_string(m) + " never accepted with the others outstanding");
      }
      reqs.push_back(req);
    }
    for (int m = 0; m < kMsgs; ++m) waitRequest(env, reqs[m], 1, "send " + std::to_string(m));
  }
  reg.release();
  closeConn(env, c);
}

// A send larger than the receive it matches (a user's count mismatch between ncclSend and ncclRecv). NCCL's
// contract is only that nothing lands past the receive buffer: its Socket transport fails the receive, and its IB
// transport has since 2.20.3 cut the write to the receiver's size and completed it (net_ib.cc, ncclIbIsend:
// `if (size > slots[r].size) size = slots[r].size;`, line 2217 in v2.28.9). So the receive may fail, or complete
// with at most its own size of the sender's first bytes; the bytes after the 1 KiB receive (a canary, in the same
// registration) must stay untouched either way. weft promises more (weft.send_larger_than_recv): an error,
// ncclInvalidUsage, never a silently truncated message.
void sendLargerThanRecv(CheckEnv& env, bool weftPromise) {
  if (weftPromise) requireWeft(env);
  Conn c = establish(env);
  constexpr size_t kRecv = 1024, kSend = 64 << 10;
  constexpr uint8_t kCanary = 0x5a;
  Buffer buf(kSend);
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  void* req = nullptr;
  Deadline d(env.timeout);
  if (env.recv()) {
    std::memset(buf.data(), kCanary, kSend);
    void* data[1] = {buf.data()};
    size_t sz[1] = {kRecv};
    int tags[1] = {0};
    void* mhs[1] = {reg.mh()};
    while (req == nullptr) expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &req), "irecv");
    env.oob.send("posted");
    ncclResult_t r = ncclSuccess;
    int done = 0, sizes[NCCL_PROXY_MAX_SUBS] = {};
    for (;;) {
      r = env.net.test(req, &done, sizes);
      if (r != ncclSuccess || done) break;
      if (d.expired()) fail("the oversized send was neither delivered nor reported within the time limit");
    }
    for (size_t k = kRecv; k < kSend; ++k) {
      if (buf.data()[k] != kCanary) fail("the oversized send wrote past the 1 KiB receive buffer (byte " + std::to_string(k) + ")");
    }
    if (done) {
      if (weftPromise) fail("a 64 KiB send into a 1 KiB receive completed as success (" + std::to_string(sizes[0]) + " B)");
      if (sizes[0] < 0 || static_cast<size_t>(sizes[0]) > kRecv) {
        fail("a 64 KiB send into a 1 KiB receive completed reporting " + std::to_string(sizes[0]) + " B");
      }
      if (findMismatch(buf.data(), static_cast<size_t>(sizes[0]), 3) != SIZE_MAX) {
        fail("the truncated receive does not hold the send's first bytes");
      }
    } else if (weftPromise && r != ncclInvalidUsage) {
      fail(std::string("expected ncclInvalidUsage, got ") + resultName(r));
    }
    env.oob.send("receiver-answered");
  } else {
    fillPattern(buf.data(), kSend, 3);
    if (env.oob.recvString(env.timeout) != "posted") fail("peer out of step");
    while (req == nullptr) expectOk(env.net.isend(c.sendComm, buf.data(), kSend, 0, reg.mh(), &req), "isend");
    // The sender may see success (the data left), an error, or nothing until the comm is closed: NCCL aborts
    // the communicator on the receiver's error. What it must not do is claim a result it cannot have.
    std::string m;
    bool finished = false;  // once the send reported anything it may not be tested again
    for (;;) {
      if (!finished) {
        int done = 0, sz = 0;
        finished = env.net.test(req, &done, &sz) != ncclSuccess || done;
      }
      if (env.oob.tryRecv(&m)) {  // the comm stays open until the receiver has its answer
        if (m == "receiver-answered") break;
        env.oob.pushBack(m);
        throw PeerAborted("the receiving side gave up on this check");
      }
      if (d.expired()) fail("neither side reported the oversized send");
    }
  }
  reg.release();
  closeConn(env, c);
}

void dataSendLargerThanRecv(CheckEnv& env) { sendLargerThanRecv(env, false); }

// PXN's subs of one grouped receive progress on their own: NCCL posts the group of step s + NCCL_STEPS only after the
// group of step s completed (its buffers are the same), while a sub whose data is ready sends on regardless, retrying
// an isend that returns NULL (net.cc v2.28.9: sendProxyProgress per sub, recvProxyProgress posting a group per step).
// Here sub A sends as far as the plugin takes its sends (steps 0..8) before sub B sends its step 0: A's step 8 has no
// posted receive until B's step 0 has arrived. A plugin must hold A's step 8 aside (tag matching) or refuse it until
// its receive exists (buffer offers; NCCL's IB transport refuses A's step 1 until B's step 0 went); one ordered
// stream that waits for A's step 8 to be posted never delivers B's step 0.
void dataGroupedSkew(CheckEnv& env) {
  int maxRecvs = agreedMaxRecvs(env);
  if (maxRecvs <= 1) throw CheckSkip("the device reports maxRecvs=1 (grouped receives not offered)");
  Conn c = establish(env);
  static constexpr int kSteps = 8, kGroups = kSteps + 1, kTagA = 7, kTagB = 9;  // NCCL_STEPS
  // Large enough to be cut into pieces on a multi-rail device (WEFT_STRIPE_MIN's default), so that a message held
  // aside may still be arriving on another rail when its receive is posted.
  constexpr size_t kMsg = (300 << 10) + 3;
  // one slot per (group, sub)
  Buffer buf(kMsg * 2 * kGroups, env.mem);
  Registration reg(env, c.comm(), buf);
  auto slot = [&](int g, int sub) { return static_cast<size_t>(g * 2 + sub) * kMsg; };
  auto seed = [&](int g, int sub) { return 900 + g * 2 + sub; };
  Deadline d(env.timeout);
  if (env.recv()) {
    std::vector<void*> reqs(kGroups, nullptr);
    auto post = [&](int g) {
      void* data[2] = {buf.data() + slot(g, 0), buf.data() + slot(g, 1)};
      size_t sizes[2] = {kMsg, kMsg};
      int tags[2] = {kTagA, kTagB};
      void* mhs[2] = {reg.mh(), reg.mh()};
      while (reqs[g] == nullptr) {
        expectOk(env.net.irecv(c.recvComm, 2, data, sizes, tags, mhs, &reqs[g]), "irecv of group " + std::to_string(g));
        if (d.expired()) fail("the grouped irecv of step " + std::to_string(g) + " was never accepted");
      }
    };
    for (int g = 0; g < kSteps; ++g) post(g);
    for (int g = 0; g < kGroups; ++g) {  // NCCL tests the oldest; its buffers free step g + NCCL_STEPS
      int done = 0, sizes[NCCL_PROXY_MAX_SUBS] = {};
      while (!done) {
        expectOk(env.net.test(reqs[g], &done, sizes), "test of group " + std::to_string(g));
        if (!done && d.expired()) {
          fail("the group of step " + std::to_string(g) + " never completed: sub A's step " + std::to_string(kSteps) +
               " (no receive posted yet) held up sub B's step 0 behind it");
        }
      }
      for (int sub = 0; sub < 2; ++sub) {
        if (sizes[sub] != static_cast<int>(kMsg) || buf.mismatch(slot(g, sub), kMsg, seed(g, sub)) != SIZE_MAX) {
          fail("step " + std::to_string(g) + ", sub " + (sub ? "B" : "A") + ": wrong size or data");
        }
      }
      if (g + kSteps < kGroups) post(g + kSteps);
    }
  } else {
    for (int g = 0; g < kGroups; ++g) {
      for (int sub = 0; sub < 2; ++sub) buf.fill(slot(g, sub), kMsg, seed(g, sub));
    }
    // Each sub posts its sends in order, retrying a NULL isend, and tests its oldest.
    struct Sub {
      int tag, next = 0, tested = 0;
      std::vector<void*> reqs = std::vector<void*>(kGroups, nullptr);
    } subs[2] = {{kTagA}, {kTagB}};
    // One round of NCCL's proxy for this sub: post the next send if it can (false: refused for now), test one.
    auto step = [&](int sub) {
      Sub& s = subs[sub];
      bool posted = true;
      if (s.next < kGroups) {
        expectOk(env.net.isend(c.sendComm, buf.data() + slot(s.next, sub), kMsg, s.tag, reg.mh(), &s.reqs[s.next]),
                 "isend");
        posted = s.reqs[s.next] != nullptr;
        if (posted) ++s.next;
      }
      if (s.tested < s.next) {
        int done = 0, size = 0;
        expectOk(env.net.test(s.reqs[s.tested], &done, &size), "test of a send");
        if (done) ++s.tested;
      }
      return posted;
    };
    // Sub A alone, as far as the plugin lets it go: all its steps, or until a send is refused (NCCL's IB transport
    // takes a group's sends slot by slot, so A waits at step 1 for B's step 0; buffer offers stop A at step 8).
    // Then both, B from its step 0.
    while (subs[0].next < kGroups && step(0)) {
      if (d.expired()) fail("sub A's sends were neither accepted nor refused within the time limit");
    }
    while (subs[0].tested < kGroups || subs[1].tested < kGroups) {
      step(0);
      step(1);
      if (d.expired()) fail("the sends did not complete within the time limit");
    }
  }
  env.oob.barrier("skew-done", env.timeout);
  reg.release();
  closeConn(env, c);
}

// Registered user buffers go out in pieces of up to NCCL_MAX_NET_SIZE, 1 GiB (src/include/collectives.h v2.28.9
// line 14; src/transport/net.cc lines 1306 and 1444-1445): one message of that size must pass intact.
void dataLarge(CheckEnv& env) {
  if (env.quick) throw CheckSkip("--quick");
  Conn c = establish(env);
  StreamSpec s;
  s.sizes = {size_t{1} << 30};
  s.inflight = 1;
  s.slotSize = size_t{1} << 30;
  s.seed = 31337;
  stream(env, c, s);
  closeConn(env, c);
}

// ---- registration and flush ------------------------------------------------------------------------------------

// NCCL registers each protocol's buffer of a connection on its comm (net.cc v2.28.9 lines 954-959 and
// 1109-1114) and, with user-buffer registration, ranges of user buffers that can overlap earlier ones (line
// 1792); it deregisters each handle it got, once (lines 1139, 1184).
void mrCache(CheckEnv& env) {
  Conn c = establish(env);
  const size_t size = 1 << 20;
  Buffer buf(size);
  void* comm = c.comm();
  // The same range twice (the p2p pool is registered by every connection). NCCL keeps each handle it is given and
  // deregisters each once; it needs neither distinct nor non-NULL handles (NCCL's Socket transport returns NULL
  // for host memory). Distinct handles are weft's promise: weft.distinct_handles.
  void *a = nullptr, *b = nullptr, *sub = nullptr;
  expectOk(env.net.regMr(comm, buf.data(), size, NCCL_PTR_HOST, &a), "regMr");
  expectOk(env.net.regMr(comm, buf.data(), size, NCCL_PTR_HOST, &b), "regMr of the same range again");
  // A sub-range at an offset, used for a transfer from/to the middle of the buffer.
  const size_t off = 12288, len = 70000;
  expectOk(env.net.regMr(comm, buf.data() + off, len, NCCL_PTR_HOST, &sub), "regMr of a sub-range");
  expectOk(env.net.deregMr(comm, a), "deregMr of the first handle");  // the others must stay usable
  void* req = nullptr;
  Deadline d(env.timeout);
  if (env.recv()) {
    void* data[1] = {buf.data() + off};
    size_t sz[1] = {len};
    int tags[1] = {0};
    void* mhs[1] = {sub};
    while (req == nullptr) expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &req), "irecv");
    auto got = waitRequest(env, req, 1, "receive into a sub-range");
    if (static_cast<size_t>(got[0]) != len || findMismatch(buf.data() + off, len, 4242) != SIZE_MAX) {
      fail("data received through a sub-range registration is wrong");
    }
  } else {
    fillPattern(buf.data() + off, len, 4242);
    while (req == nullptr) expectOk(env.net.isend(c.sendComm, buf.data() + off, len, 0, sub, &req), "isend");
    waitRequest(env, req, 1, "send from a sub-range");
  }
  expectOk(env.net.deregMr(comm, sub), "deregMr of the sub-range");
  expectOk(env.net.deregMr(comm, b), "deregMr of the second handle");
  // Registering again after everything was released works.
  Registration again(env.net, comm, buf.data(), size);
  again.release();
  closeConn(env, c);
}


// setNetAttr (v11+, optional: NCCL checks for NULL). NCCL 2.28.9 calls it on the context from the service thread
// while connecting (src/transport/net.cc: setNetAttrs from sendConnect/recvConnect with the communicator's peers and
// flows) and from the progress thread before a transfer whose operation, algorithm, protocol, peers or channels
// differ from the last hint (setXferNetAttrs, lines 240-274). Hints only: each call succeeds and nothing about the
// data changes, whatever the hints say.
void apiSetNetAttr(CheckEnv& env) {
  if (env.net.version() < 11) throw CheckSkip("setNetAttr is a v11+ member");
  if (!env.net.hasSetNetAttr()) throw CheckSkip("setNetAttr is NULL (optional: NCCL checks for it)");
  ncclNetAttr_v11_t attr{};
  attr.sendCommAttr.maxConcurrentPeers = attr.recvCommAttr.maxConcurrentPeers = 2;  // (NCCL_MAX_TREE_ARITY-1)*2
  attr.sendCommAttr.maxFlowsPerPeer = attr.recvCommAttr.maxFlowsPerPeer = 16;     // nChannels
  expectOk(env.net.setNetAttr(env.ctx, &attr), "setNetAttr (connect)");
  Conn c = establish(env, "attr");
  constexpr int kMsgs = 64;
  constexpr size_t kSize = 65536;
  Buffer buf(kSize);
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  for (int i = 0; i < kMsgs; ++i) {
    // As the progress thread: a hint for this transfer (op/algo/proto bits, peers and channels), changing often.
    ncclNetAttr_v11_t x = attr;
    ncclNetCommAttr_v11_t& side = env.recv() ? x.recvCommAttr : x.sendCommAttr;
    side.minConcurrentPeers = side.maxConcurrentPeers = 1 + i % 3;
    side.minFlowsPerPeer = side.maxFlowsPerPeer = 1 + i % 16;
    x.op = 1u << (i % 5);
    x.algo = 1u << (i % 3);
    x.proto = 1u << (i % 3);
    expectOk(env.net.setNetAttr(env.ctx, &x), "setNetAttr (transfer)");
    const size_t len = 1 + (static_cast<size_t>(i) * 977) % kSize;
    void* req = nullptr;
    if (env.recv()) {
      void* data[1] = {buf.data()};
      size_t sz[1] = {kSize};
      int tags[1] = {i};
      void* mhs[1] = {reg.mh()};
      while (req == nullptr) expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &req), "irecv");
      auto got = waitRequest(env, req, 1, "receive");
      if (got[0] != static_cast<int>(len)) fail("received " + std::to_string(got[0]) + " B, sent " + std::to_string(len));
      if (size_t at = findMismatch(buf.data(), len, static_cast<uint64_t>(i)); at != SIZE_MAX)
        fail("message " + std::to_string(i) + " differs at byte " + std::to_string(at));
    } else {
      fillPattern(buf.data(), len, static_cast<uint64_t>(i));
      while (req == nullptr) expectOk(env.net.isend(c.sendComm, buf.data(), len, i, reg.mh(), &req), "isend");
      waitRequest(env, req, 1, "send");
    }
  }
  reg.release();
  closeConn(env, c);
}

// NCCL flushes only receives into GPU memory through GPUDirect (src/transport/net.cc: recvProxyProgress posts an
// iflush when useGdr and the NIC needs it): iflush on host memory is never asked for, and NCCL's Socket transport
// answers it with an error. weft's promise: harmless there (NULL request, or one that completes).
void weftIflushHost(CheckEnv& env) {
  requireWeft(env);
  Conn c = establish(env);
  Buffer buf(4096);
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  void* req = nullptr;
  if (env.recv()) {
    void* data[1] = {buf.data()};
    size_t sz[1] = {4096};
    int tags[1] = {0};
    void* mhs[1] = {reg.mh()};
    while (req == nullptr) expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &req), "irecv");
    auto got = waitRequest(env, req, 1, "receive");
    int isz[1] = {got[0]};
    void* freq = nullptr;
    expectOk(env.net.iflush(c.recvComm, 1, data, isz, mhs, &freq), "iflush");
    if (freq != nullptr) waitRequest(env, freq, 1, "flush", /*sizesNull=*/true);  // NCCL tests flushes with NULL sizes
  } else {
    fillPattern(buf.data(), 4096, 1);
    while (req == nullptr) expectOk(env.net.isend(c.sendComm, buf.data(), 4096, 0, reg.mh(), &req), "isend");
    waitRequest(env, req, 1, "send");
  }
  reg.release();
  closeConn(env, c);
}

// weft's read-back flush (FabricRecvComm::iflush: an RMA read of the received buffer on every rail, as NCCL's IB
// transport flushes GPU receives). Over device buffers (--mem cuda) as NCCL asks for it; over host buffers only
// under WEFT_FLUSH=all, which flushes host buffers too. A flush of a non-empty receive returns a request (a NULL one would tell NCCL the GPU
// may read data the NIC has not yet made visible), an empty one none; 64 flushes in flight (32 per comm, NCCL's
// NCCL_NET_MAX_REQUESTS, on two comms) all complete, and each comm still carries data after.
void weftFlush(CheckEnv& env) {
  requireWeft(env);
  const char* mode = std::getenv("WEFT_FLUSH");
  if (env.mem == MemKind::kHost && (mode == nullptr || std::string(mode) != "all"))
    throw CheckSkip("flushes host buffers only with --env WEFT_FLUSH=all (or run it over GPU buffers: --mem cuda)");
  constexpr int kComms = 2, kPer = 32;
  constexpr size_t kSize = 4096;
  std::vector<Conn> conns;
  for (int k = 0; k < kComms; ++k) conns.push_back(establish(env, "flush" + std::to_string(k)));
  Buffer buf(kComms * kPer * kSize, env.mem);
  std::vector<std::unique_ptr<Registration>> regs;
  for (int k = 0; k < kComms; ++k)
    regs.push_back(std::make_unique<Registration>(env, conns[k].comm(), buf, k * kPer * kSize, kPer * kSize));
  auto offset = [&](int k, int i) { return static_cast<size_t>(k * kPer + i) * kSize; };
  auto slot = [&](int k, int i) { return buf.data() + offset(k, i); };
  if (env.recv()) {
    std::vector<std::vector<void*>> reqs(kComms, std::vector<void*>(kPer, nullptr));
    for (int k = 0; k < kComms; ++k)
      for (int i = 0; i < kPer; ++i) {
        void* data[1] = {slot(k, i)};
        size_t sz[1] = {kSize};
        int tags[1] = {i};
        void* mhs[1] = {regs[k]->mh()};
        while (reqs[k][i] == nullptr) expectOk(env.net.irecv(conns[k].recvComm, 1, data, sz, tags, mhs, &reqs[k][i]), "irecv");
      }
    for (int k = 0; k < kComms; ++k)
      for (int i = 0; i < kPer; ++i) {
        auto got = waitRequest(env, reqs[k][i], 1, "receive");
        if (got[0] != static_cast<int>(kSize)) fail("receive of " + std::to_string(got[0]) + " B, want 4096");
        if (size_t at = buf.mismatch(offset(k, i), kSize, static_cast<uint32_t>(k * kPer + i)); at != SIZE_MAX)
          fail("received data differs at byte " + std::to_string(at));
      }
    // An empty flush (every size 0): nothing to read, no request.
    {
      void* data[1] = {slot(0, 0)};
      int sz[1] = {0};
      void* mhs[1] = {regs[0]->mh()};
      void* f = nullptr;
      expectOk(env.net.iflush(conns[0].recvComm, 1, data, sz, mhs, &f), "iflush (empty)");
      if (f != nullptr) fail("an empty flush returned a request");
    }
    long long readsBefore = 0, readsAfter = 0;
    const bool counted = env.plugin != nullptr && env.plugin->stat("flush_reads", &readsBefore);
    std::vector<void*> flushes;
    for (int k = 0; k < kComms; ++k)
      for (int i = 0; i < kPer; ++i) {
        void* data[2] = {slot(k, i), slot(k, (i + 1) % kPer)};
        int sz[2] = {static_cast<int>(kSize), i % 2 == 0 ? 0 : static_cast<int>(kSize)};  // a grouped receive
        void* mhs[2] = {regs[k]->mh(), regs[k]->mh()};
        void* f = nullptr;
        expectOk(env.net.iflush(conns[k].recvComm, 2, data, sz, mhs, &f), "iflush");
        if (f == nullptr)
          fail(std::string("iflush of a received buffer returned no request ") +
               (buf.device() ? "for GPU memory: NCCL would let the GPU read data the NIC may not have made visible"
                             : "under WEFT_FLUSH=all"));
        flushes.push_back(f);
      }
    for (void* f : flushes) waitRequest(env, f, 1, "flush", /*sizesNull=*/true);
    // Each flush was done only once its reads were (one per rail; weft counts the reads that completed).
    if (counted && env.plugin->stat("flush_reads", &readsAfter) &&
        readsAfter - readsBefore < static_cast<long long>(flushes.size()))
      fail(std::to_string(flushes.size()) + " flushes completed, but only " + std::to_string(readsAfter - readsBefore) +
           " flush reads did");
    env.oob.barrier("flush");
    // The comms still carry data after their flushes.
    for (int k = 0; k < kComms; ++k) {
      void* data[1] = {slot(k, 0)};
      size_t sz[1] = {kSize};
      int tags[1] = {99};
      void* mhs[1] = {regs[k]->mh()};
      void* r = nullptr;
      while (r == nullptr) expectOk(env.net.irecv(conns[k].recvComm, 1, data, sz, tags, mhs, &r), "irecv");
      waitRequest(env, r, 1, "receive after the flushes");
      if (size_t at = buf.mismatch(offset(k, 0), kSize, 1000u + static_cast<uint32_t>(k)); at != SIZE_MAX)
        fail("data after the flushes differs at byte " + std::to_string(at));
    }
  } else {
    for (int k = 0; k < kComms; ++k)
      for (int i = 0; i < kPer; ++i) {
        buf.fill(offset(k, i), kSize, static_cast<uint32_t>(k * kPer + i));
        void* r = nullptr;
        while (r == nullptr) expectOk(env.net.isend(conns[k].sendComm, slot(k, i), kSize, i, regs[k]->mh(), &r), "isend");
        waitRequest(env, r, 1, "send");
      }
    env.oob.barrier("flush");
    for (int k = 0; k < kComms; ++k) {
      buf.fill(offset(k, 0), kSize, 1000u + static_cast<uint32_t>(k));
      void* r = nullptr;
      while (r == nullptr) expectOk(env.net.isend(conns[k].sendComm, slot(k, 0), kSize, 99, regs[k]->mh(), &r), "isend");
      waitRequest(env, r, 1, "send");
    }
  }
  for (auto& r : regs) r->release();
  for (auto& c : conns) closeConn(env, c);
}

}  // namespace weft::harness::checks
