// SPDX-License-Identifier: Apache-2.0
// The verbs receive comm: buffer offers to the sender, receive completions, flush reads.
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
namespace {
std::atomic<int64_t> gFlushReads{0};
}  // namespace

// ---- receive ---------------------------------------------------------------------------------------------------

VerbsRecvComm::VerbsRecvComm(std::unique_ptr<QpSet> qps, std::string peerName)
    : CommAdaptor(std::move(qps), std::move(peerName), kMaxRequests) {}

VerbsRecvComm::~VerbsRecvComm() {
  flushQp_.reset();  // first: it is attached to the comm's completion queue, which goes with q_
  q_.reset();
  if (offersMr_ != nullptr) ibv().deregMr(offersMr_);
  if (flushMr_ != nullptr) ibv().deregMr(flushMr_);
}

Status VerbsRecvComm::start() {
  offers_ = numa::makeArray<VerbsOfferMsg>(kMaxRequests, pool_.node());
  if (!offers_) return Status::kSystem;
  offersMr_ = registerLocal(offers_.get(), sizeof(VerbsOfferMsg) * kMaxRequests, "offer buffers");
  if (offersMr_ == nullptr) return Status::kSystem;
  for (int qp = 0; qp < q_->nQps; ++qp) {
    for (int i = 0; i < q_->recvWr; ++i)
      if (!postImmRecv(qp)) return Status::kSystem;
  }
  return Status::kOk;
}

bool VerbsRecvComm::postImmRecv(int qp) {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = wrId(kImmRecv, static_cast<uint32_t>(qp));
  wr.sg_list = nullptr;
  wr.num_sge = 0;
  if (int rc = ibv_post_recv(q_->qps[qp], &wr, &bad)) {
    WEFT_WARN("posting a receive on {} failed: {}", dev_.props().name, std::strerror(rc));
    fail(Status::kSystem);
    return false;
  }
  return true;
}

void VerbsRecvComm::onCompletion(const ibv_wc& wc) {
  const uint64_t kind = wc.wr_id >> 32;
  const uint32_t idx = static_cast<uint32_t>(wc.wr_id);
  switch (kind) {
    case kImmRecv: {
      postImmRecv(static_cast<int>(idx));
      if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || (wc.wc_flags & IBV_WC_WITH_IMM) == 0) {
        WEFT_WARN("peer {} on {} sent a message where only RDMA writes belong: connection closed for safety",
                  peerName_, dev_.props().name);
        fail(Status::kRemote);
        return;
      }
      const uint32_t imm = ntohl(wc.imm_data);
      const uint32_t slot = Imm::slot(imm);
      const uint32_t ri = slot / kMaxRecvs, bi = slot % kMaxRecvs;
      VerbsRequest* r = reqAt(ri);
      if (r == nullptr || !r->inUse || !r->recv || bi >= r->n || r->bufDone[bi] || Imm::pieces(imm) < 1 ||
          r->bytes[bi] + wc.byte_len > r->cap[bi]) {
        WEFT_WARN("peer {} on {} wrote into receive slot {} that has no matching receive: connection closed",
                  peerName_, dev_.props().name, slot);
        fail(Status::kRemote);
        return;
      }
      r->bytes[bi] += wc.byte_len;
      r->piecesWant[bi] = static_cast<uint8_t>(Imm::pieces(imm));
      if (Imm::truncated(imm) && r->error == Status::kOk) {
        WEFT_WARN("peer {} on {} sent a message larger than the posted receive buffer ({} B): a send larger than "
                  "its receive is not allowed",
                  peerName_, dev_.props().name, r->cap[bi]);
        r->error = Status::kInvalidUsage;
      }
      if (++r->piecesSeen[bi] == r->piecesWant[bi]) {
        r->bufDone[bi] = true;
        ++r->doneBufs;
      }
      break;
    }
    case kOfferSend: {
      --sendQueued_[0];
      if (VerbsRequest* r = reqAt(idx); r != nullptr && r->inUse) {
        r->offerPending = false;
        opDone(r);
      }
      break;
    }
    case kFlush: {
      --flushQueued_;
      gFlushReads.fetch_add(1, std::memory_order_relaxed);
      if (VerbsRequest* r = reqAt(idx); r != nullptr && r->inUse) {
        if (r->writesLeft > 0) --r->writesLeft;
        opDone(r);
      }
      break;
    }
    default:
      WEFT_WARN("unexpected completion (kind {}) on the receive comm from {}", kind, peerName_);
      break;
  }
}

int64_t VerbsRecvComm::flushReads() { return gFlushReads.load(std::memory_order_relaxed); }

Status VerbsRecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs,
                            bool /*optional: every receive completes on its data (verbs writes are not polled)*/,
                            Request** request) {
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  if (n < 1 || n > kMaxRecvs) {
    WEFT_WARN("irecv of {} buffers from {}: at most {} (maxRecvs)", n, peerName_, kMaxRecvs);
    return Status::kInternal;
  }
  for (int i = 0; i < n; ++i) {
    if (sizes[i] > 0) {
      if (Status st = checkMh(mhs ? mhs[i] : nullptr, data[i], sizes[i], "irecv"); st != Status::kOk) return st;
    }
  }
  if (sendQueued_[0] >= q_->sendWr - 1) {
    progress();
    if (sendQueued_[0] >= q_->sendWr - 1) return Status::kOk;
  }
  VerbsRequest* r = acquire();
  if (r == nullptr && pool_.allocated() < pool_.capacity()) return Status::kOk;  // no memory for more: NCCL retries
  if (r == nullptr) {
    WEFT_WARN("irecv from {}: more than {} receives outstanding (NCCL_NET_MAX_REQUESTS)", peerName_, kMaxRequests);
    return Status::kInternal;
  }
  r->recv = true;
  r->n = static_cast<uint8_t>(n);
  VerbsOfferMsg& m = offers_[r->poolIndex];
  m.magic = VerbsOfferMsg::kMagic;
  m.count = static_cast<uint32_t>(n);
  for (int i = 0; i < n; ++i) {
    uint32_t ahead = 0;  // the same tag twice in one group takes consecutive sequence numbers
    for (int j = 0; j < i; ++j) ahead += tags[j] == tags[i] ? 1 : 0;
    uint32_t seq = 0;
    if (!seqs_.peek(tags[i], ahead, &seq)) {
      WEFT_WARN("irecv from {}: more than {} distinct tags on one connection", peerName_, TagSequence::kCapacity);
      release(r);
      return Status::kInternal;
    }
    VerbsOffer& e = m.entry[i];
    e.addr = reinterpret_cast<uintptr_t>(data[i]);
    e.tagSeq = tagSeqKey(tags[i], seq);
    e.len = static_cast<uint32_t>(std::min<size_t>(sizes[i], UINT32_MAX));
    const bool keyed = sizes[i] > 0 && mhs != nullptr && mhs[i] != nullptr;
    e.rkey = keyed ? static_cast<const ibv_mr*>(mhs[i]->entry->backendMr)->rkey : 0;
    e.flags = keyed ? 0 : kOfferNoKey;
    e.slot = static_cast<uint32_t>(r->poolIndex) * kMaxRecvs + static_cast<uint32_t>(i);
    r->cap[i] = e.len;
  }
  const size_t bytes = VerbsOfferMsg::bytes(n);
  ibv_sge sge{reinterpret_cast<uintptr_t>(&m), static_cast<uint32_t>(bytes), offersMr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = wrId(kOfferSend, r->poolIndex);
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED | (bytes <= q_->maxInline ? IBV_SEND_INLINE : 0);
  if (int rc = ibv_post_send(q_->qps[0], &wr, &bad)) {
    WEFT_WARN("posting a buffer offer to {} on {} failed: {}", peerName_, dev_.props().name, std::strerror(rc));
    release(r);
    fail(Status::kSystem);
    return Status::kSystem;
  }
  ++sendQueued_[0];
  r->ops = 1;
  r->offerPending = true;
  for (int i = 0; i < n; ++i) seqs_.consume(tags[i]);
  countPosted();
  *request = r;
  return Status::kOk;
}

Status VerbsRecvComm::ensureFlushQp() {
  if (flushQp_) return Status::kOk;
  // One send slot per request the comm can have (a flush takes a request of the pool, as receives do), and one
  // spare: the queue can never be full when a flush is asked for, so none is ever dropped.
  auto f = std::make_unique<QpSet>(dev_, 1, kMaxRequests + 1, 1);
  f->cq = q_->cq;  // its completions come through this comm's queue
  std::string why;
  if (Status st = f->create(&why); st != Status::kOk) {
    WEFT_WARN("flush QP on {}: {}", dev_.props().name, why);
    return st;
  }
  QpInfo self{};
  f->describe(&self);
  if (Status st = f->connect(self, 0, &why); st != Status::kOk) {
    WEFT_WARN("flush QP on {}: {}", dev_.props().name, why);
    return st;
  }
  flushMr_ = registerLocal(&flushWord_, sizeof(flushWord_), "the flush target");
  if (flushMr_ == nullptr) return Status::kSystem;
  flushQp_ = std::move(f);
  return Status::kOk;
}

Status VerbsRecvComm::iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) {
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  int last = -1;
  for (int i = 0; i < n && i < kMaxRecvs; ++i) {
    if (mhs != nullptr && mhs[i] != nullptr && mhs[i]->magic_ == kMrMagic && mhs[i]->type == NCCL_PTR_CUDA &&
        (sizes == nullptr || sizes[i] > 0))
      last = i;
  }
  if (last < 0) return Status::kOk;  // host memory: the CPU already sees what the NIC wrote
  if (Status st = ensureFlushQp(); st != Status::kOk) return st;
  if (flushQueued_ >= flushQp_->sendWr) {  // cannot happen (sized above); never drop a flush silently
    WEFT_WARN("iflush on {}: {} flushes in flight, more than the comm's requests: internal error", dev_.props().name,
              flushQueued_);
    return Status::kInternal;
  }
  VerbsRequest* r = acquire();
  if (r == nullptr) return Status::kInternal;  // a flush is never dropped: no request to carry it is an error
  r->recv = false;
  r->n = 1;
  r->writesLeft = 1;
  const auto* mr = static_cast<const ibv_mr*>(mhs[last]->entry->backendMr);
  ibv_sge sge{reinterpret_cast<uintptr_t>(&flushWord_), 1, flushMr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = wrId(kFlush, r->poolIndex);
  wr.opcode = IBV_WR_RDMA_READ;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(data[last]);
  wr.wr.rdma.rkey = mr->rkey;
  if (int rc = ibv_post_send(flushQp_->qps[0], &wr, &bad)) {
    WEFT_WARN("posting a flush read on {} failed: {}", dev_.props().name, std::strerror(rc));
    release(r);
    return Status::kSystem;
  }
  ++flushQueued_;
  r->ops = 1;
  countPosted();
  *request = r;
  return Status::kOk;
}

}  // namespace weft::verbs
