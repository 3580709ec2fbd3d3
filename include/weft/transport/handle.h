// SPDX-License-Identifier: Apache-2.0
// The 128-byte connection handle NCCL carries from listen() to connect(), possibly to another host and another
// process. Plain bytes only: no pointers. Layout (little-endian), version 2:
//   0  u32 magic 'WEFT'     4  u8 version   5  u8 backend   6  u16 addrLen
//   8  u32 providerHash     12 u32 checksum (FNV-1a of every other byte)
//   16 u64 token (random per listen)       24 u32 listen id (libfabric: the listen's entry at its port)
//   28 u8 addr[100] (provider address of the listening port, the verbs handshake socket, or the TCP listen
//   socket; addrLen bytes)
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "weft/common/status.h"
#include "weft/transport/net.h"

namespace weft {

enum class BackendId : uint8_t { kFabric = 1, kVerbs = 2, kTcp = 3 };

struct WireHandle {
  static constexpr uint32_t kMagic = 0x54464557;  // "WEFT"
  static constexpr uint8_t kVersion = 2;
  static constexpr size_t kMaxAddr = 100;

  BackendId backend = BackendId::kFabric;
  uint32_t providerHash = 0;
  uint64_t token = 0;
  uint32_t listenId = 0;
  uint16_t addrLen = 0;
  std::array<uint8_t, kMaxAddr> addr{};

  void encode(void* out) const;
  // Refuses anything that is not a well-formed handle of this version, with a reason.
  static Status decode(const void* in, WireHandle* out, std::string* why);
};

// decode() for a backend's connect(), which also refuses a handle of another backend or provider (`transport` names
// this end's, for the warning); a refusal is warned about, naming the device the connect was for.
Status decodeForConnect(const void* handle, const std::string& device, BackendId backend, uint32_t providerHash,
                        const std::string& transport, WireHandle* out);

uint32_t fnv1a32(const void* data, size_t len, uint32_t seed = 2166136261u);
uint64_t fnv1a64(std::string_view s);
uint64_t randomToken();  // from the kernel's CSPRNG

}  // namespace weft
