// SPDX-License-Identifier: Apache-2.0
// Set-up: init, devices, listen/connect/accept (non-blocking, to self), listens closed unaccepted.
#include "checks_internal.h"

namespace weft::harness::checks {

// ---- set-up ----------------------------------------------------------------------------------------------------

// NCCL calls init again for every new communicator, to get that communicator's context, and counts devices only
// the first time (src/plugin/net.cc in v2.28.9, ncclNetPluginInit, lines 172-182); a communicator split from a
// parent may share the parent's context (ncclNetInitFromParent, line 385). finalize gets each context back
// (line 226); what the plugin returns as a context, NULL included, is its own business.
void initIdempotent(CheckEnv& env) {
  int before = 0, after = 0;
  expectOk(env.net.devices(&before), "devices");
  void* ctx2 = nullptr;
  expectOk(env.net.init(&ctx2, 0x1234), "a second init");  // what another communicator does
  expectOk(env.net.devices(&after), "devices after a second init");
  if (before != after) fail("device count changed from " + std::to_string(before) + " to " + std::to_string(after));
  if (env.net.hasFinalize()) {
    // NCCL keeps whatever context init gave, NULL included (NCCL's own Socket transport returns NULL), and hands it
    // back to listen/connect/finalize: a NULL context is not an error (weft's own promise: weft.context_per_init).
    expectOk(env.net.finalize(ctx2), "finalize of the second context");
    expectOk(env.net.finalize(nullptr), "finalize(NULL) (NCCL 2.28.3-2.29.3 call it after a failed init)");
  }
}

// NCCL builds its topology from every device's properties (src/graph/topo.cc v2.28.9, ncclTopoPopulateNics lines
// 1327-1360: the net node is found by pciPath and name, and speed, latency, port, guid, maxComms and ptrSupport
// become its attributes); src/transport/net.cc reads maxRecvs to decide grouping (lines 730, 769, 830).
void devicesProperties(CheckEnv& env) {
  int n = 0;
  expectOk(env.net.devices(&n), "devices");
  if (n < 1) fail("devices() reported " + std::to_string(n) + " devices");
  std::set<std::string> names;
  for (int d = 0; d < n; ++d) {
    Props p;
    expectOk(env.net.getProperties(d, &p), "getProperties(" + std::to_string(d) + ")");
    std::string at = "device " + std::to_string(d) + " (" + p.name + "): ";
    if (p.name.empty()) fail(at + "empty name (NCCL keys its topology by name)");
    if (!names.insert(p.name).second) fail(at + "name not unique");
    if ((p.ptrSupport & NCCL_PTR_HOST) == 0) fail(at + "ptrSupport lacks NCCL_PTR_HOST");
    if (p.speed <= 0) fail(at + "speed " + std::to_string(p.speed) + " Mb/s");
    if (p.latency < 0) fail(at + "negative latency");
    if (p.maxComms <= 0) fail(at + "maxComms " + std::to_string(p.maxComms));
    if (p.maxRecvs < 1 || p.maxRecvs > NCCL_PROXY_MAX_SUBS) fail(at + "maxRecvs " + std::to_string(p.maxRecvs));
    if (!p.pciPath.empty() && p.pciPath[0] != '/') fail(at + "pciPath is not an absolute sysfs path: " + p.pciPath);
    if (p.netDeviceType != -1 && p.netDeviceType != NCCL_NET_DEVICE_HOST &&
        !(p.netDeviceType == NCCL_NET_DEVICE_UNPACK && p.netDeviceVersion == NCCL_NET_DEVICE_UNPACK_VERSION)) {
      fail(at + "netDeviceType/version that NCCL rejects");
    }
    if (p.vNdevs != -1) {
      if (p.maxP2pBytes == 0 || p.maxP2pBytes > NCCL_MAX_NET_SIZE_BYTES) fail(at + "maxP2pBytes out of (0, 1 TiB]");
      if (p.maxCollBytes == 0 || p.maxCollBytes > NCCL_MAX_NET_SIZE_BYTES) fail(at + "maxCollBytes out of (0, 1 TiB]");
      if (p.maxP2pBytes < (size_t{1} << 30)) fail(at + "maxP2pBytes below 1 GiB: NCCL sends registered chunks of 1 GiB");
    }
  }
  Props mine;
  expectOk(env.net.getProperties(env.dev, &mine), "getProperties");
  if (mine.name != env.props.name) fail("properties of the device under test changed between calls");
}

// NCCL's proxy polls connect and accept until they hand out a comm: a NULL comm means "not yet" and the proxy
// comes back (src/transport/net.cc in v2.28.9: sendProxyConnect, line 847 and `if (resources->netSendComm ==
// NULL) { *done = 0; ...}` after it; recvProxyConnect, lines 1015-1025). Neither call may wait for the peer.
void connectTwoProcess(CheckEnv& env) {
  Conn c = establish(env);
  closeConn(env, c);
}

// A connection from this process to itself (what NCCL's GDR probe and bootstrap tests do): connect to our own
// listen from one thread, polling both ends.
SelfPair connectToSelf(CheckEnv& env) {
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void *lc = nullptr, *sc = nullptr, *rc = nullptr;
  expectOk(env.net.listen(env.ctx, env.dev, handle, &lc), "listen");
  Deadline deadline(env.timeout);
  while (sc == nullptr || rc == nullptr) {
    if (sc == nullptr) expectOk(env.net.connect(env.ctx, env.dev, handle, &sc), "connect (to self)");
    if (rc == nullptr) expectOk(env.net.accept(lc, &rc), "accept (from self)");
    if (deadline.expired()) fail("connect-to-self in one thread did not complete (blocking connect or accept?)");
  }
  expectOk(env.net.closeListen(lc), "closeListen");
  return SelfPair{Conn{sc, nullptr}, Conn{nullptr, rc}};
}

// Messages of the given sizes from `p.send` to `p.recv`, one at a time, both ends polled from this thread (a send
// may stay unposted until its receive is: it is retried while the receive is tested). Every byte is verified.
void selfMessages(CheckEnv& env, SelfPair& p, const std::vector<size_t>& sizes, uint64_t seed,
                  const std::string& what) {
  size_t largest = 1;
  for (size_t n : sizes) largest = std::max(largest, n);
  Buffer sb(largest), rb(largest);
  Registration sreg(env.net, p.send.sendComm, sb.data(), sb.size());
  Registration rreg(env.net, p.recv.recvComm, rb.data(), rb.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = sizes[k];
    fillPattern(sb.data(), n, seed + k);
    void *sreq = nullptr, *rreq = nullptr;
    void* data[1] = {rb.data()};
    size_t cap[1] = {largest};
    int tags[1] = {5};
    void* mhs[1] = {rreg.mh()};
    Deadline deadline(env.timeout);
    const std::string msg = what + " (message " + std::to_string(k + 1) + ", " + std::to_string(n) + " B)";
    while (rreq == nullptr) {
      expectOk(env.net.irecv(p.recv.recvComm, 1, data, cap, tags, mhs, &rreq), msg + ": irecv");
      if (deadline.expired()) fail(msg + ": irecv never posted");
    }
    int sdone = 0, rdone = 0, rsz[NCCL_PROXY_MAX_SUBS] = {}, ssz = 0;
    while (!sdone || !rdone) {
      if (sreq == nullptr)
        expectOk(env.net.isend(p.send.sendComm, sb.data(), n, 5, sreg.mh(), &sreq), msg + ": isend");
      else if (!sdone)
        expectOk(env.net.test(sreq, &sdone, &ssz), msg + ": test(send)");
      if (!rdone) expectOk(env.net.test(rreq, &rdone, rsz), msg + ": test(recv)");
      if (deadline.expired()) fail(what + ": a " + std::to_string(n) + " B message did not arrive");
    }
    if (static_cast<size_t>(rsz[0]) != n || findMismatch(rb.data(), n, seed + k) != SIZE_MAX)
      fail(what + ": a " + std::to_string(n) + " B message arrived wrong");
  }
  sreg.release();
  rreg.release();
}

void closeSelf(CheckEnv& env, SelfPair& p) {
  closeConn(env, p.send);
  closeConn(env, p.recv);
}

// NCCL's proxy service thread sets up the connections of every peer in turn: sendProxyConnect/recvProxyConnect
// (src/transport/net.cc) call connect/accept once and answer ncclInProgress while the comm is still NULL, and the
// service loop (src/proxy.cc) goes on to other requests. A connect that waits for its peer's accept, or an accept
// that waits for a connect, stalls every other connection of that proxy, and deadlocks two ranks that each connect
// before they accept. Checked by meaning, not by a stopwatch: with the peer's accept withheld, connect must keep
// returning (NCCL's own Socket transport may even complete it: the kernel accepts for the listener); with the
// peer's connect withheld, accept must keep returning, and without a comm. The withholding side waits for the
// other's report for the backstop (env.callLimit) before it calls it blocking, then lets the call go.
constexpr int kWithheldPolls = 20;
constexpr auto kPollGap = std::chrono::milliseconds(5);

// The peer's report of its polls, or "" when none came within the backstop.
std::string awaitReport(CheckEnv& env, const std::string& prefix) {
  try {
    std::string m = env.oob.recvString(env.callLimit + kWithheldPolls * kPollGap);
    if (m.rfind("verdict:", 0) == 0) {
      env.oob.pushBack(m);
      throw PeerAborted("the peer process gave up on this check");
    }
    if (m.rfind(prefix, 0) != 0) fail("unexpected out-of-band message '" + m.substr(0, 40) + "'");
    return m.substr(prefix.size());
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const CheckFailure*>(&e) != nullptr || dynamic_cast<const PeerAborted*>(&e) != nullptr) throw;
    return "";
  }
}

void oneMessage(CheckEnv& env, Conn& c, uint64_t seed) {
  StreamSpec s;
  s.sizes = {4096};
  s.inflight = 1;
  s.slotSize = 4096;
  s.seed = seed;
  stream(env, c, s);
}

// The receiver's half of set-up, in steps the withholding checks interleave with their peer.
void* listenAndSend(CheckEnv& env, const std::string& label) {
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  timedCall(env, "listen", [&] { return env.net.listen(env.ctx, env.dev, handle, &lc); });
  if (lc == nullptr) fail("listen succeeded but returned a NULL listen comm");
  env.oob.send("handle:" + label + ":" + std::string(reinterpret_cast<char*>(handle), sizeof(handle)));
  return lc;
}

void acceptUntilDone(CheckEnv& env, void* lc, Conn* c) {
  Deadline d(env.timeout);
  while (c->recvComm == nullptr) {
    timedCall(env, "accept", [&] { return env.net.accept(lc, &c->recvComm); });
    if (d.expired()) fail("accept did not complete within " + std::to_string(env.timeout.count()) + " s");
    checkPeer(env);
  }
  expectOk(env.net.closeListen(lc), "closeListen");
}

// The sender's half.
void receiveHandle(CheckEnv& env, const std::string& label, uint8_t* handle) {
  std::string m = env.oob.recvString(env.timeout);
  const std::string prefix = "handle:" + label + ":";
  if (m.rfind(prefix, 0) != 0 || m.size() != prefix.size() + NCCL_NET_HANDLE_MAXSIZE) fail("bad handle message");
  std::memcpy(handle, m.data() + prefix.size(), NCCL_NET_HANDLE_MAXSIZE);
}

void connectUntilDone(CheckEnv& env, uint8_t* handle, Conn* c) {
  Deadline d(env.timeout);
  while (c->sendComm == nullptr) {
    timedCall(env, "connect", [&] { return env.net.connect(env.ctx, env.dev, handle, &c->sendComm); });
    if (d.expired()) fail("connect did not complete within " + std::to_string(env.timeout.count()) + " s");
    checkPeer(env);
  }
}

void withheldAccept(CheckEnv& env) {
  Conn c;
  if (env.recv()) {
    void* lc = listenAndSend(env, "nb1");
    std::string report = awaitReport(env, "connect-returned:");  // accept withheld until then
    acceptUntilDone(env, lc, &c);
    if (report.empty()) {
      fail("with accept withheld, connect did not return " + std::to_string(kWithheldPolls) + " times within " +
           std::to_string(env.callLimit.count()) + " ms: it waits for the peer's accept");
    }
  } else {
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
    receiveHandle(env, "nb1", handle);
    int returned = 0;
    for (; returned < kWithheldPolls && c.sendComm == nullptr; ++returned) {
      timedCall(env, "connect", [&] { return env.net.connect(env.ctx, env.dev, handle, &c.sendComm); });
      std::this_thread::sleep_for(kPollGap);
    }
    std::printf("INFO\twith accept withheld, connect returned %d time%s, %s\n", returned, returned == 1 ? "" : "s",
                c.sendComm ? "the last with a comm (completed before accept)" : "each without a comm");
    env.oob.send("connect-returned:" + std::to_string(returned));
    connectUntilDone(env, handle, &c);
  }
  env.oob.barrier("nb1-connected", env.timeout);
  oneMessage(env, c, 901);
  closeConn(env, c);
}

void withheldConnect(CheckEnv& env) {
  Conn c;
  if (env.recv()) {
    void* lc = listenAndSend(env, "nb2");
    for (int i = 0; i < kWithheldPolls; ++i) {
      timedCall(env, "accept", [&] { return env.net.accept(lc, &c.recvComm); });
      if (c.recvComm != nullptr) fail("accept returned a comm before the peer had called connect");
      std::this_thread::sleep_for(kPollGap);
    }
    env.oob.send("accept-returned:" + std::to_string(kWithheldPolls));
    acceptUntilDone(env, lc, &c);
  } else {
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
    receiveHandle(env, "nb2", handle);
    std::string report = awaitReport(env, "accept-returned:");  // connect withheld until then
    connectUntilDone(env, handle, &c);
    if (report.empty()) {
      fail("with connect withheld, accept did not return " + std::to_string(kWithheldPolls) + " times within " +
           std::to_string(env.callLimit.count()) + " ms: it waits for a connection");
    }
  }
  env.oob.barrier("nb2-connected", env.timeout);
  oneMessage(env, c, 902);
  closeConn(env, c);
}

// NCCL's proxy calls connect and accept again until they return a comm, and does other work meanwhile (src/
// transport/net.cc v2.28.9: sendProxyConnect "if (resources->netSendComm == NULL) { *done = 0; ... }" after line
// 856, recvProxyConnect the same at line 1024): a call that waits for its peer stalls every other connection.
void connectNonblocking(CheckEnv& env) {
  withheldAccept(env);
  withheldConnect(env);
}

// NCCL connects to its own listen from one thread, calling connect and accept in turn until both return a comm
// (src/plugin/net.cc v2.28.9, the GDR support probe, lines 495-505; the proxy does the same when a rank's
// connection loops back to its own process).
void connectSelf(CheckEnv& env) {
  SelfPair p = connectToSelf(env);
  selfMessages(env, p, {0, 1000}, 77, "message to self");
  closeSelf(env, p);
}

// NCCL closes a listen comm once its one connection is accepted (net.cc v2.28.9 line 1038, recvProxyConnect);
// a communicator torn down during set-up closes listens that never saw their connection.
void listenCloseUnaccepted(CheckEnv& env) {
  // Shared comms: some listen comms are closed without a connection, some after accept polled in vain.
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  void* lc = nullptr;
  expectOk(env.net.listen(env.ctx, env.dev, handle, &lc), "listen");
  expectOk(env.net.closeListen(lc), "closeListen without accept");
  expectOk(env.net.listen(env.ctx, env.dev, handle, &lc), "listen");
  for (int i = 0; i < 50; ++i) {
    void* rc = nullptr;
    expectOk(env.net.accept(lc, &rc), "accept with no peer");
    if (rc != nullptr) fail("accept produced a connection although nobody connected");
  }
  expectOk(env.net.closeListen(lc), "closeListen after fruitless accepts");
}

}  // namespace weft::harness::checks
