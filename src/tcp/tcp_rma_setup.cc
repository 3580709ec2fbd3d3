// SPDX-License-Identifier: Apache-2.0
// Setting up the device API's TCP transport: devices, listen, the collective connect that gives every pair of ranks
// its sockets (tcp_rma.h: one, or a control flow and data flows), then a comm's registrations, contexts and close.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "tcp/tcp_rma.h"
#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"

namespace weft::tcp {
namespace {

uint32_t rmaProviderHash() { return fnv1a32("weft-rma-tcp", 12); }

}  // namespace

int rmaFlowsFor(const TcpDevice& d, int nranks, const char** why) {
  const int forced = static_cast<int>(params::getInt("WEFT_TCP_RMA_FLOWS"));
  int data = 1;
  if (forced > 0) {
    data = forced;
    *why = "WEFT_TCP_RMA_FLOWS";
  } else if (d.grow) {
    data = 4;  // the net connections' first step of growth: the device API's pairs do not grow
    *why = "a NIC weft does not know";
  } else {
    data = d.flows;
    *why = d.flows > 1 ? "the NIC's flow cap, as the net connections" : "one flow is the fastest on this NIC";
  }
  if (data <= 1) return 1;
  const int perPair = kRmaSocketBudget / std::max(1, nranks - 1);
  data = std::min({data, perPair - 1, kMaxFlows});
  if (data < 1) {
    *why = "the comm's socket budget";
    return 1;
  }
  return data + 1;
}

std::unique_ptr<TcpRmaTransport> TcpRmaTransport::discover(std::string* why) {
  auto backend = TcpBackend::discover(why);
  if (backend == nullptr) return nullptr;
  auto t = std::make_unique<TcpRmaTransport>();
  t->backend_ = std::move(backend);
  // GPU windows are reached through the driver's copies on the proxy's thread (no GPUDirect needed).
  for (int d = 0; d < t->backend_->deviceCount(); ++d) {
    t->props_.push_back(t->backend_->props(d));
    t->props_.back().ptrSupport |= rma::kPtrCuda;
  }
  return t;
}

Status TcpRmaTransport::listen(int dev, void* handle, rma::RmaListen** out) {
  if (dev < 0 || dev >= deviceCount() || handle == nullptr || out == nullptr) {
    WEFT_WARN("RMA listen: device {} does not exist (weft's RMA has {} devices)", dev, deviceCount());
    return Status::kInternal;
  }
  const TcpDevice& d = backend_->device(dev);
  const SocketOptions& opts = backend_->socketOptions();
  oob::Listener l;
  if (Status st = oob::Listener::open(d.rails.at(0).addr, d.rails[0].len, 1024, [&](int fd) { opts.applyEarly(fd); },
                                      d.props.name, "RMA listen", &l);
      st != Status::kOk) {
    return st;
  }
  *out = rma::SocketListen::publish(dev, std::move(l), BackendId::kTcp, rmaProviderHash(), d.props.name, handle);
  return Status::kOk;
}

Status TcpRmaTransport::connect(void* const* handles, int nranks, int rank, rma::RmaListen* listenBase,
                                uint64_t commId, rma::RmaComm** out) {
  rma::SocketListen* listenComm = rma::SocketListen::forConnect(handles, nranks, rank, listenBase, out);
  if (listenComm == nullptr) return Status::kInternal;
  const oob::Listener& listen = listenComm->listener();
  const DeviceProps& props = backend_->props(listenComm->dev());
  struct Peer {
    uint64_t token;
    sockaddr_storage addr;
    socklen_t len;
  };
  std::vector<Peer> hs(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    WireHandle h;
    if (handles[r] == nullptr ||
        decodeForConnect(handles[r], props.name, BackendId::kTcp, rmaProviderHash(), "weft's TCP RMA", &h) !=
            Status::kOk ||
        !oob::handleAddress(h, &hs[r].addr, &hs[r].len)) {
      WEFT_WARN("RMA connect (rank {} of {}): rank {}'s handle is not one of this transport's", rank, nranks, r);
      return Status::kInvalidUsage;
    }
    hs[r].token = h.token;
  }
  if (hs[rank].token != listen.token) {
    WEFT_WARN("RMA connect: rank {}'s own handle is not the one its listen comm made", rank);
    return Status::kInvalidUsage;
  }
  const SocketOptions& opts = backend_->socketOptions();
  std::vector<PeerSocket> peers(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    peers[r].name =
        "rank " + std::to_string(r) + " (" + sockaddrString(reinterpret_cast<const sockaddr*>(&hs[r].addr)) + ")";
  }

  // Outgoing: to every higher rank, each of the pair's flows. Incoming: from every lower rank, through the listen
  // socket, as many flows as its connector says. Every socket is non-blocking and all of them progress together, so
  // that no rank waits on one peer while another waits on it.
  const char* flowsWhy = "";
  const int flows = rmaFlowsFor(backend_->device(listenComm->dev()), nranks, &flowsWhy);
  struct Out {
    int rank;
    int flow;
    oob::Socket sock;
    FlowHello hello{};
    oob::Hello answer{};
    size_t sent = 0, got = 0;
    bool done = false;
    oob::Clock::time_point retryAt{};
  };
  struct In {
    oob::Socket sock;
    FlowHello hello{};
    oob::Hello answer{};
    size_t got = 0, sent = 0;
    bool answering = false;
  };
  std::vector<Out> outs;
  for (int r = rank + 1; r < nranks; ++r) {
    for (int k = 0; k < flows; ++k) outs.push_back(Out{r, k});
  }
  std::vector<In> ins;
  // Each peer's sockets once their hellos are through, by flow; a lower rank's count comes with its first hello.
  std::vector<std::vector<oob::Socket>> joined(static_cast<size_t>(nranks));
  for (int r = rank + 1; r < nranks; ++r) joined[r].resize(static_cast<size_t>(flows));
  std::vector<int> inFlows(static_cast<size_t>(nranks), 0), inJoined(static_cast<size_t>(nranks), 0);
  int ranksIn = 0;  // lower ranks whose every flow joined
  const int wantIn = rank;
  const auto start = oob::Clock::now();
  const oob::Deadline deadline = oob::connectDeadline();
  auto startOut = [&](Out& o) {
    o.sock = oob::startConnect(hs[o.rank].addr, hs[o.rank].len, [&](int fd) { opts.applyEarly(fd); });
    if (!o.sock.open()) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) return false;
      o.retryAt = oob::Clock::now() + std::chrono::milliseconds(100);  // refused: the peer's listener is not up yet
      return true;
    }
    o.hello.hello = oob::Hello::request(hs[o.rank].token, commId, rank, nranks);
    o.hello.flow = static_cast<uint32_t>(o.flow);
    o.hello.flows = static_cast<uint32_t>(flows);
    o.sent = o.got = 0;
    return true;
  };
  size_t outsDone = 0;
  while (outsDone < outs.size() || ranksIn < wantIn) {
    const auto now = oob::Clock::now();
    if (now > deadline) {
      std::string missing;
      for (auto& o : outs) {
        if (!o.done && (missing.empty() || o.flow == 0)) missing += (missing.empty() ? "" : ", ") + peers[o.rank].name;
      }
      WEFT_WARN("RMA connect (rank {} of {}): no connection within WEFT_CONNECT_TIMEOUT={} s{}{}; {} of {} lower ranks "
                "connected (a rank that never reached connect, a firewall, or the wrong WEFT_IFACE)",
                rank, nranks, params::getInt("WEFT_CONNECT_TIMEOUT"), missing.empty() ? "" : " to ", missing, ranksIn,
                wantIn);
      return Status::kRemote;
    }
    std::vector<pollfd> pfds;
    pfds.push_back({listen.sock.fd(), POLLIN, 0});
    for (auto& o : outs) {
      if (o.done) continue;
      if (!o.sock.open()) {
        if (now >= o.retryAt && !startOut(o)) {
          WEFT_WARN("RMA connect: cannot open a socket to {}: {}", peers[o.rank].name, std::strerror(errno));
          return Status::kSystem;
        }
        continue;
      }
      pfds.push_back({o.sock.fd(), static_cast<short>(o.sent < sizeof(FlowHello) ? POLLOUT : POLLIN), 0});
    }
    for (auto& i : ins) pfds.push_back({i.sock.fd(), static_cast<short>(i.answering ? POLLOUT : POLLIN), 0});
    ::poll(pfds.data(), pfds.size(), 20);
    for (;;) {
      bool failed = false;
      oob::Socket s = listen.accept(&failed);
      if (!s.open()) break;
      ins.push_back(In{std::move(s)});
    }
    for (auto& o : outs) {
      if (o.done || !o.sock.open()) continue;
      oob::Moved m = oob::moveSome(o.sock.fd(), true, &o.hello, sizeof(o.hello), &o.sent);
      if (m != oob::Moved::kDone) {
        if (m != oob::Moved::kAgain) {  // refused: the peer's listener is not up yet, or a transient failure
          o.sock.reset();
          o.retryAt = now + std::chrono::milliseconds(100);
        }
        continue;
      }
      m = oob::moveSome(o.sock.fd(), false, &o.answer, sizeof(o.answer), &o.got);
      if (m == oob::Moved::kAgain) continue;
      if (m != oob::Moved::kDone) {
        WEFT_WARN("RMA connect: {} closed the connection during the handshake", peers[o.rank].name);
        return Status::kRemote;
      }
      if (!o.answer.accepted()) {
        WEFT_WARN("RMA connect: {} refused rank {}: {}", peers[o.rank].name, rank,
                  o.answer.magic == oob::Hello::kMagic ? oob::Hello::verdictName(o.answer.status)
                                                        : "not a weft RMA listener");
        return Status::kRemote;
      }
      opts.applyConnected(o.sock.fd());
      if (o.flow > 0) opts.applyFlow(o.sock.fd());
      joined[o.rank][o.flow] = std::move(o.sock);
      o.done = true;
      ++outsDone;
    }
    for (auto& i : ins) {
      if (!i.answering) {
        const oob::Moved m = oob::moveSome(i.sock.fd(), false, &i.hello, sizeof(i.hello), &i.got);
        if (m != oob::Moved::kDone) {
          if (m != oob::Moved::kAgain) i.sock.reset();
          continue;
        }
        const uint32_t flow = i.hello.flow, n = i.hello.flows;
        const uint16_t verdict = i.hello.hello.verdict(listen.token, commId, nranks, [&](uint32_t r) {
          return r < static_cast<uint32_t>(rank) && n >= 1 && n <= kMaxFlows + 1 && flow < n &&
                 (inFlows[r] == 0 || inFlows[r] == static_cast<int>(n)) &&
                 (joined[r].size() <= flow || !joined[r][flow].open());
        });
        i.answer = oob::Hello::answer(verdict, commId, rank, nranks);
        i.answering = true;
        if (verdict != oob::Hello::kAccepted) {
          WEFT_WARN("RMA connect (rank {}): refused a connection claiming rank {} (flow {} of {}): {}", rank,
                    i.hello.hello.rank, flow, n, oob::Hello::verdictName(verdict));
        }
      }
      const oob::Moved m = oob::moveSome(i.sock.fd(), true, &i.answer, sizeof(i.answer), &i.sent);
      if (m == oob::Moved::kAgain) continue;
      if (m == oob::Moved::kDone && i.answer.status == oob::Hello::kAccepted) {
        const uint32_t r = i.hello.hello.rank;
        if (inFlows[r] == 0) {
          inFlows[r] = static_cast<int>(i.hello.flows);
          joined[r].resize(i.hello.flows);
        }
        opts.applyConnected(i.sock.fd());
        if (i.hello.flow > 0) opts.applyFlow(i.sock.fd());
        const bool fresh = !joined[r][i.hello.flow].open();
        joined[r][i.hello.flow] = std::move(i.sock);
        if (fresh && ++inJoined[r] == inFlows[r]) ++ranksIn;
      }
      i.sock.reset();
    }
    ins.erase(std::remove_if(ins.begin(), ins.end(), [](const In& i) { return !i.sock.open(); }), ins.end());
  }
  size_t dataFlows = 0;
  for (int r = 0; r < nranks; ++r) {
    if (joined[r].empty()) continue;
    peers[r].fd = joined[r][0].release();
    peers[r].data.resize(joined[r].size() - 1);
    for (size_t k = 1; k < joined[r].size(); ++k) peers[r].data[k - 1].fd = joined[r][k].release();
    dataFlows += joined[r].size() - 1;
  }
  *out = new TcpRmaComm(rank, nranks, std::move(peers), props, opts);
  WEFT_INFO(NCCL_NET | NCCL_INIT, "RMA: rank {} of {} connected on {} in {} ms{}", rank, nranks, props.name,
            std::chrono::duration_cast<std::chrono::milliseconds>(oob::Clock::now() - start).count(),
            dataFlows == 0 ? std::string(", one socket a peer")
                           : fmt::format(", a control flow and {} data flows a peer ({}) for puts of {} bytes and more",
                                         flows - 1, flowsWhy, opts.stripeMin));
  return Status::kOk;
}

// ---- registration, contexts, close -------------------------------------------------------------------------------

Status TcpRmaComm::regMrSym(void* data, size_t size, int type, uint64_t flags, int dmabufFd, rma::Window** out) {
  (void)dmabufFd;  // the driver's copies reach the memory whatever form NCCL also offers it in
  std::unique_ptr<rma::Window> w;
  if (Status st = newWindow(data, size, type, flags, &w); st != Status::kOk) return st;
  rma::Window* win = w.get();
  {
    std::lock_guard<std::mutex> lock(mu_);
    addWindow(w.release());
    if (auto it = announced_.find(win->id); it != announced_.end()) {
      for (size_t r = 0; r < it->second.size(); ++r) {
        if (it->second[r] >= 0) win->peerSize[r] = static_cast<uint64_t>(it->second[r]);
      }
      announced_.erase(it);
    }
    for (uint32_t p = 0; p < peers_.size(); ++p) {
      if (static_cast<int>(p) == rank_ || peers_[p].lost) continue;
      RmaOp* op = takeOp();
      if (op == nullptr) return Status::kSystem;
      op->internal = true;
      op->peer = p;
      op->frame.type = RmaFrame::kRegister;
      op->frame.window = win->id;
      op->frame.size = size;
      op->frame.aux = (uint64_t{win->cuda} << 8) | flags;
      enqueue(peers_[p], op);
    }
  }
  const uint32_t id = win->id;
  Status st = waitFor("the registration exchange of a window", [&] {
    for (size_t r = 0; r < peers_.size(); ++r) {
      if (peers_[r].lost) return true;  // reported below
      if (win->peerSize[r] == UINT64_MAX) return false;
    }
    return true;
  });
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t r = 0; r < peers_.size() && st == Status::kOk; ++r) {
    if (peers_[r].lost) {
      WEFT_WARN("RMA regMrSym (rank {}): {} is lost; window {} cannot be registered with it", rank_, peers_[r].name, id);
      st = Status::kRemote;
    }
  }
  if (st != Status::kOk) {
    dropWindow(win);
    return st;
  }
  WEFT_INFO(NCCL_NET | NCCL_REG, "RMA: window {} registered: {} bytes of {} memory at {}{}", id, size,
            win->cuda ? "GPU" : "host", data, (flags & rma::kFlagSignalNeverReset) ? " (signals, never reset)" : "");
  *out = win;
  return Status::kOk;
}

Status TcpRmaComm::deregMrSym(rma::Window* w) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!hasWindow(w)) {
      WEFT_WARN("RMA deregMrSym: {} is not a registered window of this comm", static_cast<void*>(w));
      return Status::kInvalidUsage;
    }
  }
  // A window still read by a put on its way out, written by a get or a put arriving now, waits until that is over:
  // its memory is NCCL's to free once this returns.
  auto busy = [&] {
    if (w->inflight > 0) return true;
    for (auto& p : peers_) {
      const bool putIn = p.inPayload || p.waitingPieces;
      if (putIn && (p.dst == w || (p.cur.type == RmaFrame::kPut && p.cur.sigWindow == w->id))) return true;
      for (const auto& f : p.data) {
        if (f.inPiece && f.dst == w) return true;
      }
    }
    return false;
  };
  Status st = waitFor("deregistering a window still in use", [&] { return !busy() || failed(); });
  std::lock_guard<std::mutex> lock(mu_);
  if (busy()) {
    WEFT_WARN("RMA deregMrSym: window {} is still used by {} operation(s); not deregistered", w->id, w->inflight);
    return st == Status::kOk ? Status::kInvalidUsage : st;
  }
  dropWindow(w);
  return Status::kOk;
}

Status TcpRmaComm::destroyContext(rma::Context* ctx) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!hasContext(ctx)) {
      WEFT_WARN("RMA destroyContext: {} is not a live context of this comm", static_cast<void*>(ctx));
      return Status::kInternal;
    }
    // Operations not started are dropped; a frame partly written must be finished (the stream would break).
    for (auto& p : peers_) {
      RmaOp** link = &p.head;
      RmaOp* prev = nullptr;
      while (*link != nullptr) {
        RmaOp* op = *link;
        if (op->ctx == ctx && op->frameSent == 0 && op->assigned == 0) {
          *link = op->next;
          if (p.tail == op) p.tail = prev;
          --p.queued;
          if (op->src != nullptr) --op->src->inflight;
          if (op->pieced) unlinkPiece(p, op);
          freeOp(op);
          continue;
        }
        prev = op;
        link = &op->next;
      }
    }
  }
  Status st = waitFor("finishing a destroyed context's operations", [&] {
    bool busy = false;
    pool_.forEach([&](RmaOp& op) {
      busy |= op.ctx == ctx && op.state == RmaOp::kQueued && !peers_[op.peer].lost;
    });
    return !busy;
  });
  std::lock_guard<std::mutex> lock(mu_);
  // Gets still waiting for their answer: forgotten (the answer is read and dropped when it comes).
  pool_.forEach([&](RmaOp& op) {
      if (op.state != RmaOp::kFree && op.ctx == ctx) {
        if (op.src != nullptr && (op.state == RmaOp::kQueued || op.state == RmaOp::kWaiting)) --op.src->inflight;
        for (auto& p : peers_) {
          if (p.getOp == &op) p.getOp = nullptr, p.dst = nullptr;
        }
        bool queued = false;
        for (auto& p : peers_) {
          for (RmaOp* q = p.head; q != nullptr; q = q->next) queued |= q == &op;
        }
        if (!queued) freeOp(&op);
      }
  });
  forgetContext(ctx);
  return st;
}

void TcpRmaComm::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* w : windows_) {
      if (w != nullptr) {
        WEFT_INFO(NCCL_NET, "RMA: window {} still registered when its comm closed; released with it", w->id);
      }
    }
    // A bye to every peer, so that its end of the socket reads as an orderly close; written as far as the socket
    // takes it now (a peer already gone, or a full socket, gets none: it sees the end of the stream then).
    for (uint32_t p = 0; p < peers_.size(); ++p) {
      PeerSocket& peer = peers_[p];
      if (peer.fd < 0 || peer.lost) continue;
      RmaOp* op = takeOp();
      if (op == nullptr) break;
      op->internal = true;
      op->peer = p;
      op->frame.type = RmaFrame::kBye;
      enqueue(peer, op);
      pumpSend(peer);
    }
  }
  delete this;
}

}  // namespace weft::tcp
