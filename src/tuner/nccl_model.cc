// SPDX-License-Identifier: Apache-2.0
#include "tuner/nccl_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace weft::tuner::model {
namespace {

enum { kTree = 0, kRing = 1, kCollNetD = 2, kCollNetC = 3, kNvls = 4, kNvlsTree = 5, kPat = 6 };
enum { kLL = 0, kLL128 = 1, kSimple = 2 };
enum { kBroadcast = 0, kReduce = 1, kAllGather = 2, kReduceScatter = 3, kAllReduce = 4 };

// NVLS efficiency by compute capability (not among the constants a tuner gets; Rubin: Blackwell's).
constexpr double kNvlsEfficiency[kNumCompCaps] = {0, 0, 0.85, 0.74, 0.74};
const Constants& K(const Topology& t) { return t.constants != nullptr ? *t.constants : kNcclDefaults; }
int ccOf(const Topology& t) { return t.cc < 0 ? 0 : t.cc >= kNumCompCaps ? kNumCompCaps - 1 : t.cc; }
// Tree bandwidth correction, powers of two from 64 B (spec: 0.4-1.0 with a dip at medium sizes).
constexpr float kTreeCorrection[3][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, .92, .92},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};
constexpr int kMaxDevWorkBatchColls = 8;

int log2i(uint64_t v) { return v <= 1 ? 0 : 63 - __builtin_clzll(v); }
int scale(const Topology& t) { return t.nNodes <= 2 ? t.nNodes - 1 : 2; }

bool enabled(const Topology& t, int coll, int algo, int proto) {
  if (t.nRanks <= 1) return algo == kRing && proto == kSimple;
  if (proto == kLL128 && !t.ll128) return false;
  switch (algo) {
    case kRing: return true;
    case kTree: return coll == kAllReduce;
    case kPat: return (coll == kAllGather || coll == kReduceScatter) && proto == kSimple && t.pat;
    case kNvls:
      return t.nvls && proto == kSimple && (coll == kAllReduce || coll == kAllGather || coll == kReduceScatter);
    case kNvlsTree: return t.nvls && proto == kSimple && coll == kAllReduce && t.nNodes > 1;
    default: return false;  // CollNet: not modelled (no SHARP in the topologies we describe)
  }
}

int nsteps(const Topology& t, int coll) {
  int n = t.nRanks;
  if (coll == kAllReduce) return 2 * (n - 1);
  if (coll == kAllGather || coll == kReduceScatter) return n - 1;
  return n;
}

int maxThreads(const Topology& t, int algo, int proto) {
  if (proto == kLL128) return 640;
  if (algo == kNvls || algo == kNvlsTree) return 640;
  if (algo == kRing && proto == kSimple) return t.bwIntra * t.nChannels <= 12 ? 256 : 512;
  return 512;
}

}  // namespace

const Constants& ncclDefaults() noexcept { return kNcclDefaults; }

const char* compCapName(int cc) noexcept {
  static const char* const kNames[kNumCompCaps] = {"volta", "ampere", "hopper", "blackwell", "rubin"};
  return cc >= 0 && cc < kNumCompCaps ? kNames[cc] : "unknown";
}

int compCapFromName(const char* s) noexcept {
  if (s == nullptr) return -1;
  for (int i = 0; i < kNumCompCaps; ++i)
    if (std::strcmp(s, compCapName(i)) == 0 || (s[0] == '0' + i && s[1] == 0)) return i;
  return -1;
}

double latencyUs(const Topology& t, int coll, int algo, int proto) {
  if (!enabled(t, coll, algo, proto)) return -1;
  const Constants& k = K(t);
  double intraLat = k.hwLat[t.nvlinkIntra ? 0 : 1][algo][proto];
  int ppn = t.ppn();
  double interLat = k.hwLat[2][ppn == 1 ? kTree : algo][proto] + t.latencyInter * (proto == kSimple ? 2 : 1);
  double netOverhead = (t.amdCpu ? 2.0 : 1.0) * (proto == kSimple ? 3.0 : 1.0);
  double base = k.baseLat[algo][proto];
  int l2n = log2i(static_cast<uint64_t>(t.nNodes));
  switch (algo) {
    case kRing: {
      int steps = nsteps(t, coll);
      int nInter = coll == kAllReduce ? 2 * (t.nNodes - 1)
                   : (coll == kAllGather || coll == kReduceScatter) ? t.nNodes - 1
                                                                   : t.nNodes - 1;
      double perIntra = t.nNodes > 1 ? std::max(intraLat, netOverhead) : intraLat;
      return base + (steps - nInter) * perIntra + nInter * interLat;
    }
    case kTree: return base + 2 * ((ppn - 1) * intraLat + l2n * interLat);
    case kNvls: return intraLat + (t.nNodes > 1 ? interLat : 0);
    case kNvlsTree: return base + intraLat + 2 * l2n * interLat;
    case kPat: return base + l2n * interLat / 3.5 + 2.8 * t.nRanks;
    default: return -1;
  }
}

double busBwGBs(const Topology& t, int coll, int algo, int proto, uint64_t nBytes) {
  if (!enabled(t, coll, algo, proto)) return -1;
  int nCh = (algo == kNvls || algo == kNvlsTree) ? (t.nNodes > 1 ? std::min(t.nvlsChannels, t.nChannels) : t.nvlsChannels)
                                                  : t.nChannels;
  double bw = nCh * (t.nNodes <= 2 ? t.bwIntra : t.bwInter);
  int sc = scale(t);
  const Constants& k = K(t);
  const int cc = ccOf(t);
  // LL: on one node by the GPU, across nodes by the CPU (NCCL's index1).
  double llMax = k.llMaxBws[t.nNodes == 1 ? cc : (t.amdCpu ? 1 : 0)][sc];
  switch (algo) {
    case kRing:
      if (proto == kLL) bw = std::min(llMax, 0.5 * bw);
      if (proto == kLL128) bw = std::min(0.92 * bw, nCh * k.perChMaxRingLL128Bws[cc][sc]);
      break;
    case kTree:
      if (proto == kSimple) bw = std::min(0.92 * bw, nCh * k.perChMaxTreeBws[cc][sc]);
      if (proto == kLL) bw = std::min(bw / 3.8, llMax);
      if (proto == kLL128) bw = std::min(bw * (t.nNodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0), nCh * k.perChMaxTreeLL128Bws[cc][sc]);
      if (coll == kAllReduce) {
        int i = std::clamp(log2i(nBytes >> 6), 0, 22);
        bw *= kTreeCorrection[proto][i];
      }
      break;
    case kPat: bw *= 0.75; break;
    case kNvls:
    case kNvlsTree: {
      int ppn = t.ppn();
      double eff = kNvlsEfficiency[cc] > 0 ? kNvlsEfficiency[cc] : 0.85;
      double intra = t.bwIntra * nCh * eff * (nCh - 1.0) / nCh * (coll == kAllReduce ? 2.0 : (ppn - 1.0) / ppn);
      bw = intra;
      if (t.nNodes > 1) {
        bw = std::min(bw, t.bwInter * nCh * (algo == kNvlsTree && t.nNodes <= 2 ? 2.0 : 1.0));
        if (k.perChMaxNvlsTreeBws[cc][sc] > 0) bw = std::min(bw, nCh * k.perChMaxNvlsTreeBws[cc][sc]);
      }
      break;
    }
    default: return -1;
  }
  return bw;
}

Table costTable(const Topology& t, int coll, uint64_t nBytes, int numPipeOps) {
  Table out{};
  for (int a = 0; a < 7; ++a)
    for (int p = 0; p < 3; ++p) {
      out.t[a][p] = -1.0f;
      out.channels[a][p] = 0;
      out.threads[a][p] = 0;
    }
  if (t.nRanks <= 1) {
    out.t[kRing][kSimple] = 0.0f;
    out.channels[kRing][kSimple] = 1;
    out.threads[kRing][kSimple] = 512;
    return out;
  }
  for (int a = 0; a < 7; ++a)
    for (int p = 0; p < 3; ++p) {
      double lat = latencyUs(t, coll, a, p);
      double bw = busBwGBs(t, coll, a, p, nBytes);
      if (lat < 0 || bw <= 0) continue;
      // bus bandwidth -> algorithm bandwidth
      if (a == kRing || ((a == kNvls || a == kNvlsTree) && coll == kAllReduce)) bw *= double(t.nRanks) / nsteps(t, coll);
      else if (a == kTree && coll == kAllReduce) bw *= 0.5;
      int latCount = a == kRing ? numPipeOps : (numPipeOps + kMaxDevWorkBatchColls - 1) / kMaxDevWorkBatchColls;
      if (a == kRing && p == kSimple && coll == kAllReduce && t.nNodes > 1 &&
          nBytes / (static_cast<uint64_t>(t.nChannels) * t.nRanks) >= 64)
        lat *= t.cc >= 1 ? 1.4 : 1.9;  // the ring "plateau"
      out.t[a][p] = static_cast<float>(lat * latCount + nBytes / (1000.0 * bw));
      // channels and threads (topoGetAlgoInfo)
      int nc = (a == kNvls || a == kNvlsTree) ? (t.nNodes > 1 ? std::min(t.nvlsChannels, t.nChannels) : t.nvlsChannels)
                                              : t.nChannels;
      int nt = maxThreads(t, a, p);
      if (a == kRing || a == kTree) {
        double threshold = p == kLL ? (a == kRing ? 8.0 * t.nRanks : 8.0) : p == kLL128 ? 8.0 : 64.0;
        while (nBytes < nc * nt * threshold && nc >= 2) --nc;
        while (nBytes < nc * nt * threshold && nt % 128 == 0 && nt > 128) nt /= 2;
        if (p == kSimple) nt += a == kRing ? 32 : 128;
        nt = std::max(nt, 96);
      }
      if (a == kTree || a == kPat) nt = 640;
      out.channels[a][p] = nc;
      out.threads[a][p] = nt;
    }
  return out;
}

Pick pick(const Table& table) {
  Pick best;
  for (int a = 0; a < 7; ++a)
    for (int p = 0; p < 3; ++p) {
      float v = table.t[a][p];
      if (!(v >= 0.0f)) continue;
      if (best.algo < 0 || v < best.timeUs) {
        best.algo = a;
        best.proto = p;
        best.timeUs = v;
        best.channels = table.channels[a][p];
        best.threads = table.threads[a][p];
      }
    }
  return best;
}

}  // namespace weft::tuner::model
