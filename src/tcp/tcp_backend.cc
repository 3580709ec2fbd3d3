#include "tcp/tcp_backend.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"
#include "weft/common/sysfs.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"
#include "weft/transport/handle.h"

namespace weft::tcp {
namespace {

// Registration is bookkeeping only: the kernel copies from and to any host address.
class NullRegistrar final : public Registrar {
 public:
  Status registerRange(uintptr_t, size_t, int, int, uint64_t, MrEntry*) override { return Status::kOk; }
  void deregisterRange(MrEntry*) noexcept override {}
};

bool isLoopbackOrBridge(const std::string& name) {
  return name == "lo" || name.rfind("docker", 0) == 0 || name.rfind("virbr", 0) == 0;
}

struct Interface {
  std::string name;
  sockaddr_storage addr{};
  socklen_t len = 0;
  bool loopback = false;
};

// Interfaces that are up with an address, in the kernel's order; IPv4 preferred, then a global IPv6 address.
std::vector<Interface> interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (int family : {AF_INET, AF_INET6}) {
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != family || (i->ifa_flags & IFF_UP) == 0) continue;
      if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr))
        continue;
      bool seen = false;
      for (const auto& o : out) seen |= o.name == i->ifa_name;
      if (seen) continue;
      Interface f;
      f.name = i->ifa_name;
      f.len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      std::memcpy(&f.addr, i->ifa_addr, f.len);
      f.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
      out.push_back(f);
    }
  }
  freeifaddrs(list);
  return out;
}

}  // namespace

uint32_t TcpBackend::providerHash() { return static_cast<uint32_t>(fnv1a64("weft-tcp-stream-v1")); }

TcpBackend::PendingConnect::~PendingConnect() {
  if (fd >= 0) ::close(fd);
}

std::unique_ptr<TcpBackend> TcpBackend::discover(std::string* why) {
  const std::string& spec = params::getString("WEFT_IFACE");
  std::vector<Interface> all = interfaces(), chosen;
  for (const auto& i : all) {
    if (spec.empty() ? !isLoopbackOrBridge(i.name) : matchInterface(i.name, spec)) chosen.push_back(i);
  }
  if (chosen.empty() && spec.empty()) {
    for (const auto& i : all) {
      if (i.loopback) chosen.push_back(i);
    }
  }
  if (chosen.empty()) {
    *why = spec.empty() ? "no network interface with an address is up"
                        : "no interface that is up with an address matches WEFT_IFACE='" + spec + "'";
    return nullptr;
  }
  auto b = std::unique_ptr<TcpBackend>(new TcpBackend());
  b->opts_ = SocketOptions::fromParams();
  b->pending_.setTimeout(static_cast<int>(params::getInt("WEFT_CONNECT_TIMEOUT")));
  const int maxRecvs = static_cast<int>(params::getInt("WEFT_MAX_RECVS"));
  for (const auto& i : chosen) {
    const int k = b->count_.load();
    if (k >= kMaxDevices) break;
    auto d = std::make_unique<TcpDevice>();
    d->addr = i.addr;
    d->addrLen = i.len;
    d->registrar = std::make_unique<NullRegistrar>();
    d->cache = std::make_unique<MrCache>(d->registrar.get());
    DeviceProps& p = d->props;
    p.name = i.name;
    p.pciPath = sysfs::netdevPciPath(i.name);
    p.provider = "tcp (native)";
    p.fabric = sockaddrString(reinterpret_cast<const sockaddr*>(&i.addr), false);
    p.guid = fnv1a64(p.pciPath.empty() ? "weft-tcp/" + i.name : p.pciPath);
    p.ptrSupport = NCCL_PTR_HOST;
    p.speedMbps = sysfs::netdevSpeedMbps(i.name);
    p.maxRecvs = maxRecvs;
    p.regIsGlobal = true;
    b->slots_[k].dev = d.get();
    b->slots_[k].props = p;
    WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft device {}: {} (native TCP) at {}, {} Mb/s, pci {}", k, p.name, p.fabric,
              p.speedMbps, p.pciPath.empty() ? "none" : p.pciPath);
    b->devices_.push_back(std::move(d));
    b->count_.store(k + 1, std::memory_order_release);
  }
  return b;
}

TcpBackend::~TcpBackend() = default;

Status TcpBackend::makeVDevice(const int* devs, int n, int* out) {
  if (devs == nullptr || out == nullptr || n < 1) return Status::kInternal;
  if (n > 1) {
    WEFT_WARN("makeVDevice: fusing {} interfaces into one device is not offered by the TCP backend; NCCL keeps "
              "them separate",
              n);
    return Status::kInvalidUsage;
  }
  if (devs[0] < 0 || devs[0] >= deviceCount()) {
    WEFT_WARN("makeVDevice: device {} does not exist ({} devices)", devs[0], deviceCount());
    return Status::kInvalidUsage;
  }
  std::lock_guard<std::mutex> lock(slotsMutex_);
  const int i = count_.load(std::memory_order_relaxed);
  if (i >= kMaxDevices) return Status::kInternal;
  slots_[i] = slots_[devs[0]];
  slots_[i].props.vdevCount = 1;
  slots_[i].props.vdevs[0] = devs[0];
  count_.store(i + 1, std::memory_order_release);
  *out = i;
  return Status::kOk;
}

Status TcpBackend::listen(int dev, const CommConfig& config, void* handle, ListenComm** out) {
  (void)config;
  *out = nullptr;
  if (dev < 0 || dev >= deviceCount()) {
    WEFT_WARN("listen on device {}, but there are {} devices", dev, deviceCount());
    return Status::kInternal;
  }
  if (handle == nullptr) return Status::kInternal;
  TcpDevice& d = *slots_[dev].dev;
  sockaddr_storage sa = d.addr;
  socklen_t len = d.addrLen;
  int fd = bindTcpSocket(sa, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) opts_.applyEarly(fd);  // accepted sockets inherit the buffer sizes
  if (fd < 0 || ::listen(fd, 64) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    WEFT_WARN("listen on {}: cannot open a listening socket at {}: {}", d.props.name,
              sockaddrString(reinterpret_cast<sockaddr*>(&sa)), std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return errno == EMFILE || errno == ENFILE ? Status::kSystem : Status::kInternal;
  }
  WireHandle h;
  h.backend = BackendId::kTcp;
  h.providerHash = providerHash();
  h.token = randomToken();
  h.addrLen = static_cast<uint16_t>(len);
  std::memcpy(h.addr.data(), &sa, len);
  h.encode(handle);
  WEFT_INFO(NCCL_NET, "listening on {} at {}", d.props.name, sockaddrString(reinterpret_cast<sockaddr*>(&sa)));
  *out = new TcpListenComm(d, fd, h.token, opts_);
  return Status::kOk;
}

Status TcpBackend::connect(int dev, const CommConfig& config, void* handle, SendComm** out) {
  (void)config;
  *out = nullptr;
  if (dev < 0 || dev >= deviceCount()) {
    WEFT_WARN("connect on device {}, but there are {} devices", dev, deviceCount());
    return Status::kInternal;
  }
  PendingConnect* pc = nullptr;
  constexpr const char* kCauses =
      "a firewall or security group dropping traffic between the nodes, or an address the peer cannot reach";
  if (pending_.find(handle, &pc, props(dev).name, kCauses) == PendingConnects<PendingConnect>::Lookup::kTimedOut) {
    return Status::kRemote;
  }
  if (pc == nullptr) {
    WireHandle h;
    if (Status st = decodeForConnect(handle, props(dev).name, &h); st != Status::kOk) return st;
    if (h.backend != BackendId::kTcp || h.providerHash != providerHash()) {
      WEFT_WARN("connect on {}: the handle comes from a different transport than native TCP (every rank must use "
                "the same WEFT_BACKEND)",
                props(dev).name);
      return Status::kInvalidUsage;
    }
    sockaddr_storage sa{};
    if (h.addrLen > sizeof(sa) || h.addrLen < sizeof(sockaddr_in)) {
      WEFT_WARN("connect on {}: the handle's address is malformed", props(dev).name);
      return Status::kInvalidUsage;
    }
    std::memcpy(&sa, h.addr.data(), h.addrLen);
    if ((sa.ss_family != AF_INET && sa.ss_family != AF_INET6) ||
        (sa.ss_family == AF_INET6 && h.addrLen < sizeof(sockaddr_in6))) {
      WEFT_WARN("connect on {}: the handle's address is malformed", props(dev).name);
      return Status::kInvalidUsage;
    }
    auto fresh = std::make_unique<PendingConnect>();
    std::memcpy(fresh->handleBytes, handle, kHandleSize);
    fresh->started = std::chrono::steady_clock::now();
    fresh->peerName = sockaddrString(reinterpret_cast<sockaddr*>(&sa));
    fresh->token = h.token;
    fresh->fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fresh->fd < 0) {
      WEFT_WARN("connect on {}: socket(): {}", props(dev).name, std::strerror(errno));
      return Status::kSystem;
    }
    opts_.applyEarly(fresh->fd);
    if (::connect(fresh->fd, reinterpret_cast<sockaddr*>(&sa), h.addrLen) != 0 && errno != EINPROGRESS) {
      WEFT_WARN("connect to {} on {} failed: {} (nothing listening there any more, a firewall/security group, or "
                "an address this host cannot reach)",
                fresh->peerName, props(dev).name, std::strerror(errno));
      return Status::kRemote;
    }
    pc = pending_.add(handle, std::move(fresh));
  }
  Status st = pollConnect(dev, *pc, out);
  if (st != Status::kOk || *out != nullptr) pending_.erase(handle);
  return st;
}

Status TcpBackend::pollConnect(int dev, PendingConnect& pc, SendComm** out) {
  TcpDevice& d = *slots_[dev].dev;
  if (pc.helloSent == 0) {
    // Until the connection is up (or failed: POLLERR, and the send below returns the error). Sending on a socket
    // still connecting returns EAGAIN too, but doing that instead made the 1,024-connection check take 1.5-6.3 s
    // now and then (whole seconds added, as a SYN retransmission would) against 0.21 s with this poll.
    pollfd p{pc.fd, POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) return Status::kOk;
  }
  if (pc.helloSent < sizeof(Hello)) {
    Hello hello{};
    hello.magic = Hello::kMagic;
    hello.version = Hello::kVersion;
    hello.status = Hello::kRequest;
    hello.token = pc.token;
    hello.tunerDigest = transport::localDigest();
    ssize_t w = ::send(pc.fd, reinterpret_cast<uint8_t*>(&hello) + pc.helloSent, sizeof(hello) - pc.helloSent,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      WEFT_WARN("connect to {} on {} failed: {} (nothing listening there any more, a firewall/security group, or "
                "an address this host cannot reach)",
                pc.peerName, d.props.name, std::strerror(errno));
      return Status::kRemote;
    }
    if (w > 0) pc.helloSent += static_cast<size_t>(w);
    if (pc.helloSent < sizeof(Hello)) return Status::kOk;
  }
  while (pc.answerGot < sizeof(Hello)) {
    ssize_t r = ::recv(pc.fd, reinterpret_cast<uint8_t*>(&pc.answer) + pc.answerGot, sizeof(Hello) - pc.answerGot,
                       MSG_DONTWAIT);
    if (r > 0) {
      pc.answerGot += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::kOk;
    WEFT_WARN("connect to {} on {}: the listener closed the handshake ({}): the listen is gone or refused us",
              pc.peerName, d.props.name, r == 0 ? "end of stream" : std::strerror(errno));
    return Status::kRemote;
  }
  const Hello& a = pc.answer;
  if (a.magic != Hello::kMagic || a.version != Hello::kVersion) {
    WEFT_WARN("connect to {} on {}: the answer is not a weft TCP handshake of this version (v{}, this end v{}: run "
              "the same weft build on every node)",
              pc.peerName, d.props.name, a.version, Hello::kVersion);
    return Status::kRemote;
  }
  if (a.status == Hello::kTunerMismatch) {
    WEFT_WARN("connect to {} on {}: {}", pc.peerName, d.props.name,
              transport::agreementMismatch(a.tunerDigest, pc.peerName));
    return Status::kInvalidUsage;
  }
  if (a.status != Hello::kAccepted || a.token != pc.token) {
    WEFT_WARN("connect to {} on {}: refused by the listener ({})", pc.peerName, d.props.name,
              a.status == Hello::kWrongToken   ? "wrong token: the handle belongs to another listen or job"
              : a.status == Hello::kUsed       ? "the handle was used already: a replayed handle"
              : a.status == Hello::kBadRequest ? "malformed request"
                                               : "an answer that does not match this connection");
    return Status::kRemote;
  }
  opts_.applyConnected(pc.fd);
  *out = new TcpSendComm(d, pc.fd, pc.peerName, opts_.writeMax);
  pc.fd = -1;  // the comm owns it now
  WEFT_INFO(NCCL_NET, "connected to {} on {} (tcp)", pc.peerName, d.props.name);
  return Status::kOk;
}

}  // namespace weft::tcp
