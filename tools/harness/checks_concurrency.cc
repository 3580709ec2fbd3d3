// SPDX-License-Identifier: Apache-2.0
// Concurrency and teardown; resource hygiene and scale.
#include "checks_internal.h"

namespace weft::harness::checks {

// ---- concurrency -----------------------------------------------------------------------------------------------

// NCCL runs a plugin from two threads per proxy: the service thread sets up (listen, connect, accept, regMr and
// deregMr, through proxyProgressAsync: src/proxy.cc in v2.28.9, ncclProxyService line 1599, lines 1484-1511)
// while the progress thread moves data (isend, irecv, test: ncclProxyProgress, line 932), concurrently.
void threadsServiceAndProgress(CheckEnv& env) {
  // NCCL's service thread registers user buffers and opens listens while the progress thread moves data on the
  // same comm.
  Conn c = establish(env);
  std::atomic<bool> stop{false};
  std::string serviceError;
  Buffer user(4 << 20);
  std::thread service([&] {
    try {
      std::mt19937 rng(env.recv() ? 1 : 2);
      for (int i = 0; !stop.load() && i < 100000; ++i) {
        size_t off = (rng() % 960) * 4096, len = 4096 * (1 + rng() % 64);  // inside the 4 MiB buffer
        void* mh = nullptr;
        expectOk(env.net.regMr(c.comm(), user.data() + off, len, NCCL_PTR_HOST, &mh), "regMr (service thread)");
        expectOk(env.net.deregMr(c.comm(), mh), "deregMr (service thread)");
        if (i % 64 == 0) {
          uint8_t h[NCCL_NET_HANDLE_MAXSIZE];
          void* lc = nullptr;
          expectOk(env.net.listen(env.ctx, env.dev, h, &lc), "listen (service thread)");
          expectOk(env.net.closeListen(lc), "closeListen (service thread)");
        }
      }
    } catch (const std::exception& e) {
      serviceError = e.what();
    }
  });
  try {
    StreamSpec s;
    for (int i = 0; i < (env.quick ? 500 : 3000); ++i) s.sizes.push_back((i % 7 == 0) ? 100 : 64 << 10);
    s.slotSize = 64 << 10;
    s.seed = 99;
    stream(env, c, s);
  } catch (...) {
    stop = true;
    service.join();
    throw;
  }
  stop = true;
  service.join();
  if (!serviceError.empty()) fail(serviceError);
  closeConn(env, c);
}

// NCCL's proxy thread progresses every connection of every channel from one loop, one step of each op per pass
// (src/proxy.cc v2.28.9, progressOps line 754: op->progress for each op in turn; net.cc sendProxyProgress and
// recvProxyProgress test the oldest request of each sub-connection, lines 1322 and 1482).
void commsMany(CheckEnv& env) {
  // A collective over 8 channels: 8 connections progressed round-robin from one thread.
  const int kConns = 8;
  std::vector<Conn> conns;
  for (int i = 0; i < kConns; ++i) conns.push_back(establish(env, "ch" + std::to_string(i)));
  {
    std::vector<std::unique_ptr<StreamState>> streams;
    for (int i = 0; i < kConns; ++i) {
      StreamSpec s;
      for (int m = 0; m < (env.quick ? 32 : 96); ++m) s.sizes.push_back(512 << 10);
      s.slotSize = 512 << 10;
      s.seed = 5000 + i;
      s.tag = i;
      streams.push_back(std::make_unique<StreamState>(env, conns[i], s));
    }
    Deadline d(env.timeout);
    std::vector<bool> finished(kConns, false);
    for (uint64_t it = 0; std::count(finished.begin(), finished.end(), true) < kConns; ++it) {
      for (int i = 0; i < kConns; ++i) {
        if (!finished[i]) finished[i] = streams[i]->step();
      }
      if (d.expired()) fail("8 concurrent connections did not finish in time");
      if (it % 4096 == 0) checkPeer(env);
    }
  }
  for (auto& c : conns) closeConn(env, c);
}

// At teardown NCCL's proxy deregisters each buffer and then closes the comm, without waiting for requests still
// outstanding when the communicator is aborted (net.cc v2.28.9: sendProxyFree lines 1136-1166, deregMr then
// closeSend; recvProxyFree lines 1184-1207).
void teardownInflight(CheckEnv& env) {
  // Communicator abort: deregMr and close with requests still outstanding, never tested again.
  Conn c = establish(env);
  Buffer buf(16 << 20);
  void* mh = nullptr;
  expectOk(env.net.regMr(c.comm(), buf.data(), buf.size(), NCCL_PTR_HOST, &mh), "regMr");
  for (int i = 0; i < 4; ++i) {
    void* req = nullptr;
    if (env.recv()) {
      void* data[1] = {buf.data() + i * (4 << 20)};
      size_t sz[1] = {4 << 20};
      int tags[1] = {0};
      void* mhs[1] = {mh};
      expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &req), "irecv");
    } else {
      expectOk(env.net.isend(c.sendComm, buf.data() + i * (4 << 20), (i % 2) ? 4 << 20 : 100, 0, mh, &req), "isend");
    }
  }
  env.oob.barrier("posted", env.timeout);
  expectOk(env.net.deregMr(c.comm(), mh), "deregMr with requests in flight");
  closeConn(env, c);
}

// NCCL's teardown after a last send: the sender's proxy sees its sends done and the communicator is destroyed at
// once, while the receiver is still behind (src/transport/net.cc v2.28.9: sendProxyFree deregisters and calls
// closeSend, lines 1139 and 1161-1166, with nothing that waits for the peer's receives). Every byte reported sent must still arrive: a plugin whose provider
// holds the tail of a send (libfabric's tcp: in its own buffer while the socket is full) must not throw it away
// with the comm. 16 connections; each sender closes its comm the moment its last send completes, the receiver
// reads slowly (a pause between its rounds of test calls) so that the senders' sockets are full when they close.
void teardownCloseAfterSends(CheckEnv& env) {
  const int kConns = 16;
  const int kMsgs = env.quick ? 24 : 64;
  std::vector<Conn> conns;
  for (int i = 0; i < kConns; ++i) conns.push_back(establish(env, "ch" + std::to_string(i)));
  std::vector<std::unique_ptr<StreamState>> streams;
  for (int i = 0; i < kConns; ++i) {
    StreamSpec s;
    // Large ones fill the socket; small ones (the tail above all) are what a provider buffers and reports sent,
    // and what may go without waiting for the receiver (eager), whose later messages then wait unread.
    for (int m = 0; m < kMsgs; ++m) s.sizes.push_back(m % 2 == 0 && m < kMsgs - 4 ? 256 << 10 : 100 * m + i);
    s.inflight = 8;
    s.slotSize = 256 << 10;
    s.recvSize = 256 << 10;  // receives are posted larger than the small sends, as NCCL's are
    s.seed = 7100 + i;
    s.tag = i;
    streams.push_back(std::make_unique<StreamState>(env, conns[i], s));
  }
  Deadline d(env.timeout);
  int left = kConns;
  for (uint64_t it = 0; left > 0; ++it) {
    for (int i = 0; i < kConns; ++i) {
      if (streams[i] == nullptr || !streams[i]->step()) continue;
      streams[i].reset();  // deregisters, as NCCL does before closing
      --left;
      if (!env.recv()) closeConn(env, conns[i]);  // at once: the receiver is still behind
    }
    if (env.recv()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (d.expired()) {
      fail(std::to_string(left) + " of 16 connections did not finish within " + std::to_string(env.timeout.count()) +
           " s" + (env.recv() ? " (data sent before the sender closed never arrived)" : ""));
    }
    if (it % 1024 == 0) checkPeer(env);
  }
  env.oob.barrier("received", env.timeout);
  for (auto& c : conns) closeConn(env, c);
}

// A communicator aborted with transfers in flight, and a new one opened at once (elastic jobs, NCCL's abort and
// re-init: src/transport/net.cc v2.28.9, sendProxyFree/recvProxyFree close the comms, lines 1161-1166 and
// 1202-1207, then the new communicator's setup calls connect/accept again, lines 841-851 and 1009-1019): whatever
// was still on its way for the old comm must never land in the new one's buffers. The new comm's
// buffers are filled with a marker first and checked twice: when its own messages have completed, and again after
// both ends closed everything (a late old write would show then). Plugins that share endpoints or queues between
// comms must route by comm, not by buffer slot, for this to hold.
void teardownCloseThenReconnect(CheckEnv& env) {
  constexpr size_t kSize = 1 << 20;
  constexpr int kMsgs = 8;
  {
    Conn old = establish(env, "old");
    Buffer buf(kSize * kMsgs);
    void* mh = nullptr;
    expectOk(env.net.regMr(old.comm(), buf.data(), buf.size(), NCCL_PTR_HOST, &mh), "regMr");
    for (int i = 0; i < kMsgs; ++i) {
      void* req = nullptr;
      uint8_t* p = buf.data() + i * kSize;
      for (int tries = 0; req == nullptr && tries < 1000; ++tries) {  // NULL: the plugin wants a retry
        if (env.recv()) {
          void* data[1] = {p};
          size_t sz[1] = {kSize};
          int tags[1] = {1};
          void* mhs[1] = {mh};
          expectOk(env.net.irecv(old.recvComm, 1, data, sz, tags, mhs, &req), "irecv (old comm)");
        } else {
          fillPattern(p, kSize, 0xA000 + i);
          expectOk(env.net.isend(old.sendComm, p, kSize, 1, mh, &req), "isend (old comm)");
        }
      }
    }
    env.oob.barrier("old-posted", env.timeout);
    expectOk(env.net.deregMr(old.comm(), mh), "deregMr with requests in flight");
    closeConn(env, old);
  }
  Conn c = establish(env, "new");
  Buffer buf(kSize * kMsgs);
  if (env.recv()) std::memset(buf.data(), 0xee, buf.size());
  void* mh = nullptr;
  expectOk(env.net.regMr(c.comm(), buf.data(), buf.size(), NCCL_PTR_HOST, &mh), "regMr");
  // As NCCL's proxy does: post ahead, test only the oldest outstanding request.
  std::vector<void*> reqs(kMsgs, nullptr);
  int posted = 0, completed = 0;
  Deadline d(env.timeout);
  for (uint64_t it = 0; completed < kMsgs; ++it) {
    if (posted < kMsgs) {
      uint8_t* p = buf.data() + posted * kSize;
      if (env.recv()) {
        void* data[1] = {p};
        size_t sz[1] = {kSize};
        int tags[1] = {1};
        void* mhs[1] = {mh};
        expectOk(env.net.irecv(c.recvComm, 1, data, sz, tags, mhs, &reqs[posted]), "irecv (new comm)");
      } else {
        fillPattern(p, kSize, 0xB000 + posted);
        expectOk(env.net.isend(c.sendComm, p, kSize, 1, mh, &reqs[posted]), "isend (new comm)");
      }
      if (reqs[posted] != nullptr) ++posted;
    }
    if (completed < posted) {
      int fin = 0, size = 0;
      expectOk(env.net.test(reqs[completed], &fin, &size), "test (new comm)");
      if (fin) {
        if (env.recv() && size != static_cast<int>(kSize)) {
          fail("new comm: receive " + std::to_string(completed) + " reported " + std::to_string(size) + " bytes");
        }
        ++completed;
      }
    }
    if (d.expired()) fail("the new comm's messages did not complete within " + std::to_string(env.timeout.count()) + " s");
    if (it % 1024 == 0) checkPeer(env);
  }
  auto verify = [&](const char* when) {
    for (int i = 0; env.recv() && i < kMsgs; ++i) {
      size_t at = findMismatch(buf.data() + i * kSize, kSize, 0xB000 + i);
      if (at != SIZE_MAX) {
        fail(std::string("new comm, buffer ") + std::to_string(i) + ", " + when + ": byte " + std::to_string(at) +
             " is not the new comm's data (old traffic, or lost data)");
      }
    }
  };
  verify("when its messages completed");
  expectOk(env.net.deregMr(c.comm(), mh), "deregMr");
  closeConn(env, c);
  env.oob.barrier("all-closed", env.timeout);
  verify("after both ends closed everything");
}

// ---- resource hygiene -------------------------------------------------------------------------------------------

struct Usage {
  int fds = 0;
  long rssKiB = 0;
  long long heapBytes = -1;  // malloc'd and in use (glibc), whoever allocated it: -1 where not known
};

// Resident memory counts what the allocator keeps as much as what is live: after comms.scale freed hundreds of
// MiB, reusing that free heap touches pages again and RSS grew 23 MiB over 2,000 cycles with nothing leaked (seen
// with the machine loaded). Free memory goes back to the system first, so the figures measure live memory.
Usage usage() {
  malloc_trim(0);
  Usage u;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++u.fds;
    closedir(d);
  }
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f)) {
      if (std::strncmp(line, "VmRSS:", 6) == 0) u.rssKiB = std::strtol(line + 6, nullptr, 10);
    }
    std::fclose(f);
  }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = mallinfo2();
  u.heapBytes = static_cast<long long>(mi.uordblks + mi.hblkhd);  // small chunks and mmapped ones
#endif
  return u;
}

void expectNoGrowth(const Usage& before, const Usage& after, int cycles, const char* what) {
  std::printf("INFO\t%d %s: fds %d -> %d, RSS %ld -> %ld KiB\n", cycles, what, before.fds, after.fds, before.rssKiB,
              after.rssKiB);
  if (after.fds > before.fds + 4) {
    fail(std::to_string(cycles) + " " + what + " grew open file descriptors from " + std::to_string(before.fds) +
         " to " + std::to_string(after.fds));
  }
  if (after.rssKiB > before.rssKiB + 16 * 1024) {
    fail(std::to_string(cycles) + " " + what + " grew resident memory by " +
         std::to_string((after.rssKiB - before.rssKiB) / 1024) + " MiB");
  }
}

// NCCL creates connections when a communicator first needs them and closes them with it (src/transport/net.cc
// v2.28.9: listen line 781, connect 841-851, accept 1009-1019, closeSend/closeRecv/closeListen 1161-1207 and 1038);
// jobs that split, shrink or re-create communicators do that for as long as they run.
void hygieneConnectCycles(CheckEnv& env) {
  // listen/connect/accept/close as NCCL does for every lazily created connection, many times over: nothing may
  // accumulate (file descriptors, endpoints, memory).
  // --quick: 40 cycles after 10 (a leaked descriptor a cycle, or an endpoint, still shows at once; the full run's
  // 2,000 after 50 are what find a slow leak). The quick count was 100 after 50: over tcp;ofi_rxm half of a quick
  // run's 13 s, in every one of some 60 entries.
  const int cycles = env.cycles > 0 ? env.cycles : (env.quick ? 40 : 2000);
  const int warmup = env.quick ? 10 : 50;
  Usage before;
  for (int i = 0; i < warmup + cycles; ++i) {
    if (i == warmup) before = usage();
    Conn c;
    try {
      c = establish(env, "cycle");
    } catch (const CheckFailure& e) {
      fail("cycle " + std::to_string(i) + ": " + e.what());
    }
    closeConn(env, c);
  }
  expectNoGrowth(before, usage(), cycles, "connect/accept/close cycles");
}

// NCCL registers a connection's buffers at setup and deregisters them at free (src/transport/net.cc v2.28.9:
// regMr lines 959 and 1114, deregMr 1139 and 1184), and registers user buffers for zero-copy transfers through
// the same calls (netRegisterBuffer, line 1648) as often as the application registers them.
void hygieneRegisterCycles(CheckEnv& env) {
  Conn c = establish(env);
  const int cycles = env.cycles > 0 ? env.cycles : (env.quick ? 2000 : 10000);
  Buffer buf(8 << 20);
  Usage before;
  for (int i = 0; i < 100 + cycles; ++i) {
    if (i == 100) before = usage();
    void* mh = nullptr;
    size_t off = (i * 7919 % 1024) * 4096;
    expectOk(env.net.regMr(c.comm(), buf.data() + off, 4096 * (1 + i % 256), NCCL_PTR_HOST, &mh), "regMr");
    expectOk(env.net.deregMr(c.comm(), mh), "deregMr");
  }
  expectNoGrowth(before, usage(), cycles, "register/deregister cycles");
  closeConn(env, c);
}

// Listening TCP sockets this process holds: a figure any plugin over TCP shows (an rxm endpoint listens for its
// connections; NCCL's Socket transport listens per listen comm), read from /proc.
int listeningSockets() {
  std::set<unsigned long> mine;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char path[300], target[64];
      std::snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
      ssize_t n = readlink(path, target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = 0;
      unsigned long inode = 0;
      if (std::sscanf(target, "socket:[%lu]", &inode) == 1) mine.insert(inode);
    }
    closedir(d);
  }
  int count = 0;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    FILE* f = std::fopen(table, "r");
    if (f == nullptr) continue;
    char line[512];
    while (std::fgets(line, sizeof(line), f)) {
      unsigned st = 0;
      unsigned long inode = 0;
      // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
      if (std::sscanf(line, " %*s %*s %*s %x %*s %*s %*s %*u %*u %lu", &st, &inode) == 2 && st == 0x0A &&
          mine.count(inode) != 0) {
        ++count;
      }
    }
    std::fclose(f);
  }
  return count;
}

// n connections, labelled `label`0.. (afterFirst runs once the first is up); on a failure the ones made are closed
// and the check fails naming which.
std::vector<Conn> establishMany(CheckEnv& env, int n, const std::string& label,
                                const std::function<void()>& afterFirst = {}) {
  std::vector<Conn> conns;
  conns.reserve(n);
  for (int i = 0; i < n; ++i) {
    try {
      conns.push_back(establish(env, label + std::to_string(i)));
    } catch (const CheckFailure& e) {
      for (auto& c : conns) closeConn(env, c);
      fail("connection " + std::to_string(i) + " of " + std::to_string(n) + ": " + e.what());
    }
    if (i == 0 && afterFirst) afterFirst();
  }
  return conns;
}

// One message of `msg` bytes per connection i, at buf + i * msg (patterned by the sender, checked by the
// receiver): registers every slot.
void registerEach(CheckEnv& env, std::vector<Conn>& conns, Buffer& buf, size_t msg, std::vector<void*>* mhs) {
  for (size_t i = 0; i < conns.size(); ++i) {
    expectOk(env.net.regMr(conns[i].comm(), buf.data() + i * msg, msg, NCCL_PTR_HOST, &(*mhs)[i]), "regMr");
    if (!env.recv()) fillPattern(buf.data() + i * msg, msg, 7000 + static_cast<int>(i));
  }
}

// Posts connection i's message (a NULL request, "not yet", is retried by the caller).
void postOne(CheckEnv& env, std::vector<Conn>& conns, Buffer& buf, size_t msg, std::vector<void*>& mhs,
             std::vector<void*>* reqs, int i) {
  uint8_t* slot = buf.data() + i * msg;
  if (env.recv()) {
    void* data[1] = {slot};
    size_t sizes[1] = {msg};
    int tags[1] = {i};
    expectOk(env.net.irecv(conns[i].recvComm, 1, data, sizes, tags, &mhs[i], &(*reqs)[i]), "irecv");
  } else {
    expectOk(env.net.isend(conns[i].sendComm, slot, msg, i, mhs[i], &(*reqs)[i]), "isend");
  }
}

// Posts (where not posted yet) and tests every connection's message, sweeping in `order`, as NCCL's progress
// thread sweeps its connections, until all completed: fails on a message that does not arrive within the timeout
// or arrives wrong.
void oneMessageEach(CheckEnv& env, std::vector<Conn>& conns, Buffer& buf, size_t msg, std::vector<void*>& mhs,
                    std::vector<void*>* reqs, const std::vector<int>& order) {
  const int n = static_cast<int>(conns.size());
  std::vector<bool> done(n, false);
  int remaining = n;
  Deadline d(env.timeout);
  for (uint64_t it = 0; remaining > 0; ++it) {
    for (int i : order) {
      if (done[i]) continue;
      if ((*reqs)[i] == nullptr) {
        postOne(env, conns, buf, msg, mhs, reqs, i);
        continue;
      }
      int fin = 0, size = 0;
      expectOk(env.net.test((*reqs)[i], &fin, &size), "test");
      if (!fin) continue;
      done[i] = true;
      --remaining;
      if (env.recv() && (size != static_cast<int>(msg) || findMismatch(buf.data() + i * msg, msg, 7000 + i) != SIZE_MAX)) {
        fail("the message on connection " + std::to_string(i) + " arrived wrong");
      }
    }
    if (d.expired()) fail(std::to_string(remaining) + " of " + std::to_string(n) + " messages did not complete");
    if (it % 256 == 0) checkPeer(env);
  }
}

// What a connection costs: N connections held at once between the two processes (NCCL keeps hundreds to thousands
// per GPU at scale: src/transport.cc v2.28.9, ncclTransportP2pSetup lines 160-170, sets up a send and a receive
// connection per channel and peer, for every communicator), each carrying one message. Prints the time to connect them all, and per connection the
// resident memory and the heap in use (malloc, the plugin's and its provider's) after connecting and after the
// first message (a provider may allocate send buffers only then), and file descriptors. The targets (issue: 32 KiB,
// 0.01 fds, 1,024 connections in 0.15 s) are printed beside the figures, not enforced: a timing fails on a loaded
// machine, and what a provider allocates is its own business; the check fails on lost or corrupted messages, and
// on more endpoints than --max-endpoints.
void commsScale(CheckEnv& env) {
  const int n = env.conns > 0 ? env.conns : (env.quick ? 256 : 1024);
  const size_t kMsg = 4096;
  Buffer buf(kMsg * n);  // the harness's own memory, touched before the baseline
  std::memset(buf.data(), 0, buf.size());
  Usage before = usage();
  long long epBefore = -1, epAfter = -1;
  const bool epReported = env.plugin != nullptr && env.plugin->stat("fabric.endpoints_open", &epBefore);
  const int listenBefore = listeningSockets();
  auto t0 = std::chrono::steady_clock::now();
  Usage first;  // after the first connection: what is shared (an endpoint opened on first use) is paid by then
  std::vector<Conn> conns = establishMany(env, n, "scale", [&] {
    auto tFirst = std::chrono::steady_clock::now();
    first = usage();
    t0 += std::chrono::steady_clock::now() - tFirst;  // the measurement is not connect time
  });
  double connectSec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Usage connected = usage();
  if (epReported) env.plugin->stat("fabric.endpoints_open", &epAfter);
  const int listenAfter = listeningSockets();
  std::printf("INFO\t%d connections: libfabric endpoints open %s; listening TCP sockets %d -> %d\n", n,
              epReported ? (std::to_string(epBefore) + " -> " + std::to_string(epAfter) + " (as the plugin reports)").c_str()
                         : "not reported by the plugin",
              listenBefore, listenAfter);
  if (env.maxEndpoints >= 0 && epReported && epAfter > env.maxEndpoints) {
    for (auto& c : conns) closeConn(env, c);
    fail(std::to_string(n) + " connections hold " + std::to_string(epAfter) + " libfabric endpoints open, more than "
         "--max-endpoints " + std::to_string(env.maxEndpoints) + ": endpoints are not shared");
  }
  {
    std::vector<void*> mhs(n, nullptr), reqs(n, nullptr);
    registerEach(env, conns, buf, kMsg, &mhs);
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    oneMessageEach(env, conns, buf, kMsg, mhs, &reqs, order);
    Usage used = usage();
    // Per connection: the connections after the first, over what the first left (it opened what is shared).
    const int more = std::max(1, n - 1);
    auto rss = [&](const Usage& u) { return static_cast<double>(u.rssKiB - first.rssKiB) / more; };
    auto heap = [&](const Usage& u) {
      if (first.heapBytes < 0) return std::string("?");
      char b[32];
      std::snprintf(b, sizeof(b), "%.1f", static_cast<double>(u.heapBytes - first.heapBytes) / 1024.0 / more);
      return std::string(b);
    };
    std::printf("INFO\t%d connections: connected in %.2f s (%.2f ms each; target 0.15 s for 1,024); the first "
                "(what is shared: endpoints opened on first use) RSS %.1f MiB, fds %d; each further one: RSS %.1f "
                "KiB after connecting, %.1f KiB after one message (target 32), heap in use %s / %s KiB, fds %.3f "
                "(%d -> %d; target 0.01)\n",
                n, connectSec, connectSec * 1000.0 / n, static_cast<double>(first.rssKiB - before.rssKiB) / 1024.0,
                first.fds - before.fds, rss(connected), rss(used), heap(connected).c_str(), heap(used).c_str(),
                static_cast<double>(used.fds - first.fds) / more, first.fds, used.fds);
    for (int i = 0; i < n; ++i) expectOk(env.net.deregMr(conns[i].comm(), mhs[i]), "deregMr");
  }
  for (auto& c : conns) closeConn(env, c);
}

// Connections are independent: NCCL's proxy posts each connection's receives when that connection's step is
// ready, in no order related to the order in which the peer sends (src/transport/net.cc v2.28.9, recvProxyProgress
// posts per sub-connection as buffers free up). Here every receive is posted before any send, in the reverse of
// the send order, on more connections (2,048; --conns) than a provider's receive queue holds (1,024 entries for
// shm and rxm in libfabric 1.17): a plugin that posts them all into one shared queue fills it with receives whose
// messages come last, and the first message sent finds no room. Each message must still arrive, intact.
void commsCrossOrder(CheckEnv& env) {
  const int n = env.conns > 0 ? env.conns : 2048;
  const size_t kMsg = 1024;
  Buffer buf(kMsg * n);
  std::memset(buf.data(), 0, buf.size());
  std::vector<Conn> conns = establishMany(env, n, "order");
  std::vector<void*> mhs(n, nullptr), reqs(n, nullptr);
  registerEach(env, conns, buf, kMsg, &mhs);
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = env.recv() ? n - 1 - i : i;
  if (env.recv()) {
    for (int i : order) postOne(env, conns, buf, kMsg, mhs, &reqs, i);  // all before the first send
  }
  env.oob.barrier("receives-posted", env.timeout);
  oneMessageEach(env, conns, buf, kMsg, mhs, &reqs, order);
  for (int i = 0; i < n; ++i) expectOk(env.net.deregMr(conns[i].comm(), mhs[i]), "deregMr");
  for (auto& c : conns) closeConn(env, c);
}

}  // namespace weft::harness::checks
