// SPDX-License-Identifier: Apache-2.0
// Any plugin file's device-API proxy table (ncclGinPlugin_v11..v13, ncclRmaPlugin_v13..v17, or a data symbol such as
// NCCL's own ncclGinIbProxy), called the way NCCL's proxy calls it (src/gin/gin_host_proxy.cc and
// src/plugin/rma/rma_v*.cc in NVIDIA/nccl): one interface with the newest signatures, adapted per version as
// NCCL's own shims do (v11/v12 have no contexts, so a context is the comm and v12's connection id the context index;
// older tables drop optFlags and the signal strength, which NCCL then treats as strong).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft::harness {

struct RmaDeviceInfo {
  std::string name;
  int ptrSupport = 0;
  int maxRecvs = 0;
  int netDeviceType = -1;
};

class RmaApi {
 public:
  // Loads `symbol` from `file` (empty: the newest of ncclRmaPlugin_v17..v13, ncclGinPlugin_v13..v11). `version`: the
  // table's version when `symbol` names one without it in its name (NCCL's ncclGinIbProxy is v11 in 2.28). nullptr
  // and `why` when none is found.
  static RmaApi* load(const std::string& file, const std::string& symbol, int version, std::string* why);
  int version() const { return version_; }
  const std::string& symbol() const { return symbol_; }
  bool gin() const { return version_ <= 12; }    // GIN tables: no contexts, no get, no flush
  bool hasGet() const { return version_ >= 13; }
  bool weakSignals() const { return version_ >= 14; }
  bool hasProperties() const { return version_ >= 16; }
  // NCCL 2.28's own IB proxy leaves queryLastError NULL (its proxy then relies on test's result alone).
  bool hasQueryLastError() const;
  const char* name() const;

  int init(void** ctx, uint64_t commId);
  int devices(int* n);
  int getProperties(int dev, RmaDeviceInfo* info);
  int listen(void* ctx, int dev, void* handle, void** listenComm);
  int connect(void* ctx, void** handles, int nranks, int rank, void* listenComm, void** collComm);
  // v13+: a block of nContexts. v11/v12: none (the comm stands for it; v12 connected nContexts connections).
  int createContext(void* collComm, int nContexts, void** ctx);
  int destroyContext(void* ctx);
  int regMrSym(void* collComm, void* data, size_t size, int type, uint64_t flags, void** mh);
  int deregMrSym(void* collComm, void* mh);
  int closeColl(void* collComm);
  int closeListen(void* listenComm);
  // ctx: createContext's (v13+) or the comm (v11/v12).
  int iput(void* ctx, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff, void* dstMh,
           uint32_t rank, uint32_t optFlags, void** request);
  int iputSignal(void* ctx, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff, void* dstMh,
                 uint32_t rank, uint64_t sigOff, void* sigMh, uint64_t value, uint32_t op, bool strong,
                 uint32_t optFlags, void** request);
  int iget(void* ctx, int context, uint64_t remoteOff, void* remoteMh, size_t size, uint64_t localOff, void* localMh,
           uint32_t rank, void** request);
  int iflush(void* ctx, int context, void* mh, uint32_t rank, void** request);
  int test(void* collComm, void* request, int* done);
  int progress(void* ctx);
  int queryLastError(void* ctx, bool* hasError);
  int getRmaProperties(void* collComm, bool* flushesAllPutsOnAnySignal);
  int finalize(void* ctx);

 private:
  int version_ = 0;
  std::string symbol_;
  void* table_ = nullptr;
  void* lib_ = nullptr;
};

// The plugin's INFO lines too (weft conformance --rma --verbose), not only its warnings.
void setRmaVerbose(bool on);

}  // namespace weft::harness
