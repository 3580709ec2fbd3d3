// SPDX-License-Identifier: Apache-2.0
#include "check_support.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <stdexcept>

namespace weft::harness {

const char* resultName(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
  }
  return "unknown ncclResult_t";
}

bool WorkerSession::open(const WorkerArgs& wa, std::string* error) {
  plugin_ = LoadedPlugin::open(wa.plugin, wa.table, error);
  if (!plugin_) return false;
  oob_ = std::make_unique<Oob>(wa.oobFd);
  NetApi& net = plugin_->api();
  env_ = std::make_unique<CheckEnv>(CheckEnv{wa.role == "recv" ? Role::kRecv : Role::kSend, net, *oob_});
  CheckEnv& env = *env_;
  env.dev = wa.dev;
  env.quick = wa.quick;
  env.soakMessages = wa.soakMessages;
  env.cycles = wa.cycles;
  env.conns = wa.conns;
  env.minFlows = wa.minFlows;
  env.plugin = plugin_.get();
  env.maxEndpoints = wa.maxEndpoints;
  env.traceDir = wa.traceDir;
  env.maxRecvs = wa.maxRecvs;
  env.timeout = std::chrono::seconds(wa.timeoutSec);
  env.callLimit = std::chrono::milliseconds(wa.callLimitMs);
  env.isWeft = std::string(net.name()) == "weft";
  ncclResult_t r = net.init(&env.ctx, 0xC0FFEE);
  if (r != ncclSuccess) {
    *error = std::string("init returned ") + resultName(r);
    return false;
  }
  if ((r = net.devices(&ndev_)) != ncclSuccess || ndev_ <= 0) {
    *error = "the plugin offers no device (devices() = " + std::to_string(ndev_) + ", " + resultName(r) + ")" +
             (warningCount() ? ": " + lastWarning() : "");
    return false;
  }
  if (wa.dev >= ndev_) {
    *error = "device " + std::to_string(wa.dev) + " does not exist";
    return false;
  }
  if (!wa.fuse.empty() && !fuse(wa.fuse, error)) return false;
  if ((r = net.getProperties(env.dev, &env.props)) != ncclSuccess) {
    *error = std::string("getProperties returned ") + resultName(r);
    return false;
  }
  return true;
}

// NIC fusion as NCCL 2.24+ runs it: makeVDevice with the member devices, then devices() again (physical +
// virtual), then the new device's properties must list its members; from then on only the fused device is used.
bool WorkerSession::fuse(const std::string& list, std::string* error) {
  NetApi& net = env_->net;
  std::vector<int> devs;
  for (const auto& t : split(list, ',')) {
    if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos || t.size() > 4 ||
        std::stoi(t) >= ndev_) {
      *error = "--fuse wants existing device numbers separated by commas (there are " + std::to_string(ndev_) +
               "), got '" + list + "'";
      return false;
    }
    devs.push_back(std::stoi(t));
  }
  if (!net.hasMakeVDevice()) {
    *error = "this table (v" + std::to_string(net.version()) + ") has no makeVDevice";
    return false;
  }
  int vdev = -1, after = 0;
  ncclResult_t r = net.makeVDevice(devs, &vdev);
  if (r != ncclSuccess) {
    *error = std::string("makeVDevice(") + list + ") returned " + resultName(r) +
             (warningCount() ? ": " + lastWarning() : "");
    return false;
  }
  if ((r = net.devices(&after)) != ncclSuccess || after != ndev_ + 1 || vdev < 0 || vdev >= after) {
    *error = "after makeVDevice, devices() = " + std::to_string(after) + " (expected " + std::to_string(ndev_ + 1) +
             ") and the new device is " + std::to_string(vdev);
    return false;
  }
  Props p;
  if ((r = net.getProperties(vdev, &p)) != ncclSuccess || p.vDevs != devs) {
    *error = "getProperties of the fused device " + std::to_string(vdev) + " does not list its members in vProps";
    return false;
  }
  ndev_ = after;
  env_->dev = vdev;
  return true;
}

WorkerSession::~WorkerSession() {
  if (env_ && env_->ctx != nullptr && env_->net.hasFinalize()) env_->net.finalize(env_->ctx);
}

void fail(const std::string& why) { throw CheckFailure(why); }

void expectOk(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess) fail(what + " returned " + resultName(r));
}

void checkPeer(CheckEnv& env) {
  std::string m;
  if (env.oob.tryRecv(&m)) {
    env.oob.pushBack(m);
    // A peer that passed may simply have finished first (its sends left; our receives are still arriving):
    // only a failed or skipped peer is a reason to stop.
    bool passed = m.size() >= 5 && m.compare(m.size() - 5, 5, ":PASS") == 0;
    if (m.rfind("verdict:", 0) == 0 && !passed) throw PeerAborted("the peer process gave up on this check");
  }
}

std::string fmtSize(size_t b) {
  if (b >= (1u << 30) && b % (1u << 30) == 0) return std::to_string(b >> 30) + " GiB";
  if (b >= (1u << 20) && b % (1u << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

Buffer::Buffer(size_t size, MemKind kind) : size_(size), kind_(kind) {
  size_t bytes = size == 0 ? 4096 : (size + 4095) & ~size_t{4095};
  if (kind == MemKind::kCuda) {
    std::string why;
    CudaDriver* cuda = CudaDriver::get(&why);
    if (cuda == nullptr) throw std::runtime_error(why);
    data_ = cuda->alloc(bytes);
    mapped_ = bytes;
    return;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("cannot allocate " + fmtSize(bytes));
  data_ = static_cast<uint8_t*>(p);
  mapped_ = bytes;
}

Buffer::~Buffer() {
  if (data_ == nullptr) return;
  if (device()) {
    CudaDriver::get(nullptr)->free(data_);
  } else {
    munmap(data_, mapped_);
  }
}

namespace {
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

void fillPattern(void* buf, size_t len, uint64_t seed) {
  auto* p = static_cast<uint8_t*>(buf);
  uint64_t base = mix(seed);
  size_t words = len / 8;
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (size_t i = 0; i < words; ++i) w[i] = base ^ (i * 0x100000001b3ull);
  for (size_t i = words * 8; i < len; ++i) p[i] = static_cast<uint8_t>(base >> (8 * (i % 8))) ^ 0x5a;
}

size_t findMismatch(const void* buf, size_t len, uint64_t seed) {
  auto* p = static_cast<const uint8_t*>(buf);
  uint64_t base = mix(seed);
  size_t words = len / 8;
  auto* w = reinterpret_cast<const uint64_t*>(p);
  for (size_t i = 0; i < words; ++i) {
    if (w[i] != (base ^ (i * 0x100000001b3ull))) {
      for (size_t b = i * 8; b < i * 8 + 8; ++b) {
        uint64_t expect = base ^ (i * 0x100000001b3ull);
        if (p[b] != static_cast<uint8_t>(expect >> (8 * (b % 8)))) return b;
      }
      return i * 8;
    }
  }
  for (size_t i = words * 8; i < len; ++i) {
    if (p[i] != (static_cast<uint8_t>(base >> (8 * (i % 8))) ^ 0x5a)) return i;
  }
  return SIZE_MAX;
}

void Buffer::fill(size_t off, size_t len, uint64_t seed) {
  if (!device()) return fillPattern(data_ + off, len, seed);
  staging_.resize(len);
  fillPattern(staging_.data(), len, seed);
  CudaDriver::get(nullptr)->toDevice(data_ + off, staging_.data(), len);
}

size_t Buffer::mismatch(size_t off, size_t len, uint64_t seed) const {
  if (!device()) return findMismatch(data_ + off, len, seed);
  staging_.resize(len);
  CudaDriver::get(nullptr)->toHost(staging_.data(), data_ + off, len);
  return findMismatch(staging_.data(), len, seed);
}

void Buffer::set(size_t off, size_t len, uint8_t v) {
  if (!device()) {
    std::memset(data_ + off, v, len);
  } else {
    CudaDriver::get(nullptr)->set(data_ + off, v, len);
  }
}

void Buffer::read(size_t off, size_t len, void* out) const {
  if (!device()) {
    std::memcpy(out, data_ + off, len);
  } else {
    CudaDriver::get(nullptr)->toHost(out, data_ + off, len);
  }
}

// NCCL hands back whatever regMr returned, NULL included (src/transport/net.cc keeps the handle and passes it to
// isend/irecv/deregMr; NCCL's Socket transport returns NULL for host memory): a NULL handle is not an error here.
Registration::Registration(NetApi& net, void* comm, void* data, size_t size, int type) : net_(net), comm_(comm) {
  expectOk(net_.regMr(comm, data, size, type, &mh_), "regMr(" + fmtSize(size) + ")");
  registered_ = true;
}

Registration::Registration(CheckEnv& env, void* comm, const Buffer& buf, size_t off, size_t len)
    : net_(env.net), comm_(comm) {
  if (len == SIZE_MAX) len = buf.size() - off;
  uint8_t* p = buf.data() + off;
  if (!buf.device()) {
    expectOk(net_.regMr(comm, p, len, NCCL_PTR_HOST, &mh_), "regMr(" + fmtSize(len) + ")");
  } else if (env.dmabuf) {
    std::string why;
    uint64_t offset = 0;
    int fd = CudaDriver::get(nullptr)->dmabuf(p, len, &offset, &why);
    if (fd < 0) throw CheckSkip("the device advertises NCCL_PTR_DMABUF but " + why);
    ncclResult_t r = net_.regMrDmaBuf(comm, p, len, NCCL_PTR_CUDA, offset, fd, &mh_);
    close(fd);  // as NCCL: the plugin keeps its own reference to what it registered
    expectOk(r, "regMrDmaBuf(" + fmtSize(len) + ", GPU memory)");
  } else {
    CudaDriver* cuda = CudaDriver::get(nullptr);
    cuda->cpuWindow(p, len, true);
    ncclResult_t r = net_.regMr(comm, p, len, NCCL_PTR_CUDA, &mh_);
    cuda->cpuWindow(p, len, false);
    expectOk(r, "regMr(" + fmtSize(len) + ", GPU memory)");
  }
  registered_ = true;
}

void Registration::release() {
  if (registered_) {
    registered_ = false;
    expectOk(net_.deregMr(comm_, mh_), "deregMr");
    mh_ = nullptr;
  }
}

Registration::~Registration() {
  if (registered_) net_.deregMr(comm_, mh_);
}

void noteCallTime(CheckEnv& env, const std::string& what, std::chrono::steady_clock::duration dt) {
  double ms = std::chrono::duration<double, std::milli>(dt).count();
  if (ms > env.slowestCall.ms) env.slowestCall = CheckEnv::SlowestCall{ms, what};
  if (dt > env.callLimit) {
    fail(what + " did not return for " + std::to_string(static_cast<long>(ms)) + " ms (backstop " +
         std::to_string(env.callLimit.count()) + " ms): NCCL polls connect/accept from one thread and needs them "
         "non-blocking");
  }
}

Conn establish(CheckEnv& env, const std::string& label, uint8_t* handleCopy) {
  Conn c;
  Deadline deadline(env.timeout);
  if (env.recv()) {
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    void* listenComm = nullptr;
    timedCall(env, "listen", [&] { return env.net.listen(env.ctx, env.dev, handle, &listenComm); });
    if (listenComm == nullptr) fail("listen succeeded but returned a NULL listen comm");
    env.oob.send(std::string("handle:") + label + ":" + std::string(reinterpret_cast<char*>(handle), sizeof(handle)));
    while (c.recvComm == nullptr) {
      timedCall(env, "accept", [&] { return env.net.accept(listenComm, &c.recvComm); });
      // As NCCL's progress thread does when nothing moved (src/proxy.cc v2.28.9 line 986: sched_yield): two
      // spinning processes on one core otherwise wait a scheduler tick per call.
      if (c.recvComm == nullptr) std::this_thread::yield();
      if (deadline.expired()) {
        env.net.closeListen(listenComm);
        fail("accept did not complete within " + std::to_string(env.timeout.count()) + " s");
      }
      checkPeer(env);
    }
    expectOk(env.net.closeListen(listenComm), "closeListen after accept");
  } else {
    std::string m = env.oob.recvString(env.timeout);
    std::string prefix = "handle:" + label + ":";
    if (m.rfind("verdict:", 0) == 0) {
      env.oob.pushBack(m);
      throw PeerAborted("the peer process gave up before sending a handle");
    }
    if (m.rfind(prefix, 0) != 0 || m.size() != prefix.size() + NCCL_NET_HANDLE_MAXSIZE) fail("bad handle message");
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
    std::memcpy(handle, m.data() + prefix.size(), sizeof(handle));
    if (handleCopy != nullptr) std::memcpy(handleCopy, handle, sizeof(handle));
    while (c.sendComm == nullptr) {
      timedCall(env, "connect", [&] { return env.net.connect(env.ctx, env.dev, handle, &c.sendComm); });
      if (c.sendComm == nullptr) std::this_thread::yield();
      if (deadline.expired()) fail("connect did not complete within " + std::to_string(env.timeout.count()) + " s");
      checkPeer(env);
    }
  }
  env.oob.barrier("connected:" + label, env.timeout);
  return c;
}

void closeConn(CheckEnv& env, Conn& c) {
  if (c.sendComm) expectOk(env.net.closeSend(c.sendComm), "closeSend");
  if (c.recvComm) expectOk(env.net.closeRecv(c.recvComm), "closeRecv");
  c = Conn{};
}

std::vector<int> waitRequest(CheckEnv& env, void* req, int n, const std::string& what, bool sizesNull) {
  std::vector<int> sizes(NCCL_PROXY_MAX_SUBS, 0);
  Deadline deadline(env.timeout);
  for (uint64_t i = 0;; ++i) {
    int done = 0;
    expectOk(env.net.test(req, &done, sizesNull ? nullptr : sizes.data()), "test(" + what + ")");
    if (done) break;
    if (deadline.expired()) fail(what + " did not complete within " + std::to_string(env.timeout.count()) + " s");
    if (i % 1024 == 0) checkPeer(env);
  }
  sizes.resize(n);
  return sizes;
}

StreamState::StreamState(CheckEnv& env, Conn& c, const StreamSpec& spec)
    : env_(env),
      conn_(c),
      spec_(spec),
      buf_(spec.slotSize * spec.inflight, env.mem),
      reg_(env, c.comm(), buf_) {}

StreamState::~StreamState() = default;

bool StreamState::step() {
  const size_t total = spec_.sizes.size();
  // Post while a slot is free.
  if (next_ < total && inflight_.size() < static_cast<size_t>(spec_.inflight)) {
    size_t i = next_;
    const size_t off = (i % spec_.inflight) * spec_.slotSize;
    uint8_t* slot = buf_.data() + off;
    void* req = nullptr;
    if (env_.recv()) {
      size_t want = spec_.recvSize ? spec_.recvSize : spec_.slotSize;
      void* data[1] = {slot};
      size_t sizes[1] = {want};
      int tags[1] = {spec_.tag};
      void* mhs[1] = {reg_.mh()};
      if (spec_.requestHint) req = reinterpret_cast<void*>(static_cast<uintptr_t>(NCCL_NET_OPTIONAL_RECV_COMPLETION));
      expectOk(env_.net.irecv(conn_.recvComm, 1, data, sizes, tags, mhs, &req), "irecv");
      if (spec_.requestHint && req == reinterpret_cast<void*>(static_cast<uintptr_t>(NCCL_NET_OPTIONAL_RECV_COMPLETION))) {
        fail("irecv left *request at the NCCL_NET_OPTIONAL_RECV_COMPLETION hint value; it must always write it");
      }
    } else {
      buf_.fill(off, spec_.sizes[i], spec_.seed * 1000003 + i);
      expectOk(env_.net.isend(conn_.sendComm, slot, spec_.sizes[i], spec_.tag, reg_.mh(), &req), "isend");
    }
    if (req != nullptr) {
      inflight_.emplace_back(i, req);
      ++next_;
    }
  }
  // Test the oldest.
  if (!inflight_.empty()) {
    auto [i, req] = inflight_.front();
    int sizes[NCCL_PROXY_MAX_SUBS] = {};
    int done = 0;
    expectOk(env_.net.test(req, &done, sizes), "test");
    if (done) {
      inflight_.pop_front();
      ++doneCount_;
      if (env_.recv() && spec_.requestHint) {
        // As NCCL's LL/LL128 do: the receive may have been reported done before its data came; the GPU then
        // watches the data itself and nobody calls the plugin for this connection. A plugin whose data needs
        // further progress calls to land must not complete early: this wait then times out.
        const size_t off = (i % spec_.inflight) * spec_.slotSize;
        Deadline arrival(env_.timeout);
        while (buf_.mismatch(off, spec_.sizes[i], spec_.seed * 1000003 + i) != SIZE_MAX) {
          if (arrival.expired()) {
            fail("receive " + std::to_string(i) + " was reported done under the optional-completion hint, but its "
                 "data never arrived without further calls into the plugin (data that needs progress calls must "
                 "not complete early)");
          }
        }
        return doneCount_ == total;
      }
      if (static_cast<size_t>(sizes[0]) != spec_.sizes[i]) {
        fail((env_.recv() ? "receive " : "send ") + std::to_string(i) + " reported " + std::to_string(sizes[0]) +
             " bytes, expected " + std::to_string(spec_.sizes[i]));
      }
      if (env_.recv()) {
        const size_t off = (i % spec_.inflight) * spec_.slotSize;
        size_t bad = buf_.mismatch(off, spec_.sizes[i], spec_.seed * 1000003 + i);
        if (bad != SIZE_MAX) {
          fail("message " + std::to_string(i) + " (" + fmtSize(spec_.sizes[i]) + ") corrupted at byte " +
               std::to_string(bad));
        }
      }
    }
  }
  return doneCount_ == total;
}

void stream(CheckEnv& env, Conn& c, const StreamSpec& spec) {
  StreamState s(env, c, spec);
  Deadline deadline(env.timeout);
  for (uint64_t it = 0; !s.step(); ++it) {
    if (deadline.expired()) fail("stream did not finish within " + std::to_string(env.timeout.count()) + " s");
    if (it % 4096 == 0) checkPeer(env);
  }
}

}  // namespace weft::harness
