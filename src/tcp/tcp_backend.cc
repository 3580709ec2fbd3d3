// SPDX-License-Identifier: Apache-2.0
#include "tcp/tcp_backend.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <unistd.h>

#include <charconv>
#include <cstring>

#include "weft/common/log.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"
#include "weft/common/sysfs.h"
#include "weft/common/topology.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"
#include "weft/transport/handle.h"
#include "tcp/tcp_acceptor.h"
#include "tcp/tcp_helpers.h"

namespace weft::tcp {
namespace {

// Registration is bookkeeping only: the kernel copies from and to any host address.
class NullRegistrar final : public Registrar {
 public:
  Status registerRange(uintptr_t, size_t, int, int, uint64_t, MrEntry*) override { return Status::kOk; }
  void deregisterRange(MrEntry*) noexcept override {}
};

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

uint32_t TcpBackend::providerHash() { return static_cast<uint32_t>(fnv1a64("weft-tcp-stream-v2")); }

// Flows a connection on this interface opens when WEFT_TCP_FLOWS does not say: clouds cap each TCP flow far below
// the link and hash flows onto paths. NCCL's Socket transport opens 2 threads x 8 sockets on AWS and 4 x 1 on
// Google (ncclNetSocketGetNsockNthread); MANA and virtio-net hosts cap flows too. Anything else: one flow.
int TcpBackend::flowsForNic(unsigned vendor, const char** why) {
  switch (vendor) {
    case 0x1d0f: *why = "AWS ENA"; return 16;
    case 0x1414: *why = "Azure MANA"; return 8;
    case 0x1ae0: *why = "Google gVNIC"; return 4;
    case 0x1af4: *why = "virtio-net"; return 4;
    default: *why = "a NIC without a flow cap weft knows"; return 1;
  }
}

TcpBackend::PendingConnect::~PendingConnect() {
  for (auto& ps : socks) {
    if (ps.fd >= 0) ::close(ps.fd);
  }
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
  const int forcedFlows = static_cast<int>(params::getInt("WEFT_TCP_FLOWS"));
  b->pending_.setTimeout(static_cast<int>(params::getInt("WEFT_CONNECT_TIMEOUT")));
  const int maxRecvs = static_cast<int>(params::getInt("WEFT_TCP_MAX_RECVS"));
  b->helperThreads_ = helperThreadsFromParams();
  for (const auto& i : chosen) {
    if (b->slots_.count() >= kMaxDevices) break;
    auto d = std::make_unique<TcpDevice>();
    RailAddr ra;
    ra.ifname = i.name;
    ra.addr = i.addr;
    ra.len = i.len;
    d->rails.push_back(ra);
    d->acceptor = std::make_shared<Acceptor>(d->rails, b->opts_, i.name);
    d->registrar = std::make_unique<NullRegistrar>();
    d->cache = std::make_unique<MrCache>(d->registrar.get());
    DeviceProps& p = d->props;
    p.name = i.name;
    p.pciPath = topo::nicPciPath(i.name, false);
    p.numaNode = topo::numaNodeOfNic(i.name, p.pciPath);
    p.provider = "tcp (native)";
    p.fabric = sockaddrString(reinterpret_cast<const sockaddr*>(&i.addr), false);
    p.guid = fnv1a64(p.pciPath.empty() ? "weft-tcp/" + i.name : p.pciPath);
    p.ptrSupport = NCCL_PTR_HOST;
    p.speedMbps = sysfs::netdevSpeedMbps(i.name);
    p.maxRecvs = maxRecvs;
    p.regIsGlobal = true;
    const char* why = "WEFT_TCP_FLOWS";
    d->flows = forcedFlows > 0 ? forcedFlows : flowsForNic(topo::nicPciVendor(i.name, p.pciPath), &why);
    if (forcedFlows == 0 && d->flows == 1 && !i.loopback) {
      // A NIC without a flow cap weft knows: each connection finds its count, from one flow up.
      d->flows = kGrowMax;
      d->grow = true;
      why = "a NIC weft does not know: grown while more flows add bandwidth";
    }
    if (b->helperThreads_ > 0) d->helpers = std::make_shared<HelperPool>(b->helperThreads_, p.numaNode, p.name);
    const int flows = d->flows;
    const bool grow = d->grow;
    const int k = b->slots_.add(std::move(d), p);
    WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft device {}: {} (native TCP) at {}, {} Mb/s, pci {}, {}{} flow{} a "
              "connection ({})", k, p.name, p.fabric, p.speedMbps, p.pciPath.empty() ? "none" : p.pciPath,
              grow ? "up to " : "", flows, flows > 1 ? "s" : "", why);
  }
  return b;
}

TcpBackend::~TcpBackend() = default;

Status TcpBackend::makeVDevice(const int* devs, int n, int* out) {
  if (devs == nullptr || out == nullptr || n < 1) return Status::kInternal;
  if (n > maxDevsPerNic()) {
    WEFT_WARN("makeVDevice: {} interfaces asked for; a device holds at most {} on this net table (8 on v12, 4 "
              "before)", n, maxDevsPerNic());
    return Status::kInvalidUsage;
  }
  std::lock_guard<std::mutex> lock(slots_.mutex());
  const int count = slots_.count();
  for (int j = 0; j < n; ++j) {
    if (devs[j] < 0 || devs[j] >= count || slots_.props(devs[j]).vdevCount > 0) {
      WEFT_WARN("makeVDevice: device {} is not one of the {} interfaces", devs[j], slots_.owned());
      return Status::kInvalidUsage;
    }
    for (int m = 0; m < j; ++m) {
      if (devs[m] == devs[j]) {
        WEFT_WARN("makeVDevice: device {} named twice", devs[j]);
        return Status::kInvalidUsage;
      }
    }
  }
  if (count >= kMaxDevices) return Status::kInternal;
  // The listen handle carries every interface's address (1 byte, then 7 per IPv4 and 19 per IPv6 one): eight IPv4
  // interfaces fit its 100 bytes, at most five IPv6 ones.
  size_t handleBytes = 1;
  for (int j = 0; j < n; ++j) handleBytes += slots_.device(devs[j]).rails[0].addr.ss_family == AF_INET ? 7 : 19;
  if (handleBytes > WireHandle::kMaxAddr) {
    WEFT_WARN("makeVDevice: the addresses of these {} interfaces take {} bytes; NCCL's handle leaves {} for them "
              "(at most 5 IPv6 interfaces a device)", n, handleBytes, WireHandle::kMaxAddr);
    return Status::kInvalidUsage;
  }
  if (n == 1) {
    *out = slots_.addMemberView(devs[0]);
    return Status::kOk;
  }
  // A device of its own: its member interfaces in the order NCCL gave them (interface k meets interface k), each
  // with its flows: flow k leaves by interface k % n.
  auto d = std::make_unique<TcpDevice>();
  d->registrar = std::make_unique<NullRegistrar>();
  d->cache = std::make_unique<MrCache>(d->registrar.get());
  DeviceProps& p = d->props;
  p = slots_.props(devs[0]);
  p.speedMbps = 0;
  p.name.clear();
  p.fabric.clear();
  for (int j = 0; j < n; ++j) {
    const TcpDevice& m = slots_.device(devs[j]);
    d->rails.push_back(m.rails[0]);
    d->flows = std::max(d->flows, m.flows);
    d->grow = d->grow || m.grow;
    p.name += (j ? "+" : "") + m.props.name;
    p.speedMbps += m.props.speedMbps;
    p.fabric += (j ? "," : "") + m.props.fabric;
  }
  p.guid = fnv1a64("weft-tcp/" + p.name);
  d->flows = std::min(kMaxFlows / n * n, d->flows * n);  // as many on each interface
  d->acceptor = std::make_shared<Acceptor>(d->rails, opts_, p.name);
  if (helperThreads_ > 0) d->helpers = std::make_shared<HelperPool>(helperThreads_, p.numaNode, p.name);
  WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft device {}: {} fused by NCCL, {} flows a connection, {} Mb/s", count,
            p.name, d->flows, p.speedMbps);
  DeviceProps slot = p;  // what NCCL sees also names the members
  slot.vdevCount = n;
  for (int j = 0; j < n; ++j) slot.vdevs[j] = devs[j];
  *out = slots_.add(std::move(d), slot);
  return Status::kOk;
}

// The handle's address bytes: the interface count, then per interface its family (4 or 6), port (network order)
// and address. Four IPv6 interfaces take 77 of the 100 bytes.
namespace {

bool encodeRails(const std::vector<sockaddr_storage>& addrs, WireHandle* h) {
  size_t n = 0;
  h->addr[n++] = static_cast<uint8_t>(addrs.size());
  for (const auto& sa : addrs) {
    const bool v4 = sa.ss_family == AF_INET;
    const size_t alen = v4 ? 4 : 16;
    if (n + 3 + alen > WireHandle::kMaxAddr) return false;
    h->addr[n++] = v4 ? 4 : 6;
    if (v4) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&sa);
      std::memcpy(&h->addr[n], &a->sin_port, 2);
      std::memcpy(&h->addr[n + 2], &a->sin_addr, 4);
    } else {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&sa);
      std::memcpy(&h->addr[n], &a->sin6_port, 2);
      std::memcpy(&h->addr[n + 2], &a->sin6_addr, 16);
    }
    n += 2 + alen;
  }
  h->addrLen = static_cast<uint16_t>(n);
  return true;
}

bool decodeRails(const WireHandle& h, std::vector<sockaddr_storage>* out) {
  out->clear();
  if (h.addrLen < 1) return false;
  const int rails = h.addr[0];
  size_t n = 1;
  if (rails < 1 || rails > kMaxRails) return false;
  for (int k = 0; k < rails; ++k) {
    if (n + 1 > h.addrLen) return false;
    const uint8_t fam = h.addr[n++];
    const size_t alen = fam == 4 ? 4 : fam == 6 ? 16 : 0;
    if (alen == 0 || n + 2 + alen > h.addrLen) return false;
    sockaddr_storage sa{};
    if (fam == 4) {
      auto* a = reinterpret_cast<sockaddr_in*>(&sa);
      a->sin_family = AF_INET;
      std::memcpy(&a->sin_port, &h.addr[n], 2);
      std::memcpy(&a->sin_addr, &h.addr[n + 2], 4);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&sa);
      a->sin6_family = AF_INET6;
      std::memcpy(&a->sin6_port, &h.addr[n], 2);
      std::memcpy(&a->sin6_addr, &h.addr[n + 2], 16);
    }
    n += 2 + alen;
    out->push_back(sa);
  }
  return n == h.addrLen;
}

socklen_t lengthOf(const sockaddr_storage& sa) {
  return sa.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

}  // namespace

Status TcpBackend::listen(int dev, const CommConfig& config, void* handle, ListenComm** out) {
  (void)config;
  *out = nullptr;
  if (!validDevice(dev, "listen")) return Status::kInternal;
  if (handle == nullptr) return Status::kInternal;
  TcpDevice& d = slots_.device(dev);
  std::vector<sockaddr_storage> addrs;
  if (Status st = d.acceptor->open(&addrs); st != Status::kOk) return st;
  WireHandle h;
  h.backend = BackendId::kTcp;
  h.providerHash = providerHash();
  h.token = randomToken();
  if (!encodeRails(addrs, &h)) {
    WEFT_WARN("listen on {}: {} interface addresses do not fit in NCCL's handle", d.props.name, addrs.size());
    return Status::kInternal;
  }
  h.encode(handle);
  *out = new TcpListenComm(d, h.token, opts_);
  return Status::kOk;
}

Status TcpBackend::connect(int dev, const CommConfig& config, void* handle, SendComm** out) {
  (void)config;
  constexpr const char* kCauses =
      "a firewall or security group dropping traffic between the nodes, or an address the peer cannot reach";
  auto start = [&](PendingConnect& pc) {
    WireHandle h;
    if (Status st = decodeForConnect(handle, props(dev).name, BackendId::kTcp, providerHash(), "native TCP", &h);
        st != Status::kOk) {
      return st;
    }
    std::vector<sockaddr_storage> peer;
    if (!decodeRails(h, &peer)) {
      WEFT_WARN("connect on {}: the handle's addresses are malformed", props(dev).name);
      return Status::kInvalidUsage;
    }
    const TcpDevice& d = slots_.device(dev);
    // Interface k meets interface k, over the interfaces both ends have; this end's flows are spread over them.
    // Flow 0 opens now; the others once the connection carries bulk data (TcpSendComm::startJoins).
    const size_t ifaces = std::min(peer.size(), d.rails.size());
    pc.flows = std::clamp<size_t>(static_cast<size_t>(d.flows) / d.rails.size() * ifaces, 1, kMaxFlows);
    pc.peerName = sockaddrString(reinterpret_cast<sockaddr*>(&peer[0]));
    pc.token = h.token;
    pc.nonce = randomToken();
    pc.socks.resize(1);
    pc.peer.assign(peer.begin(), peer.begin() + static_cast<long>(ifaces));
    if (Status st = startFlow(d, pc, 0); st != Status::kOk) return st;
    return Status::kOk;
  };
  return pending_.connect(*this, dev, handle, kCauses, out, start,
                          [&](PendingConnect& pc, SendComm** o) { return pollConnect(dev, pc, o); });
}

namespace {
bool noRoute(int err) { return err == ENETUNREACH || err == EHOSTUNREACH; }
}  // namespace

Status TcpBackend::startFlow(const TcpDevice& d, PendingConnect& pc, size_t k) {
  const size_t j = k % pc.peer.size();  // its interface
  const sockaddr_storage& sa = pc.peer[j];
  PendingConnect::Sock& ps = pc.socks[k];
  int fd = -1;
  if (pc.peer.size() > 1 && d.rails[j].addr.ss_family == sa.ss_family) {
    fd = bindTcpSocket(d.rails[j].addr, d.rails[j].len, SOCK_NONBLOCK | SOCK_CLOEXEC);  // leave by interface j
  } else {
    fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }
  if (fd < 0) {
    WEFT_WARN("connect on {}: socket(): {}", d.props.name, std::strerror(errno));
    return Status::kSystem;
  }
  opts_.applyEarly(fd);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), lengthOf(sa)) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    ::close(fd);
    if (noRoute(err)) {
      ps.retryAt = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      return Status::kOk;
    }
    WEFT_WARN("connect to {} on {} failed: {} (nothing listening there any more, a firewall/security group, or "
              "an address this host cannot reach)",
              sockaddrString(reinterpret_cast<const sockaddr*>(&sa)), d.props.name, std::strerror(err));
    return Status::kRemote;
  }
  ps.fd = fd;
  return Status::kOk;
}

Status TcpBackend::pollConnect(int dev, PendingConnect& pc, SendComm** out) {
  TcpDevice& d = slots_.device(dev);
  const int flows = static_cast<int>(pc.socks.size());
  bool all = true;
  for (int k = 0; k < flows; ++k) {
    PendingConnect::Sock& ps = pc.socks[k];
    if (ps.fd < 0) {  // no route when last tried (its interface is down): again, within the timeout
      if (std::chrono::steady_clock::now() >= ps.retryAt) {
        if (Status st = startFlow(d, pc, static_cast<size_t>(k)); st != Status::kOk) return st;
      }
      if (ps.fd < 0) {
        all = false;
        continue;
      }
    }
    if (ps.helloSent == 0) {
      // Until the connection is up (or failed: POLLERR, and the send below returns the error). Sending on a
      // socket still connecting returns EAGAIN too, but doing that instead made the 1,024-connection check take
      // 1.5-6.3 s now and then (whole seconds added, as a SYN retransmission would) against 0.21 s with this poll.
      pollfd p{ps.fd, POLLOUT, 0};
      if (::poll(&p, 1, 0) <= 0) {
        all = false;
        continue;
      }
    }
    if (ps.helloSent < sizeof(Hello)) {
      const Hello hello =
          helloRequest(pc.token, pc.nonce, k, static_cast<int>(pc.flows), static_cast<int>(pc.peer.size()));
      ssize_t w = ::send(ps.fd, reinterpret_cast<const uint8_t*>(&hello) + ps.helloSent, sizeof(hello) - ps.helloSent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && noRoute(errno) && ps.helloSent == 0) {  // the connect itself found no route: again later
        ::close(ps.fd);
        ps.fd = -1;
        ps.retryAt = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        all = false;
        continue;
      }
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        WEFT_WARN("connect to {} on {} failed{}: {} (nothing listening there any more, a firewall/security group, "
                  "or an address this host cannot reach)",
                  pc.peerName, d.props.name, flows > 1 ? " on flow " + std::to_string(k) : std::string(),
                  std::strerror(errno));
        return Status::kRemote;
      }
      if (w > 0) ps.helloSent += static_cast<size_t>(w);
      if (ps.helloSent < sizeof(Hello)) {
        all = false;
        continue;
      }
    }
    while (ps.answerGot < sizeof(Hello)) {
      ssize_t r = ::recv(ps.fd, reinterpret_cast<uint8_t*>(&ps.answer) + ps.answerGot, sizeof(Hello) - ps.answerGot,
                         MSG_DONTWAIT);
      if (r > 0) {
        ps.answerGot += static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      WEFT_WARN("connect to {} on {}: the listener closed the handshake ({}): the listen is gone or refused us",
                pc.peerName, d.props.name, r == 0 ? "end of stream" : std::strerror(errno));
      return Status::kRemote;
    }
    if (ps.answerGot < sizeof(Hello)) {
      all = false;
      continue;
    }
    const Hello& a = ps.answer;
    if (a.magic != Hello::kMagic || a.version != Hello::kVersion) {
      WEFT_WARN("connect to {} on {}: the answer is not a weft TCP handshake of this version (v{}, this end v{}: "
                "run the same weft build on every node)",
                pc.peerName, d.props.name, a.version, Hello::kVersion);
      return Status::kRemote;
    }
    if (a.status == Hello::kTunerMismatch) {
      WEFT_WARN("connect to {} on {}: {}", pc.peerName, d.props.name,
                transport::agreementMismatch(a.tunerDigest, pc.peerName));
      return Status::kInvalidUsage;
    }
    if (a.status != Hello::kAccepted || a.token != pc.token || a.nonce != pc.nonce || a.flow != k) {
      WEFT_WARN("connect to {} on {}: refused by the listener ({})", pc.peerName, d.props.name,
                a.status == Hello::kWrongToken   ? "wrong token: the handle belongs to another listen or job"
                : a.status == Hello::kUsed       ? "the handle was used already: a replayed handle"
                : a.status == Hello::kBadRequest ? "malformed request"
                                                 : "an answer that does not match this connection");
      return Status::kRemote;
    }
  }
  if (!all) return Status::kOk;
  std::vector<int> fds;
  for (auto& ps : pc.socks) {
    opts_.applyConnected(ps.fd);
    fds.push_back(ps.fd);
    ps.fd = -1;  // the comm owns it now
  }
  JoinPlan plan;
  plan.token = pc.token;
  plan.nonce = pc.nonce;
  plan.peers = pc.peer;
  *out = numa::make<TcpSendComm>(d.props.numaNode, d, std::move(fds), static_cast<int>(pc.flows),
                                 static_cast<int>(pc.peer.size()), pc.peerName, opts_, std::move(plan));
  WEFT_INFO(NCCL_NET, "connected to {} on {} (tcp{})", pc.peerName, d.props.name,
            pc.flows > 1 ? ", " + std::to_string(pc.flows) + " flows as it carries bulk data" : std::string());
  return Status::kOk;
}

// The data path's system calls and bytes, and comms open, in this process.
bool TcpBackend::stat(std::string_view key, long long* value) const {
  static constexpr std::pair<std::string_view, std::atomic<int64_t> Counters::*> kStats[] = {
      {"tcp.send_calls", &Counters::sendCalls},   {"tcp.recv_calls", &Counters::recvCalls},
      {"tcp.bytes_sent", &Counters::bytesSent},   {"tcp.bytes_received", &Counters::bytesReceived},
      {"tcp.comms_open", &Counters::commsOpen},   {"tcp.flows_open", &Counters::flowsOpen},
      {"tcp.helper_threads", &Counters::helperThreads}, {"tcp.helper_bytes", &Counters::helperBytes},
      {"tcp.stalls", &Counters::stalls}};
  for (const auto& [name, member] : kStats) {
    if (key != name) continue;
    *value = (counters().*member).load(std::memory_order_relaxed);
    return true;
  }
  // tcp.flow_bytes_sent.K: bytes sent on flow K of every connection (the flows' share of a transfer);
  // tcp.rma_flow_bytes_sent.K: the same of the device API's pairs (K = 0: their control flows)
  for (const auto& [prefix, array] : {std::pair{std::string_view("tcp.flow_bytes_sent."), &Counters::flowBytesSent},
                                      std::pair{std::string_view("tcp.rma_flow_bytes_sent."),
                                                &Counters::rmaFlowBytesSent}}) {
    if (key.substr(0, prefix.size()) != prefix) continue;
    int k = -1;
    const std::string_view num = key.substr(prefix.size());
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), k);
    if (ec != std::errc() || p != num.data() + num.size() || k < 0 || k >= kMaxFlows) return false;
    *value = (counters().*array)[k].load(std::memory_order_relaxed);
    return true;
  }
  return false;
}

std::string TcpBackend::describe(int dev) const { return "address " + props(dev).fabric; }

}  // namespace weft::tcp
