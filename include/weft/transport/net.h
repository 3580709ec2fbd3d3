// SPDX-License-Identifier: Apache-2.0
// The backend-neutral transport interface the plugin tables call into. A backend (libfabric, native ibverbs, or
// weft's own TCP sockets) provides devices, comms and requests; the plugin layer only adapts NCCL's versioned
// tables to this.
//
// Threading (NCCL's, see docs/nccl-semantics.md §threads): listen/connect/accept/regMr/deregMr/close* run on a
// communicator's proxy service thread; isend/irecv/iflush/test on its progress thread, possibly at the same time as regMr/deregMr on
// the same comm. Several communicators do this concurrently. Data-path calls on one comm come from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "weft/common/rail_health.h"
#include "weft/common/status.h"

namespace weft {

constexpr size_t kHandleSize = 128;   // NCCL_NET_HANDLE_MAXSIZE
constexpr int kMaxRecvs = 8;          // largest maxRecvs we ever report
constexpr int kMaxRequests = 32;      // NCCL_NET_MAX_REQUESTS (v7+)
// NICs one device may fuse: NCCL_NET_MAX_DEVS_PER_NIC of the net table NCCL uses, 8 on v12 (NCCL 2.30+: NCCL itself
// fuses up to 8 through makeVDevice there), 4 on the older tables. kMaxDevsPerNic sizes every per-rail array.
constexpr int kMaxDevsPerNic = 8;
constexpr int kMaxDevsPerNicBeforeV12 = 4;
// Each table's init says which it is before the first discovery (the v7-v9 tables share an init: "before v12").
void setNetTableVersion(int version) noexcept;
int maxDevsPerNic() noexcept;  // for the table in use: 8 on v12, else 4

struct DeviceProps {
  std::string name;      // unique per device, stable
  std::string pciPath;   // sysfs path ending in the PCI bus id, or empty for a virtual NIC
  int numaNode = -1;     // the NIC's NUMA node in the machine's layout (weft/common/topology.h); -1: unknown
  std::string provider;  // e.g. "tcp;ofi_rxm"
  std::string fabric;    // provider's fabric name (e.g. the subnet for tcp)
  uint64_t guid = 0;
  int ptrSupport = 0x1;  // NCCL_PTR_*
  int speedMbps = 10000;
  int port = 0;
  float latencyUs = 0.0f;
  int maxComms = 65536;
  int maxRecvs = 1;
  bool regIsGlobal = false;
  bool forceFlush = false;
  size_t maxP2pBytes = size_t{1} << 30;
  size_t maxCollBytes = size_t{1} << 30;
  // NCCL 2.30 (v12): the rail (switch) and plane the NIC is on, as the user gave them; -1: undefined. NCCL's
  // search then pairs only NICs of the same rail (without crossNic) and never NICs of different planes.
  int railId = -1;
  int planeId = -1;
  // A device NCCL made with makeVDevice: the devices it fuses (vProps). 0: a device of its own.
  int vdevCount = 0;
  int vdevs[8] = {};
};

struct CommConfig {
  int trafficClass = -1;  // NCCL_NET_TRAFFIC_CLASS_UNDEF
  // The NCCL context (v11+ init) the call belongs to; nullptr before v11. Shared endpoints are shared within it.
  const void* scope = nullptr;
};

// Every object handed to NCCL starts with a magic word so a stale or foreign pointer is refused with a clear
// error instead of being used (a pointer that is not ours at all can still fault; NCCL never passes one).
struct Object {
  explicit Object(uint32_t magic) : magic_(magic) {}
  ~Object() { magic_ = 0; }
  uint32_t magic_;
};

constexpr uint32_t kListenMagic = 0x57464c53;  // "WFLS"
constexpr uint32_t kSendMagic = 0x57465344;    // "WFSD"
constexpr uint32_t kRecvMagic = 0x57465256;    // "WFRV"
constexpr uint32_t kRequestMagic = 0x57465251; // "WFRQ"
constexpr uint32_t kMrMagic = 0x57464d52;      // "WFMR"

class MemHandle;  // defined by the registration cache (mr_cache.h)

class Request : public Object {
 public:
  Request() : Object(0) {}
  virtual ~Request() = default;
  // On done, `sizes` (when non-NULL) gets one entry per buffer and the request returns to its pool.
  virtual Status test(bool* done, int* sizes) = 0;
  // The plugin's timing of this request (plugin/conn_timing.cc, a RequestTiming), zeroed at construction and kept
  // with the request through its reuses; no backend reads or writes it.
  alignas(8) unsigned char timingSlot[96] = {};
};

class Comm : public Object {
 public:
  using Object::Object;
  virtual ~Comm() = default;
  // For logs and per-connection records: the peer's address, this end's device.
  virtual std::string peerName() const { return {}; }
  // This end's address as the peer's peerName() names it ("" where the backend has none to give): `weft report
  // --hangs` pairs the two ends of a connection by it.
  virtual std::string localName() const { return {}; }
  virtual std::string deviceName() const { return {}; }
  // The properties of the NIC it runs on (its first rail's): where it sits in the machine (numaNode, pciPath).
  virtual const DeviceProps* deviceProps() const { return nullptr; }
  // The plugin's timing record of this connection (plugin/conn_timing.cc, a telemetry::ConnStats); no backend
  // reads or writes it.
  void* timingRecord = nullptr;
  // A comm of several rails (NICs): their health, *n entries, valid until the comm is closed and readable from
  // any thread (weft/common/rail_health.h). A single-rail comm reports none.
  virtual const RailHealth* rails(int* n) const {
    *n = 0;
    return nullptr;
  }
  // Its stalls (weft/common/rail_health.h), valid until the comm is closed and readable from any thread; nullptr
  // where the backend watches none.
  virtual const StallState* stallState() const { return nullptr; }
  // Brings that health up to date now (a rail that came back while the comm sat idle); the layer above calls it
  // before it writes the comm's final record.
  virtual void refreshRails() {}
  virtual Status regMr(void* data, size_t size, int type, MemHandle** out) = 0;
  virtual Status regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out) = 0;
  virtual Status deregMr(MemHandle* mh) = 0;
  // NCCL closed the comm: by default it goes at once; a backend may keep it until the network is done with its
  // buffers (the plugin never touches it again either way).
  virtual void close() { delete this; }
};

class SendComm : public Comm {
 public:
  SendComm() : Comm(kSendMagic) {}
  // *request = nullptr with kOk means "try again later" (back-pressure).
  virtual Status isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) = 0;
};

class RecvComm : public Comm {
 public:
  RecvComm() : Comm(kRecvMagic) {}
  // optional: NCCL_NET_OPTIONAL_RECV_COMPLETION was in *request (LL/LL128, n == 1): the data carries its own
  // arrival flags, so the request may be reported done early.
  virtual Status irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs, bool optional,
                       Request** request) = 0;
  virtual Status iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) = 0;
};

class ListenComm : public Object {
 public:
  ListenComm() : Object(kListenMagic) {}
  virtual ~ListenComm() = default;
  // *recvComm stays nullptr until a peer has connected (call again).
  virtual Status accept(RecvComm** recvComm) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int deviceCount() const = 0;
  virtual const DeviceProps& props(int dev) const = 0;
  virtual Status listen(int dev, const CommConfig& config, void* handle, ListenComm** out) = 0;
  // Non-blocking: *out stays nullptr until the peer has accepted; the same `handle` pointer identifies the
  // attempt across calls (NCCL polls with the same buffer).
  virtual Status connect(int dev, const CommConfig& config, void* handle, SendComm** out) = 0;
  // NCCL's NIC fusion (v9+): a new device made of `devs` (devices of ours); its index in *out.
  virtual Status makeVDevice(const int* devs, int n, int* out) = 0;
  // NCCL finalized the context `scope` (CommConfig::scope): what the backend keeps per context is released (a
  // later context at the same address starts afresh).
  virtual void releaseScope(const void* scope) { (void)scope; }
  // True when `dev` is one of this backend's devices; else warns, naming the call (`op`), and the caller answers
  // kInternal (NCCL passed a device it was never given).
  bool validDevice(int dev, const char* op) const;
  // weft's own figures for tools (weftNetStat): true and *value for a key this backend counts. A key it does not
  // count is unknown (false), never 0: a tool reading 0 would take it for "none happened".
  virtual bool stat(std::string_view key, long long* value) const {
    (void)key;
    (void)value;
    return false;
  }
  // What `weft info` adds to device `dev`'s line beyond DeviceProps (rails, protocol, address); empty for none.
  virtual std::string describe(int dev) const {
    (void)dev;
    return {};
  }
};

}  // namespace weft
