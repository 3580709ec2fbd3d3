// SPDX-License-Identifier: Apache-2.0
#include "plugin_loader.h"

#include "weft/nccl/profiler.h"

#include <dlfcn.h>

#include <atomic>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>
#include <type_traits>

namespace weft::harness {

namespace {
std::atomic<int> gWarnings{0};
std::atomic<bool> gVerbose{false};
std::mutex gLastMutex;
std::string gLast;
std::deque<std::string> gAll;  // the warnings so far, the last kKeep (guarded by gLastMutex)
constexpr size_t kKeep = 1024;

// NCCL's ncclProfilerCallback as it behaves with a profiler that asks for net-plugin events
// (docs/nccl-semantics.md §net-events): start (0) dereferences pHandle (so a NULL one is a crash in NCCL: counted here) and writes an event handle; stop (1)
// stops whatever handle it is given; 2 and 3 (2.27+) update / update-and-stop. Every event must be stopped once.
std::mutex gNetEvMutex;
std::set<uintptr_t> gNetEvOpen;
NetEventStats gNetEv;
uintptr_t gNetEvNext = 0x1000;

ncclResult_t profilerCallback(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData) {
  std::lock_guard<std::mutex> lock(gNetEvMutex);
  if (type == 0) {
    if (pHandle == nullptr) {
      ++gNetEv.nullPhandleStarts;
      return ncclSuccess;
    }
    if (eHandle == nullptr) {
      ++gNetEv.badStops;
      return ncclSuccess;
    }
    uintptr_t h = gNetEvNext += 16;
    gNetEvOpen.insert(h);
    *eHandle = reinterpret_cast<void*>(h);
    ++gNetEv.started;
    uint32_t netType = static_cast<uint32_t>(pluginId) & NCCL_PROFILER_NET_TYPE_MASK;
    if (netType == WEFT_PROFILER_NET_TYPE && extData != nullptr)
      gNetEv.weftBytes += static_cast<const weftProfilerNetDescr_v1_t*>(extData)->length;
    return ncclSuccess;
  }
  if (type == 1 || type == 3) {
    uintptr_t h = eHandle != nullptr ? reinterpret_cast<uintptr_t>(*eHandle) : 0;
    if (h == 0) return ncclSuccess;  // NCCL forwards stopEvent(NULL); harmless
    if (gNetEvOpen.erase(h) == 0) ++gNetEv.badStops;
    else ++gNetEv.stopped;
  }
  return ncclSuccess;
}

// Per-step tokens NCCL passes as pHandle (2.27+: &sub->pHandles[step % NCCL_STEPS]).
struct ProxyEventHandle {
  void* stepEventHandle;
  void* subArgPtr;
};
ProxyEventHandle gStepTokens[NCCL_PROXY_MAX_SUBS];

template <typename P>
void copyProps(const P& in, Props* out) {
  out->name = in.name ? in.name : "";
  out->pciPath = in.pciPath ? in.pciPath : "";
  out->guid = in.guid;
  out->ptrSupport = in.ptrSupport;
  out->speed = in.speed;
  out->port = in.port;
  out->latency = in.latency;
  out->maxComms = in.maxComms;
  out->maxRecvs = in.maxRecvs;
  if constexpr (requires { in.netDeviceType; }) {
    out->netDeviceType = in.netDeviceType;
    out->netDeviceVersion = in.netDeviceVersion;
  }
  if constexpr (requires { in.regIsGlobal; }) out->regIsGlobal = in.regIsGlobal;
  if constexpr (requires { in.forceFlush; }) {
    out->forceFlush = in.forceFlush;
    out->vNdevs = in.vProps.ndevs;
    constexpr int kCap = static_cast<int>(sizeof(in.vProps.devs) / sizeof(in.vProps.devs[0]));
    for (int i = 0; i < in.vProps.ndevs && i < kCap; ++i) out->vDevs.push_back(in.vProps.devs[i]);
    out->maxP2pBytes = in.maxP2pBytes;
    out->maxCollBytes = in.maxCollBytes;
  }
  if constexpr (requires { in.maxMultiRequestSize; }) out->maxMultiRequestSize = in.maxMultiRequestSize;
  if constexpr (requires { in.railId; }) {
    out->railId = in.railId;
    out->planeId = in.planeId;
  }
}

// One adapter per table version. V is the version number; T the table type; P its properties type.
template <int V, typename T, typename P>
class TableApi final : public NetApi {
 public:
  explicit TableApi(T* t) : t_(t) {}
  int version() const override { return V; }
  const char* name() const override { return t_->name; }

  ncclResult_t init(void** ctx, uint64_t commId) override {
    *ctx = nullptr;
    if constexpr (V >= 11) {
      config_.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF;
      return t_->init(ctx, commId, &config_, harnessLogger, profilerCallback);
    } else if constexpr (V == 10) {
      return t_->init(harnessLogger, profilerCallback);
    } else {
      return t_->init(harnessLogger);
    }
  }
  ncclResult_t finalize(void* ctx) override {
    if constexpr (V >= 11) {
      return t_->finalize(ctx);
    } else {
      return ncclSuccess;
    }
  }
  bool hasFinalize() const override { return V >= 11; }
  ncclResult_t devices(int* n) override { return t_->devices(n); }
  ncclResult_t getProperties(int dev, Props* p) override {
    P raw{};
    ncclResult_t r = t_->getProperties(dev, &raw);
    if (r == ncclSuccess) copyProps(raw, p);
    return r;
  }
  ncclResult_t listen(void* ctx, int dev, void* handle, void** lc) override {
    if constexpr (V >= 11) {
      return t_->listen(ctx, dev, handle, lc);
    } else {
      return t_->listen(dev, handle, lc);
    }
  }
  ncclResult_t connect(void* ctx, int dev, void* handle, void** sc) override {
    if constexpr (V >= 11) {
      ncclNetDeviceHandle_v7_t* dh = nullptr;
      return t_->connect(ctx, dev, handle, sc, &dh);
    } else if constexpr (V == 10) {
      ncclNetDeviceHandle_v7_t* dh = nullptr;
      ncclNetCommConfig_v10_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
      return t_->connect(dev, &cfg, handle, sc, &dh);
    } else if constexpr (V >= 7) {
      ncclNetDeviceHandle_v7_t* dh = nullptr;  // NCCL passes a pointer to a NULL handle for HOST devices
      return t_->connect(dev, handle, sc, &dh);
    } else {
      return t_->connect(dev, handle, sc);
    }
  }
  ncclResult_t accept(void* lc, void** rc) override {
    if constexpr (V >= 7) {
      ncclNetDeviceHandle_v7_t* dh = nullptr;
      return t_->accept(lc, rc, &dh);
    } else {
      return t_->accept(lc, rc);
    }
  }
  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mh) override {
    if constexpr (V <= 7) {
      if (size >= (size_t{1} << 31)) return ncclInternalError;  // what NCCL's shim does for v7
      return t_->regMr(comm, data, static_cast<int>(size), type, mh);
    } else {
      return t_->regMr(comm, data, size, type, mh);
    }
  }
  ncclResult_t deregMr(void* comm, void* mh) override { return t_->deregMr(comm, mh); }
  bool hasRegMrDmaBuf() const override { return t_->regMrDmaBuf != nullptr; }
  ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mh) override {
    if (t_->regMrDmaBuf == nullptr) return ncclInternalError;
    return t_->regMrDmaBuf(comm, data, size, type, offset, fd, mh);
  }
  ncclResult_t isend(void* sc, void* data, size_t size, int tag, void* mh, void** req) override {
    if constexpr (V >= 10) {
      return t_->isend(sc, data, size, tag, mh, &gStepTokens[0], req);
    } else if constexpr (V == 9) {
      return t_->isend(sc, data, size, tag, mh, req);
    } else {
      if (size > (size_t{1} << 30)) return ncclInternalError;  // NCCL's shim limit for int-sized tables
      return t_->isend(sc, data, static_cast<int>(size), tag, mh, req);
    }
  }
  ncclResult_t irecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void** req) override {
    if constexpr (V >= 10) {
      void* phandles[NCCL_PROXY_MAX_SUBS] = {};
      for (int i = 0; i < n && i < NCCL_PROXY_MAX_SUBS; ++i) phandles[i] = &gStepTokens[i];
      return t_->irecv(rc, n, data, sizes, tags, mhs, phandles, req);
    } else if constexpr (V == 9) {
      return t_->irecv(rc, n, data, sizes, tags, mhs, req);
    } else {
      int narrow[NCCL_PROXY_MAX_SUBS];
      for (int i = 0; i < n && i < NCCL_PROXY_MAX_SUBS; ++i) {
        if (sizes[i] > (size_t{1} << 30)) return ncclInternalError;
        narrow[i] = static_cast<int>(sizes[i]);
      }
      *req = nullptr;  // the v6-v8 shims clear the optional-completion hint
      return t_->irecv(rc, n, data, narrow, tags, mhs, req);
    }
  }
  ncclResult_t iflush(void* rc, int n, void** data, int* sizes, void** mhs, void** req) override {
    return t_->iflush(rc, n, data, sizes, mhs, req);
  }
  ncclResult_t test(void* req, int* done, int* sizes) override { return t_->test(req, done, sizes); }
  ncclResult_t closeSend(void* c) override { return t_->closeSend(c); }
  ncclResult_t closeRecv(void* c) override { return t_->closeRecv(c); }
  ncclResult_t closeListen(void* c) override { return t_->closeListen(c); }
  bool hasMakeVDevice() const override {
    if constexpr (V >= 9) {
      return t_->makeVDevice != nullptr;
    } else {
      return false;
    }
  }
  ncclResult_t makeVDevice(const std::vector<int>& devs, int* d) override {
    if constexpr (V >= 9) {
      decltype(P{}.vProps) vp{};
      constexpr int kCap = static_cast<int>(sizeof(vp.devs) / sizeof(vp.devs[0]));
      if (devs.empty() || static_cast<int>(devs.size()) > kCap || t_->makeVDevice == nullptr) return ncclInvalidUsage;
      vp.ndevs = static_cast<int>(devs.size());
      for (size_t i = 0; i < devs.size(); ++i) vp.devs[i] = devs[i];
      return t_->makeVDevice(d, &vp);
    } else {
      (void)devs;
      (void)d;
      return ncclInvalidUsage;
    }
  }
  bool hasIrecvConsumed() const override {
    if constexpr (V >= 7) {
      return t_->irecvConsumed != nullptr;
    } else {
      return false;
    }
  }
  ncclResult_t irecvConsumed(void* rc, int n, void* req) override {
    if constexpr (V >= 7) {
      if (t_->irecvConsumed != nullptr) return t_->irecvConsumed(rc, n, req);
    }
    return ncclSuccess;
  }
  bool hasSetNetAttr() const override {
    if constexpr (V >= 11) {
      return t_->setNetAttr != nullptr;
    } else {
      return false;
    }
  }
  ncclResult_t setNetAttr(void* ctx, ncclNetAttr_v11_t* attr) override {
    if constexpr (V >= 11) {
      if (t_->setNetAttr != nullptr) return t_->setNetAttr(ctx, attr);  // the v12 attr has the v11 layout
    }
    (void)ctx;
    (void)attr;
    return ncclSuccess;
  }

 private:
  T* t_;
  ncclNetCommConfig_v11_t config_{};
};

std::unique_ptr<NetApi> makeApi(void* sym, int v) {
  switch (v) {
    case 6: return std::make_unique<TableApi<6, ncclNet_v6_t, ncclNetProperties_v6_t>>(static_cast<ncclNet_v6_t*>(sym));
    case 7: return std::make_unique<TableApi<7, ncclNet_v7_t, ncclNetProperties_v7_t>>(static_cast<ncclNet_v7_t*>(sym));
    case 8: return std::make_unique<TableApi<8, ncclNet_v8_t, ncclNetProperties_v8_t>>(static_cast<ncclNet_v8_t*>(sym));
    case 9: return std::make_unique<TableApi<9, ncclNet_v9_t, ncclNetProperties_v9_t>>(static_cast<ncclNet_v9_t*>(sym));
    case 10:
      return std::make_unique<TableApi<10, ncclNet_v10_t, ncclNetProperties_v10_t>>(static_cast<ncclNet_v10_t*>(sym));
    case 11:
      return std::make_unique<TableApi<11, ncclNet_v11_t, ncclNetProperties_v11_t>>(static_cast<ncclNet_v11_t*>(sym));
    case 12:
      return std::make_unique<TableApi<12, ncclNet_v12_t, ncclNetProperties_v12_t>>(static_cast<ncclNet_v12_t*>(sym));
  }
  return nullptr;
}

}  // namespace

NetEventStats netEventStats() {
  std::lock_guard<std::mutex> lock(gNetEvMutex);
  NetEventStats s = gNetEv;
  s.open = gNetEvOpen.size();
  return s;
}

void resetNetEventStats() {
  std::lock_guard<std::mutex> lock(gNetEvMutex);
  gNetEv = NetEventStats{};
  gNetEvOpen.clear();
}

void setVerbose(bool v) { gVerbose = v; }
int warningCount() { return gWarnings.load(); }
std::vector<std::string> warningsSince(int count) {
  std::lock_guard<std::mutex> lock(gLastMutex);
  const int total = gWarnings.load();
  const int first = total - static_cast<int>(gAll.size());  // index of gAll's front
  std::vector<std::string> out;
  for (int i = std::max(count, first); i < total && i - first < static_cast<int>(gAll.size()); ++i) {
    out.push_back(gAll[static_cast<size_t>(i - first)]);
  }
  return out;
}

std::string lastWarning() {
  std::lock_guard<std::mutex> lock(gLastMutex);
  return gLast;
}

void harnessLogger(ncclDebugLogLevel level, unsigned long, const char* file, int line, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (level == NCCL_LOG_WARN) {
    std::lock_guard<std::mutex> lock(gLastMutex);
    ++gWarnings;  // under the lock: warningsSince maps counts to gAll
    gLast = buf;
    gAll.push_back(buf);
    if (gAll.size() > kKeep) gAll.pop_front();
  }
  if (level == NCCL_LOG_WARN || gVerbose) {
    std::fprintf(stderr, "[plugin %s] %s:%d %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", file ? file : "?", line,
                 buf);
  }
}

std::unique_ptr<LoadedPlugin> LoadedPlugin::open(const std::string& path, int version, std::string* error) {
  auto p = std::unique_ptr<LoadedPlugin>(new LoadedPlugin());
  p->path_ = path;
  dlerror();
  p->lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  // As NCCL resolves NCCL_NET_PLUGIN (src/plugin/plugin_open.cc): a name that is neither a path nor a library file
  // name ("weft") is tried next as libnccl-net-<name>.so, found on the loader's default path.
  const bool libFile = path.size() > 6 && path.compare(0, 3, "lib") == 0 && path.compare(path.size() - 3, 3, ".so") == 0;
  if (p->lib_ == nullptr && !path.empty() && path.find('/') == std::string::npos && !libFile) {
    const std::string byName = "libnccl-net-" + path + ".so";
    dlerror();
    p->lib_ = dlopen(byName.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (p->lib_ != nullptr) p->path_ = byName;
  }
  if (p->lib_ == nullptr) {
    const char* e = dlerror();
    *error = path + " cannot be loaded as a shared library (RTLD_NOW|RTLD_LOCAL, as NCCL does): " + (e ? e : "?");
    return nullptr;
  }
  for (int v = 12; v >= 6; --v) {
    if (dlsym(p->lib_, ("ncclNetPlugin_v" + std::to_string(v)).c_str()) != nullptr) p->exported_.push_back(v);
  }
  if (p->exported_.empty()) {
    *error = path + " is not an NCCL net plugin: it exports none of ncclNetPlugin_v6 ... ncclNetPlugin_v12";
    return nullptr;
  }
  int v = version == 0 ? p->exported_.front() : version;
  void* sym = dlsym(p->lib_, ("ncclNetPlugin_v" + std::to_string(v)).c_str());
  if (sym == nullptr) {
    std::string list;
    for (int e : p->exported_) list += (list.empty() ? "v" : ", v") + std::to_string(e);
    *error = path + " does not export ncclNetPlugin_v" + std::to_string(v) + " (it exports " + list + ")";
    return nullptr;
  }
  p->stat_ = reinterpret_cast<int (*)(const char*, long long*)>(dlsym(p->lib_, "weftNetStat"));
  p->api_ = makeApi(sym, v);
  if (p->api_->name() == nullptr) {
    *error = path + ": ncclNetPlugin_v" + std::to_string(v) + ".name is NULL (NCCL reads it before init)";
    return nullptr;
  }
  return p;
}

bool LoadedPlugin::stat(const char* key, long long* value) const {
  return stat_ != nullptr && stat_(key, value) == 0;
}

LoadedPlugin::~LoadedPlugin() {
  api_.reset();
  // Never dlclose: a plugin built with -z nodelete stays anyway, and others may have threads running.
}

}  // namespace weft::harness
