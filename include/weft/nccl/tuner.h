// SPDX-License-Identifier: Apache-2.0
// Our own declarations of NCCL's tuner plugin ABI, versions v1 to v7 (NCCL 2.19 -> 2.32).
// v7 layouts: tests/abi/layouts-nccl-2.32.tsv (measured from NCCL 2.32's tuner_v7.h).
// Semantics: docs/nccl-semantics.md §tuner. Layouts: tests/abi/layouts.tsv (offsets measured from NCCL's headers);
// every struct here is checked field by field against that table by tests/unit/abi_layout_test.cc.
#pragma once

#include "weft/nccl/common.h"

extern "C" {

// ncclFunc_t (only Broadcast..AllReduce reach the tuner).
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
} ncclFunc_t;

#define NCCL_ALGO_UNDEF (-1)
#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_COLLNET_DIRECT 2
#define NCCL_ALGO_COLLNET_CHAIN 3
#define NCCL_ALGO_NVLS 4
#define NCCL_ALGO_NVLS_TREE 5
#define NCCL_ALGO_PAT 6
#define NCCL_NUM_ALGORITHMS 7  // 6 before 2.23 (no PAT)
#define NCCL_PROTO_UNDEF (-1)
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define NCCL_NUM_PROTOCOLS 3
#define NCCL_ALGO_PROTO_IGNORE (-1.0f)

#define NCCL_HW_NVLINK 0
#define NCCL_HW_PCI 1
#define NCCL_HW_NET 2
#define NCCL_NUM_HW_LINKS 3
#define NCCL_NUM_COMPCAPS 4     // v5/v6: Volta, Ampere, Hopper, Blackwell
#define NCCL_NUM_COMPCAPS_V7 5  // v7 (2.32) adds a fifth row (Rubin); the first four rows are v5's
#define NCCL_NUM_TUNING_SCALES 3

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;
typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v6_t;
static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12, "docs/nccl-semantics.md §tuner: 12 bytes");

// NCCL's model constants a v5+ tuner may edit at init, for N compute capabilities.
#define WEFT_TUNER_CONSTANTS(N)                                                     \
  struct {                                                                          \
    double baseLatencies[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];                  \
    double hwLatencies[NCCL_NUM_HW_LINKS][NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS]; \
    double llMaxBws[N][NCCL_NUM_TUNING_SCALES];                                     \
    double perChMaxRingLL128Bws[N][NCCL_NUM_TUNING_SCALES];                         \
    double perChMaxTreeLL128Bws[N][NCCL_NUM_TUNING_SCALES];                         \
    double perChMaxTreeBws[N][NCCL_NUM_TUNING_SCALES];                              \
    double perChMaxNVLSTreeBws[N][NCCL_NUM_TUNING_SCALES];                          \
  }
typedef WEFT_TUNER_CONSTANTS(NCCL_NUM_COMPCAPS) ncclTunerConstants_v5_t;  // 1152 bytes in the core
typedef ncclTunerConstants_v5_t ncclTunerConstants_v6_t;
typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v7_t;

// v7: the same tables with a row per compute capability for five of them (1272 bytes).
typedef WEFT_TUNER_CONSTANTS(NCCL_NUM_COMPCAPS_V7) ncclTunerConstants_v7_t;
#undef WEFT_TUNER_CONSTANTS

// getCollInfo of v3+: collCostTable points to a contiguous float[numAlgo][numProto] (not an array of pointers).
typedef ncclResult_t (*ncclTunerGetCollInfoV3_t)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                                 float** collCostTable, int numAlgo, int numProto, int* nChannels);
typedef ncclResult_t (*ncclTunerGetCollInfoV4_t)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                                 float** collCostTable, int numAlgo, int numProto, int regBuff,
                                                 int* nChannels);

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction);
  ncclResult_t (*getCollInfo)(ncclFunc_t collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                              int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  ncclResult_t (*destroy)();
} ncclTuner_v1_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                              int nvlsSupport, int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v2_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclTunerGetCollInfoV3_t getCollInfo;
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v3_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclTunerGetCollInfoV4_t getCollInfo;
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v5_t* nvlDomainInfo, ncclTunerConstants_v5_t* constants);
  ncclTunerGetCollInfoV4_t getCollInfo;
  ncclResult_t (*finalize)(void* context);
} ncclTuner_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v6_t* nvlDomainInfo, ncclTunerConstants_v6_t* constants);
  ncclTunerGetCollInfoV4_t getCollInfo;
  ncclResult_t (*finalize)(void* context);
  // Optional (may be NULL): called per collective task while NCCL computes its chunking (2.30+).
  ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto,
                               int nChannels, size_t* chunkSize);
} ncclTuner_v6_t;

// v7 (2.32): v6 with the five-capability constants.
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v7_t* nvlDomainInfo, ncclTunerConstants_v7_t* constants);
  ncclTunerGetCollInfoV4_t getCollInfo;
  ncclResult_t (*finalize)(void* context);
  ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto,
                               int nChannels, size_t* chunkSize);
} ncclTuner_v7_t;

}  // extern "C"
