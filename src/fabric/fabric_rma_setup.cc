// SPDX-License-Identifier: Apache-2.0
// Setting up the device API's libfabric transport: devices, the endpoint, listen, the collective connect, window
// registration and teardown (fabric_rma.h says how it works).
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstring>

#include "fabric/fabric_rma.h"
#include "weft/common/clock.h"
#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"

namespace weft::fabric {
namespace {

uint32_t rmaProviderHash(const std::string& provider) {
  const std::string s = "weft-rma-fabric/" + provider;
  return fnv1a32(s.data(), s.size());
}

class FabricRmaListen final : public rma::RmaListen {
 public:
  FabricRmaListen(int dev, uint64_t token, std::unique_ptr<RmaEndpoint> ep)
      : dev_(dev), token_(token), ep_(std::move(ep)) {}
  int dev() const override { return dev_; }
  uint64_t token() const { return token_; }
  std::unique_ptr<RmaEndpoint> take() { return std::move(ep_); }

 private:
  int dev_;
  uint64_t token_;
  std::unique_ptr<RmaEndpoint> ep_;  // nullptr once a connect took it
};

}  // namespace

// ---- devices and endpoints ----------------------------------------------------------------------------------------

std::unique_ptr<FabricRmaTransport> FabricRmaTransport::discover(std::string* why) {
  const std::string& provider = params::getString("WEFT_PROVIDER");
  const std::string& iface = params::getString("WEFT_IFACE");
  std::vector<Candidate> found;
  std::string reasons;
  const std::vector<std::string> order = provider.empty() ? defaultProviders() : std::vector<std::string>{provider};
  for (const auto& p : order) {
    std::string w;
    found = filterInterfaces(probeRma(p, &w), iface);
    if (!found.empty()) break;
    reasons += (reasons.empty() ? "" : "; ") + p + ": " + (w.empty() ? "no domain matches WEFT_IFACE" : w);
  }
  if (found.empty()) {
    *why = "no libfabric device with RMA reads and writes (" + reasons + ")";
    return nullptr;
  }
  auto t = std::unique_ptr<FabricRmaTransport>(new FabricRmaTransport());
  const int maxRecvs = static_cast<int>(params::getInt("WEFT_MAX_RECVS"));
  for (auto& c : found) {
    c.props.maxRecvs = maxRecvs;
    const size_t maxMsg = c.info->ep_attr != nullptr ? c.info->ep_attr->max_msg_size : 0;
    if (maxMsg > 0) {
      c.props.maxP2pBytes = std::min<size_t>(c.props.maxP2pBytes, maxMsg);
      c.props.maxCollBytes = std::min<size_t>(c.props.maxCollBytes, maxMsg);
    }
    const int index = static_cast<int>(t->devices_.size());
    t->devices_.push_back(std::make_unique<FabricDevice>(index, std::move(c)));
    t->devices_.back()->markRma();
  }
  return t;
}

Status RmaEndpoint::open(FabricDevice& dev, int nranksHint, std::unique_ptr<RmaEndpoint>* out) {
  if (Status st = dev.open(); st != Status::kOk) return st;
  auto e = std::make_unique<RmaEndpoint>();
  e->dev = &dev;
  const fi_info* info = dev.info();
  const char* where = dev.props().name.c_str();
  fi_cq_attr cqAttr{};
  cqAttr.format = FI_CQ_FORMAT_DATA;
  cqAttr.wait_obj = FI_WAIT_NONE;
  // Every operation NCCL may have in flight, the control messages both ways, and the writes landing here.
  cqAttr.size = std::max<size_t>(4096, info->rx_attr != nullptr ? info->rx_attr->size * 2 : 0);
  fid_cq* cq = nullptr;
  int rc = fi_cq_open(dev.domain(), &cqAttr, &cq, nullptr);
  if (rc != 0) {
    WEFT_WARN("RMA: fi_cq_open on {} failed: {}", where, fi_strerror(-rc));
    return Status::kSystem;
  }
  e->cq.reset(cq);
  fi_av_attr avAttr{};
  avAttr.type = info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
  avAttr.count = static_cast<size_t>(std::max(nranksHint, 8));
  fid_av* av = nullptr;
  rc = fi_av_open(dev.domain(), &avAttr, &av, nullptr);
  if (rc != 0) {
    WEFT_WARN("RMA: fi_av_open on {} failed: {}", where, fi_strerror(-rc));
    return Status::kSystem;
  }
  e->av.reset(av);
  // rxm over tcp: the endpoint asks for send-after-write order (fabric_rma.h says why signals rely on it there).
  InfoPtr ordered;
  if (dev.props().provider == "tcp;ofi_rxm" && (ordered = InfoPtr(fi_dupinfo(info))) && ordered->tx_attr != nullptr &&
      ordered->rx_attr != nullptr) {
    ordered->tx_attr->msg_order |= FI_ORDER_SAW;
    ordered->rx_attr->msg_order |= FI_ORDER_SAW;
  } else {
    ordered.reset();
  }
  fid_ep* ep = nullptr;
  rc = fi_endpoint(dev.domain(), const_cast<fi_info*>(ordered ? ordered.get() : info), &ep, nullptr);
  if (rc != 0) {
    WEFT_WARN("RMA: fi_endpoint on {} failed: {}", where, fi_strerror(-rc));
    return Status::kSystem;
  }
  e->ep.reset(ep);
  e->sendAfterWrite = ordered != nullptr;
  if (Status st = dev.nameEndpoint(ep, "RMA"); st != Status::kOk) return st;
  if ((rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0 || (rc = fi_ep_bind(ep, &av->fid, 0)) != 0 ||
      (rc = fi_enable(ep)) != 0) {
    WEFT_WARN("RMA: binding or enabling the endpoint on {} failed: {}", where, fi_strerror(-rc));
    return Status::kSystem;
  }
  std::vector<uint8_t> name(256);
  size_t len = name.size();
  rc = fi_getname(&ep->fid, name.data(), &len);
  if (rc != 0 || len > WireHandle::kMaxAddr) {
    WEFT_WARN("RMA: fi_getname on {} failed: {}", where,
              rc != 0 ? fi_strerror(-rc) : fmt::format("an address of {} bytes (at most {} fit a handle)", len,
                                                       WireHandle::kMaxAddr));
    return Status::kSystem;
  }
  name.resize(len);
  e->name = std::move(name);
  *out = std::move(e);
  return Status::kOk;
}

Status FabricRmaTransport::listen(int dev, void* handle, rma::RmaListen** out) {
  if (dev < 0 || dev >= deviceCount() || handle == nullptr || out == nullptr) {
    WEFT_WARN("RMA listen: device {} does not exist (weft's RMA has {} devices)", dev, deviceCount());
    return Status::kInternal;
  }
  FabricDevice& d = *devices_[static_cast<size_t>(dev)];
  std::unique_ptr<RmaEndpoint> ep;
  if (Status st = RmaEndpoint::open(d, 8, &ep); st != Status::kOk) return st;
  WireHandle h;
  h.backend = BackendId::kFabric;
  h.providerHash = rmaProviderHash(d.props().provider);
  h.token = randomToken();
  h.addrLen = static_cast<uint16_t>(ep->name.size());
  std::memcpy(h.addr.data(), ep->name.data(), ep->name.size());
  h.encode(handle);
  WEFT_INFO(NCCL_NET, "RMA: listening on {} ({}), an address of {} bytes", d.props().name, d.props().provider,
            ep->name.size());
  *out = new FabricRmaListen(dev, h.token, std::move(ep));
  return Status::kOk;
}

Status FabricRmaTransport::connect(void* const* handles, int nranks, int rank, rma::RmaListen* listenBase,
                                   uint64_t commId, rma::RmaComm** out) {
  auto* listen = dynamic_cast<FabricRmaListen*>(listenBase);
  if (handles == nullptr || out == nullptr || listen == nullptr || nranks < 1 || rank < 0 || rank >= nranks) {
    WEFT_WARN("RMA connect: called with rank {} of {}, handles {}, listen comm {}", rank, nranks,
              static_cast<const void*>(handles), static_cast<const void*>(listenBase));
    return Status::kInternal;
  }
  FabricDevice& d = *devices_[static_cast<size_t>(listen->dev())];
  std::vector<std::vector<uint8_t>> addrs(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    WireHandle h;
    if (handles[r] == nullptr ||
        decodeForConnect(handles[r], d.props().name, BackendId::kFabric, rmaProviderHash(d.props().provider),
                         "weft's libfabric RMA over " + d.props().provider, &h) != Status::kOk) {
      WEFT_WARN("RMA connect (rank {} of {}): rank {}'s handle is not one of this transport's", rank, nranks, r);
      return Status::kInvalidUsage;
    }
    if (r == rank && h.token != listen->token()) {
      WEFT_WARN("RMA connect (rank {} of {}): this rank's handle is not its listen comm's", rank, nranks);
      return Status::kInvalidUsage;
    }
    addrs[static_cast<size_t>(r)].assign(h.addr.begin(), h.addr.begin() + h.addrLen);
  }
  std::unique_ptr<RmaEndpoint> ep = listen->take();
  if (ep == nullptr) {
    WEFT_WARN("RMA connect: the listen comm was connected already (one connect per listen)");
    return Status::kInternal;
  }
  auto comm = std::make_unique<FabricRmaComm>(rank, nranks, commId, std::move(ep));
  if (Status st = comm->start(addrs); st != Status::kOk) return st;
  WEFT_INFO(NCCL_INIT | NCCL_NET, "RMA: rank {} of {} connected over {} ({}; signals {})", rank, nranks,
            d.props().name, d.props().provider,
            comm->sendsAfterWrites() ? "by the provider's send-after-write order" : "after their writes' count");
  *out = comm.release();
  return Status::kOk;
}

// ---- the comm's set-up --------------------------------------------------------------------------------------------


FabricRmaComm::FabricRmaComm(int rank, int nranks, uint64_t commId, std::unique_ptr<RmaEndpoint> ep)
    : ProviderCommOf(rank, nranks, commId, ep->dev->props(), 0x5746464d),
      ep_(std::move(ep)),
      dev_(*ep_->dev),
      peers_(static_cast<size_t>(nranks)),
      maxMsg_(dev_.maxMsgSize() > 0 ? dev_.maxMsgSize() : SIZE_MAX),
      inject_(dev_.injectSize() >= sizeof(RmaMsg) && params::getBool("WEFT_RMA_INJECT")),
      orderedSignals_(ep_->sendAfterWrite) {
  for (uint32_t i = 0; i < kCtlSlots; ++i) {
    ctlSendCtx_[i].kind = RmaCtx::kCtlSend;
    ctlSendCtx_[i].slot = i;
    ctlRecvCtx_[i].kind = RmaCtx::kCtlRecv;
    ctlRecvCtx_[i].slot = i;
  }
  for (uint32_t i = kCtlSlots; i-- > 0;) ctlFree_.push_back(i);
}

FabricRmaComm::~FabricRmaComm() {
  // The endpoint closes first (cancelling what the provider still holds), then the registrations it used.
  ep_->ep.reset();
  regs_.clear();
}

Status FabricRmaComm::start(const std::vector<std::vector<uint8_t>>& addrs) {
  ctl_ = std::make_unique<Ctl>();
  if (Status st = dev_.registerInternal(ctl_.get(), sizeof(Ctl), "RMA control messages", &ctlMr_, &ctlDesc_);
      st != Status::kOk) {
    return st;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t r = 0; r < addrs.size(); ++r) {
      fi_addr_t a = FI_ADDR_UNSPEC;
      int rc = fi_av_insert(ep_->av.get(), addrs[r].data(), 1, &a, 0, nullptr);
      if (rc != 1) {
        WEFT_WARN("RMA connect (rank {} of {}): fi_av_insert of rank {}'s address failed: {}", rank_, nranks_, r,
                  rc < 0 ? fi_strerror(-rc) : "not inserted");
        return Status::kSystem;
      }
      peers_[r].addr = a;
      peers_[r].heardMs = coarseNowMs();
    }
    for (uint32_t i = 0; i < kCtlSlots; ++i) {
      if (Status st = postRecv(i); st != Status::kOk) return st;
    }
    if (nranks_ > 1) {
      RmaMsg m = msg(RmaMsg::kHello);
      m.origin = static_cast<uint32_t>(rank_);
      m.helloNranks() = static_cast<uint64_t>(nranks_);
      sendCtl(static_cast<uint32_t>((rank_ + 1) % nranks_), m, nullptr);
    }
  }
  // Every other rank's hello came round the ring, and the ones this rank forwards have left.
  return waitFor("the connect of every rank (a hello round the ring)", [&] {
    return failed() || (hellos_ == static_cast<uint32_t>(nranks_ - 1) && sendsDrained());
  }) == Status::kOk && !failed()
             ? Status::kOk
             : Status::kRemote;
}

// ---- windows -------------------------------------------------------------------------------------------------------

Status FabricRmaComm::registerWindow(rma::Window* w, int dmabufFd, uint64_t* addr, uint64_t* key) {
  auto reg = std::make_unique<WindowReg>();
  reg->remote.resize(static_cast<size_t>(nranks_));
  *addr = 0;
  *key = 0;
  if (w->size > 0) {
    fid_mr* mr = nullptr;
    const uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    const auto base = reinterpret_cast<uintptr_t>(w->base);
    if (Status st = dev_.registerAccess(base, w->size, w->cuda ? rma::kPtrCuda : rma::kPtrHost, dmabufFd, 0, access,
                                       &mr);
        st != Status::kOk) {
      return st;
    }
    reg->mr.reset(mr);
    reg->desc = fi_mr_desc(mr);
    *addr = dev_.remoteAddr(base, base);
    *key = fi_mr_key(mr);
  }
  std::lock_guard<std::mutex> lock(mu_);
  regs_[w] = std::move(reg);
  return Status::kOk;
}

void FabricRmaComm::setRemote(rma::Window* w, uint32_t rank, uint64_t addr, uint64_t key) {
  if (WindowReg* reg = regOf(w); reg != nullptr) reg->remote[rank] = RmaRemote{addr, key};
}

}  // namespace weft::fabric
