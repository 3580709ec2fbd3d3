// SPDX-License-Identifier: Apache-2.0
// Host memory on a NUMA node and weft's threads near it: blocks land where the kernel was asked to put them, come
// back and are reused, a node the kernel refuses falls back to the heap, and a thread is bound only to cpus no other
// thread of the process is pinned to.
#include <catch2/catch.hpp>

#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "weft/common/numa.h"
#include "weft/common/params.h"
#include "weft/common/topology.h"

using namespace weft;

namespace {
struct NumaMode {  // WEFT_NUMA for the scope
  explicit NumaMode(const char* v) {
    setenv("WEFT_NUMA", v, 1);
    params::reload();
  }
  ~NumaMode() {
    unsetenv("WEFT_NUMA");
    params::reload();
  }
};

struct Counted {
  static int alive;
  int value = 7;
  Counted() { ++alive; }
  ~Counted() { --alive; }
};
int Counted::alive = 0;

struct Base : numa::Placed {
  virtual ~Base() = default;
};
struct Derived : Base {
  char payload[1000] = {};
  explicit Derived(char c) { std::memset(payload, c, sizeof(payload)); }
};
}  // namespace

TEST_CASE("numa: a block asked for on node 0 is placed there, and comes back for the next one", "[numa]") {
  NumaMode on("on");
  REQUIRE(numa::placementOn());
  const numa::Stats before = numa::stats();
  void* p = numa::allocate(3000, 0);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
  std::memset(p, 1, 3000);
  CHECK(numa::policyOf(p) == "preferred 0");
  CHECK(numa::nodeOfPage(p) == 0);
  const numa::Stats mid = numa::stats();
  CHECK(mid.blocksInUse == before.blocksInUse + 1);
  CHECK(mid.bytesInUse == before.bytesInUse + 3008);
  numa::deallocate(p);
  CHECK(numa::stats().blocksInUse == before.blocksInUse);
  void* q = numa::allocate(3001, 0);  // the same block size: the freed block again
  CHECK(q == p);
  numa::deallocate(q);
  // A big block has a mapping of its own, given back whole.
  void* big = numa::allocate(size_t{3} << 20, 0);
  REQUIRE(big != nullptr);
  CHECK(numa::policyOf(big) == "preferred 0");
  const size_t regions = numa::stats().regions;
  numa::deallocate(big);
  CHECK(numa::stats().regions == regions - 1);
}

TEST_CASE("numa: a node the kernel refuses, or placement off, gives ordinary heap memory", "[numa]") {
  {
    NumaMode on("on");
    const int absent = static_cast<int>(topo::Topology::host().numa().size()) + 5;
    const size_t fallbacks = numa::stats().fallbacks;
    void* p = numa::allocate(512, absent);
    REQUIRE(p != nullptr);
    std::memset(p, 2, 512);
    CHECK(numa::policyOf(p) == "default");
    CHECK(numa::stats().fallbacks == fallbacks + 1);
    numa::deallocate(p);
    // Refused once, never asked again: the next allocation goes straight to the heap.
    void* r = numa::allocate(512, absent);
    CHECK(numa::stats().fallbacks == fallbacks + 2);
    numa::deallocate(r);
  }
  NumaMode off("off");
  CHECK_FALSE(numa::placementOn());
  void* p = numa::allocate(4096, 0);
  REQUIRE(p != nullptr);
  std::memset(p, 3, 4096);
  CHECK(numa::policyOf(p) == "default");
  numa::deallocate(p);
  // auto: only on a machine of several nodes.
  NumaMode autoMode("auto");
  CHECK(numa::placementOn() == (topo::Topology::host().numa().size() > 1));
}

TEST_CASE("numa: arrays and objects made on a node are built and destroyed like any other", "[numa]") {
  NumaMode on("on");
  {
    auto a = numa::makeArray<Counted>(10, 0);
    REQUIRE(a);
    CHECK(Counted::alive == 10);
    CHECK(a[9].value == 7);
    CHECK(numa::policyOf(a.get()) == "preferred 0");
  }
  CHECK(Counted::alive == 0);
  const size_t inUse = numa::stats().blocksInUse;
  Base* b = numa::make<Derived>(0, 'x');
  CHECK(numa::policyOf(b) == "preferred 0");
  CHECK(static_cast<Derived*>(b)->payload[999] == 'x');
  CHECK(numa::stats().blocksInUse == inUse + 1);
  delete b;  // through the base: the block goes back to its list
  CHECK(numa::stats().blocksInUse == inUse);
  Base* h = new Derived('y');  // plain new: the heap, freed the same way
  CHECK(numa::policyOf(h) == "default");
  delete h;
}

TEST_CASE("numa: a thread goes to the node's cpus that the process may use and no other thread is pinned to",
          "[numa]") {
  using V = std::vector<int>;
  // Nobody pinned: the node's cpus.
  CHECK(numa::chooseCpus({0, 1, 2, 3}, {{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}}) == V{0, 1, 2, 3});
  // NCCL's proxy thread pinned to 2, the job's main thread to 0: the rest of the node.
  CHECK(numa::chooseCpus({0, 1, 2, 3}, {{0, 1, 2, 3, 4, 5, 6, 7}, {2}, {0}}) == V{1, 3});
  // The job runs on the other node's cpus only (taskset): nothing here, the thread stays where it is.
  CHECK(numa::chooseCpus({0, 1, 2, 3}, {{4, 5, 6, 7}, {4, 5, 6, 7}}).empty());
  // Every cpu of the node pinned by someone: nothing.
  CHECK(numa::chooseCpus({0, 1}, {{0, 1, 2, 3}, {0}, {1}}).empty());
}

TEST_CASE("numa: binding this thread near node 0 here, and a clear no for a node that is not there", "[numa]") {
  NumaMode on("on");
  std::string what;
  bool bound = false;
  cpu_set_t after;
  CPU_ZERO(&after);
  std::thread t([&] {
    bound = numa::bindThisThreadNear(0, &what);
    sched_getaffinity(0, sizeof(after), &after);
  });
  t.join();
  INFO(what);
  REQUIRE(bound);
  CHECK(what.find("NUMA node 0") != std::string::npos);
  for (int c : topo::Topology::host().numaNode(0)->cpus) CHECK(CPU_ISSET(c, &after));
  std::thread t2([&] { bound = numa::bindThisThreadNear(42, &what); });
  t2.join();
  CHECK_FALSE(bound);
  CHECK(what.find("not in this machine's layout") != std::string::npos);
  NumaMode off("off");
  CHECK_FALSE(numa::bindThisThreadNear(0, &what));
  CHECK(what.find("placement off") != std::string::npos);
}

TEST_CASE("numa: a fork while another thread allocates leaves the child's arena usable", "[numa]") {
  NumaMode on("on");
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop.load()) numa::deallocate(numa::allocate(256, 0));
  });
  int stuck = 0;
  for (int i = 0; i < 20; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      void* p = numa::allocate(256, 0);  // would wait forever on a lock held at fork time
      numa::deallocate(p);
      _exit(p != nullptr ? 0 : 1);
    }
    REQUIRE(pid > 0);
    int status = -1;
    for (int ms = 0; ms < 5000 && waitpid(pid, &status, WNOHANG) == 0; ++ms) usleep(1000);
    if (waitpid(pid, &status, WNOHANG) == 0) {
      ++stuck;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    } else {
      CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    }
  }
  stop = true;
  churn.join();
  CHECK(stuck == 0);
}
