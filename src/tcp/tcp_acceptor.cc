// SPDX-License-Identifier: Apache-2.0
#include "tcp/tcp_acceptor.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"

namespace weft::tcp {

bool sendAnswer(int fd, const Hello& request, uint16_t status) {
  Hello a{};
  a.magic = Hello::kMagic;
  a.version = Hello::kVersion;
  a.status = status;
  a.token = request.token;
  a.tunerDigest = transport::localDigest();
  a.nonce = request.nonce;
  a.flow = request.flow;
  a.flows = request.flows;
  a.ifaces = request.ifaces;
  // 40 bytes into a fresh connection's empty buffer: short only when the connector is gone
  return ::send(fd, &a, sizeof(a), MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof(a));
}

Acceptor::Acceptor(std::vector<RailAddr> ifaces, SocketOptions opts, std::string devName)
    : ifaces_(std::move(ifaces)), opts_(opts), devName_(std::move(devName)) {}

Acceptor::~Acceptor() {
  for (auto& in : incoming_) ::close(in.fd);
  for (auto& [token, l] : listens_) {
    if (l.arrival.fd >= 0 && !l.taken) ::close(l.arrival.fd);
  }
}

Status Acceptor::open(std::vector<sockaddr_storage>* addrs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (listeners_.empty()) {
    std::vector<oob::Listener> ls(ifaces_.size());
    for (size_t k = 0; k < ifaces_.size(); ++k) {
      // accepted sockets inherit the buffer sizes set before listen
      if (Status st = oob::Listener::open(ifaces_[k].addr, ifaces_[k].len, SOMAXCONN,
                                          [&](int fd) { opts_.applyEarly(fd); }, devName_, "listen", &ls[k]);
          st != Status::kOk) {
        return st;  // the ones opened close with ls
      }
    }
    listeners_ = std::move(ls);
    WEFT_INFO(NCCL_NET, "listening on {} at {}{} (every listen of the device, and flows that join later)", devName_,
              sockaddrString(reinterpret_cast<const sockaddr*>(&listeners_[0].addr)),
              listeners_.size() > 1 ? " and " + std::to_string(listeners_.size() - 1) + " more interfaces"
                                    : std::string());
  }
  addrs->clear();
  for (const oob::Listener& l : listeners_) addrs->push_back(l.addr);
  return Status::kOk;
}

void Acceptor::addListen(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  listens_[token] = Listen{};
}

void Acceptor::spend(uint64_t token) {
  if (!spent_.insert(token).second) return;
  spentOrder_.push_back(token);
  if (spentOrder_.size() > kSpentMax) {
    spent_.erase(spentOrder_.front());
    spentOrder_.pop_front();
  }
}

void Acceptor::removeListen(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = listens_.find(token);
  if (it == listens_.end()) return;
  if (it->second.used) spend(token);
  if (it->second.arrival.fd >= 0 && !it->second.taken) ::close(it->second.arrival.fd);
  listens_.erase(it);
  closeIfUnused();
}

// With no listen open and no connection waiting for flows, nothing may come in: the sockets close (a connect to
// a handle of a closed listen is refused by the kernel at once, as before there was an acceptor) and reopen, on
// new ports, at the next listen.
void Acceptor::closeIfUnused() {
  if (!listens_.empty() || !joins_.empty() || listeners_.empty()) return;
  for (auto& in : incoming_) ::close(in.fd);
  incoming_.clear();
  listeners_.clear();
}

bool Acceptor::takeArrival(uint64_t token, Arrival* out, bool* tunerMismatch, Status* error) {
  std::lock_guard<std::mutex> lock(mu_);
  *error = pollLocked();
  auto it = listens_.find(token);
  if (it == listens_.end()) return false;
  Listen& l = it->second;
  *tunerMismatch = l.mismatch;
  l.mismatch = false;
  if (!l.used || l.taken) return false;
  l.taken = true;
  *out = std::move(l.arrival);
  l.arrival.fd = -1;
  return true;
}

void Acceptor::addJoin(uint64_t token, JoinBox* box) {
  std::lock_guard<std::mutex> lock(mu_);
  joins_[token] = box;
}

void Acceptor::removeJoin(uint64_t token, JoinBox* box) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = joins_.find(token);
  if (it != joins_.end() && it->second == box) joins_.erase(it);
  spend(token);
  for (auto& [flow, fd] : box->fds) ::close(fd);
  box->fds.clear();
  box->waiting.store(0, std::memory_order_relaxed);
  closeIfUnused();
}

Status Acceptor::poll(bool wait) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return Status::kOk;
  }
  return pollLocked();
}

Status Acceptor::pollLocked() {
  for (size_t k = 0; k < listeners_.size(); ++k) {
    while (incoming_.size() < kMaxIncoming) {
      bool failed = false;
      oob::Socket s = listeners_[k].accept(&failed);
      if (!s.open()) {
        if (!failed) break;  // none waiting (or one reset before it was taken)
        const int err = errno;
        WEFT_WARN("accept on {}: {}", devName_, std::strerror(err));
        return err == EMFILE || err == ENFILE ? Status::kSystem : Status::kInternal;
      }
      sockaddr_storage sa{};
      socklen_t len = sizeof(sa);
      const bool named = ::getpeername(s.fd(), reinterpret_cast<sockaddr*>(&sa), &len) == 0;
      Incoming in;
      in.fd = s.release();
      in.iface = static_cast<int>(k);
      in.peer = named ? sockaddrString(reinterpret_cast<sockaddr*>(&sa)) : std::string("?");
      in.started = std::chrono::steady_clock::now();
      incoming_.push_back(std::move(in));
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (size_t k = 0; k < incoming_.size();) {
    Incoming& in = incoming_[k];
    bool done = serve(in);
    if (!done && now - in.started > kHelloTimeout) {
      WEFT_WARN("accept on {}: {} connected but sent no complete hello within {} s; dropped", devName_, in.peer,
                kHelloTimeout.count());
      ::close(in.fd);
      done = true;
    }
    if (done) {
      incoming_[k] = std::move(incoming_.back());
      incoming_.pop_back();
      continue;
    }
    ++k;
  }
  return Status::kOk;
}

void Acceptor::refuse(Incoming& in, uint16_t status, const char* why) {
  if (why != nullptr) WEFT_WARN("accept on {}: refused {}: {}", devName_, in.peer, why);
  (void)sendAnswer(in.fd, in.hello, status);
  ::close(in.fd);
}

bool Acceptor::serve(Incoming& in) {
  while (in.got < sizeof(Hello)) {
    ssize_t r = ::recv(in.fd, reinterpret_cast<uint8_t*>(&in.hello) + in.got, sizeof(Hello) - in.got, MSG_DONTWAIT);
    if (r > 0) {
      in.got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    WEFT_INFO(NCCL_NET, "accept on {}: {} went away during the handshake", devName_, in.peer);
    ::close(in.fd);
    return true;
  }
  const Hello& h = in.hello;
  if (h.magic != Hello::kMagic || h.version != Hello::kVersion || h.status != Hello::kRequest) {
    refuse(in, Hello::kBadRequest, "not a weft TCP hello of this version (run the same weft build on every node)");
    return true;
  }
  if (h.flows < 1 || h.flows > kMaxFlows || h.flow >= h.flows || h.ifaces < 1 || h.ifaces > listeners_.size() ||
      h.flow % h.ifaces != static_cast<unsigned>(in.iface)) {
    refuse(in, Hello::kBadRequest, "a flow or interface this device does not have");
    return true;
  }
  if (h.flow > 0) {  // a flow joining an accepted connection
    auto j = joins_.find(h.token);
    if (j == joins_.end() || j->second->nonce != h.nonce || h.flows != j->second->flows) {
      refuse(in, spent_.count(h.token) != 0 || j != joins_.end() ? Hello::kUsed : Hello::kWrongToken,
             spent_.count(h.token) != 0 || j != joins_.end()
                 ? "a flow for a connection that is gone or not its own"
                 : "wrong token: the handle belongs to another listen or job");
      return true;
    }
    if (!sendAnswer(in.fd, h, Hello::kAccepted)) {
      ::close(in.fd);
      return true;
    }
    opts_.applyConnected(in.fd);
    j->second->fds.emplace_back(h.flow, in.fd);
    j->second->waiting.fetch_add(1, std::memory_order_release);
    return true;
  }
  auto it = listens_.find(h.token);
  if (it == listens_.end()) {
    refuse(in, spent_.count(h.token) != 0 || joins_.count(h.token) != 0 ? Hello::kUsed : Hello::kWrongToken,
           spent_.count(h.token) != 0 || joins_.count(h.token) != 0
               ? "this listen's handle was used already (a replayed handle)"
               : "wrong token: the handle belongs to another listen or job");
    return true;
  }
  Listen& l = it->second;
  if (l.used) {
    refuse(in, Hello::kUsed, "this listen's handle was used already (a replayed handle)");
    return true;
  }
  if (!transport::agreesWith(h.tunerDigest)) {
    WEFT_WARN("accept on {}: {}", devName_, transport::agreementMismatch(h.tunerDigest, in.peer));
    refuse(in, Hello::kTunerMismatch, nullptr);
    l.mismatch = true;
    return true;
  }
  l.used = true;
  l.arrival.fd = in.fd;
  l.arrival.peer = in.peer;
  l.arrival.hello = h;
  return true;
}

}  // namespace weft::tcp
