// SPDX-License-Identifier: Apache-2.0
// Out-of-band set-up over TCP, written once for every transport that exchanges what its connections need over a
// socket before the data path exists (the verbs handshake, the device API's TCP and verbs transports):
//   - a listening socket and the handle NCCL carries to the connectors (handle.h, a fresh token per listen);
//   - a token-checked hello: a connector proves it holds this listener's handle, names its communicator and rank;
//   - moves of fixed-size messages on non-blocking sockets, bounded by a deadline;
//   - a ring (a socket to the next rank, one accepted from the previous) with an allgather and a barrier over it.
// Nothing here blocks past its deadline, and a peer that sends garbage, goes silent or closes early is an error
// that says which.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weft/common/status.h"
#include "weft/transport/handle.h"

namespace weft::oob {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Now plus WEFT_CONNECT_TIMEOUT; never with 0 (wait forever, as NCCL does).
Deadline connectDeadline();

// A socket this object owns: closed when it goes, or when another replaces it.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  void reset(int fd = -1);
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_ = -1;
};

// A non-blocking listening socket bound to an interface's address (its port chosen by the kernel when 0).
struct Listener {
  Socket sock;
  sockaddr_storage addr{};  // where it listens, port included
  socklen_t len = 0;
  uint64_t token = 0;  // the handle's, set by handle()

  // `early` runs on the socket before it listens (buffer sizes accepted sockets inherit); nullptr for none. `device`
  // and `what` name it in the warning when it cannot be opened.
  static Status open(sockaddr_storage at, socklen_t len, int backlog, const std::function<void(int)>& early,
                     const std::string& device, const char* what, Listener* out);
  // The handle connectors need: this listener's address and a fresh token (kept in `token`), written to `out` (NCCL's
  // 128 bytes).
  void handle(BackendId backend, uint32_t providerHash, void* out);
  // One pending connection, non-blocking: an open socket, or none for now (*failed set, with errno, when accept failed
  // for another reason than that).
  Socket accept(bool* failed) const;
};

// The address a handle names; false when it holds no IPv4 or IPv6 socket address.
bool handleAddress(const WireHandle& h, sockaddr_storage* out, socklen_t* len);

enum class Moved { kDone, kAgain, kClosed, kFailed };
// Moves what is left of a `len`-byte message on a non-blocking socket (`*done` bytes went before) as far as the
// socket takes it now: kDone when complete, kAgain when it would block, kClosed when the peer closed (receiving),
// kFailed on an error (errno).
Moved moveSome(int fd, bool send, void* buf, size_t len, size_t* done);
// Waits (up to a second at a time) for `events` on fd; false with *why once the deadline passed or poll failed.
bool waitFd(int fd, short events, Deadline deadline, std::string* why);
// Moves exactly n bytes, waiting as it must; false with *why on failure, a close, or once the deadline passed.
bool moveAll(int fd, bool send, void* buf, size_t n, Deadline deadline, std::string* why);
// A non-blocking connect to `addr` begun (TCP_NODELAY set, `early` run first when given): the socket, or none with
// errno.
Socket startConnect(const sockaddr_storage& addr, socklen_t len, const std::function<void(int)>& early = nullptr);

// What a connector says first, and the listener's answer in the same shape.
struct Hello {
  static constexpr uint32_t kMagic = 0x57465248;  // "WFRH"
  static constexpr uint16_t kVersion = 1;
  enum : uint16_t { kRequest = 0xffff, kAccepted = 0, kWrongToken = 1, kWrongComm = 2, kBadRank = 3 };
  uint32_t magic;
  uint16_t version;
  uint16_t status;  // kRequest from a connector; the verdict in an answer
  uint64_t token;   // the listener's, from its handle (a request); 0 in an answer
  uint64_t commId;  // NCCL's communicator id: two jobs on one host never cross
  uint32_t rank;    // the sender's rank
  uint32_t nranks;

  static Hello request(uint64_t token, uint64_t commId, int rank, int nranks);
  static Hello answer(uint16_t verdict, uint64_t commId, int rank, int nranks);
  // A listener's verdict on a request: its token, communicator and size, and a rank `rankOk` accepts.
  uint16_t verdict(uint64_t token, uint64_t commId, int nranks, const std::function<bool(uint32_t)>& rankOk) const;
  // An answer from a weft listener that accepted.
  bool accepted() const { return magic == kMagic && version == kVersion && status == kAccepted; }
  static const char* verdictName(uint16_t status);
};
static_assert(sizeof(Hello) == 32);

// A ring of the comm's ranks over TCP: a socket to the next rank, one accepted from the previous (every other
// connection to the listener is refused and waited past). The handles' tokens prove each hello.
class Ring {
 public:
  // Connects to `next` (its listener's address and token, from its handle) and accepts rank - 1 on `listen`.
  bool open(const Listener& listen, const sockaddr_storage& next, socklen_t nextLen, uint64_t nextToken, int rank,
            int nranks, uint64_t commId, Deadline deadline, std::string* why);
  // Every rank's `bytes`-byte record, rank r's at r * bytes of *all (N - 1 steps, each passing on what came in the one
  // before; sends and receives at once, so that no ring of full socket buffers blocks).
  bool allgather(const void* mine, size_t bytes, std::vector<char>* all, Deadline deadline, std::string* why);
  // Returns once every rank reached it: a token twice round the ring.
  bool barrier(Deadline deadline, std::string* why);

 private:
  int rank_ = 0, nranks_ = 1;
  Socket toNext_, fromPrev_;
};

}  // namespace weft::oob
