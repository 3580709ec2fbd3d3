// SPDX-License-Identifier: Apache-2.0
#include "replay.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "weft/nccl/profiler.h"

namespace weft::replay {
namespace {

// NCCL 2.23's numbering for v1 descriptors (kept here, independent of the code under test).
int funcNumber(const std::string& f) {
  static const char* k[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send", "Recv"};
  for (int i = 0; i < 8; ++i)
    if (f == k[i]) return i;
  return 200;
}
int typeNumber(const std::string& t) {
  static const char* k[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
                            "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16"};
  for (int i = 0; i < 10; ++i)
    if (t == k[i]) return i;
  return 200;
}
int algoNumber(const std::string& a) {
  static const char* k[] = {"TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
  for (int i = 0; i < 7; ++i)
    if (a == k[i]) return i;
  return 200;
}
int protoNumber(const std::string& p) {
  if (p == "LL") return 0;
  if (p == "LL128") return 1;
  if (p == "SIMPLE") return 2;
  return 200;
}

template <int V> struct Types;
template <> struct Types<1> { using T = ncclProfiler_v1_t; using D = ncclProfilerEventDescr_v1_t; using A = ncclProfilerEventStateArgs_v1_t; };
template <> struct Types<2> { using T = ncclProfiler_v2_t; using D = ncclProfilerEventDescr_v2_t; using A = ncclProfilerEventStateArgs_v2_t; };
template <> struct Types<3> { using T = ncclProfiler_v3_t; using D = ncclProfilerEventDescr_v3_t; using A = ncclProfilerEventStateArgs_v3_t; };
template <> struct Types<4> { using T = ncclProfiler_v4_t; using D = ncclProfilerEventDescr_v4_t; using A = ncclProfilerEventStateArgs_v4_t; };
template <> struct Types<5> { using T = ncclProfiler_v5_t; using D = ncclProfilerEventDescr_v5_t; using A = ncclProfilerEventStateArgs_v5_t; };
template <> struct Types<6> { using T = ncclProfiler_v6_t; using D = ncclProfilerEventDescr_v6_t; using A = ncclProfilerEventStateArgs_v6_t; };
template <> struct Types<7> { using T = ncclProfiler_v7_t; using D = ncclProfilerEventDescr_v7_t; using A = ncclProfilerEventStateArgs_v7_t; };

std::mutex gLogMu;
std::vector<std::string> gLog;
void logSink(ncclDebugLogLevel, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(gLogMu);
  gLog.emplace_back(buf);
}

constexpr size_t kMaxAhead = 1024;

template <int V>
class Impl : public Profiler {
  using T = typename Types<V>::T;
  using D = typename Types<V>::D;
  using A = typename Types<V>::A;

 public:
  Impl(void* lib, const T* t) : lib_(lib), t_(t) {}
  int version() const override { return V; }
  const char* name() const override { return t_->name != nullptr ? t_->name : "(null)"; }

  int init(Comm& c) override {
    if constexpr (V <= 3) c.initResult = t_->init(&c.ctx, &c.mask);
    else if constexpr (V == 4)
      c.initResult = t_->init(&c.ctx, &c.mask, c.name.c_str(), c.commHash, c.nNodes, c.nRanks, c.rank, logSink);
    else
      c.initResult = t_->init(&c.ctx, c.commHash, &c.mask, c.name.c_str(), c.nNodes, c.nRanks, c.rank, logSink);
    return c.initResult;
  }
  int finalize(Comm& c) override { return t_->finalize(c.ctx); }

  uint64_t run(Comm& c, const std::vector<Op>& ops) override {
    events_ = 0;
    struct Item {
      const Op* op;
      void* handle;
      std::chrono::steady_clock::time_point due;  // when the GPU gets to it
      std::vector<void*> proxyOps;
    };
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    size_t pending = 0;  // enqueued, and the GPU has not run them yet
    bool done = false;
    std::thread proxy([&] {
      // NCCL's proxy thread: a ProxyCtrl event around its work, then each operation's children.
      void* ctrl = start(c, ncclProfileProxyCtrl, nullptr, [](D&) {});
      recordArgs(ctrl, ncclProfilerProxyCtrlActive, [](A& a) { a.proxyCtrl.appendedProxyOps = 1; });
      std::deque<Item> picked;  // proxy ops started, waiting for the GPU
      for (;;) {
        std::unique_lock<std::mutex> lock(mu);
        if (picked.empty()) cv.wait(lock, [&] { return done || !queue.empty(); });
        else cv.wait_until(lock, picked.front().due, [&] { return !queue.empty(); });
        if (queue.empty() && picked.empty() && done) break;
        std::deque<Item> now;
        now.swap(queue);
        lock.unlock();
        cv.notify_all();
        for (Item& it : now) {
          it.proxyOps = startProxyOps(c, *it.op, it.handle);
          picked.push_back(std::move(it));
        }
        while (!picked.empty() && picked.front().due <= std::chrono::steady_clock::now()) {
          children(c, *picked.front().op, picked.front().handle, picked.front().proxyOps);
          picked.pop_front();
          std::lock_guard<std::mutex> g(mu);
          --pending;
          cv.notify_all();
        }
      }
      recordArgs(ctrl, ncclProfilerProxyCtrlIdle, [](A& a) { a.proxyCtrl.appendedProxyOps = 0; });
      stopH(ctrl);
    });
    for (const Op& op : ops) {
      void* group = nullptr;
      void* groupApi = nullptr;
      void* api = nullptr;
      if constexpr (V >= 5) {
        groupApi = start(c, ncclProfileGroupApi, nullptr, [&](D& d) {
          d.groupApi.graphCaptured = op.graphCaptured;
          d.groupApi.groupDepth = 1;
        });
        recordArgs(groupApi, ncclProfilerGroupStartApiStop, nullptr);
        if (op.p2p) {
          api = start(c, ncclProfileP2pApi, groupApi, [&](D& d) {
            d.p2pApi.func = op.func.c_str();
            d.p2pApi.count = op.count;
            d.p2pApi.datatype = op.dtype.c_str();
            d.p2pApi.stream = nullptr;
            d.p2pApi.graphCaptured = op.graphCaptured;
            if constexpr (V >= 7) d.p2pApi.userTag = op.userTag;
          });
        } else {
          api = start(c, ncclProfileCollApi, groupApi, [&](D& d) {
            d.collApi.func = op.func.c_str();
            d.collApi.count = op.count;
            d.collApi.datatype = op.dtype.c_str();
            d.collApi.root = op.root;
            d.collApi.stream = nullptr;
            d.collApi.graphCaptured = op.graphCaptured;
            if constexpr (V >= 7) d.collApi.userTag = op.userTag;
          });
        }
        recordArgs(groupApi, ncclProfilerGroupEndApiStart, nullptr);
      }
      // The v4-style group: the Coll/P2p parent up to v4, their parentGroup from v5.
      group = start(c, ncclProfileGroup, nullptr, [](D&) {});
      void* parent = V >= 5 ? api : group;
      void* h = op.p2p ? startP2p(c, op, parent, group) : startColl(c, op, parent, group);
      if constexpr (V >= 5) {
        void* kl = start(c, ncclProfileKernelLaunch, groupApi, [](D& d) { d.kernelLaunch.stream = nullptr; });
        stopH(kl);
      }
      stopH(h);  // enqueued: NCCL stops Coll/P2p here, long before the work completes
      stopH(api);
      stopH(group);
      stopH(groupApi);
      if (h != nullptr) {
        // A stream holds a bounded number of launched kernels (CUDA's launch queue): the application thread
        // can run only so far ahead of the work, hence of the proxy's events.
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return pending < kMaxAhead; });
        ++pending;
        queue.push_back({&op, h, std::chrono::steady_clock::now() + std::chrono::milliseconds(gpuLagMs_), {}});
        cv.notify_all();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
    proxy.join();
    return events_;
  }

  int startRaw(void* ctx, void** handle, uint64_t typeBit, void* parent, bool nullDescr) override {
    D d;
    std::memset(&d, 0, sizeof(d));
    d.type = static_cast<decltype(d.type)>(typeBit);
    d.parentObj = parent;
    d.rank = 0;
    return t_->startEvent(ctx, handle, nullDescr ? nullptr : &d);
  }
  int stop(void* handle) override { return t_->stopEvent(handle); }
  int record(void* handle, int state, uint64_t arg, bool nullArgs) override {
    A a;
    std::memset(&a, 0, sizeof(a));
    if constexpr (V >= 4) a.kernelCh.pTimer = arg;
    else a.proxyOp.transSize = arg;
    return t_->recordEventState(handle, static_cast<ncclProfilerEventState_t>(state), nullArgs ? nullptr : &a);
  }

  ~Impl() override = default;  // the library stays loaded (as NCCL keeps it)

 private:
  template <typename F>
  void* start(Comm& c, int type, void* parent, F&& fill) {
    // NCCL starts an event only when its type (or a descendant's) is in the activation mask; the hierarchy's
    // ancestors are always on.
    bool always = type == ncclProfileGroup || type == ncclProfileGroupApi || type == ncclProfileCollApi ||
                  type == ncclProfileP2pApi || type == ncclProfileKernelLaunch;
    if (!always && (c.mask & type) == 0) {
      bool ancestor = ((type == ncclProfileColl || type == ncclProfileP2p) &&
                       (c.mask & (ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh |
                                  ncclProfileNetPlugin | ncclProfileKernelPhase))) ||
                      (type == ncclProfileKernelCh && (c.mask & ncclProfileKernelPhase));  // 2.32 turns it on
      if (!ancestor) return nullptr;
    }
    D d;
    std::memset(&d, 0, sizeof(d));
    d.type = static_cast<decltype(d.type)>(type);
    d.parentObj = parent;
    d.rank = c.rank;
    fill(d);
    void* h = nullptr;
    t_->startEvent(c.ctx, &h, &d);
    ++events_;
    return h;
  }
  void stopH(void* h) {
    if (h != nullptr) t_->stopEvent(h);  // NCCL guards its own stops on NULL
  }
  template <typename F>
  void recordArgs(void* h, int state, F&& fill) {
    if (h == nullptr) return;
    A a;
    std::memset(&a, 0, sizeof(a));
    if constexpr (!std::is_same_v<std::decay_t<F>, std::nullptr_t>) {
      fill(a);
      t_->recordEventState(h, static_cast<ncclProfilerEventState_t>(state), &a);
    } else {
      t_->recordEventState(h, static_cast<ncclProfilerEventState_t>(state), nullptr);
    }
  }

  void* startColl(Comm& c, const Op& op, void* parent, void* group) {
    return start(c, ncclProfileColl, parent, [&](D& d) {
      if constexpr (V == 1) {
        d.coll.name = c.name.c_str();
        d.coll.commHash = c.commHash;
        d.coll.seqNumber = op.seq;
        d.coll.func = static_cast<uint8_t>(funcNumber(op.func));
        d.coll.count = op.count;
        d.coll.root = op.root;
        d.coll.datatype = static_cast<uint8_t>(typeNumber(op.dtype));
        d.coll.trafficBytes = op.count;
        d.coll.nMaxChannels = static_cast<uint8_t>(op.nChannels);
        d.coll.nWarps = static_cast<uint8_t>(op.nWarps);
        d.coll.algo = static_cast<uint8_t>(algoNumber(op.algo));
        d.coll.proto = static_cast<uint8_t>(protoNumber(op.proto));
      } else if constexpr (V <= 3) {
        d.coll.name = c.name.c_str();
        d.coll.commHash = c.commHash;
        d.coll.seqNumber = op.seq;
        d.coll.func = op.func.c_str();
        d.coll.count = op.count;
        d.coll.root = op.root;
        d.coll.datatype = op.dtype.c_str();
        d.coll.nMaxChannels = static_cast<uint8_t>(op.nChannels);
        d.coll.nWarps = static_cast<uint8_t>(op.nWarps);
        d.coll.algo = op.algo.c_str();
        d.coll.proto = op.proto.c_str();
      } else {
        d.coll.seqNumber = op.seq;
        d.coll.func = op.func.c_str();
        d.coll.count = op.count;
        d.coll.root = op.root;
        d.coll.datatype = op.dtype.c_str();
        d.coll.nChannels = static_cast<uint8_t>(op.nChannels);
        d.coll.nWarps = static_cast<uint8_t>(op.nWarps);
        d.coll.algo = op.algo.c_str();
        d.coll.proto = op.proto.c_str();
        if constexpr (V >= 5) d.coll.parentGroup = group;
        if constexpr (V >= 7) {
          d.coll.kernelVariant = nullptr;
          d.coll.isSymColl = !op.phases.empty();
          d.coll.userTag = op.userTag;
        }
      }
    });
  }

  void* startP2p(Comm& c, const Op& op, void* parent, void* group) {
    return start(c, ncclProfileP2p, parent, [&](D& d) {
      if constexpr (V == 1) {
        d.p2p.name = c.name.c_str();
        d.p2p.commHash = c.commHash;
        d.p2p.func = static_cast<uint8_t>(funcNumber(op.func));
        d.p2p.datatype = static_cast<uint8_t>(typeNumber(op.dtype));
        d.p2p.count = op.count;
        d.p2p.peer = op.peer;
      } else if constexpr (V <= 3) {
        d.p2p.name = c.name.c_str();
        d.p2p.commHash = c.commHash;
        d.p2p.func = op.func.c_str();
        d.p2p.datatype = op.dtype.c_str();
        d.p2p.count = op.count;
        d.p2p.peer = op.peer;
      } else {
        d.p2p.func = op.func.c_str();
        d.p2p.datatype = op.dtype.c_str();
        d.p2p.count = op.count;
        d.p2p.peer = op.peer;
        d.p2p.nChannels = static_cast<uint8_t>(op.nChannels);
        if constexpr (V >= 5) d.p2p.parentGroup = group;
        if constexpr (V >= 7) d.p2p.userTag = op.userTag;
      }
    });
  }

  // What NCCL's proxy thread sends for one operation after it was enqueued.
  // The proxy picks an operation up: one ProxyOp per peer, started (and in progress, v4+) before any data moves.
  std::vector<void*> startProxyOps(Comm& c, const Op& op, void* h) {
    std::vector<void*> out;
    for (int peer : op.proxyPeers) {
      void* opH = start(c, ncclProfileProxyOp, op.proxyParent != nullptr ? op.proxyParent : h, [&](D& d) {
        d.proxyOp.pid = op.proxyPid != 0 ? op.proxyPid : getpid();
        d.proxyOp.channelId = 0;
        d.proxyOp.peer = peer;
        d.proxyOp.nSteps = op.nSteps;
        d.proxyOp.chunkSize = static_cast<int>(op.stepBytes);
        d.proxyOp.isSend = op.isSend ? 1 : 0;
      });
      if constexpr (V >= 4) recordArgs(opH, ncclProfilerProxyOpInProgress_v4, nullptr);
      out.push_back(opH);
    }
    return out;
  }

  // The GPU runs the operation: the proxy ops' steps and stops, then the kernel channels.
  void children(Comm& c, const Op& op, void* h, const std::vector<void*>& proxyOps) {
    for (void* opH : proxyOps) {
      for (int s = 0; s < op.nSteps; ++s) {
        void* stepH = start(c, ncclProfileProxyStep, opH, [&](D& d) { d.proxyStep.step = s; });
        if constexpr (V >= 4) {
          recordArgs(stepH, op.isSend ? ncclProfilerProxyStepSendGPUWait : ncclProfilerProxyStepRecvWait,
                     [&](A& a) { a.proxyStep.transSize = op.stepBytes; });
          recordArgs(stepH, op.isSend ? ncclProfilerProxyStepSendWait : ncclProfilerProxyStepRecvFlushWait,
                     [&](A& a) { a.proxyStep.transSize = op.stepBytes; });
        }
        if constexpr (V >= 3) {
          if (stepH != nullptr) {
            ncclProfilerNetIbDescr_v1_t ib;
            std::memset(&ib, 0, sizeof(ib));
            ib.type = 1;
            ib.qp.wr_id = static_cast<uint64_t>(s);
            ib.qp.qpNum = 7;
            ib.qp.length = op.stepBytes;
            void* netH = start(c, ncclProfileNetPlugin, stepH, [&](D& d) {
              d.netPlugin.id = static_cast<int64_t>(NCCL_PROFILER_NET_TYPE_IB | 1);
              d.netPlugin.data = &ib;
            });
            stopH(netH);
          }
        }
        stopH(stepH);
        if constexpr (V <= 3) {
          recordArgs(opH, op.isSend ? ncclProfilerProxyOpSendTransmitted : ncclProfilerProxyOpRecvReceived, [&](A& a) {
            a.proxyOp.transSize = op.stepBytes * static_cast<uint64_t>(s + 1);
            a.proxyOp.steps = s + 1;
          });
        }
      }
      stopH(opH);
    }
    if constexpr (V >= 3) {
      for (int ch = 0; ch < op.nChannels; ++ch) {
        uint64_t p0 = ch < static_cast<int>(op.pStart.size()) ? op.pStart[ch] : 0;
        uint64_t p1 = ch < static_cast<int>(op.pStop.size()) ? op.pStop[ch] : 0;
        void* kh = start(c, ncclProfileKernelCh, h, [&](D& d) {
          d.kernelCh.channelId = static_cast<uint8_t>(ch);
          if constexpr (V >= 4) d.kernelCh.pTimer = p0;
        });
        if constexpr (V >= 7) {
          // NCCL 2.32 fires a channel's phases just before its KernelCh stops: each started, its stop time recorded
          // in the kernelCh arm of the state arguments, stopped.
          if (kh != nullptr && ch < static_cast<int>(op.phases.size())) {
            static const char* const kPhaseNames[] = {"initial_sync", "compute", "final_sync"};
            const auto& b = op.phases[ch];
            for (int ph = 0; ph < 3; ++ph) {
              if (b[ph] == 0 || b[ph + 1] == 0 || b[ph] == b[ph + 1]) continue;
              void* phH = start(c, ncclProfileKernelPhase, kh, [&](D& d) {
                d.kernelPhase.channelId = static_cast<uint8_t>(ch);
                d.kernelPhase.phaseId = static_cast<uint8_t>(ph);
                d.kernelPhase.phaseName = kPhaseNames[ph];
                d.kernelPhase.pTimer = b[ph];
              });
              recordArgs(phH, ncclProfilerKernelPhaseStop, [&](A& a) { a.kernelCh.pTimer = b[ph + 1]; });
              stopH(phH);
            }
          }
        }
        if constexpr (V >= 4) recordArgs(kh, ncclProfilerKernelChStop, [&](A& a) { a.kernelCh.pTimer = p1; });
        stopH(kh);
      }
    }
  }

  void* lib_;
  const T* t_;
  std::atomic<uint64_t> events_{0};
};

template <int V>
std::unique_ptr<Profiler> make(void* lib) {
  std::string sym = "ncclProfiler_v" + std::to_string(V);
  void* t = dlsym(lib, sym.c_str());
  if (t == nullptr) return nullptr;
  return std::make_unique<Impl<V>>(lib, static_cast<const typename Types<V>::T*>(t));
}

}  // namespace

std::vector<std::string> logLines() {
  std::lock_guard<std::mutex> lock(gLogMu);
  return gLog;
}

std::unique_ptr<Profiler> Profiler::load(const std::string& path, int version) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) throw std::runtime_error("cannot load " + path + ": " + dlerror());
  std::unique_ptr<Profiler> p;
  for (int v = 7; v >= 1 && p == nullptr; --v) {
    if (version != 0 && v != version) continue;
    switch (v) {
      case 7: p = make<7>(lib); break;
      case 6: p = make<6>(lib); break;
      case 5: p = make<5>(lib); break;
      case 4: p = make<4>(lib); break;
      case 3: p = make<3>(lib); break;
      case 2: p = make<2>(lib); break;
      case 1: p = make<1>(lib); break;
    }
  }
  if (p == nullptr) {
    throw std::runtime_error(path + " exports no ncclProfiler_v" +
                             (version != 0 ? std::to_string(version) : std::string("1..7")));
  }
  return p;
}

}  // namespace weft::replay
