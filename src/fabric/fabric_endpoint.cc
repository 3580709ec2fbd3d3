// SPDX-License-Identifier: Apache-2.0
#include "fabric/fabric_endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>
#include <rdma/fi_rma.h>

#include "weft/common/clock.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace weft::fabric {

const char* wire::replyStatusName(uint16_t s) {
  switch (s) {
    case kAccepted: return "accepted";
    case kBadToken: return "refused: wrong token (a handle from another listen, another job, or forged)";
    case kAlreadyConnected: return "refused: that listen already has its connection (replayed handle)";
    case kBadVersion: return "refused: different weft connection protocol version";
    case kNoSuchListen: return "refused: no such listen at that address (a stale or foreign handle)";
    case kTunerMismatch: return "refused: the two ends' tuners would decide differently";
  }
  return "refused: unknown reason";
}

Status statusOfFiError(int err) {
  switch (err) {
    case FI_ETRUNC: return Status::kInvalidUsage;
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ETIMEDOUT:
    case EPIPE:
    case FI_EIO:
      return Status::kRemote;
    default: return Status::kSystem;
  }
}

// EFA settings NCCL jobs need, where this libfabric has them (1.18+; compiled out against 1.17):
// - no CUDA calls from inside the provider: it runs on NCCL's proxy threads, where a CUDA call can deadlock
//   against a capturing CUDA graph (the GPU buffers are registered through FI_HMEM instead);
// - device RDMA for GPU buffers where the NIC offers it.
// And whether the device itself performs RDMA writes (FI_OPT_EFA_EMULATED_WRITE, asked after the options above,
// which it depends on): where it does not, the provider emulates fi_write with messages it copies into place
// while progressing, so a receive cannot be completed before its data is there (FabricDevice::hardwarePlacement).
// A libfabric that cannot say counts as emulating.
void Endpoint::applyProviderOptions(FabricDevice& dev, fid_ep* ep) {
  if (dev.props().provider != "efa") return;
#if FI_VERSION_GE(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), FI_VERSION(1, 18))
  bool no = false;
  int rc = fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_CUDA_API_PERMITTED, &no, sizeof(no));
  if (rc != 0 && rc != -FI_EOPNOTSUPP) {
    WEFT_WARN("efa: FI_OPT_CUDA_API_PERMITTED=false refused ({}); GPU buffers may not be usable", fi_strerror(-rc));
  }
  if ((dev.props().ptrSupport & NCCL_PTR_CUDA) != 0) {
    bool yes = true;
    rc = fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_EFA_USE_DEVICE_RDMA, &yes, sizeof(yes));
    if (rc != 0) WEFT_INFO(NCCL_NET, "efa: device RDMA not available ({})", fi_strerror(-rc));
  }
  bool emulated = true;
  size_t len = sizeof(emulated);
  rc = fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_EFA_EMULATED_WRITE, &emulated, &len);
  dev.noteDeviceWrites(rc == 0 && !emulated,
                       rc == 0 ? (emulated ? "the provider emulates RDMA writes on this device" : "device RDMA writes")
                               : fmt::format("FI_OPT_EFA_EMULATED_WRITE: {}", fi_strerror(-rc)));
#else
  (void)ep;
  dev.noteDeviceWrites(false, "built against a libfabric without FI_OPT_EFA_EMULATED_WRITE (1.18+)");
  static bool once = [] {
    WEFT_INFO(NCCL_INIT | NCCL_NET, "efa: built against libfabric {}.{}, which lacks FI_OPT_CUDA_API_PERMITTED and "
              "FI_OPT_EFA_USE_DEVICE_RDMA; build against 1.18+ for GPU buffers on EFA",
              FI_MAJOR_VERSION, FI_MINOR_VERSION);
    return true;
  }();
  (void)once;
#endif
}

namespace {
std::atomic<int64_t> gOpen{0};    // endpoints open in this process
std::atomic<int64_t> gProbes{0};  // liveness probes handed to the provider
std::atomic<int64_t> gStalls{0};  // stall warnings (WEFT_STALL_S)
std::atomic<int64_t> gFlushReads{0};  // read-back flush reads completed
}  // namespace

static_assert(sizeof(ConnectRequest) >= wire::kRequestBufBytes, "a request of any version must fit requestIn");

size_t Endpoint::cqEntries(const fi_info* info, bool shared) {
  const size_t priv = 4 * (kMaxRequests * kMaxRecvs) + 64;
  if (!shared) return priv;
  size_t tx = info != nullptr && info->tx_attr != nullptr ? info->tx_attr->size : 0;
  size_t rx = info != nullptr && info->rx_attr != nullptr ? info->rx_attr->size : 0;
  return std::max(priv, tx + rx + kSharedOfferRecvs + 64);
}

Status Endpoint::open(FabricDevice& dev, std::unique_ptr<Endpoint>* out, bool shared) {
  Status st = dev.open();
  if (st != Status::kOk) return st;
  std::unique_ptr<Endpoint> e(new Endpoint(dev));
  e->ctl_ = std::make_unique<Control>();
  // shm before libfabric 2.0 keeps posted receives and early messages in one set of rx_size entries (1.17: -FI_ENOMEM
  // when they are used up, and a deadlock with more receives than that posted in the reverse order of the sends):
  // receives past a budget only claim messages already there. 2.x's shm takes receives through the shared receive
  // context of util_srx.c, whose entry pool grows (chunks of rx_size): no budget there (the unit test "shm: receives
  // posted past the endpoint's budget..." and comms.cross_order pass on 2.1 without it).
  if (dev.props().provider == "shm" && FI_MAJOR(fi_version()) < 2 && dev.info() != nullptr &&
      dev.info()->rx_attr != nullptr) {
    const int64_t rx = static_cast<int64_t>(dev.info()->rx_attr->size);
    e->recvBudget_ = std::max<int64_t>(16, (rx - kSharedOfferRecvs - 64) / 2);
  }
  e->ctl_->probeOut[0] = wire::kProbeBody;
  e->ctl_->noticeOut[0] = wire::kCloseNotice;
  e->ctl_->ackOut[0] = wire::kCloseAck;
  // make_unique value-initializes: every byte sent from Control starts zeroed.
  const fi_info* info = dev.info();
  const char* where = dev.props().name.c_str();

  if (Status st = dev.registerInternal(e->ctl_.get(), sizeof(Control), "control buffers", &e->ctlMr_, &e->ctlDesc_);
      st != Status::kOk) {
    return st;
  }

  fi_cq_attr cqAttr{};
  cqAttr.format = FI_CQ_FORMAT_TAGGED;
  cqAttr.wait_obj = FI_WAIT_NONE;
  cqAttr.size = cqEntries(info, shared);
  fid_cq* cq = nullptr;
  int rc = fi_cq_open(dev.domain(), &cqAttr, &cq, nullptr);
  if (rc != 0) {
    WEFT_WARN("fi_cq_open on {} failed: {}", where, fi_strerror(-rc));
    return Status::kSystem;
  }
  e->cq_.reset(cq);
  if (shared) {
    WEFT_INFO(NCCL_NET, "shared endpoint on {}: completion queue of {} entries for the provider's tx {} and rx {}", where,
              cqAttr.size, info->tx_attr != nullptr ? info->tx_attr->size : 0,
              info->rx_attr != nullptr ? info->rx_attr->size : 0);
  }

  fi_av_attr avAttr{};
  avAttr.type = info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
  avAttr.count = 8;
  fid_av* av = nullptr;
  rc = fi_av_open(dev.domain(), &avAttr, &av, nullptr);
  if (rc != 0) {
    WEFT_WARN("fi_av_open on {} failed: {}", where, fi_strerror(-rc));
    return Status::kSystem;
  }
  e->av_.reset(av);

  fid_ep* ep = nullptr;
  rc = fi_endpoint(dev.domain(), const_cast<fi_info*>(info), &ep, nullptr);
  if (rc != 0) {
    WEFT_WARN("fi_endpoint on {} failed: {}", where, fi_strerror(-rc));
    return Status::kSystem;
  }
  e->ep_.reset(ep);
  applyProviderOptions(dev, ep);
  if (Status st = dev.nameEndpoint(ep, "endpoint"); st != Status::kOk) return st;
  if ((rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0 || (rc = fi_ep_bind(ep, &av->fid, 0)) != 0 ||
      (rc = fi_enable(ep)) != 0) {
    WEFT_WARN("binding/enabling the endpoint on {} failed: {}", where, fi_strerror(-rc));
    return Status::kSystem;
  }
  std::vector<uint8_t> name(256);
  size_t len = name.size();
  rc = fi_getname(&ep->fid, name.data(), &len);
  if (rc != 0 || len > sizeof(ConnectRequest::addr)) {
    WEFT_WARN("fi_getname on {} failed: {}", where, rc != 0 ? fi_strerror(-rc) : "address too long");
    return Status::kSystem;
  }
  name.resize(len);
  e->name_ = std::move(name);
  if (dev.flushes()) {
    if (Status st = e->insert(e->name_.data(), e->name_.size(), &e->self_); st != Status::kOk) return st;
  }
  if (Status st = e->postProbeRecv(); st != Status::kOk) return st;
  e->counted_ = true;
  gOpen.fetch_add(1, std::memory_order_relaxed);
  *out = std::move(e);
  return Status::kOk;
}

// The endpoint closes first, while every buffer, registration and context it may still touch exists: the offer
// pool, the liveness contexts and the control buffers are members declared after it (destroyed before it), and a
// message arriving while rxm closes was copied into the freed offer pool (found by the hostile-message test).
//
// rxm over verbs (libfabric up to 2.6 at least) closes a connection's verbs endpoint before it reads what that
// endpoint left in the shared queue: a flow-control credit the peer sent meanwhile is then handed the freed endpoint
// (rxm_close_conn -> rxm_flush_msg_cq -> rxm_handle_credit; an assertion in a debug build, a crash or silent
// corruption otherwise: seen in the soft-RoCE guest under load at the close of a comm's endpoint; fixed on
// libfabric's main branch in August 2026, 697688386, "fix the msg_ep use-after-free at connection teardown"). So
// there the queue is read for a while first (rxm handles the credits while their endpoints exist; anything of ours
// is dropped: no comm is left on the endpoint), which leaves only credits sent within the last moment to the race.
// libfabric 2.x's rxm over tcp has the same order (fi_close of the connection's endpoint, then rxm_flush_msg_cq,
// rxm_conn.c), and a message that arrived meanwhile is handed back to the closed endpoint: rxm_handle_rx_buf ->
// rxm_post_recv crashed both workers of conformance.fabric-tcp.private.v11 on 2.1.0 (an endpoint per connection,
// closed right after its traffic). 1.17's rxm over tcp never did in thousands of such closes: drained there from 2.0.
bool Endpoint::closeRacesArrivals(const std::string& provider) {
  if (provider.find("ofi_rxm") == std::string::npos) return false;
  if (provider.rfind("verbs", 0) == 0) return true;
  return provider.rfind("tcp", 0) == 0 && FI_MAJOR(fi_version()) >= 2;
}

Endpoint::~Endpoint() {
  if (cq_ && ep_ && closeRacesArrivals(dev_.props().provider)) {
    const int64_t until = coarseNowMs() + kCloseDrainMs;
    fi_cq_tagged_entry entries[16];
    do {
      if (fi_cq_read(cq_.get(), entries, 16) == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        (void)fi_cq_readerr(cq_.get(), &err, 0);
      }
    } while (coarseNowMs() < until);
  }
  ep_.reset();
  if (counted_) gOpen.fetch_sub(1, std::memory_order_relaxed);
}

int64_t Endpoint::openCount() { return gOpen.load(std::memory_order_relaxed); }
int64_t Endpoint::probesSent() { return gProbes.load(std::memory_order_relaxed); }
int64_t Endpoint::stalls() { return gStalls.load(std::memory_order_relaxed); }
void Endpoint::countStall() { gStalls.fetch_add(1, std::memory_order_relaxed); }

int64_t Endpoint::probeDeliveredMs(fi_addr_t to) const {
  auto it = liveness_.find(to);
  return it == liveness_.end() || !it->second ? 0 : it->second->deliveredMs;
}

namespace {
std::atomic<int64_t> gRailDowns{0}, gRailRecoveries{0}, gRailFailovers{0}, gMovedMsgs{0}, gRailReadmits{0}, gPeerResets{0};
}  // namespace
int64_t Endpoint::railFailovers() { return gRailFailovers.load(std::memory_order_relaxed); }
int64_t Endpoint::movedMessages() { return gMovedMsgs.load(std::memory_order_relaxed); }
void Endpoint::countRailFailover() { gRailFailovers.fetch_add(1, std::memory_order_relaxed); }
void Endpoint::countMoved() { gMovedMsgs.fetch_add(1, std::memory_order_relaxed); }
int64_t Endpoint::railReadmits() { return gRailReadmits.load(std::memory_order_relaxed); }
void Endpoint::countRailReadmit() { gRailReadmits.fetch_add(1, std::memory_order_relaxed); }
int64_t Endpoint::railDowns() { return gRailDowns.load(std::memory_order_relaxed); }
int64_t Endpoint::railRecoveries() { return gRailRecoveries.load(std::memory_order_relaxed); }
void Endpoint::countRailDown() { gRailDowns.fetch_add(1, std::memory_order_relaxed); }
void Endpoint::countRailRecovery() { gRailRecoveries.fetch_add(1, std::memory_order_relaxed); }
int64_t Endpoint::flushReads() { return gFlushReads.load(std::memory_order_relaxed); }
void Endpoint::countFlushRead() { gFlushReads.fetch_add(1, std::memory_order_relaxed); }

bool Endpoint::writeLenReported(FabricDevice& dev) {
  std::lock_guard<std::mutex> lock(dev.measureMutex());
  if (dev.writeLen() < 0) dev.setWriteLen(measureWriteLen(dev) ? 1 : 0);
  return dev.writeLen() == 1;
}

bool Endpoint::measureWriteLen(FabricDevice& dev) {
  constexpr size_t kLen = 1234;  // not a power of two, not a buffer size: a length no provider would invent
  std::unique_ptr<Endpoint> e;
  if (open(dev, &e) != Status::kOk) return false;
  auto buf = std::make_unique<uint8_t[]>(2 * 4096);
  MemHandle* mh = nullptr;
  if (dev.mrCache().reg(buf.get(), 2 * 4096, NCCL_PTR_HOST, &mh) != Status::kOk) return false;
  struct Dereg {
    FabricDevice& dev;
    MemHandle* mh;
    ~Dereg() { dev.mrCache().dereg(mh); }
  } dereg{dev, mh};
  fi_addr_t self = FI_ADDR_UNSPEC;
  if (e->insert(e->name_.data(), e->name_.size(), &self) != Status::kOk) return false;
  const uint64_t target = dev.remoteAddr(reinterpret_cast<uintptr_t>(buf.get() + 4096), mh->entry->base);
  OpContext ctx;
  ctx.kind = OpKind::kCtrlSend;
  ssize_t rc = -FI_EAGAIN;
  bool sent = false, landed = false;
  size_t len = 0;
  const int64_t deadline = coarseNowMs() + 2000;
  while (!landed && coarseNowMs() < deadline) {
    if (rc == -FI_EAGAIN) {
      rc = fi_writedata(e->ep(), buf.get(), kLen, mh->desc(), 0x5eed, self, target, mh->entry->key, &ctx.fi);
      if (rc != 0 && rc != -FI_EAGAIN) {
        WEFT_INFO(NCCL_NET, "{}: measuring the write length at the target: fi_writedata failed ({})",
                  dev.props().name, fi_strerror(static_cast<int>(-rc)));
        return false;
      }
    }
    fi_cq_tagged_entry entries[4];
    ssize_t n = fi_cq_read(e->cq_.get(), entries, 4);
    for (ssize_t i = 0; i < n; ++i) {
      if ((entries[i].flags & FI_REMOTE_CQ_DATA) != 0 && entries[i].data == 0x5eed) {
        landed = true;
        len = entries[i].len;
      } else if (entries[i].op_context == &ctx.fi) {
        sent = true;
      }
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(e->cq_.get(), &err, 0);
      WEFT_INFO(NCCL_NET, "{}: measuring the write length at the target: {}", dev.props().name,
                fi_strerror(err.err));
      return false;
    }
  }
  // The endpoint goes only once our own write has completed (or the bound passed): nothing of it stays in flight.
  for (int64_t until = coarseNowMs() + 1000; !sent && coarseNowMs() < until;) {
    fi_cq_tagged_entry entries[4];
    ssize_t n = fi_cq_read(e->cq_.get(), entries, 4);
    for (ssize_t i = 0; i < n; ++i) sent = sent || entries[i].op_context == &ctx.fi;
  }
  WEFT_INFO(NCCL_INIT | NCCL_NET, "{} ({}): an RMA write's length at the target is {}", dev.props().name,
            dev.props().provider, landed ? (len == kLen ? "reported" : fmt::format("not reported (len {})", len))
                                         : "unknown (the write did not land in time)");
  return landed && len == kLen;
}

// Each peer address once: a shared endpoint meets the same peer for many connections.
Status Endpoint::insert(const void* addr, size_t len, fi_addr_t* out) {
  std::string key(static_cast<const char*>(addr), len);
  if (auto it = peers_.find(key); it != peers_.end()) {
    *out = it->second;
    return Status::kOk;
  }
  fi_addr_t a = FI_ADDR_UNSPEC;
  int rc = fi_av_insert(av_.get(), addr, 1, &a, 0, nullptr);
  if (rc != 1) {
    WEFT_WARN("fi_av_insert of peer {} on {} failed: {}", addrString(addr, len), dev_.props().name,
              rc < 0 ? fi_strerror(-rc) : "address not inserted");
    return Status::kSystem;
  }
  peers_.emplace(std::move(key), a);
  *out = a;
  return Status::kOk;
}

Status Endpoint::resetPeer(fi_addr_t to) {
  if (!dev_.resetsPeers()) return Status::kInternal;
  const std::string* addr = nullptr;
  for (const auto& [a, f] : peers_) {
    if (f == to) addr = &a;
  }
  if (addr == nullptr) {
    WEFT_WARN("resetting the connection to address {} on {}: not a peer of this endpoint", to, dev_.props().name);
    return Status::kInternal;
  }
  // rxm 1.17 closes the peer's connection without looking at its state (prov/rxm/src/rxm_conn.c:
  // rxm_av_remove_handler -> rxm_close_conn), and one whose last connect failed at once (no route: the link is down)
  // has no endpoint left: closing it crashes. A probe (the peer's endpoint drops it) tells the states apart, posted as
  // nothing else can change the connection meanwhile (the caller holds the group): handed over (connected) or
  // pushed back (connecting), there is a connection to close; refused, there is none, and nothing can land through
  // one (a connection the peer opens from now on carries only what it sends from now on).
  const uint64_t probe[2] = {wire::kProbeBody, 0};
  const ssize_t tried = fi_tinject(ep_.get(), probe, sizeof(probe), to, wire::ctrlTag(wire::CtrlKind::kProbe));
  ++resetGens_[to];
  if (tried != 0 && tried != -FI_EAGAIN) {
    WEFT_INFO(NCCL_NET, "connection to {} on {}: none open ({}): nothing to close", addrString(addr->data(),
              addr->size()), dev_.props().name, fi_strerror(static_cast<int>(-tried)));
    return Status::kOk;
  }
  fi_addr_t again = FI_ADDR_UNSPEC;
  int rc = fi_av_insert(av_.get(), addr->data(), 1, &again, 0, nullptr);
  if (rc != 1 || again != to) {
    WEFT_WARN("resetting the connection to {} on {}: inserting its address again gave {} ({})", addrString(addr->data(),
              addr->size()), dev_.props().name, again, rc < 0 ? fi_strerror(-rc) : "not the same entry");
    if (rc == 1 && again != to) (void)fi_av_remove(av_.get(), &again, 1, 0);
    return Status::kSystem;
  }
  // Whatever the connection left in rxm's own queue is read first (progress only: a read of no entries leaves every
  // completion of ours queued), so that rxm over verbs does not hand a credit it finds after closing the connection
  // its freed endpoint (see ~Endpoint).
  for (int i = 0; i < 16; ++i) (void)fi_cq_read(cq_.get(), nullptr, 0);
  rc = fi_av_remove(av_.get(), &again, 1, 0);  // closes the connection; the first insertion stays
  if (rc != 0) {
    WEFT_WARN("resetting the connection to {} on {}: fi_av_remove: {}", addrString(addr->data(), addr->size()),
              dev_.props().name, fi_strerror(-rc));
    return Status::kSystem;
  }
  gPeerResets.fetch_add(1, std::memory_order_relaxed);
  WEFT_INFO(NCCL_NET, "closed the connection to {} on {} (a rail failed over; the next message opens a new one)",
            addrString(addr->data(), addr->size()), dev_.props().name);
  return Status::kOk;
}

int64_t Endpoint::peerResets() { return gPeerResets.load(std::memory_order_relaxed); }

std::string Endpoint::addrString(const void* addr, size_t len) const {
  (void)len;
  char buf[256];
  size_t n = sizeof(buf);
  const char* s = fi_av_straddr(av_.get(), addr, buf, &n);
  return s != nullptr ? std::string(s) : std::string("<unprintable address>");
}

Status Endpoint::progress(int* read) {
  if (controlQueued_) flushControl();
  fi_cq_tagged_entry entries[16];
  ssize_t n = fi_cq_read(cq_.get(), entries, 16);
  if (read != nullptr) *read = n > 0 ? static_cast<int>(n) : (n == -FI_EAVAIL ? 1 : 0);
  if (n > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      auto* ctx = static_cast<OpContext*>(entries[i].op_context);
      // Remote writes carry no context of ours (libfabric leaves op_context undefined for them: shm 1.17 hands
      // back a stale pointer, found by soak.random); their completion data names the receive they fill.
      if (ctx == nullptr || (entries[i].flags & FI_REMOTE_WRITE) != 0) {
        if ((entries[i].flags & FI_REMOTE_CQ_DATA) != 0 && table_ != nullptr) {
          if (DataSink* sink = table_->forRemoteData(entries[i].data)) sink->onRemoteData(entries[i].data, entries[i].len);
        }
        continue;
      }
      if (isCommOp(ctx->kind)) {
        if (DataSink* sink = table_ != nullptr ? table_->forContext(ctx) : nullptr) sink->onComplete(ctx, entries[i].len);
      } else if (ctx->kind == OpKind::kProbeRecv) {
        onProbe(entries[i].len);
        postProbeRecv();
      } else if (ctx->kind == OpKind::kOfferRecv) {
        const wire::OfferMsg& m = offerPool_[ctx->index];
        const uint32_t id = entries[i].len >= offsetof(wire::OfferMsg, entry) ? m.toComm : 0;
        if (DataSink* sink = table_ != nullptr && id != 0 ? table_->forId(id, "a buffer offer") : nullptr) {
          sink->onOffer(&m, entries[i].len);
        }
        postOfferPoolRecv(ctx->index);
      } else {
        handleControl(ctx, true, Status::kOk);
      }
    }
    if (table_ != nullptr) table_->runDeferred();
    return Status::kOk;
  }
  if (n == -FI_EAGAIN) return Status::kOk;
  if (n != -FI_EAVAIL) {
    WEFT_WARN("fi_cq_read on {} failed: {}", dev_.props().name, fi_strerror(static_cast<int>(-n)));
    return Status::kSystem;
  }
  fi_cq_err_entry err{};
  ssize_t rc = fi_cq_readerr(cq_.get(), &err, 0);
  if (rc < 0) {
    if (rc == -FI_EAGAIN) return Status::kOk;
    WEFT_WARN("fi_cq_readerr on {} failed: {}", dev_.props().name, fi_strerror(static_cast<int>(-rc)));
    return Status::kSystem;
  }
  auto* ctx = static_cast<OpContext*>(err.op_context);
  Status st = statusOfFiError(err.err);
  char provBuf[256] = {};
  const char* provMsg = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, provBuf, sizeof(provBuf));
  if (ctx == nullptr) {
    WEFT_WARN("completion error without a request on {}: {} ({})", dev_.props().name, fi_strerror(err.err),
              provMsg ? provMsg : "");
    return st;
  }
  if (ctx->kind == OpKind::kOfferRecv) {
    if (err.err != FI_ECANCELED) {
      WEFT_WARN("a buffer-offer receive on {} failed: {} ({}); it is not posted again", dev_.props().name,
                fi_strerror(err.err), provMsg ? provMsg : "");
    }
    return Status::kOk;
  }
  if (isCommOp(ctx->kind)) {
    if (err.err == FI_ETRUNC) {
      WEFT_WARN("on {}: the peer sent {} bytes more than the posted receive buffer holds ({} B): a send larger "
                "than its receive is not allowed",
                dev_.props().name, err.olen, err.len);
    } else if (err.err != FI_ECANCELED) {
      WEFT_WARN("transfer failed on {} ({}): {} ({})", dev_.props().name, dev_.props().provider, fi_strerror(err.err),
                provMsg ? provMsg : "");
    }
    if (DataSink* sink = table_ != nullptr ? table_->forContext(ctx) : nullptr) sink->onError(this, ctx, err.err, st);
  } else {
    handleControl(ctx, false, st);
  }
  return Status::kOk;
}

void Endpoint::handleControl(OpContext* ctx, bool ok, Status st) {
  switch (ctx->kind) {
    case OpKind::kConnRequest:
      if (ok) {
        onRequest(ctx->index);
      } else if (st != Status::kOk) {
        WEFT_WARN("on {}: receiving a connection request failed", dev_.props().name);
      }
      postRequestRecv(ctx->index);
      return;
    case OpKind::kConnReply:
      onReply(ctx->index, ok, st);
      return;
    case OpKind::kProbeRecv:
      postProbeRecv();  // a probe from the peer: drained and discarded
      return;
    case OpKind::kProbeSend: {  // the peer's host took it (alive), or it failed (gone)
      auto* l = static_cast<Liveness*>(ctx->owner);
      l->state = Liveness::kIdle;
      if (ok) l->deliveredMs = coarseNowMs();
      if (!ok && st != Status::kOk && l->error == Status::kOk) {
        l->error = st;
        l->errorMs = coarseNowMs();
      }
      return;
    }
    case OpKind::kCtrlSend:
      if (ctx->owner == &connects_) {
        ConnectSlot& c = connects_[ctx->index];
        c.request = SlotState::kFree;
        if (!ok && c.error == Status::kOk) c.error = st;
        tryFreeConnect(ctx->index);
      } else {
        replySlot_[ctx->index] = SlotState::kFree;
        ++replyGen_[ctx->index];
        if (!ok) WEFT_WARN("on {}: sending a connection reply failed", dev_.props().name);
      }
      return;
    case OpKind::kData:
    case OpKind::kOfferSend:
    case OpKind::kOfferRecv:
    case OpKind::kNote:
    case OpKind::kFlush:
    case OpKind::kAck: return;
  }
}

// Receives of weft's own messages (handshake, probes, offers) are posted on an endpoint that carries little
// else, so a full queue clears after a few progress calls; the bound keeps a broken provider from spinning here
// forever. The progress calls route completions through the comm table as any other: this may run inside a
// progress call of a comm, and its data completions must not be dropped.
Status Endpoint::postOwnRecv(void* buf, size_t len, void* desc, fi_addr_t from, uint64_t tag, OpContext& ctx,
                             const char* what) {
  ssize_t rc = -FI_EAGAIN;
  for (int tries = 0; tries < 1000 && rc == -FI_EAGAIN; ++tries) {
    rc = fi_trecv(ep_.get(), buf, len, desc, from, tag, 0, &ctx.fi);  // exact: see wire.h (tags)
    if (rc == -FI_EAGAIN && progress() != Status::kOk) rc = -FI_EIO;
  }
  if (rc != 0) {
    WEFT_WARN("posting the {} receive on {} failed: {}", what, dev_.props().name, fi_strerror(static_cast<int>(-rc)));
    return Status::kSystem;
  }
  return Status::kOk;
}

// Control receives: always from any source; some providers (sockets) see replies arrive over a connection the
// listener opened back, under another address; replies echo the connector's token, which it checks instead.
Status Endpoint::postControlRecv(void* buf, size_t len, uint64_t tag, OpContext& ctx, OpKind kind, const char* what) {
  ctx.kind = kind;
  return postOwnRecv(buf, len, ctlDesc_, FI_ADDR_UNSPEC, tag, ctx, what);
}

Status Endpoint::postProbeRecv() {
  // Any comm's probes: they are drained and discarded, whichever comm they name.
  return postControlRecv(ctl_->probeIn, sizeof(ctl_->probeIn), wire::ctrlTag(wire::CtrlKind::kProbe), probeRecvCtx_,
                         OpKind::kProbeRecv, "probe");
}

Endpoint::PeerVerdict Endpoint::checkPeer(fi_addr_t to, int64_t stalledSinceMs, int64_t nowMs, int64_t intervalMs,
                                          int64_t timeoutMs, Status* why) {
  std::unique_ptr<Liveness>& slot = liveness_[to];
  if (!slot) {
    slot = std::make_unique<Liveness>();
    slot->ctx.owner = slot.get();
    slot->ctx.kind = OpKind::kProbeSend;
  }
  Liveness& l = *slot;
  if (l.error != Status::kOk && l.errorMs < stalledSinceMs) l.error = Status::kOk;  // older than this stall
  if (l.state == Liveness::kQueued) trySendProbe(to, l, nowMs);
  if (l.error != Status::kOk) {
    *why = l.error;
    return PeerVerdict::kGone;
  }
  if (l.state != Liveness::kIdle) return nowMs - l.sentMs > timeoutMs ? PeerVerdict::kUnreachable : PeerVerdict::kOk;
  if (l.sentMs == 0 || nowMs - l.sentMs >= intervalMs) {
    l.state = Liveness::kQueued;
    l.sentMs = nowMs;
    trySendProbe(to, l, nowMs);
    if (l.error != Status::kOk) {
      *why = l.error;
      return PeerVerdict::kGone;
    }
  }
  return PeerVerdict::kOk;
}

// Probes (id 0) are drained. A close notice or ack names the comm it is for; a comm closed already (a notice
// after its receive comm went, an ack after its send comm stopped waiting) is a stray the table counts.
void Endpoint::onProbe(size_t len) {
  if (len < sizeof(ctl_->probeIn) || table_ == nullptr) return;
  const uint64_t body = ctl_->probeIn[0];
  if (body == wire::kRailDown) {  // {kRailDown, comm id | rails << 32}
    const uint64_t id = ctl_->probeIn[1] & 0xffffffffu;
    if (id == 0 || id > wire::kMaxCommId) return;
    if (DataSink* sink = table_->forId(static_cast<uint32_t>(id), "a rail-down note")) {
      sink->onRailNote(static_cast<uint32_t>(ctl_->probeIn[1] >> 32));
    }
    return;
  }
  if (body == wire::kRailUp) {
    const uint64_t w = ctl_->probeIn[1];
    const uint32_t id = wire::railUpComm(w);
    if (id == 0 || id > wire::kMaxCommId) return;
    if (DataSink* sink = table_->forId(id, "a rail re-admission note")) sink->onRailUp(this, w);
    return;
  }
  const uint64_t id = ctl_->probeIn[1];
  if (id == 0 || id > wire::kMaxCommId) return;
  if (body == wire::kWritesOver) {
    if (DataSink* sink = table_->forId(static_cast<uint32_t>(id), "a writes-over note")) sink->onWritesOver(this);
    return;
  }
  if (body != wire::kCloseNotice && body != wire::kCloseAck) return;
  if (DataSink* sink = table_->forId(static_cast<uint32_t>(id), body == wire::kCloseAck ? "a close ack" : "a close notice")) {
    sink->onCloseNote(this, body == wire::kCloseAck);
  }
}

Status Endpoint::sendCloseNote(fi_addr_t to, uint32_t commId, bool ack, OpContext& ctx, bool* again) {
  *again = false;
  // The body is the endpoint's: notes are sent only by comms with endpoints of their own (one comm, one note of
  // each kind at a time), so the id written here is still the one in the buffer when the provider reads it.
  uint64_t* body = ack ? ctl_->ackOut : ctl_->noticeOut;
  body[1] = commId;
  ssize_t rc = fi_tsend(ep_.get(), body, sizeof(ctl_->noticeOut), ctlDesc_, to, wire::ctrlTag(wire::CtrlKind::kProbe),
                        &ctx.fi);
  if (rc == 0) return Status::kOk;
  if (rc == -FI_EAGAIN) {
    *again = true;
    return Status::kOk;
  }
  return statusOfFiError(static_cast<int>(-rc));
}

// A probe the provider pushes back on stays queued (retried at the next look): one it cannot even hand over
// within the timeout counts as undelivered. Probes name no comm (the receiver drains any).
void Endpoint::trySendProbe(fi_addr_t to, Liveness& l, int64_t nowMs) {
  ssize_t rc = fi_tsend(ep_.get(), ctl_->probeOut, sizeof(ctl_->probeOut), ctlDesc_, to,
                        wire::ctrlTag(wire::CtrlKind::kProbe), &l.ctx.fi);
  if (rc == 0) {
    l.state = Liveness::kInFlight;
    gProbes.fetch_add(1, std::memory_order_relaxed);
  } else if (rc != -FI_EAGAIN) {
    l.state = Liveness::kIdle;
    l.error = statusOfFiError(static_cast<int>(-rc));
    l.errorMs = nowMs;
  }
}

Status Endpoint::postFlushRead(uint64_t remoteAddr, uint64_t key, OpContext* ctx, bool* again) {
  *again = false;
  if (self_ == FI_ADDR_UNSPEC) return Status::kInternal;
  ssize_t rc = fi_read(ep_.get(), &ctl_->flushSink, 1, ctlDesc_, self_, remoteAddr, key, &ctx->fi);
  if (rc == 0) return Status::kOk;
  if (rc == -FI_EAGAIN) {
    *again = true;
    return Status::kOk;
  }
  WEFT_WARN("flush: fi_read on {} failed: {}", dev_.props().name, fi_strerror(static_cast<int>(-rc)));
  return statusOfFiError(static_cast<int>(-rc));
}

int64_t Endpoint::linkDownForMs(int64_t nowMs, bool fresh) {
  if (!fresh && nowMs - linkCheckMs_ < 100) return linkDownSinceMs_ == 0 ? 0 : nowMs - linkDownSinceMs_;
  linkCheckMs_ = nowMs;
  if (sysfs::linkUp(dev_.linkSource())) {
    linkDownSinceMs_ = 0;
    return 0;
  }
  if (linkDownSinceMs_ == 0) linkDownSinceMs_ = nowMs;
  return nowMs - linkDownSinceMs_;
}

// Control sends wait here until the provider takes them: rxm answers -FI_EAGAIN until its connection to the
// peer is up, which needs the peer to make progress too, so they are retried on every later progress call.
void Endpoint::flushControl() {
  if (controlRetryMs_ != 0 && coarseNowMs() < controlRetryMs_) return;  // (still queued)
  bool still = false, unreachable = false;
  // Hands one queued control message to the provider: in flight, still queued (EAGAIN), or failed (returned as
  // a status, the slot freed, a warning naming `what` when given).
  auto trySend = [&](SlotState& state, const void* buf, size_t len, fi_addr_t to, uint64_t tag, OpContext& ctx,
                     const char* what) {
    if (state != SlotState::kQueued) return Status::kOk;
    ssize_t rc = fi_tsend(ep_.get(), buf, len, ctlDesc_, to, tag, &ctx.fi);
    if (rc == 0) {
      state = SlotState::kInFlight;
      return Status::kOk;
    }
    if (rc == -FI_EAGAIN) {
      still = true;
      return Status::kOk;
    }
    if (rc == -FI_ENETUNREACH || rc == -FI_EHOSTUNREACH) {  // the link is down (for now): tried again shortly
      if (controlRetryMs_ == 0 && !unreachable) {
        WEFT_INFO(NCCL_NET, "sending {} on {}: {}; trying again every 100 ms",
                  what != nullptr ? what : "a control message", dev_.props().name, fi_strerror(static_cast<int>(-rc)));
      }
      unreachable = still = true;
      return Status::kOk;
    }
    if (what != nullptr) {
      WEFT_WARN("sending {} on {} failed: {}", what, dev_.props().name, fi_strerror(static_cast<int>(-rc)));
    }
    state = SlotState::kFree;
    return statusOfFiError(static_cast<int>(-rc));
  };
  for (int i = 0; i < kConnectSlots; ++i) {
    ConnectSlot& c = connects_[i];
    const ConnectRequest& r = ctl_->requestOut[i];
    if (Status st = trySend(c.request, &r, offsetof(ConnectRequest, addr) + r.addrLen, c.to,
                            wire::ctrlTag(wire::CtrlKind::kConnRequest), c.sendCtx, "the connection request");
        st != Status::kOk && c.error == Status::kOk) {
      c.error = st;
    }
  }
  for (int i = 0; i < kReplySlots; ++i) {
    const SlotState before = replySlot_[i];
    trySend(replySlot_[i], &ctl_->replyOut[i], replyLen_[i], replyTo_[i],
            wire::ctrlTag(wire::CtrlKind::kConnReply, replyComm_[i]), replySendCtx_[i], "a connection reply");
    if (before == SlotState::kQueued && replySlot_[i] == SlotState::kFree) ++replyGen_[i];  // failed: it is over
  }
  controlQueued_ = still;
  controlRetryMs_ = unreachable ? coarseNowMs() + 100 : 0;
}

Status Endpoint::ensureOfferPool(int n) {
  if (offerPoolSize_ > 0) return Status::kOk;
  // On the NIC's NUMA node, as the comms' requests (docs/topology.md).
  offerPool_ = numa::makeArray<wire::OfferMsg>(static_cast<size_t>(n), dev_.props().numaNode);
  offerPoolCtx_ = numa::makeArray<OpContext>(static_cast<size_t>(n), dev_.props().numaNode);
  if (!offerPool_ || !offerPoolCtx_) {
    WEFT_WARN("{}: no memory for {} offer receive buffers", dev_.props().name, n);
    return Status::kSystem;
  }
  std::memset(static_cast<void*>(offerPool_.get()), 0, sizeof(wire::OfferMsg) * static_cast<size_t>(n));
  if (Status st = dev_.registerInternal(offerPool_.get(), sizeof(wire::OfferMsg) * static_cast<size_t>(n),
                                        "offer receive buffers", &offerPoolMr_, &offerPoolDesc_);
      st != Status::kOk) {
    return st;
  }
  offerPoolSize_ = n;
  for (int i = 0; i < n; ++i) {
    offerPoolCtx_[i].index = static_cast<uint16_t>(i);
    if (Status st = postOfferPoolRecv(i); st != Status::kOk) return st;
  }
  return Status::kOk;
}

// Any comm's offers: each names its comm in the body (wire::OfferMsg::toComm).
Status Endpoint::postOfferPoolRecv(int i) {
  offerPoolCtx_[i].kind = OpKind::kOfferRecv;
  return postOwnRecv(&offerPool_[i], sizeof(wire::OfferMsg), offerPoolDesc_, FI_ADDR_UNSPEC,
                     wire::ctrlTag(wire::CtrlKind::kOffer), offerPoolCtx_[i], "buffer-offer");
}

}  // namespace weft::fabric
