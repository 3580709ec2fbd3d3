// A peer of another handshake version (an older weft on some node) gets a clean refusal naming both versions, and
// the listen goes on waiting for its legitimate peer. The old peer is played by a raw libfabric endpoint sending
// handshake version 3's request over tcp;ofi_rxm on loopback.
#include <catch2/catch.hpp>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "fabric/fabric_backend.h"
#include "fabric_test_env.h"
#include "raw_peer.h"
#include "fabric/wire.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"

using namespace weft;
using namespace weft::fabric;
using weft::testing::RawPeer;

namespace {

struct Bufs {
  wire::ConnectRequestV3 request{};
  wire::ConnectReply reply{};
};

}  // namespace

TEST_CASE("a peer speaking handshake version 3 is refused naming both versions, and the listen stays open",
          "[fabric][handshake]") {
  weft::testing::FabricTestEnv env;
  WEFT_REQUIRE_FABRIC(env);
  FabricBackend* backend = env.backend();
  std::string why;
  uint8_t handle[kHandleSize];
  ListenComm* lcRaw = nullptr;
  REQUIRE(backend->listen(0, CommConfig{}, handle, &lcRaw) == Status::kOk);
  std::unique_ptr<ListenComm> lc(lcRaw);
  WireHandle h;
  REQUIRE(WireHandle::decode(handle, &h, &why) == Status::kOk);

  RawPeer old;
  REQUIRE(old.open());
  auto bufs = std::make_unique<Bufs>();
  void* desc = nullptr;
  if ((old.info->domain_attr->mr_mode & FI_MR_LOCAL) != 0) {
    REQUIRE(fi_mr_reg(old.domain, bufs.get(), sizeof(Bufs), FI_SEND | FI_RECV, 0, 0, 0, &old.mr, nullptr) == 0);
    desc = fi_mr_desc(old.mr);
  }
  fi_addr_t listener = FI_ADDR_UNSPEC;
  REQUIRE(fi_av_insert(old.av, h.addr.data(), 1, &listener, 0, nullptr) == 1);
  // Version 3's request: its own layout, its own tags (which version 4 kept for exactly this).
  wire::ConnectRequestV3& r = bufs->request;
  r.magic = wire::ConnectRequest::kMagic;
  r.version = 3;
  r.token = h.token;
  r.rails.count = 1;
  size_t nameLen = sizeof(r.addr);
  REQUIRE(fi_getname(&old.ep->fid, r.addr, &nameLen) == 0);
  r.addrLen = static_cast<uint16_t>(nameLen);
  fi_context2 recvCtx{}, sendCtx{};
  REQUIRE(fi_trecv(old.ep, &bufs->reply, sizeof(bufs->reply), desc, FI_ADDR_UNSPEC,
                   wire::ctrlTag(wire::CtrlKind::kConnReply), 0, &recvCtx) == 0);
  ssize_t rc;
  do {
    rc = fi_tsend(old.ep, &r, offsetof(wire::ConnectRequestV3, addr) + r.addrLen, desc, listener,
                  wire::ctrlTag(wire::CtrlKind::kConnRequest), &sendCtx);
    if (rc == -FI_EAGAIN) {
      RecvComm* none = nullptr;
      REQUIRE(lc->accept(&none) == Status::kOk);
      fi_cq_tagged_entry e[4];
      fi_cq_read(old.cq, e, 4);
    }
  } while (rc == -FI_EAGAIN);
  REQUIRE(rc == 0);

  bool replied = false, connected = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!replied && std::chrono::steady_clock::now() < deadline) {
    RecvComm* rcomm = nullptr;
    REQUIRE(lc->accept(&rcomm) == Status::kOk);
    connected = connected || rcomm != nullptr;
    fi_cq_tagged_entry e[4];
    ssize_t n = fi_cq_read(old.cq, e, 4);
    for (ssize_t i = 0; i < n; ++i) replied = replied || e[i].op_context == &recvCtx;
  }
  REQUIRE(replied);
  CHECK_FALSE(connected);  // the old peer never got a connection
  CHECK(bufs->reply.magic == wire::ConnectReply::kMagic);
  CHECK(bufs->reply.status == wire::kBadVersion);
  CHECK(bufs->reply.version == wire::ConnectRequest::kVersion);  // the refusal says which version this end speaks
  CHECK(bufs->reply.token == h.token);

  // The listen still waits for its legitimate peer, which connects as usual.
  CommConfig cfg{};
  SendComm* sc = nullptr;
  RecvComm* rcv = nullptr;
  CHECK(env.connect(lc.get(), cfg, handle, &sc, &rcv));
  delete sc;
  delete rcv;
  lc.reset();
}
