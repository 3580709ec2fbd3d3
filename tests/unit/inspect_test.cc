// SPDX-License-Identifier: Apache-2.0
// The `weft inspect` socket (src/telemetry/inspect.h): names, who may read it, and that no client can hold the
// process: one that connects and never reads leaves the server able to stop.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>
#include <string>

#include "telemetry/inspect.h"
#include "telemetry/sink.h"
#include "weft/common/params.h"
#include "tests/unit/scoped_env.h"

using weft::telemetry::InspectServer;

using weft::test::ScopedEnv;

namespace {

std::string freshDir() {
  char t[] = "/tmp/weft-inspect-test-XXXXXX";
  REQUIRE(mkdtemp(t) != nullptr);
  return std::string(t) + "/sockets";  // not there yet: the server makes it 0700
}

int connectTo(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string readAll(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

TEST_CASE("socket names carry the pid and PID namespace and parse back", "[inspect]") {
  int pid = 0;
  uint64_t ns = 0;
  REQUIRE(weft::telemetry::parseSocketName(weft::telemetry::socketName(4242, 4026531836ull), &pid, &ns));
  CHECK(pid == 4242);
  CHECK(ns == 4026531836ull);
  for (const char* bad : {"4242.sock", "-1-5.sock", "x-5.sock", "42-.sock", "42-5.socket", "42-5x.sock", ".sock"}) {
    CHECK_FALSE(weft::telemetry::parseSocketName(bad, &pid, &ns));
  }
}

TEST_CASE("the inspect socket answers its user and is this user's alone", "[inspect]") {
  const std::string dir = freshDir();
  ScopedEnv d("WEFT_INSPECT_DIR", dir);
  auto s = InspectServer::start([] { return std::string("{\"type\":\"process\"}\n"); });
  REQUIRE(s != nullptr);
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(::stat(s->path().c_str(), &st) == 0);
  CHECK((st.st_mode & 077) == 0);
  const int fd = connectTo(s->path());
  REQUIRE(fd >= 0);
  CHECK(readAll(fd) == "{\"type\":\"process\"}\n");
  ::close(fd);
  const std::string path = s->path();
  s.reset();
  CHECK(::access(path.c_str(), F_OK) != 0);  // removed at the end

  // A folder others may enter is refused: nothing served.
  REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  CHECK(InspectServer::start([] { return std::string(); }) == nullptr);
  ::rmdir(dir.c_str());
}

TEST_CASE("a client that connects and never reads cannot hold the server's stop", "[inspect]") {
  const std::string dir = freshDir();
  ScopedEnv d("WEFT_INSPECT_DIR", dir);
  // An answer far larger than the socket's buffers: without a bound on the send, the server's thread would wait on
  // this client forever and the destructor (the process's exit) with it.
  auto s = InspectServer::start([] { return std::string(64u << 20, 'x'); });
  REQUIRE(s != nullptr);
  const int fd = connectTo(s->path());
  REQUIRE(fd >= 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server is inside its send by now, or soon
  auto stopped = std::async(std::launch::async, [&] { s.reset(); });
  // Not a speed target: the send's bound is 2 s; a minute means it never ends.
  CHECK(stopped.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  stopped.wait();  // if it did not end, the test's own limit ends it
  ::close(fd);
  ::rmdir(dir.c_str());
}

// ---- SIGTERM: the dump first, then what the signal would have done ----------------------------------------------

namespace {

void markerHandler(int, siginfo_t*, void*) { _exit(42); }

// The child this process re-executes itself as (below): a weft process with one connection open and timing on,
// SIGTERM left as WEFT_TEST_TERM_BEFORE says (default, ignore, or an application's handler that exits 42).
struct TermChild {
  pid_t pid = -1;
  std::string dir;
};

TermChild spawnTermChild(const std::string& before) {
  TermChild c;
  c.dir = freshDir();
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  c.pid = ::fork();
  REQUIRE(c.pid >= 0);
  if (c.pid == 0) {
    ::close(ready[0]);
    setenv("WEFT_TELEMETRY_DIR", (c.dir + "/records").c_str(), 1);
    setenv("WEFT_INSPECT_DIR", c.dir.c_str(), 1);
    setenv("WEFT_TEST_TERM_BEFORE", before.c_str(), 1);
    setenv("WEFT_TEST_TERM_READY_FD", std::to_string(ready[1]).c_str(), 1);
    char self[4096] = {};
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) ::execl(self, self, "[.sigterm_child]", static_cast<char*>(nullptr));
    _exit(99);
  }
  ::close(ready[1]);
  char b = 0;
  const ssize_t got = ::read(ready[0], &b, 1);  // the child is serving (or it died: 0)
  ::close(ready[0]);
  REQUIRE(got == 1);
  return c;
}

// The dump files the child left in its records folder's hangs/.
std::string dumpsOf(const TermChild& c) {
  std::string all;
  const std::string hangs = c.dir + "/records/hangs";
  if (DIR* d = ::opendir(hangs.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(hangs + "/" + e->d_name);
      std::stringstream ss;
      ss << in.rdbuf();
      all += ss.str();
    }
    ::closedir(d);
  }
  return all;
}

int waitFor(pid_t pid) {
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return st;
}

}  // namespace

// Run only as the child above (hidden: "[.]").
TEST_CASE("sigterm child: a weft process with a connection, waiting", "[.sigterm_child]") {
  const char* before = std::getenv("WEFT_TEST_TERM_BEFORE");
  const std::string b = before != nullptr ? before : "";
  ::signal(SIGTERM, SIG_DFL);  // Catch's own handler off: the process's SIGTERM as a job's would be
  if (b == "ignore") ::signal(SIGTERM, SIG_IGN);
  if (b == "handler") {
    struct sigaction sa {};
    sa.sa_sigaction = markerHandler;
    sa.sa_flags = SA_SIGINFO;
    ::sigaction(SIGTERM, &sa, nullptr);
  }
  weft::params::reload();
  weft::StallState stall;
  weft::telemetry::ConnStats* c =
      weft::telemetry::registerConn(true, "10.0.0.2:5000", "eth0", nullptr, 0, &stall, "10.0.0.1:40000");
  REQUIRE(c != nullptr);
  const char* fd = std::getenv("WEFT_TEST_TERM_READY_FD");
  REQUIRE(fd != nullptr);
  const char one = 1;
  REQUIRE(::write(std::atoi(fd), &one, 1) == 1);
  for (int i = 0; i < 600; ++i) ::sleep(1);  // until a signal ends it (the parent's test bounds this)
  weft::telemetry::unregisterConn(c);
}

TEST_CASE("a SIGTERM writes the dump, then ends the process as the signal would have", "[inspect][sigterm]") {
  SECTION("the default action: the process dies of SIGTERM, its dump written first") {
    TermChild c = spawnTermChild("default");
    REQUIRE(::kill(c.pid, SIGTERM) == 0);
    const int st = waitFor(c.pid);
    CHECK(WIFSIGNALED(st));
    CHECK((WIFSIGNALED(st) ? WTERMSIG(st) : 0) == SIGTERM);
    const std::string d = dumpsOf(c);
    CHECK(d.find("\"reason\":\"sigterm\"") != std::string::npos);
    CHECK(d.find("\"peer\":\"10.0.0.2:5000\",\"local\":\"10.0.0.1:40000\"") != std::string::npos);
  }
  SECTION("an application's handler installed before weft's still runs, after the dump") {
    TermChild c = spawnTermChild("handler");
    REQUIRE(::kill(c.pid, SIGTERM) == 0);
    const int st = waitFor(c.pid);
    CHECK(WIFEXITED(st));
    CHECK((WIFEXITED(st) ? WEXITSTATUS(st) : 0) == 42);
    CHECK(dumpsOf(c).find("\"reason\":\"sigterm\"") != std::string::npos);
  }
  SECTION("an ignored SIGTERM stays ignored: the process goes on, its dump written") {
    TermChild c = spawnTermChild("ignore");
    REQUIRE(::kill(c.pid, SIGTERM) == 0);
    // The dump is the sign the signal came; the process must still be there after it.
    std::string d;
    for (int i = 0; i < 600 && d.find("sigterm") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      d = dumpsOf(c);
    }
    CHECK(d.find("\"reason\":\"sigterm\"") != std::string::npos);
    int st = 0;
    CHECK(::waitpid(c.pid, &st, WNOHANG) == 0);  // alive
    ::kill(c.pid, SIGKILL);
    waitFor(c.pid);
  }
}

TEST_CASE("the ledger shows every operation in flight, oldest first, and frees each at completion", "[inspect]") {
  weft::telemetry::ConnStats c;
  CHECK(c.inFlight().empty());
  int slots[weft::telemetry::ConnStats::kLedger];
  for (int i = 0; i < weft::telemetry::ConnStats::kLedger; ++i) {
    // Posted in an order that is not the age order: the ledger sorts by post time.
    const uint64_t t = 1000 + static_cast<uint64_t>((i * 7) % weft::telemetry::ConnStats::kLedger);
    slots[i] = c.ledgerPost(t, 100 + static_cast<uint64_t>(i), i, 1 + i % 3);
    REQUIRE(slots[i] < weft::telemetry::ConnStats::kLedger);
  }
  // One beyond NCCL's bound: counted, not shown.
  CHECK(c.ledgerPost(5000, 1, 99, 1) == weft::telemetry::ConnStats::kLedger);
  CHECK(c.unledgered.load() == 1);
  auto ops = c.inFlight();
  REQUIRE(ops.size() == static_cast<size_t>(weft::telemetry::ConnStats::kLedger));
  for (size_t i = 1; i < ops.size(); ++i) CHECK(ops[i - 1].postNs < ops[i].postNs);
  CHECK(ops.front().postNs == 1000);
  CHECK(ops.front().tag == 0);
  CHECK(ops.front().bytes == 100);
  // Completions free their slots; a post after them reuses one.
  c.ledgerDone(slots[0]);
  c.ledgerDone(slots[5]);
  ops = c.inFlight();
  CHECK(ops.size() == static_cast<size_t>(weft::telemetry::ConnStats::kLedger) - 2);
  for (const auto& op : ops) CHECK((op.tag != 0 && op.tag != 5));
  const int again = c.ledgerPost(900, 7, 42, 2);
  CHECK((again == slots[0] || again == slots[5]));
  ops = c.inFlight();
  CHECK(ops.front().tag == 42);  // the oldest post time now
  CHECK(ops.front().bufs == 2);
  c.ledgerDone(weft::telemetry::ConnStats::kLedger);  // none: no effect
  c.ledgerDone(-1);
  CHECK(c.inFlight().size() == static_cast<size_t>(weft::telemetry::ConnStats::kLedger) - 1);
}
