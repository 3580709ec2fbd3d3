// SPDX-License-Identifier: Apache-2.0
// Helper threads of the native TCP backend (WEFT_TCP_THREADS, docs/tcp.md §cores): on a host with cores to spare,
// the system calls of a connection's piece flows (flows 1 and up; the kernel copies each byte there) move off
// NCCL's proxy thread onto a device's helpers, so that one connection's bytes are copied by several cores.
//
// What stays on NCCL's thread: flow 0 (headers, small messages, its share of pieces), every decision (which flow
// takes which piece, which receive a piece belongs to), completions and failures. A helper only moves bytes:
//  - a send flow: the comm posts items (a piece header and its payload) on the flow's ring; the helper writes them
//    in order and counts what it wrote; the comm retires written items and hands out more;
//  - a receive flow: the helper reads a piece header and hands it over; the comm finds the piece's message and
//    hands back where its bytes go; the helper reads them there and says so; the comm counts them in.
// Each hand-over is one atomic store (release) read with acquire on the other side; an item or a header belongs to
// exactly one side at a time. A helper writes no comm state: a failed call is an errno it leaves in the task, which
// the comm turns into the comm's failure at its next progress (gloo's pair.cc does the same).
//
// Threads: WEFT_TCP_THREADS per device at most, started as flows first attach, bound near the NIC's NUMA node
// (numa::bindThisThreadNear). A flow goes to the helper with the fewest. A helper with nothing it can move
// sleeps in poll() on the sockets it waits for and an eventfd the comms write only while it sleeps (a comm posting
// work to an awake helper makes no system call).
//
// Locking: Helper::mu_ guards its task list; the helper holds it while it moves its tasks (never in poll), a comm
// takes it to attach or detach a task (set-up, close, failure: never per message). Once detach returns the helper
// touches neither the task nor the memory it named.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tcp/tcp_comm.h"

namespace weft::tcp {

class Helper;

// One piece flow's work, shared by its comm (NCCL's thread) and its helper.
struct FlowTask {
  static constexpr uint32_t kRing = 16;
  // err: a failed system call's errno, or kClosedMidPiece (the peer's end of the stream inside a piece).
  static constexpr int kClosedMidPiece = -1;
  enum State : uint32_t {
    kHeader,       // helper: reading a piece header
    kHeaderReady,  // comm: hdr holds one; says where its bytes go
    kBody,         // helper: reading len bytes to dst
    kBodyDone,     // comm: counts them in
    kEnded,        // the peer ended the flow between pieces (comm)
    kFailed,       // err says why (comm)
  };

  int fd = -1;
  bool send = true;
  // send: the comm writes ring[posted % kRing], then posted (release); the helper writes ring entries in order and
  // publishes written (bytes, monotonic) and done (items written whole).
  Item* ring[kRing] = {};
  std::atomic<uint32_t> posted{0};
  std::atomic<uint32_t> done{0};
  std::atomic<uint64_t> written{0};
  uint64_t cursor = 0;  // helper: bytes of the item at done written so far
  // receive
  std::atomic<uint32_t> state{kHeader};
  PieceHeader hdr{};
  size_t hdrGot = 0;          // helper
  uint8_t* dst = nullptr;     // comm, before kBody
  uint64_t len = 0;           // comm, before kBody
  std::atomic<uint64_t> got{0};  // the helper counts the body's bytes (the comm's stall watch reads it)
  std::atomic<int> err{0};
  Helper* helper = nullptr;  // set by attach, cleared by detach (the comm's thread)
  // helper-private: its last call found the socket full (send) or empty (receive)
  bool blocked = false;
};

// A device's helpers: none until a flow attaches, then up to `threads`.
class HelperPool {
 public:
  HelperPool(int threads, int numaNode, std::string device);
  ~HelperPool();
  HelperPool(const HelperPool&) = delete;
  HelperPool& operator=(const HelperPool&) = delete;
  // The task's helper from now on (its fd and direction set); false when no thread could be started (the comm
  // then moves the flow itself, as without helpers).
  bool attach(FlowTask* t);
  // After it returns the helper no longer touches t (or what it names). Safe on a task never attached.
  void detach(FlowTask* t);
  int threads() const { return max_; }

 private:
  const int max_;
  const int node_;
  const std::string device_;
  std::mutex mu_;  // guards helpers_ (attach, detach: set-up and close only)
  std::vector<std::unique_ptr<Helper>> helpers_;
};

// The comm posted work on an attached t (a ring entry, a receive state for the helper): wakes its helper if it
// sleeps (a system call only then).
void kick(FlowTask* t);

// The number of helpers a device gets from WEFT_TCP_THREADS (0: none, the flows move inline).
int helperThreadsFromParams();

}  // namespace weft::tcp
