#include "fabric/fabric_comm.h"

#include <rdma/fi_errno.h>

#include <time.h>

#include <climits>
#include <cstring>

#include "weft/common/params.h"
#include "weft/nccl/net.h"

namespace weft::fabric {

Status FabricRequest::test(bool* done, int* sizesOut) { return comm->testRequest(this, done, sizesOut); }

// ---- shared data-comm machinery --------------------------------------------------------------------------------

FabricDataComm::FabricDataComm(std::unique_ptr<Endpoint> ep, fi_addr_t peer, std::string peerName, int poolSize)
    : dev_(ep->device()),
      ep_(std::move(ep)),
      peer_(peer),
      peerName_(std::move(peerName)),
      pool_(new FabricRequest[poolSize]),
      probeIntervalMs_(params::getInt("WEFT_PROBE_INTERVAL")),
      peerTimeoutMs_(params::getInt("WEFT_PEER_TIMEOUT") * 1000) {
  free_.reserve(poolSize);
  for (int i = poolSize - 1; i >= 0; --i) {
    pool_[i].comm = this;
    pool_[i].poolIndex = static_cast<uint16_t>(i);
    for (int k = 0; k < kMaxRecvs; ++k) {
      pool_[i].ctx[k].owner = &pool_[i];
      pool_[i].ctx[k].index = static_cast<uint16_t>(k);
      pool_[i].ctx[k].kind = OpKind::kData;
    }
    free_.push_back(static_cast<uint16_t>(i));
  }
}

// Closing the endpoint (first member to go) cancels whatever is still in flight: NCCL may close a comm with
// requests outstanding (communicator abort), and nothing of ours waits for the network here.
FabricDataComm::~FabricDataComm() { ep_.reset(); }

FabricRequest* FabricDataComm::acquire() {
  if (free_.empty()) return nullptr;
  FabricRequest* r = &pool_[free_.back()];
  free_.pop_back();
  r->magic_ = kRequestMagic;
  ++outstanding_;
  r->n = 0;
  r->posted = 0;
  r->completed = 0;
  r->error = Status::kOk;
  return r;
}

void FabricDataComm::release(FabricRequest* r) {
  r->magic_ = 0;
  --outstanding_;
  free_.push_back(r->poolIndex);
}

Status FabricDataComm::progress() {
  Status st = ep_->progress(this);
  if (st != Status::kOk && fatal_ == Status::kOk) fatal_ = st;
  if (outstanding_ > 0 && probeIntervalMs_ > 0 && (++polls_ & 1023) == 0) checkPeer();
  return st;
}

namespace {
int64_t coarseNowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);  // vDSO: no system call
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}
}  // namespace

// Requests have been outstanding with nothing completing. A live peer may simply be busy (NCCL posts receives
// long before the data comes), so silence alone proves nothing: after WEFT_PROBE_INTERVAL ms of it, send the
// peer a probe. A live peer's host takes it at once, whatever its process is doing; a dead process answers
// with a connection error (reported by the provider on the probe's completion); a probe the provider cannot
// even hand over within WEFT_PEER_TIMEOUT means the host or the link is gone.
void FabricDataComm::checkPeer() {
  if (fatal_ != Status::kOk) return;
  int64_t now = coarseNowMs();
  if (completions_ != completionsSeen_ || lastActivityMs_ == 0) {  // something completed since the last look
    completionsSeen_ = completions_;
    lastActivityMs_ = now;
    return;
  }
  if (Status st = ep_->probeError(); st != Status::kOk) {
    WEFT_WARN("peer {} on {} is gone: a liveness probe failed after {} ms without progress (process exited or "
              "was killed, or the connection broke); its {} outstanding requests fail",
              peerName_, dev_.props().name, now - lastActivityMs_, outstanding_);
    fatal_ = Status::kRemote;
    return;
  }
  if (ep_->probeInFlight()) {
    if (now - probeSentMs_ > peerTimeoutMs_) {
      WEFT_WARN("peer {} on {} unreachable: a liveness probe was not delivered within {} s (host down, link "
                "down, or traffic filtered); its {} outstanding requests fail (WEFT_PEER_TIMEOUT)",
                peerName_, dev_.props().name, peerTimeoutMs_ / 1000, outstanding_);
      fatal_ = Status::kRemote;
    }
    return;
  }
  if (now - lastActivityMs_ >= probeIntervalMs_ && now - probeSentMs_ >= probeIntervalMs_) {
    ep_->sendProbe(peer_);
    probeSentMs_ = now;
  }
}

void FabricDataComm::onComplete(OpContext* ctx, size_t len) noexcept {
  ++completions_;
  auto* r = static_cast<FabricRequest*>(ctx->owner);
  if (r->recv) r->sizes[ctx->index] = static_cast<int>(len > INT_MAX ? INT_MAX : len);
  ++r->completed;
}

void FabricDataComm::onError(OpContext* ctx, Status st) noexcept {
  ++completions_;
  auto* r = static_cast<FabricRequest*>(ctx->owner);
  ++r->completed;
  if (r->error == Status::kOk) r->error = st;
  // A failed transfer breaks the ordered stream NCCL relies on: the connection is done for.
  if (fatal_ == Status::kOk) fatal_ = st;
}

Status FabricDataComm::postPending(FabricRequest* r) {
  while (r->posted < r->n) {
    int i = r->posted;
    ssize_t rc = fi_trecv(ep_->ep(), r->data[i], r->len[i], r->desc[i],
                          dev_.directedRecv() ? peer_ : FI_ADDR_UNSPEC, r->tag[i], 0, &r->ctx[i].fi);
    if (rc == -FI_EAGAIN) return Status::kOk;
    if (rc != 0) {
      WEFT_WARN("fi_trecv ({} B) from {} on {} failed: {}", r->len[i], peerName_, dev_.props().name,
                fi_strerror(static_cast<int>(-rc)));
      r->error = Status::kSystem;
      fatal_ = Status::kSystem;
      return Status::kSystem;
    }
    ++r->posted;
  }
  return Status::kOk;
}

Status FabricDataComm::testRequest(FabricRequest* r, bool* done, int* sizesOut) {
  *done = false;
  if (r->completed < r->n && r->error == Status::kOk) {
    if (r->posted < r->n) postPending(r);
    progress();
    if (r->posted < r->n && r->error == Status::kOk) postPending(r);
  }
  if (r->error != Status::kOk || (fatal_ != Status::kOk && r->completed < r->n)) {
    Status st = r->error != Status::kOk ? r->error : fatal_;
    // Operations of this request still in libfabric's hands would complete into a recycled request: keep it
    // out of the pool (the comm is dead anyway; its memory goes with closeSend/closeRecv).
    if (r->completed == r->posted) release(r);
    return st;
  }
  if (r->completed < r->n) return Status::kOk;
  *done = true;
  if (sizesOut != nullptr) {
    for (int i = 0; i < r->n; ++i) sizesOut[i] = r->sizes[i];
  }
  release(r);
  return Status::kOk;
}

Status FabricDataComm::checkHandle(const MemHandle* mh, const char* op) const {
  if (mh == nullptr) {
    if (dev_.localMr()) {
      WEFT_WARN("{}: NULL memory handle, but provider {} needs registered buffers", op, dev_.props().provider);
      return Status::kInternal;
    }
    return Status::kOk;
  }
  if (mh->magic_ != kMrMagic) {
    WEFT_WARN("{}: {} is not a live weft memory handle", op, static_cast<const void*>(mh));
    return Status::kInternal;
  }
  return Status::kOk;
}

Status FabricDataComm::regOnDevice(void* data, size_t size, int type, MemHandle** out) {
  if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
    WEFT_WARN("regMr: unknown memory type {:#x}", type);
    return Status::kInternal;
  }
  return dev_.mrCache().reg(data, size, type, out);
}

Status FabricDataComm::deregOnDevice(MemHandle* mh) { return dev_.mrCache().dereg(mh); }

// ---- send ------------------------------------------------------------------------------------------------------

FabricSendComm::FabricSendComm(std::unique_ptr<Endpoint> ep, fi_addr_t peer, std::string peerName, int maxRecvs)
    : FabricDataComm(std::move(ep), peer, std::move(peerName), kMaxRequests * maxRecvs),
      inject_(params::getBool("WEFT_INJECT")) {}

Status FabricSendComm::regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out) {
  return dev_.mrCache().regDmaBuf(data, size, type, offset, fd, out);
}

Status FabricSendComm::isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  if (Status st = checkHandle(mh, "isend"); st != Status::kOk) return st;
  if (size > dev_.maxMsgSize()) {
    WEFT_WARN("isend of {} B exceeds provider {}'s largest message ({} B)", size, dev_.props().provider,
              dev_.maxMsgSize());
    return Status::kInvalidUsage;
  }
  uint32_t seq;
  if (!seqs_.peek(tag, 0, &seq)) {
    WEFT_WARN("isend: more than {} distinct tags on one connection", TagSequence::kCapacity);
    return Status::kInternal;
  }
  FabricRequest* r = acquire();
  if (r == nullptr) return Status::kOk;  // all requests in flight: NCCL retries later
  r->recv = false;
  r->n = 1;
  r->sizes[0] = static_cast<int>(size > INT_MAX ? INT_MAX : size);
  uint64_t ftag = dataTag(tag, seq);
  ssize_t rc;
  if (inject_ && size <= dev_.injectSize()) {
    // Copied out by the provider right away: the request is complete as soon as it is accepted.
    rc = fi_tinject(ep_->ep(), data, size, peer_, ftag);
    if (rc == 0) {
      r->posted = 1;
      r->completed = 1;
    }
  } else {
    rc = fi_tsend(ep_->ep(), data, size, mh ? mh->desc() : nullptr, peer_, ftag, &r->ctx[0].fi);
    if (rc == 0) r->posted = 1;
  }
  if (rc == -FI_EAGAIN) {
    release(r);
    progress();
    return Status::kOk;
  }
  if (rc != 0) {
    release(r);
    WEFT_WARN("fi_tsend ({} B) to {} on {} failed: {}", size, peerName_, dev_.props().name,
              fi_strerror(static_cast<int>(-rc)));
    fatal_ = statusOfFiError(static_cast<int>(-rc));
    return fatal_;
  }
  seqs_.consume(tag);
  *request = r;
  return Status::kOk;
}

// ---- receive ---------------------------------------------------------------------------------------------------

FabricRecvComm::FabricRecvComm(std::unique_ptr<Endpoint> ep, fi_addr_t peer, std::string peerName, int maxRecvs)
    : FabricDataComm(std::move(ep), peer, std::move(peerName), kMaxRequests), maxRecvs_(maxRecvs) {}

Status FabricRecvComm::regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out) {
  return dev_.mrCache().regDmaBuf(data, size, type, offset, fd, out);
}

Status FabricRecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs,
                             Request** request) {
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  if (n < 1 || n > maxRecvs_) {
    WEFT_WARN("irecv with n={} buffers, but this device reported maxRecvs={}", n, maxRecvs_);
    return Status::kInternal;
  }
  for (int i = 0; i < n; ++i) {
    if (Status st = checkHandle(mhs ? mhs[i] : nullptr, "irecv"); st != Status::kOk) return st;
  }
  FabricRequest* r = acquire();
  if (r == nullptr) return Status::kOk;
  r->recv = true;
  r->n = static_cast<uint8_t>(n);
  for (int i = 0; i < n; ++i) {
    uint32_t ahead = 0;  // the same tag twice in one group takes consecutive sequence numbers
    for (int j = 0; j < i; ++j) ahead += tags[j] == tags[i] ? 1 : 0;
    uint32_t seq;
    if (!seqs_.peek(tags[i], ahead, &seq)) {
      release(r);
      WEFT_WARN("irecv: more than {} distinct tags on one connection", TagSequence::kCapacity);
      return Status::kInternal;
    }
    r->data[i] = data[i];
    r->len[i] = sizes[i];
    r->tag[i] = dataTag(tags[i], seq);
    r->desc[i] = mhs && mhs[i] ? mhs[i]->desc() : nullptr;
    r->sizes[i] = 0;
  }
  // The first buffer decides: if the provider has no room at all, hand the request back (NCCL retries).
  // Later buffers that meet a full queue are posted from test().
  Status st = postPending(r);
  if (st != Status::kOk) {
    release(r);
    return st;
  }
  if (r->posted == 0) {
    release(r);
    progress();
    return Status::kOk;
  }
  for (int i = 0; i < n; ++i) seqs_.consume(tags[i]);
  *request = r;
  return Status::kOk;
}

Status FabricRecvComm::iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) {
  (void)data;
  (void)sizes;
  *request = nullptr;
  if (fatal_ != Status::kOk) return fatal_;
  // Host buffers are coherent once the receive completed: nothing to flush (NULL request, as NCCL's IB
  // transport does when no flush is needed). NCCL flushes GPU buffers only on pre-Hopper GPUs or when a NIC
  // sets forceFlush; the read-back flush those need is not implemented yet, which the README states.
  for (int i = 0; i < n; ++i) {
    if (Status st = checkHandle(mhs ? mhs[i] : nullptr, "iflush"); st != Status::kOk) return st;
  }
  return Status::kOk;
}

// ---- listen ----------------------------------------------------------------------------------------------------

FabricListenComm::FabricListenComm(std::unique_ptr<Endpoint> ep, uint64_t token, int maxRecvs)
    : dev_(ep->device()), ep_(std::move(ep)), token_(token), maxRecvs_(maxRecvs) {}

Status FabricListenComm::accept(RecvComm** recvComm) {
  *recvComm = nullptr;
  if (accepted_) {
    WEFT_WARN("accept called again on a listen comm that already produced its connection");
    return Status::kInternal;
  }
  if (Status st = ep_->progress(nullptr); st != Status::kOk) return st;
  if (!replying_) {
    ConnectRequest req;
    if (!ep_->takeConnRequest(&req)) return Status::kOk;
    std::string from = ep_->addrString(req.addr, req.addrLen);
    uint16_t verdict = kAccepted;
    if (req.version != ConnectRequest::kVersion) {
      verdict = kBadVersion;
    } else if (req.token != token_) {
      verdict = kBadToken;
    }
    fi_addr_t peer;
    if (Status st = ep_->insert(req.addr, req.addrLen, &peer); st != Status::kOk) return st;
    if (Status st = ep_->sendReply(peer, verdict, req.token); st != Status::kOk) return st;
    if (verdict != kAccepted) {
      WEFT_WARN("listen on {}: connection from {} {}", dev_.props().name, from, replyStatusName(verdict));
      return ep_->postConnRequestRecv();  // keep listening for the legitimate peer
    }
    ep_->setAccepted();
    if (Status st = ep_->postConnRequestRecv(); st != Status::kOk) return st;
    replying_ = true;
    peer_ = peer;
    peerName_ = from;
  }
  // Hand the comm out only once the reply has left this process: NCCL need not progress the new recv comm
  // before the peer's connect completes, and some providers (sockets) send only while progressed.
  if (!ep_->repliesDone()) return Status::kOk;
  WEFT_INFO(NCCL_NET, "accepted connection from {} on {}", peerName_, dev_.props().name);
  accepted_ = true;
  *recvComm = new FabricRecvComm(std::move(ep_), peer_, peerName_, maxRecvs_);
  return Status::kOk;
}

}  // namespace weft::fabric
