#include "oob.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
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

void Oob::readFully(void* buf, size_t len, std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t off = 0;
  while (off < len) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw std::runtime_error("timed out waiting for the peer process");
    pollfd pfd{fd_, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    ssize_t r = ::read(fd_, p + off, len - off);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw std::runtime_error("the peer process closed the channel (it exited or crashed)");
    if (r < 0) throw std::runtime_error(std::string("oob read failed: ") + std::strerror(errno));
    off += static_cast<size_t>(r);
  }
}

std::vector<uint8_t> Oob::recv(std::chrono::milliseconds timeout) {
  if (!pending_.empty()) {
    std::string m = std::move(pending_.front());
    pending_.erase(pending_.begin());
    return std::vector<uint8_t>(m.begin(), m.end());
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  uint32_t n = 0;
  readFully(&n, sizeof(n), deadline);
  if (n > (64u << 20)) throw std::runtime_error("oob message too large");
  std::vector<uint8_t> buf(n);
  if (n) readFully(buf.data(), n, deadline);
  return buf;
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
  pollfd pfd{fd_, POLLIN, 0};
  if (::poll(&pfd, 1, 0) <= 0) return false;
  *out = recvString(std::chrono::seconds(10));
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
