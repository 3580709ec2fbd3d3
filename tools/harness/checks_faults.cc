// SPDX-License-Identifier: Apache-2.0
// Faults: killed peers, links down, a flush after the peer died (each runs alone: it ends one worker).
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>

#include "checks_internal.h"
#include "netns.h"
#include "weft/common/sysfs.h"

namespace weft::harness::checks {

// ---- faults (each runs alone: it ends one worker) ---------------------------------------------------------------

// One rank dies (SIGKILL) with the other's requests outstanding: every pending test on the survivor must return
// an error within a bounded time, and closing the broken comm must work. NCCL learns of a dead peer only from the
// plugin: an error from test stops its progress thread and becomes the communicator's async error, which the
// application sees and aborts on (src/proxy.cc v2.28.9, ncclProxyProgress lines 961-965); a test that never fails
// leaves the job hung.
void peerKilled(CheckEnv& env, Role victim) {
  Conn c = establish(env);
  const size_t size = 1 << 20;  // large enough for rendezvous protocols, where a send waits on its receiver
  Buffer buf(size * 8);
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  StreamSpec warm;  // the connection carries data first, as in a real job
  for (int i = 0; i < 16; ++i) warm.sizes.push_back(size);
  warm.slotSize = size;
  stream(env, c, warm);
  // The survivor also holds a connection to itself through the same plugin context (the same endpoint, completion
  // queue and progress as the broken one): it must keep working while, and after, the killed peer's fail.
  SelfPair other;
  if (env.role != victim) {
    other = connectToSelf(env);
    selfMessages(env, other, {0, 8, 1 << 20}, 900, "other connection before the kill");
  }
  if (env.role == victim) {
    env.oob.barrier("posted", env.timeout);
    std::printf("RESULT\t%s\tPASS\t\n", victim == Role::kSend ? "faults.sender_killed" : "faults.receiver_killed");
    std::fflush(stdout);
    kill(getpid(), SIGKILL);
  }
  // A send may legitimately stay unposted (NULL request) until the receiver has posted its receive, as with
  // NCCL's IB transport and weft's rdma protocol: the sender then keeps retrying isend, as NCCL's proxy does,
  // and that retry must fail once the receiver is gone.
  std::vector<void*> reqs;
  auto post = [&](int i, std::chrono::milliseconds patience) {
    void* req = nullptr;
    Deadline d(patience);
    ncclResult_t pr = ncclSuccess;
    while (req == nullptr && pr == ncclSuccess && !d.expired()) {
      if (env.recv()) {
        void* data[1] = {buf.data() + i * size};
        size_t sz[1] = {size};
        int tags[1] = {0};
        void* mhs[1] = {reg.mh()};
        pr = env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &req);
      } else {
        pr = env.net.isend(c.sendComm, buf.data() + i * size, size, 0, reg.mh(), &req);
      }
    }
    if (req != nullptr) reqs.push_back(req);
    return pr;
  };
  for (int i = 0; i < 8; ++i) {
    expectOk(post(i, env.recv() ? env.timeout : std::chrono::milliseconds(1000)), env.recv() ? "irecv" : "isend");
    if (reqs.size() < static_cast<size_t>(i + 1)) break;  // the sender waits for its receiver: retried below
  }
  env.oob.barrier("posted", env.timeout);
  env.peerGone = true;
  auto t0 = std::chrono::steady_clock::now();
  Deadline d(env.timeout);
  ncclResult_t r = ncclSuccess;
  size_t k = 0;  // test the oldest first, as NCCL does; a send may complete if the data left before the kill
  while (r == ncclSuccess) {
    if (k < reqs.size()) {
      int done = 0, sizes[NCCL_PROXY_MAX_SUBS];
      r = env.net.test(reqs[k], &done, sizes);
      if (done) ++k;
    } else if (env.recv()) {
      break;  // every receive completed: reported below
    } else {
      r = post(static_cast<int>(reqs.size() % 8), std::chrono::milliseconds(10));
    }
    if (d.expired()) {
      fail("requests to a killed peer neither failed nor completed within " + std::to_string(env.timeout.count()) +
           " s");
    }
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (r == ncclSuccess) fail("every request to a killed peer completed as success");
  std::printf("INFO\tkilled peer detected after %.0f ms (%s)\n", ms, resultName(r));
  // Other connections are unaffected: before the broken comm is closed, after, and a new one to ourselves.
  const std::vector<size_t> sizes = {0, 8, 65536, 1 << 20, (1 << 20) + 3};
  selfMessages(env, other, sizes, 910, "other connection after the peer died");
  reg.release();
  closeConn(env, c);
  selfMessages(env, other, sizes, 920, "other connection after closing the broken one");
  closeSelf(env, other);
  SelfPair fresh = connectToSelf(env);
  selfMessages(env, fresh, sizes, 930, "new connection after the peer died");
  closeSelf(env, fresh);
  std::printf("INFO\tother connections kept working: %zu messages before and after closing the broken comm, and "
              "on a new connection\n", 3 * sizes.size());
}


// Isolation at scale: the sending process holds N connections to the receiver (256; 64 with --quick; --conns), as
// a rank does to one peer across channels and communicators, and is SIGKILLed with a receive pending on every one.
// NCCL learns of the death only from test's error on each of them (src/proxy.cc v2.28.9, lines 961-965).
// On the receiver, every one of them must fail within a bound, while its connections to itself through the same
// plugin context (with shared endpoints: the same endpoint, queue and address vector) keep carrying intact data
// during the failures and after the broken comms are closed.
void faultsKilledMany(CheckEnv& env) {
  const int n = env.conns > 0 ? env.conns : (env.quick ? 64 : 256);
  std::vector<Conn> conns;
  conns.reserve(n);
  for (int i = 0; i < n; ++i) conns.push_back(establish(env, "many" + std::to_string(i)));
  const size_t size = 65536;
  Buffer buf(size * static_cast<size_t>(n));
  std::vector<std::unique_ptr<Registration>> regs;
  for (int i = 0; i < n; ++i) {
    regs.push_back(std::make_unique<Registration>(env.net, conns[i].comm(), buf.data() + i * size, size));
  }
  constexpr int kSelf = 4;
  std::vector<SelfPair> others;
  if (env.recv()) {
    for (int k = 0; k < kSelf; ++k) {
      others.push_back(connectToSelf(env));
      selfMessages(env, others.back(), {8, 1 << 20}, 1000 + k, "other connection before the kill");
    }
  }
  std::vector<void*> reqs(n, nullptr);
  if (env.recv()) {
    for (int i = 0; i < n; ++i) {
      void* data[1] = {buf.data() + i * size};
      size_t sz[1] = {size};
      int tags[1] = {0};
      void* mhs[1] = {regs[i]->mh()};
      Deadline d(env.timeout);
      while (reqs[i] == nullptr) {
        expectOk(env.net.irecv(conns[i].recvComm, 1, data, sz, tags, mhs, &reqs[i]), "irecv");
        if (d.expired()) fail("irecv on connection " + std::to_string(i) + " never posted");
      }
    }
  }
  env.oob.barrier("posted", env.timeout);
  if (!env.recv()) {
    std::printf("RESULT\tfaults.killed_many\tPASS\t\n");
    std::fflush(stdout);
    kill(getpid(), SIGKILL);
  }
  env.peerGone = true;
  auto t0 = std::chrono::steady_clock::now();
  Deadline d(env.timeout);
  int failed = 0, rounds = 0;
  std::vector<bool> over(n, false);
  while (failed < n) {
    for (int i = 0; i < n; ++i) {
      if (over[i]) continue;
      int done = 0, sizes[NCCL_PROXY_MAX_SUBS];
      ncclResult_t r = env.net.test(reqs[i], &done, sizes);
      if (r != ncclSuccess) {
        over[i] = true;
        ++failed;
      } else if (done) {
        fail("a receive on connection " + std::to_string(i) + " completed, but its sender was killed before sending");
      }
    }
    // The other connections keep working while the broken ones fail.
    if (++rounds % 64 == 0) selfMessages(env, others[rounds / 64 % kSelf], {4096}, 2000 + rounds, "during the failures");
    if (d.expired()) {
      fail(std::to_string(n - failed) + " of " + std::to_string(n) + " receives from a killed peer neither failed "
           "nor completed within " + std::to_string(env.timeout.count()) + " s");
    }
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("INFO\t%d connections to a killed peer failed within %.0f ms\n", n, ms);
  regs.clear();
  for (auto& c : conns) closeConn(env, c);
  const std::vector<size_t> sizes = {0, 8, 65536, 1 << 20, (1 << 20) + 3};
  for (int k = 0; k < kSelf; ++k) {
    selfMessages(env, others[k], sizes, 3000 + 10 * k, "other connection after closing the broken ones");
    closeSelf(env, others[k]);
  }
  std::printf("INFO\t%d other connections kept carrying intact data\n", kSelf);
}

// Every link of this worker's namespace (netns_conformance.sh made it; privateNetns checked) down or up.
void setLinks(bool up) {
  if (std::string err = setNetnsLinks(up); !err.empty()) fail(err);
}

// n messages of `size` through c, verified (the connection carries data before a fault, as in a real job).
void streamOf(CheckEnv& env, Conn& c, int n, size_t size, uint64_t seed = 1) {
  StreamSpec spec;
  for (int i = 0; i < n; ++i) spec.sizes.push_back(size);
  spec.slotSize = size;
  spec.seed = seed;
  stream(env, c, spec);
}

// n receives of `size` (tag 0) into consecutive slots of buf, each posted until the plugin takes it (bounded).
std::vector<void*> postReceives(CheckEnv& env, Conn& c, Buffer& buf, Registration& reg, size_t size, int n) {
  std::vector<void*> reqs;
  for (int i = 0; i < n; ++i) {
    void* data[1] = {buf.data() + i * size};
    size_t sz[1] = {size};
    int tags[1] = {0};
    void* mhs[1] = {reg.mh()};
    void* req = nullptr;
    Deadline d(env.timeout);
    while (req == nullptr && !d.expired()) expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &req), "irecv");
    if (req) reqs.push_back(req);
  }
  return reqs;
}

// After a link came back: the broken connection closes within 10 s, and a new one carries 8 messages of `size`.
void closeThenReconnect(CheckEnv& env, Conn& broken, size_t size, uint64_t seed) {
  Deadline closing(std::chrono::seconds(10));
  closeConn(env, broken);
  if (closing.expired()) fail("closing the broken connection took more than 10 s");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Conn fresh = establish(env, "after");
  streamOf(env, fresh, 8, size, seed);
  closeConn(env, fresh);
}

// A link that goes down must surface as test errors as a dead peer does (src/proxy.cc v2.28.9, lines 961-965: the
// progress thread stops on a plugin error and the communicator reports it); a hung test hangs the job. The sender
// takes its veth down with requests pending on both ends; once the link is back the broken comms close without
// hanging, and a new connection works. Only in a private network namespace (netns_conformance.sh --link-down).
void faultsLinkDown(CheckEnv& env) {
  if (std::getenv("CONFORMANCE_LINK_DOWN_OK") == nullptr)
    throw CheckSkip("takes a link down: only under netns_conformance.sh --link-down");
  if (!privateNetns()) throw CheckSkip("refusing to take links down outside a private network namespace");
  Conn c = establish(env, "link");
  const int w0 = warningCount();
  const size_t size = 1 << 20;
  Buffer buf(size * 8);
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  StreamSpec warm;
  for (int i = 0; i < 16; ++i) warm.sizes.push_back(size);
  warm.slotSize = size;
  stream(env, c, warm);
  std::vector<void*> reqs;
  if (env.recv()) {
    reqs = postReceives(env, c, buf, reg, size, 4);
  }
  env.oob.barrier("posted", env.timeout);
  if (!env.recv()) setLinks(false);
  env.oob.barrier("down", env.timeout);
  auto t0 = std::chrono::steady_clock::now();
  ncclResult_t r = ncclSuccess;
  size_t k = 0;
  Deadline d(env.timeout);
  while (r == ncclSuccess && !d.expired()) {
    if (env.recv()) {
      if (k >= reqs.size()) break;
      int done = 0, sizes[NCCL_PROXY_MAX_SUBS];
      r = env.net.test(reqs[k], &done, sizes);
      if (done) ++k;
    } else {
      // keep sending, as NCCL's proxy would; the sends cannot be delivered
      if (reqs.size() < 4) {
        void* req = nullptr;
        r = env.net.isend(c.sendComm, buf.data() + reqs.size() * size, size, 0, reg.mh(), &req);
        if (req) reqs.push_back(req);
      } else {
        int done = 0, sizes[NCCL_PROXY_MAX_SUBS];
        r = env.net.test(reqs[k % reqs.size()], &done, sizes);
        if (done) reqs.erase(reqs.begin() + static_cast<long>(k % reqs.size()));
      }
    }
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  bool failedInTime = r != ncclSuccess;
  // Both ends look for the failure while the link is still down: the link comes back only when both are done.
  env.oob.barrier("detected", env.timeout);
  if (!env.recv()) setLinks(true);
  env.oob.barrier("up", env.timeout);
  if (!failedInTime)
    fail("pending requests over a link that went down neither failed nor completed within " +
         std::to_string(env.timeout.count()) + " s");
  std::printf("INFO\tlink down detected after %.0f ms (%s)\n", ms, resultName(r));
  // With stall lines due before the failure (WEFT_STALL_S below WEFT_PEER_TIMEOUT, weft only: docs/hangs.md), the
  // sender's says where the bytes stopped: on the way (its own retransmissions show it). A failure found sooner (a
  // verbs port's down event comes within milliseconds) leaves no time for one.
  const int64_t stall = env.isWeft ? params::getInt("WEFT_STALL_S") : 0;
  if (!env.recv() && stall > 0 && stall < params::getInt("WEFT_PEER_TIMEOUT") && ms > 1000.0 * stall) {
    bool said = false;
    for (const std::string& w : warningsSince(w0)) {
      if (w.find("stalled") == std::string::npos) continue;
      std::printf("INFO\t%s\n", w.c_str());
      said = said || w.find("bytes stopped on the way") != std::string::npos;
    }
    if (!said) fail("no stall warning said the bytes stopped on the way before the link's failure was found");
  }
  reg.release();
  closeThenReconnect(env, c, size, 77);
}

// The interface a rail check takes down: the last by name of this namespace's (rail 1 under
// netns_conformance.sh --rails explicit), or the first (rail 0, which carries the handshake and a plugin's control
// traffic) with CONFORMANCE_RAIL_VICTIM=first. Skips unless links may be taken down here and there are two rails.
// 4 messages of `size` from consecutive slots of buf, pending across a fault: each step the sender posts its next
// send (a NULL request is posted again), or every request not over yet is tested once. The receiver's come posted
// (postReceives). Returns the first error; `done` counts the requests over.
struct Pending4 {
  std::vector<void*> reqs;
  size_t posted = 0, done = 0;
  std::vector<bool> over = std::vector<bool>(4, false);
  ncclResult_t step(CheckEnv& env, Conn& c, Buffer& buf, Registration& reg, size_t size) {
    if (!env.recv() && posted < 4) {
      void* req = nullptr;
      ncclResult_t r = env.net.isend(c.sendComm, buf.data() + posted * size, size, 0, reg.mh(), &req);
      if (req) {
        reqs.push_back(req);
        ++posted;
      }
      return r;
    }
    for (size_t k = 0; k < reqs.size(); ++k) {
      if (over[k]) continue;
      int fin = 0, sizes[NCCL_PROXY_MAX_SUBS];
      if (ncclResult_t r = env.net.test(reqs[k], &fin, sizes); r != ncclSuccess) return r;
      if (fin) {
        over[k] = true;
        ++done;
      }
    }
    return ncclSuccess;
  }
};

// Rounds the sender decides: it asks `decide` (on its side only) whether to run another, and tells the receiver.
bool anotherRound(CheckEnv& env, const std::function<bool()>& decide) {
  if (env.recv()) return env.oob.recvString(env.timeout) == "again";
  const bool again = decide();
  env.oob.send(again ? "again" : "done");
  return again;
}

std::vector<std::string> railLinks() {
  if (std::getenv("CONFORMANCE_LINK_DOWN_OK") == nullptr)
    throw CheckSkip("takes a link down: only under netns_conformance.sh --rails explicit --link-down");
  if (!privateNetns()) throw CheckSkip("refusing to take links down outside a private network namespace");
  std::vector<std::string> links;
  if (DIR* d = opendir("/sys/class/net")) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != ".." && n != "lo") links.push_back(n);
    }
    closedir(d);
  }
  std::sort(links.begin(), links.end());
  if (links.size() < 2) throw CheckSkip("needs two interfaces (rails) in the namespace: --rails explicit");
  return links;
}

// Bytes each of `links` sent so far (its own counter; 0 where unreadable).
std::vector<uint64_t> linkTxBytes(const std::vector<std::string>& links) {
  std::vector<uint64_t> out;
  for (const std::string& l : links)
    out.push_back(std::strtoull(sysfs::readLine("/sys/class/net/" + l + "/statistics/tx_bytes").c_str(), nullptr, 10));
  return out;
}

std::string railToTakeDown() {
  const std::vector<std::string> links = railLinks();
  const char* v = std::getenv("CONFORMANCE_RAIL_VICTIM");
  return v != nullptr && std::string(v) == "first" ? links.front() : links.back();
}

// Bandwidth of one phase of a rail check: 64 messages of `size` on c, timed on the receiving side (INFO line).
void timedStream(CheckEnv& env, Conn& c, size_t size, uint64_t seed, const char* phase) {
  const auto t0 = std::chrono::steady_clock::now();
  streamOf(env, c, 64, size, seed);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (env.recv())
    std::printf("INFO\tbandwidth %s: %.0f MB/s (64 messages of %zu KiB)\n", phase, 64.0 * size / s / 1e6, size >> 10);
}

// One rail of a multi-rail device goes down mid-stream (the sender takes down the last of its interfaces by
// name, which netns_conformance.sh --rails explicit makes rail 1): the pending requests, each striped over both
// rails, must end within the bound (complete intact where the plugin moves traffic to the surviving rail, fail
// otherwise; weft does not move it yet, docs/failover.md); a plugin that counts rails going down
// (weftNetStat "fabric.rail_downs") must have counted it on the sender, whose own link it is, and, once the link
// is back, its return. Then a new connection carries data over both rails again.
void faultsRailDown(CheckEnv& env) {
  const std::string victim = railToTakeDown();
  // weft with WEFT_RAIL_FAILOVER=1 promises more: the requests complete (moved to the surviving rail), the
  // connection goes on carrying data while the rail stays down, and it counted the failover.
  const char* fo = std::getenv("WEFT_RAIL_FAILOVER");
  const bool failover = env.isWeft && fo != nullptr && std::string(fo) == "1";
  long long failoversBefore = 0, movedBefore = 0;
  if (failover && env.plugin != nullptr) {
    env.plugin->stat("fabric.rail_failovers", &failoversBefore);
    env.plugin->stat("fabric.moved_messages", &movedBefore);
  }
  auto setVictim = [&](bool up) {
    std::string cmd = "ip link set dev " + victim + (up ? " up" : " down");
    if (std::system(cmd.c_str()) != 0) fail("'" + cmd + "' failed");
  };
  long long downsBefore = 0, recoveriesBefore = 0;
  const bool counted = env.plugin != nullptr && env.plugin->stat("fabric.rail_downs", &downsBefore) &&
                       env.plugin->stat("fabric.rail_recoveries", &recoveriesBefore);
  const size_t size = 1 << 20;
  Buffer buf(size * 8);
  // 4 striped messages of `size`, posted once the rail is down (the sender's come after the "down" barrier);
  // test() until all 4 ended or one failed, within the bound. whileDown: the sender brings the rail back after
  // that long, testing meanwhile (0: it stays down). Returns the first error (ncclSuccess: all 4 completed).
  auto run4 = [&](Conn& c, Registration& reg, const char* phase, std::chrono::milliseconds whileDown,
                  double* tookMs) {
    Pending4 p;
    if (env.recv()) {
      p.reqs = postReceives(env, c, buf, reg, size, 4);
    } else {
      for (int i = 0; i < 4; ++i) buf.fill(static_cast<size_t>(i) * size, size, 90 + i);
    }
    env.oob.barrier(std::string(phase) + "-posted", env.timeout);
    if (!env.recv()) setVictim(false);
    env.oob.barrier(std::string(phase) + "-down", env.timeout);
    auto t0 = std::chrono::steady_clock::now();
    bool restored = whileDown.count() == 0 || env.recv();  // the sender brings it back
    ncclResult_t r = ncclSuccess;
    auto doneAt = t0;
    Deadline d(env.timeout);
    while (r == ncclSuccess && (p.done < 4 || !restored) && !d.expired()) {
      if (!env.recv() && !restored && std::chrono::steady_clock::now() - t0 >= whileDown) {
        setVictim(true);
        restored = true;
      }
      const size_t before = p.done;
      r = p.step(env, c, buf, reg, size);
      if (before < 4 && p.done == 4) doneAt = std::chrono::steady_clock::now();
    }
    const size_t done = p.done;
    if (!env.recv() && !restored) setVictim(true);
    if (done < 4) doneAt = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(doneAt - t0).count();  // until the requests ended
    *tookMs = ms;
    if (r == ncclSuccess && done < 4)
      fail(std::string(phase) + ": pending requests over a device that lost one of its two rails neither failed "
           "nor completed within " + std::to_string(env.timeout.count()) + " s");
    if (r == ncclSuccess && env.recv()) {
      for (int i = 0; i < 4; ++i) {
        if (buf.mismatch(static_cast<size_t>(i) * size, size, 90 + i) != SIZE_MAX)
          fail(std::string(phase) + ": a message that completed across a rail failure arrived corrupted");
      }
    }
    std::printf("INFO\t%s: rail %s down%s: pending requests %s after %.0f ms\n", phase, victim.c_str(),
                whileDown.count() != 0 ? (" for " + std::to_string(whileDown.count()) + " ms").c_str() : "",
                r == ncclSuccess ? "completed" : (std::string("failed (") + resultName(r) + ")").c_str(), ms);
    return r;
  };
  // A flap: the rail is down for 1.2 s, less than the WEFT_PEER_TIMEOUT the test runs with, then back.
  {
    Conn f = establish(env, "flap");
    Registration freg(env.net, f.comm(), buf.data(), buf.size());
    streamOf(env, f, 4, size);
    double took = 0;
    ncclResult_t fr = run4(f, freg, "flap", std::chrono::milliseconds(1200), &took);
    env.oob.barrier("flap-ended", env.timeout);
    freg.release();
    closeConn(env, f);  // its rails' state is settled by then (a rail back up is seen at the latest at close)
    long long downs = 0, recoveries = 0;
    // An end whose requests waited out the flap (a send the provider completes once buffered need not) was
    // stalled well past WEFT_PROBE_INTERVAL: it must have seen the rail go down and come back.
    if (counted && took >= 1200 && env.plugin->stat("fabric.rail_downs", &downs) &&
        env.plugin->stat("fabric.rail_recoveries", &recoveries)) {
      if (downs <= downsBefore) fail("flap: the plugin counted no rail going down (weftNetStat fabric.rail_downs)");
      if (recoveries <= recoveriesBefore)
        fail("flap: the plugin counted no rail coming back (weftNetStat fabric.rail_recoveries)");
      if (fr != ncclSuccess) fail("flap: a rail down for less than WEFT_PEER_TIMEOUT failed the connection");
      std::printf("INFO\tflap: rails seen down %lld, back up %lld\n", downs - downsBefore, recoveries - recoveriesBefore);
      downsBefore = downs;
    }
  }
  Conn c = establish(env, "rail");
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  streamOf(env, c, 16, size);  // (the connection's first messages set up the provider's own connections)
  timedStream(env, c, size, 1, "before, both rails up");
  double took = 0;
  ncclResult_t r = run4(c, reg, "down", std::chrono::milliseconds(0), &took);
  if (failover) {
    if (r != ncclSuccess) {
      fail(std::string("down: under WEFT_RAIL_FAILOVER=1 the requests failed (") + resultName(r) + ") instead of "
           "moving to the surviving rail");
    }
    // Still down: the connection goes on, on the rail left.
    env.oob.barrier("still-down", env.timeout);
    // What each rail carried meanwhile, from the sender's interfaces' own counters (INFO line: how a plugin spreads
    // the failed rail's share over the rails left; rail_down_test.sh judges weft's).
    const std::vector<std::string> links = env.recv() ? std::vector<std::string>{} : railLinks();
    const std::vector<uint64_t> sent0 = linkTxBytes(links);
    timedStream(env, c, size, 55, "during, one rail down");
    if (!env.recv()) {
      const std::vector<uint64_t> sent1 = linkTxBytes(links);
      std::string shares;
      for (size_t i = 0; i < links.size(); ++i)
        shares += (i ? " " : "") + links[i] + "=" + std::to_string(sent1[i] - sent0[i]);
      std::printf("INFO	during, one rail down: bytes sent per rail: %s\n", shares.c_str());
    }
    long long failovers = 0, moved = 0;
    if (env.plugin != nullptr && env.plugin->stat("fabric.rail_failovers", &failovers) &&
        env.plugin->stat("fabric.moved_messages", &moved)) {
      if (failovers <= failoversBefore) fail("down: the requests completed, but no rail failover was counted");
      std::printf("INFO\tfailover: %lld rail failovers, %lld messages moved to the surviving rail in this process; "
                  "down phase took %.0f ms\n", failovers - failoversBefore, moved - movedBefore, took);
    }
  }
  long long downsAfter = 0;
  if (counted) env.plugin->stat("fabric.rail_downs", &downsAfter);
  env.oob.barrier("detected", env.timeout);  // both ends looked while the rail was still down
  if (!env.recv()) setVictim(true);
  env.oob.barrier("up", env.timeout);
  // Back up, under failover with re-admission (WEFT_RAIL_READMIT, on unless 0): the same connection takes the rail
  // back while it carries data (both ends count it), and goes on carrying data, its later messages on that rail
  // again (rail_down_test.sh finds them in the connection records). The sender decides each round.
  auto readmitRounds = [&](const char* phase) {
    long long before = 0, now = 0;
    env.plugin->stat("fabric.rail_readmits", &before);
    const auto t0 = std::chrono::steady_clock::now();
    double tookMs = -1;
    int rounds = 0, at = -1;
    while (anotherRound(env, [&] {
      if (at < 0 && env.plugin->stat("fabric.rail_readmits", &now) && now > before) {
        at = rounds;
        tookMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      }
      return at < 0 ? std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30) : rounds - at < 24;
    })) {
      streamOf(env, c, 64, 64 << 10, 200 + static_cast<uint64_t>(rounds));
      ++rounds;
    }
    env.plugin->stat("fabric.rail_readmits", &now);
    if (now <= before)
      fail(std::string(phase) + ": under WEFT_RAIL_FAILOVER=1 the connection did not take the rail back within 30 s "
           "of carrying data (weftNetStat fabric.rail_readmits)");
    if (!env.recv())
      std::printf("INFO\t%s: the rail was taken back %.0f ms after it came up (%d rounds of 64 messages), then "
                  "%d more rounds\n", phase, tookMs, at, rounds - at);
  };
  const char* ra = std::getenv("WEFT_RAIL_READMIT");
  if (failover && r == ncclSuccess && env.plugin != nullptr && !(ra != nullptr && std::string(ra) == "0")) {
    readmitRounds("back up");
    timedStream(env, c, size, 56, "after, the rail taken back");
    // The rail taken back fails again under load: what it had in flight now travels under the comm id the
    // receiver gave the rail when taking it back, and must move to rail 0 all the same; then it is taken back
    // once more (after twice the wait: it failed soon after the last time).
    double took2 = 0;
    if (ncclResult_t r2 = run4(c, reg, "down again", std::chrono::milliseconds(0), &took2); r2 != ncclSuccess)
      fail(std::string("down again: the requests failed (") + resultName(r2) + ") instead of moving to rail 0");
    streamOf(env, c, 16, size, 57);
    env.oob.barrier("detected again", env.timeout);
    if (!env.recv()) setVictim(true);
    env.oob.barrier("up again", env.timeout);
    readmitRounds("back up again");
  }
  // Completed (the plugin moved the traffic, or a send it completes once buffered) or failed: either is an answer
  // within the bound. A failure must have been put down to the rail.
  if (counted && r != ncclSuccess && downsAfter <= downsBefore)
    fail("the requests failed, and the plugin counted no rail going down (weftNetStat fabric.rail_downs) after " +
         victim + " went down");
  reg.release();
  closeThenReconnect(env, c, size, 78);
  if (counted) std::printf("INFO\trails seen down by this process: %lld\n", downsAfter - downsBefore);
}

// Every rail of a multi-rail device goes down (the sender takes down all of its interfaces) with requests pending:
// they must end within the bound, and where the plugin moves traffic between rails (weft with WEFT_RAIL_FAILOVER=1)
// they must fail, there being nowhere left to move it, and each rail must have been counted down. Back up, a new
// connection carries data.
void faultsRailsAllDown(CheckEnv& env) {
  const std::vector<std::string> links = railLinks();
  const char* fo = std::getenv("WEFT_RAIL_FAILOVER");
  const bool failover = env.isWeft && fo != nullptr && std::string(fo) == "1";
  auto setAll = [&](bool up) {
    for (const std::string& l : links) {
      std::string cmd = "ip link set dev " + l + (up ? " up" : " down");
      if (std::system(cmd.c_str()) != 0) fail("'" + cmd + "' failed");
    }
  };
  long long downsBefore = 0;
  const bool counted = env.plugin != nullptr && env.plugin->stat("fabric.rail_downs", &downsBefore);
  const size_t size = 1 << 20;
  Buffer buf(size * 4);
  Conn c = establish(env, "all");
  Registration reg(env.net, c.comm(), buf.data(), buf.size());
  streamOf(env, c, 8, size);
  Pending4 p;
  if (env.recv()) p.reqs = postReceives(env, c, buf, reg, size, 4);
  env.oob.barrier("posted", env.timeout);
  if (!env.recv()) setAll(false);
  env.oob.barrier("down", env.timeout);
  const auto t0 = std::chrono::steady_clock::now();
  ncclResult_t r = ncclSuccess;
  Deadline d(env.timeout);
  try {
    while (r == ncclSuccess && p.done < 4 && !d.expired()) r = p.step(env, c, buf, reg, size);
  } catch (...) {
    if (!env.recv()) setAll(true);
    throw;
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  long long downs = 0;
  if (counted) env.plugin->stat("fabric.rail_downs", &downs);
  env.oob.barrier("ended", env.timeout);
  if (!env.recv()) setAll(true);
  if (r == ncclSuccess && p.done < 4)
    fail("with every rail down, pending requests neither failed nor completed within " +
         std::to_string(env.timeout.count()) + " s");
  if (failover && r == ncclSuccess)
    fail("with every rail down, requests completed under WEFT_RAIL_FAILOVER=1: they cannot have been delivered");
  if (r != ncclSuccess && counted && downs < downsBefore + static_cast<long long>(links.size()))
    fail("the requests failed, but the plugin counted " + std::to_string(downs - downsBefore) + " of the " +
         std::to_string(links.size()) + " rails going down (weftNetStat fabric.rail_downs)");
  std::printf("INFO\tevery rail down: pending requests %s after %.0f ms\n",
              r == ncclSuccess ? "completed" : (std::string("failed (") + resultName(r) + ")").c_str(), ms);
  env.oob.barrier("up", env.timeout);
  reg.release();
  closeThenReconnect(env, c, size, 81);
}

// The soak (soak.random: connections, grouped receives of random sizes and tags, every byte checked) while the
// sender flaps the last of its interfaces (rail 1 under netns_conformance.sh --rails explicit): down 0.8 s every
// 2 s, shorter than the WEFT_PEER_TIMEOUT the test runs with. Nothing may be lost, duplicated or corrupted, and
// every request must end; what the plugin counted is reported.
void faultsRailFlapSoak(CheckEnv& env) {
  const std::string victim = railToTakeDown();
  long long downs0 = 0, rec0 = 0;
  const bool counted = env.plugin != nullptr && env.plugin->stat("fabric.rail_downs", &downs0) &&
                       env.plugin->stat("fabric.rail_recoveries", &rec0);
  std::atomic<bool> stop{false};
  std::atomic<int> flaps{0};
  std::atomic<bool> linkError{false};
  std::thread flapper;
  if (!env.recv()) {
    flapper = std::thread([&] {
      auto nap = [&](int ms) {
        for (int t = 0; t < ms && !stop.load(); t += 50) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      };
      while (!stop.load()) {
        nap(1200);
        if (stop.load()) break;
        if (std::system(("ip link set dev " + victim + " down").c_str()) != 0) linkError = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(800));
        if (std::system(("ip link set dev " + victim + " up").c_str()) != 0) linkError = true;
        ++flaps;
      }
    });
  }
  // Rounds of the soak until at least 10 s and 4 flaps have passed (at most 200 rounds); the sender decides and
  // tells the receiver before each round.
  std::string failure;
  auto t0 = std::chrono::steady_clock::now();
  int rounds = 0;
  try {
    while (anotherRound(env, [&] {
      return rounds < 200 &&
             (rounds == 0 || flaps.load() < 4 || std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    })) {
      soakRandom(env);
      ++rounds;
    }
  } catch (const CheckFailure& e) {
    failure = e.what();
  } catch (...) {
    stop = true;
    if (flapper.joinable()) flapper.join();
    throw;
  }
  stop = true;
  if (flapper.joinable()) flapper.join();
  if (!env.recv()) (void)std::system(("ip link set dev " + victim + " up").c_str());
  if (!failure.empty()) fail("while " + victim + " flapped: " + failure);
  if (linkError) fail("'ip link set dev " + victim + "' failed");
  long long downs = 0, rec = 0;
  if (counted) {
    env.plugin->stat("fabric.rail_downs", &downs);
    env.plugin->stat("fabric.rail_recoveries", &rec);
  }
  if (!env.recv())
    std::printf("INFO\t%s flapped %d times (down 0.8 s each) during %d rounds of the soak (%.1f s)\n", victim.c_str(),
                flaps.load(), rounds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (counted) std::printf("INFO\trails seen down %lld times, back up %lld times\n", downs - downs0, rec - rec0);
  long long fo = 0, re = 0;
  if (counted && env.plugin->stat("fabric.rail_failovers", &fo) && env.plugin->stat("fabric.rail_readmits", &re) &&
      fo > 0)
    std::printf("INFO\trails failed over %lld times, taken back %lld times (this process)\n", fo, re);
}

// A flush on a comm whose peer died (NCCL's proxy flushes the receive it just completed, and the sender may be
// gone by then): the flush returns an error, or a request that completes or fails, within the bound; it never
// hangs. Then, once a pending receive has failed (the plugin knows the peer is gone), a second flush of the same
// buffer ends the same way; weft fails it. Over device buffers under --mem cuda (as NCCL flushes), over host
// buffers otherwise (weft flushes those only under WEFT_FLUSH=all; without it a NULL request is the answer).
void faultsFlushPeerKilled(CheckEnv& env) {
  Conn c = establish(env);
  constexpr size_t kSize = 65536;
  Buffer buf(2 * kSize, env.mem);
  Registration reg(env, c.comm(), buf);
  void* data[1] = {buf.data()};
  void* mhs[1] = {reg.mh()};
  if (!env.recv()) {
    buf.fill(0, kSize, 77);
    void* r = nullptr;
    while (r == nullptr) expectOk(env.net.isend(c.sendComm, buf.data(), kSize, 5, reg.mh(), &r), "isend");
    waitRequest(env, r, 1, "send");
    env.oob.barrier("received", env.timeout);
    std::printf("RESULT\tfaults.flush_peer_killed\tPASS\t\n");
    std::fflush(stdout);
    kill(getpid(), SIGKILL);
  }
  size_t sz[1] = {kSize};
  int tags[1] = {5};
  void* r = nullptr;
  while (r == nullptr) expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &r), "irecv");
  auto got = waitRequest(env, r, 1, "receive");
  if (buf.mismatch(0, kSize, 77) != SIZE_MAX) fail("the message before the kill arrived corrupted");
  env.oob.barrier("received", env.timeout);
  env.peerGone = true;
  // Ends a flush: an error from iflush, no request, or a request that completes or fails within the bound.
  auto flushEnds = [&](const char* when) {
    int fsz[1] = {got[0]};
    void* f = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    ncclResult_t fr = env.net.iflush(c.recvComm, 1, data, fsz, mhs, &f);
    std::string how;
    if (fr != ncclSuccess) {
      how = std::string("iflush returned ") + resultName(fr);
    } else if (f == nullptr) {
      how = "no request (nothing to flush)";
    } else {
      Deadline d(env.timeout);
      int done = 0;
      while (!done && fr == ncclSuccess) {
        fr = env.net.test(f, &done, nullptr);
        if (!done && fr == ncclSuccess && d.expired())
          fail(std::string("a flush ") + when + " neither completed nor failed within " +
               std::to_string(env.timeout.count()) + " s");
      }
      how = fr != ncclSuccess ? std::string("its request failed: ") + resultName(fr) : "its request completed";
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("INFO\tflush %s: %s after %.0f ms\n", when, how.c_str(), ms);
    return fr;
  };
  flushEnds("right after the peer was killed");
  // A receive that cannot complete: it fails once the plugin finds the peer gone.
  void* dead = nullptr;
  sz[0] = kSize;
  data[0] = buf.data() + kSize;
  Deadline posting(env.timeout);
  ncclResult_t pr = ncclSuccess;
  while (dead == nullptr && pr == ncclSuccess && !posting.expired()) pr = env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &dead);
  Deadline d(env.timeout);
  int done = 0;
  while (pr == ncclSuccess && dead != nullptr && !done && !d.expired()) pr = env.net.test(dead, &done, nullptr);
  if (pr == ncclSuccess)
    fail(done ? "a receive from a killed peer completed as success"
              : "a receive from a killed peer did not fail within " + std::to_string(env.timeout.count()) + " s");
  data[0] = buf.data();
  ncclResult_t after = flushEnds("once the comm had failed");
  if (env.isWeft && after == ncclSuccess) fail("weft flushed on a comm it had already failed, and reported success");
  reg.release();
  closeConn(env, c);
}

void faultsSenderKilled(CheckEnv& env) { peerKilled(env, Role::kSend); }
void faultsReceiverKilled(CheckEnv& env) { peerKilled(env, Role::kRecv); }

}  // namespace weft::harness::checks
