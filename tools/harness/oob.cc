// SPDX-License-Identifier: Apache-2.0
#include "oob.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace weft::harness {

void Oob::send(const void* data, size_t len) {
  uint32_t n = static_cast<uint32_t>(len);
  std::vector<uint8_t> buf(reinterpret_cast<const uint8_t*>(&n), reinterpret_cast<const uint8_t*>(&n) + sizeof(n));
  buf.insert(buf.end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + len);
  size_t off = 0;
  while (off < buf.size()) {
    ssize_t w = ::write(fd_, buf.data() + off, buf.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error(std::string("oob write failed: ") + std::strerror(errno));
    off += static_cast<size_t>(w);
  }
}

// Bytes are kept in inbuf_ until a whole message is there, so a timeout in the middle of a message loses
// nothing and the stream never falls out of step.
bool Oob::fill(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{fd_, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      if (left.count() <= 0) return false;
      continue;
    }
    char buf[65536];
    ssize_t r = ::read(fd_, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw std::runtime_error("the peer process closed the channel (it exited or crashed)");
    if (r < 0) throw std::runtime_error(std::string("oob read failed: ") + std::strerror(errno));
    inbuf_.append(buf, static_cast<size_t>(r));
    return true;
  }
}

bool Oob::takeMessage(std::string* out) {
  if (inbuf_.size() < 4) return false;
  uint32_t n;
  std::memcpy(&n, inbuf_.data(), 4);
  if (n > (64u << 20)) throw std::runtime_error("oob message too large: the channel is corrupted");
  if (inbuf_.size() < 4 + static_cast<size_t>(n)) return false;
  *out = inbuf_.substr(4, n);
  inbuf_.erase(0, 4 + static_cast<size_t>(n));
  return true;
}

std::vector<uint8_t> Oob::recv(std::chrono::milliseconds timeout) {
  if (!pending_.empty()) {
    std::string m = std::move(pending_.front());
    pending_.erase(pending_.begin());
    return std::vector<uint8_t>(m.begin(), m.end());
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string m;
  while (!takeMessage(&m)) {
    if (!fill(deadline)) throw std::runtime_error("timed out waiting for the peer process");
  }
  return std::vector<uint8_t>(m.begin(), m.end());
}

std::string Oob::recvString(std::chrono::milliseconds timeout) {
  auto b = recv(timeout);
  std::string m(b.begin(), b.end());
  if (m.rfind("verdict:", 0) == 0) lastVerdict_ = m;
  return m;
}

bool Oob::tryRecv(std::string* out) {
  if (!pending_.empty()) {
    *out = std::move(pending_.front());
    pending_.erase(pending_.begin());
    return true;
  }
  std::string m;
  if (!takeMessage(&m)) {
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 0) <= 0) return false;
    fill(std::chrono::steady_clock::now());
    if (!takeMessage(&m)) return false;
  }
  if (m.rfind("verdict:", 0) == 0) lastVerdict_ = m;
  *out = std::move(m);
  return true;
}

void Oob::barrier(const std::string& label, std::chrono::milliseconds timeout) {
  send("barrier:" + label);
  std::string got = recvString(timeout);
  if (got != "barrier:" + label) {
    throw std::runtime_error("out of step with the peer process: expected '" + label + "', got '" + got + "'");
  }
}

}  // namespace weft::harness
