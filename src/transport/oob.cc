// SPDX-License-Identifier: Apache-2.0
#include "weft/transport/oob.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"

namespace weft::oob {

Deadline connectDeadline() {
  const int64_t sec = params::getInt("WEFT_CONNECT_TIMEOUT");
  return sec > 0 ? Clock::now() + std::chrono::seconds(sec) : Deadline::max();
}

void Socket::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status Listener::open(sockaddr_storage at, socklen_t len, int backlog, const std::function<void(int)>& early,
                      const std::string& device, const char* what, Listener* out) {
  const sockaddr_storage asked = at;
  int fd = bindTcpSocket(at, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0 && early) early(fd);
  if (fd < 0 || ::listen(fd, backlog) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&at), &len) != 0) {
    const int err = errno;
    WEFT_WARN("{} on {}: cannot open a listening socket at {}: {}", what, device,
              sockaddrString(reinterpret_cast<const sockaddr*>(&asked), false), std::strerror(err));
    if (fd >= 0) ::close(fd);
    return Status::kSystem;
  }
  out->sock.reset(fd);
  out->addr = at;
  out->len = len;
  return Status::kOk;
}

void Listener::handle(BackendId backend, uint32_t providerHash, void* out) {
  WireHandle h;
  h.backend = backend;
  h.providerHash = providerHash;
  h.token = token = randomToken();
  h.addrLen = static_cast<uint16_t>(std::min<size_t>(len, h.addr.size()));
  std::memcpy(h.addr.data(), &addr, h.addrLen);
  h.encode(out);
}

Socket Listener::accept(bool* failed) const {
  *failed = false;
  for (;;) {
    int fd = ::accept4(sock.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) return Socket(fd);
    if (errno == EINTR) continue;
    // A connection reset before it was taken is gone, not a failure of the listener.
    *failed = errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED;
    return Socket();
  }
}

bool handleAddress(const WireHandle& h, sockaddr_storage* out, socklen_t* len) {
  if (h.addrLen < sizeof(sockaddr_in) || h.addrLen > sizeof(sockaddr_storage)) return false;
  *out = sockaddr_storage{};
  std::memcpy(out, h.addr.data(), h.addrLen);
  if (out->ss_family == AF_INET) {
    *len = sizeof(sockaddr_in);
    return true;
  }
  if (out->ss_family == AF_INET6 && h.addrLen >= sizeof(sockaddr_in6)) {
    *len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

Moved moveSome(int fd, bool send, void* buf, size_t len, size_t* done) {
  while (*done < len) {
    ssize_t n = send ? ::send(fd, static_cast<char*>(buf) + *done, len - *done, MSG_NOSIGNAL | MSG_DONTWAIT)
                     : ::recv(fd, static_cast<char*>(buf) + *done, len - *done, MSG_DONTWAIT);
    if (n > 0) {
      *done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0 && !send) return Moved::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Moved::kAgain;
    return Moved::kFailed;
  }
  return Moved::kDone;
}

bool waitFd(int fd, short events, Deadline deadline, std::string* why) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) {
    *why = "WEFT_CONNECT_TIMEOUT passed";
    return false;
  }
  pollfd p{fd, events, 0};
  if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0 && errno != EINTR) {
    *why = std::strerror(errno);
    return false;
  }
  return true;
}

bool moveAll(int fd, bool send, void* buf, size_t n, Deadline deadline, std::string* why) {
  size_t done = 0;
  for (;;) {
    switch (moveSome(fd, send, buf, n, &done)) {
      case Moved::kDone: return true;
      case Moved::kClosed: *why = "the peer closed its socket"; return false;
      case Moved::kFailed: *why = std::strerror(errno); return false;
      case Moved::kAgain: break;
    }
    if (!waitFd(fd, send ? POLLOUT : POLLIN, deadline, why)) return false;
  }
}

Socket startConnect(const sockaddr_storage& addr, socklen_t len, const std::function<void(int)>& early) {
  Socket s(::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.open()) return s;
  if (early) early(s.fd());
  int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    s.reset();
    errno = err;
  }
  return s;
}

Hello Hello::request(uint64_t token, uint64_t commId, int rank, int nranks) {
  return Hello{kMagic, kVersion, kRequest, token, commId, static_cast<uint32_t>(rank), static_cast<uint32_t>(nranks)};
}

Hello Hello::answer(uint16_t verdict, uint64_t commId, int rank, int nranks) {
  return Hello{kMagic, kVersion, verdict, 0, commId, static_cast<uint32_t>(rank), static_cast<uint32_t>(nranks)};
}

uint16_t Hello::verdict(uint64_t tok, uint64_t comm, int n, const std::function<bool(uint32_t)>& rankOk) const {
  if (magic != kMagic || version != kVersion || status != kRequest || tok == 0 || token != tok) return kWrongToken;
  if (commId != comm || nranks != static_cast<uint32_t>(n)) return kWrongComm;
  if (rank >= nranks || !rankOk(rank)) return kBadRank;
  return kAccepted;
}

const char* Hello::verdictName(uint16_t s) {
  switch (s) {
    case kAccepted: return "accepted";
    case kWrongToken: return "a handle that is not this listener's (a stale or foreign handle)";
    case kWrongComm: return "a different communicator";
    case kBadRank: return "a rank outside the communicator, or one seen already";
    default: return "an unknown answer";
  }
}

bool Ring::open(const Listener& listen, const sockaddr_storage& next, socklen_t nextLen, uint64_t nextToken, int rank,
                int nranks, uint64_t commId, Deadline deadline, std::string* why) {
  rank_ = rank;
  nranks_ = nranks;
  toNext_ = startConnect(next, nextLen);
  if (!toNext_.open()) {
    *why = std::string("connecting to the next rank: ") + std::strerror(errno);
    return false;
  }
  Hello hello = Hello::request(nextToken, commId, rank, nranks);
  if (!moveAll(toNext_.fd(), true, &hello, sizeof(hello), deadline, why)) {
    *why = "the hello to the next rank: " + *why;
    return false;
  }
  // Connections waiting for their hello, read together: a stray that stays silent holds no one up.
  struct Pending {
    Socket sock;
    Hello hello{};
    size_t got = 0;
  };
  std::vector<Pending> pending;
  const uint32_t prev = static_cast<uint32_t>((rank - 1 + nranks) % nranks);
  for (;;) {
    for (;;) {
      bool failed = false;
      Socket s = listen.accept(&failed);
      if (failed) {
        *why = std::string("accepting the previous rank: ") + std::strerror(errno);
        return false;
      }
      if (!s.open()) break;
      pending.push_back(Pending{std::move(s)});
    }
    for (Pending& p : pending) {
      const Moved m = moveSome(p.sock.fd(), false, &p.hello, sizeof(p.hello), &p.got);
      if (m == Moved::kAgain) continue;
      if (m != Moved::kDone) {
        p.sock.reset();  // gone before its hello: a stray, or a peer that gave up
        continue;
      }
      const uint16_t v = p.hello.verdict(listen.token, commId, nranks, [&](uint32_t r) { return r == prev; });
      if (v != Hello::kAccepted) {
        WEFT_WARN("RMA connect (rank {} of {}): refused a connection claiming rank {} of {} (comm {:#x}): {}", rank,
                  nranks, p.hello.rank, p.hello.nranks, p.hello.commId, Hello::verdictName(v));
        p.sock.reset();
        continue;
      }
      int one = 1;
      ::setsockopt(p.sock.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fromPrev_ = std::move(p.sock);
      return true;
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(), [](const Pending& p) { return !p.sock.open(); }),
                  pending.end());
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      *why = "waiting for the previous rank: WEFT_CONNECT_TIMEOUT passed";
      return false;
    }
    std::vector<pollfd> fds{{listen.sock.fd(), POLLIN, 0}};
    for (const Pending& p : pending) fds.push_back({p.sock.fd(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left, 100)));
  }
}

bool Ring::allgather(const void* mine, size_t bytes, std::vector<char>* all, Deadline deadline, std::string* why) {
  all->assign(bytes * static_cast<size_t>(nranks_), 0);
  std::vector<char> out(static_cast<const char*>(mine), static_cast<const char*>(mine) + bytes), in(bytes);
  std::memcpy(all->data() + bytes * static_cast<size_t>(rank_), mine, bytes);
  for (int step = 1; step < nranks_; ++step) {
    size_t sent = 0, got = 0;
    for (;;) {
      const Moved s = moveSome(toNext_.fd(), true, out.data(), bytes, &sent);
      if (s == Moved::kFailed) {
        *why = std::string("to the next rank: ") + std::strerror(errno);
        return false;
      }
      const Moved r = moveSome(fromPrev_.fd(), false, in.data(), bytes, &got);
      if (r == Moved::kClosed || r == Moved::kFailed) {
        *why = r == Moved::kClosed ? "the previous rank closed its socket"
                                   : std::string("from the previous rank: ") + std::strerror(errno);
        return false;
      }
      if (s == Moved::kDone && r == Moved::kDone) break;
      if (Clock::now() > deadline) {
        *why = "WEFT_CONNECT_TIMEOUT passed";
        return false;
      }
      pollfd p[2] = {{toNext_.fd(), static_cast<short>(s == Moved::kDone ? 0 : POLLOUT), 0},
                     {fromPrev_.fd(), static_cast<short>(r == Moved::kDone ? 0 : POLLIN), 0}};
      ::poll(p, 2, 100);
    }
    const size_t origin = static_cast<size_t>((rank_ - step + nranks_) % nranks_);
    std::memcpy(all->data() + bytes * origin, in.data(), bytes);
    out.swap(in);
  }
  return true;
}

bool Ring::barrier(Deadline deadline, std::string* why) {
  // Rank 0 sends first and the others pass it on: once it is back every rank has arrived; the second round tells
  // every rank that all have.
  for (int round = 0; round < 2; ++round) {
    uint8_t token = 1;
    const bool ok = rank_ == 0 ? moveAll(toNext_.fd(), true, &token, 1, deadline, why) &&
                                     moveAll(fromPrev_.fd(), false, &token, 1, deadline, why)
                               : moveAll(fromPrev_.fd(), false, &token, 1, deadline, why) &&
                                     moveAll(toNext_.fd(), true, &token, 1, deadline, why);
    if (!ok) return false;
  }
  return true;
}

}  // namespace weft::oob
