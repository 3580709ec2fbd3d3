// SPDX-License-Identifier: Apache-2.0
// The WEFT_* table parses strictly: garbage is reported, never read as 0, and the default stays in effect.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "weft/common/params.h"

using namespace weft;

TEST_CASE("integers parse only when the whole text is a number in range", "[params]") {
  int64_t v = 0;
  std::string err;
  CHECK(params::parseInt("42", 0, 100, &v, &err));
  CHECK(v == 42);
  CHECK_FALSE(params::parseInt("", 0, 100, &v, &err));
  CHECK_FALSE(params::parseInt("12abc", 0, 100, &v, &err));
  CHECK(err.find("not an integer") != std::string::npos);
  CHECK_FALSE(params::parseInt(" 7", 0, 100, &v, &err));
  CHECK_FALSE(params::parseInt("101", 0, 100, &v, &err));
  CHECK(err.find("outside") != std::string::npos);
  CHECK_FALSE(params::parseInt("99999999999999999999999", 0, 100, &v, &err));
}

TEST_CASE("booleans accept the usual spellings and nothing else", "[params]") {
  bool b = false;
  std::string err;
  for (const char* t : {"1", "true", "YES", "On"}) {
    CHECK(params::parseBool(t, &b, &err));
    CHECK(b);
  }
  for (const char* f : {"0", "false", "no", "OFF"}) {
    CHECK(params::parseBool(f, &b, &err));
    CHECK_FALSE(b);
  }
  CHECK_FALSE(params::parseBool("2", &b, &err));
  CHECK_FALSE(params::parseBool("", &b, &err));
}

TEST_CASE("a bad environment value is a problem, and the default stays in effect", "[params]") {
  setenv("WEFT_MAX_RECVS", "eight", 1);
  setenv("WEFT_PROVIDR", "tcp", 1);  // a typo of WEFT_PROVIDER
  params::reload();
  CHECK(params::getInt("WEFT_MAX_RECVS") == 8);
  auto problems = params::problems();
  bool sawValue = false, sawTypo = false;
  for (const auto& p : problems) {
    sawValue |= p.find("WEFT_MAX_RECVS='eight'") != std::string::npos;
    sawTypo |= p.find("WEFT_PROVIDR is not a weft variable") != std::string::npos;
  }
  CHECK(sawValue);
  CHECK(sawTypo);
  unsetenv("WEFT_MAX_RECVS");
  unsetenv("WEFT_PROVIDR");
  params::reload();
  // Gone with the variables. (Not "no problems at all": the environment this runs in may hold other WEFT_ names,
  // such as the scripts' WEFT_CACHE_DIR, which the plugin rightly names as not its own.)
  for (const auto& p : params::problems()) {
    CHECK(p.find("WEFT_MAX_RECVS") == std::string::npos);
    CHECK(p.find("WEFT_PROVIDR") == std::string::npos);
  }
}

TEST_CASE("the scripts' own variables are not problems, a name one letter off is", "[params]") {
  setenv("WEFT_CACHE_DIR", "/tmp/weft-cache", 1);       // scripts/libfabric2.sh
  setenv("WEFT_E2E_STEPS", "2", 1);                     // the end-to-end script
  setenv("WEFT_CACHE_DIRS", "/tmp/weft-cache", 1);      // nobody's
  params::reload();
  bool sawScript = false, sawOther = false;
  for (const auto& p : params::problems()) {
    sawScript |= p.find("WEFT_CACHE_DIR ") != std::string::npos || p.find("WEFT_E2E_STEPS") != std::string::npos;
    sawOther |= p.find("WEFT_CACHE_DIRS is not a weft variable") != std::string::npos;
  }
  CHECK_FALSE(sawScript);
  CHECK(sawOther);
  unsetenv("WEFT_CACHE_DIR");
  unsetenv("WEFT_E2E_STEPS");
  unsetenv("WEFT_CACHE_DIRS");
  params::reload();
}

TEST_CASE("choices reject values outside their list", "[params]") {
  setenv("WEFT_GDR", "maybe", 1);
  params::reload();
  CHECK(params::getString("WEFT_GDR") == "auto");
  CHECK_FALSE(params::problems().empty());
  setenv("WEFT_GDR", "0", 1);
  params::reload();
  CHECK(params::getString("WEFT_GDR") == "0");
  unsetenv("WEFT_GDR");
  params::reload();
}

TEST_CASE("every variable is documented and its default parses", "[params]") {
  params::reload();
  for (const auto& v : params::values()) {
    INFO(v.def->name);
    CHECK(std::string(v.def->doc).size() > 20);
    CHECK(v.valid);
    CHECK(std::string(v.def->name).rfind("WEFT_", 0) == 0);
  }
}

namespace {
const params::ForeignSetting& setting(const std::vector<params::ForeignSetting>& all, const char* name) {
  for (const auto& s : all) {
    if (std::string(s.def->name) == name) return s;
  }
  FAIL("no foreign default " << name);
  throw 0;
}
}  // namespace

TEST_CASE("provider defaults are set where the user set none, and the user's own values are kept", "[params]") {
  setenv("FI_OFI_RXM_USE_SRX", "1", 1);
  unsetenv("RDMAV_FORK_SAFE");
  auto all = params::applyForeignDefaultsNow();
  CHECK(setting(all, "FI_OFI_RXM_USE_SRX").fromUser);
  CHECK(setting(all, "FI_OFI_RXM_USE_SRX").value == "1");
  CHECK(std::string(std::getenv("FI_OFI_RXM_USE_SRX")) == "1");
  CHECK_FALSE(setting(all, "RDMAV_FORK_SAFE").fromUser);
  REQUIRE(std::getenv("RDMAV_FORK_SAFE") != nullptr);
  CHECK(std::string(std::getenv("RDMAV_FORK_SAFE")) == setting(all, "RDMAV_FORK_SAFE").def->value);
  unsetenv("FI_OFI_RXM_USE_SRX");
  all = params::applyForeignDefaultsNow();
  CHECK_FALSE(setting(all, "FI_OFI_RXM_USE_SRX").fromUser);
  CHECK(std::string(std::getenv("FI_OFI_RXM_USE_SRX")) == "0");
}

TEST_CASE("every provider default says why", "[params]") {
  for (const auto& d : params::foreignDefaults()) {
    CHECK(std::string(d.why).size() > 20);
    CHECK(std::string(d.value).size() > 0);
  }
}
