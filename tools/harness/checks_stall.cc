// SPDX-License-Identifier: Apache-2.0
// weft's stall lines (docs/hangs.md): a connection that waits with no byte moving says once what it waits for and
// which case it is.
#include "checks_internal.h"

namespace weft::harness::checks {

namespace {

// A warning logged since `from` that contains `needle`: the first, or empty.
std::string warnedWith(int from, const std::string& needle) {
  for (const std::string& w : warningsSince(from)) {
    if (w.find(needle) != std::string::npos) return w;
  }
  return {};
}

void* post(CheckEnv& env, Conn& c, bool send, void* data, size_t size, int tag, void* mh) {
  void* req = nullptr;
  Deadline d(env.timeout);
  while (req == nullptr) {
    if (send) {
      expectOk(env.net.isend(c.sendComm, data, size, tag, mh, &req), "isend");
    } else {
      void* bufs[1] = {data};
      size_t sizes[1] = {size};
      int tags[1] = {tag};
      void* mhs[1] = {mh};
      expectOk(env.net.irecv(c.recvComm, 1, bufs, sizes, tags, mhs, &req), "irecv");
    }
    if (d.expired()) fail(std::string(send ? "isend" : "irecv") + " kept answering NULL");
  }
  return req;
}

}  // namespace

// With WEFT_STALL_S of 1-5 s: (1) the receiver posts a receive whose send comes WEFT_STALL_S + 2 s late (the sender
// makes no call meanwhile): the receiver warns that the peer is alive but has not posted its send; (2) the sender
// posts 64 MiB (more than the sockets hold) that the receiver takes only WEFT_STALL_S + 2 s later: the sender warns
// that the peer reads nothing, its receive not posted. Each warns once, names its peer, and the message arrives
// intact once the peer posts. Backends without stall lines yet fail it (the harness skips it where the plugin is
// not weft).
void weftStallLines(CheckEnv& env) {
  requireWeft(env);
  const int64_t stall = params::getInt("WEFT_STALL_S");
  if (stall < 1 || stall > 5) throw CheckSkip("run with --env WEFT_STALL_S between 1 and 5");
  const auto late = std::chrono::seconds(stall + 2);
  Conn c = establish(env);
  constexpr size_t kBig = 64 << 20, kSmall = 4096;
  Buffer buf(kBig);
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  const int w0 = warningCount();
  long long stalls0 = 0;
  const bool counted = env.plugin != nullptr && env.plugin->stat("tcp.stalls", &stalls0);
  // (1) a send posted late
  if (env.recv()) {
    std::memset(buf.data(), 0, kSmall);
    void* req = post(env, c, false, buf.data(), kSmall, 1, reg.mh());
    env.oob.send("posted");
    waitRequest(env, req, 1, "the late message");
    if (findMismatch(buf.data(), kSmall, 71) != SIZE_MAX) fail("the late message arrived corrupted");
    const std::string w = warnedWith(w0, "has not posted the matching send");
    if (w.empty()) {
      fail("a receive whose send came " + std::to_string(stall + 2) + " s late logged no stall warning saying the "
           "peer has not posted its send (WEFT_STALL_S=" + std::to_string(stall) + ")");
    }
    std::printf("INFO\treceiver: %s\n", w.c_str());
  } else {
    if (env.oob.recvString(env.timeout) != "posted") fail("peer out of step");
    std::this_thread::sleep_for(late);
    fillPattern(buf.data(), kSmall, 71);
    waitRequest(env, post(env, c, true, buf.data(), kSmall, 1, reg.mh()), 1, "the late send");
  }
  // (2) a receive posted late
  const int w1 = warningCount();
  if (env.recv()) {
    env.oob.send("ready");
    std::this_thread::sleep_for(late);
    std::memset(buf.data(), 0, kBig);
    waitRequest(env, post(env, c, false, buf.data(), kBig, 2, reg.mh()), 1, "the 64 MiB received late");
    if (findMismatch(buf.data(), kBig, 72) != SIZE_MAX) fail("the 64 MiB received late arrived corrupted");
  } else {
    if (env.oob.recvString(env.timeout) != "ready") fail("peer out of step");
    fillPattern(buf.data(), kBig, 72);
    waitRequest(env, post(env, c, true, buf.data(), kBig, 2, reg.mh()), 1, "the 64 MiB sent");
    const std::string w = warnedWith(w1, "receive window is closed");
    if (w.empty()) {
      fail("a 64 MiB send whose receive came " + std::to_string(stall + 2) + " s late logged no stall warning "
           "saying the peer reads nothing (WEFT_STALL_S=" + std::to_string(stall) + ")");
    }
    std::printf("INFO\tsender: %s\n", w.c_str());
  }
  // one warning per episode, not one per look
  int stallWarnings = 0;
  for (const std::string& w : warningsSince(w0)) stallWarnings += w.find("stalled, no byte moved") != std::string::npos;
  if (stallWarnings > 1) fail(std::to_string(stallWarnings) + " stall warnings for one stall (one expected)");
  long long stalls1 = 0;
  if (counted && env.plugin->stat("tcp.stalls", &stalls1) && stalls1 - stalls0 != stallWarnings) {
    fail("tcp.stalls counted " + std::to_string(stalls1 - stalls0) + " stalls for " + std::to_string(stallWarnings) +
         " warnings");
  }
  reg.release();
  closeConn(env, c);
}

}  // namespace weft::harness::checks
