// SPDX-License-Identifier: Apache-2.0
// weft's own guarantees, beyond NCCL's contract (its handle format known).
#include "checks_internal.h"

namespace weft::harness::checks {

// ---- weft's own guarantees (handle format known) ---------------------------------------------------------------

void requireWeft(CheckEnv& env) {
  if (!env.isWeft) {
    throw CheckSkip("a weft promise beyond NCCL's contract (or weft's handle format); the plugin under test is not "
                    "weft");
  }
}

void weftSendLargerThanRecv(CheckEnv& env) { sendLargerThanRecv(env, true); }

// Under WEFT_DELIVERY_ACK (docs/failover.md, step 2) a send is reported done only once the receiver's process has
// taken its message: what a multi-rail comm needs to send again, on another rail, whatever a failed rail may have
// swallowed. Checked by withholding the receiver: it posts nothing and makes no call while the sender posts small
// messages (those a provider copies out and completes at once: libfabric's tcp does, without acknowledgements)
// and tests them for a while; none may be done. Then the receiver posts its receives: every send completes and
// every byte arrives.
void weftDeliveryAck(CheckEnv& env) {
  requireWeft(env);
  const char* mode = std::getenv("WEFT_DELIVERY_ACK");
  const std::string m = mode != nullptr ? mode : "";
  if (m != "all" && m != "rails") {
    throw CheckSkip("run with --env WEFT_DELIVERY_ACK=all (or =rails over a device of several NICs)");
  }
  Conn c = establish(env);
  // Small enough to go at once in every protocol (eager with rdma: WEFT_EAGER_MAX's default is 16 KiB).
  const std::vector<size_t> sizes = {8, 100, 4096, 12000};
  constexpr size_t kSlot = 16 << 10;
  Buffer buf(kSlot * sizes.size());
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  std::vector<void*> reqs(sizes.size(), nullptr);
  if (env.recv()) {
    std::memset(buf.data(), 0, buf.size());
    if (env.oob.recvString(env.timeout) != "withheld") fail("peer out of step");
    for (size_t i = 0; i < sizes.size(); ++i) {
      void* data[1] = {buf.data() + i * kSlot};
      size_t sz[1] = {kSlot};
      int tags[1] = {7};
      void* mhs[1] = {reg.mh()};
      Deadline d(env.timeout);
      while (reqs[i] == nullptr) {
        expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &reqs[i]), "irecv");
        if (d.expired()) fail("irecv kept answering NULL");
      }
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<int> got = waitRequest(env, reqs[i], 1, "receive " + std::to_string(i));
      if (static_cast<size_t>(got[0]) != sizes[i]) {
        fail("receive " + std::to_string(i) + " reported " + std::to_string(got[0]) + " B, expected " +
             std::to_string(sizes[i]));
      }
      if (findMismatch(buf.data() + i * kSlot, sizes[i], 900 + i) != SIZE_MAX) {
        fail("message " + std::to_string(i) + " arrived corrupted");
      }
    }
    env.oob.send("received");
  } else {
    for (size_t i = 0; i < sizes.size(); ++i) fillPattern(buf.data() + i * kSlot, sizes[i], 900 + i);
    // Posted and tested for a while (the property is "never done while withheld"; the time only bounds how long
    // it is looked at): a send the plugin will not take yet (NULL) is posted after the receiver's release.
    size_t posted = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    uint64_t tests = 0;
    while (std::chrono::steady_clock::now() < until) {
      if (posted < sizes.size()) {
        expectOk(env.net.isend(c.sendComm, buf.data() + posted * kSlot, sizes[posted], 7, reg.mh(), &reqs[posted]),
                 "isend");
        if (reqs[posted] != nullptr) ++posted;
      }
      for (size_t i = 0; i < posted; ++i) {
        int done = 0, got[NCCL_PROXY_MAX_SUBS] = {};
        expectOk(env.net.test(reqs[i], &done, got), "test");
        ++tests;
        if (done) {
          fail("send " + std::to_string(i) + " (" + std::to_string(sizes[i]) + " B) was reported done while the "
               "receiver had posted nothing and made no call: it cannot have been delivered");
        }
      }
    }
    if (posted == 0) fail("no send was taken while the receiver was withheld (every isend answered NULL)");
    std::printf("INFO\t%zu sends posted, none done over %llu tests while the receiver was withheld\n", posted,
                static_cast<unsigned long long>(tests));
    env.oob.send("withheld");
    Deadline d(env.timeout);
    for (size_t i = posted; i < sizes.size(); ++i) {
      while (reqs[i] == nullptr) {
        expectOk(env.net.isend(c.sendComm, buf.data() + i * kSlot, sizes[i], 7, reg.mh(), &reqs[i]), "isend");
        if (d.expired()) fail("isend kept answering NULL after the receiver posted");
      }
    }
    for (size_t i = 0; i < sizes.size(); ++i) waitRequest(env, reqs[i], 1, "send " + std::to_string(i));
    if (env.oob.recvString(env.timeout) != "received") fail("peer out of step");
  }
  closeConn(env, c);
}

// Polls connect with a handle the listener must refuse; requires an error (with a warning) within 30 s.
void connectRefused(CheckEnv& env, uint8_t* handle, const std::string& what) {
  int warnings = warningCount();
  void* sc = nullptr;
  ncclResult_t r = ncclSuccess;
  Deadline d(std::chrono::seconds(30));
  while (r == ncclSuccess && sc == nullptr && !d.expired()) r = env.net.connect(env.ctx, env.dev, handle, &sc);
  if (sc != nullptr) fail(what + " produced a connection");
  if (r == ncclSuccess) fail(what + " was neither refused nor connected within 30 s");
  if (warningCount() == warnings) fail(what + " was refused without a warning");
}

// weft gives every v11+ communicator its own context (per-communicator state: telemetry, and the endpoint groups of
// the shared-endpoint transport), and finalizes each on its own.
void weftContextPerInit(CheckEnv& env) {
  requireWeft(env);
  if (!env.net.hasFinalize()) throw CheckSkip("contexts exist from table v11 (NCCL 2.28)");
  void *c1 = nullptr, *c2 = nullptr;
  expectOk(env.net.init(&c1, 0x1111), "init");
  expectOk(env.net.init(&c2, 0x2222), "init again");
  if (c1 == nullptr || c2 == nullptr) fail("init returned success but a NULL context");
  if (c1 == c2) fail("two communicators' init returned the same context");
  expectOk(env.net.finalize(c1), "finalize of the first context");
  expectOk(env.net.finalize(c2), "finalize of the second context");
}

// weft answers each registration with a handle of its own, even for a range registered before, and each handle
// deregisters on its own, in any order.
void weftDistinctHandles(CheckEnv& env) {
  requireWeft(env);
  Conn c = establish(env);
  Buffer buf(1 << 20);
  void *a = nullptr, *b = nullptr;
  expectOk(env.net.regMr(c.comm(), buf.data(), buf.size(), NCCL_PTR_HOST, &a), "regMr");
  expectOk(env.net.regMr(c.comm(), buf.data(), buf.size(), NCCL_PTR_HOST, &b), "regMr of the same range again");
  if (a == nullptr || b == nullptr || a == b) fail("registering one range twice must give two distinct handles");
  expectOk(env.net.deregMr(c.comm(), b), "deregMr of the second handle");
  expectOk(env.net.deregMr(c.comm(), a), "deregMr of the first handle");
  closeConn(env, c);
}

void weftWrongToken(CheckEnv& env) {
  requireWeft(env);
  if (env.recv()) {
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
    void* lc = nullptr;
    expectOk(env.net.listen(env.ctx, env.dev, handle, &lc), "listen");
    env.oob.send(std::string(reinterpret_cast<char*>(handle), sizeof(handle)));
    // Keep accepting while the forged connect is refused; then the real one must get through.
    void* rc = nullptr;
    Deadline d(env.timeout);
    bool forgedDone = false;
    while (rc == nullptr) {
      expectOk(env.net.accept(lc, &rc), "accept");
      std::string m;
      if (!forgedDone && env.oob.tryRecv(&m)) {
        if (m != "forged-refused") fail("unexpected message " + m);
        if (rc != nullptr) fail("accept produced a connection for a forged token");
        forgedDone = true;
        env.oob.send("go");
      }
      if (d.expired()) fail("accept never got the legitimate connection");
    }
    if (!forgedDone) fail("a connection was accepted before the forged attempt was refused");
    expectOk(env.net.closeListen(lc), "closeListen");
    Conn c{nullptr, rc};
    closeConn(env, c);
  } else {
    std::string m = env.oob.recvString(env.timeout);
    uint8_t real[NCCL_NET_HANDLE_MAXSIZE], forged[NCCL_NET_HANDLE_MAXSIZE];
    std::memcpy(real, m.data(), sizeof(real));
    WireHandle h;
    std::string why;
    if (WireHandle::decode(real, &h, &why) != Status::kOk) fail("cannot decode weft's own handle: " + why);
    h.token ^= 0x1;  // a well-formed handle with the wrong token
    h.encode(forged);
    connectRefused(env, forged, "a connect with a wrong token");
    env.oob.send("forged-refused");
    if (env.oob.recvString(env.timeout) != "go") fail("peer out of step");
    void* sc = nullptr;
    Deadline d(env.timeout);
    while (sc == nullptr) {
      expectOk(env.net.connect(env.ctx, env.dev, real, &sc), "connect with the real handle after a forged one");
      if (d.expired()) fail("the legitimate connect did not complete");
    }
    Conn c{sc, nullptr};
    closeConn(env, c);
  }
}

void weftReplayedHandle(CheckEnv& env) {
  requireWeft(env);
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  Conn c = establish(env, "replay", handle);
  // The same handle again, from another buffer: a replay. The receiver keeps its comm progressing (NCCL tests
  // its requests) while the replay is refused; the first connection must still carry data afterwards.
  if (!env.recv()) connectRefused(env, handle, "a replayed handle");
  StreamSpec s;
  s.sizes = {64};
  s.slotSize = 64;
  s.inflight = 1;
  stream(env, c, s);
  closeConn(env, c);
}

// weft's TCP backend (docs/tcp.md, "Flows"): a connection that carried small messages only holds one flow; a large
// transfer then travels over several, at least `want` of them each with a fair part of the bytes: 10%, or half an
// even share where there are more than 5 flows (16 flows carry 6.25% each; with helper threads, a helper's flow may
// instead carry half an even share of what flows 1 and up carried). Counted by the plugin per flow index
// (weftNetStat tcp.flow_bytes_sent.K, tcp.flows_open), as deltas around this check's own connection.
void weftTcpFlows(CheckEnv& env) {
  requireWeft(env);
  long long flows0 = 0;
  if (env.plugin == nullptr || !env.plugin->stat("tcp.flows_open", &flows0)) throw CheckSkip("not weft's TCP backend");
  const int forced = static_cast<int>(params::getInt("WEFT_TCP_FLOWS"));
  const int want = env.minFlows > 0 ? env.minFlows : forced >= 4 ? 4 : 0;
  if (want == 0) {
    throw CheckSkip("run with WEFT_TCP_FLOWS of 4 or more, or --min-flows N where the NIC decides (on loopback a "
                    "connection keeps one flow)");
  }
  Conn c = establish(env);
  StreamSpec small;
  for (int i = 0; i < 64; ++i) small.sizes.push_back(64);
  small.slotSize = 64;
  stream(env, c, small);
  long long flows1 = 0;
  env.plugin->stat("tcp.flows_open", &flows1);
  // The sender's bulk sends (which open the flows) start only once the receiver counted: its last receives of
  // the small messages may otherwise adopt flows the sender, done first, already opened.
  if (env.recv()) {
    env.oob.send("counted");
  } else if (env.oob.recvString(std::chrono::seconds(60)) != "counted") {
    fail("peer out of step");
  }
  if (flows1 - flows0 != 1) {
    fail("a connection that carried only 64-byte messages holds " + std::to_string(flows1 - flows0) +
         " flows (one expected: flows open as it carries bulk data)");
  }
  constexpr int kFlows = 64;
  // With helper threads (WEFT_TCP_THREADS), flows 1 and up move on them, on both sides: they must carry a part.
  const bool helped = params::getInt("WEFT_TCP_THREADS") > 0;
  long long helperBytes0 = 0, helperBytes1 = 0, helpers = 0;
  env.plugin->stat("tcp.helper_bytes", &helperBytes0);
  std::vector<long long> before(kFlows, 0), after(kFlows, 0);
  for (int k = 0; k < kFlows; ++k) env.plugin->stat(("tcp.flow_bytes_sent." + std::to_string(k)).c_str(), &before[k]);
  StreamSpec bulk;
  for (int i = 0; i < 256; ++i) bulk.sizes.push_back(1 << 20);
  bulk.slotSize = 1 << 20;
  stream(env, c, bulk);
  long long flows2 = 0;
  env.plugin->stat("tcp.flows_open", &flows2);
  env.plugin->stat("tcp.helper_bytes", &helperBytes1);
  env.plugin->stat("tcp.helper_threads", &helpers);
  if (helped) {
    const long long moved = helperBytes1 - helperBytes0;
    std::printf("INFO	%s: %lld helper threads moved %.1f%% of the 256 MiB\n", env.recv() ? "receiving" : "sending",
                helpers, 100.0 * static_cast<double>(moved) / (256.0 * (1 << 20)));
    if (moved < (256ll << 20) / 4) {
      closeConn(env, c);
      fail(std::string("with WEFT_TCP_THREADS the helper threads ") + (env.recv() ? "received " : "sent ") +
           std::to_string(moved) + " of 256 MiB's bytes (a quarter or more expected: flows 1 and up are theirs)");
    }
  }
  // A later connection of the same device starts where this one stopped (docs/tcp.md, "Flows"): its first bulk
  // message opens as many flows. Checked on the sending side, which opens them, where this connection's count is
  // final: forced, or grown to the most a connection may have (a count below it may still be growing).
  const long long first = flows2 - flows1 + 1;
  if (!env.recv() && forced == 0 && first < 16) {
    std::printf("INFO	the first connection has %lld flows, below 16: a later one's start is not checked\n", first);
  }
  // The sender decides (the receiver may not have adopted a flow that joined and carried nothing yet).
  bool second = forced > 0 || first >= 16;
  if (!env.recv()) {
    env.oob.send(second ? "second" : "none");
  } else {
    const std::string said = env.oob.recvString(std::chrono::seconds(60));
    if (said != "second" && said != "none") fail("peer out of step");
    second = said == "second";
  }
  long long laterFlows = 0;
  if (second) {
    Conn c2 = establish(env, "later");
    long long f0 = 0, f1 = 0;
    env.plugin->stat("tcp.flows_open", &f0);
    StreamSpec one;
    one.sizes = {4 << 20};
    one.slotSize = 4 << 20;
    stream(env, c2, one);
    // Flows still joining (a loaded host: the first bulk send waits 200 ms for them at most) join as the comm
    // progresses: a few 64-byte messages more, for up to 10 s, the sender saying when it has seen enough.
    StreamSpec tick;
    tick.sizes = {64};
    tick.slotSize = 64;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      env.plugin->stat("tcp.flows_open", &f1);
      bool more = false;
      if (!env.recv()) {
        more = f1 - f0 + 1 < first && std::chrono::steady_clock::now() < until;
        env.oob.send(more ? "more" : "enough");
      } else {
        more = env.oob.recvString(std::chrono::seconds(60)) == "more";
      }
      if (!more) break;
      stream(env, c2, tick);
    }
    closeConn(env, c2);
    laterFlows = f1 - f0 + 1;
  }
  if (env.recv()) {
    std::printf("INFO	flows open on the receiving side: 1 after small messages, %lld after 256 MiB\n", flows2 - flows0);
    closeConn(env, c);
    return;
  }
  if (second) {
    std::printf("INFO	a later connection's first 4 MiB message went out on %lld flows (the first has %lld)\n",
                laterFlows, first);
    if (laterFlows < first) {
      closeConn(env, c);
      fail("a later connection of the device opened " + std::to_string(laterFlows) + " flows for its first 4 MiB "
           "message; the first connection had found " + std::to_string(first) + " (it should start there)");
    }
  }
  long long total = 0;
  std::vector<long long> bytes(kFlows, 0);
  for (int k = 0; k < kFlows; ++k) {
    env.plugin->stat(("tcp.flow_bytes_sent." + std::to_string(k)).c_str(), &after[k]);
    bytes[k] = after[k] - before[k];
    total += bytes[k];
  }
  int used = 0;
  for (long long b : bytes) used += b > 0;
  const double fair = used > 5 ? 0.5 / used : 0.10;
  // With helpers, flow 0 moves on NCCL's thread and the others on the helpers: on a busy host the helpers get less
  // of the cores and flow 0 takes more (the flows pull pieces as they can). The helpers' flows then each need a
  // fair part of what flows 1 and up carried (their quarter of the whole is checked above).
  const long long rest = total - bytes[0];
  const double fairRest = used - 1 > 5 ? 0.5 / (used - 1) : 0.10;
  int fairShare = 0;
  std::string shares;
  for (int k = 0; k < kFlows; ++k) {
    if (bytes[k] == 0) continue;
    const double share = total > 0 ? static_cast<double>(bytes[k]) / static_cast<double>(total) : 0;
    const double ofRest = rest > 0 ? static_cast<double>(bytes[k]) / static_cast<double>(rest) : 0;
    fairShare += share >= fair || (helped && k > 0 && ofRest >= fairRest);
    char one[16];
    std::snprintf(one, sizeof(one), "%s%.1f%%", shares.empty() ? "" : " ", share * 100);
    shares += one;
  }
  std::printf("INFO	256 MiB over %lld flows (%d carried bytes; shares %s)\n", flows2 - flows0, used, shares.c_str());
  closeConn(env, c);
  if (fairShare < want) {
    char pct[16];
    std::snprintf(pct, sizeof(pct), "%.1f%%", fair * 100);
    fail(std::to_string(fairShare) + " flows carried " + pct + " of the bytes or more" +
         (helped ? " (or, on a helper, half an even share of what the helpers' flows carried)" : "") + "; " +
         std::to_string(want) + " expected (shares: " + shares + ")");
  }
}

void weftUnreachablePeer(CheckEnv& env) {
  requireWeft(env);
  int64_t limit = params::getInt("WEFT_CONNECT_TIMEOUT");
  if (limit < 1 || limit > 10) throw CheckSkip("run with WEFT_CONNECT_TIMEOUT between 1 and 10 s");
  // 1: the listen is gone (nothing answers at that address); 2: a listener that never accepts (a filtered or
  // wedged peer). Either way connect must fail within the timeout, with a warning, and not spin forever.
  for (int round = 0; round < 2; ++round) {
    if (env.recv()) {
      uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
      void* lc = nullptr;
      expectOk(env.net.listen(env.ctx, env.dev, handle, &lc), "listen");
      if (round == 0) expectOk(env.net.closeListen(lc), "closeListen");
      env.oob.send(std::string(reinterpret_cast<char*>(handle), sizeof(handle)));
      if (env.oob.recvString(std::chrono::seconds(limit + 30)) != "done") fail("peer out of step");
      if (round == 1) expectOk(env.net.closeListen(lc), "closeListen");
    } else {
      std::string m = env.oob.recvString(env.timeout);
      uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
      std::memcpy(handle, m.data(), sizeof(handle));
      int warnings = warningCount();
      auto t0 = std::chrono::steady_clock::now();
      void* sc = nullptr;
      ncclResult_t r = ncclSuccess;
      Deadline d(std::chrono::seconds(limit + 15));
      while (r == ncclSuccess && sc == nullptr && !d.expired()) r = env.net.connect(env.ctx, env.dev, handle, &sc);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      env.oob.send("done");
      std::string what = round == 0 ? "connect to a closed listen" : "connect to a listener that never accepts";
      if (sc != nullptr) fail(what + " succeeded");
      if (r == ncclSuccess) fail(what + " did not fail within WEFT_CONNECT_TIMEOUT + 15 s");
      if (warningCount() == warnings) fail(what + " failed without a warning");
      std::printf("INFO\t%s failed after %.1f s (%s)\n", what.c_str(), s, resultName(r));
    }
  }
}

// NCCL never does these; a plugin must survive them with an error and a warning, not a crash: closing twice,
// deregistering twice, testing a request after it reported done, NULL out-pointers, a memory handle that is not
// one, a comm of the wrong kind.
void weftMisuse(CheckEnv& env) {
  requireWeft(env);
  Conn c = establish(env);
  Buffer buf(1 << 16);
  // a registration deregistered twice
  void* mh = nullptr;
  expectOk(env.net.regMr(c.comm(), buf.data(), buf.size(), NCCL_PTR_HOST, &mh), "regMr");
  expectOk(env.net.deregMr(c.comm(), mh), "deregMr");
  int w = warningCount();
  if (env.net.deregMr(c.comm(), mh) == ncclSuccess) fail("a second deregMr of the same handle succeeded");
  if (warningCount() == w) fail("a second deregMr was refused without a warning");
  uint64_t junk[16] = {};
  if (env.net.deregMr(c.comm(), junk) == ncclSuccess) fail("deregMr accepted a handle that is not weft's");
  // NULL out-pointers
  if (env.net.regMr(c.comm(), buf.data(), buf.size(), NCCL_PTR_HOST, nullptr) == ncclSuccess)
    fail("regMr accepted a NULL handle pointer");
  // DMA-BUF registration where the device does not advertise it (NCCL never asks then), with an fd that is no
  // dma-buf: refused with a warning, never registered as something it is not.
  if (env.net.hasRegMrDmaBuf() && (env.props.ptrSupport & NCCL_PTR_DMABUF) == 0) {
    for (int type : {NCCL_PTR_CUDA, NCCL_PTR_HOST}) {
      int fds[2];
      if (pipe(fds) != 0) fail("pipe() failed");
      void* dm = nullptr;
      w = warningCount();
      ncclResult_t dr = env.net.regMrDmaBuf(c.comm(), buf.data(), buf.size(), type, 0, fds[0], &dm);
      close(fds[0]);
      close(fds[1]);
      const std::string what = type == NCCL_PTR_CUDA ? "GPU" : "host";
      if (dr == ncclSuccess) {
        env.net.deregMr(c.comm(), dm);
        fail("regMrDmaBuf (" + what + ") succeeded on a device without NCCL_PTR_DMABUF, with a pipe for a dma-buf");
      }
      if (warningCount() == w) fail("regMrDmaBuf (" + what + ") was refused without a warning");
    }
  }
  // a message exchanged, then its request tested again
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  void* req = nullptr;
  if (env.recv()) {
    void* data[1] = {buf.data()};
    size_t sz[1] = {4096};
    int tags[1] = {3};
    void* mhs[1] = {reg.mh()};
    Deadline d(env.timeout);
    while (req == nullptr && !d.expired()) expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &req), "irecv");
    // a foreign memory handle in a receive
    void* bad[1] = {junk};
    void* r2 = nullptr;
    if (env.net.irecv(c.recvComm, 1, data, sz, tags, bad, &r2) == ncclSuccess && r2 != nullptr)
      fail("irecv accepted a memory handle that is not weft's");
  } else {
    // a foreign memory handle in a send
    void* r2 = nullptr;
    if (env.net.isend(c.sendComm, buf.data(), 4096, 3, junk, &r2) == ncclSuccess && r2 != nullptr)
      fail("isend accepted a memory handle that is not weft's");
    fillPattern(buf.data(), 4096, 99);
    Deadline d(env.timeout);
    while (req == nullptr && !d.expired()) expectOk(env.net.isend(c.sendComm, buf.data(), 4096, 3, reg.mh(), &req), "isend");
  }
  waitRequest(env, req, 1, "the exchanged message");
  int done = 0, sizes[NCCL_PROXY_MAX_SUBS] = {};
  w = warningCount();
  if (env.net.test(req, &done, sizes) == ncclSuccess && done) fail("a request tested again after it reported done");
  if (warningCount() == w) fail("testing a completed request gave no warning");
  // a comm of the wrong kind
  void* r3 = nullptr;
  if (env.recv()) {
    if (env.net.isend(c.recvComm, buf.data(), 8, 0, reg.mh(), &r3) == ncclSuccess) fail("isend accepted a receive comm");
  } else {
    if (env.net.closeRecv(c.sendComm) == ncclSuccess) fail("closeRecv accepted a send comm");
  }
  reg.release();
  env.oob.barrier("misuse-done", env.timeout);
  // closed twice
  void* comm = c.comm();
  closeConn(env, c);
  w = warningCount();
  ncclResult_t again = env.recv() ? env.net.closeRecv(comm) : env.net.closeSend(comm);
  if (again == ncclSuccess) fail("a comm closed twice: the second close succeeded");
  if (warningCount() == w) fail("a second close was refused without a warning");
  // a listen comm closed twice
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  void* lc = nullptr;
  expectOk(env.net.listen(env.ctx, env.dev, handle, &lc), "listen");
  expectOk(env.net.closeListen(lc), "closeListen");
  if (env.net.closeListen(lc) == ncclSuccess) fail("a listen comm closed twice: the second close succeeded");
}

void weftGarbageHandles(CheckEnv& env) {
  requireWeft(env);
  std::mt19937_64 rng(env.recv() ? 11 : 12);
  for (int i = 0; i < 64; ++i) {
    uint8_t h[NCCL_NET_HANDLE_MAXSIZE];
    for (auto& b : h) b = static_cast<uint8_t>(rng());
    if (i == 0) std::memset(h, 0, sizeof(h));
    void* sc = nullptr;
    int warnings = warningCount();
    ncclResult_t r = env.net.connect(env.ctx, env.dev, h, &sc);
    if (r == ncclSuccess || sc != nullptr) fail("connect accepted a garbage handle (#" + std::to_string(i) + ")");
    if (r != ncclInvalidUsage) fail(std::string("garbage handle: expected ncclInvalidUsage, got ") + resultName(r));
    if (warningCount() == warnings) fail("a garbage handle was refused without a warning");
  }
  // Objects that are not (or no longer) ours are refused, not used.
  int done = 0;
  uint64_t junk[8] = {};
  if (env.net.test(junk, &done, nullptr) == ncclSuccess) fail("test accepted a request that is not weft's");
  void* req = nullptr;
  if (env.net.isend(junk, junk, 8, 0, nullptr, &req) == ncclSuccess) fail("isend accepted a comm that is not weft's");
  if (env.net.closeSend(junk) == ncclSuccess) fail("closeSend accepted a comm that is not weft's");
}

}  // namespace weft::harness::checks
