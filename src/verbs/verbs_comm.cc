// SPDX-License-Identifier: Apache-2.0
// What a verbs send and receive comm share: requests, completions, errors, the liveness probe, stalls and memory
// registration. Set-up is verbs_connect.cc, the two directions verbs_send.cc and verbs_recv.cc.
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
const char* statusHint(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_RETRY_EXC_ERR:
      return ": the peer's NIC stopped acknowledging (process gone, host down, link down, or a wrong GID/LID)";
    case IBV_WC_RNR_RETRY_EXC_ERR: return ": the peer posted no receive in time";
    case IBV_WC_REM_ACCESS_ERR: return ": the peer refused the access (buffer not registered there, or key revoked)";
    case IBV_WC_REM_INV_REQ_ERR: return ": the peer found the request invalid";
    case IBV_WC_LOC_PROT_ERR: return ": a local buffer is not covered by its registration";
    default: return "";
  }
}

}  // namespace

const char* VerbsDataComm::kindName(uint64_t kind) {
  switch (kind) {
    case kWrite: return "RDMA write";
    case kOfferSend: return "buffer offer";
    case kOfferRecv: return "offer receive";
    case kImmRecv: return "receive";
    case kProbe: return "liveness probe";
    case kFlush: return "flush read";
  }
  return "work request";
}

// ---- requests and the shared data-comm machinery ---------------------------------------------------------------

Status VerbsRequest::test(bool* done, int* sizes) { return comm->testRequest(this, done, sizes); }

VerbsDataComm::VerbsDataComm(std::unique_ptr<QpSet> qps, std::string peerName, int poolSize)
    : q_(std::move(qps)), dev_(q_->dev), peerName_(std::move(peerName)), pool_(static_cast<size_t>(poolSize), dev_.props().numaNode) {
  probeIntervalMs_ = static_cast<int>(params::getInt("WEFT_PROBE_INTERVAL"));
  peerTimeoutMs_ = params::getInt("WEFT_PEER_TIMEOUT") * 1000;
  stripeMin_ = static_cast<uint64_t>(params::getInt("WEFT_STRIPE_MIN"));
  // Mb/s / 100 -> bytes per ms: speed * 1e6 / 8 / 100 / 1000
  floorBytesPerMs_ = std::max<uint64_t>(1000, static_cast<uint64_t>(dev_.props().speedMbps) * 10 / 8);
  stallMs_ = params::getInt("WEFT_STALL_S") * 1000;
}

VerbsDataComm::~VerbsDataComm() {
  for (size_t i = 0; i < pool_.allocated(); ++i) reqAt(i)->magic_ = 0;
  q_.reset();  // QPs first (outstanding work requests are flushed with them), then the CQ
}

VerbsRequest* VerbsDataComm::acquire() {
  VerbsRequest* r = pool_.takeRequest([this](VerbsRequest& q, size_t i) {
    q.comm = this;
    q.poolIndex = static_cast<uint16_t>(i);
  });
  if (r == nullptr) return nullptr;
  uint16_t idx = r->poolIndex;
  VerbsDataComm* c = r->comm;
  r->~VerbsRequest();
  new (r) VerbsRequest();
  r->poolIndex = idx;
  r->comm = c;
  r->inUse = true;
  r->magic_ = kRequestMagic;
  return r;
}

void VerbsDataComm::release(VerbsRequest* r) {
  if (stall_.over()) {  // a request is over: the stall is (the next one counts from here)
    WEFT_INFO(NCCL_NET, "connection to {} on {}: requests complete again", peerName_, dev_.props().name);
    stallSeenDone_ = dataDone_;
    stallFromMs_ = coarseNowMs();
  }
  r->magic_ = 0;
  r->inUse = false;
  pool_.giveBack(r->poolIndex);
}

int VerbsDataComm::qpIndex(uint32_t qpNum) const {
  for (int i = 0; i < q_->nQps; ++i)
    if (q_->qps[i]->qp_num == qpNum) return i;
  return -1;
}

void VerbsDataComm::progress() {
  ibv_wc wc[16];
  int n = ibv_poll_cq(q_->cq, 16, wc);
  if (n < 0) {
    WEFT_WARN("polling the completion queue of the connection to {} on {} failed", peerName_, dev_.props().name);
    fail(Status::kSystem);
  }
  for (int i = 0; i < n; ++i) {
    silence_.completed();
    if (wc[i].status == IBV_WC_SUCCESS && (wc[i].wr_id >> 32) == kProbe) {
      probeDone(wc[i]);
    } else if (wc[i].status == IBV_WC_SUCCESS) {
      ++dataDone_;
      onCompletion(wc[i]);
    } else {
      onError(wc[i]);
    }
  }
  if ((outstanding_ > 0 || waitingOffer_) && (++polls_ & 1023) == 0) checkPeer();
}

void VerbsDataComm::probeDone(const ibv_wc& wc) {
  if (int qp = qpIndex(wc.qp_num); qp >= 0) --sendQueued_[qp];
  --probesInFlight_;
  if (wc.status == IBV_WC_SUCCESS) probeOkMs_ = coarseNowMs();
}

// A stall: no data completion since the comm last became busy or last completed something, for WEFT_STALL_S, with
// a probe acknowledged since (the peer's NIC answers: the peer is reachable; an unreachable one fails in checkPeer).
void VerbsDataComm::watchStall(int64_t nowMs) {
  if (busyEpoch_ != stallEpoch_ || dataDone_ != stallSeenDone_) {
    if (stall_.over()) {
      WEFT_INFO(NCCL_NET, "connection to {} on {}: requests complete again", peerName_, dev_.props().name);
    }
    stallEpoch_ = busyEpoch_;
    stallSeenDone_ = dataDone_;
    stallFromMs_ = nowMs;
    return;
  }
  if (stall_.reported || nowMs - stallFromMs_ < stallMs_ || probeOkMs_ < stallFromMs_) return;
  // An RDMA write completes only once all of it landed: a large message still on its way shows no completion.
  // The outstanding requests' bytes get the time they take at 1% of the port's speed (as the probe's deadline).
  uint64_t pending = 0;
  for (size_t i = 0; i < pool_.allocated(); ++i) {
    const VerbsRequest* r = reqAt(i);
    if (r == nullptr || !r->inUse || r->reported) continue;
    if (!r->recv) pending += r->size;
    for (int j = 0; r->recv && j < r->n; ++j) pending += r->bufDone[j] ? 0 : r->cap[j];
  }
  if (nowMs - stallFromMs_ < stallMs_ + static_cast<int64_t>(pending / floorBytesPerMs_)) return;
  stall_.begin(stallFromMs_, StallKind::kBehind);  // the peer's NIC acknowledged a probe in the stall
  stallCount().fetch_add(1, std::memory_order_relaxed);
  WEFT_WARN("connection to {} on {}: stalled, nothing completed for {} s: {}; the peer is reachable (its NIC "
            "acknowledged a liveness probe {} ms ago), so {}: that rank is behind (in compute, or waiting on another "
            "rank: its own stall lines say on whom) (WEFT_STALL_S; docs/hangs.md)",
            peerName_, dev_.props().name, (nowMs - stallFromMs_) / 1000,
            fmt::format("{} request{} outstanding{}", outstanding_, outstanding_ == 1 ? "" : "s",
                        waitingOffer_ ? ", a send waiting for the peer's offer" : ""),
            nowMs - probeOkMs_, stallWhat());
}

std::atomic<int64_t>& stallCount() {
  static std::atomic<int64_t> n{0};
  return n;
}

std::string VerbsSendComm::stallWhat() const {
  return "no offer of a buffer has come for these sends: the peer has not posted the receive";
}

std::string VerbsRecvComm::stallWhat() const {
  return "nothing has come for these receives, whose offers the peer has: it has not posted the matching send";
}

void VerbsDataComm::opDone(VerbsRequest* r) {
  if (--r->ops == 0 && r->reported) release(r);
}

void VerbsDataComm::onError(const ibv_wc& wc) {
  const uint64_t kind = wc.wr_id >> 32;
  const uint32_t idx = static_cast<uint32_t>(wc.wr_id);
  Status st = Status::kSystem;
  switch (wc.status) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_WR_FLUSH_ERR:
      st = Status::kRemote;
      break;
    default: break;
  }
  if (wc.status != IBV_WC_WR_FLUSH_ERR || fatal_ == Status::kOk) {
    WEFT_WARN("{} {} {} on {} failed: {} (vendor error {:#x}){}; the connection's requests fail", kindName(kind),
              kind == kImmRecv || kind == kOfferRecv ? "from" : "to", peerName_, dev_.props().name,
              ibv().wcStatusStr(wc.status), wc.vendor_err, statusHint(wc.status));
  }
  fail(st);
  const int qp = qpIndex(wc.qp_num);
  switch (kind) {
    case kWrite:
    case kOfferSend:
    case kFlush: {
      if (kind != kFlush && qp >= 0) --sendQueued_[qp];
      if (kind == kFlush) --flushQueued_;
      if (VerbsRequest* r = reqAt(idx); r != nullptr && r->inUse) {
        if (r->error == Status::kOk) r->error = st;
        if (kind == kOfferSend) r->offerPending = false;
        opDone(r);
      }
      break;
    }
    case kProbe:
      probeDone(wc);
      WEFT_WARN("peer {} on {} is gone: a liveness probe failed after {} ms without progress; its {} outstanding "
                "requests fail",
                peerName_, dev_.props().name, coarseNowMs() - silence_.sinceMs(), outstanding_);
      break;
    default: break;  // flushed receives: nothing of NCCL's
  }
}

void VerbsDataComm::checkPeer() {
  if (fatal_ != Status::kOk) return;
  dev_.pollAsync();
  if (int ev = q_->asyncError.load(std::memory_order_relaxed); ev != 0) {
    WEFT_WARN("connection to {} on {}: asynchronous QP error ({}); its {} outstanding requests fail", peerName_,
              dev_.props().name, ibv().eventTypeStr(static_cast<ibv_event_type>(ev)), outstanding_);
    fail(Status::kRemote);
    return;
  }
  if (!dev_.usable()) {
    WEFT_WARN("connection to {} on {}: {}; its {} outstanding requests fail", peerName_, dev_.props().name,
              dev_.stateReason(), outstanding_);
    fail(Status::kRemote);
    return;
  }
  const int64_t now = coarseNowMs();
  if (stallMs_ > 0) watchStall(now);
  if (silence_.restarted(now)) {
    probeSentMs_ = now;  // the peer answered something: a probe still queued gets its full time again
    return;
  }
  if (probeIntervalMs_ <= 0) return;
  if (probesInFlight_ > 0) {
    // A probe queues behind the QP's earlier writes (RC is in order): a large message on a slow or congested link
    // must not pass for a dead peer, so its deadline grows with the bytes ahead of it.
    if (now - probeSentMs_ > probeDeadlineMs_) {
      WEFT_WARN("peer {} on {} unreachable: a liveness probe was not acknowledged within {} s; its {} outstanding "
                "requests fail (WEFT_PEER_TIMEOUT)",
                peerName_, dev_.props().name, peerTimeoutMs_ / 1000, outstanding_);
      fail(Status::kRemote);
    }
    return;
  }
  if (now - silence_.sinceMs() >= probeIntervalMs_ && now - probeSentMs_ >= probeIntervalMs_) {
    postProbe();
    probeSentMs_ = now;
    probeDeadlineMs_ = peerTimeoutMs_ + static_cast<int64_t>(bytesInFlight_ / floorBytesPerMs_);
  }
}

void VerbsDataComm::postProbe() {
  for (int i = 0; i < q_->nQps; ++i) {
    if (sendQueued_[i] >= q_->sendWr) continue;
    ibv_sge sge{reinterpret_cast<uintptr_t>(&q_->probeWord[1]), 8, q_->probeMr->lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wrId(kProbe, static_cast<uint32_t>(i));
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = q_->peerProbeAddr;
    wr.wr.rdma.rkey = q_->peerProbeRkey;
    if (ibv_post_send(q_->qps[i], &wr, &bad) != 0) continue;
    ++sendQueued_[i];
    ++probesInFlight_;
  }
}

Status VerbsDataComm::testRequest(VerbsRequest* r, bool* done, int* sizes) {
  *done = false;
  if (r->reported) {
    WEFT_WARN("test on a request that already completed");
    return Status::kInternal;
  }
  auto complete = [&] { return r->recv ? r->doneBufs == r->n : r->writesLeft == 0; };
  if (!complete() && r->error == Status::kOk) progress();
  if (r->error != Status::kOk || (fatal_ != Status::kOk && !complete())) {
    Status st = r->error != Status::kOk ? r->error : fatal_;
    r->reported = true;
    --outstanding_;
    if (r->ops == 0) release(r);  // else when the NIC gives back its last work request (flushed at close)
    return st;
  }
  if (!complete()) return Status::kOk;
  *done = true;
  if (sizes != nullptr) {
    if (r->recv) {
      for (int i = 0; i < r->n; ++i) sizes[i] = static_cast<int>(r->bytes[i] > INT_MAX ? INT_MAX : r->bytes[i]);
    } else {
      sizes[0] = static_cast<int>(r->size);
    }
  }
  r->reported = true;
  --outstanding_;
  if (r->ops == 0) release(r);
  return Status::kOk;
}

Status VerbsDataComm::checkMh(const MemHandle* mh, const void* data, size_t size, const char* op) const {
  if (Status st = checkMemHandle(mh, data, size, op, /*nullOk=*/false, dev_.props().name); st != Status::kOk) {
    return st;
  }
  if (mh->entry == nullptr || mh->entry->backendMr == nullptr) {
    WEFT_WARN("{}: {} is not a live weft memory handle", op, static_cast<const void*>(mh));
    return Status::kInternal;
  }
  auto* mr = static_cast<const ibv_mr*>(mh->entry->backendMr);
  if (mr->pd != dev_.pd()) {
    WEFT_WARN("{}: memory handle {} was registered on another device than {}", op, static_cast<const void*>(mh),
              dev_.props().name);
    return Status::kInvalidUsage;
  }
  return Status::kOk;
}

ibv_mr* VerbsDataComm::registerLocal(void* p, size_t n, const char* what) {
  ibv_mr* mr = ibv().regMr(dev_.pd(), p, n, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) WEFT_WARN("registering {} on {} failed: {}", what, dev_.props().name, std::strerror(errno));
  return mr;
}

Status VerbsDataComm::registerMr(void* data, size_t size, int type, int fd, uint64_t offset, MemHandle** out) {
  *out = nullptr;
  if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
    WEFT_WARN("regMr: unknown memory type {:#x}", type);
    return Status::kInternal;
  }
  if (type == NCCL_PTR_CUDA && (dev_.props().ptrSupport & NCCL_PTR_CUDA) == 0) {
    WEFT_WARN("regMr: GPU memory on {}, which does not offer it (WEFT_GDR, nvidia-peermem or DMA-BUF)",
              dev_.props().name);
    return Status::kInvalidUsage;
  }
  if (fd >= 0 && (dev_.props().ptrSupport & NCCL_PTR_DMABUF) == 0) {
    WEFT_WARN("regMrDmaBuf on {}, which does not advertise NCCL_PTR_DMABUF: refused", dev_.props().name);
    return Status::kInvalidUsage;
  }
  MrCache& cache = dev_.mrCache();
  return fd >= 0 ? cache.regDmaBuf(data, size, type, offset, fd, out) : cache.reg(data, size, type, out);
}

Status VerbsDataComm::deregisterMr(MemHandle* mh) { return dev_.mrCache().dereg(mh); }

std::string VerbsDataComm::commDeviceName() const { return dev_.props().name; }

}  // namespace weft::verbs
