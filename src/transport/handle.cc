// SPDX-License-Identifier: Apache-2.0
#include "weft/transport/handle.h"

#include "weft/common/log.h"

#include <sys/random.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace weft {

uint32_t fnv1a32(const void* data, size_t len, uint32_t h) {
  auto p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= 16777619u;
  }
  return h;
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t randomToken() {
  uint64_t t = 0;
  ssize_t n;
  do {
    n = getrandom(&t, sizeof(t), 0);
  } while (n < 0 && errno == EINTR);
  if (n != sizeof(t)) throw Error(Status::kSystem, std::string("getrandom failed: ") + std::strerror(errno));
  return t;
}

namespace {
uint32_t checksum(const uint8_t* bytes) {
  // Everything except the checksum field itself.
  uint32_t h = fnv1a32(bytes, 12);
  return fnv1a32(bytes + 16, kHandleSize - 16, h);
}
}  // namespace

void WireHandle::encode(void* out) const {
  uint8_t b[kHandleSize] = {};
  uint32_t magic = kMagic;
  std::memcpy(b + 0, &magic, 4);
  b[4] = kVersion;
  b[5] = static_cast<uint8_t>(backend);
  std::memcpy(b + 6, &addrLen, 2);
  std::memcpy(b + 8, &providerHash, 4);
  std::memcpy(b + 16, &token, 8);
  std::memcpy(b + 24, &listenId, 4);
  std::memcpy(b + 28, addr.data(), addrLen);
  uint32_t sum = checksum(b);
  std::memcpy(b + 12, &sum, 4);
  std::memcpy(out, b, kHandleSize);
}

Status WireHandle::decode(const void* in, WireHandle* out, std::string* why) {
  if (in == nullptr) {
    *why = "handle is NULL";
    return Status::kInternal;
  }
  const auto* b = static_cast<const uint8_t*>(in);
  uint32_t magic, sum;
  std::memcpy(&magic, b, 4);
  std::memcpy(&sum, b + 12, 4);
  if (magic != kMagic) {
    *why = "not a weft handle (bad magic): it was made by another plugin, or corrupted on the way";
    return Status::kInvalidUsage;
  }
  if (b[4] != kVersion) {
    *why = "handle version " + std::to_string(b[4]) + " from a different weft release (this one speaks " +
           std::to_string(kVersion) + "): run the same weft build on every node";
    return Status::kInvalidUsage;
  }
  if (sum != checksum(b)) {
    *why = "handle checksum mismatch: truncated or corrupted handle";
    return Status::kInvalidUsage;
  }
  WireHandle h;
  h.backend = static_cast<BackendId>(b[5]);
  std::memcpy(&h.addrLen, b + 6, 2);
  std::memcpy(&h.providerHash, b + 8, 4);
  std::memcpy(&h.token, b + 16, 8);
  std::memcpy(&h.listenId, b + 24, 4);
  if (h.addrLen == 0 || h.addrLen > kMaxAddr) {
    *why = "handle address length " + std::to_string(h.addrLen) + " out of range";
    return Status::kInvalidUsage;
  }
  std::memcpy(h.addr.data(), b + 28, h.addrLen);
  *out = h;
  return Status::kOk;
}

Status decodeForConnect(const void* handle, const std::string& device, BackendId backend, uint32_t providerHash,
                        const std::string& transport, WireHandle* out) {
  std::string why;
  Status st = WireHandle::decode(handle, out, &why);
  if (st != Status::kOk) {
    WEFT_WARN("connect on {}: {}", device, why);
    return st;
  }
  if (out->backend != backend || out->providerHash != providerHash) {
    WEFT_WARN("connect on {}: the handle comes from a different transport than {} (every rank must use the same "
              "WEFT_BACKEND, and for libfabric the same WEFT_PROVIDER)",
              device, transport);
    return Status::kInvalidUsage;
  }
  return Status::kOk;
}

}  // namespace weft
