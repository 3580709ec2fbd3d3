// SPDX-License-Identifier: Apache-2.0
// The `weft inspect` socket (src/telemetry/inspect.h): names, who may read it, and that no client can hold the
// process: one that connects and never reads leaves the server able to stop.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>
#include <string>

#include "telemetry/inspect.h"
#include "weft/common/params.h"

using weft::telemetry::InspectServer;

namespace {

struct EnvVar {  // set for the scope, then unset; params re-read both times
  std::string name;
  EnvVar(const char* n, const std::string& v) : name(n) {
    setenv(n, v.c_str(), 1);
    weft::params::reload();
  }
  ~EnvVar() {
    unsetenv(name.c_str());
    weft::params::reload();
  }
};

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
  EnvVar d("WEFT_INSPECT_DIR", dir);
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
  EnvVar d("WEFT_INSPECT_DIR", dir);
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
