// SPDX-License-Identifier: Apache-2.0
// Our own declarations of NCCL's profiler plugin ABI, versions v1 to v7 (NCCL 2.23 -> 2.32).
// v7 layouts: tests/abi/layouts-nccl-2.32.tsv (measured from NCCL 2.32's profiler_v7.h).
// Semantics: docs/nccl-semantics.md §net-events and §profiler-events. Layouts: tests/abi/layouts.tsv; every struct
// here is checked field by field against that table by tests/unit/abi_layout_test.cc.
#pragma once

#include <sys/types.h>

#include "weft/nccl/common.h"

extern "C" {

// Event types (activation-mask bits).
enum {
  ncclProfileGroup = 1 << 0,
  ncclProfileColl = 1 << 1,
  ncclProfileP2p = 1 << 2,
  ncclProfileProxyOp = 1 << 3,
  ncclProfileProxyStep = 1 << 4,
  ncclProfileProxyCtrl = 1 << 5,
  ncclProfileKernelCh = 1 << 6,     // v3+ (2.26)
  ncclProfileNetPlugin = 1 << 7,    // v3+ (2.26)
  ncclProfileGroupApi = 1 << 8,     // v5+ (2.28)
  ncclProfileCollApi = 1 << 9,      // v5+
  ncclProfileP2pApi = 1 << 10,      // v5+
  ncclProfileKernelLaunch = 1 << 11,  // v5+
  ncclProfileCeColl = 1 << 12,      // v6 (2.29)
  ncclProfileCeSync = 1 << 13,      // v6
  ncclProfileCeBatch = 1 << 14,     // v6
  ncclProfileKernelPhase = 1 << 15, // v7 (2.32): a kernel channel's barrier phase, child of its kernelCh event
};

// Event states (stable numbering across versions).
typedef enum {
  ncclProfilerProxyOpSendPosted = 0,  // 0..7 deprecated in v4
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,
  ncclProfilerGroupStartApiStop = 23,
  ncclProfilerGroupEndApiStart = 24,
  // 25..30: copy-engine collective states (v6)
  ncclProfilerKernelPhaseStop = 31,  // v7: stop time in eStateArgs->kernelCh.pTimer
} ncclProfilerEventState_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v1_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v2_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v3_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v4_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v5_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v7_t;

// Net-plugin event callback types (§4): 0 start, 1 stop, 2 update (2.27+), 3 update then stop (2.27+).
enum { ncclProfilerNetEventStart = 0, ncclProfilerNetEventStop = 1, ncclProfilerNetEventUpdate = 2,
       ncclProfilerNetEventUpdateAndStop = 3 };
#define NCCL_PROFILER_NET_VER_BITS 16
#define NCCL_PROFILER_NET_VER_MASK (~0U >> NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_MASK (~0U << NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_IB (1U << NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_SOCK (2U << NCCL_PROFILER_NET_VER_BITS)

// The descriptors NCCL's own IB and Socket transports hand to the callback (version 1 of each).
typedef struct {
  uint8_t type;  // ncclProfileQp = 1
  union {
    struct {
      int device;
      uint64_t wr_id;
      int opcode;
      int qpNum;
      size_t length;
    } qp;
  };
} ncclProfilerNetIbDescr_v1_t;

typedef struct {
  uint8_t type;  // ncclProfileSocket = 1
  union {
    struct {
      int fd;
      int op;
      size_t length;
    } sock;
  };
} ncclProfilerNetSockDescr_v1_t;

// ---- descriptors -----------------------------------------------------------------------------------------------

struct ncclProfilerProxyOpArm {
  pid_t pid;
  uint8_t channelId;
  int peer;
  int nSteps;
  int chunkSize;
  int isSend;
};
struct ncclProfilerProxyStepArm {
  int step;
};
struct ncclProfilerNetPluginArm {
  int64_t id;
  void* data;
};

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name;
      uint64_t commHash;
      uint64_t seqNumber;
      uint8_t func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      uint8_t datatype;
      uint32_t op;
      size_t trafficBytes;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      uint8_t algo;
      uint8_t proto;
      int isCollnet;
      int isNvls;
    } coll;
    struct {
      const char* name;
      uint64_t commHash;
      uint8_t func;
      void* buff;
      uint8_t datatype;
      size_t count;
      int peer;
    } p2p;
    ncclProfilerProxyOpArm proxyOp;
    ncclProfilerProxyStepArm proxyStep;
  };
} ncclProfilerEventDescr_v1_t;

#define WEFT_PROFILER_P2P_V2                                                                                  \
  struct {                                                                                                    \
    const char* name;                                                                                         \
    uint64_t commHash;                                                                                        \
    const char* func;                                                                                         \
    void* buff;                                                                                               \
    const char* datatype;                                                                                     \
    size_t count;                                                                                             \
    int peer;                                                                                                 \
  } p2p

// The v2/v3 collective arm (string names), around v2's trafficBytes.
#define WEFT_PROFILER_COLL_V2_HEAD \
  const char* name;                \
  uint64_t commHash;               \
  uint64_t seqNumber;              \
  const char* func;                \
  const void* sendBuff;            \
  void* recvBuff;                  \
  size_t count;                    \
  int root;                        \
  const char* datatype
#define WEFT_PROFILER_COLL_V2_TAIL \
  uint8_t nMaxChannels;            \
  uint8_t nWarps;                  \
  const char* algo;                \
  const char* proto

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      WEFT_PROFILER_COLL_V2_HEAD;
      size_t trafficBytes;
      WEFT_PROFILER_COLL_V2_TAIL;
    } coll;
    WEFT_PROFILER_P2P_V2;
    ncclProfilerProxyOpArm proxyOp;
    ncclProfilerProxyStepArm proxyStep;
  };
} ncclProfilerEventDescr_v2_t;

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      WEFT_PROFILER_COLL_V2_HEAD;  // v3 = v2 without trafficBytes
      WEFT_PROFILER_COLL_V2_TAIL;
    } coll;
    WEFT_PROFILER_P2P_V2;
    ncclProfilerProxyOpArm proxyOp;
    ncclProfilerProxyStepArm proxyStep;
    struct {
      uint8_t channelId;
    } kernelCh;
    ncclProfilerNetPluginArm netPlugin;
  };
} ncclProfilerEventDescr_v3_t;
#undef WEFT_PROFILER_P2P_V2
#undef WEFT_PROFILER_COLL_V2_HEAD
#undef WEFT_PROFILER_COLL_V2_TAIL

// The v4 collective arm; v5/v6 append parentGroup.
#define WEFT_PROFILER_COLL_V4 \
  uint64_t seqNumber;         \
  const char* func;           \
  void const* sendBuff;       \
  void* recvBuff;             \
  size_t count;               \
  int root;                   \
  const char* datatype;       \
  uint8_t nChannels;          \
  uint8_t nWarps;             \
  const char* algo;           \
  const char* proto
#define WEFT_PROFILER_P2P_V4 \
  const char* func;          \
  void* buff;                \
  const char* datatype;      \
  size_t count;              \
  int peer;                  \
  uint8_t nChannels
struct ncclProfilerKernelChArmV4 {
  uint8_t channelId;
  uint64_t pTimer;
};

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      WEFT_PROFILER_COLL_V4;
    } coll;
    struct {
      WEFT_PROFILER_P2P_V4;
    } p2p;
    ncclProfilerProxyOpArm proxyOp;
    ncclProfilerProxyStepArm proxyStep;
    ncclProfilerKernelChArmV4 kernelCh;
    ncclProfilerNetPluginArm netPlugin;
  };
} ncclProfilerEventDescr_v4_t;

// The arms v5 and v6 share (v6 adds the copy-engine arms).
#define WEFT_PROFILER_ARMS_V5        \
  struct {                           \
    bool graphCaptured;              \
    int groupDepth;                  \
  } groupApi;                        \
  struct {                           \
    const char* func;                \
    size_t count;                    \
    const char* datatype;            \
    int root;                        \
    void* stream;                    \
    bool graphCaptured;              \
  } collApi;                         \
  struct {                           \
    const char* func;                \
    size_t count;                    \
    const char* datatype;            \
    void* stream;                    \
    bool graphCaptured;              \
  } p2pApi;                          \
  struct {                           \
    void* stream;                    \
  } kernelLaunch;                    \
  struct {                           \
    WEFT_PROFILER_COLL_V4;           \
    void* parentGroup;               \
  } coll;                            \
  struct {                           \
    WEFT_PROFILER_P2P_V4;            \
    void* parentGroup;               \
  } p2p;                             \
  ncclProfilerProxyOpArm proxyOp;    \
  ncclProfilerProxyStepArm proxyStep; \
  ncclProfilerKernelChArmV4 kernelCh; \
  ncclProfilerNetPluginArm netPlugin

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    WEFT_PROFILER_ARMS_V5;
  };
} ncclProfilerEventDescr_v5_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    WEFT_PROFILER_ARMS_V5;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint64_t syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
    struct {
      bool isComplete;
      uint32_t nRanks;
    } ceCollSync;
    struct {
      uint32_t numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;

// v7 (2.32): userTag on the API, coll, p2p and ceColl arms (0 = untagged; the userProfilerTag of the
// ncclCollConfig_t the application gave ncclAllReduceConfig & co., copied by NCCL into every event of the call; values
// with the top bit set are NCCL's own), kernel-variant metadata on coll, and the kernelPhase arm.
#define WEFT_KERNEL_PHASE_INITIAL_SYNC 0
#define WEFT_KERNEL_PHASE_COMPUTE 1
#define WEFT_KERNEL_PHASE_FINAL_SYNC 2
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      WEFT_PROFILER_COLL_V4;
      void* parentGroup;
      const char* kernelVariant;
      bool isSymColl;
      uint64_t userTag;
    } coll;
    struct {
      WEFT_PROFILER_P2P_V4;
      void* parentGroup;
      uint64_t userTag;
    } p2p;
    ncclProfilerProxyOpArm proxyOp;
    ncclProfilerProxyStepArm proxyStep;
    ncclProfilerKernelChArmV4 kernelCh;
    ncclProfilerNetPluginArm netPlugin;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
      uint64_t userTag;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
    struct {
      uint8_t channelId;
      uint8_t phaseId;        // WEFT_KERNEL_PHASE_*
      const char* phaseName;
      uint64_t pTimer;        // start, GPU globaltimer (ns)
    } kernelPhase;
  };
} ncclProfilerEventDescr_v7_t;
#undef WEFT_PROFILER_ARMS_V5
#undef WEFT_PROFILER_COLL_V4
#undef WEFT_PROFILER_P2P_V4

// ---- state arguments -------------------------------------------------------------------------------------------

typedef union {
  struct {
    size_t transSize;
    int steps;
  } proxyOp;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
} ncclProfilerEventStateArgs_v1_t;
typedef ncclProfilerEventStateArgs_v1_t ncclProfilerEventStateArgs_v2_t;
typedef ncclProfilerEventStateArgs_v1_t ncclProfilerEventStateArgs_v3_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} ncclProfilerEventStateArgs_v4_t;
static_assert(sizeof(ncclProfilerEventStateArgs_v1_t) == 16, "v1-v3 state args: size_t + int");
static_assert(sizeof(ncclProfilerEventStateArgs_v4_t) == 8,
              "v4+ state args are 8 bytes (docs/nccl-semantics.md §profiler-events)");
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v5_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v6_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v7_t;  // kernelCh.pTimer: KernelPhaseStop too

// ---- function tables (48 bytes each; every member returns ncclResult_t) ----------------------------------------

#define WEFT_PROFILER_TAIL(N)                                                                                 \
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v##N##_t* eDescr);         \
  ncclResult_t (*stopEvent)(void* eHandle);                                                                   \
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v##N##_t eState,                     \
                                   ncclProfilerEventStateArgs_v##N##_t* eStateArgs);                          \
  ncclResult_t (*finalize)(void* context)

// init's three signatures: v1-v3 (no communicator), v4 (commHash), v5-v7 (commId second).
typedef ncclResult_t (*ncclProfilerInitV1_t)(void** context, int* eActivationMask);
typedef ncclResult_t (*ncclProfilerInitV4_t)(void** context, int* eActivationMask, const char* commName,
                                             uint64_t commHash, int nNodes, int nranks, int rank,
                                             ncclDebugLogger_t logfn);
typedef ncclResult_t (*ncclProfilerInitV5_t)(void** context, uint64_t commId, int* eActivationMask,
                                             const char* commName, int nNodes, int nranks, int rank,
                                             ncclDebugLogger_t logfn);
#define WEFT_PROFILER_TABLE(N, INIT) \
  typedef struct {                   \
    const char* name;                \
    INIT init;                       \
    WEFT_PROFILER_TAIL(N);           \
  } ncclProfiler_v##N##_t
WEFT_PROFILER_TABLE(1, ncclProfilerInitV1_t);
WEFT_PROFILER_TABLE(2, ncclProfilerInitV1_t);
WEFT_PROFILER_TABLE(3, ncclProfilerInitV1_t);
WEFT_PROFILER_TABLE(4, ncclProfilerInitV4_t);
WEFT_PROFILER_TABLE(5, ncclProfilerInitV5_t);
WEFT_PROFILER_TABLE(6, ncclProfilerInitV5_t);
WEFT_PROFILER_TABLE(7, ncclProfilerInitV5_t);
#undef WEFT_PROFILER_TABLE
#undef WEFT_PROFILER_TAIL

}  // extern "C"

// weft's own net-plugin event descriptor (pluginId = WEFT_PROFILER_NET_TYPE | WEFT_PROFILER_NET_VER): published
// so that any profiler can decode netPlugin.data for events our transport opens. Layout is part of our ABI.
#define WEFT_PROFILER_NET_TYPE (0x57U << NCCL_PROFILER_NET_VER_BITS)  // 'W'
#define WEFT_PROFILER_NET_VER 1
extern "C" typedef struct {
  uint8_t type;      // 1 = one message (send or receive) on a connection
  uint8_t isSend;    // 1 send, 0 receive
  uint16_t reserved; // 0
  uint32_t peerId;   // weft's connection id (the same as in weft's per-connection records)
  uint64_t seq;      // message sequence number on the connection
  size_t length;     // bytes posted (send size, or the receive buffer size)
} weftProfilerNetDescr_v1_t;
