// SPDX-License-Identifier: Apache-2.0
// One NCCL device of the verbs backend: an active port of an HCA (InfiniBand, or Ethernet = RoCE), with its own
// device context, protection domain and registration cache.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "verbs/ibv_api.h"
#include "verbs/verbs_util.h"
#include "weft/transport/mr_cache.h"
#include "weft/transport/net.h"

namespace weft::verbs {

class VerbsDevice final : public Registrar {
 public:
  // Every active InfiniBand/RoCE port WEFT_IB_HCA selects. Empty with `why` when there is none.
  static std::vector<std::unique_ptr<VerbsDevice>> discover(std::string* why);
  ~VerbsDevice() override;

  const DeviceProps& props() const { return props_; }
  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  bool roce() const { return roce_; }
  int gidIndex() const { return gidIndex_; }
  const ibv_gid& gid() const { return gid_; }
  uint16_t lid() const { return lid_; }
  ibv_mtu activeMtu() const { return mtu_; }
  int maxQpWr() const { return maxQpWr_; }
  int maxCqe() const { return maxCqe_; }
  // Where this device's connection handshakes listen (an address of the port's own network interface).
  const sockaddr_storage& handshakeAddr() const { return addr_; }
  socklen_t handshakeAddrLen() const { return addrLen_; }
  MrCache& mrCache() { return *cache_; }

  // Registrar: ibv_reg_mr (or ibv_reg_dmabuf_mr) with local and remote write access, relaxed ordering where
  // rdma-core can ask for it.
  Status registerRange(uintptr_t base, size_t len, int type, int dmabufFd, uint64_t dmabufOffset,
                       MrEntry* entry) override;
  void deregisterRange(MrEntry* entry) noexcept override;
  // A window of the device API (verbs/verbs_rma.h): remote read, write and atomic access, through DMA-BUF where
  // dmabufFd >= 0. The caller owns *out (ibv().deregMr).
  Status registerRma(uintptr_t base, size_t len, int type, int dmabufFd, ibv_mr** out);
  // The device performs RDMA atomics (fetch-and-add) on remote memory.
  bool atomics() const { return atomics_; }

  // Reads pending asynchronous events without blocking (port down/up, fatal device error, QP errors) and turns
  // them into state the comms see. Cheap when nothing is pending; never blocks if another thread is reading.
  void pollAsync() noexcept;
  // Whether the port can carry traffic: false after IBV_EVENT_PORT_ERR (until PORT_ACTIVE) or a fatal device error.
  bool usable() const {
    return !fatal_.load(std::memory_order_relaxed) && !portDown_.load(std::memory_order_relaxed);
  }
  std::string stateReason() const;

 private:
  VerbsDevice() : cache_(std::make_unique<MrCache>(this)) {}
  bool open(ibv_device* dev, const std::string& name, int port, std::string* why);
  // The steps of open().
  bool openPort(ibv_device* dev, int port, ibv_port_attr* portAttr, std::string* why);
  bool pickGid(const std::string& sys, const ibv_port_attr& pa, std::string* why);
  bool allocate(std::string* why);
  bool findHandshakeAddress(const std::string& name, const std::string& sys, std::string* why);
  void fillProps(const std::string& name, int port, const ibv_port_attr& pa);
  void advertiseGpuMemory();
  Status registerAccess(uintptr_t base, size_t len, int type, int dmabufFd, uint64_t dmabufOffset, int access,
                        ibv_mr** out);

  DeviceProps props_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  bool roce_ = false;
  int gidIndex_ = 0;
  ibv_gid gid_{};
  uint16_t lid_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
  int maxQpWr_ = 0;
  int maxCqe_ = 0;
  bool relaxedOrdering_ = false;
  bool atomics_ = false;
  sockaddr_storage addr_{};
  socklen_t addrLen_ = 0;
  std::unique_ptr<MrCache> cache_;  // reset first in the destructor: it deregisters through the PD
  std::mutex asyncMutex_;
  std::atomic<bool> fatal_{false};
  std::atomic<bool> portDown_{false};
};

// The far end of a reliable-connected QP, as the handshake or the ring carried it.
struct RcPeer {
  uint32_t qpn = 0, psn = 0;
  uint16_t lid = 0;
  bool roce = false;
  uint8_t mtu = 0;  // ibv_mtu
  uint8_t gid[16] = {};
};
struct QpOwner;
// An RC QP on dev's PD, both sides on `cq`, one SGE a request, moved to INIT with `access` (remote access flags);
// max_inline_data `inlineData` where the device takes it, else none (*inlineGot: what it took). nullptr with *why.
ibv_qp* createRcQp(const VerbsDevice& dev, ibv_cq* cq, QpOwner* owner, int sendWr, int recvWr, uint32_t inlineData,
                   int access, uint32_t* inlineGot, std::string* why);
// Moves an RC QP in INIT to RTR and RTS towards `peer` (WEFT_IB_TIMEOUT, WEFT_IB_RETRY_CNT, WEFT_IB_SL; RNR retries
// without end: receives are always posted), with `rdAtomic` reads and atomics in flight each way; false with *why.
bool connectRcQp(const VerbsDevice& dev, ibv_qp* qp, const RcPeer& peer, uint32_t myPsn, int trafficClass,
                 int rdAtomic, std::string* why);

// Set by pollAsync when an asynchronous QP error names a QP whose qp_context is one of these.
struct QpOwner {
  std::atomic<int> asyncError{0};  // the ibv_event_type, 0: none
};

}  // namespace weft::verbs
