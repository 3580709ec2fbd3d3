// SPDX-License-Identifier: Apache-2.0
// One NCCL device = one libfabric provider domain (a NIC, an interface for tcp, the host for shm).
// Fabric and domain open lazily on first use and live for the rest of the process; all comms of the device
// share them and its registration cache.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/fabric_raii.h"
#include "weft/common/sysfs.h"
#include "weft/transport/mr_cache.h"
#include "weft/transport/net.h"

namespace weft::fabric {

struct Candidate {  // one usable (provider, domain) pair found by discovery
  InfoPtr info;
  DeviceProps props;
};

// Preference order when WEFT_PROVIDER is empty.
const std::vector<std::string>& defaultProviders();

// fi_getinfo for reliable, tagged endpoints of `provider` (empty: every provider), one entry per domain, IPv4
// preferred over IPv6. Never throws; on failure returns nothing and says why.
std::vector<Candidate> probe(const std::string& provider, std::string* why);
// The same for the device API's RMA (fabric/fabric_rma.h): RMA reads and writes required; atomics, GPU memory and
// manual progress preferred.
std::vector<Candidate> probeRma(const std::string& provider, std::string* why);
// The candidates in a list fi_getinfo returned (or one recorded from a host): reliable-datagram tagged endpoints of
// `provider`, one per domain, IPv4 before IPv6, link-local-only domains left out; GPU memory advertised where
// `wantHmem`, the provider offers FI_HMEM and RMA reads, and a CUDA driver is present.
std::vector<Candidate> candidatesFrom(const fi_info* list, const std::string& provider, bool wantHmem);

// WEFT_IFACE filtering: comma-separated prefixes, '^' excludes, '=' exact. Empty spec: everything except
// loopback/container bridges, unless that leaves nothing.
std::vector<Candidate> filterInterfaces(std::vector<Candidate> in, const std::string& spec);

class FabricDevice final : public Registrar {
 public:
  FabricDevice(int index, Candidate c);
  ~FabricDevice() override;

  const DeviceProps& props() const { return props_; }
  const fi_info* info() const { return info_.get(); }
  int index() const { return index_; }
  // Whether the provider carries messages over TCP streams (tcp, tcp;ofi_rxm, sockets): a send it reports done
  // may still be in its own buffer or the socket's, lost if the endpoint closes (or resets the connection) then.
  // Others complete a send once it reached the peer (shm: its memory; efa, verbs: the NIC's acknowledgment).
  bool streamSockets() const {
    const std::string& p = props_.provider;
    return p.rfind("tcp", 0) == 0 || p.rfind("sockets", 0) == 0;
  }

  // Whether Endpoint::resetPeer can close this provider's connection to a peer, so that nothing it still holds lands
  // later: rxm (tcp;ofi_rxm, verbs;ofi_rxm) with FI_AV_REMOVE_CLEANUP on (weft's default). Rail failover with the
  // rdma protocol needs it (docs/failover.md, "RMA failover").
  bool resetsPeers() const;

  // A device of the device API's RMA transport (fabric/fabric_rma.h): one endpoint per comm, so the net table's
  // warnings about endpoints per connection do not apply. Before open().
  void markRma() { rmaOnly_ = true; }
  // Opens fabric + domain once; safe to call from several threads.
  Status open();
  fid_domain* domain() const { return domain_.get(); }
  MrCache& mrCache() { return cache_; }

  bool localMr() const { return localMr_; }          // FI_MR_LOCAL: every buffer needs a descriptor
  bool directedRecv() const { return directedRecv_; } // receives can be restricted to the connected peer
  // Whether a send of `size` bytes may use fi_tinject, which completes it at once with no completion entry. Only
  // where the provider transmits without later progress calls: automatic progress, or verbs (rxm hands an inject
  // straight to the QP as an inline send the NIC transmits). Elsewhere the bytes can sit in a software queue until
  // this comm is progressed again, which NCCL need never do once the send reported done: tcp and sockets with
  // manual progress, and efa (its RDM protocol queues a send it cannot post yet, before the peer handshake or when
  // the device queue is full, and moves it only from a completion-queue read). Zero-byte sends included: sockets
  // left an injected 0 B message to self queued forever (found by faults.sender_killed).
  bool canInject(size_t size) const { return injectSafe_ && size <= injectSize_; }
  // Data lands in our buffers without progress calls of ours (NIC hardware RMA or automatic progress). On EFA
  // only once an endpoint said the device performs RDMA writes itself (noteDeviceWrites).
  bool hardwarePlacement() const {
    return hardwarePlacement_ && (!efa_ || deviceWrites_.load(std::memory_order_relaxed) == 1);
  }
  // The read-back flush (FabricRecvComm::iflush): RMA reads from our own registrations are possible; and
  // whether host buffers are flushed too (WEFT_FLUSH=all, for tests).
  bool canReadBack() const { return canReadBack_; }
  bool flushHost() const { return flushHost_; }
  bool flushes() const;
  // EFA: what the first endpoint learnt about RDMA writes (logged once; later endpoints of the device agree).
  void noteDeviceWrites(bool device, const std::string& why);
  size_t maxMsgSize() const { return maxMsgSize_; }
  size_t injectSize() const { return injectSize_; }  // the provider's (whatever its progress model)
  // Where this NIC's link state is read (a network interface's operstate, or an RDMA device's port state).
  const sysfs::LinkSource& linkSource() const { return link_; }
  uint32_t providerHash() const { return providerHash_; }

  // Transfer protocol (WEFT_PROTOCOL): true = rdma (receiver offers buffers, sender RMA-writes with remote CQ
  // data), false = sendrecv (tagged messages only). Messages up to eagerMax() go as tagged sends either way.
  bool rdma() const { return rdma_; }
  // shm before libfabric 2.0 answers a full receive queue with -FI_ENOMEM (see FabricComm's receive posting).
  bool enomemIsFull() const { return enomemIsFull_; }
  size_t eagerMax() const { return eagerMax_; }
  // rdma with 4 bytes of remote completion data (the provider's limit, or WEFT_CQ_DATA=4).
  bool compactImm() const { return compactImm_; }
  // Remote address of `addr` inside registration `mh` as the peer must name it (FI_MR_VIRT_ADDR or offset).
  uint64_t remoteAddr(uintptr_t addr, uintptr_t regBase) const { return virtAddr_ ? addr : addr - regBase; }
  static constexpr size_t kDefaultEagerMax = 16384;
  // A key for a registration of ours where the provider does not assign them (unique within the domain).
  uint64_t nextKey() { return provKey_ ? 0 : nextKey_.fetch_add(1, std::memory_order_relaxed); }

  // Whether the provider reports an RMA write's length at the target (Endpoint::writeLenReported measures it once
  // per device): -1 not measured yet, 0 no, 1 yes.
  int writeLen() const { return writeLen_.load(std::memory_order_acquire); }
  void setWriteLen(int v) { writeLen_.store(v, std::memory_order_release); }
  std::mutex& measureMutex() { return measureMutex_; }

  // Gives a new endpoint of this device, before fi_enable, the name its provider's local address is made of, where
  // weft chooses it: shm only. shm keeps an endpoint's queues in a file of /dev/shm named by default after the process
  // id and a per-process counter; a file left by a process that was killed keeps that name, and a later process with
  // the same id (ids are reused; in a container every job starts near 1) is refused its endpoint (-FI_EBUSY: the
  // provider sees the id alive, its own) or, across PID namespaces that share /dev/shm, two live jobs take one file.
  // weft's names add the PID namespace and 64 random bits: "weft-<uid>-<pid namespace>-<pid>-<random>-<n>". The first
  // shm endpoint of a device (once per process and NIC in a job) also removes the files of weft processes of this user and PID namespace that died
  // (sweepShmRegions). Elsewhere nothing to do.
  Status nameEndpoint(fid_ep* ep, const char* who);
  // The name nameEndpoint gives the next shm endpoint of this process, and the part every name of this user and PID
  // namespace starts with.
  static std::string nextShmName();
  static const std::string& shmNamePrefix();
  // Removes from `dir` the files named by shmNamePrefix() whose process is gone (no such process id in this namespace)
  // and that this user owns: what a killed process left (16 MiB each on 2.1). A live process, or one whose id was
  // reused, keeps its file. Returns how many went.
  static int sweepShmRegions(const std::string& dir = "/dev/shm");

  // Registers a buffer of weft's own (control messages, offers) for sends and receives where the provider needs
  // local registration; otherwise leaves *mr empty and *desc NULL. `what` names it in the warning on failure.
  Status registerInternal(void* buf, size_t len, const char* what, MrPtr* mr, void** desc);

  // Registrar
  Status registerRange(uintptr_t base, size_t len, int type, int dmabufFd, uint64_t dmabufOffset,
                       MrEntry* entry) override;
  void deregisterRange(MrEntry* entry) noexcept override;
  // One registration of [base, base+len) with the given access (FI_*), memory `type` (NCCL_PTR_*), through a
  // DMA-BUF where dmabufFd >= 0: what registerRange does for the net table, and the RMA windows with their own access.
  Status registerAccess(uintptr_t base, size_t len, int type, int dmabufFd, uint64_t dmabufOffset, uint64_t access,
                        fid_mr** out);

 private:
  int index_;
  InfoPtr info_;
  DeviceProps props_;
  sysfs::LinkSource link_;
  bool localMr_;
  bool directedRecv_;
  size_t injectSize_;
  bool injectSafe_;
  bool hardwarePlacement_;
  bool efa_ = false;
  bool canReadBack_ = false;
  bool flushHost_ = false;
  std::atomic<int> deviceWrites_{-1};  // -1 unknown, 0 emulated (or unknowable), 1 the device writes
  size_t maxMsgSize_;
  uint32_t providerHash_;
  bool provKey_;
  bool virtAddr_;
  bool rdma_ = false;
  bool enomemIsFull_ = false;
  bool compactImm_ = false;
  size_t eagerMax_ = kDefaultEagerMax;
  std::atomic<uint64_t> nextKey_{1};
  std::mutex openMutex_;  // guards the one-time opening of fabric_ and domain_
  std::atomic<int> writeLen_{-1};
  std::atomic<bool> shmSwept_{false};  // nameEndpoint swept /dev/shm
  std::mutex measureMutex_;  // serializes the one measurement of writeLen_ (taken before openMutex_)
  bool opened_ = false;
  bool rmaOnly_ = false;
  FabricPtr fabric_;
  DomainPtr domain_;
  MrCache cache_;  // declared last: destroyed first, while domain_ is still open
};

}  // namespace weft::fabric
