// SPDX-License-Identifier: Apache-2.0
// The listening sockets of a TCP device: one per interface, opened at the device's first listen and kept for the
// process's life, so that a flow can join an accepted connection long after NCCL closed its listen comm.
//
// Every listen comm of the device shares them (they close while no listen is open and no connection waits for
// flows): a hello names its listen by the handle's random token. A
// connection's first flow (flow 0) waits here, validated, until its listen comm's accept takes it; the receive
// comm made from it registers a join box under the token, and a later flow of that connection (flow k > 0, the same
// nonce) is answered at once and left in the box for the comm to adopt. A token nobody registered is refused, one
// whose listen accepted already (or whose connection is gone) is refused as replayed.
//
// Thread-safety: one mutex. NCCL may drive different listens and receive comms from different threads; receive
// comms only try the lock (a comm waiting for flows polls now and then and skips a turn when another polls).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "weft/transport/oob.h"
#include "tcp/tcp_comm.h"

namespace weft::tcp {

// A connection's first flow, its hello checked, waiting for its listen comm's accept (which answers it).
struct Arrival {
  int fd = -1;
  std::string peer;
  Hello hello{};
};

class Acceptor {
 public:
  Acceptor(std::vector<RailAddr> ifaces, SocketOptions opts, std::string devName);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Opens the listening sockets at the first call; their addresses, one per interface.
  Status open(std::vector<sockaddr_storage>* addrs);
  void addListen(uint64_t token);
  // Forgets a listen; a first flow it did not take is closed (its connector sees the end of the handshake).
  void removeListen(uint64_t token);
  // Polls, then hands out the listen's first flow when it said hello. *tunerMismatch: a hello for this listen
  // came from a peer whose tuner would decide differently (refused here).
  bool takeArrival(uint64_t token, Arrival* out, bool* tunerMismatch, Status* error);
  void addJoin(uint64_t token, JoinBox* box);
  // Forgets a connection's box; flows left in it are closed.
  void removeJoin(uint64_t token, JoinBox* box);
  // Accepts what came in and reads hellos. wait false: nothing when another thread holds the lock.
  Status poll(bool wait);

  std::mutex& mutex() { return mu_; }  // a receive comm takes its box's flows under it

  static constexpr std::chrono::seconds kHelloTimeout{30};

 private:
  struct Incoming {
    int fd = -1;
    int iface = 0;
    std::string peer;
    Hello hello{};
    size_t got = 0;
    std::chrono::steady_clock::time_point started;
  };
  struct Listen {
    bool used = false;     // its first flow came (a replay is refused)
    bool taken = false;    // its accept took it
    bool mismatch = false;
    Arrival arrival;
  };
  Status pollLocked();
  // Reads what has arrived of its hello: true when the socket is finished with here (handed on, or refused and
  // closed).
  bool serve(Incoming& in);
  void refuse(Incoming& in, uint16_t status, const char* why);
  void spend(uint64_t token);
  void closeIfUnused();

  std::mutex mu_;
  std::vector<RailAddr> ifaces_;
  SocketOptions opts_;
  std::string devName_;
  std::vector<oob::Listener> listeners_;  // one an interface (weft/transport/oob.h), open while a listen needs them
  std::vector<Incoming> incoming_;
  std::unordered_map<uint64_t, Listen> listens_;
  std::unordered_map<uint64_t, JoinBox*> joins_;
  // Tokens whose listen accepted and went (a replayed handle is refused as such), the last kSpentMax of them.
  std::unordered_set<uint64_t> spent_;
  std::deque<uint64_t> spentOrder_;
  static constexpr size_t kSpentMax = 65536;
  static constexpr size_t kMaxIncoming = 4096;
};

// Sends a handshake answer on a fresh socket: false when it could not go whole (the connector is gone).
bool sendAnswer(int fd, const Hello& request, uint16_t status);

}  // namespace weft::tcp
