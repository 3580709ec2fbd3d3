// SPDX-License-Identifier: Apache-2.0
#include "fabric/fabric_device.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include "fabric/rails.h"
#include "weft/common/process.h"
#include "weft/common/cuda_shim.h"
#include "weft/common/netif.h"
#include "weft/common/params.h"
#include "weft/common/topology.h"
#include "weft/nccl/net.h"
#include "weft/transport/handle.h"

namespace weft::fabric {

const std::vector<std::string>& defaultProviders() {
  static const std::vector<std::string> kOrder = {"efa", "verbs;ofi_rxm", "tcp;ofi_rxm", "tcp", "sockets"};
  return kOrder;
}

namespace {

constexpr uint32_t kApiVersion = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);

InfoPtr makeHints(const std::string& provider, bool directed, bool manualProgress, bool hmem, bool rma,
                  uint64_t extraCaps = 0) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return hints;
  // RMA reads: the read-back flush after receives into GPU memory (FabricRecvComm::iflush).
  hints->caps = FI_TAGGED | FI_SEND | FI_RECV | (directed ? FI_DIRECTED_RECV : 0) |
                (hmem ? FI_HMEM | FI_RMA | FI_READ | FI_REMOTE_READ : 0) |
                (rma ? FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ : 0) | extraCaps;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->resource_mgmt = FI_RM_ENABLED;
  // Progress is driven from test(): a provider thread would fight NCCL's threads for the cores.
  if (manualProgress) {
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->control_progress = FI_PROGRESS_MANUAL;
  }
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  if (hmem) hints->domain_attr->mr_mode |= FI_MR_HMEM;
  // No ordering asked for (FI_ORDER_NONE, 0; the name is deprecated from libfabric 2.0): matching order comes from
  // our sequence tags.
  hints->tx_attr->msg_order = 0;
  hints->rx_attr->msg_order = 0;
  if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());
  return hints;
}


// Whether the sockets provider's data sockets get fixed buffers of a size that no partly consumed loopback skb can
// fill (FI_SOCKETS_MAX_BUF_SZ, weft's default 4 MiB; it sets SO_RCVBUF on the listening socket, which every socket
// a peer's data arrives on is accepted from). Below 1 MiB, or 0 (autotuning), the stall warned about can happen.
bool socketsBuffersFixed() {
  const char* v = params::foreign("FI_SOCKETS_MAX_BUF_SZ");
  if (v == nullptr) return false;
  char* end = nullptr;
  long long n = std::strtoll(v, &end, 10);
  return end != v && *end == '\0' && n >= (1 << 20);
}

std::string pciPathOf(const fi_info* info) {
  if (info->nic != nullptr && info->nic->bus_attr != nullptr && info->nic->bus_attr->bus_type == FI_BUS_PCI) {
    const auto& pci = info->nic->bus_attr->attr.pci;
    char bdf[64];
    std::snprintf(bdf, sizeof(bdf), "/sys/bus/pci/devices/%04x:%02x:%02x.%x", pci.domain_id, pci.bus_id,
                  pci.device_id, pci.function_id);
    std::string p = sysfs::realPath(bdf);
    if (!p.empty()) return p;
  }
  // tcp/sockets: the domain is a network interface; a physical one has a PCI device behind it.
  if (info->domain_attr != nullptr && info->domain_attr->name != nullptr) {
    std::string p = topo::nicPciPath(info->domain_attr->name, false);
    if (!p.empty()) return p;
  }
  return {};
}

int speedMbpsOf(const fi_info* info) {
  if (info->nic != nullptr && info->nic->link_attr != nullptr && info->nic->link_attr->speed > 0) {
    return static_cast<int>(std::min<size_t>(info->nic->link_attr->speed / 1000000, INT_MAX));
  }
  if (info->domain_attr != nullptr && info->domain_attr->name != nullptr) {
    return sysfs::netdevSpeedMbps(info->domain_attr->name);
  }
  return 10000;
}

int addrPreference(const fi_info* i) {
  switch (i->addr_format) {
    case FI_SOCKADDR_IN: return 0;
    case FI_SOCKADDR_IN6: {
      // Link-local IPv6 needs a scope id that does not survive another host: last resort.
      auto* sa = static_cast<const sockaddr_in6*>(i->src_addr);
      if (sa != nullptr && IN6_IS_ADDR_LINKLOCAL(&sa->sin6_addr)) return 3;
      return 1;
    }
    default: return 2;
  }
}

// The provider settings weft chooses (params::foreignDefaults), in place before libfabric reads them, logged once.
void applyProviderDefaults() {
  static const bool logged = [] {
    std::string line;
    for (const auto& s : params::applyForeignDefaults()) {
      line += (line.empty() ? "" : ", ") + std::string(s.def->name) + "=" + s.value +
              (s.fromUser ? " (user's)" : " (weft's default)");
    }
    WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft provider settings: {}", line);
    return true;
  }();
  (void)logged;
}

}  // namespace

std::vector<Candidate> probe(const std::string& provider, std::string* why) {
  applyProviderDefaults();
  std::vector<Candidate> out;
  fi_info* list = nullptr;
  int rc = -FI_ENODATA;
  // Ask for the most we can use first, then relax: RMA (the rdma protocol), GPU memory, directed receives and
  // manual progress are preferences, not requirements.
  const bool wantHmem = cuda::compiledIn() && params::getString("WEFT_GDR") != "0";
  const bool wantRma = params::getString("WEFT_PROTOCOL") != "sendrecv";
  for (int attempt = 0; attempt < 16 && rc != 0; ++attempt) {
    bool hmem = wantHmem && (attempt & 4) == 0;
    if (!wantHmem && (attempt & 4) == 0) continue;
    bool rma = wantRma && (attempt & 8) == 0;
    if (!wantRma && (attempt & 8) == 0) continue;
    InfoPtr hints = makeHints(provider, (attempt & 1) == 0, (attempt & 2) == 0, hmem, rma);
    if (!hints) {
      *why = "fi_allocinfo failed";
      return out;
    }
    rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &list);
  }
  if (rc != 0) {
    *why = "fi_getinfo(" + (provider.empty() ? std::string("any provider") : provider) +
           ", reliable tagged endpoints): " + fi_strerror(-rc);
    return out;
  }
  InfoPtr owner(list);
  out = candidatesFrom(list, provider, wantHmem);
  if (out.empty()) *why = "no domain of " + (provider.empty() ? std::string("any provider") : provider);
  return out;
}

std::vector<Candidate> probeRma(const std::string& provider, std::string* why) {
  applyProviderDefaults();
  std::vector<Candidate> out;
  // RMA reads and writes are required; atomics, GPU memory and manual progress are asked for first, then relaxed.
  // An answer is taken only when it has a domain of `provider` itself: asked for atomics, libfabric 2.x answers
  // "tcp" with tcp;ofi_rxm alone (the native tcp has none).
  const bool wantHmem = cuda::compiledIn() && params::getString("WEFT_GDR") != "0";
  int rc = -FI_ENODATA;
  for (int attempt = 0; attempt < 8 && out.empty(); ++attempt) {
    const bool atomics = (attempt & 1) == 0;
    const bool hmem = wantHmem && (attempt & 2) == 0;
    if (!wantHmem && (attempt & 2) == 0) continue;
    InfoPtr hints = makeHints(provider, false, (attempt & 4) == 0, hmem, true, atomics ? FI_ATOMIC : 0);
    if (!hints) {
      *why = "fi_allocinfo failed";
      return out;
    }
    fi_info* list = nullptr;
    rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &list);
    if (rc != 0) continue;
    InfoPtr owner(list);
    out = candidatesFrom(list, provider, wantHmem);
  }
  if (out.empty()) {
    *why = rc != 0 ? "fi_getinfo(" + (provider.empty() ? std::string("any provider") : provider) +
                         ", reliable endpoints with RMA reads and writes): " + fi_strerror(-rc)
                   : "no domain of " + (provider.empty() ? std::string("any provider") : provider);
  }
  return out;
}

std::vector<Candidate> candidatesFrom(const fi_info* list, const std::string& provider, bool wantHmem) {
  std::vector<Candidate> out;
  std::map<std::string, const fi_info*> best;  // domain name -> best info
  std::vector<std::string> order;
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    if (i->domain_attr == nullptr || i->domain_attr->name == nullptr || i->fabric_attr == nullptr ||
        i->fabric_attr->prov_name == nullptr) {
      continue;
    }
    if (!provider.empty() && provider != i->fabric_attr->prov_name) continue;
    // What the hints asked for, checked again: a reliable-datagram endpoint with tagged messages. (libfabric 2.x's
    // efa offers each device also as fabric efa-direct, without tagged messages: never taken.)
    if (i->ep_attr == nullptr || i->ep_attr->type != FI_EP_RDM || (i->caps & FI_TAGGED) == 0) continue;
    std::string key = std::string(i->fabric_attr->prov_name) + "/" + i->domain_attr->name;
    auto it = best.find(key);
    if (it == best.end()) {
      best[key] = i;
      order.push_back(key);
    } else if (addrPreference(i) < addrPreference(it->second)) {
      it->second = i;
    }
  }
  for (const auto& key : order) {
    const fi_info* i = best[key];
    if (addrPreference(i) == 3) continue;  // only link-local IPv6 on this domain
    Candidate c;
    c.info = dupInfo(i);
    DeviceProps& p = c.props;
    p.name = i->domain_attr->name;
    p.provider = i->fabric_attr->prov_name;
    p.fabric = i->fabric_attr->name ? i->fabric_attr->name : "";
    p.pciPath = pciPathOf(i);
    p.numaNode = topo::numaNodeOfNic(p.name, p.pciPath);
    p.speedMbps = speedMbpsOf(i);
    p.guid = fnv1a64(p.pciPath.empty() ? p.provider + "/" + p.name : p.pciPath);
    p.port = 0;
    p.latencyUs = 0.0f;
    p.maxComms = 65536;
    p.regIsGlobal = true;  // the registration cache makes sub-range registrations nearly free
    p.forceFlush = false;
    size_t maxMsg = i->ep_attr != nullptr ? i->ep_attr->max_msg_size : 0;
    p.maxP2pBytes = std::clamp<size_t>(maxMsg, 1, NCCL_MAX_NET_SIZE_BYTES);
    p.maxCollBytes = p.maxP2pBytes;
    p.ptrSupport = NCCL_PTR_HOST;
    // GPU buffers: the provider registers and moves device memory itself (FI_HMEM). WEFT_GDR=auto advertises
    // it when the provider offers it, 1 insists (a warning says when it cannot), 0 never.
    const std::string& gdr = params::getString("WEFT_GDR");
    // GPU memory needs the read-back flush: without RMA reads, host buffers only.
    const bool canRead = (i->caps & FI_RMA) != 0 && (i->caps & FI_READ) != 0;
    // A provider built with CUDA support offers FI_HMEM whether or not a driver is there (libfabric 2.1's shm
    // does on a machine without one): GPU memory is advertised only where libcuda.so.1 loads, as for verbs.
    if (wantHmem && (i->caps & FI_HMEM) != 0 && canRead && cuda::driverPresent()) {
      p.ptrSupport |= NCCL_PTR_CUDA;
    } else if (gdr == "1") {
      WEFT_WARN("WEFT_GDR=1 but {} on {} cannot register GPU memory ({}): host buffers only", p.provider, p.name,
                !cuda::compiledIn()            ? "built without CUDA"
                : (i->caps & FI_HMEM) == 0     ? "provider lacks FI_HMEM"
                : !cuda::driverPresent()       ? "no CUDA driver (libcuda.so.1) on this machine"
                                               : "provider offers no RMA read, which the flush after a GPU receive needs");
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<Candidate> filterInterfaces(std::vector<Candidate> in, const std::string& spec) {
  std::vector<Candidate> out;
  if (!spec.empty()) {
    for (auto& c : in) {
      if (matchInterface(c.props.name, spec)) out.push_back(std::move(c));
    }
    return out;
  }
  for (auto& c : in) {
    if (!isLoopbackOrBridge(c.props.name)) out.push_back(std::move(c));
  }
  if (out.empty()) {
    for (auto& c : in) {
      if (c.info) out.push_back(std::move(c));
    }
  }
  return out;
}

namespace {
// Whether local buffers must be registered. Before libfabric 2.0 a provider could say so by the FI_LOCAL_MR mode
// bit as well as by FI_MR_LOCAL; 2.0 deprecated the mode bit (its providers use mr_mode only).
bool needsLocalMr(const fi_info& info) {
  bool local = (info.domain_attr->mr_mode & FI_MR_LOCAL) != 0;
#if FI_MAJOR_VERSION < 2
  local = local || (info.mode & FI_LOCAL_MR) != 0;
#endif
  return local;
}
}  // namespace

FabricDevice::FabricDevice(int index, Candidate c)
    : index_(index),
      info_(std::move(c.info)),
      props_(std::move(c.props)),
      localMr_(needsLocalMr(*info_)),
      directedRecv_((info_->caps & FI_DIRECTED_RECV) != 0),
      injectSize_(info_->tx_attr != nullptr ? info_->tx_attr->inject_size : 0),
      injectSafe_(info_->domain_attr->data_progress == FI_PROGRESS_AUTO || props_.provider.rfind("verbs", 0) == 0),
      hardwarePlacement_(info_->domain_attr->data_progress == FI_PROGRESS_AUTO || props_.provider == "efa" ||
                         props_.provider.rfind("verbs", 0) == 0),
      maxMsgSize_(info_->ep_attr != nullptr ? info_->ep_attr->max_msg_size : 0),
      providerHash_(static_cast<uint32_t>(fnv1a64(props_.provider))),
      provKey_((info_->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0),
      virtAddr_((info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0),
      cache_(this) {
  // The rdma protocol needs RMA writes that carry remote completion data: 8 bytes say a receive slot and the
  // exact size; 4 bytes (EFA, verbs) the slot and a length of the form m * 2^e (see fabric_comm.h).
  // WEFT_CQ_DATA=4 uses the 4-byte form where 8 bytes are available too (to test that path on any provider).
  enomemIsFull_ = props_.provider == "shm" && FI_MAJOR(fi_version()) < 2;
  const size_t cqData = info_->domain_attr->cq_data_size;
  const bool rmaCapable = (info_->caps & FI_RMA) != 0 && cqData >= 4;
  compactImm_ = cqData < 8 || params::getString("WEFT_CQ_DATA") == "4";
  const std::string& want = params::getString("WEFT_PROTOCOL");
  // auto: rdma where the NIC places written data itself (zero-copy, no progress calls at the target). On
  // software providers (tcp, sockets, shm) an RMA write travels the same byte stream as a message and was
  // measured no faster: weft bench, tcp;ofi_rxm loopback, 1 MiB x 8 in flight 41 Gb/s rdma vs 47 sendrecv,
  // 64 MiB 15 vs 27 (bench/README.md).
  const std::string& prov = props_.provider;
  const bool hardware = prov == "efa" || prov.rfind("verbs", 0) == 0 || prov == "cxi" || prov == "opx" ||
                        prov == "psm3";
  rdma_ = rmaCapable && (want == "rdma" || (want == "auto" && hardware));
  if (want == "rdma" && !rmaCapable) {
    WEFT_WARN("WEFT_PROTOCOL=rdma, but provider {} on {} {}: using the sendrecv protocol", props_.provider,
              props_.name,
              (info_->caps & FI_RMA) == 0 ? "offers no RMA"
                                          : fmt::format("carries only {} bytes of remote completion data (4 needed)",
                                                        info_->domain_attr->cq_data_size));
  }
  if (rdma_ && compactImm_) {
    // The compact form describes a write in at most 8 pieces of up to 2^30 bytes; NCCL's own default limit for a
    // single network operation is 1 GiB, kept here.
    props_.maxP2pBytes = std::min<size_t>(props_.maxP2pBytes, size_t{1} << 30);
    props_.maxCollBytes = std::min<size_t>(props_.maxCollBytes, size_t{1} << 30);
  }
  const int64_t eager = params::getInt("WEFT_EAGER_MAX");
  eagerMax_ = eager < 0 ? kDefaultEagerMax : static_cast<size_t>(eager);
  link_ = sysfs::linkSourceFor(props_.name, static_cast<const sockaddr*>(info_->src_addr));
  efa_ = prov == "efa";
  canReadBack_ = (info_->caps & FI_RMA) != 0 && (info_->caps & FI_READ) != 0;
  flushHost_ = canReadBack_ && params::getString("WEFT_FLUSH") == "all";
}

bool FabricDevice::flushes() const {
  return canReadBack_ && ((props_.ptrSupport & NCCL_PTR_CUDA) != 0 || flushHost_);
}

void FabricDevice::noteDeviceWrites(bool device, const std::string& why) {
  int expect = -1;
  if (!deviceWrites_.compare_exchange_strong(expect, device ? 1 : 0, std::memory_order_relaxed)) return;
  WEFT_INFO(NCCL_INIT | NCCL_NET, "device {} ({}): {}: LL/LL128 receives {}", index_, props_.name, why,
            device ? "may complete as soon as the data is written" : "complete only once their data was placed");
}

FabricDevice::~FabricDevice() = default;

Status FabricDevice::open() {
  std::lock_guard<std::mutex> lock(openMutex_);
  if (opened_) return Status::kOk;
  fid_fabric* fabric = nullptr;
  int rc = fi_fabric(info_->fabric_attr, &fabric, nullptr);
  if (rc != 0) {
    WEFT_WARN("fi_fabric({} on {}) failed: {}", props_.provider, props_.name, fi_strerror(-rc));
    return Status::kSystem;
  }
  fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  rc = fi_domain(fabric_.get(), info_.get(), &domain, nullptr);
  if (rc != 0) {
    WEFT_WARN("fi_domain({} on {}) failed: {}", props_.provider, props_.name, fi_strerror(-rc));
    fabric_.reset();
    return Status::kSystem;
  }
  domain_.reset(domain);
  opened_ = true;
  // weft opens one endpoint per NCCL context and device (one per connection with WEFT_FABRIC_SHARED_EP=0).
  size_t epCnt = info_->domain_attr->ep_cnt;
  if (epCnt > 0 && epCnt < 1024 && !rmaOnly_) {
    WEFT_WARN("device {}: provider {} advertises at most {} endpoints per domain: enough for weft's shared "
              "endpoints (one per NCCL communicator and device), not for one per connection "
              "(WEFT_FABRIC_SHARED_EP=0){}",
              index_, props_.provider, epCnt,
              props_.provider == "sockets"
                  ? " (libfabric 1.17's sockets provider stops connecting after that many were ever opened, even "
                    "closed ones)"
                  : "");
  }
  if (props_.provider == "sockets" && !socketsBuffersFixed()) {
    // Seen here about once in 70-200 runs of 256 messages in flight on one connection (Linux 6.18, loopback): the
    // receiver's socket holds 2-14 bytes of a header in a buffer whose memory is full, the window stays shut,
    // both sides wait for good. weft's liveness probe then fails the peer as unreachable (WEFT_PEER_TIMEOUT).
    // weft's default FI_SOCKETS_MAX_BUF_SZ (params.cc) prevents it; only a user's smaller value brings it back.
    WEFT_WARN("device {}: provider sockets (deprecated upstream) with FI_SOCKETS_MAX_BUF_SZ={} can stall a "
              "connection for good under load: it peeks each message header, and a partly arrived header can hold "
              "an autotuned TCP receive buffer full with the window shut; the peer then fails as unreachable after "
              "WEFT_PEER_TIMEOUT. Leave FI_SOCKETS_MAX_BUF_SZ to weft (4 MiB), or prefer tcp;ofi_rxm",
              index_, params::foreign("FI_SOCKETS_MAX_BUF_SZ") ? params::foreign("FI_SOCKETS_MAX_BUF_SZ") : "");
  }
  WEFT_INFO(NCCL_INIT | NCCL_NET,
            "device {} ({}): domain {} open, protocol {}, eager up to {} B, mr_mode {:#x}, inject {} B{}, max msg {} "
            "B{}; link state from {}",
            index_, props_.provider, props_.name, rdma_ ? "rdma" : "sendrecv", rdma_ ? eagerMax_ : 0,
            info_->domain_attr->mr_mode, injectSize_, injectSafe_ ? "" : " (not used: software progress)", maxMsgSize_,
            directedRecv_ ? ", directed receives" : "", link_.describe);
  return Status::kOk;
}

const std::string& FabricDevice::shmNamePrefix() {
  static const std::string prefix = fmt::format("weft-{}-{}-", geteuid(), pidNamespace());
  return prefix;
}

std::string FabricDevice::nextShmName() {
  // One random part per process (a forked child keeps it, under its own process id).
  static const uint64_t salt = randomToken();
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}{}-{:016x}-{}", shmNamePrefix(), getpid(), salt,
                     counter.fetch_add(1, std::memory_order_relaxed));
}

int FabricDevice::sweepShmRegions(const std::string& dir) {
  const std::string& prefix = shmNamePrefix();
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (dirent* ent = readdir(d)) {
    const char* name = ent->d_name;
    if (std::strncmp(name, prefix.c_str(), prefix.size()) != 0) continue;
    char* end = nullptr;
    long pid = std::strtol(name + prefix.size(), &end, 10);
    if (end == name + prefix.size() || *end != '-' || pid <= 0 || pid == getpid()) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat st{};
    if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
      continue;
    }
    if (unlinkat(dirfd(d), name, 0) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

Status FabricDevice::nameEndpoint(fid_ep* ep, const char* who) {
  if (props_.provider != "shm") return Status::kOk;
  if (!shmSwept_.exchange(true)) {
    if (int n = sweepShmRegions(); n > 0) {
      WEFT_INFO(NCCL_INIT | NCCL_NET, "removed {} shm file(s) of weft processes of this user that died (/dev/shm/{}*)",
                n, shmNamePrefix());
    }
  }
  std::string name = nextShmName();
  // The provider copies the string (NUL included).
  int rc = fi_setname(&ep->fid, const_cast<char*>(name.c_str()), name.size() + 1);
  if (rc != 0) {
    WEFT_WARN("{}: naming the endpoint on {} ({}) failed: {}", who, props_.name, name, fi_strerror(-rc));
    return Status::kSystem;
  }
  return Status::kOk;
}

Status FabricDevice::registerInternal(void* buf, size_t len, const char* what, MrPtr* mr, void** desc) {
  *desc = nullptr;
  if (!localMr_) return Status::kOk;
  fid_mr* m = nullptr;
  int rc = fi_mr_reg(domain_.get(), buf, len, FI_SEND | FI_RECV | (canReadBack_ ? FI_READ : 0), 0, nextKey(), 0, &m,
                     nullptr);
  if (rc != 0) {
    WEFT_WARN("fi_mr_reg of the {} on {} failed: {}", what, props_.name, fi_strerror(-rc));
    return Status::kSystem;
  }
  mr->reset(m);
  *desc = fi_mr_desc(m);
  return Status::kOk;
}

Status FabricDevice::registerRange(uintptr_t base, size_t len, int type, int dmabufFd, uint64_t dmabufOffset,
                                   MrEntry* entry) {
  entry->backendMr = nullptr;
  entry->desc = nullptr;
  entry->key = 0;
  bool hostOnly = type == NCCL_PTR_HOST && dmabufFd < 0;
  // Host buffers need no registration where the provider asks for none, unless the peer writes into them (or
  // flushes read them back: WEFT_FLUSH=all).
  if (hostOnly && !localMr_ && !rdma_ && !flushHost_) return Status::kOk;
  const uint64_t access = FI_SEND | FI_RECV | (rdma_ ? FI_WRITE | FI_REMOTE_WRITE : 0) |
                          ((type == NCCL_PTR_CUDA || dmabufFd >= 0 || flushHost_) && canReadBack_ ? FI_REMOTE_READ : 0);
  fid_mr* mr = nullptr;
  if (Status st = registerAccess(base, len, type, dmabufFd, dmabufOffset, access, &mr); st != Status::kOk) return st;
  entry->backendMr = mr;
  entry->desc = fi_mr_desc(mr);
  entry->key = fi_mr_key(mr);
  return Status::kOk;
}

Status FabricDevice::registerAccess(uintptr_t base, size_t len, int type, int dmabufFd, uint64_t dmabufOffset,
                                    uint64_t access, fid_mr** out) {
  Status st = open();
  if (st != Status::kOk) return st;
  fi_mr_attr attr{};
  iovec iov{reinterpret_cast<void*>(base), len};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  attr.iface = FI_HMEM_SYSTEM;
  // Keys are ours to choose unless the provider assigns them; they must be unique within the domain.
  attr.requested_key = nextKey();
  uint64_t flags = 0;
  if (type == NCCL_PTR_CUDA) {
    if ((info_->caps & FI_HMEM) == 0) {
      WEFT_WARN("regMr: GPU buffer {:#x} ({} B) but provider {} has no FI_HMEM support", base, len, props_.provider);
      return Status::kInvalidUsage;
    }
    const char* why = nullptr;
    int dev = cuda::deviceOfPointer(reinterpret_cast<void*>(base), &why);
    if (dev < 0) {
      WEFT_WARN("regMr: cannot register GPU buffer {:#x}: {}", base, why);
      return Status::kInvalidUsage;
    }
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = dev;
  }
  if (dmabufFd >= 0) {
#ifdef FI_MR_DMABUF
    fi_mr_dmabuf dmabuf{};
    dmabuf.fd = dmabufFd;
    dmabuf.offset = dmabufOffset;
    dmabuf.len = len;
    dmabuf.base_addr = reinterpret_cast<void*>(base - dmabufOffset);
    attr.dmabuf = &dmabuf;
    flags |= FI_MR_DMABUF;
#else
    (void)dmabufOffset;
    WEFT_WARN("regMrDmaBuf: this weft was built against libfabric {}.{}, which has no DMA-BUF registration",
              FI_MAJOR_VERSION, FI_MINOR_VERSION);
    return Status::kInvalidUsage;
#endif
  }
  fid_mr* mr = nullptr;
  int rc = fi_mr_regattr(domain_.get(), &attr, flags, &mr);
  if (rc != 0) {
    WEFT_WARN("fi_mr_regattr({:#x}, {} B, {}) on {} failed: {}", base, len, type == NCCL_PTR_CUDA ? "cuda" : "host",
              props_.name, fi_strerror(-rc));
    return Status::kSystem;
  }
  *out = mr;
  return Status::kOk;
}

void FabricDevice::deregisterRange(MrEntry* entry) noexcept {
  if (entry->backendMr != nullptr) FidCloser<fid_mr>()(static_cast<fid_mr*>(entry->backendMr));
  entry->backendMr = nullptr;
  entry->desc = nullptr;
}

bool FabricDevice::resetsPeers() const {
  const std::string& mode = params::getString("WEFT_RAIL_FAILOVER_RMA");
  if (mode == "off" || props_.provider.find("ofi_rxm") == std::string::npos) return false;
  // rxm over tcp (libfabric 1.17): closing a connection while an RMA write with completion data is half received
  // reports its error with no operation context (prov/tcp/src/tcpx_ep.c, tcpx_ep_flush_all_queues: cur_rx), which
  // rxm's error handler dereferences (prov/rxm/src/rxm_cq.c, rxm_handle_comp_error): the process crashes. Seen in
  // the flap soak, 2 runs in 5. Only on request (tests).
  if (streamSockets() && mode != "on") return false;
  const char* v = params::foreign("FI_AV_REMOVE_CLEANUP");
  bool on = false;
  std::string error;
  return v != nullptr && params::parseBool(v, &on, &error) && on;
}

}  // namespace weft::fabric
