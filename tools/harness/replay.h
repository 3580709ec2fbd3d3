// SPDX-License-Identifier: Apache-2.0
// Drives any NCCL profiler plugin file the way NCCL does: dlopen, ncclProfiler_vN, init with that version's
// arguments (one context per communicator), then per operation the event tree NCCL builds
// (docs/nccl-semantics.md §profiler-events): on the application thread the group (v1-v4) or GroupApi -> CollApi/P2pApi (v5+), the Coll/P2p event started and
// stopped at enqueue; on a separate proxy thread, afterwards, the ProxyOp -> ProxyStep -> NetPlugin events with
// their states and the KernelCh events with GPU timers (v4+), each preceded by its barrier phases (v7); then
// finalize. Every descriptor is built in the
// exact layout of its version.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weft::replay {

struct Op {
  bool p2p = false;
  std::string func = "AllReduce";   // v2+ name; v1 gets NCCL 2.23's number
  std::string dtype = "ncclFloat32";
  uint64_t count = 1024;
  int root = -1;
  int peer = -1;                    // p2p
  std::string algo = "RING";
  std::string proto = "SIMPLE";
  int nChannels = 2;
  int nWarps = 16;
  uint64_t seq = 0;
  bool graphCaptured = false;
  // kernel channels: GPU timer start and stop (v4+), per channel
  std::vector<uint64_t> pStart, pStop;
  // v7: the user's tag of the call (on CollApi/P2pApi and Coll/P2p), and per channel the kernel's barrier phase
  // boundaries (GPU timer): initial sync [b0,b1], compute [b1,b2], final sync [b2,b3]. As NCCL 2.32 does, a phase
  // with a zero boundary or no length is not sent; phases go only where the mask asks for ncclProfileKernelPhase.
  uint64_t userTag = 0;
  std::vector<std::array<uint64_t, 4>> phases;
  // proxy ops: one per peer; each moves nSteps steps of stepBytes
  std::vector<int> proxyPeers;
  int nSteps = 2;
  uint64_t stepBytes = 65536;
  bool isSend = true;
  pid_t proxyPid = 0;               // 0: this process; another value plays a PXN op from a peer's proxy
  void* proxyParent = nullptr;      // overrides the op's parent (PXN: an address from another process)
};

struct Comm {
  uint64_t commHash = 0;
  std::string name = "replay";
  int nNodes = 1, nRanks = 2, rank = 0;
  void* ctx = nullptr;
  int mask = 0;
  int initResult = 0;
};

class Profiler {
 public:
  // version 0: the newest the file exports. Throws std::runtime_error naming what is missing.
  static std::unique_ptr<Profiler> load(const std::string& path, int version);
  virtual ~Profiler() = default;
  virtual int version() const = 0;
  virtual const char* name() const = 0;
  virtual int init(Comm& c) = 0;
  virtual int finalize(Comm& c) = 0;
  // Replays the operations of one communicator: application events on the calling thread, proxy and kernel
  // events on a proxy thread that follows behind (as NCCL's proxy does). Returns the number of events sent.
  virtual uint64_t run(Comm& c, const std::vector<Op>& ops) = 0;
  // The GPU this long behind the CPU (as when the application enqueues far ahead of the work): the proxy picks
  // each operation up at once (its ProxyOp starts), but the steps, the ProxyOp stops and the kernel channels come
  // only `ms` after the operation was enqueued.
  void setGpuLagMs(int ms) { gpuLagMs_ = ms; }

 protected:
  int gpuLagMs_ = 0;

 public:
  // Raw entry points, for hostile-input tests: a descriptor of this version with the given type bits.
  virtual int startRaw(void* ctx, void** handle, uint64_t typeBit, void* parent, bool nullDescr) = 0;
  virtual int stop(void* handle) = 0;
  virtual int record(void* handle, int state, uint64_t arg, bool nullArgs) = 0;
};

// What the plugin logged through the logger handed to init (v4+).
std::vector<std::string> logLines();

}  // namespace weft::replay
