// SPDX-License-Identifier: Apache-2.0
// A peer of another handshake version (an older weft on some node) gets a clean refusal naming both versions, and
// the listen goes on waiting for its legitimate peer; a peer whose tuner would decide differently is refused
// naming both digests. The other peer is played by a raw libfabric endpoint sending its request over tcp;ofi_rxm on
// loopback.
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
#include "weft/transport/agreement.h"
#include "weft/transport/handle.h"

using namespace weft;
using namespace weft::fabric;
using weft::testing::RawPeer;
using weft::transport::Agreement;
using weft::transport::setAgreementSource;

namespace {

struct Bufs {
  uint8_t request[sizeof(wire::ConnectRequest) + 64] = {};
  wire::ConnectReply reply{};
};

// An older (or differently tuned) weft, played by a raw endpoint: sends `len` bytes of request from bufs->request
// (its address filled in at addrAt), with its reply receive posted under replyTag for replyCap bytes; drives
// accept until the reply came. *replyLen: what arrived; *acceptSt: the first accept status that was not kOk.
struct Exchange {
  bool replied = false;
  bool connected = false;
  size_t replyLen = 0;
  Status acceptSt = Status::kOk;
};

Exchange exchange(ListenComm* lc, RawPeer& peer, Bufs* bufs, fi_addr_t listener, size_t addrAt, uint16_t* addrLen,
                  size_t baseLen, uint64_t replyTag, size_t replyCap) {
  Exchange x;
  void* desc = nullptr;
  if ((peer.info->domain_attr->mr_mode & FI_MR_LOCAL) != 0) {
    REQUIRE(fi_mr_reg(peer.domain, bufs, sizeof(Bufs), FI_SEND | FI_RECV, 0, 0, 0, &peer.mr, nullptr) == 0);
    desc = fi_mr_desc(peer.mr);
  }
  size_t nameLen = sizeof(bufs->request) - addrAt;
  REQUIRE(fi_getname(&peer.ep->fid, bufs->request + addrAt, &nameLen) == 0);
  *addrLen = static_cast<uint16_t>(nameLen);
  fi_context2 recvCtx{}, sendCtx{};
  REQUIRE(fi_trecv(peer.ep, &bufs->reply, replyCap, desc, FI_ADDR_UNSPEC, replyTag, 0, &recvCtx) == 0);
  ssize_t rc;
  do {
    rc = fi_tsend(peer.ep, bufs->request, baseLen + nameLen, desc, listener,
                  wire::ctrlTag(wire::CtrlKind::kConnRequest), &sendCtx);
    if (rc == -FI_EAGAIN) {
      RecvComm* none = nullptr;
      REQUIRE(lc->accept(&none) == Status::kOk);
      fi_cq_tagged_entry e[4];
      fi_cq_read(peer.cq, e, 4);
    }
  } while (rc == -FI_EAGAIN);
  REQUIRE(rc == 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!x.replied && std::chrono::steady_clock::now() < deadline) {
    RecvComm* rcomm = nullptr;
    Status st = lc->accept(&rcomm);
    if (st != Status::kOk && x.acceptSt == Status::kOk) x.acceptSt = st;
    x.connected = x.connected || rcomm != nullptr;
    fi_cq_tagged_entry e[4];
    ssize_t n = fi_cq_read(peer.cq, e, 4);
    for (ssize_t i = 0; i < n; ++i) {
      if (e[i].op_context == &recvCtx) x.replied = true, x.replyLen = e[i].len;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(peer.cq, &err, 0);
      FAIL("the old peer's receive failed: " << fi_strerror(err.err));
    }
  }
  return x;
}

Agreement digestA() { return Agreement{0xAAAAAAAAAAAAAAAAull, "test digest A"}; }

// A listen of weft's, and a raw peer that can reach it.
struct Setup {
  uint8_t handle[kHandleSize] = {};
  std::unique_ptr<ListenComm> lc;
  WireHandle h;
  RawPeer peer;
  std::unique_ptr<Bufs> bufs = std::make_unique<Bufs>();
  fi_addr_t listener = FI_ADDR_UNSPEC;
  explicit Setup(FabricBackend* backend) {
    std::string why;
    ListenComm* lcRaw = nullptr;
    REQUIRE(backend->listen(0, CommConfig{}, handle, &lcRaw) == Status::kOk);
    lc.reset(lcRaw);
    REQUIRE(WireHandle::decode(handle, &h, &why) == Status::kOk);
    REQUIRE(peer.open());
    REQUIRE(fi_av_insert(peer.av, h.addr.data(), 1, &listener, 0, nullptr) == 1);
  }
  template <typename Request>
  Request* request(uint16_t version) {
    auto* r = reinterpret_cast<Request*>(bufs->request);
    r->magic = wire::ConnectRequest::kMagic;
    r->version = version;
    r->token = h.token;
    r->rails.count = 1;
    return r;
  }
  template <typename Request>
  Exchange send(Request* r, uint64_t replyTag, size_t replyCap) {
    return exchange(lc.get(), peer, bufs.get(), listener, offsetof(Request, addr), &r->addrLen,
                    offsetof(Request, addr), replyTag, replyCap);
  }
};

}  // namespace

TEST_CASE("a peer speaking handshake version 3 is refused naming both versions, and the listen stays open",
          "[fabric][handshake]") {
  weft::testing::FabricTestEnv env;
  WEFT_REQUIRE_FABRIC(env);
  Setup t(env.backend());
  // Version 3's request: its own layout, its own tags (which version 4 kept for exactly this).
  auto* r = t.request<wire::ConnectRequestV3>(3);
  Exchange x = t.send(r, wire::ctrlTag(wire::CtrlKind::kConnReply), sizeof(t.bufs->reply));
  REQUIRE(x.replied);
  CHECK_FALSE(x.connected);  // the old peer never got a connection
  CHECK(x.replyLen == wire::kReplyBytesV4);  // its own layout
  CHECK(t.bufs->reply.magic == wire::ConnectReply::kMagic);
  CHECK(t.bufs->reply.status == wire::kBadVersion);
  CHECK(t.bufs->reply.version == wire::ConnectRequest::kVersion);  // the refusal says which version this end speaks
  CHECK(t.bufs->reply.token == t.h.token);

  // The listen still waits for its legitimate peer, which connects as usual.
  SendComm* sc = nullptr;
  RecvComm* rcv = nullptr;
  CHECK(env.connect(t.lc.get(), CommConfig{}, t.handle, &sc, &rcv));
  delete sc;
  delete rcv;
}

TEST_CASE("a peer speaking handshake version 4 gets its refusal in its own layout, under its comm id",
          "[fabric][handshake]") {
  weft::testing::FabricTestEnv env;
  WEFT_REQUIRE_FABRIC(env);
  Setup t(env.backend());
  auto* r = t.request<wire::ConnectRequestV4>(4);
  r->listenId = t.h.listenId;
  r->commId = 4242;
  // Version 4 posted its reply receive for exactly its reply, tagged with its comm id: a longer reply would be an
  // error there, not a refusal it can read.
  Exchange x = t.send(r, wire::ctrlTag(wire::CtrlKind::kConnReply, 4242), wire::kReplyBytesV4);
  REQUIRE(x.replied);
  CHECK_FALSE(x.connected);
  CHECK(x.replyLen == wire::kReplyBytesV4);
  CHECK(t.bufs->reply.status == wire::kBadVersion);
  CHECK(t.bufs->reply.version == wire::ConnectRequest::kVersion);
}

TEST_CASE("a peer speaking handshake version 5 (four rails) gets its refusal in its own layout, under its comm id",
          "[fabric][handshake]") {
  weft::testing::FabricTestEnv env;
  WEFT_REQUIRE_FABRIC(env);
  Setup t(env.backend());
  auto* r = t.request<wire::ConnectRequestV5>(5);
  r->listenId = t.h.listenId;
  r->commId = 5151;
  // Version 5's reply receive is its own ConnectReply: four rails, then the digest.
  Exchange x = t.send(r, wire::ctrlTag(wire::CtrlKind::kConnReply, 5151), wire::kReplyBytesV5);
  REQUIRE(x.replied);
  CHECK_FALSE(x.connected);
  CHECK(x.replyLen == wire::kReplyBytesV5);
  CHECK(t.bufs->reply.magic == wire::ConnectReply::kMagic);
  CHECK(t.bufs->reply.status == wire::kBadVersion);
  CHECK(t.bufs->reply.version == wire::ConnectRequest::kVersion);
  CHECK(t.bufs->reply.token == t.h.token);
}

TEST_CASE("a peer whose tuner would decide differently is refused naming both digests, and accept fails",
          "[fabric][handshake][agreement]") {
  weft::testing::FabricTestEnv env;
  WEFT_REQUIRE_FABRIC(env);
  setAgreementSource(&digestA);  // this process: digest A
  Setup t(env.backend());
  auto* r = t.request<wire::ConnectRequest>(wire::ConnectRequest::kVersion);
  r->listenId = t.h.listenId;
  r->commId = 99;
  r->tunerDigest = 0xBBBBBBBBBBBBBBBBull;
  Exchange x = t.send(r, wire::ctrlTag(wire::CtrlKind::kConnReply, 99), sizeof(wire::ConnectReply));
  setAgreementSource(nullptr);
  REQUIRE(x.replied);
  CHECK_FALSE(x.connected);
  CHECK(x.acceptSt == Status::kInvalidUsage);  // NCCL's init fails here instead of hanging later
  CHECK(x.replyLen == sizeof(wire::ConnectReply));
  CHECK(t.bufs->reply.status == wire::kTunerMismatch);
  CHECK(t.bufs->reply.tunerDigest == 0xAAAAAAAAAAAAAAAAull);  // the connector names this end's digest
}
