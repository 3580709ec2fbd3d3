// SPDX-License-Identifier: Apache-2.0
#include "raw_fabric.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <stdexcept>

#include "oob.h"

namespace weft::harness {

const char* rawModeName(RawMode m) { return m == RawMode::kTagged ? "raw-tagged" : "raw-rma"; }

namespace {

[[noreturn]] void raise(const std::string& what, int rc) {
  throw std::runtime_error("raw libfabric: " + what + ": " + fi_strerror(rc < 0 ? -rc : rc));
}

template <typename T>
void closeFid(T* p) {
  if (p != nullptr) fi_close(&p->fid);
}

// Fabric and domain for one (provider, interface), shared by the links of one run.
struct RawDomain {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  uint64_t nextKey = 1;
  ~RawDomain() {
    closeFid(domain);
    closeFid(fabric);
    if (info != nullptr) fi_freeinfo(info);
  }
};

std::shared_ptr<RawDomain> openDomain(const std::string& provider, const std::string& iface) {
  fi_info* hints = fi_allocinfo();
  hints->caps = FI_TAGGED | FI_RMA | FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_SAFE;  // as the plugin must (NCCL registers while data flows)
  hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  hints->domain_attr->control_progress = FI_PROGRESS_MANUAL;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  fi_info* list = nullptr;
  int rc = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0, hints, &list);
  fi_freeinfo(hints);
  if (rc != 0) raise("fi_getinfo(" + provider + ", tagged + RMA, manual progress)", rc);
  const fi_info* pick = nullptr;
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    if (i->fabric_attr->prov_name == nullptr || provider != i->fabric_attr->prov_name) continue;
    const char* dom = i->domain_attr->name;
    if (i->addr_format == FI_SOCKADDR_IN6) continue;
    if (iface.empty() || (dom != nullptr && iface == dom)) {
      pick = i;
      break;
    }
  }
  if (pick == nullptr) {
    fi_freeinfo(list);
    throw std::runtime_error("raw libfabric: provider " + provider + " has no IPv4 domain named '" + iface + "'");
  }
  auto d = std::make_shared<RawDomain>();
  d->info = fi_dupinfo(pick);
  fi_freeinfo(list);
  if ((rc = fi_fabric(d->info->fabric_attr, &d->fabric, nullptr)) != 0) raise("fi_fabric", rc);
  if ((rc = fi_domain(d->fabric, d->info, &d->domain, nullptr)) != 0) raise("fi_domain", rc);
  return d;
}

constexpr uint64_t kTagData = 0;
constexpr uint64_t kTagCredit = 1;
constexpr uint64_t kTagHello = 2;

struct Credit {
  uint64_t addr, key, len;
  uint32_t slot, pad;
};

struct RawEp {
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* ep = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
};

class RawLink final : public Link {
 public:
  RawLink(std::shared_ptr<RawDomain> d, RawMode mode, bool split) : d_(std::move(d)), mode_(mode) {
    nEps_ = split ? 2 : 1;
    for (int k = 0; k < nEps_; ++k) openEp(eps_[k]);
    for (int i = kPool - 1; i >= 0; --i) free_.push_back(i);
    creditsIn_.reset(new Credit[kCredits]);
    std::memset(static_cast<void*>(creditsIn_.get()), 0, sizeof(Credit) * kCredits);
    creditsMr_ = regRaw(creditsIn_.get(), sizeof(Credit) * kCredits);
    reqsMr_ = regRaw(reqs_, sizeof(reqs_));  // the credits RMA receives send live in their requests
    helloMr_ = regRaw(hello_, sizeof(hello_));
  }
  ~RawLink() override {
    for (int k = 0; k < nEps_; ++k) {
      closeFid(eps_[k].ep);
      closeFid(eps_[k].av);
      closeFid(eps_[k].cq);
    }
    closeFid(creditsMr_);
    closeFid(reqsMr_);
    closeFid(helloMr_);
  }

  // Endpoint names to give the peer: [sending, receiving] when split, one otherwise.
  std::vector<std::vector<uint8_t>> names() {
    std::vector<std::vector<uint8_t>> out;
    for (int k = 0; k < nEps_; ++k) {
      std::vector<uint8_t> n(256);
      size_t len = n.size();
      int rc = fi_getname(&eps_[k].ep->fid, n.data(), &len);
      if (rc != 0) raise("fi_getname", rc);
      n.resize(len);
      out.push_back(std::move(n));
    }
    return out;
  }

  // The peer's names in the same order: our sender talks to its receiver and the other way round.
  void connect(const std::vector<std::vector<uint8_t>>& peer) {
    for (int k = 0; k < nEps_; ++k) {
      const auto& name = peer[nEps_ == 2 ? 1 - k : 0];
      if (fi_av_insert(eps_[k].av, name.data(), 1, &eps_[k].peer, 0, nullptr) != 1) {
        throw std::runtime_error("fi_av_insert failed");
      }
    }
    if (mode_ == RawMode::kRma) {
      for (int i = 0; i < kCredits; ++i) postCreditRecv(i);
    }
  }

  // Brings up the provider's connections of this link before anything is timed: every endpoint sends one
  // message to its peer endpoint and receives one, all endpoints progressed until the four operations complete.
  // Without it the first operations set the connections up, and rxm with manual progress handles a connection
  // request only while the endpoint it is addressed to is progressed: test() polls the request's own endpoint,
  // so a rank waiting on its receive never accepted the connection its peer's credit needed (a deadlock seen
  // in CI under load: "irecv was refused (NULL request) for 60 s" on one rank, a receive that never completed
  // on the other). Both ranks call this for their links in the same order, after connect().
  void handshake() {
    for (int k = 0; k < nEps_; ++k) {
      hello_[k] = 0x6865'6c6c'6fULL;
      helloCtx_[k].index = k;
      helloCtx_[k].kind = Kind::kHello;
      helloCtx_[nEps_ + k].index = nEps_ + k;
      helloCtx_[nEps_ + k].kind = Kind::kHello;
    }
    helloDone_ = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto expired = [&] { return std::chrono::steady_clock::now() > end; };
    auto post = [&](auto op) {
      for (ssize_t rc;;) {
        if ((rc = op()) == 0) return;
        if (rc != -FI_EAGAIN) raise("hello", static_cast<int>(rc));
        progressAndNull();
        if (expired()) throw std::runtime_error("raw libfabric: the connection handshake did not start within 60 s");
      }
    };
    for (int k = 0; k < nEps_; ++k) {
      RawEp& e = eps_[k];
      post([&] {
        return fi_trecv(e.ep, &hello_[2 + k], sizeof(uint64_t), fi_mr_desc(helloMr_), FI_ADDR_UNSPEC, kTagHello, 0,
                        &helloCtx_[nEps_ + k].fi);
      });
      post([&] {
        return fi_tsend(e.ep, &hello_[k], sizeof(uint64_t), fi_mr_desc(helloMr_), e.peer, kTagHello,
                        &helloCtx_[k].fi);
      });
    }
    while (helloDone_ < 2 * nEps_) {
      progressAndNull();
      if (expired()) throw std::runtime_error("raw libfabric: the connection handshake did not finish within 60 s");
    }
  }

  // A memory handle: the registration and where it starts (remote addresses are offsets from there unless the
  // provider uses virtual addresses).
  struct RawMr {
    fid_mr* mr;
    uintptr_t base;
  };
  void* reg(void* buf, size_t size, bool) override { return new RawMr{regRaw(buf, size), reinterpret_cast<uintptr_t>(buf)}; }
  void dereg(void* mh, bool) override {
    auto* m = static_cast<RawMr*>(mh);
    closeFid(m->mr);
    delete m;
  }

  void* postSend(void* data, size_t size, void* mh) override {
    if (free_.empty()) return progressAndNull();
    Credit c{};
    if (mode_ == RawMode::kRma) {
      if (credits_.empty()) {
        poll(tx());
        if (credits_.empty()) return progressAndNull();
      }
      c = credits_.front();
    }
    Req& r = take(true);
    r.size = static_cast<int>(size);
    RawEp& e = tx();
    ssize_t rc = mode_ == RawMode::kTagged
                     ? fi_tsend(e.ep, data, size, desc(mh), e.peer, kTagData, &r.ctx.fi)
                     : fi_writedata(e.ep, data, size, desc(mh), (uint64_t{c.slot} << 40) | size, e.peer, c.addr, c.key,
                                    &r.ctx.fi);
    if (rc == -FI_EAGAIN) return giveBack(r);
    if (rc != 0) raise(mode_ == RawMode::kTagged ? "fi_tsend" : "fi_writedata", static_cast<int>(rc));
    if (mode_ == RawMode::kRma) credits_.pop_front();
    return &r;
  }

  void* postRecv(void* data, size_t size, void* mh) override {
    if (free_.empty()) return progressAndNull();
    Req& r = take(false);
    RawEp& e = rx();
    if (mode_ == RawMode::kTagged) {
      ssize_t rc = fi_trecv(e.ep, data, size, desc(mh), FI_ADDR_UNSPEC, kTagData, 0, &r.ctx.fi);
      if (rc == -FI_EAGAIN) return giveBack(r);
      if (rc != 0) raise("fi_trecv", static_cast<int>(rc));
      return &r;
    }
    auto* m = static_cast<RawMr*>(mh);
    uint64_t addr = reinterpret_cast<uintptr_t>(data);
    if ((d_->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) == 0) addr -= m->base;
    r.credit = Credit{addr, fi_mr_key(m->mr), size, static_cast<uint32_t>(r.index), 0};
    r.creditPending = true;
    ssize_t rc = fi_tsend(e.ep, &r.credit, sizeof(Credit), fi_mr_desc(reqsMr_), e.peer, kTagCredit,
                          &r.creditCtx.fi);
    if (rc == -FI_EAGAIN) return giveBack(r);
    if (rc != 0) raise("fi_tsend(credit)", static_cast<int>(rc));
    r.awaitingData = true;
    return &r;
  }

  bool test(void* req, int* size) override {
    Req& r = *static_cast<Req*>(req);
    if (!r.done || r.creditPending) poll(r.onTx ? tx() : rx());
    if (!r.done || r.creditPending) return false;
    *size = r.size;
    free_.push_back(r.index);
    return true;
  }

 private:
  static constexpr int kPool = 512;
  static constexpr int kCredits = 64;
  enum class Kind : uint8_t { kData, kCreditSend, kCreditRecv, kHello };
  struct Ctx {
    fi_context2 fi;  // first: libfabric is handed &fi
    int index = 0;
    Kind kind = Kind::kData;
  };
  struct Req {
    Ctx ctx;        // data operation
    Ctx creditCtx;  // the credit send of an RMA receive
    int index = 0;
    int size = 0;
    bool onTx = false;
    bool done = false;
    bool creditPending = false;
    bool awaitingData = false;
    Credit credit{};
  };

  Req& take(bool onTx) {
    int i = free_.back();
    free_.pop_back();
    Req& r = reqs_[i];
    r.index = i;
    r.onTx = onTx;
    r.ctx.index = i;
    r.ctx.kind = Kind::kData;
    r.creditCtx.index = i;
    r.creditCtx.kind = Kind::kCreditSend;
    r.done = false;
    r.creditPending = false;
    r.awaitingData = false;
    return r;
  }
  // Pushed back: progress every endpoint of the link (an rxm connection comes up only while both its ends are
  // progressed, and the peer may be waiting on our other endpoint).
  void* giveBack(Req& r) {
    free_.push_back(r.index);
    return progressAndNull();
  }
  void* progressAndNull() {
    for (int k = 0; k < nEps_; ++k) poll(eps_[k]);
    return nullptr;
  }
  RawEp& tx() { return eps_[0]; }
  RawEp& rx() { return eps_[nEps_ - 1]; }

  void openEp(RawEp& e) {
    fi_cq_attr cqa{};
    cqa.format = FI_CQ_FORMAT_TAGGED;
    cqa.wait_obj = FI_WAIT_NONE;
    cqa.size = 1024;
    int rc;
    if ((rc = fi_cq_open(d_->domain, &cqa, &e.cq, nullptr)) != 0) raise("fi_cq_open", rc);
    fi_av_attr ava{};
    ava.type = FI_AV_TABLE;
    if ((rc = fi_av_open(d_->domain, &ava, &e.av, nullptr)) != 0) raise("fi_av_open", rc);
    if ((rc = fi_endpoint(d_->domain, d_->info, &e.ep, nullptr)) != 0) raise("fi_endpoint", rc);
    if ((rc = fi_ep_bind(e.ep, &e.cq->fid, FI_TRANSMIT | FI_RECV)) != 0) raise("fi_ep_bind(cq)", rc);
    if ((rc = fi_ep_bind(e.ep, &e.av->fid, 0)) != 0) raise("fi_ep_bind(av)", rc);
    if ((rc = fi_enable(e.ep)) != 0) raise("fi_enable", rc);
  }
  void* desc(void* mh) const { return mh != nullptr ? fi_mr_desc(static_cast<RawMr*>(mh)->mr) : nullptr; }

  fid_mr* regRaw(void* buf, size_t size) {
    fid_mr* mr = nullptr;
    uint64_t key = (d_->info->domain_attr->mr_mode & FI_MR_PROV_KEY) ? 0 : d_->nextKey++;
    int rc = fi_mr_reg(d_->domain, buf, size, FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE, 0, key, 0, &mr, nullptr);
    if (rc != 0) raise("fi_mr_reg", rc);
    return mr;
  }

  void postCreditRecv(int i) {
    RawEp& e = tx();  // credits come to the sending side
    ssize_t rc;
    do {
      creditRecvCtx_[i].index = i;
      creditRecvCtx_[i].kind = Kind::kCreditRecv;
      rc = fi_trecv(e.ep, &creditsIn_[i], sizeof(Credit), fi_mr_desc(creditsMr_), FI_ADDR_UNSPEC, kTagCredit, 0,
                    &creditRecvCtx_[i].fi);
      if (rc == -FI_EAGAIN) fi_cq_read(e.cq, nullptr, 0);
    } while (rc == -FI_EAGAIN);
    if (rc != 0) raise("fi_trecv(credit)", static_cast<int>(rc));
  }

  void poll(RawEp& ep) {
    fi_cq_tagged_entry e[16];
    ssize_t n = fi_cq_read(ep.cq, e, 16);
    if (n == -FI_EAGAIN) return;
    if (n < 0) {
      fi_cq_err_entry err{};
      fi_cq_readerr(ep.cq, &err, 0);
      raise("completion", err.err);
    }
    for (ssize_t k = 0; k < n; ++k) {
      void* ctx = e[k].op_context;
      if (ctx == nullptr) {  // remote write: the slot is in the completion data
        Req& r = reqs_[(e[k].data >> 40) & 0xffff];
        r.size = static_cast<int>(e[k].data & ((uint64_t{1} << 40) - 1));
        r.done = true;
        continue;
      }
      auto* c = static_cast<Ctx*>(ctx);
      switch (c->kind) {
        case Kind::kCreditRecv:
          credits_.push_back(creditsIn_[c->index]);
          postCreditRecv(c->index);
          break;
        case Kind::kCreditSend: reqs_[c->index].creditPending = false; break;
        case Kind::kHello: ++helloDone_; break;
        case Kind::kData: {
          Req& r = reqs_[c->index];
          if (mode_ == RawMode::kTagged && (e[k].flags & FI_RECV) != 0) r.size = static_cast<int>(e[k].len);
          r.done = true;
          break;
        }
      }
    }
  }

  std::shared_ptr<RawDomain> d_;
  RawMode mode_;
  RawEp eps_[2];
  int nEps_ = 1;
  Req reqs_[kPool];
  fid_mr* reqsMr_ = nullptr;
  std::vector<int> free_;
  std::unique_ptr<Credit[]> creditsIn_;
  fid_mr* creditsMr_ = nullptr;
  Ctx creditRecvCtx_[kCredits];
  std::deque<Credit> credits_;
  uint64_t hello_[4] = {};  // [0, nEps): sent from each endpoint; [2, 2 + nEps): received on each
  fid_mr* helloMr_ = nullptr;
  Ctx helloCtx_[4];
  int helloDone_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Link>> openRawLinks(Oob& oob, const std::string& provider, const std::string& iface,
                                                RawMode mode, int count, bool split, const std::string& label) {
  auto d = openDomain(provider, iface);
  std::vector<std::unique_ptr<RawLink>> links;
  for (int i = 0; i < count; ++i) {
    links.push_back(std::make_unique<RawLink>(d, mode, split));
    for (const auto& n : links.back()->names()) oob.send(n.data(), n.size());
  }
  for (int i = 0; i < count; ++i) {
    std::vector<std::vector<uint8_t>> peer;
    for (int k = 0; k < (split ? 2 : 1); ++k) peer.push_back(oob.recv());
    links[i]->connect(peer);
  }
  for (auto& l : links) l->handshake();
  oob.barrier("raw:" + label);
  std::vector<std::unique_ptr<Link>> out;
  for (auto& l : links) out.push_back(std::move(l));
  return out;
}

}  // namespace weft::harness
