// SPDX-License-Identifier: Apache-2.0
// A reference implementation of NCCL's cost model (src/graph/tuning.cc of NCCL 2.28.9 as docs/tuning.md describes
// it; our own code): for a topology description it produces the cost table
// NCCL hands the tuner (µs per (algorithm, protocol), -1 where not available) and NCCL's own pick, channels and
// threads. Used to evaluate the tuner without GPUs (`weft tune show`, the simulator) — never inside the plugin,
// which always works from the table NCCL itself passes.
#pragma once

#include <cstdint>

namespace weft::tuner::model {

constexpr int kNumCompCaps = 5;  // NCCL 2.32's tuner v7: 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell, 4 Rubin
const char* compCapName(int cc) noexcept;
int compCapFromName(const char* s) noexcept;  // "volta".."rubin" or "0".."4"; -1 when neither

// NCCL's tuning constants, in the shape of tuner v7's (ncclTunerConstants_v7_t): what NCCL hands a v5+ tuner at
// init. Protocol order LL / LL128 / Simple; the per-channel caps by compute capability and node scale (1, 2, >2).
struct Constants {
  double baseLat[7][3];
  double hwLat[3][7][3];  // NVLink, PCI, network
  double llMaxBws[kNumCompCaps][3];  // one node: by compute capability; across nodes rows 0/1 by CPU (Intel/AMD)
  double perChMaxRingLL128Bws[kNumCompCaps][3];
  double perChMaxTreeLL128Bws[kNumCompCaps][3];
  double perChMaxTreeBws[kNumCompCaps][3];
  double perChMaxNvlsTreeBws[kNumCompCaps][3];
  int compCaps = kNumCompCaps;  // rows that came from NCCL (4 from a v5/v6 tuner's init); the rest are defaults
};
// NCCL's own defaults (ncclTunerConstantsDefaults, src/graph/tuning.cc of 2.30.7, the same in 2.31's
// src/tuning/cost_model.cc). Rubin's row is not in the sources read so far: Blackwell's stands in for it, so a
// profile or topology of compute capability 4 is modelled (as Blackwell) rather than refused; NCCL 2.32's own
// numbers reach the model through a profile recorded by a v7 tuner (Profile::constants).
const Constants& ncclDefaults() noexcept;
inline constexpr Constants kNcclDefaults = {
    // baseLat: Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT
    {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {8.0, 8.0, 8.0}},
    // hwLat
    {{{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}, {0, 0, 3.7}, {0, 0, 2.8}, {0, 0, 25}, {0, 0, 25}, {0, 0, 4.0}},   // NVLink
     {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}, {0, 0, 3.7}, {0, 0, 2.8}, {0, 0, 0}, {0, 0, 0}, {0, 0, 4.0}},      // PCI
     {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}, {0, 0, 31}, {0, 0, 30}, {0, 0, 18}, {0, 0, 20.9}, {0, 0, 14}}},  // network
    // llMaxBws
    {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {282.0, 90.0, 70.0}, {282.0, 90.0, 70.0}},
    // perChMaxRingLL128Bws
    {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 36.7}, {40.0, 40.0, 40.0}, {40.0, 40.0, 40.0}},
    // perChMaxTreeLL128Bws
    {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}, {55.6, 31.67, 20.0}},
    // perChMaxTreeBws
    {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}, {70.0, 42.8, 24.0}},
    // perChMaxNvlsTreeBws
    {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {0.0, 57.7, 45.5}, {0.0, 96.0, 80.0}, {0.0, 96.0, 80.0}},
    kNumCompCaps};

struct Topology {
  int nRanks = 16;
  int nNodes = 2;
  int cc = 2;              // compute capability index (kNumCompCaps): 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell, 4 Rubin
  const Constants* constants = nullptr;  // NCCL's as a tuner received them (a recorded profile's), else ncclDefaults()
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
