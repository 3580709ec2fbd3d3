// SPDX-License-Identifier: Apache-2.0
// What the checks share: buffers with verifiable contents, deadlines, connection set-up the way NCCL's proxy
// polls it, and NCCL-shaped message streams (NCCL_STEPS slots in flight, oldest request tested first).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "checks.h"
#include "device_memory.h"

namespace weft::harness {

// A worker's hold on the plugin under test: loaded, initialised for one communicator, its device chosen. The
// communicator is finalized on every way out of the worker, as NCCL's destroy would.
class WorkerSession {
 public:
  WorkerSession() = default;
  ~WorkerSession();
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;
  // False, with the reason, when the plugin cannot be used at all.
  bool open(const WorkerArgs& wa, std::string* error);
  CheckEnv& env() { return *env_; }
  int deviceCount() const { return ndev_; }

 private:
  bool fuse(const std::string& list, std::string* error);
  std::unique_ptr<LoadedPlugin> plugin_;
  std::unique_ptr<Oob> oob_;
  std::unique_ptr<CheckEnv> env_;
  int ndev_ = 0;
};

[[noreturn]] void fail(const std::string& why);
void expectOk(ncclResult_t r, const std::string& what);

// Throws PeerAborted when the peer has given up on the current check (it sent its verdict early).
void checkPeer(CheckEnv& env);

class Deadline {
 public:
  explicit Deadline(std::chrono::milliseconds d) : end_(std::chrono::steady_clock::now() + d) {}
  bool expired() const { return std::chrono::steady_clock::now() > end_; }

 private:
  std::chrono::steady_clock::time_point end_;
};

// Page-aligned host memory (mmap), or device memory from the CUDA driver (MemKind::kCuda), freed on
// destruction. Checks that run over either kind fill and verify through fill()/mismatch(), which copy through
// the driver for device memory: the harness never touches device memory with the CPU.
class Buffer {
 public:
  explicit Buffer(size_t size, MemKind kind = MemKind::kHost);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool device() const { return kind_ == MemKind::kCuda; }
  // fillPattern / findMismatch on [off, off + len), for either kind.
  void fill(size_t off, size_t len, uint64_t seed);
  size_t mismatch(size_t off, size_t len, uint64_t seed) const;
  void set(size_t off, size_t len, uint8_t v);
  // Copies [off, off + len) out (for checks that compare bytes past a message).
  void read(size_t off, size_t len, void* out) const;

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  MemKind kind_ = MemKind::kHost;
  mutable std::vector<uint8_t> staging_;  // device kind: host copy for fill/verify
};

// Deterministic contents: both processes compute the same bytes from (seed, offset).
void fillPattern(void* buf, size_t len, uint64_t seed);
// Returns the first differing offset, or SIZE_MAX when all bytes match.
size_t findMismatch(const void* buf, size_t len, uint64_t seed);

// A memory registration that is released when it goes out of scope.
class Registration {
 public:
  Registration(NetApi& net, void* comm, void* data, size_t size, int type = NCCL_PTR_HOST);
  // [off, off + len) of `buf` (len SIZE_MAX: to its end) registered as NCCL would: host memory with regMr;
  // device memory with regMrDmaBuf where the device advertises NCCL_PTR_DMABUF (and env.dmabuf), else regMr of
  // type NCCL_PTR_CUDA (inside the mock driver's registration window).
  Registration(CheckEnv& env, void* comm, const Buffer& buf, size_t off = 0, size_t len = SIZE_MAX);
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  void* mh() const { return mh_; }
  void release();

 private:
  NetApi& net_;
  void* comm_;
  void* mh_ = nullptr;
  bool registered_ = false;
};

struct Conn {
  void* sendComm = nullptr;  // set on the sending rank
  void* recvComm = nullptr;  // set on the receiving rank
  void* comm() const { return sendComm ? sendComm : recvComm; }
};

// Accounts one listen/connect/accept call that took `dt`: kept if it is the slowest of the check, a failure past
// the backstop (env.callLimit).
void noteCallTime(CheckEnv& env, const std::string& what, std::chrono::steady_clock::duration dt);

// Runs one listen/connect/accept call: it must succeed, and its time is accounted as noteCallTime says.
template <typename F>
void timedCall(CheckEnv& env, const char* what, F&& call) {
  auto t0 = std::chrono::steady_clock::now();
  ncclResult_t r = call();
  auto dt = std::chrono::steady_clock::now() - t0;
  expectOk(r, what);
  noteCallTime(env, what, dt);
}

// listen (receiver) -> handle over the OOB channel -> connect/accept polled until both exist, each call
// required to return quickly (NCCL polls them from one service thread). `label` keeps handles of several
// connections apart.
// handleCopy (sending rank only): receives the handle bytes it connected with.
Conn establish(CheckEnv& env, const std::string& label = "conn", uint8_t* handleCopy = nullptr);
void closeConn(CheckEnv& env, Conn& c);

// Polls test() on one request until done; returns the sizes it reported (n entries).
std::vector<int> waitRequest(CheckEnv& env, void* req, int n, const std::string& what, bool sizesNull = false);

// Sends (or receives) `sizes.size()` messages through `slots` buffers of `slotSize` bytes, `inflight` at a time,
// testing the oldest request first as NCCL's proxy does; contents verified byte for byte on the receiver,
// and every reported size checked. recvSize: the receive posted for message i (0: the slot size).
struct StreamSpec {
  std::vector<size_t> sizes;
  int inflight = 8;
  size_t slotSize = 0;
  size_t recvSize = 0;
  uint64_t seed = 1;
  int tag = 0;
  bool requestHint = false;  // receiver pre-sets *request = NCCL_NET_OPTIONAL_RECV_COMPLETION
};
void stream(CheckEnv& env, Conn& c, const StreamSpec& spec);

// Non-blocking, resumable form of stream() for several connections progressed in one loop.
class StreamState {
 public:
  StreamState(CheckEnv& env, Conn& c, const StreamSpec& spec);
  ~StreamState();
  bool step();  // one pass: post what may be posted, test the oldest; true when finished
  void* comm() const { return conn_.comm(); }

 private:
  CheckEnv& env_;
  Conn& conn_;
  StreamSpec spec_;
  Buffer buf_;
  Registration reg_;
  size_t next_ = 0, doneCount_ = 0;
  std::deque<std::pair<size_t, void*>> inflight_;  // message index, request
};

std::string fmtSize(size_t bytes);

}  // namespace weft::harness
