// SPDX-License-Identifier: Apache-2.0
// Our own declarations of the tables NCCL's device API (GIN) drives through its CPU proxy:
// - ncclGin_v11_t / ncclGin_v12_t: NCCL 2.28-2.29 (and 2.30.3-2.30.4 through their compatibility wrappers), proxy
//   mode: listen/connect across all ranks, symmetric registration, iput/iputSignal, test, ginProgress.
// - ncclGin_v13_t: NCCL 2.30.3-2.30.4's table, which 2.30.7 also loads as ncclRmaPlugin_v13 (the same shape):
//   contexts, iget and iflush.
// - ncclRma_v14_t ... ncclRma_v17_t: NCCL 2.30.7 on. v14 took the data path out of the GIN table and added strong
//   and weak signals; v15 added optFlags; v16 getRmaProperties; v17 a peer list in the context config.
// Semantics (which completion means what, signal ordering, flags): docs/nccl-semantics.md §device API. Layouts:
// tests/abi/layouts-rma.tsv (measured from NCCL's headers), checked by tests/unit/abi_layout_test.cc.
#pragma once

#include "weft/nccl/net.h"

extern "C" {

// Registration flags (regMrSym's mrFlags).
#define NCCL_NET_MR_FLAG_FORCE_SO (1 << 0)            // the region may take signals: strongly ordered after puts
#define NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET (1 << 1)  // a signal region that starts at 0 and only the plugin writes
// Signal operations (iputSignal's signalOp).
#define NCCL_NET_SIGNAL_OP_INC 0x1  // add 1, whatever signalValue says
#define NCCL_NET_SIGNAL_OP_ADD 0x2  // add signalValue
// The device type an RMA/GIN plugin reports in getProperties for the proxy path (ncclNetDeviceType value 2).
#define NCCL_NET_DEVICE_GIN_PROXY 2

// v15+ optFlags.
enum ncclRmaOptFlags_v15 { ncclRmaOptFlagsDefault = 0, ncclRmaOptFlagsAggregateRequests = (1 << 0) };

typedef struct {
  int nSignals;
  int nCounters;
  int nContexts;
  int queueDepth;
  int trafficClass;
} ncclGinConfig_v13_t;

// NCCL 2.30.7 added rankStride to v14's config (2.30.3/2.30.4 had none, and passed no v14 table anyway): a context
// talks to the ranks at multiples of the stride from its own. v15 and v16 keep this config; v17 replaces the stride
// with a list of peers.
typedef struct {
  int nContexts;
  int trafficClass;
  int rankStride;
} ncclRmaConfig_v14_t;
typedef ncclRmaConfig_v14_t ncclRmaConfig_v15_t;
typedef ncclRmaConfig_v14_t ncclRmaConfig_v16_t;

typedef struct {
  int nContexts;
  int trafficClass;
  int* peerArray;  // the ranks this block of contexts talks to; NULL: every rank
  int peerArrayCount;
} ncclRmaConfig_v17_t;

typedef struct {
  // True when any signal arriving, from any peer, makes every put already received on the comm visible.
  bool flushesAllPutsOnAnySignal;
} ncclRmaProperties_v16_t;
typedef ncclRmaProperties_v16_t ncclRmaProperties_v17_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  ncclResult_t (*createContext)(void* collComm, int nSignals, int nCounters, void** ginCtx,
                                ncclNetDeviceHandle_v11_t** devHandle);
  ncclResult_t (*regMrSym)(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle,
                           void** ginHandle);
  ncclResult_t (*regMrSymDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                                 uint64_t mrFlags, void** mhandle, void** ginHandle);
  ncclResult_t (*deregMrSym)(void* collComm, void* mhandle);
  ncclResult_t (*destroyContext)(void* ginCtx);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*iput)(void* collComm, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                       void* dstMhandle, uint32_t rank, void** request);
  ncclResult_t (*iputSignal)(void* collComm, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                             void* dstMhandle, uint32_t rank, uint64_t signalOff, void* signalMhandle,
                             uint64_t signalValue, uint32_t signalOp, void** request);
  ncclResult_t (*test)(void* collComm, void* request, int* done);
  ncclResult_t (*ginProgress)(void* collComm);
  ncclResult_t (*queryLastError)(void* ginCtx, bool* hasError);
  ncclResult_t (*finalize)(void* ctx);
} ncclGin_v11_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, void* handles[], int nranks, int rank, int nConnections, int queueDepth,
                          void* listenComm, void** collComm);
  ncclResult_t (*createContext)(void* collComm, int nSignals, int nCounters, int nContexts, void** ginCtx,
                                ncclNetDeviceHandle_v11_t** devHandle);
  ncclResult_t (*regMrSym)(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle,
                           void** ginHandle);
  ncclResult_t (*regMrSymDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                                 uint64_t mrFlags, void** mhandle, void** ginHandle);
  ncclResult_t (*deregMrSym)(void* collComm, void* mhandle);
  ncclResult_t (*destroyContext)(void* ginCtx);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*iput)(void* collComm, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                       void* dstMhandle, uint32_t rank, int connectionId, void** request);
  ncclResult_t (*iputSignal)(void* collComm, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                             void* dstMhandle, uint32_t rank, uint64_t signalOff, void* signalMhandle,
                             uint64_t signalValue, uint32_t signalOp, int connectionId, void** request);
  ncclResult_t (*test)(void* collComm, void* request, int* done);
  ncclResult_t (*ginProgress)(void* collComm);
  ncclResult_t (*queryLastError)(void* ginCtx, bool* hasError);
  ncclResult_t (*finalize)(void* ctx);
} ncclGin_v12_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  ncclResult_t (*createContext)(void* collComm, ncclGinConfig_v13_t* config, void** ginCtx,
                                ncclNetDeviceHandle_v11_t** devHandle);
  ncclResult_t (*regMrSym)(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle,
                           void** ginHandle);
  ncclResult_t (*regMrSymDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                                 uint64_t mrFlags, void** mhandle, void** ginHandle);
  ncclResult_t (*deregMrSym)(void* collComm, void* mhandle);
  ncclResult_t (*destroyContext)(void* ginCtx);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*iput)(void* ginCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                       void* dstMhandle, uint32_t rank, void** request);
  ncclResult_t (*iputSignal)(void* ginCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size,
                             uint64_t dstOff, void* dstMhandle, uint32_t rank, uint64_t signalOff, void* signalMhandle,
                             uint64_t signalValue, uint32_t signalOp, void** request);
  ncclResult_t (*iget)(void* ginCtx, int context, uint64_t remoteOff, void* remoteMhandle, size_t size,
                       uint64_t localOff, void* localMhandle, uint32_t rank, void** request);
  ncclResult_t (*iflush)(void* ginCtx, int context, void* mhandle, uint32_t rank, void** request);
  ncclResult_t (*test)(void* collComm, void* request, int* done);
  ncclResult_t (*ginProgress)(void* ginCtx);
  ncclResult_t (*queryLastError)(void* ginCtx, bool* hasError);
  ncclResult_t (*finalize)(void* ctx);
} ncclGin_v13_t;
typedef ncclGin_v13_t ncclRma_v13_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  ncclResult_t (*createContext)(void* collComm, ncclRmaConfig_v14_t* config, void** rmaCtx);
  ncclResult_t (*regMrSym)(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle);
  ncclResult_t (*regMrSymDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                                 uint64_t mrFlags, void** mhandle);
  ncclResult_t (*deregMrSym)(void* collComm, void* mhandle);
  ncclResult_t (*destroyContext)(void* rmaCtx);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*iput)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                       void* dstMhandle, uint32_t rank, void** request);
  ncclResult_t (*iputSignal)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size,
                             uint64_t dstOff, void* dstMhandle, uint32_t rank, uint64_t signalOff, void* signalMhandle,
                             uint64_t signalValue, uint32_t signalOp, bool isStrongSignal, void** request);
  ncclResult_t (*iget)(void* rmaCtx, int context, uint64_t remoteOff, void* remoteMhandle, size_t size,
                       uint64_t localOff, void* localMhandle, uint32_t rank, void** request);
  ncclResult_t (*iflush)(void* rmaCtx, int context, void* mhandle, uint32_t rank, void** request);
  ncclResult_t (*test)(void* collComm, void* request, int* done);
  ncclResult_t (*rmaProgress)(void* rmaCtx);
  ncclResult_t (*queryLastError)(void* rmaCtx, bool* hasError);
  ncclResult_t (*finalize)(void* ctx);
} ncclRma_v14_t;

// v15 and v16 share one shape but for getRmaProperties (v16) and the config's type; v17 has v16's shape.
#define WEFT_NCCL_RMA_V15_SHAPE(V, CONFIG, PROPS_MEMBER)                                                           \
  typedef struct {                                                                                              \
    const char* name;                                                                                           \
    ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);                           \
    ncclResult_t (*devices)(int* ndev);                                                                         \
    PROPS_MEMBER                                                                                                \
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);                                     \
    ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);                                \
    ncclResult_t (*connect)(void* ctx, void* handles[], int nranks, int rank, void* listenComm,                 \
                            void** collComm);                                                                   \
    ncclResult_t (*createContext)(void* collComm, CONFIG * config, void** rmaCtx);                              \
    ncclResult_t (*regMrSym)(void* collComm, void* data, size_t size, int type, uint64_t mrFlags,               \
                             void** mhandle);                                                                   \
    ncclResult_t (*regMrSymDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,  \
                                   uint64_t mrFlags, void** mhandle);                                           \
    ncclResult_t (*deregMrSym)(void* collComm, void* mhandle);                                                  \
    ncclResult_t (*destroyContext)(void* rmaCtx);                                                               \
    ncclResult_t (*closeColl)(void* collComm);                                                                  \
    ncclResult_t (*closeListen)(void* listenComm);                                                              \
    ncclResult_t (*iput)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size,             \
                         uint64_t dstOff, void* dstMhandle, uint32_t rank, uint32_t optFlags, void** request);  \
    ncclResult_t (*iputSignal)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size,       \
                               uint64_t dstOff, void* dstMhandle, uint32_t rank, uint64_t signalOff,            \
                               void* signalMhandle, uint64_t signalValue, uint32_t signalOp,                    \
                               bool isStrongSignal, uint32_t optFlags, void** request);                         \
    ncclResult_t (*iget)(void* rmaCtx, int context, uint64_t remoteOff, void* remoteMhandle, size_t size,       \
                         uint64_t localOff, void* localMhandle, uint32_t rank, uint32_t optFlags,               \
                         void** request);                                                                       \
    ncclResult_t (*iflush)(void* rmaCtx, int context, void* mhandle, uint32_t rank, void** request);            \
    ncclResult_t (*test)(void* collComm, void* request, int* done);                                             \
    ncclResult_t (*rmaProgress)(void* rmaCtx);                                                                  \
    ncclResult_t (*queryLastError)(void* rmaCtx, bool* hasError);                                               \
    ncclResult_t (*finalize)(void* ctx);                                                                        \
  } ncclRma_##V##_t;

#define WEFT_RMA_PROPS(P) ncclResult_t (*getRmaProperties)(void* collComm, P * rmaProps);
WEFT_NCCL_RMA_V15_SHAPE(v15, ncclRmaConfig_v15_t, )
WEFT_NCCL_RMA_V15_SHAPE(v16, ncclRmaConfig_v16_t, WEFT_RMA_PROPS(ncclRmaProperties_v16_t))
WEFT_NCCL_RMA_V15_SHAPE(v17, ncclRmaConfig_v17_t, WEFT_RMA_PROPS(ncclRmaProperties_v17_t))
#undef WEFT_RMA_PROPS
#undef WEFT_NCCL_RMA_V15_SHAPE

}  // extern "C"
