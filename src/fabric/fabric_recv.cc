// SPDX-License-Identifier: Apache-2.0
// The receive side of a data comm: receives, buffer offers to the sender, flushes of GPU buffers.
#include "fabric/fabric_comm.h"

#include "weft/common/clock.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <time.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>

#include "weft/common/params.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"

namespace weft::fabric {

FabricRecvComm::FabricRecvComm(std::shared_ptr<EndpointGroup> group, std::vector<Rail> rails, std::string peerName,
                               int maxRecvs, Protocol proto, CommId localId, uint32_t peerId)
    : CommAdaptor(std::move(group), std::move(rails), std::move(peerName), 2 * kMaxRequests, proto,
                  std::move(localId), peerId, true),
      maxRecvs_(maxRecvs) {
  offerQueue_.reserve(pool_.capacity());
}

Status FabricRecvComm::start() {
  // Remote writes into its buffers name it, except in the 4-byte form that carries the length.
  if (Status st = join(proto_.imm4 && !proto_.immId); st != Status::kOk) return st;
  if (!proto_.rdma) return Status::kOk;
  nSeqs_ = proto_.imm4 && !proto_.immId ? WriteImm32::kSeqs : WriteImm::kSeqs;
  bySeq_.reset(new uint16_t[nSeqs_]());
  wantOffers_ = true;  // registered with each chunk of requests (makeChunk())
  return Status::kOk;
}

bool FabricRecvComm::sendOffer(FabricRecvRequest* r) {
  OfferMsg& m = offer(r->poolIndex);
  m.epoch = ctlEpoch_;
  ssize_t rc = fi_tsend(ctl().ep(), &m, OfferMsg::bytes(m.count), offerDesc(r->poolIndex), ctlPeer(),
                        wire::ctrlTag(wire::CtrlKind::kOffer), &r->offerCtx.fi);
  if (rc == 0) {
    ++r->ops;
    r->offerPosted = r->offerBusy = true;
    return true;
  }
  if (rc != -FI_EAGAIN) {
    WEFT_WARN("sending a buffer offer to {} on {} failed: {}", peerName_, dev_.props().name,
              fi_strerror(static_cast<int>(-rc)));
    if (r->error == Status::kOk) r->error = statusOfFiError(static_cast<int>(-rc));
    if (fatal_ == Status::kOk) fatal_ = r->error;
    return true;
  }
  return false;
}

// Offers the provider pushed back on leave in irecv order (the sender matches by tag, so order is only fairness).
void FabricRecvComm::flushOffers() {
  size_t k = 0;
  while (k < offerQueue_.size() && sendOffer(&recvReq(offerQueue_[k]))) ++k;
  if (k > 0) offerQueue_.erase(offerQueue_.begin(), offerQueue_.begin() + static_cast<std::ptrdiff_t>(k));
}

Status FabricRecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs, bool optional,
                             Request** request) {
  *request = nullptr;
  bool busy = false;
  auto lock = group_->tryLockIfShared(&busy);
  if (busy) return Status::kOk;  // back-pressure: NCCL posts it again
  if (fatal_ != Status::kOk) return fatal_;
  if (n < 1 || n > maxRecvs_) {
    WEFT_WARN("irecv with n={} buffers, but this device reported maxRecvs={}", n, maxRecvs_);
    return Status::kInternal;
  }
  for (int i = 0; i < n; ++i) {
    if (Status st = checkHandle(mhs ? mhs[i] : nullptr, "irecv"); st != Status::kOk) return st;
    if (Status st = checkTag(tags[i], "irecv"); st != Status::kOk) return st;
  }
  FabricRequest* acquired = acquire();
  if (acquired == nullptr) return fatal_;  // kOk: NCCL retries (see makeChunk())
  FabricRecvRequest* r = &asRecv(acquired);
  r->n = static_cast<uint8_t>(n);
  // Early completion is safe only where the provider places data without further calls from us (hardware
  // RMA): with manual progress in software (tcp, sockets, shm) the data would land only when NCCL next calls
  // test, which for an early-completed LL receive it never does.
  // With delivery acknowledgements the receiver must see the data land to acknowledge it: no early completion.
  r->optional = optional && n == 1 && proto_.rdma && dev_.hardwarePlacement() && !proto_.acks;
  OfferMsg* m = proto_.rdma ? &offer(r->poolIndex) : nullptr;
  for (int i = 0; i < n; ++i) {
    uint32_t ahead = 0;  // the same tag twice in one group takes consecutive sequence numbers
    for (int j = 0; j < i; ++j) ahead += tags[j] == tags[i] ? 1 : 0;
    uint64_t count;
    if (!seqs_.peek(tags[i], ahead, &count)) {
      r->reported = true;
      release(r);
      WEFT_WARN("irecv: more than {} distinct tags on one connection", TagSequence::kCapacity);
      return Status::kInternal;
    }
    MemHandle* mh = mhs ? mhs[i] : nullptr;
    const int k = railOf(count);  // where the sender's tagged message for this sequence travels
    const MemHandle* h = mh ? mh->rail(k) : nullptr;
    r->data[i] = data[i];
    r->mh[i] = mh;
    r->len[i] = sizes[i];
    r->tag[i] = wire::dataTag(tagComm(k, localId_.get()), tags[i], static_cast<uint32_t>(count));
    r->desc[i] = h ? h->desc() : nullptr;
    r->rail[i] = static_cast<uint8_t>(k);
    r->sizes[i] = 0;
    r->rmaBytes[i] = 0;
    r->rmaSegs[i] = 0;
    r->flags[i] = 0;
    if (m == nullptr) {
      r->flags[i] = FabricRecvRequest::kNeedPost;
      continue;
    }
    const bool keyed = mh != nullptr && mh->entry != nullptr && mh->entry->backendMr != nullptr;
    uint16_t sq = 0;
    if (keyed && !allocSeq(static_cast<uint16_t>(r->poolIndex * kMaxRecvs + i), &sq)) {
      r->n = static_cast<uint8_t>(i);  // the buffers before this one hold sequences: given back with the request
      r->optional = false;
      r->reported = true;
      release(r);
      return Status::kOk;  // every sequence is in use: NCCL retries
    }
    r->seq[i] = sq;
    fillOfferEntry(*r, i, keyed, &m->entry[i]);
    r->flags[i] = keyed ? FabricRecvRequest::kOffered : 0;
    if (!keyed || proto_.eagerMax > 0) r->flags[i] |= FabricRecvRequest::kNeedPost;
  }
  // The first tagged receive decides: if the provider has no room at all, hand the request back (NCCL retries).
  // Later ones that meet a full queue are posted from test().
  if (Status st = postPending(r); st != Status::kOk) {
    r->reported = true;
    if (r->ops == 0) release(r);
    return st;
  }
  if (m == nullptr && r->ops == 0) {
    r->reported = true;
    release(r);
    progress();
    return Status::kOk;
  }
  if (m != nullptr) {
    m->magic = OfferMsg::kMagic;
    m->count = static_cast<uint16_t>(n);
    m->reserved = 0;
    m->toComm = peerId_;
    m->reserved2 = 0;
    if (!sendOffer(r)) offerQueue_.push_back(r->poolIndex);  // capacity reserved: never allocates
  }
  for (int i = 0; i < n; ++i) seqs_.consume(tags[i]);
  *request = r;
  return Status::kOk;
}

Status FabricRecvComm::iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) {
  *request = nullptr;
  bool busy = false;
  auto lock = group_->tryLockIfShared(&busy);
  if (!busy && fatal_ != Status::kOk) return fatal_;  // (busy: the failure shows in the next test)
  for (int i = 0; i < n; ++i) {
    if (Status st = checkHandle(mhs ? mhs[i] : nullptr, "iflush"); st != Status::kOk) return st;
  }
  // As NCCL's IB transport: one read of the last non-empty buffer, on every rail (the data may have come through
  // any), after which everything the NICs wrote before is visible to the GPU (PCIe orders a read after the writes
  // before it). Host buffers are coherent once the receive completed: nothing to flush, a NULL request, unless
  // WEFT_FLUSH=all.
  int last = -1;
  for (int i = 0; i < n; ++i)
    if (sizes != nullptr && sizes[i] != 0) last = i;
  const MemHandle* mh = last >= 0 && mhs != nullptr ? mhs[last] : nullptr;
  if (mh == nullptr || !dev_.flushes() || (mh->type != NCCL_PTR_CUDA && !dev_.flushHost())) return Status::kOk;
  if (busy) {
    // Another thread holds the shared group: a flush cannot be dropped, and an error would fail NCCL's proxy.
    // Wait for the lock (held only for one bounded progress batch).
    lock = group_->lockIfShared();
    if (fatal_ != Status::kOk) return fatal_;
  }
  for (int k = 0; k < nRails_; ++k) {
    if (mh->rail(k) == nullptr || mh->rail(k)->entry == nullptr || mh->rail(k)->entry->backendMr == nullptr) {
      WEFT_WARN("iflush: buffer {} is not registered for RMA on rail {}", data[last], k);
      return Status::kInternal;
    }
  }
  FabricRequest* acquired = acquire();
  if (acquired == nullptr) {
    // The pool holds every request NCCL may have in flight on the comm (maxRecvs grouped receives x its steps);
    // a flush beyond is a caller that never tests its requests.
    WEFT_WARN("iflush: every request of the comm from {} is in flight", peerName_);
    return fatal_ != Status::kOk ? fatal_ : Status::kInternal;
  }
  FabricRecvRequest* r = &asRecv(acquired);
  r->flush = true;
  r->flushMh = mh;
  r->n = static_cast<uint8_t>(nRails_);
  for (int k = 0; k < nRails_; ++k) {
    r->flags[k] = FabricRecvRequest::kNeedPost;
    r->rail[k] = static_cast<uint8_t>(k);
    r->data[k] = data[last];
    r->sizes[k] = 0;
    r->ctx[k].kind = OpKind::kFlush;
  }
  if (Status st = postPending(r); st != Status::kOk) {
    r->reported = true;
    if (r->ops == 0) release(r);
    return st;
  }
  *request = r;
  return Status::kOk;
}

}  // namespace weft::fabric
