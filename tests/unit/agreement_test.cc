// SPDX-License-Identifier: Apache-2.0
// The tuner's decision state in the connection handshake: ranks that would tune differently (another profile,
// one that is damaged or missing, other WEFT_TUNER* settings) cannot connect, and NCCL's init fails naming both
// digests instead of hanging on mismatched algorithms. The two-process cases start this binary again as the
// connecting peer (the hidden test case below), with its own environment.
#include <catch2/catch.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/fabric_backend.h"
#include "fabric_test_env.h"
#include "tuner/agreement.h"
#include "tuner/profile.h"
#include "weft/common/params.h"
#include "weft/transport/agreement.h"
#include "weft/transport/handle.h"
#include "tests/unit/scoped_env.h"

extern char** environ;

using namespace weft;
using weft::transport::Agreement;
using weft::transport::setAgreementSource;

using weft::test::ScopedEnv;

namespace {

std::string tempDir() {
  static std::string dir = [] {
    char tmpl[] = "/tmp/weft-agreement-XXXXXX";
    const char* d = mkdtemp(tmpl);
    REQUIRE(d != nullptr);
    return std::string(d);
  }();
  return dir;
}

// A valid profile whose one measurement takes `us`.
std::string writeProfileFile(const std::string& name, double us) {
  tuner::Profile p;
  p.sig.nRanks = 2;
  p.sig.nNodes = 2;
  tuner::Measurement m;
  m.coll = 4;
  m.bytes = 1 << 20;
  m.arm.algo = 1;
  m.arm.proto = 2;
  m.timeUs = us;
  m.samples = 5;
  m.spread = 0.02;
  p.measurements.push_back(m);
  std::string path = tempDir() + "/" + name;
  std::ofstream(path) << tuner::writeProfile(p);
  return path;
}

uint64_t digestWith(std::initializer_list<std::pair<const char*, std::string>> vars) {
  std::vector<std::unique_ptr<ScopedEnv>> set;
  for (const auto& [k, v] : vars) set.push_back(std::make_unique<ScopedEnv>(k, v));
  return tuner::decisionState().digest;
}

}  // namespace

TEST_CASE("the tuner's digest changes with everything that changes its decisions, and nothing else",
          "[tuner][agreement]") {
  const std::string a = writeProfileFile("a.json", 100.0);
  const std::string b = writeProfileFile("b.json", 150.0);
  const std::string a2 = tempDir() + "/a-copy.json";
  { std::ofstream(a2) << std::ifstream(a).rdbuf(); }
  const std::string damaged = tempDir() + "/damaged.json";
  {
    std::ifstream in(a);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(damaged) << text.substr(0, text.size() / 2);
  }
  const uint64_t none = digestWith({});
  const uint64_t withA = digestWith({{"WEFT_TUNER_PROFILE", a}});
  CHECK(none != 0);
  CHECK(withA != none);
  CHECK(digestWith({{"WEFT_TUNER_PROFILE", a2}}) == withA);  // the same bytes elsewhere: the same decisions
  CHECK(digestWith({{"WEFT_TUNER_PROFILE", b}}) != withA);
  CHECK(digestWith({{"WEFT_TUNER_PROFILE", damaged}}) != withA);
  CHECK(digestWith({{"WEFT_TUNER_PROFILE", tempDir() + "/missing.json"}}) != withA);
  CHECK(digestWith({{"WEFT_TUNER_PROFILE", a}, {"WEFT_TUNER_MARGIN", "10"}}) != withA);
  CHECK(digestWith({{"WEFT_TUNER_PROFILE", a}, {"WEFT_TUNER_EXPLORE", "1"}}) != withA);
  CHECK(digestWith({{"WEFT_TUNER_FORCE", "RING/LL"}}) != none);
  CHECK(digestWith({{"WEFT_TUNER", "0"}}) != none);
  CHECK(digestWith({{"WEFT_TUNER", "0"}, {"WEFT_TUNER_PROFILE", a}}) == digestWith({{"WEFT_TUNER", "0"}}));
  CHECK(digestWith({{"WEFT_TUNER_PROFILE", a}, {"WEFT_TUNER_LOG", "1"}}) == withA);  // logging decides nothing
  // Unchecked: turned off, or NCCL told to take another tuner (this library's is then not used).
  CHECK(digestWith({{"WEFT_TUNER_CHECK", "0"}}) == 0);
  CHECK(digestWith({{"NCCL_TUNER_PLUGIN", "libnccl-tuner-example.so"}}) == 0);
  CHECK(digestWith({{"NCCL_TUNER_PLUGIN", "weft"}}) == none);
  // The summary says what was loaded.
  {
    ScopedEnv e("WEFT_TUNER_PROFILE", damaged);
    CHECK(tuner::decisionState().summary.find("does not load") != std::string::npos);
  }
}

TEST_CASE("weft tune check reads the state line from NCCL's log format, one per process", "[tuner][agreement]") {
  std::istringstream log(
      "node1:4242:4250 [0] NCCL INFO Bootstrap : Using eth0\n"
      "node1:4242:4250 [0] NCCL INFO NET/weft : tuner decision state 00000000000000a1: profile /p.json, margin 3%\n"
      "node1:4242:4251 [1] NCCL INFO NET/weft : tuner decision state 00000000000000a1: profile /p.json, margin 3%\n"
      "node2:77:78 [0] NCCL INFO NET/weft : tuner decision state 00000000000000b2: no profile, margin 3%\n"
      "tuner decision state 00000000000000c3: tuner off (WEFT_TUNER=0)\n"
      "tuner decision state xyz: not a digest\n"
      "tuner decision state 00000000000000d4 no colon\n");
  auto got = tuner::scanLog(log, "job.log");
  REQUIRE(got.size() == 3);  // node1:4242 once, however many of its threads logged
  CHECK(got[0].who == "node1:4242");
  CHECK(got[0].digest == 0xa1);
  CHECK(got[0].summary == "profile /p.json, margin 3%");
  CHECK(got[1].who == "node2:77");
  CHECK(got[1].digest == 0xb2);
  CHECK(got[2].who == "job.log:5");  // no NCCL prefix: named by file and line
  CHECK(got[2].digest == 0xc3);
  CHECK(tuner::stateLine(Agreement{0xa1, "x"}) == "tuner decision state 00000000000000a1: x");
}

// The connecting peer of the two-process cases (hidden: started by the case below with its own environment).
// WEFT_TEST_HANDLE: the listen handle in hex; WEFT_TEST_EXPECT: "connected" or "refused".
TEST_CASE("agreement peer", "[.][agreement_peer]") {
  weft::testing::FabricTestEnv env;
  WEFT_REQUIRE_FABRIC(env);
  setAgreementSource(&tuner::decisionState);
  const char* hex = std::getenv("WEFT_TEST_HANDLE");
  const char* expect = std::getenv("WEFT_TEST_EXPECT");
  REQUIRE(hex != nullptr);
  REQUIRE(expect != nullptr);
  uint8_t handle[kHandleSize] = {};
  for (size_t i = 0; i < kHandleSize && hex[2 * i] != 0; ++i) {
    handle[i] = static_cast<uint8_t>(std::stoi(std::string(hex + 2 * i, 2), nullptr, 16));
  }
  SendComm* sc = nullptr;
  Status st = Status::kOk;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (sc == nullptr && st == Status::kOk && std::chrono::steady_clock::now() < deadline) {
    st = env.backend()->connect(0, CommConfig{}, handle, &sc);
  }
  setAgreementSource(nullptr);
  if (std::string(expect) == "connected") {
    CHECK(st == Status::kOk);
    CHECK(sc != nullptr);
  } else {
    CHECK(st == Status::kInvalidUsage);
    CHECK(sc == nullptr);
  }
  delete sc;
}

TEST_CASE("two processes whose tuners would decide differently cannot connect; alike, they can",
          "[fabric][tuner][agreement]") {
  const std::string a = writeProfileFile("pa.json", 100.0);
  const std::string b = writeProfileFile("pb.json", 150.0);
  const std::string damaged = tempDir() + "/pdamaged.json";
  std::ofstream(damaged) << "{\"format\":\"weft-tuner-profile\",\"version\":1,\"signa";
  struct Case {
    const char* what;
    std::string peerProfile;
    bool connects;
  };
  const std::vector<Case> cases = {
      {"the same profile", a, true},
      {"another profile", b, false},
      {"a damaged profile", damaged, false},
      {"a missing profile", tempDir() + "/nowhere.json", false},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      weft::testing::FabricTestEnv env{{"WEFT_TUNER_PROFILE", a.c_str()}};
      WEFT_REQUIRE_FABRIC(env);
      setAgreementSource(&tuner::decisionState);
      uint8_t handle[kHandleSize];
      ListenComm* lcRaw = nullptr;
      REQUIRE(env.backend()->listen(0, CommConfig{}, handle, &lcRaw) == Status::kOk);
      std::unique_ptr<ListenComm> lc(lcRaw);
      std::string hex;
      for (uint8_t x : handle) hex += fmt::format("{:02x}", x);
      std::vector<std::string> envs;
      for (char** e = environ; *e != nullptr; ++e) {
        if (std::strncmp(*e, "WEFT_TUNER_PROFILE=", 19) != 0) envs.emplace_back(*e);
      }
      envs.push_back("WEFT_TUNER_PROFILE=" + c.peerProfile);
      envs.push_back("WEFT_TEST_HANDLE=" + hex);
      envs.push_back(std::string("WEFT_TEST_EXPECT=") + (c.connects ? "connected" : "refused"));
      std::vector<char*> envp;
      for (auto& e : envs) envp.push_back(e.data());
      envp.push_back(nullptr);
      std::string self = "/proc/self/exe", tag = "[agreement_peer]";
      char* argv[] = {self.data(), tag.data(), nullptr};
      pid_t pid = 0;
      REQUIRE(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) == 0);
      RecvComm* rc = nullptr;
      Status st = Status::kOk;
      int status = 0;
      bool exited = false;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
      while (std::chrono::steady_clock::now() < deadline) {
        if (rc == nullptr && st == Status::kOk) st = lc->accept(&rc);
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = true;
        if (exited && (rc != nullptr || st != Status::kOk)) break;
      }
      if (!exited) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
      }
      setAgreementSource(nullptr);
      INFO(c.what);
      REQUIRE(exited);
      CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));  // the peer saw what it expected
      if (c.connects) {
        CHECK(st == Status::kOk);
        CHECK(rc != nullptr);
      } else {
        CHECK(st == Status::kInvalidUsage);
        CHECK(rc == nullptr);
      }
      delete rc;
    }
  }
}
