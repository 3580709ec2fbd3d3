// SPDX-License-Identifier: Apache-2.0
// Shared endpoint groups (WEFT_FABRIC_SHARED_EP=1), over tcp;ofi_rxm on loopback with connections to this process
// itself: liveness probes are per peer address (many stalled comms to one peer process send one probe per
// WEFT_PROBE_INTERVAL between them, not one each), finalizing a context releases its groups, and a hostile
// message naming one comm disturbs no other, and the data path never waits for a group another thread holds.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <memory>
#include <vector>

#include "fabric/fabric_backend.h"
#include "fabric/fabric_comm.h"
#include "fabric/wire.h"
#include "fabric_test_env.h"
#include "raw_peer.h"
#include "fabric/fabric_endpoint.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"
#include "weft/nccl/net.h"

using namespace weft;
using namespace weft::fabric;

TEST_CASE("stalled comms to one peer share its liveness probes", "[fabric][liveness]") {
  weft::testing::FabricTestEnv env{{"WEFT_FABRIC_SHARED_EP", "1"}, {"WEFT_PROBE_INTERVAL", "50"}};
  WEFT_REQUIRE_FABRIC(env);
  FabricBackend* backend = env.backend();
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
  for (int i = 0; i < kComms; ++i) {
    REQUIRE(env.connect(listens[i].get(), cfg, handles[i].data(), &sends[i], &recvs[i]));
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
  auto deadline = t0 + std::chrono::seconds(30);
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
}

TEST_CASE("finalizing a context releases its endpoint groups", "[fabric][shared]") {
  weft::testing::FabricTestEnv env{{"WEFT_FABRIC_SHARED_EP", "1"}};
  WEFT_REQUIRE_FABRIC(env);
  FabricBackend* backend = env.backend();
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
}

namespace {

// Moves one message of `size` bytes over a connected pair, both ends polled here; true when it arrived intact.
// The buffers live in `arena` (beyond the comms' close: a receive that never completed is still posted).
bool transfer(SendComm* s, RecvComm* r, size_t size, int seed, Status* sendErr,
              std::deque<std::vector<uint8_t>>& arena) {
  std::vector<uint8_t>& out = arena.emplace_back(size);
  std::vector<uint8_t>& in = arena.emplace_back(size, 0);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(i * 31 + seed);
  MemHandle *ms = nullptr, *mr = nullptr;
  if (s->regMr(out.data(), size, NCCL_PTR_HOST, &ms) != Status::kOk) return false;
  if (r->regMr(in.data(), size, NCCL_PTR_HOST, &mr) != Status::kOk) return false;
  Request *rs = nullptr, *rr = nullptr;
  void* data[1] = {in.data()};
  size_t sizes[1] = {size};
  int tags[1] = {seed};
  bool ok = r->irecv(1, data, sizes, tags, &mr, false, &rr) == Status::kOk && rr != nullptr;
  bool sdone = false, rdone = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ok && !(sdone && rdone) && std::chrono::steady_clock::now() < deadline) {
    if (rs == nullptr) {
      *sendErr = s->isend(out.data(), size, seed, ms, &rs);
      if (*sendErr != Status::kOk) break;
    }
    if (rs != nullptr && !sdone && (*sendErr = rs->test(&sdone, nullptr)) != Status::kOk) break;
    int got = 0;
    if (!rdone && rr->test(&rdone, &got) != Status::kOk) ok = false;
  }
  bool intact = ok && sdone && rdone && *sendErr == Status::kOk && in == out;
  if (sdone) s->deregMr(ms);
  if (rdone) r->deregMr(mr);  // else still posted: deregistered with the comm
  return intact;
}

// Connects sends.size() pairs of comms in this process through `cfg` (one listen each); `handle` is left holding
// the last listen's.
void connectPairs(weft::testing::FabricTestEnv& env, const CommConfig& cfg, std::vector<SendComm*>* sends,
                  std::vector<RecvComm*>* recvs, uint8_t* handle) {
  for (size_t i = 0; i < sends->size(); ++i) {
    ListenComm* lcRaw = nullptr;
    REQUIRE(env.backend()->listen(0, cfg, handle, &lcRaw) == Status::kOk);
    std::unique_ptr<ListenComm> lc(lcRaw);
    REQUIRE(env.connect(lc.get(), cfg, handle, &(*sends)[i], &(*recvs)[i]));
  }
}

}  // namespace

TEST_CASE("a hostile message naming one comm of a shared endpoint disturbs no other", "[fabric][shared]") {
  // rdma: send comms take buffer offers, routed by the comm id in their body
  weft::testing::FabricTestEnv env{{"WEFT_FABRIC_SHARED_EP", "1"}, {"WEFT_PROTOCOL", "rdma"}};
  WEFT_REQUIRE_FABRIC(env);
  std::string why;
  std::deque<std::vector<uint8_t>> arena;  // outlives the comms (declared before them)
  int scope = 0;
  CommConfig cfg{};
  cfg.scope = &scope;
  constexpr int kPairs = 3;  // 0: the target, 1 and 2: bystanders
  std::vector<SendComm*> sends(kPairs, nullptr);
  std::vector<RecvComm*> recvs(kPairs, nullptr);
  uint8_t handle[kHandleSize];
  connectPairs(env, cfg, &sends, &recvs, handle);
  Status err = Status::kOk;
  for (int i = 0; i < kPairs; ++i) REQUIRE(transfer(sends[i], recvs[i], 65536, 10 + i, &err, arena));

  // Another process sends the shared endpoint a malformed buffer offer naming the target's id (in the body, where
  // offers name their comm), and one naming an id no comm has.
  WireHandle h;
  REQUIRE(WireHandle::decode(handle, &h, &why) == Status::kOk);
  weft::testing::RawPeer hostile;
  REQUIRE(hostile.open());
  auto junk = std::make_unique<uint8_t[]>(512);  // one 256-byte message per id
  for (int i = 0; i < 512; ++i) junk[i] = static_cast<uint8_t>(0xA5 ^ i);
  void* desc = nullptr;
  if ((hostile.info->domain_attr->mr_mode & FI_MR_LOCAL) != 0) {
    REQUIRE(fi_mr_reg(hostile.domain, junk.get(), 512, FI_SEND, 0, 0, 0, &hostile.mr, nullptr) == 0);
    desc = fi_mr_desc(hostile.mr);
  }
  fi_addr_t target = FI_ADDR_UNSPEC;
  REQUIRE(fi_av_insert(hostile.av, h.addr.data(), 1, &target, 0, nullptr) == 1);
  const uint32_t victim = dynamic_cast<FabricSendComm*>(sends[0])->commId();
  const uint32_t nobody = wire::kMaxCommId;
  fi_context2 ctx[2]{};
  int sent = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (uint32_t id : {victim, nobody}) {
    uint8_t* msg = junk.get() + 256 * sent;
    std::memcpy(msg + offsetof(wire::OfferMsg, toComm), &id, sizeof(id));
    ssize_t rc;
    do {
      rc = fi_tsend(hostile.ep, msg, 96, desc, target, wire::ctrlTag(wire::CtrlKind::kOffer), &ctx[sent]);
      if (rc == -FI_EAGAIN) {  // rxm connects while both sides make progress
        fi_cq_tagged_entry e[4];
        fi_cq_read(hostile.cq, e, 4);
        Status ignored;
        transfer(sends[1], recvs[1], 64, 1, &ignored, arena);
      }
    } while (rc == -FI_EAGAIN && std::chrono::steady_clock::now() < deadline);
    REQUIRE(rc == 0);
    ++sent;
  }
  int completed = 0;
  while (completed < sent && std::chrono::steady_clock::now() < deadline) {
    fi_cq_tagged_entry e[4];
    ssize_t n = fi_cq_read(hostile.cq, e, 4);
    if (n > 0) completed += static_cast<int>(n);
  }
  REQUIRE(completed == sent);

  // The bystanders go on carrying intact data (and drive the shared endpoint, which delivers the junk); the
  // target's connection is closed for safety, its sends failing from then on.
  Status victimErr = Status::kOk;
  for (int round = 0; round < 3; ++round) {
    CHECK(transfer(sends[1], recvs[1], 65536, 20 + round, &err, arena));
    CHECK(transfer(sends[2], recvs[2], 4096, 30 + round, &err, arena));
  }
  CHECK_FALSE(transfer(sends[0], recvs[0], 65536, 40, &victimErr, arena));
  CHECK(victimErr != Status::kOk);

  for (int i = 0; i < kPairs; ++i) {
    sends[i]->close();
    recvs[i]->close();
  }
}

// shm keeps posted receives and messages that came before their receive in one set of 1,024 entries, and handles
// messages in arrival order (Endpoint::dataRecvRoom). More receives than that, posted in the reverse order of the
// sends, deadlocked it: now receives past the endpoint's budget only claim messages already there.
TEST_CASE("shm: receives posted past the endpoint's budget, in the reverse order of the sends, all complete",
          "[fabric][shared][shm]") {
  weft::testing::FabricTestEnv env{{"WEFT_FABRIC_SHARED_EP", "1"}, {"WEFT_PROVIDER", "shm"}, {"WEFT_IFACE", ""},
                                   {"WEFT_PROTOCOL", "sendrecv"}};
  WEFT_REQUIRE_FABRIC(env);
  int scope = 0;
  CommConfig cfg{};
  cfg.scope = &scope;
  constexpr int kPairs = 1200;  // past the budget (224) and past shm's 1,024 entries
  constexpr size_t kSize = 256;
  std::vector<SendComm*> sends(kPairs, nullptr);
  std::vector<RecvComm*> recvs(kPairs, nullptr);
  uint8_t handle[kHandleSize];
  connectPairs(env, cfg, &sends, &recvs, handle);
  Endpoint& ep = dynamic_cast<FabricRecvComm*>(recvs[0])->group().rail(0);
  REQUIRE(&ep == &dynamic_cast<FabricSendComm*>(sends[0])->group().rail(0));  // one endpoint: sends to itself
  std::vector<uint8_t> out(kSize * kPairs), in(kSize * kPairs, 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + i / kSize);
  std::vector<MemHandle*> ms(kPairs, nullptr), mr(kPairs, nullptr);
  std::vector<Request*> rs(kPairs, nullptr), rr(kPairs, nullptr);
  for (int i = 0; i < kPairs; ++i) {
    REQUIRE(sends[i]->regMr(out.data() + i * kSize, kSize, NCCL_PTR_HOST, &ms[i]) == Status::kOk);
    REQUIRE(recvs[i]->regMr(in.data() + i * kSize, kSize, NCCL_PTR_HOST, &mr[i]) == Status::kOk);
  }
  auto postRecv = [&](int i) {
    void* data[1] = {in.data() + i * kSize};
    size_t sizes[1] = {kSize};
    int tags[1] = {1};
    return recvs[i]->irecv(1, data, sizes, tags, &mr[i], false, &rr[i]);
  };
  for (int i = kPairs - 1; i >= 0; --i) REQUIRE(postRecv(i) == Status::kOk);  // all first, the last first
  std::vector<bool> sdone(kPairs, false), rdone(kPairs, false);
  int left = 2 * kPairs;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < kPairs; ++i) {
      if (rs[i] == nullptr) {
        REQUIRE(sends[i]->isend(out.data() + i * kSize, kSize, 1, ms[i], &rs[i]) == Status::kOk);
      } else if (!sdone[i]) {
        bool d = false;
        REQUIRE(rs[i]->test(&d, nullptr) == Status::kOk);
        if (d) sdone[i] = true, --left;
      }
      if (rr[i] == nullptr) {
        REQUIRE(postRecv(i) == Status::kOk);
      } else if (!rdone[i]) {
        bool d = false;
        int got = 0;
        REQUIRE(rr[i]->test(&d, &got) == Status::kOk);
        if (d) {
          rdone[i] = true, --left;
          CHECK(got == static_cast<int>(kSize));
        }
      }
    }
  }
  REQUIRE(left == 0);
  CHECK(in == out);
  CHECK(ep.dataRecvs() == 0);  // every receive posted was accounted back: the budget does not leak
  for (int i = 0; i < kPairs; ++i) {
    sends[i]->deregMr(ms[i]);
    recvs[i]->deregMr(mr[i]);
    sends[i]->close();
    recvs[i]->close();
  }
}

TEST_CASE("the data path never waits for a shared group another thread holds", "[fabric][shared]") {
  weft::testing::FabricTestEnv env{{"WEFT_FABRIC_SHARED_EP", "1"}};
  WEFT_REQUIRE_FABRIC(env);
  FabricBackend* backend = env.backend();
  std::deque<std::vector<uint8_t>> arena;
  int scope = 0;
  CommConfig cfg{};
  cfg.scope = &scope;
  uint8_t handle[kHandleSize];
  ListenComm* lcRaw = nullptr;
  REQUIRE(backend->listen(0, cfg, handle, &lcRaw) == Status::kOk);
  std::unique_ptr<ListenComm> lc(lcRaw);
  SendComm* s = nullptr;
  RecvComm* r = nullptr;
  REQUIRE(env.connect(lc.get(), cfg, handle, &s, &r));
  Status err = Status::kOk;
  REQUIRE(transfer(s, r, 4096, 1, &err, arena));

  std::vector<uint8_t>& buf = arena.emplace_back(4096);
  MemHandle *ms = nullptr, *mr = nullptr;
  REQUIRE(s->regMr(buf.data(), buf.size(), NCCL_PTR_HOST, &ms) == Status::kOk);
  REQUIRE(r->regMr(buf.data(), buf.size(), NCCL_PTR_HOST, &mr) == Status::kOk);
  Request* pending = nullptr;  // a receive posted before the group is taken
  void* data[1] = {buf.data()};
  size_t sizes[1] = {buf.size()};
  int tags[1] = {7};
  REQUIRE(r->irecv(1, data, sizes, tags, &mr, false, &pending) == Status::kOk);
  REQUIRE(pending != nullptr);

  // Another thread (NCCL's service thread in a handshake step or a close) holds the group: every data-path call
  // returns at once, backing off (a call that waited would never return while the holder waits for it).
  EndpointGroup& group = dynamic_cast<FabricSendComm*>(s)->group();
  std::promise<void> held, release;
  std::thread holder([&] {
    std::lock_guard<std::mutex> l(group.mutex());
    held.set_value();
    release.get_future().wait();
  });
  held.get_future().wait();
  auto calls = std::async(std::launch::async, [&] {
    Request *rs = nullptr, *rr = nullptr;
    bool done = true;
    const bool sendBacksOff = s->isend(buf.data(), buf.size(), 7, ms, &rs) == Status::kOk && rs == nullptr;
    const bool recvBacksOff = r->irecv(1, data, sizes, tags, &mr, false, &rr) == Status::kOk && rr == nullptr;
    const bool testNotDone = pending->test(&done, nullptr) == Status::kOk && !done;
    return sendBacksOff && recvBacksOff && testNotDone;
  });
  const bool returned = calls.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  release.set_value();
  holder.join();
  REQUIRE(returned);
  CHECK(calls.get());

  // Free again: the same calls go through, and the message arrives.
  Request* rs = nullptr;
  bool sdone = false, rdone = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!(sdone && rdone) && std::chrono::steady_clock::now() < deadline) {
    if (rs == nullptr) REQUIRE(s->isend(buf.data(), buf.size(), 7, ms, &rs) == Status::kOk);
    if (rs != nullptr && !sdone) REQUIRE(rs->test(&sdone, nullptr) == Status::kOk);
    if (!rdone) REQUIRE(pending->test(&rdone, nullptr) == Status::kOk);
  }
  CHECK(sdone);
  CHECK(rdone);
  s->deregMr(ms);
  r->deregMr(mr);
  s->close();
  r->close();
  lc.reset();
}

TEST_CASE("without a context (tables before v11), comms are grouped by the thread that sets them up",
          "[fabric][shared]") {
  weft::testing::FabricTestEnv env{{"WEFT_FABRIC_SHARED_EP", "1"}};
  WEFT_REQUIRE_FABRIC(env);
  FabricBackend* backend = env.backend();
  const int64_t endpoints0 = Endpoint::openCount();
  CommConfig none{};  // scope nullptr, as listen_v7 passes
  uint8_t h1[kHandleSize], h2[kHandleSize], h3[kHandleSize];
  ListenComm *a = nullptr, *b = nullptr, *c = nullptr;
  REQUIRE(backend->listen(0, none, h1, &a) == Status::kOk);
  REQUIRE(backend->listen(0, none, h2, &b) == Status::kOk);
  CHECK(Endpoint::openCount() == endpoints0 + 1);  // one (service) thread: one group
  Status other = Status::kInternal;
  std::thread([&] { other = backend->listen(0, none, h3, &c); }).join();  // another communicator's thread
  REQUIRE(other == Status::kOk);
  CHECK(Endpoint::openCount() == endpoints0 + 2);
  delete a;
  delete b;
  delete c;
  CHECK(Endpoint::openCount() == endpoints0);
}
