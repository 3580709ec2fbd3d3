// Shared endpoint groups (WEFT_FABRIC_SHARED_EP=1), over tcp;ofi_rxm on loopback with connections to this process
// itself: liveness probes are per peer address (many stalled comms to one peer process send one probe per
// WEFT_PROBE_INTERVAL between them, not one each), and finalizing a context releases its groups.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <vector>

#include "fabric/fabric_backend.h"
#include "fabric/fabric_endpoint.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"
#include "weft/nccl/net.h"

using namespace weft;
using namespace weft::fabric;

TEST_CASE("stalled comms to one peer share its liveness probes", "[fabric][liveness]") {
  setenv("WEFT_PROVIDER", "tcp;ofi_rxm", 1);
  setenv("WEFT_IFACE", "lo", 1);
  setenv("WEFT_FABRIC_SHARED_EP", "1", 1);
  setenv("WEFT_PROBE_INTERVAL", "50", 1);
  params::reload();
  std::string why;
  auto backend = FabricBackend::discover(&why);
  if (!backend) {
    WARN("skipped: no tcp;ofi_rxm on lo here (" << why << ")");
    return;
  }
  constexpr int kComms = 32;
  const int64_t endpoints0 = Endpoint::openCount();
  int scope = 0;  // stands for one NCCL context: every comm below shares its endpoint group
  CommConfig cfg{};
  cfg.scope = &scope;
  std::vector<std::unique_ptr<ListenComm>> listens;
  std::vector<std::vector<uint8_t>> handles;
  std::vector<SendComm*> sends(kComms, nullptr);
  std::vector<RecvComm*> recvs(kComms, nullptr);
  for (int i = 0; i < kComms; ++i) {
    handles.emplace_back(kHandleSize);
    ListenComm* lc = nullptr;
    REQUIRE(backend->listen(0, cfg, handles.back().data(), &lc) == Status::kOk);
    listens.emplace_back(lc);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < kComms; ++i) {
    while ((sends[i] == nullptr || recvs[i] == nullptr) && std::chrono::steady_clock::now() < deadline) {
      if (sends[i] == nullptr) REQUIRE(backend->connect(0, cfg, handles[i].data(), &sends[i]) == Status::kOk);
      if (recvs[i] == nullptr) REQUIRE(listens[i]->accept(&recvs[i]) == Status::kOk);
    }
    REQUIRE(sends[i] != nullptr);
    REQUIRE(recvs[i] != nullptr);
  }
  REQUIRE(Endpoint::openCount() == endpoints0 + 1);  // one rail, one shared endpoint for all of them

  // Every receive comm waits for a message that never comes: all of them are stalled, all toward one peer.
  std::vector<uint8_t> buf(4096 * kComms);
  std::vector<MemHandle*> mhs(kComms, nullptr);
  std::vector<Request*> reqs(kComms, nullptr);
  for (int i = 0; i < kComms; ++i) {
    REQUIRE(recvs[i]->regMr(buf.data() + 4096 * i, 4096, NCCL_PTR_HOST, &mhs[i]) == Status::kOk);
    void* data[1] = {buf.data() + 4096 * i};
    size_t sizes[1] = {4096};
    int tags[1] = {i};
    REQUIRE(recvs[i]->irecv(1, data, sizes, tags, &mhs[i], false, &reqs[i]) == Status::kOk);
    REQUIRE(reqs[i] != nullptr);
  }
  const int64_t probes0 = Endpoint::probesSent();
  auto t0 = std::chrono::steady_clock::now();
  // Until a few probes went out (each comm looks at its peer once per 1024 of its test calls).
  deadline = t0 + std::chrono::seconds(30);
  while (Endpoint::probesSent() - probes0 < 4 && std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < kComms; ++i) {
      bool done = false;
      REQUIRE(reqs[i]->test(&done, nullptr) == Status::kOk);  // the peer is alive: no failure
      REQUIRE_FALSE(done);
    }
  }
  const double elapsedMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int64_t sent = Endpoint::probesSent() - probes0;
  INFO(sent << " probes in " << elapsedMs << " ms by " << kComms << " stalled comms");
  CHECK(sent >= 4);
  // One peer address: at most one probe per interval (the first once the stall is an interval old), whatever the
  // number of comms. Per-comm probes would send kComms per interval.
  CHECK(sent <= static_cast<int64_t>(elapsedMs / 50.0) + 1);

  for (int i = 0; i < kComms; ++i) {
    CHECK(recvs[i]->deregMr(mhs[i]) == Status::kOk);
    recvs[i]->close();  // canceled receives park the comm until the provider reports them
    sends[i]->close();
  }
  listens.clear();
  for (const char* v : {"WEFT_PROVIDER", "WEFT_IFACE", "WEFT_FABRIC_SHARED_EP", "WEFT_PROBE_INTERVAL"}) unsetenv(v);
  params::reload();
}

TEST_CASE("finalizing a context releases its endpoint groups", "[fabric][shared]") {
  setenv("WEFT_PROVIDER", "tcp;ofi_rxm", 1);
  setenv("WEFT_IFACE", "lo", 1);
  setenv("WEFT_FABRIC_SHARED_EP", "1", 1);
  params::reload();
  std::string why;
  auto backend = FabricBackend::discover(&why);
  if (!backend) {
    WARN("skipped: no tcp;ofi_rxm on lo here (" << why << ")");
    return;
  }
  const int64_t endpoints0 = Endpoint::openCount();
  int scope = 0;
  CommConfig cfg{};
  cfg.scope = &scope;
  uint8_t h1[kHandleSize], h2[kHandleSize], h3[kHandleSize];
  ListenComm *a = nullptr, *b = nullptr, *c = nullptr;
  REQUIRE(backend->listen(0, cfg, h1, &a) == Status::kOk);
  REQUIRE(backend->listen(0, cfg, h2, &b) == Status::kOk);
  CHECK(Endpoint::openCount() == endpoints0 + 1);  // one context, one device: one group
  // NCCL finalizes the context (here with a listen still open, which keeps its group until it closes); a later
  // context at the same address gets a group of its own.
  backend->releaseScope(&scope);
  REQUIRE(backend->listen(0, cfg, h3, &c) == Status::kOk);
  CHECK(Endpoint::openCount() == endpoints0 + 2);
  delete a;
  delete b;
  CHECK(Endpoint::openCount() == endpoints0 + 1);  // the released group closed with its last listen
  delete c;
  CHECK(Endpoint::openCount() == endpoints0);
  for (const char* v : {"WEFT_PROVIDER", "WEFT_IFACE", "WEFT_FABRIC_SHARED_EP"}) unsetenv(v);
  params::reload();
}
