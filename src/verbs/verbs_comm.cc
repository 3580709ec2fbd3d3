// SPDX-License-Identifier: Apache-2.0
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

uint64_t tagSeqKey(int tag, uint32_t seq) { return (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 32) | seq; }

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

// ---- handshake socket ------------------------------------------------------------------------------------------

HandshakeSocket::~HandshakeSocket() {
  if (fd_ >= 0) ::close(fd_);
}

void HandshakeSocket::queue(const void* data, size_t len) { out_.append(static_cast<const char*>(data), len); }

Status HandshakeSocket::flush(std::string* why) {
  while (!out_.empty()) {
    ssize_t n = ::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL);
    if (n > 0) {
      out_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Status::kOk;
    *why = n < 0 ? std::strerror(errno) : "connection closed";
    return Status::kRemote;
  }
  return Status::kOk;
}

bool HandshakeSocket::fill(size_t want, std::string* why) {
  char buf[256];
  while (in_.size() < want) {
    size_t ask = std::min(sizeof(buf), want - in_.size());
    ssize_t n = ::recv(fd_, buf, ask, 0);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      *why = "the peer closed the connection";
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
    *why = std::strerror(errno);
    return false;
  }
  return true;
}

void HandshakeSocket::take(void* out, size_t n) {
  if (out != nullptr) std::memcpy(out, in_.data(), n);
  in_.erase(0, n);
}

bool HandshakeSocket::readQpInfo(QpInfo* out, std::string* why) {
  if (!fill(QpInfo::kBytesV1, why)) return false;
  uint16_t version = 0;
  std::memcpy(&version, in_.data() + offsetof(QpInfo, version), sizeof(version));
  const size_t n = version >= 2 ? sizeof(QpInfo) : QpInfo::kBytesV1;
  if (!fill(n, why)) return false;
  *out = QpInfo{};
  take(out, n);
  return true;
}

// ---- QPs -------------------------------------------------------------------------------------------------------

QpSet::QpSet(VerbsDevice& d, int n, int swr, int rwr) : dev(d), nQps(n), sendWr(swr), recvWr(rwr) {}

QpSet::~QpSet() {
  const IbvApi& api = ibv();
  for (auto*& qp : qps) {
    if (qp != nullptr) api.destroyQp(qp);  // waits for any asynchronous event on it to be acknowledged
    qp = nullptr;
  }
  if (ownCq && cq != nullptr) api.destroyCq(cq);
  if (probeMr != nullptr) api.deregMr(probeMr);
}

Status QpSet::create(std::string* why) {
  const IbvApi& api = ibv();
  if (cq == nullptr) {
    int cqe = std::min(nQps * (sendWr + recvWr) + 16, std::max(dev.maxCqe(), 64));
    cq = api.createCq(dev.context(), cqe, nullptr, nullptr, 0);
    if (cq == nullptr) {
      *why = std::string("ibv_create_cq(") + std::to_string(cqe) + ") failed: " + std::strerror(errno);
      return Status::kSystem;
    }
    ownCq = true;
  }
  probeMr = api.regMr(dev.pd(), probeWord, sizeof(probeWord), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (probeMr == nullptr) {
    *why = std::string("registering the probe word failed: ") + std::strerror(errno);
    return Status::kSystem;
  }
  psn = static_cast<uint32_t>(randomToken()) & 0xffffff;  // PSNs are 24 bits
  for (int i = 0; i < nQps; ++i) {
    qps[i] = createRcQp(dev, cq, this, sendWr, recvWr, 64, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                        i == 0 ? &maxInline : nullptr, why);
    if (qps[i] == nullptr) return Status::kSystem;
  }
  return Status::kOk;
}

void QpSet::describe(QpInfo* info) const {
  info->nQps = static_cast<uint16_t>(nQps);
  for (int i = 0; i < nQps; ++i) info->qpn[i] = qps[i]->qp_num;
  info->psn = psn;
  info->lid = dev.lid();
  info->roce = dev.roce() ? 1 : 0;
  info->mtu = static_cast<uint8_t>(dev.activeMtu());
  std::memcpy(info->gid, dev.gid().raw, 16);
  info->probeAddr = reinterpret_cast<uintptr_t>(&probeWord[0]);
  info->probeRkey = probeMr->rkey;
}

Status QpSet::connect(const QpInfo& peer, int trafficClass, std::string* why) {
  peerProbeAddr = peer.probeAddr;
  peerProbeRkey = peer.probeRkey;
  for (int i = 0; i < nQps; ++i) {
    RcPeer rc;
    rc.qpn = peer.qpn[i];
    rc.psn = peer.psn;
    rc.lid = peer.lid;
    rc.roce = peer.roce != 0;
    rc.mtu = peer.mtu;
    std::memcpy(rc.gid, peer.gid, 16);
    if (!connectRcQp(dev, qps[i], rc, psn, trafficClass, 1, why)) return Status::kSystem;
  }
  return Status::kOk;
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

// ---- listen / accept -------------------------------------------------------------------------------------------

VerbsListenComm::VerbsListenComm(VerbsDevice& dev, int fd, uint64_t token)
    : dev_(dev), listenFd_(fd), token_(token) {}

VerbsListenComm::~VerbsListenComm() {
  if (listenFd_ >= 0) ::close(listenFd_);
}

Status VerbsListenComm::accept(RecvComm** out) {
  *out = nullptr;
  std::string why;
  if (!sock_) {
    sockaddr_storage sa{};
    socklen_t len = sizeof(sa);
    int fd = ::accept4(listenFd_, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return Status::kOk;
      WEFT_WARN("accept on {} failed: {}", dev_.props().name, std::strerror(errno));
      return Status::kSystem;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sock_ = std::make_unique<HandshakeSocket>(fd);
    peerName_ = sockaddrString(reinterpret_cast<sockaddr*>(&sa));
    started_ = std::chrono::steady_clock::now();
  }
  auto drop = [&](const std::string& reason) {
    WEFT_WARN("accept on {}: the handshake from {} failed: {}", dev_.props().name, peerName_, reason);
    sock_.reset();
    qps_.reset();
    replied_ = false;
  };
  // Whether `n` bytes of the handshake are in; a connector that closes, fails, or stalls past the handshake
  // timeout is dropped (and accept keeps listening).
  auto notYet = [&](const char* waitingFor) {
    if (!why.empty()) {
      drop(why);
    } else if (std::chrono::steady_clock::now() - started_ > kHandshakeTimeout) {
      drop(std::string("no ") + waitingFor + " within " + std::to_string(kHandshakeTimeout.count()) + " s");
    }
  };
  auto arrived = [&](size_t n, const char* waitingFor) {
    if (sock_->fill(n, &why)) return true;
    notYet(waitingFor);
    return false;
  };
  QpInfo reply{};
  reply.magic = QpInfo::kMagic;
  reply.version = QpInfo::kVersion;
  reply.token = token_;
  auto answer = [&](uint32_t status) {  // best effort for refusals: the socket closes right after
    reply.status = status;
    sock_->queue(&reply, sizeof(reply));
    sock_->flush(&why);
  };
  if (!replied_) {
    QpInfo peer;
    if (!sock_->readQpInfo(&peer, &why)) {
      notYet("request");
      return Status::kOk;
    }
    if (peer.magic != QpInfo::kMagic || peer.version != QpInfo::kVersion || peer.nQps < 1 || peer.nQps > kMaxQps) {
      answer(QpInfo::kBadRequest);
      drop("not a weft verbs connection request of this version");
      return Status::kOk;
    }
    if (peer.token != token_) {
      answer(QpInfo::kWrongToken);
      WEFT_WARN("refused a connection from {} on {}: wrong token (a handle of another listen or job, or forged)",
                peerName_, dev_.props().name);
      sock_.reset();
      return Status::kOk;
    }
    reply.tunerDigest = transport::localDigest();  // in the refusal too: the connector names both digests
    if (!transport::agreesWith(peer.tunerDigest)) {
      // The real peer, tuning differently: told why (it fails its connect naming both), and this accept fails.
      WEFT_WARN("accept on {} from {}: {}", dev_.props().name, peerName_,
                transport::agreementMismatch(peer.tunerDigest, peerName_));
      answer(QpInfo::kTunerMismatch);
      sock_.reset();
      return Status::kInvalidUsage;
    }
    qps_ = VerbsRecvComm::makeQps(dev_, peer.nQps);
    Status st = qps_->create(&why);
    if (st == Status::kOk) st = qps_->connect(peer, static_cast<int>(peer.trafficClass) - 1, &why);
    if (st != Status::kOk) {
      WEFT_WARN("accept on {} from {}: {}", dev_.props().name, peerName_, why);
      answer(QpInfo::kNoResources);
      sock_.reset();
      qps_.reset();
      return st;
    }
    qps_->describe(&reply);
    reply.status = QpInfo::kAccepted;
    sock_->queue(&reply, sizeof(reply));
    replied_ = true;
  }
  if (sock_->flush(&why) != Status::kOk) {
    drop(why);
    return Status::kOk;
  }
  if (!arrived(1, "confirmation")) return Status::kOk;
  sock_->take(nullptr, 1);
  std::unique_ptr<VerbsRecvComm> rc(numa::make<VerbsRecvComm>(dev_.props().numaNode, std::move(qps_), peerName_));
  rc->setLocalName(localAddressOf(sock_->fd()));
  if (Status st = rc->start(); st != Status::kOk) return st;
  WEFT_INFO(NCCL_NET, "accepted a connection from {} on {} ({} QP{})", peerName_, dev_.props().name,
            rc->qpCount(), rc->qpCount() == 1 ? "" : "s");
  sock_.reset();
  replied_ = false;
  *out = rc.release();
  return Status::kOk;
}

}  // namespace weft::verbs
