// SPDX-License-Identifier: Apache-2.0
// The exported ncclNetPlugin_v7 ... _v12 tables: thin noexcept adapters over one implementation.
// Each adapter converts its version's argument types, calls into the backend through guarded(), and maps the
// result to ncclResult_t in one place. Nothing here allocates on the data path.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>

#include <time.h>

#include "plugin/conn_timing.h"
#include "plugin/device_props.h"
#include "plugin/engine.h"
#include "plugin/guarded.h"
#include "plugin/live_objects.h"
#include "telemetry/profiler_core.h"
#include "telemetry/sink.h"
#include "tuner/agreement.h"
#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/nccl/net.h"
#include "weft/nccl/profiler.h"
#include "weft/transport/mr_cache.h"

namespace weft {
namespace {

constexpr uint32_t kContextMagic = 0x57464358;  // "WFCX"

// What a v11+ init returns as ctx: the communicator's identity and config.
struct NetContext {
  uint32_t magic = kContextMagic;
  uint64_t commId = 0;
  CommConfig config;
  // The latest setNetAttr hint (v11+), kept for what may use it; nothing does yet (setNetAttrImpl says why).
  std::atomic<uint32_t> hintOp{0}, hintAlgo{0}, hintProto{0};
  std::atomic<int32_t> hintSendPeers{0}, hintRecvPeers{0}, hintFlows{0};
  std::atomic<uint64_t> hints{0};
};

LiveObjects& live() {
  static LiveObjects* l = new LiveObjects;  // never destroyed: NCCL may close comms during exit
  return *l;
}

Backend* backendOrWarn(const char* what) {
  Backend* b = Engine::instance().backend();
  if (b == nullptr) WEFT_WARN("{} called, but weft offers no devices ({})", what, Engine::instance().declineReason());
  return b;
}

Comm* asComm(void* p) {
  auto* o = static_cast<Object*>(p);
  if (o == nullptr || !live().contains(p)) return nullptr;
  if (o->magic_ == kSendMagic) return static_cast<SendComm*>(o);
  if (o->magic_ == kRecvMagic) return static_cast<RecvComm*>(o);
  return nullptr;
}

template <typename T, uint32_t kMagic>
T* as(void* p, const char* what) {
  auto* o = static_cast<Object*>(p);
  if (o == nullptr || o->magic_ != kMagic) {
    WEFT_WARN("{}: {} is not a live weft object of the right kind (closed already, or not ours)", what, p);
    return nullptr;
  }
  return static_cast<T*>(o);
}

// ---- one implementation ----------------------------------------------------------------------------------------

ncclResult_t initImpl(ncclDebugLogger_t logger) {
  return guarded("init", [&] {
    Status st = Engine::instance().init(logger);  // sets the logger first
    // This library's tuner is the one NCCL 2.21+ uses by default: connections carry its decision state and are
    // refused where the two ends' differ (weft/transport/agreement.h). Once per process.
    static std::once_flag agreement;
    std::call_once(agreement, [] { transport::setAgreementSource(&tuner::decisionState); });
    return st;
  });
}

ncclResult_t devicesImpl(int* ndev) {
  return guarded("devices", [&] {
    if (ndev == nullptr) return Status::kInternal;
    *ndev = Engine::instance().deviceCount();
    return Status::kOk;
  });
}

template <typename P>
ncclResult_t getPropertiesImpl(int dev, P* props) {
  return guarded("getProperties", [&] {
    Backend* b = backendOrWarn("getProperties");
    if (b == nullptr || props == nullptr || dev < 0 || dev >= b->deviceCount()) return Status::kInternal;
    const DeviceProps& d = b->props(dev);
    fillDeviceProps(d, dev, props);
    if constexpr (requires { props->netDeviceType; }) {
      props->netDeviceType = NCCL_NET_DEVICE_HOST;
      props->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
    }
    if constexpr (requires { props->regIsGlobal; }) props->regIsGlobal = d.regIsGlobal ? 1 : 0;
    if constexpr (requires { props->forceFlush; }) {
      props->forceFlush = d.forceFlush ? 1 : 0;
      // A fused device lists its members; NCCL (2.28+ shims) copies only ndevs entries: a pre-v12 table holds 4,
      // v12 8, and makeVDevice below never makes more than the table in use holds.
      constexpr int kCap = static_cast<int>(sizeof(props->vProps.devs) / sizeof(props->vProps.devs[0]));
      if (d.vdevCount > 0 && d.vdevCount <= kCap) {
        props->vProps.ndevs = d.vdevCount;
        for (int i = 0; i < d.vdevCount; ++i) props->vProps.devs[i] = d.vdevs[i];
      }
    }
    return Status::kOk;
  });
}

template <typename VP>
ncclResult_t makeVDeviceImpl(int* d, VP* props) {
  return guarded("makeVDevice", [&] {
    Backend* b = backendOrWarn("makeVDevice");
    if (b == nullptr || d == nullptr || props == nullptr) return Status::kInternal;
    constexpr int kCap = static_cast<int>(sizeof(props->devs) / sizeof(props->devs[0]));
    if (props->ndevs < 1 || props->ndevs > kCap) {
      WEFT_WARN("makeVDevice: ndevs={} (1 to {} allowed)", props->ndevs, kCap);
      return Status::kInternal;
    }
    return b->makeVDevice(props->devs, props->ndevs, d);
  });
}

ncclResult_t listenImpl(int dev, const CommConfig& config, void* handle, void** listenComm) {
  return guarded("listen", [&] {
    if (listenComm == nullptr || handle == nullptr) return Status::kInternal;
    *listenComm = nullptr;
    Backend* b = backendOrWarn("listen");
    if (b == nullptr) return Status::kInternal;
    ListenComm* lc = nullptr;
    Status st = b->listen(dev, config, handle, &lc);
    if (st == Status::kOk) {
      *listenComm = static_cast<Object*>(lc);
      live().add(*listenComm);
    }
    return st;
  });
}

ncclResult_t connectImpl(int dev, const CommConfig& config, void* handle, void** sendComm) {
  return guarded("connect", [&] {
    if (sendComm == nullptr || handle == nullptr) return Status::kInternal;
    *sendComm = nullptr;
    Backend* b = backendOrWarn("connect");
    if (b == nullptr) return Status::kInternal;
    SendComm* sc = nullptr;
    Status st = b->connect(dev, config, handle, &sc);
    if (st == Status::kOk && sc != nullptr) {
      timingOpen(sc, true);
      *sendComm = static_cast<Object*>(sc);
      live().add(*sendComm);
    }
    return st;
  });
}

ncclResult_t acceptImpl(void* listenComm, void** recvComm) {
  return guarded("accept", [&] {
    if (recvComm == nullptr) return Status::kInternal;
    *recvComm = nullptr;
    if (!live().contains(listenComm)) {
      WEFT_WARN("accept: {} is not a live weft listen comm (closed already, or not ours)", listenComm);
      return Status::kInternal;
    }
    auto* lc = as<ListenComm, kListenMagic>(listenComm, "accept");
    if (lc == nullptr) return Status::kInternal;
    RecvComm* rc = nullptr;
    Status st = lc->accept(&rc);
    if (st == Status::kOk && rc != nullptr) {
      timingOpen(rc, false);
      *recvComm = static_cast<Object*>(rc);
      live().add(*recvComm);
    }
    return st;
  });
}

ncclResult_t regMrImpl(void* comm, void* data, size_t size, int type, void** mhandle) {
  return guarded("regMr", [&] {
    if (mhandle == nullptr) return Status::kInternal;
    *mhandle = nullptr;
    Comm* c = asComm(comm);
    if (c == nullptr) {
      WEFT_WARN("regMr: {} is not a live weft send or receive comm", comm);
      return Status::kInternal;
    }
    MemHandle* mh = nullptr;
    Status st = c->regMr(data, size, type, &mh);
    if (st == Status::kOk) {
      *mhandle = static_cast<Object*>(mh);
      live().add(*mhandle);
      timingRegMr(c, data, type);
    }
    return st;
  });
}

ncclResult_t regMrDmaBufImpl(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                             void** mhandle) {
  return guarded("regMrDmaBuf", [&] {
    if (mhandle == nullptr) return Status::kInternal;
    *mhandle = nullptr;
    Comm* c = asComm(comm);
    if (c == nullptr) {
      WEFT_WARN("regMrDmaBuf: {} is not a live weft send or receive comm", comm);
      return Status::kInternal;
    }
    MemHandle* mh = nullptr;
    Status st = c->regMrDmaBuf(data, size, type, offset, fd, &mh);
    if (st == Status::kOk) {
      *mhandle = static_cast<Object*>(mh);
      live().add(*mhandle);
      timingRegMr(c, data, type);
    }
    return st;
  });
}

ncclResult_t deregMrImpl(void* comm, void* mhandle) {
  return guarded("deregMr", [&] {
    Comm* c = asComm(comm);
    if (c == nullptr) {
      WEFT_WARN("deregMr: {} is not a live weft send or receive comm", comm);
      return Status::kInternal;
    }
    if (!live().remove(mhandle)) {
      WEFT_WARN("deregMr: {} is not a live weft memory handle (deregistered already, or not ours)", mhandle);
      return Status::kInternal;
    }
    return c->deregMr(static_cast<MemHandle*>(static_cast<Object*>(mhandle)));
  });
}

MemHandle* asMr(void* p) { return static_cast<MemHandle*>(static_cast<Object*>(p)); }

ncclResult_t isendImpl(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request,
                       void* phandle = nullptr) {
  return guarded("isend", [&] {
    if (request == nullptr) return Status::kInternal;
    *request = nullptr;
    auto* sc = as<SendComm, kSendMagic>(sendComm, "isend");
    if (sc == nullptr) return Status::kInternal;
    Request* r = nullptr;
    Status st = sc->isend(data, size, tag, asMr(mhandle), &r);
    if (r != nullptr) timingPost(sc, r, size, tag, true, 1, &phandle);
    *request = r ? static_cast<Object*>(r) : nullptr;
    return st;
  });
}

ncclResult_t irecvImpl(void* recvComm, int n, void** data, const size_t* sizes, int* tags, void** mhandles,
                       void** request, void** phandles = nullptr) {
  return guarded("irecv", [&] {
    if (request == nullptr) return Status::kInternal;
    const bool optional = *request == reinterpret_cast<void*>(NCCL_NET_OPTIONAL_RECV_COMPLETION);
    *request = nullptr;  // always overwritten
    auto* rc = as<RecvComm, kRecvMagic>(recvComm, "irecv");
    if (rc == nullptr || n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || tags == nullptr) {
      return Status::kInternal;
    }
    MemHandle* mhs[kMaxRecvs];
    for (int i = 0; i < n; ++i) mhs[i] = mhandles ? asMr(mhandles[i]) : nullptr;
    Request* r = nullptr;
    Status st = rc->irecv(n, data, sizes, tags, mhs, optional, &r);
    if (r != nullptr) {
      uint64_t total = 0;
      for (int i = 0; i < n; ++i) total += sizes[i];
      timingPost(rc, r, total, tags[0], false, n, phandles);
    }
    *request = r ? static_cast<Object*>(r) : nullptr;
    return st;
  });
}

ncclResult_t irecvIntImpl(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                          void** request) {
  if (n < 1 || n > kMaxRecvs || sizes == nullptr) {
    if (request != nullptr) *request = nullptr;
    WEFT_WARN("irecv with n={} buffers (at most {})", n, kMaxRecvs);
    return ncclInternalError;
  }
  size_t wide[kMaxRecvs];
  for (int i = 0; i < n; ++i) wide[i] = static_cast<size_t>(sizes[i] < 0 ? 0 : sizes[i]);
  return irecvImpl(recvComm, n, data, wide, tags, mhandles, request);
}

ncclResult_t iflushImpl(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  return guarded("iflush", [&] {
    if (request == nullptr) return Status::kInternal;
    *request = nullptr;
    auto* rc = as<RecvComm, kRecvMagic>(recvComm, "iflush");
    if (rc == nullptr || n < 1 || n > kMaxRecvs) return Status::kInternal;
    MemHandle* mhs[kMaxRecvs];
    for (int i = 0; i < n; ++i) mhs[i] = mhandles ? asMr(mhandles[i]) : nullptr;
    Request* r = nullptr;
    Status st = rc->iflush(n, data, sizes, mhs, &r);
    *request = r ? static_cast<Object*>(r) : nullptr;
    return st;
  });
}

ncclResult_t testImpl(void* request, int* done, int* sizes) {
  return guarded("test", [&] {
    if (done == nullptr) return Status::kInternal;
    *done = 0;
    auto* r = as<Request, kRequestMagic>(request, "test");
    if (r == nullptr) return Status::kInternal;
    bool d = false;
    Status st = r->test(&d, sizes);
    if ((d || st != Status::kOk) && timingPending(r)) timingDone(r, sizes);
    *done = d ? 1 : 0;
    return st;
  });
}

ncclResult_t closeSendImpl(void* sendComm) {
  return guarded("closeSend", [&] {
    if (!live().contains(sendComm)) {
      WEFT_WARN("closeSend: {} is not a live weft send comm (closed already, or not ours)", sendComm);
      return Status::kInternal;
    }
    auto* sc = as<SendComm, kSendMagic>(sendComm, "closeSend");
    if (sc == nullptr) return Status::kInternal;
    live().remove(sendComm);
    timingClose(sc);
    sc->close();
    return Status::kOk;
  });
}

ncclResult_t closeRecvImpl(void* recvComm) {
  return guarded("closeRecv", [&] {
    if (!live().contains(recvComm)) {
      WEFT_WARN("closeRecv: {} is not a live weft receive comm (closed already, or not ours)", recvComm);
      return Status::kInternal;
    }
    auto* rc = as<RecvComm, kRecvMagic>(recvComm, "closeRecv");
    if (rc == nullptr) return Status::kInternal;
    live().remove(recvComm);
    timingClose(rc);
    rc->close();
    return Status::kOk;
  });
}

ncclResult_t closeListenImpl(void* listenComm) {
  return guarded("closeListen", [&] {
    if (!live().contains(listenComm)) {
      WEFT_WARN("closeListen: {} is not a live weft listen comm (closed already, or not ours)", listenComm);
      return Status::kInternal;
    }
    auto* lc = as<ListenComm, kListenMagic>(listenComm, "closeListen");
    if (lc == nullptr) return Status::kInternal;
    live().remove(listenComm);
    delete lc;
    return Status::kOk;
  });
}

// ---- per-version adapters --------------------------------------------------------------------------------------

ncclResult_t init_v7(ncclDebugLogger_t logger) {  // the v7, v8 and v9 tables
  setNetTableVersion(9);
  return initImpl(logger);
}
ncclResult_t init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
  setNetTableVersion(10);
  if (prof != nullptr) setProfilerCallback(prof);
  return initImpl(logger);
}

template <typename Config>
ncclResult_t init_v11(void** ctx, uint64_t commId, Config* config, ncclDebugLogger_t logger,
                      ncclProfilerCallback_t prof) {
  // v12's config type is its own: NCCL fuses up to 8 NICs a device there, 4 before.
  setNetTableVersion(std::is_same_v<Config, ncclNetCommConfig_v12_t> ? 12 : 11);
  if (prof != nullptr) setProfilerCallback(prof);
  if (ctx != nullptr) *ctx = nullptr;
  ncclResult_t r = initImpl(logger);
  if (r != ncclSuccess) return r;
  return guarded("init", [&] {
    if (ctx == nullptr) return Status::kInternal;
    auto* c = new NetContext();
    c->commId = commId;
    if (config != nullptr) c->config.trafficClass = config->trafficClass;
    *ctx = c;
    WEFT_INFO(NCCL_INIT | NCCL_NET, "init for communicator {:#x} (traffic class {})", commId, c->config.trafficClass);
    return Status::kOk;
  });
}

ncclResult_t finalize_v11(void* ctx) {
  return guarded("finalize", [&] {
    if (ctx == nullptr) return Status::kOk;  // NCCL 2.28.3-2.29.3 call finalize after a failed init
    auto* c = static_cast<NetContext*>(ctx);
    if (c->magic != kContextMagic) {
      WEFT_WARN("finalize: {} is not a weft context", ctx);
      return Status::kInternal;
    }
    c->magic = 0;
    if (Backend* b = Engine::instance().backend()) b->releaseScope(c);
    delete c;
    return Status::kOk;
  });
}

// setNetAttr (v11+, NCCL 2.28+): NCCL's hints for a context, from the service thread at connect (peers and flows
// per peer the communicator may use) and from the progress thread before transfers whose operation, algorithm,
// protocol, peers or channels differ from the last. Accepted and kept (no allocation, lock or log on the progress
// thread). Not acted on: weft carries every comm of a context over the same shared endpoint per NIC, whose
// receive budget and queues do not depend on how many peers or flows are active, and a flow is a channel's own
// comm already; NCCL's Socket and IB transports use the hints to size per-flow sockets and QPs, which weft does
// not have. The log says the first hint of each context.
template <typename A>
ncclResult_t setNetAttrImpl(void* ctx, A* attr) {
  return guarded("setNetAttr", [&] {
    auto* c = static_cast<NetContext*>(ctx);
    if (c == nullptr || c->magic != kContextMagic) {
      WEFT_WARN("setNetAttr: {} is not a weft context", ctx);
      return Status::kInternal;
    }
    if (attr == nullptr) {
      WEFT_WARN("setNetAttr: NULL attributes");
      return Status::kInternal;
    }
    c->hintOp.store(attr->op, std::memory_order_relaxed);
    c->hintAlgo.store(attr->algo, std::memory_order_relaxed);
    c->hintProto.store(attr->proto, std::memory_order_relaxed);
    c->hintSendPeers.store(attr->sendCommAttr.maxConcurrentPeers, std::memory_order_relaxed);
    c->hintRecvPeers.store(attr->recvCommAttr.maxConcurrentPeers, std::memory_order_relaxed);
    c->hintFlows.store(std::max(attr->sendCommAttr.maxFlowsPerPeer, attr->recvCommAttr.maxFlowsPerPeer),
                       std::memory_order_relaxed);
    if (c->hints.fetch_add(1, std::memory_order_relaxed) == 0) {
      WEFT_INFO(NCCL_NET, "context {:#x}: NCCL's first flow hint: send to {} peers, receive from {}, {} flows per "
                "peer (kept; weft's shared endpoints need no sizing by it)",
                c->commId, attr->sendCommAttr.maxConcurrentPeers, attr->recvCommAttr.maxConcurrentPeers,
                std::max(attr->sendCommAttr.maxFlowsPerPeer, attr->recvCommAttr.maxFlowsPerPeer));
    }
    return Status::kOk;
  });
}

CommConfig configOf(void* ctx) {
  auto* c = static_cast<NetContext*>(ctx);
  if (c == nullptr || c->magic != kContextMagic) return CommConfig{};
  CommConfig cfg = c->config;
  cfg.scope = c;
  return cfg;
}

ncclResult_t listen_v7(int dev, void* handle, void** listenComm) {
  return listenImpl(dev, CommConfig{}, handle, listenComm);
}

ncclResult_t listen_v11(void* ctx, int dev, void* handle, void** listenComm) {
  return listenImpl(dev, configOf(ctx), handle, listenComm);
}

ncclResult_t connect_v7(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v7_t** /*unused by HOST*/) {
  return connectImpl(dev, CommConfig{}, handle, sendComm);
}

ncclResult_t connect_v10(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                         ncclNetDeviceHandle_v10_t**) {
  CommConfig c;
  if (config != nullptr) c.trafficClass = config->trafficClass;  // NULL from the 2.26/2.27 GDR probe
  return connectImpl(dev, c, handle, sendComm);
}

ncclResult_t connect_v11(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t**) {
  return connectImpl(dev, configOf(ctx), handle, sendComm);
}

ncclResult_t accept_v7(void* listenComm, void** recvComm, ncclNetDeviceHandle_v7_t**) {
  return acceptImpl(listenComm, recvComm);
}

ncclResult_t regMr_v7(void* comm, void* data, int size, int type, void** mhandle) {
  if (size < 0) {
    if (mhandle != nullptr) *mhandle = nullptr;
    return ncclInternalError;
  }
  return regMrImpl(comm, data, static_cast<size_t>(size), type, mhandle);
}

ncclResult_t isend_v7(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  if (size < 0) {
    if (request != nullptr) *request = nullptr;
    return ncclInternalError;
  }
  return isendImpl(sendComm, data, static_cast<size_t>(size), tag, mhandle, request);
}

ncclResult_t isend_v9(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  return isendImpl(sendComm, data, size, tag, mhandle, request);
}

ncclResult_t isend_v10(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                       void** request) {
  return isendImpl(sendComm, data, size, tag, mhandle, request, phandle);
}

ncclResult_t irecv_v9(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                      void** request) {
  return irecvImpl(recvComm, n, data, sizes, tags, mhandles, request);
}

ncclResult_t irecv_v10(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                       void** phandles, void** request) {
  return irecvImpl(recvComm, n, data, sizes, tags, mhandles, request, phandles);
}

}  // namespace
}  // namespace weft

using namespace weft;

#define WEFT_EXPORT __attribute__((visibility("default")))

extern "C" {

// NCCL reads `name` right after dlsym, before init: it must be a static string.
WEFT_EXPORT ncclNet_v7_t ncclNetPlugin_v7 = {
    "weft",        init_v7,       devicesImpl,     getPropertiesImpl<ncclNetProperties_v7_t>,
    listen_v7,     connect_v7,    accept_v7,       regMr_v7,
    regMrDmaBufImpl, deregMrImpl, isend_v7,        irecvIntImpl,
    iflushImpl,    testImpl,      closeSendImpl,   closeRecvImpl,
    closeListenImpl, nullptr /*getDeviceMr*/, nullptr /*irecvConsumed*/,
};

WEFT_EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
    "weft",        init_v7,       devicesImpl,     getPropertiesImpl<ncclNetProperties_v8_t>,
    listen_v7,     connect_v7,    accept_v7,       regMrImpl,
    regMrDmaBufImpl, deregMrImpl, isend_v7,        irecvIntImpl,
    iflushImpl,    testImpl,      closeSendImpl,   closeRecvImpl,
    closeListenImpl, nullptr, nullptr,
};

WEFT_EXPORT ncclNet_v9_t ncclNetPlugin_v9 = {
    "weft",        init_v7,       devicesImpl,     getPropertiesImpl<ncclNetProperties_v9_t>,
    listen_v7,     connect_v7,    accept_v7,       regMrImpl,
    regMrDmaBufImpl, deregMrImpl, isend_v9,        irecv_v9,
    iflushImpl,    testImpl,      closeSendImpl,   closeRecvImpl,
    closeListenImpl, nullptr, nullptr, makeVDeviceImpl<ncclNetVDeviceProps_v9_t>,
};

WEFT_EXPORT ncclNet_v10_t ncclNetPlugin_v10 = {
    "weft",        init_v10,      devicesImpl,     getPropertiesImpl<ncclNetProperties_v10_t>,
    listen_v7,     connect_v10,   accept_v7,       regMrImpl,
    regMrDmaBufImpl, deregMrImpl, isend_v10,       irecv_v10,
    iflushImpl,    testImpl,      closeSendImpl,   closeRecvImpl,
    closeListenImpl, nullptr, nullptr, makeVDeviceImpl<ncclNetVDeviceProps_v10_t>,
};

WEFT_EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
    "weft",        init_v11<ncclNetCommConfig_v11_t>, devicesImpl, getPropertiesImpl<ncclNetProperties_v11_t>,
    listen_v11,    connect_v11,   accept_v7,       regMrImpl,
    regMrDmaBufImpl, deregMrImpl, isend_v10,       irecv_v10,
    iflushImpl,    testImpl,      closeSendImpl,   closeRecvImpl,
    closeListenImpl, nullptr, nullptr, makeVDeviceImpl<ncclNetVDeviceProps_v11_t>, finalize_v11,
    setNetAttrImpl<ncclNetAttr_v11_t>,
};

WEFT_EXPORT ncclNet_v12_t ncclNetPlugin_v12 = {
    "weft",        init_v11<ncclNetCommConfig_v12_t>, devicesImpl, getPropertiesImpl<ncclNetProperties_v12_t>,
    listen_v11,    connect_v11,   accept_v7,       regMrImpl,
    regMrDmaBufImpl, deregMrImpl, isend_v10,       irecv_v10,
    iflushImpl,    testImpl,      closeSendImpl,   closeRecvImpl,
    closeListenImpl, nullptr, nullptr, makeVDeviceImpl<ncclNetVDeviceProps_v12_t>, finalize_v11,
    setNetAttrImpl<ncclNetAttr_v12_t>,
};

// weft's own figures, for tools (`weft conformance` reports endpoints open with it); not part of NCCL's ABI.
// Returns 0 and sets *value for a key the backend in use counts, -1 otherwise (no backend yet, or a key it does not
// count: a figure it does not keep is unknown, never 0). Keys, by backend (Backend::stat):
// - libfabric: "fabric.endpoints_open" (endpoints open in this process), "fabric.probes_sent" (liveness probes),
//   "fabric.rail_downs" and "fabric.rail_recoveries" (a comm's rail seen going down / coming back, every comm
//   counted), "fabric.rail_failovers" and "fabric.moved_messages" (WEFT_RAIL_FAILOVER: rails failed over, messages
//   sent or posted again elsewhere), "fabric.rail_readmits" (failed-over rails taken back), "fabric.peer_resets"
//   (rail failover with the rdma protocol: a failed rail's connection closed), "fabric.flush_reads";
// - libfabric and verbs: "flush_reads" (read-back flush reads completed);
// - tcp: "tcp.send_calls", "tcp.recv_calls", "tcp.bytes_sent", "tcp.bytes_received", "tcp.comms_open".
WEFT_EXPORT int weftNetStat(const char* key, long long* value) {
  if (key == nullptr || value == nullptr) return -1;
  try {
    const weft::Backend* b = weft::Engine::instance().backend();
    return b != nullptr && b->stat(key, value) ? 0 : -1;
  } catch (...) {
    return -1;
  }
}

}  // extern "C"
