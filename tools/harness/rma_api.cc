// SPDX-License-Identifier: Apache-2.0
#include "rma_api.h"

#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include <cstring>

#include "weft/nccl/rma.h"

namespace weft::harness {
namespace {

bool gVerbose = false;  // set before the ranks fork, read only after

void logger(ncclDebugLogLevel level, unsigned long, const char* file, int line, const char* fmt, ...) {
  if (level != NCCL_LOG_WARN && (!gVerbose || level != NCCL_LOG_INFO)) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "  [plugin %s %s:%d] %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", file ? file : "?", line,
               buf);
}

template <typename T>
T* as(void* t) {
  return static_cast<T*>(t);
}

}  // namespace

void setRmaVerbose(bool on) { gVerbose = on; }

RmaApi* RmaApi::load(const std::string& file, const std::string& symbol, int version, std::string* why) {
  void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *why = std::string("cannot load: ") + dlerror();
    return nullptr;
  }
  auto* api = new RmaApi;
  api->lib_ = lib;
  if (!symbol.empty()) {
    api->table_ = dlsym(lib, symbol.c_str());
    api->symbol_ = symbol;
    api->version_ = version;
    if (version == 0) {
      // ncclRmaPlugin_vN / ncclGinPlugin_vN say their version.
      const auto v = symbol.rfind("_v");
      if (v != std::string::npos) api->version_ = std::atoi(symbol.c_str() + v + 2);
    }
    if (api->table_ == nullptr || api->version_ < 11 || api->version_ > 17) {
      *why = api->table_ == nullptr ? "no symbol " + symbol
                                    : "give the table version of " + symbol + " with --rma-table (11 to 17)";
      delete api;
      return nullptr;
    }
    return api;
  }
  static const char* const kOrder[] = {"ncclRmaPlugin_v17", "ncclRmaPlugin_v16", "ncclRmaPlugin_v15",
                                       "ncclRmaPlugin_v14", "ncclRmaPlugin_v13", "ncclGinPlugin_v13",
                                       "ncclGinPlugin_v12", "ncclGinPlugin_v11"};
  for (const char* s : kOrder) {
    if (void* t = dlsym(lib, s); t != nullptr) {
      api->table_ = t;
      api->symbol_ = s;
      api->version_ = std::atoi(std::strrchr(s, 'v') + 1);
      return api;
    }
  }
  *why = "no ncclRmaPlugin_v13..v17 or ncclGinPlugin_v11..v13 symbol";
  delete api;
  return nullptr;
}

// Every call dispatches on the version; the table types are ours (weft/nccl/rma.h), checked against NCCL's.
#define RMA_CALL(expr11, expr12, expr13, expr14, expr15, expr16, expr17) \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wunused-variable\"") \
  switch (version_) {                                                    \
    case 11: { auto* t = as<ncclGin_v11_t>(table_); return expr11; }     \
    case 12: { auto* t = as<ncclGin_v12_t>(table_); return expr12; }     \
    case 13: { auto* t = as<ncclGin_v13_t>(table_); return expr13; }     \
    case 14: { auto* t = as<ncclRma_v14_t>(table_); return expr14; }     \
    case 15: { auto* t = as<ncclRma_v15_t>(table_); return expr15; }     \
    case 16: { auto* t = as<ncclRma_v16_t>(table_); return expr16; }     \
    default: { auto* t = as<ncclRma_v17_t>(table_); return expr17; }     \
  }                                                                      \
  _Pragma("GCC diagnostic pop")
#define RMA_SAME(expr) RMA_CALL(expr, expr, expr, expr, expr, expr, expr)

const char* RmaApi::name() const { RMA_SAME(t->name) }
int RmaApi::init(void** ctx, uint64_t commId) { RMA_SAME(t->init(ctx, commId, logger)) }
int RmaApi::devices(int* n) { RMA_SAME(t->devices(n)) }

int RmaApi::getProperties(int dev, RmaDeviceInfo* info) {
  auto fill = [&](auto& p, int r) {
    if (r != 0) return r;
    info->name = p.name ? p.name : "";
    info->ptrSupport = p.ptrSupport;
    info->maxRecvs = p.maxRecvs;
    info->netDeviceType = static_cast<int>(p.netDeviceType);
    return 0;
  };
  if (version_ <= 12) {
    ncclNetProperties_v11_t p{};
    int r = version_ == 11 ? as<ncclGin_v11_t>(table_)->getProperties(dev, &p)
                           : as<ncclGin_v12_t>(table_)->getProperties(dev, &p);
    return fill(p, r);
  }
  ncclNetProperties_v12_t p{};
  int r = 0;
  switch (version_) {
    case 13: r = as<ncclGin_v13_t>(table_)->getProperties(dev, &p); break;
    case 14: r = as<ncclRma_v14_t>(table_)->getProperties(dev, &p); break;
    case 15: r = as<ncclRma_v15_t>(table_)->getProperties(dev, &p); break;
    case 16: r = as<ncclRma_v16_t>(table_)->getProperties(dev, &p); break;
    default: r = as<ncclRma_v17_t>(table_)->getProperties(dev, &p); break;
  }
  return fill(p, r);
}

int RmaApi::listen(void* ctx, int dev, void* handle, void** listenComm) {
  RMA_SAME(t->listen(ctx, dev, handle, listenComm))
}

int RmaApi::connect(void* ctx, void** handles, int nranks, int rank, void* listenComm, void** collComm) {
  // v12: NCCL 2.29 asks for one connection per GIN context it will use; the harness uses 4.
  RMA_CALL(t->connect(ctx, handles, nranks, rank, listenComm, collComm),
           t->connect(ctx, handles, nranks, rank, 4, 0, listenComm, collComm),
           t->connect(ctx, handles, nranks, rank, listenComm, collComm),
           t->connect(ctx, handles, nranks, rank, listenComm, collComm),
           t->connect(ctx, handles, nranks, rank, listenComm, collComm),
           t->connect(ctx, handles, nranks, rank, listenComm, collComm),
           t->connect(ctx, handles, nranks, rank, listenComm, collComm))
}

int RmaApi::createContext(void* collComm, int nContexts, void** ctx) {
  if (version_ <= 12) {
    *ctx = collComm;
    return 0;
  }
  if (version_ == 13) {
    ncclGinConfig_v13_t c{};
    c.nContexts = nContexts;
    c.trafficClass = -1;
    ncclNetDeviceHandle_v11_t* dev = nullptr;
    return as<ncclGin_v13_t>(table_)->createContext(collComm, &c, ctx, &dev);
  }
  if (version_ <= 16) {
    ncclRmaConfig_v14_t c{nContexts, -1, 1};
    RMA_CALL(0, 0, 0, t->createContext(collComm, &c, ctx), t->createContext(collComm, &c, ctx),
             t->createContext(collComm, &c, ctx), 0)
  }
  ncclRmaConfig_v17_t c{nContexts, -1, nullptr, 0};
  return as<ncclRma_v17_t>(table_)->createContext(collComm, &c, ctx);
}

int RmaApi::destroyContext(void* ctx) {
  if (version_ <= 12) return 0;
  RMA_SAME(t->destroyContext(ctx))
}

int RmaApi::regMrSym(void* collComm, void* data, size_t size, int type, uint64_t flags, void** mh) {
  void* gin = nullptr;
  RMA_CALL(t->regMrSym(collComm, data, size, type, flags, mh, &gin),
           t->regMrSym(collComm, data, size, type, flags, mh, &gin),
           t->regMrSym(collComm, data, size, type, flags, mh, &gin), t->regMrSym(collComm, data, size, type, flags, mh),
           t->regMrSym(collComm, data, size, type, flags, mh), t->regMrSym(collComm, data, size, type, flags, mh),
           t->regMrSym(collComm, data, size, type, flags, mh))
}

int RmaApi::deregMrSym(void* collComm, void* mh) { RMA_SAME(t->deregMrSym(collComm, mh)) }
int RmaApi::closeColl(void* collComm) { RMA_SAME(t->closeColl(collComm)) }
int RmaApi::closeListen(void* listenComm) { RMA_SAME(t->closeListen(listenComm)) }

int RmaApi::iput(void* ctx, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff, void* dstMh,
                 uint32_t rank, uint32_t optFlags, void** request) {
  RMA_CALL(t->iput(ctx, srcOff, srcMh, size, dstOff, dstMh, rank, request),
           t->iput(ctx, srcOff, srcMh, size, dstOff, dstMh, rank, context, request),
           t->iput(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, request),
           t->iput(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, request),
           t->iput(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, optFlags, request),
           t->iput(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, optFlags, request),
           t->iput(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, optFlags, request))
}

int RmaApi::iputSignal(void* ctx, int context, uint64_t srcOff, void* srcMh, size_t size, uint64_t dstOff,
                       void* dstMh, uint32_t rank, uint64_t sigOff, void* sigMh, uint64_t value, uint32_t op,
                       bool strong, uint32_t optFlags, void** request) {
  RMA_CALL(t->iputSignal(ctx, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, value, op, request),
           t->iputSignal(ctx, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, value, op, context, request),
           t->iputSignal(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, value, op, request),
           t->iputSignal(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, value, op, strong,
                         request),
           t->iputSignal(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, value, op, strong,
                         optFlags, request),
           t->iputSignal(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, value, op, strong,
                         optFlags, request),
           t->iputSignal(ctx, context, srcOff, srcMh, size, dstOff, dstMh, rank, sigOff, sigMh, value, op, strong,
                         optFlags, request))
}

int RmaApi::iget(void* ctx, int context, uint64_t remoteOff, void* remoteMh, size_t size, uint64_t localOff,
                 void* localMh, uint32_t rank, void** request) {
  RMA_CALL(-1, -1, t->iget(ctx, context, remoteOff, remoteMh, size, localOff, localMh, rank, request),
           t->iget(ctx, context, remoteOff, remoteMh, size, localOff, localMh, rank, request),
           t->iget(ctx, context, remoteOff, remoteMh, size, localOff, localMh, rank, 0, request),
           t->iget(ctx, context, remoteOff, remoteMh, size, localOff, localMh, rank, 0, request),
           t->iget(ctx, context, remoteOff, remoteMh, size, localOff, localMh, rank, 0, request))
}

int RmaApi::iflush(void* ctx, int context, void* mh, uint32_t rank, void** request) {
  RMA_CALL(-1, -1, t->iflush(ctx, context, mh, rank, request), t->iflush(ctx, context, mh, rank, request),
           t->iflush(ctx, context, mh, rank, request), t->iflush(ctx, context, mh, rank, request),
           t->iflush(ctx, context, mh, rank, request))
}

int RmaApi::test(void* collComm, void* request, int* done) { RMA_SAME(t->test(collComm, request, done)) }

int RmaApi::progress(void* ctx) {
  RMA_CALL(t->ginProgress ? t->ginProgress(ctx) : 0, t->ginProgress ? t->ginProgress(ctx) : 0,
           t->ginProgress ? t->ginProgress(ctx) : 0, t->rmaProgress ? t->rmaProgress(ctx) : 0,
           t->rmaProgress ? t->rmaProgress(ctx) : 0, t->rmaProgress ? t->rmaProgress(ctx) : 0,
           t->rmaProgress ? t->rmaProgress(ctx) : 0)
}

bool RmaApi::hasQueryLastError() const { RMA_SAME(t->queryLastError != nullptr) }

int RmaApi::queryLastError(void* ctx, bool* hasError) {
  *hasError = false;
  RMA_SAME(t->queryLastError ? t->queryLastError(ctx, hasError) : 0)
}

int RmaApi::getRmaProperties(void* collComm, bool* flushes) {
  *flushes = false;
  if (version_ < 16) return 0;
  ncclRmaProperties_v16_t p{};
  int r = version_ == 16 ? as<ncclRma_v16_t>(table_)->getRmaProperties(collComm, &p)
                         : as<ncclRma_v17_t>(table_)->getRmaProperties(collComm, &p);
  *flushes = p.flushesAllPutsOnAnySignal;
  return r;
}

int RmaApi::finalize(void* ctx) { RMA_SAME(t->finalize(ctx)) }

}  // namespace weft::harness
