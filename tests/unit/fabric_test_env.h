// SPDX-License-Identifier: Apache-2.0
// What the unit tests of the libfabric backend share: the backend over tcp;ofi_rxm on loopback with the settings a
// test names (restored when it ends), and a connection made by polling connect and accept in one thread.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <initializer_list>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fabric/fabric_backend.h"
#include "tests/support/skip.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"

namespace weft::testing {

class FabricTestEnv {
 public:
  // WEFT_PROVIDER and WEFT_IFACE are set for loopback; `extra` adds settings (name, value).
  FabricTestEnv(std::initializer_list<std::pair<const char*, const char*>> extra = {}) {
    vars_ = {{"WEFT_PROVIDER", "tcp;ofi_rxm"}, {"WEFT_IFACE", "lo"}};
    for (const auto& [k, v] : extra) vars_.emplace_back(k, v);
    for (const auto& [k, v] : vars_) setenv(k.c_str(), v.c_str(), 1);
    params::reload();
    backend_ = fabric::FabricBackend::discover(&why_);
  }
  ~FabricTestEnv() {
    backend_.reset();
    for (const auto& kv : vars_) unsetenv(kv.first.c_str());
    params::reload();
  }
  FabricTestEnv(const FabricTestEnv&) = delete;
  FabricTestEnv& operator=(const FabricTestEnv&) = delete;

  // nullptr (with the reason in why()) where this machine has no tcp;ofi_rxm on lo: the test says so and skips.
  fabric::FabricBackend* backend() const { return backend_.get(); }
  const std::string& why() const { return why_; }

  // Connects through `lc` (listening with `handle`), polling both ends here; false after 30 s.
  bool connect(ListenComm* lc, const CommConfig& cfg, uint8_t* handle, SendComm** s, RecvComm** r) const {
    *s = nullptr;
    *r = nullptr;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((*s == nullptr || *r == nullptr) && std::chrono::steady_clock::now() < deadline) {
      if (*s == nullptr && backend_->connect(0, cfg, handle, s) != Status::kOk) return false;
      if (*r == nullptr && lc->accept(r) != Status::kOk) return false;
    }
    return *s != nullptr && *r != nullptr;
  }

 private:
  std::vector<std::pair<std::string, std::string>> vars_;
  std::unique_ptr<fabric::FabricBackend> backend_;
  std::string why_;
};

}  // namespace weft::testing

// Skips the test (with the reason) where the backend cannot start here; under CI=true, where scripts/setup.sh has
// installed libfabric, fails it instead.
#define WEFT_REQUIRE_FABRIC(env)                                                      \
  do {                                                                                \
    if ((env).backend() == nullptr)                                                   \
      WEFT_SKIP_UNLESS_CI("no tcp;ofi_rxm on lo here (" << (env).why() << ")");       \
  } while (0)
