// SPDX-License-Identifier: Apache-2.0
// A reference implementation of NCCL's cost model (src/graph/tuning.cc of NCCL 2.28.9 as tuner/README.md describes
// it; our own code): for a topology description it produces the cost table
// NCCL hands the tuner (µs per (algorithm, protocol), -1 where not available) and NCCL's own pick, channels and
// threads. Used to evaluate the tuner without GPUs (`weft tune show`, the simulator) — never inside the plugin,
// which always works from the table NCCL itself passes.
#pragma once

#include <cstdint>

namespace weft::tuner::model {

struct Topology {
  int nRanks = 16;
  int nNodes = 2;
  int cc = 2;              // compute capability index: 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell
  bool amdCpu = false;     // net overhead 2 µs instead of 1, lower LL bandwidth caps across nodes
  int nChannels = 16;      // ring/tree graph channels (comm->nChannels)
  double bwIntra = 20.0;   // graph bandwidth per channel inside a node, GB/s
  double bwInter = 12.0;   // ... across nodes, GB/s
  double latencyInter = 0; // extra network latency, µs
  bool nvlinkIntra = true; // NVLink inside the node (else PCI)
  bool nvls = false;       // NVLink SHARP available
  int nvlsChannels = 16;
  bool ll128 = true;       // LL128 verified on these paths
  bool pat = false;        // PAT enabled (NCCL: auto = one GPU per node)
  int ppn() const { return nNodes > 0 ? nRanks / nNodes : nRanks; }
};

struct Table {
  float t[7][3];         // µs; -1 = NCCL_ALGO_PROTO_IGNORE
  int channels[7][3];    // what topoGetAlgoInfo would use
  int threads[7][3];
  // The costs as NCCL hands them to the tuner: one contiguous float[7][3].
  float* flat() { return &t[0][0]; }
  const float* flat() const { return &t[0][0]; }
};

// coll: ncclFunc_t 0..4. numPipeOps as NCCL passes it (1 for a lone collective).
Table costTable(const Topology& t, int coll, uint64_t nBytes, int numPipeOps = 1);
// The latency and bus bandwidth (before the algorithm-bandwidth conversion) of one entry; <0 when not available.
double latencyUs(const Topology& t, int coll, int algo, int proto);
double busBwGBs(const Topology& t, int coll, int algo, int proto, uint64_t nBytes);

struct Pick {
  int algo = -1, proto = -1, channels = 0, threads = 0;
  float timeUs = -1;
};
// NCCL's choice from a (possibly tuner-modified) table: the first minimum over entries >= 0.
Pick pick(const Table& table);

}  // namespace weft::tuner::model
