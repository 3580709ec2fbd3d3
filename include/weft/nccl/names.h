// SPDX-License-Identifier: Apache-2.0
// NCCL's names for its functions, algorithms and protocols, indexed by NCCL's own numbers (ncclFunc_t 0-7,
// NCCL_ALGO_*, NCCL_PROTO_*), spelled as NCCL's profiler and logs spell them: the one table the timing records,
// the tuner's profiles and the tools use.
#pragma once

#include <array>

namespace weft::nccl {

inline constexpr std::array<const char*, 8> kFuncNames = {"Broadcast", "Reduce",   "AllGather", "ReduceScatter",
                                                          "AllReduce", "SendRecv", "Send",      "Recv"};
inline constexpr std::array<const char*, 7> kAlgoNames = {"TREE", "RING",      "COLLNET_DIRECT", "COLLNET_CHAIN",
                                                          "NVLS", "NVLS_TREE", "PAT"};
inline constexpr std::array<const char*, 3> kProtoNames = {"LL", "LL128", "SIMPLE"};

}  // namespace weft::nccl
