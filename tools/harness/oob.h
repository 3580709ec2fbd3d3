// SPDX-License-Identifier: Apache-2.0
// The out-of-band channel between the two worker processes: what NCCL's bootstrap network is to its ranks.
// Handles travel over it as opaque bytes; checks also use it to agree on parameters and to stay in step.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace weft::harness {

class Oob {
 public:
  explicit Oob(int fd) : fd_(fd) {}
  void send(const void* data, size_t len);
  void send(const std::string& s) { send(s.data(), s.size()); }
  // Throws std::runtime_error after `timeout` or when the peer is gone.
  std::vector<uint8_t> recv(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  std::string recvString(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Both sides call with the same label; throws if the peer is elsewhere or does not arrive in time.
  void barrier(const std::string& label, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Non-blocking: a message that has already arrived, if any (it is then consumed).
  bool tryRecv(std::string* out);
  // Puts a message back so the next recv returns it first.
  void pushBack(std::string msg) { pending_.push_back(std::move(msg)); }
  void discardPending() { pending_.clear(); }
  // The last "verdict:" message received, whoever consumed it (a check may swallow one while waiting).
  const std::string& lastVerdict() const { return lastVerdict_; }

 private:
  bool fill(std::chrono::steady_clock::time_point deadline);  // false: nothing arrived before the deadline
  bool takeMessage(std::string* out);                          // a whole message from inbuf_, if there is one
  int fd_;
  std::vector<std::string> pending_;
  std::string inbuf_;
  std::string lastVerdict_;
};

}  // namespace weft::harness
