// SPDX-License-Identifier: Apache-2.0
// shm endpoints under weft's own names (FabricDevice::nameEndpoint): each endpoint's file in /dev/shm is named by
// user, PID namespace, process, 64 random bits and a counter, so a file a killed process left cannot refuse a later
// process that got its id (the default name was the id and a counter: CI's conformance.shm.rdma.gpu_mock.lf2 failed
// on "binding/enabling the endpoint on shm failed: Device or resource busy"); and the files of dead weft processes
// are swept.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fabric/fabric_backend.h"
#include "fabric/fabric_comm.h"
#include "fabric/fabric_device.h"
#include "fabric/fabric_endpoint.h"
#include "fabric_test_env.h"
#include "weft/transport/handle.h"

using namespace weft;
using namespace weft::fabric;

namespace {

std::string endpointName(RecvComm* r) {
  const std::vector<uint8_t>& n = dynamic_cast<FabricRecvComm*>(r)->group().rail(0).name();
  std::string s(n.begin(), n.end());
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

bool exists(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0;
}

// A process id that was just in use and is not now (a child that exited, reaped).
pid_t deadPid() {
  pid_t p = fork();
  if (p == 0) _exit(0);
  int status = 0;
  waitpid(p, &status, 0);
  return p;
}

}  // namespace

TEST_CASE("shm: each endpoint takes a weft name of its own, and connects by it", "[fabric][shm]") {
  weft::testing::FabricTestEnv env{{"WEFT_FABRIC_SHARED_EP", "0"}, {"WEFT_PROVIDER", "shm"}, {"WEFT_IFACE", ""}};
  WEFT_REQUIRE_FABRIC(env);
  int scope = 0;
  CommConfig cfg{};
  cfg.scope = &scope;
  constexpr int kPairs = 3;
  std::vector<SendComm*> sends(kPairs, nullptr);
  std::vector<RecvComm*> recvs(kPairs, nullptr);
  std::set<std::string> names;
  const std::string mine = FabricDevice::shmNamePrefix() + std::to_string(getpid()) + "-";
  for (int i = 0; i < kPairs; ++i) {
    uint8_t handle[kHandleSize];
    ListenComm* lcRaw = nullptr;
    REQUIRE(env.backend()->listen(0, cfg, handle, &lcRaw) == Status::kOk);
    std::unique_ptr<ListenComm> lc(lcRaw);
    REQUIRE(env.connect(lc.get(), cfg, handle, &sends[i], &recvs[i]));
    std::string name = endpointName(recvs[i]);
    INFO("endpoint name " << name);
    CHECK(name.rfind(mine, 0) == 0);
    CHECK(name.size() < 64);  // fits a rail's address in the handshake
    CHECK(exists("/dev/shm/" + name));
    names.insert(name);
  }
  CHECK(names.size() == kPairs);  // private endpoints: one name each
  for (int i = 0; i < kPairs; ++i) {
    sends[i]->close();
    recvs[i]->close();
  }
  for (const std::string& n : names) CHECK_FALSE(exists("/dev/shm/" + n));  // a clean close removes its file
}

TEST_CASE("shm: the sweep removes only the files of this user's dead weft processes", "[fabric][shm]") {
  std::string dir = std::filesystem::temp_directory_path() / ("weft-shm-sweep-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string prefix = FabricDevice::shmNamePrefix();
  const pid_t dead = deadPid();
  const std::string gone = prefix + std::to_string(dead) + "-0123456789abcdef-0";
  const std::vector<std::string> kept = {
      prefix + std::to_string(getpid()) + "-0123456789abcdef-1",   // this process
      prefix + std::to_string(getppid()) + "-0123456789abcdef-0",  // a live one
      "weft-" + std::to_string(geteuid()) + "-1-" + std::to_string(dead) + "-0123456789abcdef-0",  // another namespace
      std::to_string(dead) + ":0:0",                                                               // not weft's
      prefix + "x-0",                                                                              // no process id
  };
  for (const std::string& n : kept) std::ofstream(dir + "/" + n) << "x";
  std::ofstream(dir + "/" + gone) << "x";
  std::filesystem::create_directories(dir + "/" + prefix + std::to_string(dead) + "-dir");  // not a file
  CHECK(FabricDevice::sweepShmRegions(dir) == 1);
  CHECK_FALSE(exists(dir + "/" + gone));
  for (const std::string& n : kept) {
    INFO(n);
    CHECK(exists(dir + "/" + n));
  }
  CHECK(exists(dir + "/" + prefix + std::to_string(dead) + "-dir"));
  CHECK(FabricDevice::sweepShmRegions(dir + "/none") == 0);  // no such directory: nothing, no error
  std::filesystem::remove_all(dir);
}

TEST_CASE("shm: the file of a killed process goes when the next device opens an endpoint", "[fabric][shm]") {
  // The victim: a child that opens an shm endpoint, says its name and is killed with it open.
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(fds[0]);
    weft::testing::FabricTestEnv env{{"WEFT_FABRIC_SHARED_EP", "0"}, {"WEFT_PROVIDER", "shm"}, {"WEFT_IFACE", ""}};
    if (env.backend() == nullptr) _exit(77);
    int scope = 0;
    CommConfig cfg{};
    cfg.scope = &scope;
    uint8_t handle[kHandleSize];
    SendComm* s = nullptr;
    RecvComm* r = nullptr;
    ListenComm* lc = nullptr;
    if (env.backend()->listen(0, cfg, handle, &lc) != Status::kOk || !env.connect(lc, cfg, handle, &s, &r)) _exit(1);
    std::string name = endpointName(r) + "\n";
    if (write(fds[1], name.data(), name.size()) != static_cast<ssize_t>(name.size())) _exit(1);
    raise(SIGKILL);
  }
  close(fds[1]);
  std::string name;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') name += c;
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) WEFT_SKIP("no shm provider here");
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  INFO("the killed process's endpoint: " << name);
  REQUIRE_FALSE(name.empty());
  REQUIRE(exists("/dev/shm/" + name));  // left behind: nothing ran at the kill

  weft::testing::FabricTestEnv env{{"WEFT_FABRIC_SHARED_EP", "0"}, {"WEFT_PROVIDER", "shm"}, {"WEFT_IFACE", ""}};
  WEFT_REQUIRE_FABRIC(env);
  int scope = 0;
  CommConfig cfg{};
  cfg.scope = &scope;
  uint8_t handle[kHandleSize];
  ListenComm* lcRaw = nullptr;
  REQUIRE(env.backend()->listen(0, cfg, handle, &lcRaw) == Status::kOk);
  std::unique_ptr<ListenComm> lc(lcRaw);
  CHECK_FALSE(exists("/dev/shm/" + name));
}
