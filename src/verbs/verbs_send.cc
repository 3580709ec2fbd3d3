// SPDX-License-Identifier: Apache-2.0
// The verbs send comm: buffer offers from the receiver, RDMA writes with immediate data into them.
#include "verbs/verbs_comm.h"

#include "weft/nccl/net.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <ctime>

#include "weft/common/clock.h"
#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/transport/agreement.h"
#include "weft/transport/handle.h"

namespace weft::verbs {

// ---- send ------------------------------------------------------------------------------------------------------

VerbsSendComm::VerbsSendComm(std::unique_ptr<QpSet> qps, std::string peerName, int maxRecvs)
    : CommAdaptor(std::move(qps), std::move(peerName), kMaxRequests * maxRecvs) {}

VerbsSendComm::~VerbsSendComm() {
  q_.reset();
  if (offersMr_ != nullptr) ibv().deregMr(offersMr_);
}

Status VerbsSendComm::start() {
  offers_ = numa::makeArray<VerbsOfferMsg>(kOfferRecvs, pool_.node());
  if (!offers_) return Status::kSystem;
  offersMr_ = registerLocal(offers_.get(), sizeof(VerbsOfferMsg) * kOfferRecvs, "offer buffers");
  if (offersMr_ == nullptr) return Status::kSystem;
  for (int i = 0; i < kOfferRecvs; ++i) {
    if (!postOfferRecv(i)) return Status::kSystem;
  }
  return Status::kOk;
}

bool VerbsSendComm::postOfferRecv(int i) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(&offers_[i]), sizeof(VerbsOfferMsg), offersMr_->lkey};
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = wrId(kOfferRecv, static_cast<uint32_t>(i));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (int rc = ibv_post_recv(q_->qps[0], &wr, &bad)) {
    WEFT_WARN("posting an offer receive on {} failed: {}", dev_.props().name, std::strerror(rc));
    fail(Status::kSystem);
    return false;
  }
  return true;
}

void VerbsSendComm::onCompletion(const ibv_wc& wc) {
  const uint64_t kind = wc.wr_id >> 32;
  const uint32_t idx = static_cast<uint32_t>(wc.wr_id);
  switch (kind) {
    case kOfferRecv: {
      const VerbsOfferMsg& m = offers_[idx];
      if (wc.byte_len < VerbsOfferMsg::bytes(1) || m.magic != VerbsOfferMsg::kMagic || m.count < 1 ||
          m.count > kMaxRecvs || wc.byte_len < VerbsOfferMsg::bytes(static_cast<int>(m.count))) {
        WEFT_WARN("peer {} on {} sent a malformed buffer offer: connection closed for safety", peerName_,
                  dev_.props().name);
        fail(Status::kRemote);
        return;
      }
      for (uint32_t i = 0; i < m.count; ++i) {
        bool dropped = false;
        if (!table_.addOffer(m.entry[i].tagSeq, m.entry[i], &dropped)) {
          WEFT_WARN("peer {} on {} offered a buffer twice or more than NCCL can have outstanding: connection closed",
                    peerName_, dev_.props().name);
          fail(Status::kRemote);
          return;
        }
      }
      postOfferRecv(static_cast<int>(idx));
      break;
    }
    case kWrite: {
      if (int qp = qpIndex(wc.qp_num); qp >= 0) --sendQueued_[qp];
      if (VerbsRequest* r = reqAt(idx); r != nullptr && r->inUse) {
        if (r->writesLeft > 0 && --r->writesLeft == 0) bytesInFlight_ -= std::min(bytesInFlight_, r->bytes[0]);
        opDone(r);
      }
      break;
    }
    default:
      WEFT_WARN("unexpected completion (kind {}) on the send comm to {}", kind, peerName_);
      break;
  }
}

Status VerbsSendComm::isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  if (size > INT_MAX) {
    WEFT_WARN("isend of {} B to {}: larger than NCCL ever sends (maxP2pBytes)", size, peerName_);
    return Status::kInvalidUsage;
  }
  if (size > 0) {
    if (Status st = checkMh(mh, data, size, "isend"); st != Status::kOk) return st;
  }
  uint32_t seq = 0;
  if (!seqs_.peek(tag, 0, &seq)) {
    WEFT_WARN("isend to {}: more than {} distinct tags on one connection", peerName_, TagSequence::kCapacity);
    return Status::kInternal;
  }
  const uint64_t key = tagSeqKey(tag, seq);
  VerbsOffer* o = table_.findOffer(key);
  if (o == nullptr) {
    progress();
    if (fatal_ != Status::kOk) return fatal_;
    o = table_.findOffer(key);
  }
  if (o == nullptr) {
    waitingOffer_ = true;  // NCCL calls again; the stall check watches the peer meanwhile
    return Status::kOk;
  }
  waitingOffer_ = false;
  const bool truncated = size > o->len;
  uint64_t chunk = size;
  const int pieces = truncated ? 1 : splitMessage(size, q_->nQps, stripeMin_, &chunk);
  const int first = static_cast<int>(seq % static_cast<uint32_t>(q_->nQps));
  for (int p = 0; p < pieces; ++p) {
    if (sendQueued_[(first + p) % q_->nQps] >= q_->sendWr - 1) return Status::kOk;  // back-pressure: NCCL retries
  }
  VerbsRequest* r = acquire();
  if (r == nullptr && pool_.allocated() < pool_.capacity()) return Status::kOk;  // no memory for more: NCCL retries
  if (r == nullptr) {
    WEFT_WARN("isend to {}: more requests in flight than NCCL allows ({})", peerName_, pool_.capacity());
    return Status::kInternal;
  }
  if (truncated) {
    WEFT_WARN("isend of {} B to {} on {}: the matching receive buffer holds only {} B", size, peerName_,
              dev_.props().name, o->len);
  }
  r->recv = false;
  r->n = 1;
  r->size = static_cast<uint32_t>(size);
  r->writesLeft = static_cast<uint16_t>(pieces);
  const uint32_t lkey = size > 0 ? static_cast<const ibv_mr*>(mh->entry->backendMr)->lkey : 0;
  for (int p = 0; p < pieces; ++p) {
    const uint64_t off = static_cast<uint64_t>(p) * chunk;
    const uint64_t len = truncated ? 0 : std::min<uint64_t>(chunk, size - off);
    const int qp = (first + p) % q_->nQps;
    ibv_sge sge{reinterpret_cast<uintptr_t>(data) + off, static_cast<uint32_t>(len), lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wrId(kWrite, r->poolIndex);
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(Imm::encode(o->slot, static_cast<uint32_t>(pieces), truncated));
    wr.sg_list = len > 0 ? &sge : nullptr;
    wr.num_sge = len > 0 ? 1 : 0;
    // Inline data is copied into the work request by the CPU: host memory only (a device pointer would be read).
    const bool inlined = len > 0 && len <= q_->maxInline && mh != nullptr && mh->type == NCCL_PTR_HOST;
    wr.send_flags = IBV_SEND_SIGNALED | (inlined ? IBV_SEND_INLINE : 0);
    wr.wr.rdma.remote_addr = o->addr + off;
    wr.wr.rdma.rkey = o->rkey;
    if (int rc = ibv_post_send(q_->qps[qp], &wr, &bad)) {
      WEFT_WARN("posting an RDMA write of {} B to {} on {} failed: {}", len, peerName_, dev_.props().name,
                std::strerror(rc));
      fail(Status::kSystem);
      r->error = Status::kSystem;
      r->writesLeft = 0;
      break;
    }
    ++sendQueued_[qp];
    ++r->ops;
  }
  r->bytes[0] = truncated ? 0 : size;  // what this send adds to bytesInFlight_
  bytesInFlight_ += r->bytes[0];
  seqs_.consume(tag);
  table_.eraseOffer(key);
  countPosted();
  *request = r;
  return Status::kOk;
}

}  // namespace weft::verbs
