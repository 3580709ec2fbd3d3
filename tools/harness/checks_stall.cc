// SPDX-License-Identifier: Apache-2.0
// weft's stall lines (docs/hangs.md): a connection that waits with no byte moving says once what it waits for and
// which case it is.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>

#include "checks_internal.h"
#include "self_exec.h"

namespace weft::harness::checks {

namespace {

// A warning logged since `from` that contains `needle`: the first, or empty.
std::string warnedWith(int from, const std::string& needle) {
  for (const std::string& w : warningsSince(from)) {
    if (w.find(needle) != std::string::npos) return w;
  }
  return {};
}

// One isend or irecv call: the request, or nullptr (the plugin wants the call again, as NCCL makes it).
void* postOnce(CheckEnv& env, Conn& c, bool send, void* data, size_t size, int tag, void* mh) {
  void* req = nullptr;
  if (send) {
    expectOk(env.net.isend(c.sendComm, data, size, tag, mh, &req), "isend");
  } else {
    void* bufs[1] = {data};
    size_t sizes[1] = {size};
    int tags[1] = {tag};
    void* mhs[1] = {mh};
    expectOk(env.net.irecv(c.recvComm, 1, bufs, sizes, tags, mhs, &req), "irecv");
  }
  return req;
}

void* post(CheckEnv& env, Conn& c, bool send, void* data, size_t size, int tag, void* mh) {
  Deadline d(env.timeout);
  for (;;) {
    if (void* req = postOnce(env, c, send, data, size, tag, mh)) return req;
    if (d.expired()) fail(std::string(send ? "isend" : "irecv") + " kept answering NULL");
  }
}

// Posts a send or receive (again while the plugin answers NULL: a send waiting for the receiver's offer) and tests
// it until a warning since `from` contains `needle` or `limit` passes (then fails the check); returns the request
// (posted by then) through *req and the warning. The peer waits meanwhile, making no call.
std::string postUntilWarned(CheckEnv& env, Conn& c, bool send, void* data, size_t size, int tag, void* mh,
                            void** req, int from, const std::string& needle, std::chrono::seconds limit,
                            const std::string& what) {
  Deadline d(limit);
  *req = nullptr;
  for (uint64_t i = 0;; ++i) {
    if (*req == nullptr) {
      *req = postOnce(env, c, send, data, size, tag, mh);
    } else {
      int done = 0;
      int sizes[NCCL_PROXY_MAX_SUBS] = {};
      expectOk(env.net.test(*req, &done, sizes), "test(" + what + ")");
      if (done) fail(what + " completed while its peer had not posted its side");
    }
    if ((i & 255) == 0) {
      std::string w = warnedWith(from, needle);
      if (!w.empty()) return w;
      if (d.expired()) {
        env.oob.send("go");  // the peer posts its side and ends
        fail(what + ": no stall warning saying \"" + needle + "\" within " + std::to_string(limit.count()) +
             " s (WEFT_STALL_S=" + std::to_string(params::getInt("WEFT_STALL_S")) + ")");
      }
    }
  }
}

// With WEFT_PROM_FILE set (a relative path: each worker's own, in its folder): the Prometheus file must come to show a
// connection stalled now (weft_conn_stalled_seconds above 0) with a stall counted, within `limit`. Empty: it did;
// else what it showed.
std::string promShowsStall(const std::string& path, std::chrono::seconds limit) {
  Deadline d(limit);
  std::string last;
  for (;;) {
    std::ifstream in(path);
    std::string line;
    bool stalledNow = false, counted = false;
    last.clear();
    while (std::getline(in, line)) {
      if (line.rfind("weft_conn_stall", 0) != 0) continue;
      last += line + "; ";
      const size_t sp = line.rfind(' ');
      const double v = sp == std::string::npos ? 0 : std::atof(line.c_str() + sp + 1);
      if (line.rfind("weft_conn_stalled_seconds{", 0) == 0 && v > 0) stalledNow = true;
      if (line.rfind("weft_conn_stalls_total{", 0) == 0 && v >= 1) counted = true;
    }
    if (stalledNow && counted) return {};
    if (d.expired()) return last.empty() ? "no weft_conn_stall* lines" : last;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// `weft inspect --json --pid <this process>` (this worker is the weft binary, /proc/self/exe) must show a send
// connection stalled now, with the stalled send first in its operations in flight once `posted` (a send that waits
// for the receiver's offer is not posted yet: isend answers NULL). Empty: it did; else what it printed.
std::string inspectShowsStall(bool posted) {
  const std::string out = runWeft("inspect --json --pid " + std::to_string(getpid()));
  size_t at = 0;
  while ((at = out.find("\"type\":\"conn\"", at)) != std::string::npos) {
    const size_t end = out.find('\n', at);
    const std::string line = out.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at += 1;
    const size_t s = line.find("\"stalled_s\":");
    if (line.find("\"dir\":\"send\"") != std::string::npos && s != std::string::npos &&
        std::atof(line.c_str() + s + 12) > 0) {
      // The ledger of operations in flight shows the stalled send itself: tag 2, 64 MiB, one buffer.
      if (posted && line.find("\"ops\":[{\"tag\":2,\"bytes\":67108864,\"bufs\":1,") == std::string::npos) {
        return "the stalled connection's ops do not show the 64 MiB send (tag 2) in flight: " + line;
      }
      return {};
    }
  }
  return out.empty() ? "nothing" : out;
}

std::atomic<int> gAppTerm{0};
void appTermHandler(int) { gAppTerm.store(1); }  // the application's own SIGTERM handler: it notes the signal


// The checks that read their own stall dumps: WEFT_TELEMETRY_DIR, where they go (skips unless weft runs with it and a
// WEFT_STALL_S of 1-5 s).
std::string hangDumpDir(CheckEnv& env) {
  requireWeft(env);
  const int64_t stall = params::getInt("WEFT_STALL_S");
  const std::string dir = params::getString("WEFT_TELEMETRY_DIR");
  if (stall < 1 || stall > 5 || dir.empty()) {
    throw CheckSkip("run with --env WEFT_STALL_S between 1 and 5 and --env WEFT_TELEMETRY_DIR");
  }
  return dir;
}

}  // namespace

// With WEFT_STALL_S of 1-5 s and WEFT_TELEMETRY_DIR: the receiver's application is stuck (it posts nothing) while
// the sender's 64 MiB waits; the sender's stall line comes and its dump is written; then the launcher's SIGTERM
// reaches the receiver, whose application handler (installed before weft's) survives it: weft writes the
// receiver's dump first, then runs that handler. `weft report --hangs` over both dumps must name the receiver's
// process as the one every chain of waits ends at. The receiver then posts and the 64 MiB arrives intact.
void weftHangReport(CheckEnv& env) {
  const std::string dir = hangDumpDir(env);
  if (!params::getBool("WEFT_INSPECT") || !params::getBool("WEFT_DUMP_ON_TERM")) {
    throw CheckSkip("needs WEFT_INSPECT and WEFT_DUMP_ON_TERM on");
  }
  if (env.recv()) {
    struct sigaction now {};
    ::sigaction(SIGTERM, nullptr, &now);
    if ((now.sa_flags & SA_SIGINFO) != 0 || now.sa_handler != SIG_DFL) {
      throw CheckSkip("SIGTERM is handled in this worker already (run it alone: --only weft.hang_report)");
    }
    ::signal(SIGTERM, appTermHandler);  // before weft's: weft's handler is installed as the first connection opens
  }
  const auto limit = std::chrono::seconds(30);
  Conn c = establish(env);
  constexpr size_t kBig = 64 << 20;
  Buffer buf(kBig);
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  if (env.recv()) {
    env.oob.send(std::to_string(::getpid()));
    if (env.oob.recvString(limit + env.timeout) != "term") fail("peer out of step");
    ::raise(SIGTERM);  // as the launcher's kill; handled before raise returns
    if (gAppTerm.load() == 0) fail("the application's SIGTERM handler did not run after weft's");
    if (!hasDump(dir, ::getpid())) fail("no dump of this process in " + dir + "/hangs after SIGTERM");
    env.oob.send("dumped");
    std::memset(buf.data(), 0, kBig);
    waitRequest(env, post(env, c, false, buf.data(), kBig, 3, reg.mh()), 1, "the 64 MiB received late");
    if (findMismatch(buf.data(), kBig, 73) != SIZE_MAX) fail("the 64 MiB received late arrived corrupted");
  } else {
    const std::string peer = env.oob.recvString(limit + env.timeout);
    fillPattern(buf.data(), kBig, 73);
    void* req = nullptr;
    const int w0 = warningCount();
    postUntilWarned(env, c, true, buf.data(), kBig, 3, reg.mh(), &req, w0, "has not posted the receive", limit,
                    "the 64 MiB send");
    Deadline d(std::chrono::seconds(10));  // the record writer's round (100 ms) writes this process's dump
    while (!hasDump(dir, ::getpid()) && !d.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    env.oob.send("term");
    const std::string dumped = env.oob.recvString(limit + env.timeout);
    std::string report;
    if (dumped == "dumped") report = reportHangs(dir);
    if (req == nullptr) req = post(env, c, true, buf.data(), kBig, 3, reg.mh());
    waitRequest(env, req, 1, "the 64 MiB sent");
    if (dumped != "dumped") fail("peer out of step after its SIGTERM");
    const std::string first = report.substr(0, report.find('\n'));
    std::printf("INFO\tsender: %s\n", first.c_str());
    if (first.find("every chain of waits ends at ") == std::string::npos ||
        (first.find(" pid " + peer + ")") == std::string::npos && first.find(" pid " + peer + ":") == std::string::npos)) {
      fail("weft report --hangs did not name the receiver (pid " + peer + ") as where the waits end: " + report);
    }
  }
  reg.release();
  closeConn(env, c);
}

// Tests two requests in one loop until both are done (each rank's send needs the other rank's receive progressed).
void waitBoth(CheckEnv& env, void* a, void* b, const std::string& what) {
  Deadline d(env.timeout);
  bool doneA = false, doneB = false;
  while (!doneA || !doneB) {
    int sizes[NCCL_PROXY_MAX_SUBS] = {};
    int done = 0;
    if (!doneA) {
      expectOk(env.net.test(a, &done, sizes), "test(" + what + ")");
      doneA = done != 0;
    }
    if (!doneB) {
      done = 0;
      expectOk(env.net.test(b, &done, sizes), "test(" + what + ")");
      doneB = done != 0;
    }
    if (d.expired()) fail(what + " did not complete within " + std::to_string(env.timeout.count()) + " s");
  }
}

// With WEFT_STALL_S of 1-5 s and WEFT_TELEMETRY_DIR: each rank sends 64 MiB to the other before it posts its
// receive (ranks that disagree on the order of their operations), over one connection each way. Each send's stall
// line comes and each rank's stall dump is written; `weft report --hangs` over the two must name the cycle, both
// processes in it. Then each posts its receive and both messages arrive intact.
void weftHangCycle(CheckEnv& env) {
  const std::string dir = hangDumpDir(env);
  const auto limit = std::chrono::seconds(30);
  // One connection each way: `out` is where this rank sends, `in` where it receives.
  Conn fwd = establish(env, "cycle-fwd");
  env.role = env.recv() ? Role::kSend : Role::kRecv;
  Conn bwd = establish(env, "cycle-bwd");
  env.role = env.recv() ? Role::kSend : Role::kRecv;
  Conn& out = fwd.sendComm != nullptr ? fwd : bwd;
  Conn& in = fwd.sendComm != nullptr ? bwd : fwd;
  constexpr size_t kBig = 64 << 20;
  Buffer sbuf(kBig), rbuf(kBig);
  Registration sreg(env.net, out.comm(), sbuf.data(), sbuf.size());
  Registration rreg(env.net, in.comm(), rbuf.data(), rbuf.size());
  const uint64_t mine = env.recv() ? 75 : 74, theirs = env.recv() ? 74 : 75;
  fillPattern(sbuf.data(), kBig, mine);
  std::memset(rbuf.data(), 0, kBig);
  env.oob.send(std::to_string(::getpid()));
  const std::string peer = env.oob.recvString(limit + env.timeout);
  void* sreq = nullptr;
  postUntilWarned(env, out, true, sbuf.data(), kBig, 4, sreg.mh(), &sreq, warningCount(), "has not posted the receive",
                  limit, "the 64 MiB send");
  Deadline d(std::chrono::seconds(10));  // the record writer's round (100 ms) writes this process's dump
  while (!hasDump(dir, ::getpid()) && !d.expired()) {
    if (sreq == nullptr) sreq = postOnce(env, out, true, sbuf.data(), kBig, 4, sreg.mh());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const bool dumped = hasDump(dir, ::getpid());
  env.oob.send(dumped ? "dumped" : "no dump");
  const std::string peerDumped = env.oob.recvString(limit + env.timeout);
  std::string report;
  if (dumped && peerDumped == "dumped" && !env.recv()) report = reportHangs(dir);
  // Both now post their receives, and both messages travel (a send still waiting for the peer's offer, as verbs'
  // isend does, is posted again meanwhile: its receive is this rank's peer's).
  void* rreq = post(env, in, false, rbuf.data(), kBig, 4, rreg.mh());
  Deadline posting(env.timeout);
  while (sreq == nullptr) {
    sreq = postOnce(env, out, true, sbuf.data(), kBig, 4, sreg.mh());
    int done = 0;
    int sizes[NCCL_PROXY_MAX_SUBS] = {};
    expectOk(env.net.test(rreq, &done, sizes), "test(the 64 MiB receive)");
    if (sreq == nullptr && posting.expired()) fail("isend kept answering NULL after the peer posted its receive");
  }
  waitBoth(env, sreq, rreq, "the crossed 64 MiB messages");
  if (findMismatch(rbuf.data(), kBig, theirs) != SIZE_MAX) fail("the 64 MiB received late arrived corrupted");
  if (!dumped) fail("no stall dump of this process in " + dir + "/hangs within 10 s of its stall line");
  if (peerDumped != "dumped") fail("the peer wrote no stall dump");
  if (!env.recv()) {
    const std::string first = report.substr(0, report.find('\n'));
    std::printf("INFO\tsender: %s\n", first.c_str());
    const std::string self = std::to_string(::getpid());
    auto names = [&](const std::string& pid) {
      return first.find(" pid " + pid + ")") != std::string::npos || first.find(" pid " + pid + " ") != std::string::npos;
    };
    if (first.find("a cycle: ") == std::string::npos || !names(self) || !names(peer)) {
      fail("weft report --hangs did not name the cycle of pids " + self + " and " + peer + ": " + report);
    }
  }
  sreg.release();
  rreg.release();
  closeConn(env, fwd);
  closeConn(env, bwd);
}

// With WEFT_STALL_S of 1-5 s: (1) the receiver posts a receive whose send the sender posts only once the receiver
// warned that the peer is alive but has not posted its send; (2) the sender posts 64 MiB (more than the sockets
// hold) that the receiver takes only once the sender warned that the peer has not posted the receive. The peer
// makes no call meanwhile; each side gets 30 s to warn. Each warns once, and the messages arrive intact once the
// peer posts. Backends without stall lines fail it (it skips where the plugin is not weft).
void weftStallLines(CheckEnv& env) {
  requireWeft(env);
  const int64_t stall = params::getInt("WEFT_STALL_S");
  if (stall < 1 || stall > 5) throw CheckSkip("run with --env WEFT_STALL_S between 1 and 5");
  const auto limit = std::chrono::seconds(30);
  Conn c = establish(env);
  constexpr size_t kBig = 64 << 20, kSmall = 4096;
  Buffer buf(kBig);
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  const int w0 = warningCount();
  long long stalls0 = 0;
  std::string counter;  // the backend's count of stall warnings
  for (const char* k : {"tcp.stalls", "fabric.stalls", "verbs.stalls"}) {
    if (counter.empty() && env.plugin != nullptr && env.plugin->stat(k, &stalls0)) counter = k;
  }
  const bool counted = !counter.empty();
  // (1) a send posted late
  if (env.recv()) {
    std::memset(buf.data(), 0, kSmall);
    void* req = nullptr;
    const std::string w = postUntilWarned(env, c, false, buf.data(), kSmall, 1, reg.mh(), &req, w0,
                                          "has not posted the matching send", limit, "the receive");
    std::printf("INFO\treceiver: %s\n", w.c_str());
    env.oob.send("go");
    if (req == nullptr) req = post(env, c, false, buf.data(), kSmall, 1, reg.mh());
    waitRequest(env, req, 1, "the late message");
    if (findMismatch(buf.data(), kSmall, 71) != SIZE_MAX) fail("the late message arrived corrupted");
  } else {
    if (env.oob.recvString(limit + env.timeout) != "go") fail("peer out of step");
    fillPattern(buf.data(), kSmall, 71);
    waitRequest(env, post(env, c, true, buf.data(), kSmall, 1, reg.mh()), 1, "the late send");
  }
  // (2) a receive posted late
  const int w1 = warningCount();
  if (env.recv()) {
    if (env.oob.recvString(limit + env.timeout) != "go") fail("peer out of step");
    std::memset(buf.data(), 0, kBig);
    waitRequest(env, post(env, c, false, buf.data(), kBig, 2, reg.mh()), 1, "the 64 MiB received late");
    if (findMismatch(buf.data(), kBig, 72) != SIZE_MAX) fail("the 64 MiB received late arrived corrupted");
  } else {
    fillPattern(buf.data(), kBig, 72);
    void* req = nullptr;
    const std::string w = postUntilWarned(env, c, true, buf.data(), kBig, 2, reg.mh(), &req, w1,
                                          "has not posted the receive", limit, "the 64 MiB send");
    std::printf("INFO\tsender: %s\n", w.c_str());
    // The stall in the Prometheus file too, while it lasts (item 5 of issue 59).
    const std::string prom = params::getString("WEFT_PROM_FILE");
    const std::string shown = prom.empty() ? std::string() : promShowsStall(prom, std::chrono::seconds(10));
    // And live, through weft inspect (item 3), where the process serves it.
    const std::string inspected = params::getBool("WEFT_INSPECT") ? inspectShowsStall(req != nullptr) : std::string();
    env.oob.send("go");
    if (!shown.empty()) fail("the Prometheus file " + prom + " did not show the stall within 10 s: " + shown);
    if (!inspected.empty()) fail("weft inspect did not show this process's send connection stalled: " + inspected);
    if (req == nullptr) req = post(env, c, true, buf.data(), kBig, 2, reg.mh());
    waitRequest(env, req, 1, "the 64 MiB sent");
  }
  // one warning per episode, not one per look
  int stallWarnings = 0;
  for (const std::string& w : warningsSince(w0)) stallWarnings += w.find(": stalled, ") != std::string::npos;
  if (stallWarnings > 1) fail(std::to_string(stallWarnings) + " stall warnings for one stall (one expected)");
  long long stalls1 = 0;
  if (counted && env.plugin->stat(counter.c_str(), &stalls1) && stalls1 - stalls0 != stallWarnings) {
    fail(counter + " counted " + std::to_string(stalls1 - stalls0) + " stalls for " + std::to_string(stallWarnings) +
         " warnings");
  }
  reg.release();
  closeConn(env, c);
}

}  // namespace weft::harness::checks
