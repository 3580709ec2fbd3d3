// SPDX-License-Identifier: Apache-2.0
// Loads any NCCL net plugin file the way NCCL does (dlopen RTLD_NOW|RTLD_LOCAL, newest ncclNetPlugin_vN first)
// and presents every table version through one interface, converting argument types the way NCCL's own
// version shims do. The conformance checks and `weft bench` drive plugins only through this.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/nccl/net.h"

namespace weft::harness {

struct Props {
  std::string name;
  std::string pciPath;
  uint64_t guid = 0;
  int ptrSupport = 0, speed = 0, port = 0, maxComms = 0, maxRecvs = 0;
  float latency = 0;
  int netDeviceType = -1, netDeviceVersion = -1;  // v7+
  int regIsGlobal = -1;                            // v8+
  int forceFlush = -1, vNdevs = -1;                // v9+
  std::vector<int> vDevs;                          // v9+: vProps.devs[0..vNdevs)
  size_t maxP2pBytes = 0, maxCollBytes = 0;        // v9+
  int maxMultiRequestSize = -1;                    // v11+
  int railId = -2, planeId = -2;                   // v12
};

class NetApi {
 public:
  virtual ~NetApi() = default;
  virtual int version() const = 0;
  virtual const char* name() const = 0;
  // ctx is written for v11+ (per-communicator init) and left NULL before.
  virtual ncclResult_t init(void** ctx, uint64_t commId) = 0;
  virtual ncclResult_t finalize(void* ctx) = 0;  // success and nothing for tables without finalize
  virtual bool hasFinalize() const = 0;
  virtual ncclResult_t devices(int* n) = 0;
  virtual ncclResult_t getProperties(int dev, Props* p) = 0;
  virtual ncclResult_t listen(void* ctx, int dev, void* handle, void** listenComm) = 0;
  virtual ncclResult_t connect(void* ctx, int dev, void* handle, void** sendComm) = 0;
  virtual ncclResult_t accept(void* listenComm, void** recvComm) = 0;
  virtual ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mh) = 0;
  virtual ncclResult_t deregMr(void* comm, void* mh) = 0;
  // GPU memory by DMA-BUF fd (v6+; NCCL calls it only where ptrSupport has NCCL_PTR_DMABUF).
  virtual bool hasRegMrDmaBuf() const = 0;
  virtual ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                   void** mh) = 0;
  virtual ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mh, void** req) = 0;
  virtual ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhs,
                             void** req) = 0;
  virtual ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhs, void** req) = 0;
  virtual ncclResult_t test(void* req, int* done, int* sizes) = 0;
  virtual ncclResult_t closeSend(void* c) = 0;
  virtual ncclResult_t closeRecv(void* c) = 0;
  virtual ncclResult_t closeListen(void* c) = 0;
  // NIC fusion (v9+): NCCL calls it during topology detection, before any comm exists.
  virtual bool hasMakeVDevice() const = 0;
  virtual ncclResult_t makeVDevice(const std::vector<int>& devs, int* d) = 0;
  virtual bool hasIrecvConsumed() const = 0;
  virtual ncclResult_t irecvConsumed(void* recvComm, int n, void* req) = 0;
  // v11+: optional (NCCL checks for NULL) per-context hints, at connect and before transfers.
  virtual bool hasSetNetAttr() const = 0;
  virtual ncclResult_t setNetAttr(void* ctx, ncclNetAttr_v11_t* attr) = 0;
};

// What the plugin did with the profiler callback the loader hands to v10+ init (the harness plays NCCL with a
// profiler that asks for net-plugin events).
struct NetEventStats {
  uint64_t started = 0, stopped = 0, open = 0;
  uint64_t nullPhandleStarts = 0;  // a start with pHandle NULL: NCCL would crash
  uint64_t badStops = 0;           // a stop of an event never started, or stopped twice
  uint64_t weftBytes = 0;          // lengths in weft's own descriptors
};
NetEventStats netEventStats();
void resetNetEventStats();

class LoadedPlugin {
 public:
  // version 0: the newest table the file exports, as NCCL would pick it.
  static std::unique_ptr<LoadedPlugin> open(const std::string& path, int version, std::string* error);
  ~LoadedPlugin();
  NetApi& api() { return *api_; }
  const std::vector<int>& exported() const { return exported_; }
  const std::string& path() const { return path_; }
  // A figure the plugin reports about itself through weft's optional `weftNetStat` export (not NCCL's ABI);
  // false where the plugin has no such export or does not know the key.
  bool stat(const char* key, long long* value) const;

 private:
  void* lib_ = nullptr;
  int (*stat_)(const char*, long long*) = nullptr;
  std::string path_;
  std::vector<int> exported_;
  std::unique_ptr<NetApi> api_;
};

// Logger handed to plugins: counts warnings (checks use it to prove an error was explained) and prints them
// when WEFT_TEST_VERBOSE is set, or always for warnings.
void harnessLogger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...);
int warningCount();
std::string lastWarning();
// The warnings logged after the first `count` (warningCount() before), as far as the last 1,024 reach.
std::vector<std::string> warningsSince(int count);
void setVerbose(bool v);

}  // namespace weft::harness
