// SPDX-License-Identifier: Apache-2.0
#include "verbs/verbs_device.h"

#include "weft/nccl/net.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "weft/common/cuda_shim.h"
#include "weft/common/netif.h"
#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/common/sysfs.h"
#include "weft/common/topology.h"

namespace weft::verbs {
namespace {

using sysfs::readLine;
using sysfs::realPath;

// Addresses of a network interface, IPv4 first.
bool interfaceAddress(const std::string& ifname, sockaddr_storage* out, socklen_t* len) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (int family : {AF_INET, AF_INET6}) {
    for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != family || ifname != i->ifa_name) continue;
      if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr))
        continue;
      *len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      std::memcpy(out, i->ifa_addr, *len);
      found = true;
    }
  }
  freeifaddrs(list);
  return found;
}

// The first interface (not loopback unless nothing else) that WEFT_IFACE allows, with an IPv4 address.
bool anyInterfaceAddress(sockaddr_storage* out, socklen_t* len) {
  const std::string& spec = params::getString("WEFT_IFACE");
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (bool loopbackToo : {false, true}) {
    for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      if (!loopbackToo && (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
      if (!spec.empty() && !matchInterface(i->ifa_name, spec)) continue;
      *len = sizeof(sockaddr_in);
      std::memcpy(out, i->ifa_addr, *len);
      found = true;
    }
  }
  freeifaddrs(list);
  return found;
}

bool gdrKernelSupport() {
  return access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
         access("/sys/module/nvidia_peermem/version", F_OK) == 0 || access("/sys/module/nv_peer_mem", F_OK) == 0;
}

}  // namespace

std::vector<std::unique_ptr<VerbsDevice>> VerbsDevice::discover(std::string* why) {
  std::vector<std::unique_ptr<VerbsDevice>> out;
  params::applyForeignDefaults();  // RDMAV_FORK_SAFE before the first device is opened
  const IbvApi& api = ibv();
  if (!api.loaded) {
    *why = api.error;
    return out;
  }
  HcaSpec spec;
  std::string err;
  if (!parseHcaSpec(params::getString("WEFT_IB_HCA"), &spec, &err)) {
    *why = "WEFT_IB_HCA='" + params::getString("WEFT_IB_HCA") + "': " + err;
    return out;
  }
  int n = 0;
  ibv_device** list = api.getDeviceList(&n);
  if (list == nullptr || n == 0) {
    if (list) api.freeDeviceList(list);
    *why = "no RDMA device (ibv_get_device_list found none)";
    return out;
  }
  std::string reasons;
  for (int d = 0; d < n; ++d) {
    ibv_device* dev = list[d];
    std::string name = api.getDeviceName(dev);
    // EFA and other non-IB-transport devices are libfabric's: RC QPs and RDMA writes are InfiniBand semantics.
    if (dev->node_type != IBV_NODE_CA || dev->transport_type != IBV_TRANSPORT_IB) {
      reasons += (reasons.empty() ? "" : "; ") + name + ": not an InfiniBand/RoCE channel adapter";
      continue;
    }
    ibv_context* probe = api.openDevice(dev);
    if (probe == nullptr) {
      reasons += (reasons.empty() ? "" : "; ") + name + ": ibv_open_device failed: " + std::strerror(errno);
      continue;
    }
    ibv_device_attr da{};
    int ports = api.queryDevice(probe, &da) == 0 ? da.phys_port_cnt : 0;
    api.closeDevice(probe);
    for (int p = 1; p <= ports; ++p) {
      if (!hcaSelected(spec, name, p)) continue;
      auto v = std::unique_ptr<VerbsDevice>(new VerbsDevice());
      std::string w;
      if (v->open(dev, name, p, &w)) {
        if (const HcaSpec::Item* it = hcaItem(spec, name, p)) {
          v->props_.railId = it->rail;
          v->props_.planeId = it->plane;
        }
        out.push_back(std::move(v));
      } else {
        reasons += (reasons.empty() ? "" : "; ") + name + ":" + std::to_string(p) + ": " + w;
      }
    }
  }
  api.freeDeviceList(list);
  if (out.empty())
    *why = "no active InfiniBand/RoCE port" + std::string(spec.items.empty() ? "" : " selected by WEFT_IB_HCA") +
           (reasons.empty() ? "" : " (" + reasons + ")");
  return out;
}

bool VerbsDevice::open(ibv_device* dev, const std::string& name, int port, std::string* why) {
  ibv_port_attr pa{};
  const std::string sys = "/sys/class/infiniband/" + name + "/ports/" + std::to_string(port);
  if (!openPort(dev, port, &pa, why) || !pickGid(sys, pa, why) || !allocate(why) ||
      !findHandshakeAddress(name, sys, why))
    return false;
  fillProps(name, port, pa);
  advertiseGpuMemory();
  return true;
}

// The device context and the port: active, InfiniBand or Ethernet (RoCE); its limits.
bool VerbsDevice::openPort(ibv_device* dev, int port, ibv_port_attr* portAttr, std::string* why) {
  const IbvApi& api = ibv();
  ctx_ = api.openDevice(dev);
  if (ctx_ == nullptr) {
    *why = std::string("ibv_open_device failed: ") + std::strerror(errno);
    return false;
  }
  port_ = static_cast<uint8_t>(port);
  ibv_device_attr da{};
  if (api.queryDevice(ctx_, &da) != 0) {
    *why = "ibv_query_device failed";
    return false;
  }
  ibv_port_attr& pa = *portAttr;
  if (api.queryPort(ctx_, port_, &pa) != 0) {
    *why = "ibv_query_port failed";
    return false;
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    *why = "port not active";
    return false;
  }
  atomics_ = da.atomic_cap != IBV_ATOMIC_NONE;
  roce_ = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (!roce_ && pa.link_layer != IBV_LINK_LAYER_INFINIBAND && pa.link_layer != IBV_LINK_LAYER_UNSPECIFIED) {
    *why = "link layer is neither InfiniBand nor Ethernet";
    return false;
  }
  lid_ = pa.lid;
  mtu_ = pa.active_mtu;
  maxQpWr_ = da.max_qp_wr;
  maxCqe_ = da.max_cqe;
  return true;
}

// The GID the port's traffic uses: WEFT_IB_GID_INDEX, or (RoCE) the best of the table (chooseGid).
bool VerbsDevice::pickGid(const std::string& sys, const ibv_port_attr& pa, std::string* why) {
  const IbvApi& api = ibv();
  const int forced = static_cast<int>(params::getInt("WEFT_IB_GID_INDEX"));
  if (roce_) {
    std::vector<GidEntry> table;
    for (int i = 0; i < pa.gid_tbl_len && i < 1024; ++i) {
      GidEntry e;
      e.index = i;
      ibv_gid g{};
      if (api.queryGid(ctx_, port_, i, &g) != 0) continue;
      std::memcpy(e.gid, g.raw, 16);
      if (gidIsZero(e.gid)) continue;
      e.type = readLine(sys + "/gid_attrs/types/" + std::to_string(i));
      table.push_back(e);
    }
    gidIndex_ = chooseGid(table, forced);
    if (gidIndex_ < 0) {
      *why = forced >= 0 ? "WEFT_IB_GID_INDEX=" + std::to_string(forced) + " is not a valid GID of this port"
                         : "no usable RoCE GID (is an IP address configured on the port's interface?)";
      return false;
    }
  } else {
    gidIndex_ = forced >= 0 ? forced : 0;
  }
  if (api.queryGid(ctx_, port_, gidIndex_, &gid_) != 0) {
    *why = "ibv_query_gid failed";
    return false;
  }
  return true;
}

// The protection domain, and the asynchronous event channel made non-blocking.
bool VerbsDevice::allocate(std::string* why) {
  const IbvApi& api = ibv();
  pd_ = api.allocPd(ctx_);
  if (pd_ == nullptr) {
    *why = std::string("ibv_alloc_pd failed: ") + std::strerror(errno);
    return false;
  }
  // Asynchronous events are read without blocking from the data path's stall checks.
  int fl = fcntl(ctx_->async_fd, F_GETFL);
  if (fl < 0 || fcntl(ctx_->async_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
    *why = "cannot make the asynchronous event channel non-blocking";
    return false;
  }
  return true;
}

// The TCP address the connection handshake runs on: the RoCE GID's IPv4 address, else the port's interface.
bool VerbsDevice::findHandshakeAddress(const std::string& name, const std::string& sys, std::string* why) {
  // The connection handshake runs over TCP on the port's own interface where there is one.
  if (roce_ && gidIsIpv4Mapped(gid_.raw)) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&addr_);
    sin->sin_family = AF_INET;
    std::memcpy(&sin->sin_addr, gid_.raw + 12, 4);
    addrLen_ = sizeof(sockaddr_in);
  } else {
    std::string ndev = readLine(sys + "/gid_attrs/ndevs/" + std::to_string(gidIndex_));
    if (ndev.empty()) ndev = readLine("/sys/class/infiniband/" + name + "/parent");  // rxe, siw
    if (ndev.empty()) {
      if (DIR* dir = opendir(("/sys/class/infiniband/" + name + "/device/net").c_str())) {
        while (dirent* e = readdir(dir)) {
          if (e->d_name[0] != '.') {
            ndev = e->d_name;
            break;
          }
        }
        closedir(dir);
      }
    }
    if ((ndev.empty() || !interfaceAddress(ndev, &addr_, &addrLen_)) && !anyInterfaceAddress(&addr_, &addrLen_)) {
      *why = "no IP interface to run the connection handshake on";
      return false;
    }
  }
  // The handshake address must be this network namespace's (an RDMA device can be visible from others).
  if (int fd = bindTcpSocket(addr_, addrLen_, SOCK_CLOEXEC); fd >= 0) {
    ::close(fd);
  } else {
    *why = "its address " + sockaddrString(reinterpret_cast<const sockaddr*>(&addr_), false) +
           " cannot be bound here (" + std::strerror(errno) + "; another network namespace's device?)";
    return false;
  }
  return true;
}

void VerbsDevice::fillProps(const std::string& name, int port, const ibv_port_attr& pa) {
  const IbvApi& api = ibv();
  relaxedOrdering_ = api.regMrIova2 != nullptr;
  props_.name = name + ":" + std::to_string(port);
  props_.pciPath = topo::nicPciPath(name, true);
  props_.numaNode = topo::numaNodeOfNic(name, props_.pciPath);
  props_.provider = roce_ ? "verbs (RoCE)" : "verbs (InfiniBand)";
  props_.fabric = roce_ ? "roce" : "ib";
  props_.guid = api.getDeviceGuid(ctx_->device);
  props_.port = port;
  int speed = portSpeedMbps(pa.active_speed, pa.active_width);
  props_.speedMbps = speed > 0 ? speed : 10000;
  props_.latencyUs = 0;
  props_.maxComms = 65536;
  props_.maxRecvs = static_cast<int>(params::getInt("WEFT_MAX_RECVS"));
  props_.regIsGlobal = true;
  props_.forceFlush = false;
  props_.maxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
  props_.maxCollBytes = NCCL_MAX_NET_SIZE_BYTES;
  props_.ptrSupport = NCCL_PTR_HOST;
}

// NCCL_PTR_CUDA (and NCCL_PTR_DMABUF) as WEFT_GDR and the host allow.
void VerbsDevice::advertiseGpuMemory() {
  const IbvApi& api = ibv();
  const std::string& gdr = params::getString("WEFT_GDR");
  if (cuda::compiledIn() && gdr != "0" && cuda::driverPresent()) {
    // GPU memory through nvidia-peermem, or through DMA-BUF where the kernel and device take it (the probe NCCL
    // uses: a registration of fd -1 fails with EOPNOTSUPP/EPROTONOSUPPORT only when DMA-BUF is unsupported).
    if (gdrKernelSupport()) props_.ptrSupport |= NCCL_PTR_CUDA;
    if (api.regDmabufMr != nullptr) {
      errno = 0;
      ibv_mr* probe = api.regDmabufMr(pd_, 0, 0, 0, -1, 0);
      if (probe != nullptr) api.deregMr(probe);
      if (errno != EOPNOTSUPP && errno != EPROTONOSUPPORT) props_.ptrSupport |= NCCL_PTR_DMABUF | NCCL_PTR_CUDA;
    }
  }
  if (gdr == "1" && (props_.ptrSupport & NCCL_PTR_CUDA) == 0) {
    if (cuda::compiledIn() && cuda::driverPresent()) {
      // The user says GPU memory can be pinned (a peer-memory module weft does not see: a container without
      // /sys/module, another vendor's module). Registrations then go through ibv_reg_mr and fail, each with a
      // warning, where nothing pins GPU pages.
      props_.ptrSupport |= NCCL_PTR_CUDA;
      WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft: {}: WEFT_GDR=1: GPU memory advertised without nvidia-peermem or "
                "DMA-BUF detected; GPU registrations go through ibv_reg_mr", props_.name);
    } else {
      WEFT_WARN("WEFT_GDR=1 but {} cannot register GPU memory ({}): host buffers only", props_.name,
                cuda::compiledIn() ? "no CUDA driver (libcuda.so.1)" : "built without CUDA");
    }
  }
}

VerbsDevice::~VerbsDevice() {
  cache_.reset();  // deregisters through the PD
  const IbvApi& api = ibv();
  if (pd_) api.deallocPd(pd_);
  if (ctx_) api.closeDevice(ctx_);
}

Status VerbsDevice::registerRange(uintptr_t base, size_t len, int type, int dmabufFd, uint64_t dmabufOffset,
                                  MrEntry* entry) {
  ibv_mr* mr = nullptr;
  if (Status st = registerAccess(base, len, type, dmabufFd, dmabufOffset,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, &mr);
      st != Status::kOk) {
    return st;
  }
  entry->backendMr = mr;
  entry->key = mr->rkey;
  entry->desc = nullptr;
  return Status::kOk;
}

Status VerbsDevice::registerRma(uintptr_t base, size_t len, int type, int dmabufFd, ibv_mr** out) {
  return registerAccess(base, len, type, dmabufFd, 0,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                            (atomics_ ? IBV_ACCESS_REMOTE_ATOMIC : 0),
                        out);
}

Status VerbsDevice::registerAccess(uintptr_t base, size_t len, int type, int dmabufFd, uint64_t dmabufOffset,
                                   int access, ibv_mr** out) {
  const IbvApi& api = ibv();
  ibv_mr* mr = nullptr;
  if (dmabufFd >= 0) {
    if (api.regDmabufMr == nullptr) {
      WEFT_WARN("DMA-BUF registration on {}: this rdma-core lacks ibv_reg_dmabuf_mr", props_.name);
      return Status::kInvalidUsage;
    }
    mr = api.regDmabufMr(pd_, dmabufOffset, len, base, dmabufFd,
                         access | (relaxedOrdering_ ? IBV_ACCESS_RELAXED_ORDERING : 0));
  } else if (relaxedOrdering_) {
    // An optional access flag: devices that cannot order relaxed ignore it.
    mr = api.regMrIova2(pd_, reinterpret_cast<void*>(base), len, base, access | IBV_ACCESS_RELAXED_ORDERING);
  } else {
    mr = api.regMr(pd_, reinterpret_cast<void*>(base), len, access);
  }
  if (mr == nullptr) {
    int e = errno;
    WEFT_WARN("registering {} B of {} memory at {:#x} on {} failed: {}{}", len, type == NCCL_PTR_CUDA ? "GPU" : "host",
              base, props_.name, std::strerror(e),
              e == ENOMEM ? " (locked-memory limit? raise `ulimit -l`)" : "");
    return Status::kSystem;
  }
  *out = mr;
  return Status::kOk;
}

void VerbsDevice::deregisterRange(MrEntry* entry) noexcept {
  if (entry->backendMr != nullptr) ibv().deregMr(static_cast<ibv_mr*>(entry->backendMr));
  entry->backendMr = nullptr;
}

void VerbsDevice::pollAsync() noexcept {
  std::unique_lock<std::mutex> lock(asyncMutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const IbvApi& api = ibv();
  ibv_async_event ev;
  while (api.getAsyncEvent(ctx_, &ev) == 0) {
    switch (ev.event_type) {
      case IBV_EVENT_PORT_ERR:
        if (ev.element.port_num == port_) {
          portDown_.store(true, std::memory_order_relaxed);
          WEFT_WARN("{}: port went down (IBV_EVENT_PORT_ERR): its connections fail", props_.name);
        }
        break;
      case IBV_EVENT_PORT_ACTIVE:
        if (ev.element.port_num == port_) {
          portDown_.store(false, std::memory_order_relaxed);
          WEFT_INFO(NCCL_NET, "{}: port active again", props_.name);
        }
        break;
      case IBV_EVENT_DEVICE_FATAL:
        fatal_.store(true, std::memory_order_relaxed);
        WEFT_WARN("{}: fatal device error (IBV_EVENT_DEVICE_FATAL): every connection on it fails", props_.name);
        break;
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_PATH_MIG_ERR:
        // The owner is alive: ibv_destroy_qp waits until this event is acknowledged below.
        if (ev.element.qp != nullptr && ev.element.qp->qp_context != nullptr)
          static_cast<QpOwner*>(ev.element.qp->qp_context)->asyncError.store(ev.event_type, std::memory_order_relaxed);
        WEFT_WARN("{}: {} on QP {:#x}", props_.name, api.eventTypeStr(ev.event_type),
                  ev.element.qp ? ev.element.qp->qp_num : 0);
        break;
      default:
        WEFT_INFO(NCCL_NET, "{}: asynchronous event {}", props_.name, api.eventTypeStr(ev.event_type));
        break;
    }
    api.ackAsyncEvent(&ev);
  }
}

std::string VerbsDevice::stateReason() const {
  if (fatal_.load()) return "a fatal device error";
  if (portDown_.load()) return "the port is down";
  return "ok";
}

ibv_qp* createRcQp(const VerbsDevice& dev, ibv_cq* cq, QpOwner* owner, int sendWr, int recvWr, uint32_t inlineData,
                   int access, uint32_t* inlineGot, std::string* why) {
  const IbvApi& api = ibv();
  ibv_qp_init_attr ia{};
  ia.qp_context = owner;
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = 0;
  ia.cap.max_send_wr = static_cast<uint32_t>(std::min(sendWr, dev.maxQpWr()));
  ia.cap.max_recv_wr = static_cast<uint32_t>(std::min(recvWr, dev.maxQpWr()));
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = inlineData;
  ibv_qp* qp = api.createQp(dev.pd(), &ia);
  if (qp == nullptr && inlineData > 0) {  // some devices take no inline data
    ia.cap.max_inline_data = 0;
    qp = api.createQp(dev.pd(), &ia);
  }
  if (qp == nullptr) {
    *why = std::string("ibv_create_qp failed: ") + std::strerror(errno);
    return nullptr;
  }
  if (inlineGot != nullptr) *inlineGot = ia.cap.max_inline_data;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = dev.port();
  a.qp_access_flags = static_cast<unsigned>(access);
  if (int rc = api.modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    *why = std::string("QP to INIT failed: ") + std::strerror(rc);
    api.destroyQp(qp);
    return nullptr;
  }
  return qp;
}

bool connectRcQp(const VerbsDevice& dev, ibv_qp* qp, const RcPeer& peer, uint32_t myPsn, int trafficClass,
                 int rdAtomic, std::string* why) {
  const IbvApi& api = ibv();
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(dev.activeMtu(), peer.mtu));
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = static_cast<uint8_t>(rdAtomic);
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = dev.port();
  a.ah_attr.sl = static_cast<uint8_t>(params::getInt("WEFT_IB_SL"));
  a.ah_attr.dlid = peer.lid;
  if (dev.roce() || peer.roce) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev.gidIndex());
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.grh.traffic_class = static_cast<uint8_t>(trafficClass < 0 ? 0 : trafficClass);
    a.ah_attr.grh.flow_label = 0;
  }
  if (int rc = api.modifyQp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    *why = std::string("QP to RTR failed: ") + std::strerror(rc);
    return false;
  }
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_RTS;
  s.sq_psn = myPsn;
  s.timeout = static_cast<uint8_t>(params::getInt("WEFT_IB_TIMEOUT"));
  s.retry_cnt = static_cast<uint8_t>(params::getInt("WEFT_IB_RETRY_CNT"));
  s.rnr_retry = 7;  // the receiver always has receives posted; 7 = wait for it however long
  s.max_rd_atomic = static_cast<uint8_t>(rdAtomic);
  if (int rc = api.modifyQp(qp, &s,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                IBV_QP_MAX_QP_RD_ATOMIC)) {
    *why = std::string("QP to RTS failed: ") + std::strerror(rc);
    return false;
  }
  return true;
}

}  // namespace weft::verbs
