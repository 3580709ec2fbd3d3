// SPDX-License-Identifier: Apache-2.0
// Pure pieces of the verbs backend, unit-tested without an RDMA device: NCCL_IB_HCA-style port selection, port
// speed, GID choice for RoCE, and the immediate data of the RDMA writes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::verbs {

// WEFT_IB_HCA (NCCL_IB_HCA syntax): "[^][=]dev[:port][,dev[:port]...]". Names are prefixes unless '='.
struct HcaSpec {
  struct Item {
    std::string name;
    int port = -1;   // -1: any port
    int rail = -1;   // NCCL 2.30's name:port:rail:plane (v12 railId/planeId); -1: undefined
    int plane = -1;
  };
  bool exclude = false;
  bool exact = false;
  std::vector<Item> items;
};
bool parseHcaSpec(const std::string& text, HcaSpec* out, std::string* error);
bool hcaSelected(const HcaSpec& spec, const std::string& device, int port);
// The item of an including spec that selects (device, port): its rail and plane (nullptr: none, or an exclusion).
const HcaSpec::Item* hcaItem(const HcaSpec& spec, const std::string& device, int port);

// Mb/s of a port from ibv_port_attr's active_speed and active_width codes; 0 when a code is unknown.
int portSpeedMbps(unsigned activeSpeed, unsigned activeWidth);

// One entry of a port's GID table: its index, its type as sysfs names it ("RoCE v2", "IB/RoCE v1"), the GID.
struct GidEntry {
  int index = 0;
  std::string type;
  uint8_t gid[16] = {};
};
bool gidIsZero(const uint8_t* gid);
bool gidIsIpv4Mapped(const uint8_t* gid);  // ::ffff:a.b.c.d
// RoCE: `forced` (WEFT_IB_GID_INDEX) if >= 0 and present with a non-zero GID; else the first RoCEv2 GID of an IPv4
// address, else the first other RoCEv2 GID (not link-local), else the first non-zero RoCEv1 GID. -1: none.
int chooseGid(const std::vector<GidEntry>& table, int forced);

// Immediate data of an RDMA write with immediate (host order; sent big-endian): [31:8] receive slot,
// [7] truncated (the message was larger than the offered buffer: nothing was written), [3:0] pieces the
// message was split into (1..8). The written length comes with each completion (byte_len).
struct Imm {
  static uint32_t encode(uint32_t slot, uint32_t pieces, bool truncated) {
    return (slot << 8) | (truncated ? 0x80u : 0u) | (pieces & 0xfu);
  }
  static uint32_t slot(uint32_t imm) { return imm >> 8; }
  static uint32_t pieces(uint32_t imm) { return imm & 0xfu; }
  static bool truncated(uint32_t imm) { return (imm & 0x80u) != 0; }
};

// How a message of `size` bytes is split over `nQps` QPs: pieces of `chunk` bytes (the last one shorter), one per
// QP; below `stripeMin` (or with one QP) a single piece. Returns the number of pieces (at least 1).
int splitMessage(uint64_t size, int nQps, uint64_t stripeMin, uint64_t* chunk);

}  // namespace weft::verbs
