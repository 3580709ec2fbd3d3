// SPDX-License-Identifier: Apache-2.0
// The device API's proxy tables: ncclGinPlugin_v11, _v12 (NCCL 2.28-2.29, proxy mode), ncclGinPlugin_v13 and
// ncclRmaPlugin_v13 (2.30.3-2.30.4's GIN table, which 2.30.7 also loads as RMA v13), ncclRmaPlugin_v14 ... _v17
// (2.30.7 on). Thin noexcept adapters over one RMA core (src/rma/rma.h); docs/device-api.md says what each
// version's calls mean and where NCCL's source says so.
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <vector>

#include "plugin/conn_timing.h"
#include "plugin/device_props.h"
#include "plugin/engine.h"
#include "plugin/guarded.h"
#include "plugin/live_objects.h"
#include "rma/rma.h"
#include "weft/common/cuda_shim.h"
#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/nccl/rma.h"

namespace weft {
namespace {

// NCCL holds our objects as void*: always the address of their Object part (a polymorphic class has its vtable
// pointer before that), converted back the same way.
template <typename T>
T* fromHandle(void* p) {
  return static_cast<T*>(static_cast<Object*>(p));
}
void* toHandle(Object* o) { return o; }

// What init returns as ctx: the communicator's id, handed to connect so two jobs on one host never join.
struct RmaInit {
  uint64_t commId = 0;
};

// The process's RMA transport, chosen once (WEFT_RMA), and the objects handed to NCCL by the calls off the data path,
// so that those calls refuse what is not live without touching freed memory.
class RmaState {
 public:
  static RmaState& get() {
    static RmaState* s = new RmaState;  // never destroyed: NCCL may call in during exit
    return *s;
  }
  rma::RmaTransport* transport() {
    std::call_once(once_, [this] { choose(); });
    return transport_.get();
  }
  const std::string& declined() const { return declined_; }
  LiveObjects& live() { return live_; }
  // Each comm's ledger in the dumps (conn_timing.h), by comm.
  void openLedger(rma::RmaComm* c, const std::string& device) {
    const uint32_t id = timingRmaOpen(c, device);
    if (id == 0) return;
    std::lock_guard<std::mutex> lock(ledgerMu_);
    ledgers_.push_back({c, id});
  }
  void closeLedger(rma::RmaComm* c) {
    uint32_t id = 0;
    {
      std::lock_guard<std::mutex> lock(ledgerMu_);
      for (auto it = ledgers_.begin(); it != ledgers_.end(); ++it) {
        if (it->first == c) {
          id = it->second;
          ledgers_.erase(it);
          break;
        }
      }
    }
    timingRmaClose(id);
  }

 private:
  void choose() {
    transport_ = selectRmaTransport(params::getString("WEFT_RMA"), Engine::instance().backend(), &declined_);
    if (transport_ != nullptr) {
      WEFT_INFO(NCCL_INIT | NCCL_NET, "RMA: NCCL's device API through its proxy over weft's {} transport, {} device(s)",
                transport_->name(), transport_->deviceCount());
    } else {
      WEFT_INFO(NCCL_INIT | NCCL_NET, "RMA: weft offers no devices to the device API: {}", declined_);
    }
  }
  std::once_flag once_;
  std::unique_ptr<rma::RmaTransport> transport_;
  std::string declined_;
  LiveObjects live_;
  std::mutex ledgerMu_;
  std::vector<std::pair<rma::RmaComm*, uint32_t>> ledgers_;
};

rma::RmaComm* asComm(void* p, const char* what) {
  if (p == nullptr || !RmaState::get().live().contains(p) || static_cast<Object*>(p)->magic_ != rma::kCommMagic) {
    WEFT_WARN("RMA {}: {} is not a live weft RMA comm", what, p);
    return nullptr;
  }
  return fromHandle<rma::RmaComm>(p);
}

// The data path checks the magic word only (it runs for every operation); set-up checks the live set.
rma::Context* asContext(void* p) {
  auto* o = static_cast<Object*>(p);
  if (o == nullptr || o->magic_ != rma::kContextMagic) return nullptr;
  return static_cast<rma::Context*>(o);
}

rma::Window* asWindow(void* p) {
  auto* o = static_cast<Object*>(p);
  if (o == nullptr || o->magic_ != rma::kWindowMagic) return nullptr;
  return static_cast<rma::Window*>(o);
}

// GIN v11/v12 have no contexts in proxy mode: a comm carries a block made at connect (v12: one a connection).
struct DefaultContexts {
  std::mutex mu;
  std::vector<std::pair<rma::RmaComm*, rma::Context*>> of;
  rma::Context* find(rma::RmaComm* c) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [comm, ctx] : of) {
      if (comm == c) return ctx;
    }
    return nullptr;
  }
};
DefaultContexts& defaults() {
  static DefaultContexts* d = new DefaultContexts;
  return *d;
}

// ---- one implementation ------------------------------------------------------------------------------------------

ncclResult_t initImpl(void** ctx, uint64_t commId, ncclDebugLogger_t logger) {
  return guarded("RMA init", [&] {
    Status st = Engine::instance().init(logger);
    if (st != Status::kOk) return st;
    RmaState::get().transport();
    if (ctx != nullptr) {
      auto* init = new RmaInit{commId};
      RmaState::get().live().add(init);
      *ctx = init;
    }
    return Status::kOk;
  });
}

ncclResult_t devicesImpl(int* ndev) {
  return guarded("RMA devices", [&] {
    if (ndev == nullptr) return Status::kInternal;
    rma::RmaTransport* t = RmaState::get().transport();
    *ndev = t != nullptr ? t->deviceCount() : 0;
    return Status::kOk;
  });
}

template <typename P>
ncclResult_t getPropertiesImpl(int dev, P* props) {
  return guarded("RMA getProperties", [&] {
    rma::RmaTransport* t = RmaState::get().transport();
    if (t == nullptr || props == nullptr || dev < 0 || dev >= t->deviceCount()) {
      WEFT_WARN("RMA getProperties: no device {} ({})", dev, t == nullptr ? RmaState::get().declined() : "out of range");
      return Status::kInternal;
    }
    // GPU memory: the TCP transport reaches it through the driver's copies; libfabric where the provider does (FI_HMEM).
    // maxRecvs: NCCL's proxy keeps at most 32 x maxRecvs operations per context and rank.
    fillDeviceProps(t->props(dev), dev, props);
    props->netDeviceType = static_cast<ncclNetDeviceType>(NCCL_NET_DEVICE_GIN_PROXY);
    props->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
    return Status::kOk;
  });
}

ncclResult_t listenImpl(int dev, void* handle, void** listenComm) {
  return guarded("RMA listen", [&] {
    rma::RmaTransport* t = RmaState::get().transport();
    if (t == nullptr || handle == nullptr || listenComm == nullptr) return Status::kInternal;
    rma::RmaListen* l = nullptr;
    Status st = t->listen(dev, handle, &l);
    if (st != Status::kOk) return st;
    RmaState::get().live().add(toHandle(l));
    *listenComm = toHandle(l);
    return Status::kOk;
  });
}

ncclResult_t connectImpl(void* ctx, void** handles, int nranks, int rank, void* listenComm, void** collComm,
                         int defaultContexts) {
  return guarded("RMA connect", [&] {
    rma::RmaTransport* t = RmaState::get().transport();
    if (t == nullptr || collComm == nullptr || listenComm == nullptr || !RmaState::get().live().contains(listenComm)) {
      WEFT_WARN("RMA connect: {} is not a live weft RMA listen comm", listenComm);
      return Status::kInternal;
    }
    // NCCL hands connect the context of its init call, or (2.30's host RMA path) its net plugin's: only ours says
    // which communicator this is.
    uint64_t commId = 0;
    if (ctx != nullptr && RmaState::get().live().contains(ctx)) commId = static_cast<RmaInit*>(ctx)->commId;
    rma::RmaComm* comm = nullptr;
    Status st = t->connect(handles, nranks, rank, fromHandle<rma::RmaListen>(listenComm), commId, &comm);
    if (st != Status::kOk) return st;
    if (defaultContexts > 0) {
      rma::Context* c = nullptr;
      if (Status s = comm->createContext(defaultContexts, {}, &c); s != Status::kOk) {
        comm->close();
        return s;
      }
      std::lock_guard<std::mutex> lock(defaults().mu);
      defaults().of.push_back({comm, c});
    }
    RmaState::get().live().add(toHandle(comm));
    RmaState::get().openLedger(comm, t->props(fromHandle<rma::RmaListen>(listenComm)->dev()).name);
    *collComm = toHandle(comm);
    return Status::kOk;
  });
}

ncclResult_t createContextImpl(void* collComm, int nContexts, std::vector<int> peers, void** out) {
  return guarded("RMA createContext", [&] {
    rma::RmaComm* comm = asComm(collComm, "createContext");
    if (comm == nullptr || out == nullptr) return Status::kInternal;
    rma::Context* c = nullptr;
    Status st = comm->createContext(nContexts, std::move(peers), &c);
    if (st != Status::kOk) return st;
    RmaState::get().live().add(c);
    *out = c;
    return Status::kOk;
  });
}

ncclResult_t destroyContextImpl(void* rmaCtx) {
  return guarded("RMA destroyContext", [&] {
    if (rmaCtx == nullptr) return Status::kOk;
    if (!RmaState::get().live().remove(rmaCtx)) {
      WEFT_WARN("RMA destroyContext: {} is not a live weft RMA context", rmaCtx);
      return Status::kInternal;
    }
    auto* c = static_cast<rma::Context*>(rmaCtx);
    return static_cast<rma::RmaComm*>(c->comm)->destroyContext(c);
  });
}

ncclResult_t regMrSymImpl(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, int fd, void** mhandle,
                          void** ginHandle) {
  return guarded("RMA regMrSym", [&] {
    rma::RmaComm* comm = asComm(collComm, "regMrSym");
    if (comm == nullptr || mhandle == nullptr) return Status::kInternal;
    rma::Window* w = nullptr;
    Status st = comm->regMrSym(data, size, type, mrFlags, fd, &w);
    if (st != Status::kOk) return st;
    *mhandle = w;
    if (ginHandle != nullptr) *ginHandle = w;
    return Status::kOk;
  });
}

ncclResult_t deregMrSymImpl(void* collComm, void* mhandle) {
  return guarded("RMA deregMrSym", [&] {
    rma::RmaComm* comm = asComm(collComm, "deregMrSym");
    if (comm == nullptr) return Status::kInternal;
    return comm->deregMrSym(static_cast<rma::Window*>(mhandle));
  });
}

ncclResult_t closeCollImpl(void* collComm) {
  return guarded("RMA closeColl", [&] {
    rma::RmaComm* comm = asComm(collComm, "closeColl");
    if (comm == nullptr) return Status::kInternal;
    RmaState::get().live().remove(toHandle(comm));
    RmaState::get().closeLedger(comm);  // no dump reads it once this returns
    {
      std::lock_guard<std::mutex> lock(defaults().mu);
      auto& of = defaults().of;
      for (auto it = of.begin(); it != of.end(); ++it) {
        if (it->first == comm) {
          comm->destroyContext(it->second);
          of.erase(it);
          break;
        }
      }
    }
    comm->close();
    return Status::kOk;
  });
}

ncclResult_t closeListenImpl(void* listenComm) {
  return guarded("RMA closeListen", [&] {
    if (listenComm == nullptr || !RmaState::get().live().remove(listenComm)) {
      WEFT_WARN("RMA closeListen: {} is not a live weft RMA listen comm", listenComm);
      return Status::kInternal;
    }
    delete fromHandle<rma::RmaListen>(listenComm);
    return Status::kOk;
  });
}

rma::RmaComm* commOfContext(rma::Context* c) { return c != nullptr ? static_cast<rma::RmaComm*>(c->comm) : nullptr; }

ncclResult_t iputImpl(rma::Context* c, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff,
                      void* dstMh, uint32_t rank, const rma::Signal* signal, uint32_t optFlags, void** request) {
  return guarded(signal ? "RMA iputSignal" : "RMA iput", [&] {
    rma::RmaComm* comm = commOfContext(c);
    if (comm == nullptr || comm->magic_ != rma::kCommMagic) {
      WEFT_WARN("RMA iput: {} is not a live weft RMA context", static_cast<void*>(c));
      return Status::kInternal;
    }
    return comm->iput(c, context, asWindow(srcMh), srcOff, size, asWindow(dstMh), dstOff, rank, signal, optFlags,
                      request);
  });
}

ncclResult_t iputSignalImpl(rma::Context* c, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff,
                            void* dstMh, uint32_t rank, uint64_t signalOff, void* signalMh, uint64_t signalValue,
                            uint32_t signalOp, bool strong, uint32_t optFlags, void** request) {
  rma::Signal s;
  s.window = asWindow(signalMh);
  s.off = signalOff;
  s.value = signalValue;
  s.op = signalOp == NCCL_NET_SIGNAL_OP_INC   ? rma::SignalOp::kInc
         : signalOp == NCCL_NET_SIGNAL_OP_ADD ? rma::SignalOp::kAdd
                                              : static_cast<rma::SignalOp>(0xff);
  s.strong = strong;
  return iputImpl(c, context, srcOff, srcMh, size, dstOff, dstMh, rank, &s, optFlags, request);
}

ncclResult_t igetImpl(rma::Context* c, int context, uint64_t remoteOff, void* remoteMh, size_t size,
                      uint64_t localOff, void* localMh, uint32_t rank, uint32_t optFlags, void** request) {
  return guarded("RMA iget", [&] {
    rma::RmaComm* comm = commOfContext(c);
    if (comm == nullptr || comm->magic_ != rma::kCommMagic) {
      WEFT_WARN("RMA iget: {} is not a live weft RMA context", static_cast<void*>(c));
      return Status::kInternal;
    }
    return comm->iget(c, context, asWindow(remoteMh), remoteOff, size, asWindow(localMh), localOff, rank, optFlags,
                      request);
  });
}

ncclResult_t iflushImpl(rma::Context* c, int context, void* mh, uint32_t rank, void** request) {
  return guarded("RMA iflush", [&] {
    rma::RmaComm* comm = commOfContext(c);
    if (comm == nullptr || comm->magic_ != rma::kCommMagic) {
      WEFT_WARN("RMA iflush: {} is not a live weft RMA context", static_cast<void*>(c));
      return Status::kInternal;
    }
    return comm->iflush(c, context, asWindow(mh), rank, request);
  });
}

ncclResult_t testImpl(void* collComm, void* request, int* done) {
  return guarded("RMA test", [&] {
    auto* comm = collComm != nullptr ? fromHandle<rma::RmaComm>(collComm) : nullptr;
    if (comm == nullptr || comm->magic_ != rma::kCommMagic || done == nullptr) {
      WEFT_WARN("RMA test: {} is not a live weft RMA comm", collComm);
      return Status::kInternal;
    }
    bool d = false;
    Status st = comm->test(request, &d);
    *done = d ? 1 : 0;
    return st;
  });
}

ncclResult_t progressImpl(rma::RmaComm* comm) {
  return guarded("RMA progress", [&] {
    if (comm == nullptr || comm->magic_ != rma::kCommMagic) return Status::kInternal;
    return comm->progress();
  });
}

ncclResult_t queryLastErrorImpl(void* ctxOrComm, bool* hasError) {
  return guarded("RMA queryLastError", [&] {
    if (hasError == nullptr) return Status::kInternal;
    auto* o = static_cast<Object*>(ctxOrComm);
    rma::RmaComm* comm = nullptr;
    if (o != nullptr && o->magic_ == rma::kContextMagic) comm = commOfContext(static_cast<rma::Context*>(o));
    if (o != nullptr && o->magic_ == rma::kCommMagic) comm = fromHandle<rma::RmaComm>(ctxOrComm);
    if (comm == nullptr) {
      WEFT_WARN("RMA queryLastError: {} is neither a weft RMA context nor comm", ctxOrComm);
      return Status::kInternal;
    }
    *hasError = comm->hasError(nullptr);
    return Status::kOk;
  });
}

ncclResult_t finalizeImpl(void* ctx) {
  return guarded("RMA finalize", [&] {
    if (ctx != nullptr && RmaState::get().live().remove(ctx)) delete static_cast<RmaInit*>(ctx);
    return Status::kOk;
  });
}

// The default block of a GIN v11/v12 comm.
rma::Context* defaultContext(void* collComm) {
  auto* comm = collComm != nullptr ? fromHandle<rma::RmaComm>(collComm) : nullptr;
  if (comm == nullptr || comm->magic_ != rma::kCommMagic) return nullptr;
  return defaults().find(comm);
}

ncclNetDeviceHandle_v11_t* proxyDeviceHandle() {
  static ncclNetDeviceHandle_v11_t h{static_cast<ncclNetDeviceType>(NCCL_NET_DEVICE_GIN_PROXY),
                                     NCCL_NET_DEVICE_INVALID_VERSION, nullptr, 0, 1};
  return &h;
}

// ---- GIN v11 / v12 (NCCL 2.28-2.29, proxy mode) -------------------------------------------------------------------------

ncclResult_t ginCreateContextNoDevice(const char* table) {
  WEFT_WARN("GIN {} createContext: weft offers NCCL's device API through its CPU proxy only (its devices report "
            "GIN_PROXY); a device-side context is not available",
            table);
  return ncclInvalidUsage;
}

ncclResult_t ginV11Init(void** ctx, uint64_t commId, ncclDebugLogger_t l) { return initImpl(ctx, commId, l); }
ncclResult_t ginV11Connect(void* ctx, void* handles[], int nranks, int rank, void* listenComm, void** collComm) {
  return connectImpl(ctx, handles, nranks, rank, listenComm, collComm, 1);
}
ncclResult_t ginV11CreateContext(void*, int, int, void**, ncclNetDeviceHandle_v11_t**) {
  return ginCreateContextNoDevice("v11");
}
ncclResult_t ginV11RegMrSym(void* c, void* data, size_t size, int type, uint64_t flags, void** mh, void** gh) {
  return regMrSymImpl(c, data, size, type, flags, -1, mh, gh);
}
ncclResult_t ginV11RegMrSymDmaBuf(void* c, void* data, size_t size, int type, uint64_t, int fd, uint64_t flags,
                                  void** mh, void** gh) {
  return regMrSymImpl(c, data, size, type, flags, fd, mh, gh);
}
ncclResult_t ginV11Iput(void* c, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff, void* dstMh,
                        uint32_t rank, void** request) {
  return iputImpl(defaultContext(c), 0, srcOff, srcMh, size, dstOff, dstMh, rank, nullptr, 0, request);
}
ncclResult_t ginV11IputSignal(void* c, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff, void* dstMh,
                              uint32_t rank, uint64_t sigOff, void* sigMh, uint64_t sigVal, uint32_t sigOp,
                              void** request) {
  return iputSignalImpl(defaultContext(c), 0, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, sigVal, sigOp,
                        true, 0, request);
}
ncclResult_t ginV11Progress(void* c) { return progressImpl(c != nullptr ? fromHandle<rma::RmaComm>(c) : nullptr); }

ncclResult_t ginV12Connect(void* ctx, void* handles[], int nranks, int rank, int nConnections, int /*queueDepth*/,
                           void* listenComm, void** collComm) {
  return connectImpl(ctx, handles, nranks, rank, listenComm, collComm, nConnections > 0 ? nConnections : 1);
}
ncclResult_t ginV12CreateContext(void*, int, int, int, void**, ncclNetDeviceHandle_v11_t**) {
  return ginCreateContextNoDevice("v12");
}
ncclResult_t ginV12Iput(void* c, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff, void* dstMh,
                        uint32_t rank, int connectionId, void** request) {
  return iputImpl(defaultContext(c), connectionId, srcOff, srcMh, size, dstOff, dstMh, rank, nullptr, 0, request);
}
ncclResult_t ginV12IputSignal(void* c, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff, void* dstMh,
                              uint32_t rank, uint64_t sigOff, void* sigMh, uint64_t sigVal, uint32_t sigOp,
                              int connectionId, void** request) {
  return iputSignalImpl(defaultContext(c), connectionId, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh,
                        sigVal, sigOp, true, 0, request);
}

// ---- GIN v13 = RMA v13 (NCCL 2.30.3-2.30.4 as GIN, 2.30.7 as RMA) --------------------------------------------------------

ncclResult_t connectV13(void* ctx, void* handles[], int nranks, int rank, void* listenComm, void** collComm) {
  return connectImpl(ctx, handles, nranks, rank, listenComm, collComm, 0);
}
ncclResult_t v13CreateContext(void* collComm, ncclGinConfig_v13_t* config, void** ginCtx,
                              ncclNetDeviceHandle_v11_t** devHandle) {
  if (config == nullptr) return ncclInternalError;
  ncclResult_t r = createContextImpl(collComm, config->nContexts, {}, ginCtx);
  if (r == ncclSuccess && devHandle != nullptr) *devHandle = proxyDeviceHandle();
  return r;
}
ncclResult_t v13Iput(void* ctx, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff, void* dstMh,
                     uint32_t rank, void** request) {
  return iputImpl(asContext(ctx), context, srcOff, srcMh, size, dstOff, dstMh, rank, nullptr, 0, request);
}
ncclResult_t v13IputSignal(void* ctx, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff,
                           void* dstMh, uint32_t rank, uint64_t sigOff, void* sigMh, uint64_t sigVal, uint32_t sigOp,
                           void** request) {
  // All v13 signals are strong.
  return iputSignalImpl(asContext(ctx), context, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, sigVal,
                        sigOp, true, 0, request);
}
ncclResult_t v13Iget(void* ctx, int context, uint64_t remoteOff, void* remoteMh, size_t size, uint64_t localOff,
                     void* localMh, uint32_t rank, void** request) {
  return igetImpl(asContext(ctx), context, remoteOff, remoteMh, size, localOff, localMh, rank, 0, request);
}
ncclResult_t ctxIflush(void* ctx, int context, void* mh, uint32_t rank, void** request) {
  return iflushImpl(asContext(ctx), context, mh, rank, request);
}
ncclResult_t ctxProgress(void* ctx) {
  rma::Context* c = asContext(ctx);
  return progressImpl(c != nullptr ? commOfContext(c) : nullptr);
}

// ---- RMA v14 .. v17 ----------------------------------------------------------------------------------------------------

std::vector<int> stridePeers(void* collComm, int stride) {
  std::vector<int> peers;
  auto* comm = collComm != nullptr ? fromHandle<rma::RmaComm>(collComm) : nullptr;
  if (comm == nullptr || comm->magic_ != rma::kCommMagic || stride <= 1) return peers;
  for (int i = 0; i < comm->nranks(); i += stride) peers.push_back((comm->rank() + i) % comm->nranks());
  return peers;
}
ncclResult_t v14CreateContext(void* collComm, ncclRmaConfig_v14_t* config, void** rmaCtx) {
  if (config == nullptr) return ncclInternalError;
  auto* comm = collComm != nullptr ? fromHandle<rma::RmaComm>(collComm) : nullptr;
  if (config->rankStride < 0 ||
      (config->rankStride > 0 && comm != nullptr && comm->magic_ == rma::kCommMagic &&
       comm->nranks() % config->rankStride != 0)) {
    WEFT_WARN("RMA createContext: rank stride {} does not divide the communicator's ranks", config->rankStride);
    return ncclInternalError;
  }
  return createContextImpl(collComm, config->nContexts, stridePeers(collComm, config->rankStride), rmaCtx);
}
ncclResult_t v17CreateContext(void* collComm, ncclRmaConfig_v17_t* config, void** rmaCtx) {
  if (config == nullptr || config->peerArrayCount < 0 || (config->peerArrayCount > 0 && config->peerArray == nullptr)) {
    WEFT_WARN("RMA createContext: a peer list of {} entries at {}", config ? config->peerArrayCount : -1,
              config ? static_cast<void*>(config->peerArray) : nullptr);
    return ncclInternalError;
  }
  return createContextImpl(collComm, config->nContexts,
                           std::vector<int>(config->peerArray, config->peerArray + config->peerArrayCount), rmaCtx);
}
ncclResult_t regMrSymNoGin(void* c, void* data, size_t size, int type, uint64_t flags, void** mh) {
  return regMrSymImpl(c, data, size, type, flags, -1, mh, nullptr);
}
ncclResult_t regMrSymDmaBufNoGin(void* c, void* data, size_t size, int type, uint64_t, int fd, uint64_t flags,
                                 void** mh) {
  return regMrSymImpl(c, data, size, type, flags, fd, mh, nullptr);
}
ncclResult_t v14IputSignal(void* ctx, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff,
                           void* dstMh, uint32_t rank, uint64_t sigOff, void* sigMh, uint64_t sigVal, uint32_t sigOp,
                           bool strong, void** request) {
  return iputSignalImpl(asContext(ctx), context, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, sigVal,
                        sigOp, strong, 0, request);
}
ncclResult_t v15Iput(void* ctx, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff, void* dstMh,
                     uint32_t rank, uint32_t optFlags, void** request) {
  return iputImpl(asContext(ctx), context, srcOff, srcMh, size, dstOff, dstMh, rank, nullptr, optFlags, request);
}
ncclResult_t v15IputSignal(void* ctx, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff,
                           void* dstMh, uint32_t rank, uint64_t sigOff, void* sigMh, uint64_t sigVal, uint32_t sigOp,
                           bool strong, uint32_t optFlags, void** request) {
  return iputSignalImpl(asContext(ctx), context, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, sigVal,
                        sigOp, strong, optFlags, request);
}
ncclResult_t v15Iget(void* ctx, int context, uint64_t remoteOff, void* remoteMh, size_t size, uint64_t localOff,
                     void* localMh, uint32_t rank, uint32_t optFlags, void** request) {
  return igetImpl(asContext(ctx), context, remoteOff, remoteMh, size, localOff, localMh, rank, optFlags, request);
}
ncclResult_t getRmaProperties(void* collComm, ncclRmaProperties_v16_t* props) {
  return guarded("RMA getRmaProperties", [&] {
    rma::RmaComm* comm = asComm(collComm, "getRmaProperties");
    if (comm == nullptr || props == nullptr) return Status::kInternal;
    props->flushesAllPutsOnAnySignal = comm->flushesAllPutsOnAnySignal();
    return Status::kOk;
  });
}

template <typename P>
ncclResult_t getProps(int dev, P* props) {
  return getPropertiesImpl(dev, props);
}
ncclResult_t listenAny(void*, int dev, void* handle, void** listenComm) { return listenImpl(dev, handle, listenComm); }

}  // namespace
}  // namespace weft

using namespace weft;

extern "C" {

__attribute__((visibility("default"))) ncclGin_v11_t ncclGinPlugin_v11 = {
    "weft", ginV11Init, devicesImpl, getProps<ncclNetProperties_v11_t>, listenAny, ginV11Connect, ginV11CreateContext,
    ginV11RegMrSym, ginV11RegMrSymDmaBuf, deregMrSymImpl, destroyContextImpl, closeCollImpl, closeListenImpl,
    ginV11Iput, ginV11IputSignal, testImpl, ginV11Progress, queryLastErrorImpl, finalizeImpl};

__attribute__((visibility("default"))) ncclGin_v12_t ncclGinPlugin_v12 = {
    "weft", ginV11Init, devicesImpl, getProps<ncclNetProperties_v11_t>, listenAny, ginV12Connect, ginV12CreateContext,
    ginV11RegMrSym, ginV11RegMrSymDmaBuf, deregMrSymImpl, destroyContextImpl, closeCollImpl, closeListenImpl,
    ginV12Iput, ginV12IputSignal, testImpl, ginV11Progress, queryLastErrorImpl, finalizeImpl};

__attribute__((visibility("default"))) ncclGin_v13_t ncclGinPlugin_v13 = {
    "weft", ginV11Init, devicesImpl, getProps<ncclNetProperties_v12_t>, listenAny, connectV13, v13CreateContext,
    ginV11RegMrSym, ginV11RegMrSymDmaBuf, deregMrSymImpl, destroyContextImpl, closeCollImpl, closeListenImpl, v13Iput,
    v13IputSignal, v13Iget, ctxIflush, testImpl, ctxProgress, queryLastErrorImpl, finalizeImpl};

__attribute__((visibility("default"))) ncclRma_v13_t ncclRmaPlugin_v13 = ncclGinPlugin_v13;

__attribute__((visibility("default"))) ncclRma_v14_t ncclRmaPlugin_v14 = {
    "weft", ginV11Init, devicesImpl, getProps<ncclNetProperties_v12_t>, listenAny, connectV13, v14CreateContext,
    regMrSymNoGin, regMrSymDmaBufNoGin, deregMrSymImpl, destroyContextImpl, closeCollImpl, closeListenImpl, v13Iput,
    v14IputSignal, v13Iget, ctxIflush, testImpl, ctxProgress, queryLastErrorImpl, finalizeImpl};

__attribute__((visibility("default"))) ncclRma_v15_t ncclRmaPlugin_v15 = {
    "weft", ginV11Init, devicesImpl, getProps<ncclNetProperties_v12_t>, listenAny, connectV13, v14CreateContext,
    regMrSymNoGin, regMrSymDmaBufNoGin, deregMrSymImpl, destroyContextImpl, closeCollImpl, closeListenImpl, v15Iput,
    v15IputSignal, v15Iget, ctxIflush, testImpl, ctxProgress, queryLastErrorImpl, finalizeImpl};

__attribute__((visibility("default"))) ncclRma_v16_t ncclRmaPlugin_v16 = {
    "weft", ginV11Init, devicesImpl, getRmaProperties, getProps<ncclNetProperties_v12_t>, listenAny, connectV13,
    v14CreateContext, regMrSymNoGin, regMrSymDmaBufNoGin, deregMrSymImpl, destroyContextImpl, closeCollImpl,
    closeListenImpl, v15Iput, v15IputSignal, v15Iget, ctxIflush, testImpl, ctxProgress, queryLastErrorImpl,
    finalizeImpl};

__attribute__((visibility("default"))) ncclRma_v17_t ncclRmaPlugin_v17 = {
    "weft", ginV11Init, devicesImpl, getRmaProperties, getProps<ncclNetProperties_v12_t>, listenAny, connectV13,
    v17CreateContext, regMrSymNoGin, regMrSymDmaBufNoGin, deregMrSymImpl, destroyContextImpl, closeCollImpl,
    closeListenImpl, v15Iput, v15IputSignal, v15Iget, ctxIflush, testImpl, ctxProgress, queryLastErrorImpl,
    finalizeImpl};

}  // extern "C"
