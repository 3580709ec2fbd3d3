// SPDX-License-Identifier: Apache-2.0
// Setting up the device API's TCP transport: devices, listen, and the collective connect that gives every pair of
// ranks one socket (tcp_rma.h).
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

#include "tcp/tcp_rma.h"
#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"

namespace weft::tcp {
namespace {

uint32_t rmaProviderHash() { return fnv1a32("weft-rma-tcp", 12); }

class TcpRmaListen final : public rma::RmaListen {
 public:
  TcpRmaListen(int dev, int fd, uint64_t token, sockaddr_storage addr) : dev_(dev), fd_(fd), token_(token), addr_(addr) {}
  ~TcpRmaListen() override {
    if (fd_ >= 0) ::close(fd_);
  }
  int dev() const override { return dev_; }
  int fd() const { return fd_; }
  uint64_t token() const { return token_; }
  const sockaddr_storage& addr() const { return addr_; }

 private:
  int dev_;
  int fd_;
  uint64_t token_;
  sockaddr_storage addr_;
};

socklen_t addrLen(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// Sends or receives what is left of a fixed-size message on a non-blocking socket: true when complete; false with
// *dead set when the socket failed or closed.
bool moveBytes(int fd, bool send, void* buf, size_t len, size_t* done, bool* dead) {
  while (*done < len) {
    ssize_t n = send ? ::send(fd, static_cast<char*>(buf) + *done, len - *done, MSG_NOSIGNAL | MSG_DONTWAIT)
                     : ::recv(fd, static_cast<char*>(buf) + *done, len - *done, MSG_DONTWAIT);
    if (n > 0) {
      *done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0 && !send) {
      *dead = true;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    *dead = true;
    return false;
  }
  return true;
}

const char* verdictName(uint16_t s) {
  switch (s) {
    case RmaHello::kAccepted: return "accepted";
    case RmaHello::kWrongToken: return "a handle that is not this listener's (a stale or foreign handle)";
    case RmaHello::kWrongComm: return "a different communicator";
    case RmaHello::kBadRank: return "a rank outside the communicator, or one seen already";
    default: return "an unknown answer";
  }
}

}  // namespace

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
  sockaddr_storage sa = d.rails.at(0).addr;
  socklen_t len = d.rails[0].len;
  int fd = bindTcpSocket(sa, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) backend_->socketOptions().applyEarly(fd);
  if (fd < 0 || ::listen(fd, 1024) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    WEFT_WARN("RMA listen on {}: cannot open a listening socket at {}: {}", d.props.name,
              sockaddrString(reinterpret_cast<const sockaddr*>(&d.rails[0].addr), false), std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return Status::kSystem;
  }
  WireHandle h;
  h.backend = BackendId::kTcp;
  h.providerHash = rmaProviderHash();
  h.token = randomToken();
  h.addrLen = static_cast<uint16_t>(len);
  std::memcpy(h.addr.data(), &sa, std::min<size_t>(len, h.addr.size()));
  h.encode(handle);
  *out = new TcpRmaListen(dev, fd, h.token, sa);
  WEFT_INFO(NCCL_NET, "RMA: listening on {} at {}", d.props.name, sockaddrString(reinterpret_cast<sockaddr*>(&sa)));
  return Status::kOk;
}

Status TcpRmaTransport::connect(void* const* handles, int nranks, int rank, rma::RmaListen* listenBase,
                                uint64_t commId, rma::RmaComm** out) {
  auto* listen = dynamic_cast<TcpRmaListen*>(listenBase);
  if (handles == nullptr || out == nullptr || listen == nullptr || nranks < 1 || rank < 0 || rank >= nranks) {
    WEFT_WARN("RMA connect: called with rank {} of {}, handles {}, listen comm {}", rank, nranks,
              static_cast<const void*>(handles), static_cast<const void*>(listenBase));
    return Status::kInternal;
  }
  std::vector<WireHandle> hs(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    std::string why;
    if (handles[r] == nullptr || WireHandle::decode(handles[r], &hs[r], &why) != Status::kOk ||
        hs[r].providerHash != rmaProviderHash() || hs[r].addrLen < sizeof(sockaddr_in) ||
        hs[r].addrLen > sizeof(sockaddr_storage)) {
      WEFT_WARN("RMA connect: the handle of rank {} is not a weft RMA handle{}{}", r, why.empty() ? "" : ": ", why);
      return Status::kInvalidUsage;
    }
  }
  if (hs[rank].token != listen->token()) {
    WEFT_WARN("RMA connect: rank {}'s own handle is not the one its listen comm made", rank);
    return Status::kInvalidUsage;
  }
  const SocketOptions& opts = backend_->socketOptions();
  const DeviceProps& props = backend_->props(listen->dev());
  std::vector<PeerSocket> peers(static_cast<size_t>(nranks));
  auto peerAddr = [&](int r) {
    sockaddr_storage sa{};
    std::memcpy(&sa, hs[r].addr.data(), hs[r].addrLen);
    return sa;
  };
  for (int r = 0; r < nranks; ++r) {
    const sockaddr_storage sa = peerAddr(r);
    peers[r].name = "rank " + std::to_string(r) + " (" + sockaddrString(reinterpret_cast<const sockaddr*>(&sa)) + ")";
  }

  // Outgoing: to every higher rank. Incoming: from every lower rank, through the listen socket.
  struct Out {
    int rank;
    int fd = -1;
    RmaHello hello{}, answer{};
    size_t sent = 0, got = 0;
    bool done = false;
    std::chrono::steady_clock::time_point retryAt{};
  };
  struct In {
    int fd;
    RmaHello hello{};
    RmaHello answer{};
    size_t got = 0, sent = 0;
    bool answering = false;
  };
  std::vector<Out> outs;
  for (int r = rank + 1; r < nranks; ++r) outs.push_back(Out{r});
  std::vector<In> ins;
  int accepted = 0;
  const int wantIn = rank;
  const int64_t timeoutSec = params::getInt("WEFT_CONNECT_TIMEOUT");
  const auto start = std::chrono::steady_clock::now();
  auto fail = [&](Status st) {
    for (auto& o : outs) {
      if (o.fd >= 0) ::close(o.fd);
    }
    for (auto& i : ins) {
      if (i.fd >= 0) ::close(i.fd);
    }
    for (auto& p : peers) {
      if (p.fd >= 0) ::close(p.fd);
      p.fd = -1;
    }
    return st;
  };
  auto startOut = [&](Out& o) {
    const sockaddr_storage sa = peerAddr(o.rank);
    o.fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (o.fd < 0) return false;
    opts.applyEarly(o.fd);
    if (::connect(o.fd, reinterpret_cast<const sockaddr*>(&sa), addrLen(sa)) != 0 && errno != EINPROGRESS) {
      ::close(o.fd);
      o.fd = -1;
      o.retryAt = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      return true;
    }
    o.hello = RmaHello{RmaHello::kMagic, RmaHello::kVersion, RmaHello::kRequest, hs[o.rank].token, commId,
                       static_cast<uint32_t>(rank), static_cast<uint32_t>(nranks)};
    o.sent = o.got = 0;
    return true;
  };
  size_t outsDone = 0;
  while (outsDone < outs.size() || accepted < wantIn) {
    const auto now = std::chrono::steady_clock::now();
    if (timeoutSec > 0 && now - start > std::chrono::seconds(timeoutSec)) {
      std::string missing;
      for (auto& o : outs) {
        if (!o.done) missing += (missing.empty() ? "" : ", ") + peers[o.rank].name;
      }
      WEFT_WARN("RMA connect (rank {} of {}): no connection within WEFT_CONNECT_TIMEOUT={} s{}{}; {} of {} lower ranks "
                "connected (a rank that never reached connect, a firewall, or the wrong WEFT_IFACE)",
                rank, nranks, timeoutSec, missing.empty() ? "" : " to ", missing, accepted, wantIn);
      return fail(Status::kRemote);
    }
    std::vector<pollfd> pfds;
    pfds.push_back({listen->fd(), POLLIN, 0});
    for (auto& o : outs) {
      if (o.done) continue;
      if (o.fd < 0) {
        if (now >= o.retryAt && !startOut(o)) {
          WEFT_WARN("RMA connect: cannot open a socket to {}: {}", peers[o.rank].name, std::strerror(errno));
          return fail(Status::kSystem);
        }
        continue;
      }
      pfds.push_back({o.fd, static_cast<short>(o.sent < sizeof(RmaHello) ? POLLOUT : POLLIN), 0});
    }
    for (auto& i : ins) {
      if (i.fd >= 0) pfds.push_back({i.fd, static_cast<short>(i.answering ? POLLOUT : POLLIN), 0});
    }
    ::poll(pfds.data(), pfds.size(), 20);
    // New incoming sockets.
    for (;;) {
      int fd = ::accept4(listen->fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      ins.push_back(In{fd});
    }
    for (auto& o : outs) {
      if (o.done || o.fd < 0) continue;
      bool dead = false;
      if (o.sent < sizeof(RmaHello) && !moveBytes(o.fd, true, &o.hello, sizeof(o.hello), &o.sent, &dead)) {
        if (dead) {  // refused: the peer's listener is not up yet, or a transient failure; try again
          ::close(o.fd);
          o.fd = -1;
          o.retryAt = now + std::chrono::milliseconds(100);
        }
        continue;
      }
      if (!moveBytes(o.fd, false, &o.answer, sizeof(o.answer), &o.got, &dead)) {
        if (dead) {
          WEFT_WARN("RMA connect: {} closed the connection during the handshake", peers[o.rank].name);
          return fail(Status::kRemote);
        }
        continue;
      }
      if (o.answer.magic != RmaHello::kMagic || o.answer.version != RmaHello::kVersion ||
          o.answer.status != RmaHello::kAccepted) {
        WEFT_WARN("RMA connect: {} refused rank {}: {}", peers[o.rank].name, rank,
                  o.answer.magic == RmaHello::kMagic ? verdictName(o.answer.status) : "not a weft RMA listener");
        return fail(Status::kRemote);
      }
      opts.applyConnected(o.fd);
      peers[o.rank].fd = o.fd;
      o.fd = -1;
      o.done = true;
      ++outsDone;
    }
    for (auto& i : ins) {
      if (i.fd < 0) continue;
      bool dead = false;
      if (!i.answering) {
        if (!moveBytes(i.fd, false, &i.hello, sizeof(i.hello), &i.got, &dead)) {
          if (dead) {
            ::close(i.fd);
            i.fd = -1;
          }
          continue;
        }
        uint16_t verdict = RmaHello::kAccepted;
        if (i.hello.magic != RmaHello::kMagic || i.hello.version != RmaHello::kVersion ||
            i.hello.token != listen->token()) {
          verdict = RmaHello::kWrongToken;
        } else if (i.hello.commId != commId || i.hello.nranks != static_cast<uint32_t>(nranks)) {
          verdict = RmaHello::kWrongComm;
        } else if (i.hello.rank >= static_cast<uint32_t>(rank) || peers[i.hello.rank].fd >= 0) {
          verdict = RmaHello::kBadRank;
        }
        i.answer = RmaHello{RmaHello::kMagic, RmaHello::kVersion, verdict, 0, commId, static_cast<uint32_t>(rank),
                            static_cast<uint32_t>(nranks)};
        i.answering = true;
        if (verdict != RmaHello::kAccepted) {
          WEFT_WARN("RMA connect (rank {}): refused a connection claiming rank {}: {}", rank, i.hello.rank,
                    verdictName(verdict));
        }
      }
      if (!moveBytes(i.fd, true, &i.answer, sizeof(i.answer), &i.sent, &dead)) {
        if (dead) {
          ::close(i.fd);
          i.fd = -1;
        }
        continue;
      }
      if (i.answer.status == RmaHello::kAccepted) {
        opts.applyConnected(i.fd);
        peers[i.hello.rank].fd = i.fd;
        ++accepted;
      } else {
        ::close(i.fd);
      }
      i.fd = -1;
    }
    ins.erase(std::remove_if(ins.begin(), ins.end(), [](const In& i) { return i.fd < 0; }), ins.end());
  }
  for (auto& i : ins) {
    if (i.fd >= 0) ::close(i.fd);
  }
  *out = new TcpRmaComm(rank, nranks, std::move(peers), props, opts.writeMax);
  WEFT_INFO(NCCL_NET | NCCL_INIT, "RMA: rank {} of {} connected on {} in {} ms", rank, nranks, props.name,
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
  return Status::kOk;
}

}  // namespace weft::tcp
